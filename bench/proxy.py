"""pgbench through nothing, cowproxy and PgBouncer (session mode), interleaved in one run.

    .venv/bin/python bench/proxy.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres] [--seconds 8]
        [--rounds 2] [--clients 1,8] [--scale 10]

Without --dsn an embedded PostgreSQL is started. PgBouncer is installed from Debian (apt-get) when missing;
it is skipped, with a note, if that fails. Prints TPS per target, the ratio to direct, and the latency
each hop adds. pgbench runs `-S` (select only) and TPC-B, simple protocol, at each client count.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"process exited early: {proc.args}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"port {port} never opened")


@contextlib.contextmanager
def server(dsn: str | None) -> Iterator[tuple[str, str, int, str]]:
    """(dsn, host, port, bindir-or-empty)."""
    if dsn:
        parts = urlsplit(dsn)
        yield dsn, parts.hostname or "127.0.0.1", parts.port or 5432, ""
        return
    from migrations.embedded import embedded_postgres

    with embedded_postgres(settings={"max_connections": "200"}) as srv:
        yield srv.dsn(), srv.host, srv.port, str(srv.bindir)


@contextlib.contextmanager
def cowproxy(host: str, port: int) -> Iterator[int]:
    listen = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "proxy.cli",
            "serve",
            "--upstream",
            f"{host}:{port}",
            "--listen",
            f"127.0.0.1:{listen}",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(listen, proc)
        yield listen
    finally:
        proc.terminate()
        proc.wait(30)


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
def pgbouncer(binary: str, host: str, port: int, database: str, user: str) -> Iterator[int]:
    listen = free_port()
    work = Path(tempfile.mkdtemp(prefix="cowproxy-bench-pgb-"))
    work.chmod(0o777)
    (work / "users.txt").write_text(f'"{user}" ""\n')
    (work / "pgbouncer.ini").write_text(
        f"[databases]\n{database} = host={host} port={port} dbname={database}\n"
        f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {listen}\nauth_type = trust\n"
        f"auth_file = {work}/users.txt\npool_mode = session\nmax_client_conn = 200\n"
        f"default_pool_size = 50\nlogfile = {work}/pgbouncer.log\nunix_socket_dir =\n"
    )
    for f in work.iterdir():
        f.chmod(0o644)
    cmd = [binary, str(work / "pgbouncer.ini")]
    if os.geteuid() == 0:
        cmd[1:1] = ["-u", "nobody"]  # PgBouncer refuses to run as root
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(listen, proc)
        yield listen
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)


def pgbench(
    binary: str, host: str, port: int, user: str, database: str, *, args: list[str], seconds: int
) -> tuple[float, float]:
    result = subprocess.run(
        [binary, "-n", "-T", str(seconds), "-h", host, "-p", str(port), "-U", user, *args, database],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"pgbench failed: {result.stderr.strip()}")
    tps = float(re.search(r"tps = ([\d.]+)", result.stdout).group(1))  # type: ignore[union-attr]
    latency = float(re.search(r"latency average = ([\d.]+) ms", result.stdout).group(1))  # type: ignore[union-attr]
    return tps, latency


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", help="PostgreSQL (superuser) to benchmark against; default: embedded")
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", default="1,8")
    parser.add_argument("--scale", type=int, default=10)
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    bouncer = ensure_pgbouncer()
    with server(args.dsn) as (dsn, host, port, bindir):
        tool = os.path.join(bindir, "pgbench") if bindir else (shutil.which("pgbench") or "pgbench")
        user = urlsplit(dsn).username or "postgres"
        database = "cowproxy_bench"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database}")
            conn.execute(f"CREATE DATABASE {database}")
        subprocess.run(
            [tool, "-i", "-q", "-s", str(args.scale), "-h", host, "-p", str(port), "-U", user, database],
            check=True,
            capture_output=True,
        )
        with contextlib.ExitStack() as stack:
            targets = {"direct": port, "cowproxy": stack.enter_context(cowproxy(host, port))}
            if bouncer:
                targets["pgbouncer"] = stack.enter_context(pgbouncer(bouncer, host, port, database, user))
            workloads = [
                (f"{name} c={c}", [*flags, "-c", str(c), "-j", str(min(c, 2))])
                for name, flags in (("-S", ["-S"]), ("tpcb", []))
                for c in clients
            ]
            results: dict[tuple[str, str], list[tuple[float, float]]] = {}
            for round_no in range(args.rounds):
                for label, flags in workloads:
                    for target, target_port in targets.items():  # interleaved: same conditions for each
                        tps, lat = pgbench(
                            tool,
                            "127.0.0.1" if target != "direct" else host,
                            target_port,
                            user,
                            database,
                            args=flags,
                            seconds=args.seconds,
                        )
                        results.setdefault((label, target), []).append((tps, lat))
                        print(
                            f"round {round_no + 1} {label:10} {target:9} tps {tps:9.1f} latency {lat:.3f} ms",
                            flush=True,
                        )
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database}")
    print()
    print(f"{'workload':12} {'target':10} {'tps':>9} {'ratio':>6} {'added latency':>14}")
    for label, flags in workloads:
        clients_n = int(flags[flags.index("-c") + 1])
        base_tps = statistics.median(t for t, _ in results[(label, "direct")])
        for target in targets:
            tps = statistics.median(t for t, _ in results[(label, target)])
            # Per transaction, from the median throughputs: clients / tps is pgbench's average latency.
            added = clients_n * 1e6 * (1 / tps - 1 / base_tps)
            print(f"{label:12} {target:10} {tps:9.1f} {tps / base_tps:6.2f} {added:11.0f} µs")


if __name__ == "__main__":
    main()
