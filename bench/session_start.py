"""What a new tagged connection costs, by the number of CoW tables: connect, join, first statement.

    .venv/bin/python bench/session_start.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--tables 10,200] [--connections 30] [--baseline CHECKOUT] [--bind]

Without --dsn an embedded PostgreSQL is started. For each table count, a database with that many small
keyed tables and the layer installed; then, through `cowproxy serve` (and with --baseline CHECKOUT, through
the proxy of another checkout, e.g. a git worktree of main), ``--connections`` connections one after the
other, each tagged with its own session at startup, each running one statement (the first joins the
session and reads the catalog) and closing. Prints the median wall time per connection (connect +
authentication + join + first statement) per proxy and table count; the proxies alternate connection by
connection, so load from other jobs hits both alike. With --bind both proxies hold the database's binding
secret and join with ``cow.bind_session`` (a first bind records the backend's binding: a write), as in
production; the baseline must be a checkout that has the binding.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import _common as common  # first: it takes bench/ off the import path (its proxy.py is not the package)
import psycopg

ROOT = Path(__file__).resolve().parent.parent
bp = common.sibling("proxy")  # its server, proxy and process helpers


def make_database(dsn: str, name: str, tables: int) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    db = urlsplit(dsn)._replace(path="/" + name).geturl()
    with psycopg.connect(db, autocommit=True) as conn:
        for i in range(tables):
            conn.execute(f"CREATE TABLE t{i} (id int PRIMARY KEY, v text, n int DEFAULT 0)")
    subprocess.run(
        [sys.executable, "-m", "cowproxy", "install", "--dsn", db], check=True, capture_output=True, cwd=ROOT
    )
    return db


def first_statement(host: str, port: int, database: str, session: str) -> float:
    started = time.perf_counter()
    dsn = f"postgresql://postgres@{host}:{port}/{database}?options=-c%20cow.session_id%3D{session}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT count(*) FROM t0").fetchone()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", help="PostgreSQL (superuser); default: embedded")
    parser.add_argument("--tables", default="10,200")
    parser.add_argument("--connections", type=int, default=30)
    parser.add_argument("--baseline", help="another checkout of cowproxy: one more proxy, cp-base")
    parser.add_argument("--bind", action="store_true", help="both proxies bind (a binding secret)")
    args = parser.parse_args()
    with bp.server(args.dsn, None) as (dsn, host, port, _bindir, _sockets):
        for tables in [int(t) for t in args.tables.split(",")]:
            name = f"cowproxy_bench_start_{tables}"
            make_database(dsn, name, tables)
            with contextlib.ExitStack() as stack:
                extra = (
                    bp.bind_arguments(urlsplit(dsn)._replace(path="/" + name).geturl(), stack)
                    if args.bind
                    else ()
                )
                proxies = [stack.enter_context(bp.cowproxy(f"{host}:{port}", "tcp", extra=extra))]
                if args.baseline:
                    base = bp.cowproxy(
                        f"{host}:{port}", "tcp", Path(args.baseline).resolve(), "cp-base", extra=extra
                    )
                    proxies.append(stack.enter_context(base))
                times: dict[str, list[float]] = {p.name: [] for p in proxies}
                for i in range(args.connections):
                    for proxy in proxies:
                        times[proxy.name].append(first_statement(proxy.host, proxy.port, name, f"s{i}"))
                for proxy_name, values in times.items():
                    print(
                        f"tables {tables:5}  {proxy_name:9} median {statistics.median(values) * 1e3:7.1f} ms"
                        f"  (min {min(values) * 1e3:.1f}, max {max(values) * 1e3:.1f}) per tagged connection",
                        flush=True,
                    )
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


if __name__ == "__main__":
    main()
