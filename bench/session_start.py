"""What a new tagged connection costs, by the number of CoW tables, against an untagged one through the same
proxy: connect, join, first work, close.

    .venv/bin/python bench/session_start.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--tables 10,200] [--connections 30] [--baseline CHECKOUT] [--bind] [--work select|tpcb]

Without --dsn an embedded PostgreSQL is started. For each table count, a database with that many small
keyed tables and the layer installed; then, through `cowproxy serve` (and with --baseline CHECKOUT, through
the proxy of another checkout, e.g. a git worktree of main), ``--connections`` rounds in which each proxy
takes one connection tagged with its own session at startup and one untagged connection, each running the
work and closing; and the same two directly, without a proxy (the session joined by the client itself, as
a connection without the proxy would: what the layer costs the server). With --baseline the baseline's
proxy fronts a second database with the same tables and the baseline's own layer (installed by that
checkout), and ``direct-base`` joins there directly: the before/after of proxy and layer together. The
work: ``select``, one ``SELECT count(*) FROM t0``; ``tpcb``, one transaction of prepared statements as
``pgbench -M prepared`` sends them (two UPDATEs, a SELECT and an INSERT by unqualified names, BEGIN and
COMMIT).

Printed per proxy and table count: the median wall time per connection (connect + authentication + join +
work + close), session and untagged, and the session's extra; and the proxy process's CPU time per
connection (every thread: the asyncio one and the C relay's), the same three. The figure of issue 16 is the
session's extra through a proxy (``+``), against the layer's own extra (the ``direct`` row). The proxies and
the two kinds of connection alternate connection by connection, so load from other jobs hits all alike.
With --bind the proxies hold the database's binding secret and join with ``cow.bind_session`` (a first bind
records the backend's binding: a write), as in production, and the direct sessions bind with it too; the
baseline must be a checkout that has the binding.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import itertools
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import _common as common  # first: it takes bench/ off the import path (its proxy.py is not the package)
import psycopg

ROOT = Path(__file__).resolve().parent.parent
bp = common.sibling("proxy")  # its server, proxy and process helpers
_keys = itertools.count(1_000_000)  # INSERT keys: one per connection, never in the tables before


def make_database(dsn: str, name: str, tables: int, root: Path = ROOT) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    db = urlsplit(dsn)._replace(path="/" + name).geturl()
    with psycopg.connect(db, autocommit=True) as conn:
        for i in range(tables):
            conn.execute(f"CREATE TABLE t{i} (id int PRIMARY KEY, v text, n int DEFAULT 0)")
            conn.execute(f"INSERT INTO t{i} SELECT g, 'v' || g FROM generate_series(1, 100) g")
    common.install_layer_cli(db, root)
    return db


def set_secret(db: str, extra: tuple[str, ...], root: Path) -> None:
    """Give database ``db`` the binding secret of the file in ``extra`` (``--bind-secret-file PATH``)."""
    subprocess.run(
        [sys.executable, "-m", "cowproxy", "secret", "--set", "--file", extra[1], "--dsn", db],
        check=True,
        capture_output=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )


def select_work(conn: psycopg.Connection) -> None:
    conn.execute("SELECT count(*) FROM t0").fetchone()


def tpcb_work(conn: psycopg.Connection) -> None:
    """One transaction of named prepared statements (Parse once, then Bind/Execute), writes by unqualified
    names: what a pgbench -M prepared client sends on a new connection."""
    key = next(_keys)
    with conn.transaction():
        conn.execute("UPDATE t0 SET n = n + 1 WHERE id = %s", (key % 100 + 1,), prepare=True)
        conn.execute("SELECT n FROM t0 WHERE id = %s", (key % 100 + 1,), prepare=True).fetchone()
        conn.execute("UPDATE t1 SET n = n - 1 WHERE id = %s", (key % 100 + 1,), prepare=True)
        conn.execute("INSERT INTO t2 (id, v) VALUES (%s, %s)", (key, "x"), prepare=True)


WORK: dict[str, Callable[[psycopg.Connection], None]] = {"select": select_work, "tpcb": tpcb_work}


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of process ``pid`` so far (schedstat: nanoseconds on a CPU)."""
    total = 0
    for task in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        with contextlib.suppress(OSError), open(task) as f:
            total += int(f.read().split()[0])
    return total


def one_connection(dsn: str, work: Callable[[psycopg.Connection], None], join: str | None) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        if join is not None:  # (directly: the client joins its session itself)
            conn.execute(join)
        work(conn)


Target = tuple[str, str, int, int | None]  # name, host, port, the proxy's pid (None: directly)


def start_targets(
    args: argparse.Namespace, server: tuple[str, str, int], tables: int, stack: contextlib.ExitStack
) -> tuple[list[Target], dict[str, str], str | None]:
    """The databases (this checkout's layer; with --baseline also the baseline's), the proxies in front of
    them and the direct targets: (targets, each target's database, the binding secret or None)."""
    dsn, host, port = server
    name = f"cowproxy_bench_start_{tables}"
    db = make_database(dsn, name, tables)
    names = {"cowproxy": name, "direct": name}
    extra = bp.bind_arguments(db, stack) if args.bind else ()
    proxies = [stack.enter_context(bp.cowproxy(f"{host}:{port}", "tcp", extra=extra))]
    if args.baseline:  # (the baseline's proxy in front of the baseline's own layer)
        baseline = Path(args.baseline).resolve()
        names["cp-base"] = names["direct-base"] = f"{name}_base"
        base_db = make_database(dsn, names["cp-base"], tables, baseline)
        if extra:
            set_secret(base_db, extra, baseline)
        proxies.append(
            stack.enter_context(bp.cowproxy(f"{host}:{port}", "tcp", baseline, "cp-base", extra=extra))
        )
    targets: list[Target] = [(p.name, p.host, p.port, p.pid) for p in proxies]
    targets += [(target, host, port, None) for target in names if target.startswith("direct")]
    return targets, names, Path(extra[1]).read_text().strip() if extra else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", help="PostgreSQL (superuser); default: embedded")
    parser.add_argument("--tables", default="10,200")
    parser.add_argument("--connections", type=int, default=30)
    parser.add_argument("--baseline", help="another checkout of cowproxy: one more proxy, cp-base")
    parser.add_argument("--bind", action="store_true", help="both proxies bind (a binding secret)")
    parser.add_argument("--work", choices=sorted(WORK), default="select")
    args = parser.parse_args()
    work = WORK[args.work]
    with bp.server(args.dsn, None) as (dsn, host, port, _bindir, _sockets):
        for tables in [int(t) for t in args.tables.split(",")]:
            names: dict[str, str] = {}
            with contextlib.ExitStack() as stack:
                targets, names, secret = start_targets(args, (dsn, host, port), tables, stack)
                wall: dict[tuple[str, bool], list[float]] = {}
                cpu: dict[tuple[str, bool], list[float]] = {}
                for i in range(args.connections + 1):  # (the first round warms up: not counted)
                    for target, target_host, target_port, pid in targets:
                        for tagged in (True, False):
                            session = f"{target}-{i}"
                            url = f"postgresql://postgres@{target_host}:{target_port}/{names[target]}"
                            join = None
                            if tagged and pid is None:
                                join = (
                                    f"SELECT cow.bind_session('{session}', NULL, '{secret}')"
                                    if secret
                                    else f"SELECT cow.use_session('{session}', NULL)"
                                )
                            elif tagged:
                                url += f"?options=-c%20cow.session_id%3D{session}"
                            before, started = cpu_ns(pid) if pid else 0, time.perf_counter()
                            one_connection(url, work, join)
                            elapsed, used = time.perf_counter() - started, cpu_ns(pid) - before if pid else 0
                            if i:
                                wall.setdefault((target, tagged), []).append(elapsed * 1e3)
                                cpu.setdefault((target, tagged), []).append(used / 1e6)
                print(
                    f"tables {tables}, work {args.work}{', bind' if args.bind else ''}: medians of "
                    f"{args.connections} connections, ms    wall: session  untagged        +"
                    "     proxy CPU: session  untagged        +",
                    flush=True,
                )
                for target, *_ in targets:
                    row = f"  {target:11}"
                    for values in (wall, cpu):
                        session, untagged = (statistics.median(values[target, t]) for t in (True, False))
                        if values is cpu and target.startswith("direct"):
                            break
                        row += f"{'':21}{session:8.2f} {untagged:9.2f} {session - untagged:+8.2f}"
                    print(row, flush=True)
            with psycopg.connect(dsn, autocommit=True) as conn:
                for database in set(names.values()):
                    conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


if __name__ == "__main__":
    main()
