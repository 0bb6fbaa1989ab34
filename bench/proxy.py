"""pgbench through nothing, cowproxy and PgBouncer (session mode), interleaved in one run.

    .venv/bin/python bench/proxy.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--socket-dir /var/run/postgresql] [--seconds 8] [--rounds 2] [--clients 1,8] [--scale 10]
        [--transports tcp,unix] [--strace 3] [--workloads=-S,tpcb] [--floor [plain,buffered]]
        [--baseline CHECKOUT] [--python-relay] [--modes simple,extended,prepared]

Without --dsn an embedded PostgreSQL is started. PgBouncer is installed from Debian (apt-get) when missing;
it is skipped, with a note, if that fails. pgbench runs `-S` (select only) and TPC-B, simple protocol, at
each client count, against every target in turn (round by round, so load from other jobs hits all alike).
--modes picks pgbench's query modes (`-M`; default simple): extended and prepared workloads are labelled
`-S/ext`, `tpcb/prep` and so on.

Transports: `tcp` = every hop over 127.0.0.1; `unix` = every hop over a Unix socket (pgbench to the proxy,
the proxy to PostgreSQL; direct = pgbench to PostgreSQL's socket), which is how PgBouncer usually runs next
to its server.

Prints per target: median TPS, ratio to direct over the same transport, the latency each hop adds, and the
proxy process's CPU time (utime + stime from /proc/PID/stat) per transaction. With --strace S, one more
pgbench run of S seconds per workload and proxy with `strace -c -f` attached gives syscalls per transaction
(strace slows the traced process, so those runs are not part of the TPS figures). --floor adds `relay`, a
uvloop byte relay that parses nothing (the least any Python + uvloop proxy can cost; --floor plain,buffered
also `relay-buf`, the same reading server replies with asyncio.BufferedProtocol); --baseline CHECKOUT adds
`cp-base`, cowproxy from another checkout (e.g. a git worktree of main), for a before/after in one run.
`cowproxy` runs with its C relay for untagged connections when the extension is built; --python-relay adds
`cp-python`, the same proxy with --no-fast-relay (every byte through the Python relay).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Target:
    name: str  # direct | cowproxy | cp-base | relay | pgbouncer
    transport: str  # tcp | unix
    host: str  # 127.0.0.1 or a socket directory (libpq's convention)
    port: int
    pid: int | None  # the proxy process; None for direct

    @property
    def label(self) -> str:
        return f"{self.name}/{self.transport}"


@dataclass(frozen=True)
class Run:
    tps: float
    latency_ms: float
    transactions: int
    cpu_s: float | None  # the proxy process's CPU seconds (user + system) during the run
    user_s: float | None  # of which user


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(host: str, port: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"process exited early: {proc.args}")
        try:
            if host.startswith("/"):
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(f"{host}/.s.PGSQL.{port}")
            else:
                socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{host}:{port} never opened")


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(utime + stime, utime) of a process (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK, int(fields[11]) / CLK_TCK


@contextlib.contextmanager
def server(dsn: str | None, socket_dir: str | None) -> Iterator[tuple[str, str, int, str, str | None]]:
    """(dsn, host, port, bindir-or-empty, unix socket directory or None)."""
    if dsn:
        parts = urlsplit(dsn)
        default = "/var/run/postgresql"
        yield (
            dsn,
            parts.hostname or "127.0.0.1",
            parts.port or 5432,
            "",
            socket_dir or (default if os.path.isdir(default) else None),
        )
        return
    from migrations.embedded import embedded_postgres

    with embedded_postgres(settings={"max_connections": "200"}) as srv:
        sockets = srv.datadir.parent  # the embedded server's -k directory
        sockets.chmod(0o755)  # PgBouncer runs as nobody
        yield srv.dsn(), srv.host, srv.port, str(srv.bindir), str(sockets)


def bind_arguments(db_dsn: str, stack: contextlib.ExitStack) -> tuple[str, ...]:
    """A fresh binding secret for the database, in a file that lives as long as ``stack``: the proxy's
    arguments to bind with it (``cowproxy serve --bind-secret-file``)."""
    secret = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "bind-secret"
    subprocess.run(
        [sys.executable, "-m", "cowproxy", "secret", "--rotate", "--file", str(secret), "--dsn", db_dsn],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    return ("--bind-secret-file", str(secret))


@contextlib.contextmanager
def cowproxy(
    upstream: str, transport: str, root: Path = ROOT, name: str = "cowproxy", extra: tuple[str, ...] = ()
) -> Iterator[Target]:
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="cowproxy-bench-cp-"))
    host = str(work) if transport == "unix" else "127.0.0.1"
    proc = subprocess.Popen(
        [
            *(
                sys.executable,
                "-m",
                "cowproxy",
                "serve",
                "--upstream",
                upstream,
                "--listen",
                f"{host}:{port}",
            ),
            *extra,
        ],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(host, port, proc)
        yield Target(name, transport, host, port, proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)


# The floor for any proxy on Python + uvloop: bytes relayed both ways with no parsing at all (one
# data_received and one write per chunk). Not a proxy anyone should run: no framing, no cancel, no metrics.
TRIVIAL_RELAY = """
import asyncio, gc, sys, uvloop
listen_host, listen_port, up_host, up_port = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
buffered = sys.argv[5] == "buffered"
def path(host, port): return f"{host}/.s.PGSQL.{port}"
class Up(asyncio.Protocol):
    def __init__(self, client): self.client = client
    def data_received(self, data): self.client.transport.write(data)
    def connection_lost(self, exc): self.client.transport.close()
class BufferedUp(asyncio.BufferedProtocol):
    # asyncio.BufferedProtocol: uvloop reads into our buffer (no bytes object per chunk). Writing a view of
    # it is only safe when the write completes at once (small replies): the best case for this protocol.
    def __init__(self, client): self.client, self.buf = client, bytearray(262144)
    def get_buffer(self, hint): return self.buf
    def buffer_updated(self, n): self.client.transport.write(memoryview(self.buf)[:n])
    def connection_lost(self, exc): self.client.transport.close()
class Client(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.up, self.early = transport, None, []
        asyncio.ensure_future(self.connect())
    async def connect(self):
        loop = asyncio.get_running_loop()
        protocol = BufferedUp if buffered else Up
        if up_host.startswith("/"):
            self.up, _ = await loop.create_unix_connection(lambda: protocol(self), path(up_host, up_port))
        else:
            self.up, _ = await loop.create_connection(lambda: protocol(self), up_host, up_port)
        for data in self.early: self.up.write(data)
    def data_received(self, data):
        if self.up is None: self.early.append(data)
        else: self.up.write(data)
    def connection_lost(self, exc):
        if self.up is not None: self.up.close()
async def main():
    loop = asyncio.get_running_loop()
    if listen_host.startswith("/"):
        await loop.create_unix_server(Client, path(listen_host, listen_port))
    else:
        await loop.create_server(Client, listen_host, listen_port)
    gc.freeze()
    await asyncio.Event().wait()
uvloop.run(main())
"""


@contextlib.contextmanager
def trivial_relay(up_host: str, up_port: int, transport: str, mode: str) -> Iterator[Target]:
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="cowproxy-bench-relay-"))
    host = str(work) if transport == "unix" else "127.0.0.1"
    proc = subprocess.Popen(
        [sys.executable, "-c", TRIVIAL_RELAY, host, str(port), up_host, str(up_port), mode],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(host, port, proc)
        yield Target("relay" if mode == "plain" else "relay-buf", transport, host, port, proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)


def ensure_pgbouncer() -> str | None:
    found = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
    )
    if found:
        return found
    print("installing pgbouncer from Debian (apt-get)...", flush=True)
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "pgbouncer"]):
        if subprocess.run(cmd, capture_output=True, check=False).returncode != 0:
            print("note: could not install pgbouncer; it is left out", flush=True)
            return None
    return shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


@contextlib.contextmanager
def pgbouncer(
    binary: str,
    upstream_host: str,
    port: int,
    database: str,
    user: str,
    *,
    transport: str,
    aliases: tuple[str, ...] = (),
    settings: tuple[str, ...] = (),
) -> Iterator[Target]:
    """PgBouncer in session mode before ``database``; ``aliases``: more lines of its [databases] section
    (``name = connect string``), ``settings``: more lines of its [pgbouncer] section."""
    listen = free_port()
    work = Path(tempfile.mkdtemp(prefix="cowproxy-bench-pgb-"))
    work.chmod(0o777)
    (work / "users.txt").write_text(f'"{user}" ""\n')
    if transport == "unix":  # no TCP listener, the socket in work/
        listener = f"listen_addr =\nunix_socket_dir = {work}\n"
        host = str(work)
    else:
        listener = "listen_addr = 127.0.0.1\nunix_socket_dir =\n"
        host = "127.0.0.1"
    (work / "pgbouncer.ini").write_text(
        f"[databases]\n{database} = host={upstream_host} port={port} dbname={database}\n"
        + "".join(f"{line}\n" for line in aliases)
        + f"[pgbouncer]\n{listener}listen_port = {listen}\nauth_type = trust\n"
        f"auth_file = {work}/users.txt\npool_mode = session\nmax_client_conn = 200\n"
        f"default_pool_size = 50\nlogfile = {work}/pgbouncer.log\n"
        + "".join(f"{line}\n" for line in settings)
    )
    for f in work.iterdir():
        f.chmod(0o644)
    cmd = [binary, str(work / "pgbouncer.ini")]
    if os.geteuid() == 0:
        cmd[1:1] = ["-u", "nobody"]  # PgBouncer refuses to run as root
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(host, listen, proc)
        yield Target("pgbouncer", transport, host, listen, proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)


def pgbench(binary: str, target: Target, user: str, database: str, *, args: list[str], seconds: int) -> Run:
    cmd = [binary, "-n", "-T", str(seconds), "-h", target.host, "-p", str(target.port), "-U", user]
    before = cpu_seconds(target.pid) if target.pid else None
    result = subprocess.run([*cmd, *args, database], capture_output=True, text=True, check=False)
    after = cpu_seconds(target.pid) if target.pid else None
    if result.returncode != 0:
        raise SystemExit(f"pgbench failed ({target.label}): {result.stderr.strip()}")

    def number(pattern: str) -> float:
        found = re.search(pattern, result.stdout)
        if found is None:
            raise SystemExit(f"unexpected pgbench output: {result.stdout}")
        return float(found.group(1))

    return Run(
        tps=number(r"tps = ([\d.]+)"),
        latency_ms=number(r"latency average = ([\d.]+) ms"),
        transactions=int(number(r"actually processed: (\d+)")),
        cpu_s=after[0] - before[0] if after and before else None,
        user_s=after[1] - before[1] if after and before else None,
    )


_STRACE_ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$")


def traced(
    binary: str, target: Target, user: str, database: str, *, args: list[str], seconds: int
) -> tuple[float, dict[str, float]]:
    """Syscalls per transaction of the proxy process (all threads) during one pgbench run."""
    assert target.pid is not None
    with tempfile.NamedTemporaryFile(prefix="cowproxy-strace-", suffix=".txt") as out:
        strace = subprocess.Popen(
            ["strace", "-c", "-f", "-q", "-o", out.name, "-p", str(target.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)  # attached
        run = pgbench(binary, target, user, database, args=args, seconds=seconds)
        strace.send_signal(signal.SIGINT)
        strace.wait(30)
        calls: dict[str, float] = {}
        for line in Path(out.name).read_text().splitlines():
            found = _STRACE_ROW.match(line)
            if found and found.group(2) != "total":
                calls[found.group(2)] = int(found.group(1)) / max(run.transactions, 1)
    return sum(calls.values()), calls


_MODE_SUFFIX = {"simple": "", "extended": "/ext", "prepared": "/prep"}


Workload = tuple[str, list[str]]  # (label, pgbench flags)
Results = dict[tuple[str, str], list[Run]]  # (workload, target) -> one run per round


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", help="PostgreSQL (superuser) to benchmark against; default: embedded")
    parser.add_argument("--socket-dir", help="with --dsn: its Unix socket directory (/var/run/postgresql)")
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", default="1,8")
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--transports", default="tcp", help="tcp, unix or tcp,unix")
    parser.add_argument("--strace", type=int, default=0, help="seconds per strace -c run (0: none)")
    parser.add_argument("--workloads", default="-S,tpcb", help="-S, tpcb or both")
    parser.add_argument(
        "--modes",
        default="simple",
        help="pgbench -M query modes: simple, extended, prepared (comma-separated)",
    )
    parser.add_argument(
        "--floor",
        nargs="?",
        const="plain",
        help="plain (relay: a uvloop byte relay that parses nothing), buffered (relay-buf: the same with "
        "asyncio.BufferedProtocol server side) or plain,buffered",
    )
    parser.add_argument(
        "--baseline",
        help="another checkout of cowproxy (e.g. a git worktree of main): one more target, cp-base (tcp)",
    )
    parser.add_argument(
        "--python-relay",
        action="store_true",
        help="one more target, cp-python: cowproxy with --no-fast-relay",
    )
    args = parser.parse_args()
    unknown = set(args.modes.split(",")) - set(_MODE_SUFFIX)
    if unknown:
        raise SystemExit(f"--modes: unknown {', '.join(sorted(unknown))} (simple, extended, prepared)")
    if args.strace and not shutil.which("strace"):
        raise SystemExit("--strace needs strace (apt-get install strace)")
    return args


def main() -> None:
    args = _parse_args()
    transports = args.transports.split(",")
    bouncer = ensure_pgbouncer()
    database = "cowproxy_bench"
    with server(args.dsn, args.socket_dir) as (dsn, host, port, bindir, sockets):
        if "unix" in transports and sockets is None:
            raise SystemExit("--transports unix: no Unix socket directory (pass --socket-dir)")
        tool = os.path.join(bindir, "pgbench") if bindir else (shutil.which("pgbench") or "pgbench")
        user = urlsplit(dsn).username or "postgres"
        create_database(dsn, tool, host=host, port=port, user=user, database=database, scale=args.scale)
        with contextlib.ExitStack() as stack:
            targets = _targets(
                stack,
                args,
                transports=transports,
                host=host,
                port=port,
                sockets=sockets,
                bouncer=bouncer,
                database=database,
                user=user,
            )
            workloads = _workloads(args)
            results = _run_rounds(
                args.rounds,
                workloads,
                targets=targets,
                tool=tool,
                user=user,
                database=database,
                seconds=args.seconds,
            )
            traces: dict[tuple[str, str], tuple[float, dict[str, float]]] = {}
            if args.strace:
                for label, flags in workloads:
                    for target in targets:
                        if target.pid is not None:
                            traces[(label, target.label)] = traced(
                                tool, target, user, database, args=flags, seconds=args.strace
                            )
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database}")
    _report(workloads, transports, targets, results)
    _report_traces(traces)


def create_database(
    dsn: str, tool: str, *, host: str, port: int, user: str, database: str, scale: int
) -> None:
    """``database`` made anew with ``pgbench -i -s scale``'s tables."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {database}")
        conn.execute(f"CREATE DATABASE {database}")
    subprocess.run(
        [tool, "-i", "-q", "-s", str(scale), "-h", host, "-p", str(port), "-U", user, database],
        check=True,
        capture_output=True,
    )


def layer_database(dsn: str, tool: str, *, host: str, port: int, user: str, database: str, scale: int) -> str:
    """``create_database``'s, with this checkout's layer installed; its DSN."""
    create_database(dsn, tool, host=host, port=port, user=user, database=database, scale=scale)
    db_dsn = urlsplit(dsn)._replace(path="/" + database).geturl()
    install = [sys.executable, "-m", "cowproxy", "install", "--dsn", db_dsn]
    subprocess.run(install, check=True, capture_output=True, cwd=ROOT)
    return db_dsn


def _targets(
    stack: contextlib.ExitStack,
    args: argparse.Namespace,
    *,
    transports: list[str],
    host: str,
    port: int,
    sockets: str | None,
    bouncer: str | None,
    database: str,
    user: str,
) -> list[Target]:
    """Per transport: direct, cowproxy, then the optional ones (Python relay, baseline, floors, PgBouncer)."""
    targets: list[Target] = []
    for transport in transports:
        up_host = host if transport == "tcp" else str(sockets)
        upstream = f"{up_host}:{port}"
        targets.append(Target("direct", transport, up_host, port, None))
        targets.append(stack.enter_context(cowproxy(upstream, transport)))
        if args.python_relay:
            targets.append(
                stack.enter_context(
                    cowproxy(upstream, transport, name="cp-python", extra=("--no-fast-relay",))
                )
            )
        if args.baseline and transport == "tcp":  # main before Unix sockets could not do unix
            targets.append(
                stack.enter_context(cowproxy(upstream, transport, Path(args.baseline).resolve(), "cp-base"))
            )
        for mode in args.floor.split(",") if args.floor else ():
            targets.append(stack.enter_context(trivial_relay(up_host, port, transport, mode)))
        if bouncer:
            targets.append(
                stack.enter_context(pgbouncer(bouncer, up_host, port, database, user, transport=transport))
            )
    return targets


def _workloads(args: argparse.Namespace) -> list[Workload]:
    wanted = args.workloads.split(",")
    return [
        (
            f"{name}{_MODE_SUFFIX[mode]} c={c}",
            [*flags, *(("-M", mode) if mode != "simple" else ()), "-c", str(c), "-j", str(min(c, 2))],
        )
        for mode in args.modes.split(",")
        for name, flags in (("-S", ["-S"]), ("tpcb", []))
        if name in wanted
        for c in (int(n) for n in args.clients.split(","))
    ]


def _run_rounds(
    rounds: int,
    workloads: list[Workload],
    *,
    targets: list[Target],
    tool: str,
    user: str,
    database: str,
    seconds: int,
) -> Results:
    results: Results = {}
    for round_no in range(rounds):
        for label, flags in workloads:
            for target in targets:  # interleaved: same conditions for each
                run = pgbench(tool, target, user, database, args=flags, seconds=seconds)
                results.setdefault((label, target.label), []).append(run)
                cpu = (
                    f" cpu/txn {run.cpu_s / run.transactions * 1e6:5.0f} µs"
                    f" (user {(run.user_s or 0) / run.transactions * 1e6:.0f})"
                    if run.cpu_s
                    else ""
                )
                print(
                    f"round {round_no + 1} {label:14} {target.label:15} tps {run.tps:9.1f} "
                    f"latency {run.latency_ms:.3f} ms{cpu}",
                    flush=True,
                )
    return results


def _report(
    workloads: list[Workload], transports: list[str], targets: list[Target], results: Results
) -> None:
    print()
    print(
        f"{'workload':14} {'target':15} {'tps':>9} {'spread':>13} {'ratio':>6} {'added lat':>10} "
        f"{'cpu/txn':>8} {'user':>6}"
    )
    for label, flags in workloads:
        clients_n = int(flags[flags.index("-c") + 1])
        for transport in transports:
            base_tps = statistics.median(r.tps for r in results[(label, f"direct/{transport}")])
            for target in targets:
                if target.transport != transport:
                    continue
                runs = results[(label, target.label)]
                tps = statistics.median(r.tps for r in runs)
                spread = f"{min(r.tps for r in runs):.0f}-{max(r.tps for r in runs):.0f}"
                # Per transaction, from the median throughputs: clients / tps is pgbench's average latency.
                added = clients_n * 1e6 * (1 / tps - 1 / base_tps)
                cpus = [r.cpu_s / r.transactions * 1e6 for r in runs if r.cpu_s is not None]
                users = [r.user_s / r.transactions * 1e6 for r in runs if r.user_s is not None]
                cpu = f"{statistics.median(cpus):5.0f} µs" if cpus else "-"
                user = f"{statistics.median(users):3.0f} µs" if users else "-"
                print(
                    f"{label:14} {target.label:15} {tps:9.1f} {spread:>13} {tps / base_tps:6.2f} "
                    f"{added:7.0f} µs {cpu:>8} {user:>6}"
                )


def _report_traces(traces: dict[tuple[str, str], tuple[float, dict[str, float]]]) -> None:
    if not traces:
        return
    print()
    print(f"{'workload':14} {'target':15} {'syscalls/txn':>12}  top syscalls per txn")
    for (label, target_label), (total, calls) in traces.items():
        top = sorted(calls.items(), key=lambda kv: -kv[1])[:6]
        detail = ", ".join(f"{name} {count:.1f}" for name, count in top)
        print(f"{label:14} {target_label:15} {total:12.1f}  {detail}")


if __name__ == "__main__":
    main()
