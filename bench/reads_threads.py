"""Read traces' cost per transaction, by thread of the proxy: its Python thread (relay hand-overs, taking the
C relay's records, the writer) and its other threads (the C relay).

    .venv/bin/python bench/reads_threads.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--seconds 10] [--rounds 3] [--sessions 8] [--mode prepared] [--select-only] [--warmup S]
        [--baseline DIR]

Without --dsn an embedded PostgreSQL is started; `pgbench -i -s 10` and the layer in a scratch database.
Three proxies, one at a time, the order turned each round: `proxy` (no recording), `reads` (--reads-dsn;
the sessions set no operation id, so each read takes its transaction's: the proxy asks the server before
a transaction that read and wrote ends) and `reads_op` (--reads-dsn, each session with an operation id).
Each runs N pgbench processes, one session each; CPU from /proc/PID/task/TID/schedstat (time on a CPU, in
ns: the clock-tick counts of stat are 10 ms steps, as much as the Python thread's whole share of a run) per
transaction, summed over the rounds. On a shared machine the TPS swing with the load; CPU per transaction
much less. Each run also gives the share of its reads the proxy recorded (a recording proxy whose writer
cannot keep up drops records, counted, and so does less work per transaction). --warmup S: each proxy first
serves the same sessions for S seconds, not measured, so that its one-time costs (the writer's connection
and first batch, the first analyses) stay out of the figure: at TPC-B's rates on the loaded machine they
were several µs per transaction of a 10 s run. --baseline DIR: the
same three from another checkout too (a git worktree of main, its C
extension built), side by side in each round, named base_proxy, base_reads, base_reads_op, on a database of
their own with that checkout's layer (its venv's `cowproxy install`: the rows its writer writes into the
table its layer has). The server's part of recording: the CPU of the writer's backend (the connection
whose last statement was the COPY into cow.reads, or cow.read_runs from layer 57; /proc/PID/stat, 10 ms
ticks, so the server must be on this machine) per transaction.
The whole server's CPU per transaction too (`server`: the postmaster's processes, the sessions' backends
and the writer's; every database's, so a server of the bench's own: without --dsn), and `all`, the proxy's
and the server's together. --database NAME: the scratch database's name.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import _common as common  # first: it takes bench/ off the import path (its proxy.py is not the package)
import psycopg

ROOT = Path(__file__).resolve().parent.parent
bp = common.sibling("proxy")  # its server, proxy and process helpers

GATHER = 1.0  # proxy.reads.GATHER: the writer's longest wait before a batch
# After pgbench: the C relay's records are taken within a GATHER, then written (main: 0.1 s, then gathered).
SETTLE = 2 * GATHER + 0.5
DATABASE = "cowproxy_bench_reads_threads"


def thread_cpu(pid: int) -> tuple[float, float]:
    """(the main thread's CPU seconds, the other threads')."""
    main = other = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            seconds = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]) / 1e9
            if int(tid) == pid:
                main += seconds
            else:
                other += seconds
    return main, other


_TICK = os.sysconf("SC_CLK_TCK")


def server_cpu(postmaster: int) -> float:
    """The server's CPU seconds so far: the postmaster's, its children's that ended (cutime, cstime: the
    sessions' backends of earlier runs) and its live children's (the writer's backend, the WAL writer, …).
    Every database's: the figure is the bench's alone on a server of its own (without --dsn)."""
    fields = Path(f"/proc/{postmaster}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(f) for f in fields[11:15])
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            child = stat.read_text().rsplit(")", 1)[1].split()
            if int(child[1]) == postmaster:
                ticks += int(child[11]) + int(child[12])
    return ticks / _TICK


def postmaster_pid(dsn: str) -> int:
    """The server's postmaster, from postmaster.pid in its data directory (a local server)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    assert row is not None
    return int((Path(str(row[0])) / "postmaster.pid").read_text().split()[0])


def writer_cpu(db_dsn: str) -> float:
    """The CPU seconds so far of the backends whose last statement was a COPY into cow.reads (a recording
    proxy's writer, once it wrote)."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        pids = [
            r[0]
            for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                ' AND query LIKE \'COPY "cow"."read%%\''
            ).fetchall()
        ]
    seconds = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            seconds += (int(fields[11]) + int(fields[12])) / _TICK
    return seconds


def run(
    args: argparse.Namespace,
    tool: str,
    target: bp.Target,
    name: str,
    user: str,
    *,
    db_dsn: str,
    database: str,
) -> tuple[int, float, float, int, float, float]:
    """N pgbench processes through one proxy: (transactions, main thread CPU, other threads' CPU, the
    warm-up's transactions, the writer's backend's CPU, the whole server's CPU)."""
    assert target.pid is not None

    def run(seconds: float) -> int:
        return sessions(
            args, tool, target.host, target.port, name, user=user, run=("-T", str(seconds)), database=database
        )

    warm = 0
    if args.warmup:
        warm = run(args.warmup)
        time.sleep(SETTLE)
    main0, other0, server0 = *thread_cpu(target.pid), writer_cpu(db_dsn)
    all0 = server_cpu(args.postmaster)
    txns = run(args.seconds)
    time.sleep(SETTLE)  # (the writer's last batch)
    main1, other1, server1 = *thread_cpu(target.pid), writer_cpu(db_dsn)
    all1 = server_cpu(args.postmaster)
    return txns, main1 - main0, other1 - other0, warm, server1 - server0, all1 - all0


def recorded(db_dsn: str, name: str) -> int:
    """The reads the proxy ``name`` recorded (taken out: the next round's sessions have the same names). A
    recording proxy that cannot write as fast as the sessions read drops records (its bounded queue): it
    then did less work per transaction, which its CPU figure does not show. Counted by the tables (from
    layer 57 a run's row counts its reads; the view cow.reads would unpack each), gone with their sessions
    (the layer's trigger drops a session's reads)."""
    like = f"thr\\_{name}\\_%"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        runs = conn.execute("SELECT to_regclass('cow.read_runs') IS NOT NULL").fetchone()
        count = (
            "SELECT (SELECT count(*) FROM cow.read_rows WHERE session LIKE %(s)s)"
            " + (SELECT coalesce(sum(reads), 0) FROM cow.read_runs WHERE session LIKE %(s)s)"
            if runs is not None and runs[0]
            else "SELECT count(*) FROM cow.reads WHERE session LIKE %(s)s"
        )
        row = conn.execute(count, {"s": like}).fetchone()
        conn.execute("DELETE FROM cow.sessions WHERE session_id LIKE %s", (like,))
    return int(row[0]) if row is not None else 0


def sessions(
    args: argparse.Namespace,
    tool: str,
    host: str,
    port: int,
    name: str,
    *,
    user: str,
    run: tuple[str, str],
    database: str = DATABASE,
) -> int:
    """N pgbench processes at once, one session each (``run``: ``-T`` seconds or ``-t`` transactions each):
    the transactions they made."""
    procs = []
    for i in range(args.sessions):
        options = f"-c cow.session_id=thr_{name}_{i}"
        if name.endswith("reads_op"):
            options += f" -c cow.operation_id=op{i}"
        flags = ["-M", args.mode, *(["-S"] if args.select_only else [])]
        cmd = [
            tool,
            "-n",
            *run,
            "-c",
            "1",
            "-j",
            "1",
            "-h",
            host,
            "-p",
            str(port),
            "-U",
            user,
            *flags,
            database,
        ]
        env = {**os.environ, "PGOPTIONS": options}
        out = subprocess.PIPE
        procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True))
    txns = 0
    for proc in procs:
        out = proc.communicate()[0]
        found = re.search(r"number of transactions actually processed: (\d+)", out)
        if proc.returncode != 0 or found is None:
            raise SystemExit(f"pgbench failed ({name}): {out[-400:]}")
        txns += int(found.group(1))
    return txns


def dropped(extra: tuple[str, ...]) -> str:
    """The read records a recording proxy dropped so far, by reason (its /metrics), e.g. ``queue_full 120``;
    "" for a proxy that does not record."""
    if "--metrics" not in extra:
        return ""
    address = extra[extra.index("--metrics") + 1]
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    found = re.findall(r'^cowproxy_reads_dropped_total\{reason="(\w+)"\} (\S+)$', text, re.M)
    return " ".join(f"{reason} {float(n):.0f}" for reason, n in found if float(n)) or "none"


def proxies(db_dsn: str, baseline: Path | None) -> list[tuple[str, tuple[str, ...], Path]]:
    """The proxies compared, as (name, serve's extra options, checkout): without recording, recording,
    recording with operation ids (the name tells pgbench to tag them); the same from a baseline checkout.
    A recording proxy serves its metrics (the drops' reasons)."""
    reads = ("--reads-dsn", db_dsn, "--metrics", f"127.0.0.1:{bp.free_port()}")
    configs = [("proxy", (), ROOT), ("reads", reads, ROOT), ("reads_op", reads, ROOT)]
    if baseline is not None:
        configs += [("base_" + name, extra, baseline.resolve()) for name, extra, _ in configs]
    return configs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", help="PostgreSQL (superuser); default: embedded")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--mode", default="prepared", help="pgbench -M")
    parser.add_argument("--select-only", action="store_true", help="pgbench -S instead of TPC-B")
    parser.add_argument("--warmup", type=int, default=0, help="seconds served first, not measured")
    parser.add_argument("--baseline", type=Path, help="another checkout (e.g. a worktree of main) to run too")
    parser.add_argument("--database", default=DATABASE, help="the scratch database's name")
    args = parser.parse_args()
    with bp.server(args.dsn, None) as (dsn, host, port, bindir, _sockets):
        tool = os.path.join(bindir, "pgbench") if bindir else (shutil.which("pgbench") or "pgbench")
        user = urlsplit(dsn).username or "postgres"
        db_dsn = bp.layer_database(
            dsn, tool, host=host, port=port, user=user, database=args.database, scale=10
        )
        args.postmaster = postmaster_pid(dsn)
        configs = proxies(db_dsn, args.baseline)
        databases = {name: args.database for name, _, _ in configs}
        dsns = {name: db_dsn for name, _, _ in configs}
        if args.baseline is not None:
            base = args.database + "_base"
            bp.create_database(dsn, tool, host=host, port=port, user=user, database=base, scale=10)
            base_dsn = urlsplit(dsn)._replace(path="/" + base).geturl()
            python = str(args.baseline.resolve() / ".venv" / "bin" / "python")
            common.install_layer_cli(base_dsn, args.baseline, python)
            for name in databases:
                if name.startswith("base_"):
                    databases[name], dsns[name] = base, base_dsn
        totals = {name: [0, 0.0, 0.0, 0.0, 0.0] for name, _, _ in configs}
        kept = {name: [0, 0] for name, _, _ in configs}  # (reads recorded, transactions run)
        for round_no in range(args.rounds):
            for k in range(len(configs)):
                name, extra, root = configs[(k + round_no) % len(configs)]
                with bp.cowproxy(f"{host}:{port}", "tcp", root=root, extra=extra, name=name) as target:
                    txns, main_s, other_s, warm, server_s, all_s = run(
                        args, tool, target, name, user, db_dsn=dsns[name], database=databases[name]
                    )
                    drops = dropped(extra)
                for i, value in enumerate((txns, main_s, other_s, server_s, all_s)):
                    totals[name][i] += value
                # (each transaction of pgbench's -S and TPC-B reads once: SELECT abalance)
                got = recorded(dsns[name], name)
                kept[name][0] += got
                kept[name][1] += txns + warm
                print(
                    f"round {round_no + 1} {name:13} txns {txns:7}  python {main_s / txns * 1e6:6.1f} µs/txn"
                    f"  other threads {other_s / txns * 1e6:6.1f} µs/txn"
                    f"  writer's backend {server_s / txns * 1e6:5.2f} µs/txn"
                    f"  server {all_s / txns * 1e6:6.1f} µs/txn"
                    f"  reads recorded {got / (txns + warm) * 100:5.1f} %"
                    + (f"  dropped: {drops}" if drops else ""),
                    flush=True,
                )
        print(f"load average {os.getloadavg()[0]:.1f}")
        for name, (txns, main_s, other_s, server_s, all_s) in totals.items():
            tps = txns / args.rounds / args.seconds
            python, other = main_s / txns * 1e6, other_s / txns * 1e6
            total = python + other
            cpu = f"python {python:6.1f}  other {other:6.1f}  total {total:6.1f} µs/txn"
            share = kept[name][0] / kept[name][1] * 100 if kept[name][1] else 0.0
            server = (
                f"writer's backend {server_s / txns * 1e6:5.2f} µs/txn"
                f"  server {all_s / txns * 1e6:6.1f}  all {total + all_s / txns * 1e6:6.1f} µs/txn"
            )
            print(f"{name:13} tps {tps:8.1f}  {cpu}  {server}  reads recorded {share:5.1f} %")
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name in sorted(set(databases.values())):
                conn.execute(f"DROP DATABASE IF EXISTS {name}")


if __name__ == "__main__":
    main()
