"""A new connection's first write in a session, with server connections reused (``--server-reuse``) and
without, side by side in one run.

    .venv/bin/python bench/server_reuse.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--tables 10,200] [--connections 40] [--work tpcb|select]

Without --dsn an embedded PostgreSQL is started. For each table count, a database with that many small
keyed tables, the layer and a binding secret; two proxies in front of it with that secret, one with
``--server-reuse``. Each round, each proxy takes one new psycopg connection tagged with a session of its
own at startup (as an RL rollout or a test's connection: a new session each time), runs the work (``tpcb``:
one transaction as ``pgbench -M prepared`` sends it, its first writes into the session; ``select``: one
count) and closes. The proxies alternate connection by connection, so load from other jobs hits both alike,
and the other proxy's connection gives the reuse proxy's reset its time (as a client's think time would).

Printed per table count: the median wall time per connection (connect + authentication + join + work +
close) and the proxy process's CPU time per connection (every thread), for each proxy and their ratio
(reuse / new), and how many backends each used (distinct ``pg_backend_pid()``: the first round, a warm-up,
not counted).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable

import _common as common  # first: it takes bench/ off the import path (its proxy.py is not the package)
import psycopg

bp = common.sibling("proxy")  # its server, proxy and process helpers
start = common.sibling("session_start")  # its database, work and CPU helpers


def one_connection(url: str, work: Callable[[psycopg.Connection], None]) -> int:
    """Connect, work, close; the backend's pid."""
    with psycopg.connect(url, autocommit=True) as conn:
        work(conn)
        pid = conn.info.backend_pid
    return pid


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", help="PostgreSQL (superuser); default: embedded")
    parser.add_argument("--tables", default="10,200")
    parser.add_argument("--connections", type=int, default=40)
    parser.add_argument("--work", choices=sorted(start.WORK), default="tpcb")
    args = parser.parse_args()
    work = start.WORK[args.work]
    with bp.server(args.dsn, None) as (dsn, host, port, _bindir, _sockets):
        for tables in [int(t) for t in args.tables.split(",")]:
            name = f"cowproxy_bench_reuse_{tables}"
            with contextlib.ExitStack() as stack:
                db = start.make_database(dsn, name, tables)
                extra = bp.bind_arguments(db, stack)
                upstream = f"{host}:{port}"
                proxies = {
                    "new": stack.enter_context(bp.cowproxy(upstream, "tcp", name="new", extra=extra)),
                    "reuse": stack.enter_context(
                        bp.cowproxy(upstream, "tcp", name="reuse", extra=(*extra, "--server-reuse"))
                    ),
                }
                wall: dict[str, list[float]] = {target: [] for target in proxies}
                cpu: dict[str, list[float]] = {target: [] for target in proxies}
                pids: dict[str, set[int]] = {target: set() for target in proxies}
                for i in range(args.connections + 1):  # (the first round warms up: not counted)
                    for target, proxy in proxies.items():
                        url = (
                            f"postgresql://postgres@{proxy.host}:{proxy.port}/{name}"
                            f"?options=-c%20cow.session_id%3D{target}-{tables}-{i}"
                        )
                        before, started = start.cpu_ns(proxy.pid), time.perf_counter()
                        pid = one_connection(url, work)
                        elapsed, used = time.perf_counter() - started, start.cpu_ns(proxy.pid) - before
                        if i:
                            wall[target].append(elapsed * 1e3)
                            cpu[target].append(used / 1e6)
                            pids[target].add(pid)
                print(
                    f"tables {tables}, work {args.work}: medians of {args.connections} connections, ms"
                    "      wall   proxy CPU   backends",
                    flush=True,
                )
                for target in proxies:
                    print(
                        f"  {target:10}{'':46}{statistics.median(wall[target]):8.2f}"
                        f"{statistics.median(cpu[target]):12.2f}{len(pids[target]):11d}",
                        flush=True,
                    )
                ratio_wall = statistics.median(wall["reuse"]) / statistics.median(wall["new"])
                ratio_cpu = statistics.median(cpu["reuse"]) / statistics.median(cpu["new"])
                print(f"  reuse/new{'':47}{ratio_wall:8.2f}{ratio_cpu:12.2f}", flush=True)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


if __name__ == "__main__":
    main()
