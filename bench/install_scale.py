"""`cowproxy install` on generated schemas of thousands of tables, and the cost of one app DDL statement then.

    .venv/bin/python bench/install_scale.py --dsn postgresql://postgres@127.0.0.1:5432/postgres \
        [--tables 2000 5000]

For each count: a database with that many tables (a serial key, a unique text column with its index, and a
foreign key to the table before, in groups of ten), then `install_layer` timed (batched transactions, the
server's default `max_locks_per_transaction`), then `ALTER TABLE … ADD COLUMN` on one table in the middle,
timed on that database and on a plain copy of the schema made before the install (the difference is the
layer's work: its event triggers). Prints one line per count.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import asyncpg

from migrations import install_layer

GROUP = 10  # tables per foreign-key chain


def schema_sql(tables: int) -> str:
    parts = []
    for i in range(tables):
        fk = f", parent_id int REFERENCES t{i - 1} (id)" if i % GROUP else ""
        parts.append(f"CREATE TABLE t{i} (id serial PRIMARY KEY, code text NOT NULL UNIQUE, qty int{fk});")
    return "\n".join(parts)


async def _database(admin: asyncpg.Connection, name: str) -> None:
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{name}"')


def _dsn(dsn: str, database: str) -> str:
    head, _, _ = dsn.rpartition("/")
    return f"{head}/{database}"


async def _alter_ms(dsn: str, table: str, rounds: int) -> float:
    """Median time of ``ALTER TABLE … ADD COLUMN`` (then DROP COLUMN, untimed) on ``table``."""
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


async def run(dsn: str, count: int, rounds: int) -> str:
    admin = await asyncpg.connect(dsn)
    layer_db, plain_db = f"cow_install_{count}", f"cow_install_{count}_plain"
    try:
        for name in (layer_db, plain_db):
            await _database(admin, name)
            conn = await asyncpg.connect(_dsn(dsn, name))
            try:
                await conn.execute(schema_sql(count))
            finally:
                await conn.close()
        conn = await asyncpg.connect(_dsn(dsn, layer_db))
        try:
            start = time.perf_counter()
            await install_layer(conn)
            install_s = time.perf_counter() - start
            enabled = await conn.fetchval("SELECT count(*) FROM cow.registry")
        finally:
            await conn.close()
        table = f"t{count // 2 + 1}"  # in a chain: a parent and a child
        layer_ms = await _alter_ms(_dsn(dsn, layer_db), table, rounds)
        plain_ms = await _alter_ms(_dsn(dsn, plain_db), table, rounds)
        return (
            f"{count} tables: install {install_s:.1f} s ({enabled} enabled, "
            f"{count / install_s:.0f} tables/s); "
            f"ALTER TABLE {table} ADD COLUMN: {layer_ms:.1f} ms with the layer, {plain_ms:.1f} ms plain "
            f"(layer work {layer_ms - plain_ms:.1f} ms; median of {rounds})"
        )
    finally:
        for name in (layer_db, plain_db):
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--dsn", required=True, help="maintenance DSN of a server the user may create databases on"
    )
    parser.add_argument("--tables", type=int, nargs="+", default=[2000, 5000])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    for count in args.tables:
        print(asyncio.run(run(args.dsn, count, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
