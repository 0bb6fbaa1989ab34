"""`cowproxy install` on generated schemas of thousands of tables, and the cost of one app DDL statement then:
a baseline layer (a git ref's SQL files) against this checkout's, side by side.

    .venv/bin/python bench/install_scale.py --dsn postgresql://postgres@127.0.0.1:5432/postgres \\
        [--tables 2000 5000] [--baseline REF] [--rounds 5] [--jobs 2] [--baseline-jobs 1]

For each count: databases with that many tables (a serial key, a unique text column with its index, and a
foreign key to the table before, in chains of ten): one for the baseline layer (``a``, ``--baseline``, default
``main``), one for this checkout's (``b``) and a plain copy. Then ``install_layer`` is timed on ``a`` and on
``b`` (batched transactions, the server's default ``max_locks_per_transaction``; ``b`` on ``--jobs``
connections at once, ``a`` on ``--baseline-jobs``), then ``ALTER TABLE … ADD
COLUMN`` on one table in the middle of a chain (a parent and a child), on ``a``, ``b`` and the plain copy (the
difference to plain is the layer's work: its event triggers). ``--baseline none`` times this checkout only.
Prints one line per count and layer, and the ratios b/a.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

# First: it takes this folder, whose other files are named like the packages, off the import path.
import _common as common
import asyncpg

from migrations import install_layer
from migrations.layer import Workers

GROUP = 10  # tables per foreign-key chain


def schema_sql(tables: int, start: int = 0) -> str:
    parts = []
    for i in range(start, tables):
        fk = f", parent_id int REFERENCES t{i - 1} (id)" if i % GROUP else ""
        parts.append(f"CREATE TABLE t{i} (id serial PRIMARY KEY, code text NOT NULL UNIQUE, qty int{fk});")
    return "\n".join(parts)


async def create_schema(conn: asyncpg.Connection, tables: int) -> None:
    """The tables, 200 per transaction (one transaction for thousands runs out of the lock table)."""
    for start in range(0, tables, 200):
        await conn.execute(schema_sql(min(tables, start + 200), start))


async def _database(admin: asyncpg.Connection, name: str) -> None:
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{name}"')


async def _alter_ms(dsn: str, table: str, rounds: int) -> float:
    """Median time of ``ALTER TABLE … ADD COLUMN`` (each round a new column) on ``table``."""
    conn = await asyncpg.connect(dsn)
    try:
        times = []
        for r in range(rounds):
            start = time.perf_counter()
            await conn.execute(f"ALTER TABLE {table} ADD COLUMN extra_{r} int")
            times.append((time.perf_counter() - start) * 1000)
        return statistics.median(times)
    finally:
        await conn.close()


class _BackendCpu:
    """CPU time of the install's backends (this machine's /proc; 0 for a remote server): each one's last value
    read every 0.2 s, as a connection closed by install takes its figure with it. Unlike wall time it does not
    count waiting for a core that other processes hold, so it tells what an idle machine would take."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.seen: dict[int, int] = {}

    def read(self) -> None:
        for pid in self.pids:
            ns = common.cpu_ns(pid)
            if ns is not None:
                self.seen[pid] = max(ns, self.seen.get(pid, 0))

    async def poll(self) -> None:
        while True:
            self.read()
            await asyncio.sleep(0.2)

    def seconds(self) -> float:
        return sum(self.seen.values()) / 1e9


async def _install_s(dsn: str, files: common.Layer, jobs: int) -> tuple[float, float, int]:
    """Install's wall time, its backends' CPU time, and the tables enabled."""
    conn = await asyncpg.connect(dsn)
    cpu = _BackendCpu()
    cpu.pids.append(conn.get_server_pid())

    async def connect() -> asyncpg.Connection:
        extra = await asyncpg.connect(dsn)
        cpu.pids.append(extra.get_server_pid())
        return extra

    poller = asyncio.create_task(cpu.poll())
    try:
        start = time.perf_counter()
        with common.installed_layer(files):
            await install_layer(conn, workers=Workers(connect, jobs))
        seconds = time.perf_counter() - start
        cpu.read()
        enabled = int(await conn.fetchval("SELECT count(*) FROM cow.registry"))
        return seconds, cpu.seconds(), enabled
    finally:
        poller.cancel()
        await conn.close()


async def run(dsn: str, count: int, rounds: int, layers: dict[str, tuple[common.Layer, int]]) -> list[str]:
    admin = await asyncpg.connect(dsn)
    names = {v: f"cow_install_{count}_{v}" for v in (*layers, "plain")}
    table = f"t{count // 2 + 1}"  # in a chain: a parent and a child
    lines = []
    try:
        for name in names.values():
            await _database(admin, name)
            conn = await asyncpg.connect(common.with_database(dsn, name))
            try:
                await create_schema(conn, count)
            finally:
                await conn.close()
        plain_ms = await _alter_ms(common.with_database(dsn, names["plain"]), table, rounds)
        results = {}
        for v, (files, jobs) in layers.items():
            common.log(f"{count} tables: installing layer {v} ({jobs} connection(s))")
            install_s, cpu_s, enabled = await _install_s(common.with_database(dsn, names[v]), files, jobs)
            layer_ms = await _alter_ms(common.with_database(dsn, names[v]), table, rounds)
            results[v] = (install_s, layer_ms - plain_ms)
            lines.append(
                f"{count} tables, layer {v}: install {install_s:.1f} s on {jobs} connection(s), backends' "
                f"CPU {cpu_s:.1f} s ({enabled} enabled, "
                f"{count / install_s:.0f} tables/s); ALTER TABLE {table} ADD COLUMN: {layer_ms:.1f} ms with "
                f"the layer, {plain_ms:.1f} ms plain "
                f"(layer work {layer_ms - plain_ms:.1f} ms; median of {rounds})"
            )
        if "a" in results and "b" in results:
            (ia, wa), (ib, wb) = results["a"], results["b"]
            work = f"{wb / wa:.2f}x" if wa > 0 else "n/a"
            lines.append(f"{count} tables, b/a: install {ib / ia:.2f}x, ALTER layer work {work}")
        return lines
    finally:
        for name in names.values():
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def main(args: argparse.Namespace) -> None:
    layers: dict[str, tuple[common.Layer, int]] = {}
    if args.baseline != "none":
        layers["a"] = (common.baseline_layer(args.baseline), args.baseline_jobs)
    layers["b"] = (common.this_layer(), args.jobs)
    for count in args.tables:
        for line in await run(args.dsn, count, args.rounds, layers):
            print(line, flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--dsn", required=True, help="maintenance DSN of a server the user may create databases on"
    )
    parser.add_argument("--tables", type=int, nargs="+", default=[2000, 5000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", default="main", help="git ref of layer a ('none': layer b only)")
    parser.add_argument("--jobs", type=int, default=2, help="connections of layer b's install (default 2)")
    parser.add_argument(
        "--baseline-jobs",
        type=int,
        default=1,
        help="connections of layer a's install (default 1; a layer without cow._refresh_batch uses one)",
    )
    sys.exit(common.run_main("install_scale", main(parser.parse_args())))
