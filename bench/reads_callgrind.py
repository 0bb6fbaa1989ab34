"""Read traces' cost in instructions per transaction, by thread of the proxy, under callgrind: deterministic
where the CPU-time figures of bench/reads_threads.py swing with the shared machine's load.

    .venv/bin/python bench/reads_callgrind.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--transactions 1000] [--sessions 8] [--mode prepared] [--select-only] [--baseline DIR] [--keep DIR]

Without --dsn an embedded PostgreSQL is started; `pgbench -i -s 1` and the layer in a scratch database.
Three proxies, one at a time, each under callgrind (`--instr-atstart=no --separate-threads=yes`): `proxy`
(no recording), `reads` (--reads-dsn; each read takes its transaction's operation) and `reads_op` (--reads-
dsn, each session with an operation id). Each serves N pgbench sessions of --transactions each once
unmeasured (the writer's connection, the first analyses), then the same again with callgrind's
instrumentation on, and a wait for the writer's last batch; instructions (Ir) per transaction of the main
(Python) thread and of the others (the C relay). --baseline DIR: the same from another checkout (a git
worktree of main with its C extension built), named base_*. Valgrind runs the proxy's threads one at a time
on one core: the counts, not the times, are the figure; the wake-ups of the Python thread (and so its per-
take costs) follow callgrind's slower clock, so the Python thread's count is an indication. --keep DIR keeps
each proxy's profiles in DIR/<name>/ (for callgrind_annotate: where a thread's instructions go).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import _common as common  # first: it takes bench/ off the import path (its proxy.py is not the package)
import psycopg

bp = common.sibling("proxy")  # its server, proxy and process helpers
rt = common.sibling("reads_threads")  # the proxies compared
DATABASE = "cowproxy_bench_reads_callgrind"
SETTLE = 8.0  # seconds for the writer's last batch under valgrind (its GATHER is 1 s)


def pgbench(args: argparse.Namespace, tool: str, port: int, *, name: str, user: str) -> None:
    run = ("-t", str(args.transactions))
    rt.sessions(args, tool, "127.0.0.1", port, name, user=user, run=run, database=DATABASE)


def control(pid: int, *flags: str) -> None:
    subprocess.run(["callgrind_control", *flags, str(pid)], check=True, capture_output=True)


def totals(out_dir: Path, pid: int) -> tuple[int, int]:
    """(Ir of thread 1, Ir of the other threads) from the last dump of each thread's file."""
    main = other = 0
    for path in out_dir.glob(f"cg.{pid}*"):
        found = re.findall(r"^(?:summary|totals): (\d+)", path.read_text(errors="replace"), re.M)
        thread = re.search(r"^thread: (\d+)", path.read_text(errors="replace"), re.M)
        if not found or thread is None:
            continue
        if int(thread.group(1)) == 1:
            main += int(found[-1])
        else:
            other += int(found[-1])
    return main, other


def measure(
    args: argparse.Namespace,
    tool: str,
    upstream: str,
    *,
    user: str,
    name: str,
    extra: tuple[str, ...],
    root: Path,
) -> tuple[int, int]:
    if args.keep is not None:
        out_dir = args.keep / name
        shutil.rmtree(out_dir, ignore_errors=True)
        out_dir.mkdir(parents=True)
    else:
        out_dir = Path(tempfile.mkdtemp(prefix="cowproxy-bench-cg-"))
    port = bp.free_port()
    valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes"]
    valgrind += [f"--callgrind-out-file={out_dir}/cg.%p", "--dump-instr=no"]
    cmd = [*valgrind, sys.executable, "-m", "cowproxy", "serve", "--upstream", upstream]
    cmd += ["--listen", f"127.0.0.1:{port}", *extra]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        bp.wait_listening("127.0.0.1", port, proc, timeout=600)
        pgbench(args, tool, port, name=name, user=user)  # (unmeasured: the one-time costs)
        time.sleep(SETTLE)
        control(proc.pid, "-z")
        control(proc.pid, "-i", "on")
        pgbench(args, tool, port, name=name, user=user)
        time.sleep(SETTLE)
        control(proc.pid, "-i", "off")
        control(proc.pid, "-d")
        return totals(out_dir, proc.pid)
    finally:
        proc.terminate()
        proc.wait(120)
        if args.keep is None:
            shutil.rmtree(out_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", help="PostgreSQL (superuser); default: embedded")
    parser.add_argument("--transactions", type=int, default=1000, help="per session")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--mode", default="prepared", help="pgbench -M")
    parser.add_argument("--select-only", action="store_true", help="pgbench -S instead of TPC-B")
    parser.add_argument("--baseline", type=Path, help="another checkout (e.g. a worktree of main) to run too")
    parser.add_argument("--keep", type=Path, help="keep each proxy's callgrind profiles in DIR/<name>/")
    args = parser.parse_args()
    with bp.server(args.dsn, None) as (dsn, host, port, bindir, _sockets):
        tool = os.path.join(bindir, "pgbench") if bindir else (shutil.which("pgbench") or "pgbench")
        user = urlsplit(dsn).username or "postgres"
        db_dsn = bp.layer_database(dsn, tool, host=host, port=port, user=user, database=DATABASE, scale=1)
        configs = rt.proxies(db_dsn, args.baseline)
        txns = args.sessions * args.transactions
        found: dict[str, tuple[float, float]] = {}
        for name, extra, root in configs:
            upstream = f"{host}:{port}"
            main_ir, other_ir = measure(args, tool, upstream, user=user, name=name, extra=extra, root=root)
            found[name] = (main_ir / txns, other_ir / txns)
            print(f"{name:13} python {found[name][0]:9.0f}  other {found[name][1]:9.0f} Ir/txn", flush=True)
        print(f"load average {os.getloadavg()[0]:.1f}")
        for name, (python, other) in found.items():
            base = found["base_proxy" if name.startswith("base_") else "proxy"]
            extra_ir = python + other - base[0] - base[1]
            print(
                f"{name:13} python {python:9.0f}  other {other:9.0f}  total {python + other:9.0f} Ir/txn"
                f"  over its proxy {extra_ir:+8.0f} ({extra_ir / (base[0] + base[1]) * 100:+5.1f} %)"
            )
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {DATABASE}")


if __name__ == "__main__":
    main()
