"""CPU time of one adoption of a tagged connection by the C relay (``FastRelay.adopt``, then ``recall``),
with the list of decisions a busy database gives it (1,024 Django-sized texts: ``MAX_DECISIONS``).

    .venv/bin/python bench/fast_adopt.py [--decisions 1024] [--grow] [--baseline CHECKOUT]

A session whose statements C keeps handing back (Django inlines its literals: nearly every text is new) is
adopted again after each stay in Python, and every adoption of a database's connections gets one list
(``Decisions.export``). ``--baseline CHECKOUT``: the same measurement with another checkout's built
``proxy`` (its ``.venv/bin/python`` when it has one), in turns, 3 times each; µs of CPU
(``time.process_time``) per adoption, the best of 5 rounds of 200 each time. ``--grow``: each adoption's list
is the last one with one decision more (a table that grows between adoptions: a session inside Django's
test blocks, adopted again after each new text), the same row objects first, from ``--decisions`` on.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

# Files in bench/ are named like the packages they measure: keep this folder off the import path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

from proxy.fastrelay import FastRelay  # noqa: E402
from proxy.handoff import Adoption  # noqa: E402

TEXT = (
    'INSERT INTO "queries_note" ("note", "misc", "tag_id", "negate") VALUES (\'{}\', \'m\', NULL, true) '
    'RETURNING "queries_note"."id"'
)


def measure(count: int, rounds: int = 5, per_round: int = 200, *, grow: bool = False) -> float:
    fast = FastRelay()
    kind = fast.kind_index("insert")
    assert kind is not None
    rows = [(b"Q" + TEXT.format(i).encode(), kind, (), False, False, -1) for i in range(count)]
    client, _client_peer = socket.socketpair()
    server, _server_peer = socket.socketpair()
    best = float("inf")
    try:
        for _ in range(rounds):
            # Growing: the lists of a table that takes one decision between adoptions, up to ``count``
            # (made before the clock starts: Decisions.export makes each once per table version).
            lists = [rows[: count - per_round + n + 1] for n in range(per_round)] if grow else [rows]
            adoptions = [Adoption([], [], True, d, False, False) for d in lists]
            start = time.process_time()
            for n in range(per_round):
                fast.adopt(1, client.fileno(), server.fileno(), 1 << 20, adoptions[n % len(adoptions)])
                if fast.recall(1) is None:
                    raise SystemExit("bench/fast_adopt.py: the connection did not come back")
            best = min(best, (time.process_time() - start) / per_round)
    finally:
        fast.close()
    return best * 1e6


def _in_checkout(path: str, count: int, grow: bool) -> float:
    python = os.path.join(path, ".venv", "bin", "python")
    python = python if os.path.exists(python) else sys.executable
    out = subprocess.run(
        [
            python,
            os.path.abspath(__file__),
            "--json",
            "--decisions",
            str(count),
            *(["--grow"] if grow else []),
        ],
        cwd=path,
        env={**os.environ, "PYTHONPATH": path},
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(json.loads(out)["us"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--decisions", type=int, default=1024)
    parser.add_argument("--grow", action="store_true", help="each adoption's list one decision longer")
    parser.add_argument("--baseline", help="a built checkout to measure side by side with this one")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json:
        print(json.dumps({"us": measure(args.decisions, grow=args.grow)}))
        return
    what = f"{args.decisions} decisions" + (", growing" if args.grow else "")
    if args.baseline is None:
        print(f"adopt + recall, {what}: {measure(args.decisions, grow=args.grow):.1f} µs CPU")
        return
    here = os.path.dirname(_HERE)
    base, this = [], []
    for _ in range(3):
        base.append(_in_checkout(args.baseline, args.decisions, args.grow))
        this.append(_in_checkout(here, args.decisions, args.grow))
    print(
        f"adopt + recall, {what}, µs CPU (best of 3): baseline {min(base):.1f}, "
        f"this {min(this):.1f}, this/baseline {min(this) / min(base):.3f}"
    )


if __name__ == "__main__":
    main()
