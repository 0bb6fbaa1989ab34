"""Python cost of one untagged statement round trip through the proxy, in-process (no sockets).

    .venv/bin/python bench/proxy_hotpath.py [--n 70000] [--baseline CHECKOUT]

A `ClientConnection` with its relay in the ready state and stub transports gets TPC-B's seven statements
(simple Query) and the server's replies, as `data_received` calls from uvloop would deliver them; µs per
statement round trip (client -> proxy -> server -> proxy -> client), best of 5 rounds. Each checkout runs in
its own interpreter (--baseline: e.g. a git worktree of main, for a before/after), alternately, 3 times.
This is the relay's Python only: uvloop's callback machinery and the socket syscalls come on top (see
bench/proxy.py for the whole process).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MEASURE = r"""
import gc, sys, time
from proxy import protocol as p
from proxy.config import Address, ProxyConfig
from proxy.server import ClientConnection, ProxyServer, State, UpstreamProtocol


class Stub:
    writes = 0
    def write(self, data): Stub.writes += 1
    def get_extra_info(self, name): return ("127.0.0.1", 1)
    def pause_reading(self): pass
    def resume_reading(self): pass
    def close(self): pass


conn = ClientConnection(ProxyServer(ProxyConfig(upstream=Address("127.0.0.1", 1))))
conn.connection_made(Stub())
up = UpstreamProtocol(conn)
up.connection_made(Stub())
conn.upstream = up
conn.state = State.AUTH
conn._auth_data(p.encode_ready("I"))  # authentication done: the relay takes over
assert conn.state is State.READY
Stub.writes = 0
cc, t, i = p.encode_command_complete, p.encode_ready("T"), p.encode_ready("I")
row = (
    p.message(b"T", b"\x00\x01abalance\x00" + b"\x00" * 6 + b"\x00\x17\x00\x04\xff\xff\xff\xff\x00\x00")
    + p.message(b"D", b"\x00\x01\x00\x00\x00\x041234")
    + cc("SELECT 1")
)
statements = [
    ("BEGIN;", cc("BEGIN") + t),
    ("UPDATE pgbench_accounts SET abalance = abalance + -4217 WHERE aid = 612344;", cc("UPDATE 1") + t),
    ("SELECT abalance FROM pgbench_accounts WHERE aid = 612344;", row + t),
    ("UPDATE pgbench_tellers SET tbalance = tbalance + -4217 WHERE tid = 54;", cc("UPDATE 1") + t),
    ("UPDATE pgbench_branches SET bbalance = bbalance + -4217 WHERE bid = 4;", cc("UPDATE 1") + t),
    ("INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (54, 4, 612344, -4217, "
     "CURRENT_TIMESTAMP);", cc("INSERT 0 1") + t),
    ("END;", cc("COMMIT") + i),
]
messages = [(p.encode_query(q), r) for q, r in statements]
n = int(sys.argv[1]) // 7
gc.freeze()
best = float("inf")
for _ in range(5):
    start = time.perf_counter()
    for _ in range(n):
        for query, reply in messages:
            conn.data_received(query)
            up.data_received(reply)
    best = min(best, (time.perf_counter() - start) / (n * 7) * 1e6)
assert Stub.writes == 2 * 5 * n * 7 and conn.relay.at_rest()
print(best)
"""


def measure(checkout: Path, n: int) -> float:
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, str(n)],
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(checkout)},
        capture_output=True,
        text=True,
        check=True,
    )
    return float(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=70000, help="statements per round")
    parser.add_argument("--baseline", help="another checkout of cowproxy to compare with")
    args = parser.parse_args()
    checkouts = {"cowproxy": ROOT}
    if args.baseline:
        checkouts["cp-base"] = Path(args.baseline).resolve()
    results: dict[str, list[float]] = {name: [] for name in checkouts}
    for _ in range(3):
        for name, checkout in checkouts.items():
            results[name].append(measure(checkout, args.n))
    for name, values in results.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name:9} best {min(values):5.2f} µs per statement round trip (runs: {shown})")


if __name__ == "__main__":
    main()
