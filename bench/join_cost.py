"""The server's cost of a session's join in a new backend (``cow.bind_session`` or ``cow.use_session`` as the
first statement of a connection), this checkout's layer against another checkout's, side by side.

    .venv/bin/python bench/join_cost.py --baseline CHECKOUT [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--connections 40] [--tables 10] [--use]

Without --dsn an embedded PostgreSQL is started. Two databases with the same small keyed tables, the layer
installed in each by its own checkout (bench/session_start.py's), the same binding secret in both. Then
``--connections`` rounds, each opening one new connection to each database in turn: ``track_functions``
on, the join (``cow.bind_session`` with the secret; ``--use``: ``cow.use_session``), its wall time, the
join function's own time (``pg_stat_xact_user_functions.total_time``: the server's, no round trip), then
one ``SELECT count(*) FROM t0`` (the first read of an overlay view in that backend). Printed: the medians
per layer, and this layer's functions (calls and self time) in the median backend's order of cost.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import statistics
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import _common as common  # first: it takes bench/ off the import path
import psycopg

bp = common.sibling("proxy")
start = common.sibling("session_start")

FUNCTIONS = (
    "SELECT funcname, calls, total_time, self_time FROM pg_stat_xact_user_functions WHERE schemaname = 'cow'"
)


def join(conn: psycopg.Connection, use: bool, session: str, secret: str) -> tuple[float, float, list[tuple]]:
    """(wall ms, the join function's server ms, every cow function's row) of the join on a new backend."""
    conn.execute("SET track_functions = 'all'")
    conn.execute("BEGIN")
    started = time.perf_counter()
    if use:
        conn.execute("SELECT cow.use_session(%s, NULL)", (session,))
    else:
        conn.execute("SELECT cow.bind_session(%s, NULL, %s)", (session, secret))
    wall = (time.perf_counter() - started) * 1e3
    rows = conn.execute(FUNCTIONS).fetchall()
    conn.execute("COMMIT")
    name = "use_session" if use else "bind_session"
    return wall, next(r[2] for r in rows if r[0] == name), rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", help="PostgreSQL (superuser); default: embedded")
    parser.add_argument(
        "--baseline", required=True, help="another checkout of cowproxy (e.g. a worktree of main)"
    )
    parser.add_argument("--connections", type=int, default=40)
    parser.add_argument("--tables", type=int, default=10)
    parser.add_argument("--use", action="store_true", help="cow.use_session instead of cow.bind_session")
    args = parser.parse_args()
    baseline = Path(args.baseline).resolve()
    with bp.server(args.dsn, None) as (dsn, _host, _port, _bindir, _sockets), contextlib.ExitStack() as stack:
        dbs = {
            "this": start.make_database(dsn, "cowproxy_bench_join", args.tables),
            "baseline": start.make_database(dsn, "cowproxy_bench_join_base", args.tables, baseline),
        }
        extra = bp.bind_arguments(dbs["this"], stack)
        start.set_secret(dbs["baseline"], extra, baseline)
        secret = Path(extra[1]).read_text().strip()
        wall: dict[str, list[float]] = collections.defaultdict(list)
        server: dict[str, list[float]] = collections.defaultdict(list)
        read: dict[str, list[float]] = collections.defaultdict(list)
        functions: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
        for i in range(args.connections + 1):  # (the first round warms up: not counted)
            for label, db in dbs.items():
                with psycopg.connect(db, autocommit=True) as conn:
                    w, s, rows = join(conn, args.use, f"join-{label}-{i}-{time.time_ns()}", secret)
                    started = time.perf_counter()
                    conn.execute("SELECT count(*) FROM t0").fetchone()
                    r = (time.perf_counter() - started) * 1e3
                if i:
                    wall[label].append(w)
                    server[label].append(s)
                    read[label].append(r)
                    if label == "this":
                        for name, calls, _total, own in rows:
                            functions[name].append((calls, own))
        what = "cow.use_session" if args.use else "cow.bind_session"
        print(f"{what} as a new backend's first statement, medians of {args.connections} connections, ms")
        print(f"  {'layer':10} {'join wall':>10} {'join server':>12} {'first read':>11}")
        for label in dbs:
            medians = [statistics.median(values[label]) for values in (wall, server, read)]
            print(f"  {label:10} {medians[0]:10.2f} {medians[1]:12.2f} {medians[2]:11.2f}")
        print("  this layer's functions (calls, self ms):")
        for name in sorted(functions, key=lambda n: -statistics.median(own for _c, own in functions[n])):
            calls = statistics.median(c for c, _own in functions[name])
            print(f"    {name:24} {calls:5.0f} {statistics.median(own for _c, own in functions[name]):8.3f}")
        with psycopg.connect(dsn, autocommit=True) as conn:
            for db in dbs.values():
                conn.execute(f"DROP DATABASE IF EXISTS {urlsplit(db).path[1:]} WITH (FORCE)")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory():
        main()
