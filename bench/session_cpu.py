"""Proxy CPU per TPC-B transaction: a session, an untagged connection, and an untagged connection whose
statements the server makes slow, interleaved in one run.

    .venv/bin/python bench/session_cpu.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--seconds 10] [--rounds 4] [--modes prepared,extended] [--delay-ms 2] [--rate TPS]

Issue 16 measured that a session's TPC-B transaction costs the C relay 75-150 us more CPU than an untagged
one. The third target tells whether that is the proxy's work for a session or the server's slower
transaction: `plain/slow` is untagged TPC-B through the same proxy, with a row trigger (in the scratch
database only, on the connections that set `bench.delay`) that sleeps `--delay-ms` on each of the
transaction's three UPDATEs. The proxy relays the same messages for it as for `plain`; only the server's
time between them grows, about as much as the layer's triggers make a session's grow.

CPU is the proxy process's, per thread, from /proc/PID/task/TID/schedstat (nanoseconds on a CPU, not
10 ms ticks), divided by the transactions pgbench ran: `main` is the asyncio thread (connection start,
Python's statements), `relay` the C relay's thread. With --rate every target runs at the same TPS
(`pgbench -R`), so the relay sleeps as often for each. Prints every run and the medians per target.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import _common as common  # first: it takes bench/ off the import path (its proxy.py is not the package)
import psycopg

ROOT = Path(__file__).resolve().parent.parent
bp = common.sibling("proxy")  # its server, proxy and process helpers
sessions = common.sibling("sessions")  # its pgbench database

TARGETS = ("session", "plain", "plain/slow")

DELAY_SQL = """
CREATE FUNCTION public.bench_delay() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('bench.delay', true) = 'on' THEN
        PERFORM pg_sleep(current_setting('bench.delay_ms')::float8 / 1000);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER bench_delay BEFORE UPDATE ON public.pgbench_accounts
    FOR EACH ROW EXECUTE FUNCTION public.bench_delay();
CREATE TRIGGER bench_delay BEFORE UPDATE ON public.pgbench_tellers
    FOR EACH ROW EXECUTE FUNCTION public.bench_delay();
CREATE TRIGGER bench_delay BEFORE UPDATE ON public.pgbench_branches
    FOR EACH ROW EXECUTE FUNCTION public.bench_delay();
"""


@dataclass(frozen=True)
class Sample:
    target: str
    mode: str
    transactions: int
    main_us: float  # per transaction
    relay_us: float


def thread_ns(pid: int) -> dict[int, int]:
    """Nanoseconds on a CPU so far, per thread of ``pid``."""
    out = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(task)] = int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
        except (OSError, ValueError):
            continue  # (a thread that ended)
    return out


def target_env(target: str, delay_ms: float) -> dict[str, str]:
    env = dict(os.environ)
    if target == "session":
        env["PGOPTIONS"] = f"-c cow.session_id=bench_cpu_{uuid.uuid4().hex[:12]}"
    elif target == "plain/slow":
        env["PGOPTIONS"] = f"-c bench.delay=on -c bench.delay_ms={delay_ms}"
    return env


def run_one(args: argparse.Namespace, tool: str, proxy: bp.Target, target: str, mode: str) -> Sample:
    port, pid = proxy.port, proxy.pid
    assert pid is not None
    cmd = [tool, "-n", "-M", mode, "-c", "1", "-T", str(args.seconds), "-h", "127.0.0.1", "-p", str(port)]
    if args.rate:
        cmd += ["-R", str(args.rate)]
    before = thread_ns(pid)
    result = subprocess.run(
        [*cmd, "-U", args.user, args.database],
        env=target_env(target, args.delay_ms),
        capture_output=True,
        text=True,
        check=False,
    )
    after = thread_ns(pid)
    done = re.search(r"actually processed: (\d+)", result.stdout)
    if result.returncode != 0 or done is None or int(done.group(1)) == 0:
        raise SystemExit(f"pgbench failed ({target}): {result.stderr.strip() or result.stdout.strip()}")
    n = int(done.group(1))
    main = (after.get(pid, 0) - before.get(pid, 0)) / 1e3 / n
    # The relay is the busiest other thread (the rest are the loop's idle helpers).
    relay = max(((ns - before.get(tid, 0)) for tid, ns in after.items() if tid != pid), default=0) / 1e3 / n
    return Sample(target, mode, n, main, relay)


def prepare(dsn: str, database: str, tool: str, scale: int) -> str:
    """The pgbench database with the layer (bench/sessions.py's), and the UPDATE delays of plain/slow."""
    db_dsn = str(sessions.pgbench_database(dsn, database, tool, scale))
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(DELAY_SQL)
    return db_dsn


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument(
        "--database", default="cowproxy_bench_session_cpu", help="scratch: dropped and made anew"
    )
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--modes", default="prepared,extended")
    parser.add_argument("--delay-ms", type=float, default=2.0, help="plain/slow: server sleep per UPDATE")
    parser.add_argument("--rate", type=int, help="pgbench -R: every target at this TPS")
    return parser.parse_args()


def report(samples: list[Sample]) -> None:
    print(f"\n{'mode':10} {'target':12} {'txns':>6} {'main µs/txn':>12} {'relay µs/txn':>13}  (medians)")
    for mode in dict.fromkeys(s.mode for s in samples):
        for target in TARGETS:
            mine = [s for s in samples if s.mode == mode and s.target == target]
            print(
                f"{mode:10} {target:12} {statistics.median(s.transactions for s in mine):6.0f}"
                f" {statistics.median(s.main_us for s in mine):12.1f}"
                f" {statistics.median(s.relay_us for s in mine):13.1f}"
            )


def main() -> None:
    args = parse_args()
    args.user = urlsplit(args.dsn).username or "postgres"
    tool = shutil.which("pgbench") or "pgbench"
    prepare(args.dsn, args.database, tool, args.scale)
    parts = urlsplit(args.dsn)
    upstream = f"{parts.hostname or '127.0.0.1'}:{parts.port or 5432}"
    samples = []
    with bp.cowproxy(upstream, "tcp") as proxy:
        for round_no in range(args.rounds):
            for mode in args.modes.split(","):
                turn = round_no % len(TARGETS)  # no target always first
                for target in TARGETS[turn:] + TARGETS[:turn]:
                    s = run_one(args, tool, proxy, target, mode)
                    samples.append(s)
                    print(
                        f"round {round_no + 1} {mode:9} {target:11} txns {s.transactions:6}"
                        f"  main {s.main_us:7.1f} µs/txn  relay {s.relay_us:7.1f} µs/txn",
                        flush=True,
                    )
    report(samples)


if __name__ == "__main__":
    main()
