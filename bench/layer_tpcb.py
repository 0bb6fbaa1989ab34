"""TPC-B and ``-S`` in sessions without the proxy: a baseline layer against this checkout's, side by side.

The layer's own cost in a session (issue 16, goal 5: a session's TPC-B at >= 0.8 of the plain tables). Two
databases on one server are built alike with ``pgbench -i -s SCALE``: ``a`` gets the layer's migrations as of
git ref ``--baseline`` (default ``main``), ``b`` this checkout's. Targets, N pgbench processes at once (``-c
1`` each, like bench/sessions.py):

- ``plain``      the plain tables of ``b``, no session;
- ``session/a``  each process in its own session on ``a``, without the proxy (``PGOPTIONS`` sets
                 ``cow.session_id`` and the overlay ``search_path``, what ``cow.use_session`` sets);
- ``session/b``  the same on ``b``.

Targets take turns round by round (the order turns by one each time), so the machine's load falls on all
alike. Printed per workload, query mode and N: the median TPS over rounds, each session's TPS over
``plain`` (the goal's ratio), and the backends' CPU per transaction (``/proc/<pid>/schedstat`` of every
backend of the run, summed; only when the server runs on this machine): unlike TPS it does not count
waiting for a core that another process holds, so on a loaded machine it is the steadier figure.

``--explain K`` first runs K TPC-B transactions with random keys per target under ``EXPLAIN (ANALYZE,
BUFFERS, FORMAT JSON)`` (literal statements, planned each time: what ``-M simple`` pays) and prints, per
statement, the median planning and execution time, the INSTEAD OF trigger's time and the buffers.

    .venv/bin/python bench/layer_tpcb.py [--dsn DSN] [--baseline REF] [--scale 10] [--seconds 5]
        [--rounds 3] [--sessions 1,8] [--workloads tpcb,-S] [--modes prepared,simple] [--explain 40]
        [--prefix cowtpcb]

Without ``--dsn`` an embedded PostgreSQL is started; with it, scratch databases ``cowtpcb_<pid>_{a,b}`` are
made and dropped at the end (``--prefix`` names them otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import _common as common  # first: it takes bench/ off the import path (its proxy.py is not the package)
import asyncpg
import psycopg

import migrations.layer as layer_mod

bp = common.sibling("proxy")  # its server helper
TARGETS = ("plain", "session/a", "session/b")
# pgbench's TPC-B statements with its random keys at scale s (the order of its built-in script).
TPCB = (
    ("UPDATE accounts", "UPDATE pgbench_accounts SET abalance = abalance + {delta} WHERE aid = {aid}"),
    ("SELECT accounts", "SELECT abalance FROM pgbench_accounts WHERE aid = {aid}"),
    ("UPDATE tellers", "UPDATE pgbench_tellers SET tbalance = tbalance + {delta} WHERE tid = {tid}"),
    ("UPDATE branches", "UPDATE pgbench_branches SET bbalance = bbalance + {delta} WHERE bid = {bid}"),
    (
        "INSERT history",
        "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) "
        "VALUES ({tid}, {bid}, {aid}, {delta}, CURRENT_TIMESTAMP)",
    ),
)


@dataclass(frozen=True)
class Server:
    dsn: str  # the maintenance database
    host: str
    port: int
    user: str
    pgbench: str


@dataclass(frozen=True)
class Run:
    tps: float
    transactions: int
    cpu_us: float | None  # the backends' CPU per transaction


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dsn", help="PostgreSQL (superuser) to benchmark against; default: embedded")
    p.add_argument("--baseline", default="main", help="git ref whose migrations build database a")
    p.add_argument("--scale", type=int, default=10)
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sessions", default="1,8", help="N: concurrent sessions (comma-separated)")
    p.add_argument("--workloads", default="tpcb,-S", help="tpcb, -S (comma-separated)")
    p.add_argument("--modes", default="prepared,simple", help="pgbench -M query modes")
    p.add_argument("--explain", type=int, default=0, metavar="K", help="EXPLAIN K TPC-B transactions first")
    p.add_argument("--prefix", default="cowtpcb", help="scratch databases' name prefix (PREFIX_<pid>_a, _b)")
    return p.parse_args()


def pgbench_init(dsn: str, srv: Server, scale: int) -> None:
    database = urlsplit(dsn).path.lstrip("/")
    where = ["-h", srv.host, "-p", str(srv.port), "-U", srv.user]
    subprocess.run(
        [srv.pgbench, "-i", "-q", "-s", str(scale), *where, database], check=True, capture_output=True
    )


async def install(dsn: str, files: common.Layer) -> None:
    """The layer of ``files`` installed on schema public."""
    conn = await asyncpg.connect(dsn)
    try:
        with common.installed_layer(files):
            await layer_mod.install_layer(conn, schemas=("public",))
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


async def create(dsn: str, names: list[str]) -> None:
    """The scratch databases, made afresh (main drops them at the end)."""
    async with common.scratch_databases(dsn, names, keep=True):
        pass


def overlay_path(dsn: str) -> str:
    """The search_path cow.use_session sets, without blanks (for PGOPTIONS)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session('bench_path')")
        row = conn.execute("SHOW search_path").fetchone()
        assert row is not None
        return str(row[0]).replace(" ", "")


def backend_cpu_ns(pid: int) -> int | None:
    return common.cpu_ns(pid)


@dataclass(frozen=True)
class Load:
    n: int  # pgbench processes at once
    flags: list[str]
    seconds: int


def run_pgbench(srv: Server, database: str, options: str | None, load: Load) -> Run:
    """``load.n`` pgbench processes at once (one connection each, session ``options`` when given): TPS
    summed, and the CPU of their backends per transaction, sampled while they run."""
    n, flags, seconds = load.n, load.flags, load.seconds
    app = f"cowtpcb_{os.getpid()}_{time.monotonic_ns()}"
    env = dict(os.environ, PGAPPNAME=app)
    procs = []
    for i in range(n):
        if options is not None:
            env = dict(env, PGOPTIONS=options.format(i=i))
        cmd = [srv.pgbench, "-n", "-T", str(seconds), "-c", "1", "-j", "1"]
        procs.append(
            subprocess.Popen(
                [*cmd, "-h", srv.host, "-p", str(srv.port), "-U", srv.user, *flags, database],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    with psycopg.connect(srv.dsn, autocommit=True) as conn:
        while any(p.poll() is None for p in procs):
            rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,))
            for (pid,) in rows.fetchall():
                used = backend_cpu_ns(pid)
                if used is not None:
                    first.setdefault(pid, used)
                    last[pid] = used
            time.sleep(0.05)
    tps, transactions = 0.0, 0
    for proc in procs:
        out, err = proc.communicate()
        found = re.search(r"tps = ([\d.]+)", out)
        done = re.search(r"actually processed: (\d+)", out)
        if proc.returncode != 0 or found is None or done is None:
            raise SystemExit(f"pgbench failed: {err.strip() or out.strip()}")
        tps += float(found.group(1))
        transactions += int(done.group(1))
    cpu = sum(last[p] - first[p] for p in last)
    return Run(tps, transactions, cpu / transactions / 1000 if last and transactions else None)


def explain_statement(conn: psycopg.Connection[Any], sql: str) -> dict[str, float]:
    row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}").fetchone()
    assert row is not None
    data = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    top = data[0]
    plan = top["Plan"]
    return {
        "planning": top["Planning Time"],
        "execution": top["Execution Time"],
        "trigger": sum(t["Time"] for t in top.get("Triggers", []) if t["Trigger Name"].startswith("cow_")),
        "buffers": plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0),
    }


Explained = dict[str, dict[str, list[dict[str, float]]]]  # target: statement: figures of each transaction


def explain_tpcb(dsns: dict[str, str], sessions: dict[str, str | None], scale: int, k: int) -> Explained:
    """K TPC-B transactions under EXPLAIN ANALYZE on each target (a connection each, in its session when
    it has one), the targets taking turns transaction by transaction; the figures per statement."""
    rng = random.Random(16)
    found: Explained = {t: {name: [] for name, _ in TPCB} for t in dsns}
    conns = {t: psycopg.connect(d, autocommit=True) for t, d in dsns.items()}
    try:
        for t, session in sessions.items():
            if session is not None:
                conns[t].execute("SELECT cow.use_session(%s)", (session,))
        for i in range(k + 2):  # two to warm up the caches
            keys = {
                "aid": rng.randint(1, 100000 * scale),
                "bid": rng.randint(1, scale),
                "tid": rng.randint(1, 10 * scale),
                "delta": rng.randint(-5000, 5000),
            }
            for t, conn in conns.items():
                conn.execute("BEGIN")
                for name, sql in TPCB:
                    figures = explain_statement(conn, sql.format(**keys))
                    if i >= 2:
                        found[t][name].append(figures)
                conn.execute("COMMIT")
    finally:
        for conn in conns.values():
            conn.close()
    return found


def print_explain(results: Explained, k: int) -> None:
    print(f"\nEXPLAIN (ANALYZE, BUFFERS) of {k} TPC-B transactions, medians, ms (buffers: hit + read)")
    names = list(results)
    print(f"(each figure: {' / '.join(names)})")
    for stmt, _sql in TPCB:
        cols = []
        for field in ("planning", "execution", "trigger", "buffers"):
            meds = [statistics.median(f[field] for f in results[n][stmt]) for n in names]
            digits = 0 if field == "buffers" else 3
            cols.append(f"{field} " + " / ".join(f"{m:.{digits}f}" for m in meds))
        print(f"{stmt:18}  " + "   ".join(cols))


Results = dict[tuple[str, str, int, str], list[Run]]


def report(results: Results, workloads: list[tuple[str, str, int]]) -> None:
    print()
    head = "".join(f"{t:>12}" for t in TARGETS)
    cpu_head = "".join(f"{'cpu ' + t.split('/')[-1]:>11}" for t in TARGETS)
    print(f"{'workload':22}{head}  a/plain  b/plain  b/a  {cpu_head}  cpu b/a")
    for name, mode, n in workloads:
        tps = {t: statistics.median(r.tps for r in results[(name, mode, n, t)]) for t in TARGETS}
        cpus = {t: [r.cpu_us for r in results[(name, mode, n, t)] if r.cpu_us is not None] for t in TARGETS}
        cpu = {t: statistics.median(c) if c else None for t, c in cpus.items()}
        cpu_cols = "".join(f"{c:9.0f}µs" if c is not None else f"{'-':>11}" for c in cpu.values())
        a, b = cpu["session/a"], cpu["session/b"]
        cpu_ratio = f"{b / a:.2f}" if a and b else "-"
        print(
            f"{name + ' ' + mode + ' N=' + str(n):22}"
            + "".join(f"{tps[t]:12.1f}" for t in TARGETS)
            + f"  {tps['session/a'] / tps['plain']:7.2f}  {tps['session/b'] / tps['plain']:7.2f}"
            f"  {tps['session/b'] / tps['session/a']:4.2f}  {cpu_cols}  {cpu_ratio:>7}"
        )


def main() -> int:
    args = parse_args()
    counts = [int(n) for n in args.sessions.split(",")]
    base = common.baseline_layer(args.baseline)
    with bp.server(args.dsn, None) as (dsn, host, port, bindir, _sockets):
        tool = os.path.join(bindir, "pgbench") if bindir else (shutil.which("pgbench") or "pgbench")
        srv = Server(dsn, host, port, urlsplit(dsn).username or "postgres", tool)
        names = [f"{args.prefix}_{os.getpid()}_{v}" for v in ("a", "b")]

        dsns = {"a": common.with_database(dsn, names[0]), "b": common.with_database(dsn, names[1])}
        asyncio.run(create(dsn, names))
        try:
            for v, files in (("a", base), ("b", common.this_layer())):
                pgbench_init(dsns[v], srv, args.scale)
                asyncio.run(install(dsns[v], files))
            measure(args, srv, dsns, names, counts)
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                for name in names:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


def measure(
    args: argparse.Namespace, srv: Server, dsns: dict[str, str], names: list[str], counts: list[int]
) -> None:
    paths = {v: overlay_path(d) for v, d in dsns.items()}
    version = psycopg.connect(dsns["b"]).execute("SHOW server_version").fetchone()
    print(
        f"PostgreSQL {version[0] if version else '?'}, scale {args.scale}, "
        f"a = layer at {args.baseline}, b = this checkout"
    )
    if args.explain:
        targets = {"plain": dsns["b"], "a": dsns["a"], "b": dsns["b"]}
        sessions = {"plain": None, "a": "explain_a", "b": "explain_b"}
        print_explain(explain_tpcb(targets, sessions, args.scale, args.explain), args.explain)
    databases = {"plain": names[1], "session/a": names[0], "session/b": names[1]}
    options = {
        "plain": None,
        "session/a": f"-c cow.session_id=bench_a_{{i}} -c search_path={paths['a']}",
        "session/b": f"-c cow.session_id=bench_b_{{i}} -c search_path={paths['b']}",
    }
    workloads = [
        (name, mode, n)
        for mode in args.modes.split(",")
        for name in args.workloads.split(",")
        for n in counts
    ]
    results: Results = {}
    turn = 0
    for round_no in range(args.rounds):
        for name, mode, n in workloads:
            load = Load(n, [*(["-S"] if name == "-S" else []), "-M", mode], args.seconds)
            order = TARGETS[turn % 3 :] + TARGETS[: turn % 3]
            turn += 1
            for target in order:
                run = run_pgbench(srv, databases[target], options[target], load)
                results.setdefault((name, mode, n, target), []).append(run)
                cpu = f"{run.cpu_us:.0f} µs/txn" if run.cpu_us is not None else "-"
                common.log(
                    f"round {round_no + 1} {name:4} {mode:8} N={n:<3} {target:10} tps {run.tps:9.1f}  {cpu}"
                )
    report(results, workloads)


if __name__ == "__main__":
    sys.exit(main())
