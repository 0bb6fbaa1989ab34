"""N concurrent sessions through cowproxy against the same sessions without it, interleaved in one run.

    .venv/bin/python bench/sessions.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--seconds 5] [--rounds 2] [--sessions 1,8,64] [--scale 10] [--workloads=-S,tpcb]
        [--modes prepared,extended,simple] [--baseline CHECKOUT] [--proxy-args "--workers 2"] [--bind]
        [--reads] [--operation]

Without --dsn an embedded PostgreSQL is started. The layer is installed on `pgbench -i` tables. For each
workload (`-S` or TPC-B, a pgbench query mode) and each N, N pgbench processes run at once (`-c 1` each),
against every target in turn, round by round (so load from other jobs hits all alike; the order of the targets
turns by one per round and workload, so that none is always first or last, e.g. right after pgbench's
initialisation or the previous target's checkpoint):

- `session/direct`: each process in its own session without the proxy: `PGOPTIONS` sets `cow.session_id`
  and the overlay `search_path` (what `cow.use_session` sets) directly on PostgreSQL;
- `session/proxy`: each in its own session through cowproxy (startup tag `-c cow.session_id=...`);
- `session/pgbouncer`: each in its own session joined as `session/direct` joins, through the cheapest real
  hop, PgBouncer in session mode (installed with apt-get when missing): PgBouncer forwards no `options`, so
  process i connects to a database alias of its own whose `connect_query` sets the same two settings. It
  separates what any hop costs on this machine from what cowproxy's logic costs;
- `plain/direct`: the plain tables, no session, no proxy (the reference for the layer's own cost);
- `plain/proxy`: untagged through cowproxy (the reference for the proxy's own cost);
- with --baseline CHECKOUT, `session/cp-base`: the sessions through cowproxy from another checkout;
- with --workers N, `session/proxy-Nw`: the sessions through `cowproxy serve --workers N` (the proxy
  process's CPU is not measured for it: its workers are children);
- with --reads, the cost of read traces: `session/reads`, the sessions through a cowproxy that records
  their reads (`--reads-dsn`: into `cow.reads`, on the proxy's own connection; the C relay records the
  statements it takes), and `session/python`, through one with `--no-fast-relay`; the columns `reads ratio`
  (session/reads over session/proxy: the goal) and `rec ratio` (session/reads over session/python); and
  the server's CPU per transaction (`srv/txn`: every process of the postmaster, the sessions' backends and
  the writer's, read 2.5 s after each run so that the writer's last batch is in; a server of the bench's
  own: without --dsn) and `all ratio`, the CPU per transaction of the proxy and the server together,
  session/reads over session/proxy.

With --pin, PostgreSQL (every process of its postmaster) and pgbench run on CPU 0 and the proxies on the
other CPUs: the proxy on cores of its own, as on a host or pod of its own, so that the ratio shows what the
proxy costs a session and not what sharing the server's cores costs it. Use it with the embedded server
(without --dsn): it pins the server's processes while it runs and unpins them at the end. On a VM whose
idle vCPUs the hypervisor must wake at every round trip, pinning slows every proxied run instead
(docs/benchmarks.md, "The proxy on a core of its own").

With --bind, this checkout's proxies hold the database's binding secret (`--bind-secret-file`): they join
sessions with `cow.bind_session`, as in production (without it they fall back to `cow.use_session`);
the baseline's proxy gets no secret (a checkout from before the binding has no such option).

Session ids differ per target and process, so each session's changes grow alike over the rounds. Before
the rounds, one write through each tagged target, joined as its process 0 joins, must land in that session's
changes and not in the base table.
Prints per workload and N: the sum of the processes' TPS (median over rounds), the ratio of
`session/proxy` to `session/direct` (goal: >= 0.9), of `session/proxy` to `session/pgbouncer` (`vs hop`)
and of `plain/proxy` to `plain/direct`, the latency each hop adds per statement (from the median TPS, one
process: N / tps per transaction, divided by the statements of a transaction) in a session (cowproxy and
PgBouncer) and untagged, and the CPU per transaction of the proxy process and of PgBouncer.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import _common as common  # first: it takes bench/ off the import path (its proxy.py is not the package)
import psycopg

ROOT = Path(__file__).resolve().parent.parent
bp = common.sibling("proxy")  # its server, proxy and process helpers

# Statements per transaction, for the added latency per statement (BEGIN and END count, in every mode).
_STATEMENTS = {"-S": 1, "tpcb": 7, "update": 1}


@dataclass(frozen=True)
class Target:
    name: str
    host: str
    port: int
    pid: int | None  # the proxy process whose CPU is measured
    tagged: bool  # each process in its own session
    direct: bool = False  # no proxy
    hop: str | None = None  # through PgBouncer: process i connects to database alias f"{hop}{i}"


@dataclass(frozen=True)
class Run:
    tps: float
    transactions: int
    cpu_s: float | None
    server_s: float | None = None  # the server's CPU (--reads): every backend's, the writer's included


def server_cpu(postmaster: int) -> float:
    """The CPU seconds so far of the server's processes: the postmaster's children that ended and were
    reaped (its cutime/cstime: the sessions' backends of earlier runs) and the live ones (the writer's
    backend, the WAL writer, ...). Counts every database's backends: a server of the bench's own."""
    fields = Path(f"/proc/{postmaster}/stat").read_text().rsplit(")", 1)[1].split()
    seconds = sum(int(f) for f in fields[11:15])  # (utime, stime, cutime, cstime)
    for pid in _process_tree(postmaster)[1:]:
        with contextlib.suppress(OSError):  # (ended meanwhile: in cutime now, or soon)
            child = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            seconds += int(child[11]) + int(child[12])
    return seconds / bp.CLK_TCK


# After a run with --reads: the proxy takes the C relay's records once a second and writes what it took
# (proxy.reads.GATHER), and the sessions' backends end after pgbench: the CPU is read once both are done.
SETTLE = 2.5


@dataclass(frozen=True)
class Bench:
    tool: str  # pgbench
    user: str
    database: str
    seconds: int
    path: str  # the overlay search_path (sessions without the proxy)
    operation: bool = False  # each process with an operation id of its own too (--operation)
    pin: frozenset[int] | None = None  # the CPUs of PostgreSQL and pgbench (--pin)
    postmaster: int | None = None  # --reads: the server's CPU per run too (Run.server_s)


def session_id(target: str, i: int) -> str:
    return f"bench_{target.replace('/', '_')}_{i}"


def joining(bench: Bench, target: Target, i: int) -> tuple[str, str | None]:
    """(database, startup options) with which process ``i`` of ``target`` connects."""
    if target.hop is not None:  # its own alias joins the server connection (hop_aliases)
        return f"{target.hop}{i}", None
    if not target.tagged:
        return bench.database, None
    options = f"-c cow.session_id={session_id(target.name, i)}"
    if bench.operation:
        options += f" -c cow.operation_id=op{i}"
    if target.direct:  # no proxy: what cow.use_session sets, set directly
        options += f" -c search_path={bench.path.replace(' ', '')}"
    return bench.database, options


HOP = "session/pgbouncer"
HOP_ALIAS = "session_pgbouncer_"  # the database alias of its process i: HOP_ALIAS + str(i)


def hop_aliases(bench: Bench, upstream: tuple[str, int], sessions: int) -> tuple[str, ...]:
    """PgBouncer's [databases] lines for HOP: alias i is the database, and its connect_query sets on each
    new server connection what session/direct's PGOPTIONS set (the ids and the path are identifiers and
    need no quotes inside the quoted value)."""
    lines = []
    for i in range(sessions):
        sets = [f"SET cow.session_id = {session_id(HOP, i)}", f"SET search_path = {bench.path}"]
        if bench.operation:
            sets.append(f"SET cow.operation_id = op{i}")
        lines.append(
            f"{HOP_ALIAS}{i} = host={upstream[0]} port={upstream[1]} dbname={bench.database} "
            f"connect_query='{'; '.join(sets)}'"
        )
    return tuple(lines)


def release(target: Target, user: str, sessions: int) -> None:
    """Closes PgBouncer's server connections of aliases 0..``sessions``-1 (KILL, then RESUME for the next
    run): pooled idle, they would hold backends of the server's max_connections while other targets run,
    and the next run of an alias gets a server connection of its own again."""
    if target.hop is None:
        return
    with psycopg.connect(
        host=target.host, port=target.port, user=user, dbname="pgbouncer", autocommit=True
    ) as admin:  # its console: the simple protocol, which psycopg uses for a statement without parameters
        for i in range(sessions):
            admin.execute(f"KILL {target.hop}{i}")
            admin.execute(f"RESUME {target.hop}{i}")


def check_joined(bench: Bench, db_dsn: str, target: Target) -> None:
    """One write through ``target``, joined as its process 0 joins: it must land in that session's changes
    and leave the base table alone (PgBouncer logs a connect_query's error and goes on unjoined)."""
    database, options = joining(bench, target, 0)
    with psycopg.connect(
        host=target.host,
        port=target.port,
        user=bench.user,
        dbname=database,
        options=options or "",
        autocommit=True,
    ) as conn:
        conn.execute("UPDATE pgbench_branches SET filler = 'joined' WHERE bid = 1")
    release(target, bench.user, 1)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        changes = conn.execute(
            "SELECT count(*) FROM cow.session_changes(%s) WHERE table_name = 'pgbench_branches'",
            (session_id(target.name, 0),),
        ).fetchone()
        base = conn.execute(
            "SELECT count(*) FROM public.pgbench_branches WHERE filler LIKE 'joined%'"
        ).fetchone()
    if changes is None or base is None or base[0] or not changes[0]:
        raise SystemExit(f"{target.name} is not joined: its write went to the base table or nowhere")


def run_sessions(bench: Bench, target: Target, n: int, flags: list[str]) -> Run:
    """``n`` pgbench processes at once (one connection each); TPS summed."""
    procs = []
    before = bp.cpu_seconds(target.pid) if target.pid else None
    server_before = server_cpu(bench.postmaster) if bench.postmaster else None
    for i in range(n):
        env = dict(os.environ)
        database, options = joining(bench, target, i)
        if options is not None:
            env["PGOPTIONS"] = options
        cmd = [bench.tool, "-n", "-T", str(bench.seconds), "-c", "1", "-j", "1", "-h", target.host]
        procs.append(
            subprocess.Popen(
                [*cmd, "-p", str(target.port), "-U", bench.user, *flags, database],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
        if bench.pin is not None:  # pgbench -j 1 is one thread: pinned before it has connected, or just after
            with contextlib.suppress(OSError):
                os.sched_setaffinity(procs[-1].pid, bench.pin)
    tps = 0.0
    transactions = 0
    failures = []
    for proc in procs:
        out, err = proc.communicate()
        found = re.search(r"tps = ([\d.]+)", out)
        done = re.search(r"actually processed: (\d+)", out)
        if done is not None and int(done.group(1)) == 0:
            # Starved for the whole run (64 processes on 2 loaded cores): it counts, as 0 tps.
            print(f"note: a {target.name} process ran no transaction", file=sys.stderr)
            continue
        if proc.returncode != 0 or found is None or done is None:
            failures.append(err.strip() or out.strip())
            continue
        tps += float(found.group(1))
        transactions += int(done.group(1))
    server_s = None
    if bench.postmaster and server_before is not None:
        time.sleep(SETTLE)
        server_s = server_cpu(bench.postmaster) - server_before
    after = bp.cpu_seconds(target.pid) if target.pid else None
    release(target, bench.user, n)
    if failures:
        raise SystemExit(f"pgbench failed ({target.name}): {failures[0]}")
    return Run(tps, transactions, after[0] - before[0] if after and before else None, server_s)


@dataclass(frozen=True)
class Proxies:
    mine: bp.Target
    base: bp.Target | None
    many: bp.Target | None
    reads: bp.Target | None  # recording reads (--reads)
    python: bp.Target | None  # no C relay (--reads)

    def running(self) -> list[bp.Target]:
        return [t for t in (self.mine, self.base, self.many, self.reads, self.python) if t is not None]


@contextlib.contextmanager
def proxies(
    upstream: str,
    baseline: str | None,
    extra: tuple[str, ...],
    workers: int,
    own: tuple[str, ...] = (),
    *,
    reads_dsn: str | None = None,
) -> Iterator[Proxies]:
    """This checkout's proxy (``extra`` and ``own`` arguments), with --workers, with --reads (recording
    and no C relay), and the baseline's (``extra`` only)."""
    with contextlib.ExitStack() as stack:
        mine = stack.enter_context(bp.cowproxy(upstream, "tcp", extra=(*extra, *own)))
        reads = python = None
        if reads_dsn is not None:
            reads = stack.enter_context(
                bp.cowproxy(upstream, "tcp", extra=(*extra, *own, "--reads-dsn", reads_dsn), name="reads")
            )
            python = stack.enter_context(
                bp.cowproxy(upstream, "tcp", extra=(*extra, *own, "--no-fast-relay"), name="python")
            )
        many = None
        if workers > 1:
            many = stack.enter_context(
                bp.cowproxy(upstream, "tcp", extra=(*extra, *own, "--workers", str(workers)), name="workers")
            )
        base = None
        if baseline:
            base = stack.enter_context(
                bp.cowproxy(upstream, "tcp", Path(baseline).resolve(), "cp-base", extra=extra)
            )
        yield Proxies(mine, base, many, reads, python)


# The `update` workload: one autocommit UPDATE per transaction (an ORM's save() outside a transaction block;
# in a session such a statement is the Python relay's, which runs it again after the row-changed 40001:
# proxy/rerun.py). The accounts of scale 1, so that any --scale has them.
AUTOCOMMIT_UPDATE = """\\set aid random(1, 100000)
\\set delta random(-5000, 5000)
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
"""


def _process_tree(root: int) -> list[int]:
    """``root`` and its descendants (from /proc: the postmaster's children, a proxy's workers)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def pin_tree(root: int, cpus: frozenset[int]) -> None:
    """Every thread of ``root`` and its descendants onto ``cpus``. Threads and processes started later
    inherit it from their parent (the postmaster forks each backend; the proxy's C relay threads)."""
    for pid in _process_tree(root):
        for task in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(task.name), cpus)


def postmaster_pid(dsn: str) -> int:
    """The server's postmaster, from postmaster.pid in its data directory (a local server)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    assert row is not None
    return int((Path(str(row[0])) / "postmaster.pid").read_text().split()[0])


@contextlib.contextmanager
def pinned_server(dsn: str, cpus: frozenset[int] | None) -> Iterator[None]:
    """Under --pin the server runs on ``cpus`` for the benchmark, and on every CPU again afterwards."""
    if cpus is None:
        yield
        return
    postmaster = postmaster_pid(dsn)
    before = frozenset(os.sched_getaffinity(postmaster))
    pin_tree(postmaster, cpus)
    try:
        yield
    finally:
        pin_tree(postmaster, before)


def pgbench_database(dsn: str, database: str, tool: str, scale: int) -> str:
    """``database`` made anew with ``pgbench -i -s scale`` and the layer installed; its DSN."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {database}")
        conn.execute(f"CREATE DATABASE {database}")
    db_dsn = urlsplit(dsn)._replace(path="/" + database).geturl()
    parts = urlsplit(dsn)
    host, port, user = parts.hostname or "127.0.0.1", str(parts.port or 5432), parts.username or "postgres"
    subprocess.run(
        [tool, "-i", "-q", "-s", str(scale), "-h", host, "-p", port, "-U", user, database],
        check=True,
        capture_output=True,
    )
    common.install_layer_cli(db_dsn)
    return db_dsn


def overlay_path(dsn: str) -> str:
    """The search_path cow.use_session sets (what a session without the proxy puts in PGOPTIONS)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session('bench_path')")
        row = conn.execute("SHOW search_path").fetchone()
        assert row is not None
        return str(row[0])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", help="PostgreSQL (superuser) to benchmark against; default: embedded")
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sessions", default="1,8,64", help="N: concurrent sessions (comma-separated)")
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument(
        "--database",
        default="cowproxy_bench_sessions",
        help="the scratch database (dropped and made anew): two runs on one server need two names",
    )
    parser.add_argument("--workloads", default="-S,tpcb", help="-S, tpcb, update (comma-separated)")
    parser.add_argument("--modes", default="prepared,extended,simple", help="pgbench -M query modes")
    parser.add_argument("--baseline", help="another checkout of cowproxy: one more target, session/cp-base")
    parser.add_argument("--proxy-args", default="", help="more arguments for cowproxy serve (both)")
    parser.add_argument("--no-plain", action="store_true", help="leave out plain/direct and plain/proxy")
    parser.add_argument("--no-hop", action="store_true", help="leave out session/pgbouncer")
    parser.add_argument("--workers", type=int, default=1, help="N > 1: one more target, session/proxy-Nw")
    parser.add_argument("--bind", action="store_true", help="this checkout's proxies bind (a binding secret)")
    parser.add_argument(
        "--reads", action="store_true", help="two more targets: session/reads (recording) and session/python"
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="PostgreSQL and pgbench on CPU 0, the proxies on the others: the proxy on cores of its own "
        "(as on a host or pod of its own), so that sessions through it are not slowed by sharing the "
        "server's cores (meant for the embedded server: it pins the server's processes while it runs)",
    )
    parser.add_argument(
        "--operation",
        action="store_true",
        help="each process's session with an operation id (without: reads take their transaction's)",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    counts = [int(n) for n in args.sessions.split(",")]
    modes = args.modes.split(",")
    with bp.server(args.dsn, None) as (dsn, host, port, bindir, _sockets):
        tool = os.path.join(bindir, "pgbench") if bindir else (shutil.which("pgbench") or "pgbench")
        user = urlsplit(dsn).username or "postgres"
        database = args.database
        db_dsn = pgbench_database(dsn, database, tool, args.scale)
        path = overlay_path(db_dsn)
        extra = tuple(args.proxy_args.split())
        secret_dir = contextlib.ExitStack()
        own = bp.bind_arguments(db_dsn, secret_dir) if args.bind else ()
        reads_dsn = db_dsn if args.reads else None
        server_cpus, proxy_cpus = _pin_sets(args.pin)
        postmaster = postmaster_pid(dsn) if args.reads else None
        bench = Bench(tool, user, database, args.seconds, path, args.operation, server_cpus, postmaster)
        bouncer = None if args.no_hop else bp.ensure_pgbouncer()
        with (
            secret_dir,
            proxies(
                f"{host}:{port}", args.baseline, extra, args.workers, own, reads_dsn=reads_dsn
            ) as running,
            pinned_server(dsn, server_cpus),
        ):
            mine, base, many = running.mine, running.base, running.many
            bouncers, hops = [], []
            if bouncer is not None:
                # over TCP to the server, as the proxies are; a server connection keeps its join when
                # pooled again (DISCARD ALL, the default reset, would undo connect_query's SETs)
                hop = secret_dir.enter_context(
                    bp.pgbouncer(
                        bouncer,
                        host,
                        port,
                        database,
                        user,
                        transport="tcp",
                        aliases=hop_aliases(bench, (host, port), max(counts)),
                        settings=(f"admin_users = {user}", "server_reset_query = DEALLOCATE ALL"),
                    )
                )
                bouncers.append(hop)
                hops.append(Target(HOP, hop.host, hop.port, hop.pid, True, hop=HOP_ALIAS))
            if proxy_cpus is not None:
                for proxy in [*running.running(), *bouncers]:
                    pin_tree(proxy.pid, proxy_cpus)
            targets = [
                Target("session/direct", host, port, None, True, direct=True),
                Target("session/proxy", mine.host, mine.port, mine.pid, True),
                *hops,
            ]
            if base is not None:
                targets.append(Target("session/cp-base", base.host, base.port, base.pid, True))
            if many is not None:
                name = f"session/proxy-{args.workers}w"
                targets.append(Target(name, many.host, many.port, None, True))
            for extra_target, name in ((running.python, "session/python"), (running.reads, "session/reads")):
                if extra_target is not None:
                    targets.append(Target(name, extra_target.host, extra_target.port, extra_target.pid, True))
            if not args.no_plain:
                targets.append(Target("plain/direct", host, port, None, False, direct=True))
                targets.append(Target("plain/proxy", mine.host, mine.port, mine.pid, False))
            update = Path(secret_dir.enter_context(tempfile.TemporaryDirectory())) / "update.sql"
            update.write_text(AUTOCOMMIT_UPDATE)
            workloads = [
                (name, mode, n, [*flags, "-M", mode])
                for mode in modes
                for name, flags in (("-S", ["-S"]), ("tpcb", []), ("update", ["-f", str(update)]))
                if name in args.workloads.split(",")
                for n in counts
            ]
            for target in targets:
                if target.tagged:
                    check_joined(bench, db_dsn, target)
            results: dict[tuple[str, str, int, str], list[Run]] = {}
            for round_no in range(args.rounds):
                for index, (name, mode, n, flags) in enumerate(workloads):
                    for target in _rotated(targets, round_no + index):
                        run = run_sessions(bench, target, n, flags)
                        results.setdefault((name, mode, n, target.name), []).append(run)
                        print(
                            f"round {round_no + 1} {name:4} {mode:8} N={n:<3} {target.name:16} "
                            f"tps {run.tps:9.1f}" + round_cpu(run),
                            flush=True,
                        )
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
    report(results, targets, workloads)


def _pin_sets(pin: bool) -> tuple[frozenset[int] | None, frozenset[int] | None]:
    """(PostgreSQL's and pgbench's CPUs, the proxies' CPUs) under --pin; (None, None) without it."""
    if not pin:
        return None, None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs at least 2 CPUs")
    return frozenset(cpus[:1]), frozenset(cpus[1:])


def _rotated(targets: list[Target], turn: int) -> list[Target]:
    start = turn % len(targets)
    return targets[start:] + targets[:start]


def report(
    results: dict[tuple[str, str, int, str], list[Run]],
    targets: list[Target],
    workloads: list[tuple[str, str, int, list[str]]],
) -> None:
    """The summary table: median TPS per target, the ratios, added latency, the proxies' CPU."""

    def median_tps(key: tuple[str, str, int, str]) -> float:
        return statistics.median(r.tps for r in results[key])

    print()
    names = [t.name for t in targets]
    widths = {n: max(16, len(n) + 2) for n in names}
    header = "".join(f"{n:>{widths[n]}}" for n in names)
    reads_head = (
        "  reads ratio  rec ratio  cpu/txn py  cpu/txn reads  srv/txn proxy  srv/txn reads  all ratio"
        if "session/reads" in names
        else ""
    )
    # the baseline's CPU beside this checkout's: on a shared machine the steadier figure than the TPS
    base_head = "  cpu/txn base" if "session/cp-base" in names else ""
    hop = HOP in names
    print(
        f"{'workload':20}{header}  sess ratio"
        + ("  vs hop" if hop else "")
        + "  plain ratio  +µs/stmt sess"
        + ("  +µs/stmt hop" if hop else "")
        + "  +µs/stmt plain  cpu/txn sess"
        + ("  cpu/txn hop" if hop else "")
        + "  cpu/txn plain"
        + base_head
        + reads_head
    )
    for name, mode, n, _flags in workloads:
        tps = {t: median_tps((name, mode, n, t)) for t in names}
        row = "".join(f"{tps[t]:{widths[t]}.1f}" for t in names)
        stmts = _STATEMENTS[name]

        sess = tps["session/proxy"] / tps["session/direct"]
        plain = f"{tps['plain/proxy'] / tps['plain/direct']:.2f}" if "plain/proxy" in tps else "-"
        cpu = cpu_per_txn(results[(name, mode, n, "session/proxy")])
        cpu_plain = cpu_per_txn(results[(name, mode, n, "plain/proxy")]) if "plain/proxy" in tps else "-"
        base_col = f"  {cpu_per_txn(results[(name, mode, n, 'session/cp-base')]):>12}" if base_head else ""
        reads_cols = ""
        if "session/reads" in tps:
            key = (name, mode, n, "session/proxy")
            reads_cols = (
                f"  {tps['session/reads'] / tps['session/proxy']:11.3f}"
                f"  {tps['session/reads'] / tps['session/python']:9.3f}"
                f"  {cpu_per_txn(results[(name, mode, n, 'session/python')]):>10}"
                f"  {cpu_per_txn(results[(name, mode, n, 'session/reads')]):>13}"
                f"  {server_per_txn(results[(name, mode, n, 'session/proxy')]):>13}"
                f"  {server_per_txn(results[(name, mode, n, 'session/reads')]):>13}"
                f"  {all_ratio(results[(name, mode, n, 'session/reads')], results[key]):>9}"
            )
        vs_hop = added_hop = cpu_hop = ""
        if hop:
            vs_hop = f"  {tps['session/proxy'] / tps[HOP]:6.2f}"
            added_hop = f"  {added(tps, HOP, 'session/direct', n, stmts):>12}"
            cpu_hop = f"  {cpu_per_txn(results[(name, mode, n, HOP)]):>11}"
        print(
            f"{name + ' ' + mode + ' N=' + str(n):20}{row}  {sess:10.2f}{vs_hop}  {plain:>11}  "
            f"{added(tps, 'session/proxy', 'session/direct', n, stmts):>13}{added_hop}  "
            f"{added(tps, 'plain/proxy', 'plain/direct', n, stmts):>14}  "
            f"{cpu:>12}{cpu_hop}  {cpu_plain:>13}" + base_col + reads_cols
        )


def cpu_per_txn(runs: list[Run]) -> str:
    """The proxy process's CPU per transaction (µs, median over rounds)."""
    cpus = [r.cpu_s / r.transactions * 1e6 for r in runs if r.cpu_s is not None and r.transactions]
    return f"{statistics.median(cpus):.0f} µs" if cpus else "-"


def round_cpu(run: Run) -> str:
    """A round's CPU per transaction, the proxy's and the server's (--reads), for its line."""
    if run.server_s is None or not run.transactions:
        return ""
    proxy_s = run.cpu_s or 0.0
    return (
        f"  cpu/txn proxy {proxy_s / run.transactions * 1e6:6.1f} µs"
        f"  server {run.server_s / run.transactions * 1e6:6.1f} µs"
    )


def server_per_txn(runs: list[Run]) -> str:
    """The server's CPU per transaction (µs, median over rounds; --reads)."""
    cpus = [r.server_s / r.transactions * 1e6 for r in runs if r.server_s is not None and r.transactions]
    return f"{statistics.median(cpus):.0f} µs" if cpus else "-"


def all_ratio(runs: list[Run], base: list[Run]) -> str:
    """The CPU per transaction of everything a run used, the proxy process and the server (the sessions'
    backends, the writer's), of ``runs`` over ``base`` (medians over rounds): the cost of recording."""

    def total(of: list[Run]) -> float | None:
        cpus = [
            (r.cpu_s + r.server_s) / r.transactions
            for r in of
            if r.cpu_s is not None and r.server_s is not None and r.transactions
        ]
        return statistics.median(cpus) if cpus else None

    mine, theirs = total(runs), total(base)
    return f"{mine / theirs:.3f}" if mine and theirs else "-"


def added(tps: dict[str, float], proxy: str, direct: str, n: int, statements: int) -> str:
    """Latency the proxy adds per statement (µs), from the median throughputs of ``n`` processes."""
    if proxy not in tps or direct not in tps:
        return "-"
    return f"{n * 1e6 * (1 / tps[proxy] - 1 / tps[direct]) / statements:.0f}"


if __name__ == "__main__":
    main()
