"""An application's temporary tables on a database with the layer: a baseline layer (a git ref's SQL files)
against this checkout's, and the plain database, side by side.

    .venv/bin/python bench/temp_tables.py --dsn postgresql://postgres@127.0.0.1:5432/postgres \\
        [--tables 200] [--rounds 60] [--baseline REF]

Three databases with ``--tables`` keyed tables: one with the baseline layer (``a``, default ``main``), one
with this checkout's (``b``), one plain. Then, round by round in turn on each (so load from other jobs hits
all alike), one cycle of what an application does with a scratch table: ``CREATE TEMP TABLE``, an index, an
``INSERT … SELECT``, an ``ALTER TABLE`` and a ``DROP TABLE``. Prints the median milliseconds per cycle and the
ratios to plain: what the layer's DDL event triggers add to it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

# First: it takes this folder, whose other files are named like the packages, off the import path.
import _common as common
import asyncpg

from migrations import install_layer

CYCLE = (
    "CREATE TEMP TABLE scratch (id int PRIMARY KEY, v text)",
    "CREATE INDEX ON scratch (v)",
    "INSERT INTO scratch SELECT id, code FROM t0",
    "ALTER TABLE scratch ADD COLUMN w int",
    "DROP TABLE scratch",
)


async def _database(admin: asyncpg.Connection, dsn: str, name: str, tables: int) -> str:
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{name}"')
    db = common.with_database(dsn, name)
    conn = await asyncpg.connect(db)
    try:
        for i in range(tables):
            await conn.execute(f"CREATE TABLE t{i} (id serial PRIMARY KEY, code text NOT NULL)")
        await conn.execute("INSERT INTO t0 (code) SELECT 'c' || g FROM generate_series(1, 100) g")
    finally:
        await conn.close()
    return db


async def _install(db: str, files: common.Layer) -> None:
    conn = await asyncpg.connect(db)
    try:
        with common.installed_layer(files):
            await install_layer(conn)
    finally:
        await conn.close()


async def _cycle_ms(conn: asyncpg.Connection) -> float:
    start = time.perf_counter()
    for statement in CYCLE:
        await conn.execute(statement)
    return (time.perf_counter() - start) * 1000


async def main(args: argparse.Namespace) -> None:
    layers: dict[str, common.Layer] = {"a": common.baseline_layer(args.baseline), "b": common.this_layer()}
    admin = await asyncpg.connect(args.dsn)
    names = {v: f"cow_temp_tables_{v}" for v in ("a", "b", "plain")}
    try:
        dbs = {v: await _database(admin, args.dsn, name, args.tables) for v, name in names.items()}
        for v, files in layers.items():
            common.log(f"installing layer {v}")
            await _install(dbs[v], files)
        conns = {v: await asyncpg.connect(db) for v, db in dbs.items()}
        try:
            times: dict[str, list[float]] = {v: [] for v in conns}
            for _ in range(args.rounds):
                for v, conn in conns.items():
                    times[v].append(await _cycle_ms(conn))
        finally:
            for conn in conns.values():
                await conn.close()
        medians = {v: statistics.median(t) for v, t in times.items()}
        for v, median in medians.items():
            print(
                f"{args.tables} tables, {v:5}: {median:7.2f} ms per cycle (median of {args.rounds}),"
                f" {median / medians['plain']:.2f}x plain",
                flush=True,
            )
        print(f"b/a: {medians['b'] / medians['a']:.2f}x", flush=True)
    finally:
        for name in names.values():
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--dsn", required=True, help="maintenance DSN of a server the user may create databases on"
    )
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--baseline", default="main", help="git ref of layer a")
    sys.exit(common.run_main("temp_tables", main(parser.parse_args())))
