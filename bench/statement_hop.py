"""What one statement's round trip through the proxy costs a single client, the way Django's test suite sends
them (simple Queries with inlined literals, one at a time), by the relay that carries it.

    .venv/bin/python bench/statement_hop.py [--dsn DSN] [--statements 2000] [--rounds 5]
        [--database NAME] [--baseline CHECKOUT]

Without --dsn an embedded PostgreSQL is started. One database (``--database``) with one small table and the
layer installed, ``cowproxy serve`` in front of it (with --baseline also the proxy of another checkout, e.g.
a git worktree of main, in front of the same database), then per round, each target in turn:

- ``direct``: the client on the server, no proxy (a session joined by the client itself);
- ``untagged``: through the proxy, untagged (the C relay takes every statement);
- ``session-c``: a session, autocommit, one text again and again (decided: the C relay takes it);
- ``session-block``: a session inside a transaction block after a text the proxy had not seen (Django's
  ``TestCase``), one text again and again. Which relay carries it depends on the proxy: before branch i16cq
  the C relay handed the connection back at the new text and Python kept it until the block ended (the
  analysis' cache answering); since, the C relay asks Python about the new text and keeps the connection;
- ``session-block-new``: as ``session-block``, every text new (``SELECT … WHERE id = <n>``, its shape known
  after the first);
- ``session-block-savepoint``: as ``session-block``, Django's savepoint pair with a new name each time;
- ``session-rewritten``, ``session-block-rewritten``: as ``session-c`` and ``session-block``, a text the proxy
  rewrites and need do nothing else for (a schema-qualified name: ``public.hop_t``). Before branch i16rwq
  every such text went to Python (the C relay handed back at it); since, the C relay sends its rewritten
  text by Python's decision.

Printed per target: the median over the rounds of the wall time per statement (µs) and of the proxy
process's CPU per statement (µs; its main thread, the Python relay, and the rest, mostly the C relay's
thread, from /proc). ``session-* - direct`` is what the hop adds per statement: times the statements of a
run, the floor any proxy of that kind pays.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import _common as common  # first: it takes bench/ off the import path (its proxy.py is not the package)
import psycopg

ROOT = Path(__file__).resolve().parent.parent
bp = common.sibling("proxy")
SESSION = "bench-hop"

Work = Callable[[psycopg.Connection, int], None]


def thread_cpu(pid: int) -> tuple[float, float]:
    """(main thread, the other threads) CPU seconds of process ``pid`` so far (schedstat: ns on a CPU)."""
    main = other = 0.0
    for stat in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        with contextlib.suppress(OSError):
            seconds = int(Path(stat).read_text().split()[0]) / 1e9
            if Path(stat).parent.name == str(pid):
                main += seconds
            else:
                other += seconds
    return main, other


def make_database(dsn: str, name: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    db = common.with_database(dsn, name)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE hop_t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO hop_t SELECT g, 'v' || g FROM generate_series(1, 1000) g")
    common.install_layer_cli(db)
    return db


def drop_database(dsn: str, name: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def same_text(conn: psycopg.Connection, n: int) -> None:
    cur = psycopg.ClientCursor(conn)
    for _ in range(n):
        cur.execute("SELECT v FROM hop_t WHERE id = 7")
        cur.fetchall()


def new_texts(conn: psycopg.Connection, n: int) -> None:
    cur = psycopg.ClientCursor(conn)
    for i in range(n):
        cur.execute(f"SELECT v FROM hop_t WHERE id = {i % 1000 + 1}")
        cur.fetchall()


def savepoints(conn: psycopg.Connection, n: int) -> None:
    cur = psycopg.ClientCursor(conn)
    for i in range(n // 2):
        cur.execute(f'SAVEPOINT "s{os.getpid()}_x{i}"')
        cur.execute(f'RELEASE SAVEPOINT "s{os.getpid()}_x{i}"')


def rewritten_text(conn: psycopg.Connection, n: int) -> None:
    cur = psycopg.ClientCursor(conn)
    for _ in range(n):
        cur.execute("SELECT v FROM public.hop_t WHERE id = 7")  # (qualified: sent as the overlay's)
        cur.fetchall()


def in_block(work: Work) -> Work:
    def run(conn: psycopg.Connection, n: int) -> None:
        cur = psycopg.ClientCursor(conn)
        cur.execute("BEGIN")
        cur.execute(f"SELECT 'a text never seen' AS \"{time.monotonic_ns()}\"")  # (a new text in the block)
        work(conn, n)
        cur.execute("COMMIT")

    return run


WORKS: dict[str, tuple[bool, Work]] = {  # target -> (in a session, work)
    "untagged": (False, same_text),
    "session-c": (True, same_text),
    "session-block": (True, in_block(same_text)),
    "session-block-new": (True, in_block(new_texts)),
    "session-block-savepoint": (True, in_block(savepoints)),
    "session-rewritten": (True, rewritten_text),
    "session-block-rewritten": (True, in_block(rewritten_text)),
}


def conninfo(db: str, port: int | None, session: bool) -> str:
    parts = psycopg.conninfo.conninfo_to_dict(db)
    if port is not None:
        parts.update(host="127.0.0.1", port=str(port))
    if session:
        parts["options"] = f"-c cow.session_id={SESSION}"
    return psycopg.conninfo.make_conninfo(**parts)  # type: ignore[arg-type]


@dataclass(frozen=True)
class HopTarget:
    name: str
    port: int | None  # the proxy's (None: directly)
    pid: int | None  # the proxy process
    session: bool
    work: Work


def measure(db: str, target: HopTarget, n: int) -> tuple[float, ...]:
    """(wall µs, proxy main-thread CPU µs, proxy other-thread CPU µs) per statement."""
    port, pid = target.port, target.pid
    with psycopg.connect(conninfo(db, port, target.session), autocommit=True) as conn:
        if port is None and target.session:
            conn.execute("SELECT cow.use_session(%s)", (SESSION,))
        target.work(conn, 50)  # (warm: the join, the catalog, the decisions)
        before = thread_cpu(pid) if pid else (0.0, 0.0)
        started = time.perf_counter()
        target.work(conn, n)
        wall = time.perf_counter() - started
        after = thread_cpu(pid) if pid else (0.0, 0.0)
    return wall / n * 1e6, (after[0] - before[0]) / n * 1e6, (after[1] - before[1]) / n * 1e6


def targets(proxies: list[tuple[str, int, int]]) -> Iterator[HopTarget]:
    yield HopTarget("direct", None, None, False, same_text)
    yield HopTarget("direct-session", None, None, True, same_text)
    for name, port, pid in proxies:
        for work_name, (session, work) in WORKS.items():
            yield HopTarget(f"{name} {work_name}", port, pid, session, work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", help="maintenance DSN (default: an embedded PostgreSQL)")
    parser.add_argument("--statements", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--database", default="cowproxy_bench_hop")
    parser.add_argument("--baseline", help="another checkout whose proxy runs beside this one's")
    args = parser.parse_args()
    with common.server(args.dsn, "128MB") as dsn, contextlib.ExitStack() as stack:
        db = make_database(dsn, args.database)
        stack.callback(drop_database, dsn, args.database)
        parts = psycopg.conninfo.conninfo_to_dict(db)
        upstream = f"{parts.get('host', '127.0.0.1')}:{parts.get('port', 5432)}"
        proxies = [stack.enter_context(bp.cowproxy(upstream, "tcp"))]
        if args.baseline:
            proxies.append(stack.enter_context(bp.cowproxy(upstream, "tcp", Path(args.baseline), "base")))
        found: dict[str, list[tuple[float, ...]]] = {}
        plan = list(targets([(p.name, p.port, p.pid) for p in proxies]))
        for r in range(args.rounds):
            for target in plan:
                found.setdefault(target.name, []).append(measure(db, target, args.statements))
            common.log(f"round {r + 1}/{args.rounds} done (load {os.getloadavg()[0]:.2f})")
    print(f"{'target':<36} {'wall µs/stmt':>12} {'proxy main µs':>14} {'proxy other µs':>15}")
    for name, rows in found.items():
        wall, main_cpu, other = (statistics.median(column) for column in zip(*rows, strict=True))
        print(f"{name:<36} {wall:>12.1f} {main_cpu:>14.1f} {other:>15.1f}")


if __name__ == "__main__":
    main()
