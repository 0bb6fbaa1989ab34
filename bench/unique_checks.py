"""Cost of the session-side checks of a partial UNIQUE index (migration 0002) per write.

Two tables of ``--rows`` rows each, alike except that ``items_idx`` has the soft-delete index
``UNIQUE (grp, name) WHERE deleted_at IS NULL`` and ``items_noidx`` has none, exist in schema ``public``
(the layer installed on it) and as plain copies in schema ``plain``. Other sessions hold ``--other-changes``
changes of each table and the measured session ``bench`` ``--session-changes``. Variants, one connection
each:

- ``plain/noidx``, ``plain/idx``: the plain tables (the index's own cost on a table without cowproxy);
- ``session/noidx``, ``session/idx``: the overlay views in session ``bench``.

Operations (prepared statements through asyncpg, autocommit): insert one row, update one row's ``name``
(a column the index reads: the check runs) and one row's ``note`` (it does not read it: the check is
skipped). The variants take turns op by op in a shuffled order over a warm-up round and ``--rounds`` rounds
of ``--batch`` ops (``synchronous_commit = off``: no WAL flush per write); the figure is the median of every
single op, and the per-round means give the spread.
``session/idx - session/noidx`` is what the check adds to a write.

    .venv/bin/python bench/unique_checks.py [--rows 100000] [--dsn DSN] [--rounds 5] [--batch 300]

Without ``--dsn`` an embedded PostgreSQL is started; with ``--dsn`` a scratch database ``cowbench_u<pid>``
is created on that server and dropped at the end.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from dataclasses import dataclass

# First: it takes this folder, whose other files are named like the packages, off the import path.
import _common as common
import asyncpg

from migrations import install_layer

SESSION = "bench"
TABLES = ("items_noidx", "items_idx")
VARIANTS = tuple(f"{side}/{t.split('_')[1]}" for side in ("plain", "session") for t in TABLES)
DDL = """
CREATE TABLE {schema}.{table} (
    id bigint PRIMARY KEY,
    grp int NOT NULL,
    name text NOT NULL,
    deleted_at timestamptz,
    note text
);
INSERT INTO {schema}.{table}
SELECT g, g % 1000, 'item ' || g, CASE WHEN g % 5 = 0 THEN timestamptz '2026-01-01' END, NULL
FROM generate_series(1, {rows}) AS g;
"""
INDEX = "CREATE UNIQUE INDEX {table}_live ON {schema}.{table} (grp, name) WHERE deleted_at IS NULL"

OPS = {
    "insert 1 row": "INSERT INTO {table} (id, grp, name)"
    " VALUES ($1::bigint, $1::bigint % 1000, 'new ' || $1::bigint)",
    "update name (checked)": "UPDATE {table} SET name = 'renamed ' || $1::bigint WHERE id = $1::bigint",
    "update note (not checked)": "UPDATE {table} SET note = 'n' WHERE id = $1",
}


@dataclass(frozen=True)
class Config:
    rows: int
    dsn: str | None
    rounds: int
    batch: int
    session_changes: int
    other_changes: int
    seed: int


def parse_args(argv: list[str] | None = None) -> Config:
    p = common.argument_parser(__doc__, rows=100_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch", type=int, default=300)
    p.add_argument("--session-changes", type=int, default=1_000)
    p.add_argument("--other-changes", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    if a.rounds < 1 or a.batch < 1:
        p.error("--rounds and --batch must be positive")
    if a.session_changes + a.other_changes + 2 * (a.rounds + 1) * a.batch > a.rows * 4 // 5:
        p.error("--rows is too small for the changes and the measured updates")
    return Config(a.rows, a.dsn, a.rounds, a.batch, a.session_changes, a.other_changes, a.seed)


async def build(dsn: str, cfg: Config, ids: list[int]) -> None:
    """The tables, the layer, other sessions' and the measured session's changes (ids[0:k] of the pool)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE SCHEMA plain")
        for schema in ("public", "plain"):
            for table in TABLES:
                await conn.execute(DDL.format(schema=schema, table=table, rows=cfg.rows))
            await conn.execute(INDEX.format(schema=schema, table="items_idx"))
        await install_layer(conn, schemas=("public",))
        other = ids[: cfg.other_changes]
        mine = ids[cfg.other_changes : cfg.other_changes + cfg.session_changes]
        for table in TABLES:
            for s in range(10):  # ten other sessions
                await conn.execute("SELECT cow.use_session($1)", f"other{s}")
                await conn.execute(
                    f"UPDATE {table} SET note = 'other' WHERE id = ANY ($1::bigint[])", other[s::10]
                )
            await conn.execute("SELECT cow.use_session($1)", SESSION)
            await conn.execute(f"UPDATE {table} SET note = 'mine' WHERE id = ANY ($1::bigint[])", mine)
            await conn.execute("SELECT cow.use_session(NULL)")
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


async def measure(dsn: str, cfg: Config, pool: list[int]) -> dict[tuple[str, str], tuple[float, list[float]]]:
    rng = random.Random(cfg.seed + 1)
    conns: dict[str, asyncpg.Connection] = {}
    for v in VARIANTS:
        # No WAL flush per autocommit write: on a server that syncs its commits the flush would drown the
        # difference measured here.
        conns[v] = await asyncpg.connect(dsn, server_settings={"synchronous_commit": "off"})
        if v.startswith("plain"):
            await conns[v].execute("SET search_path = plain")
        else:
            await conns[v].execute("SELECT cow.use_session($1)", SESSION)
    try:
        stmts = {
            (op, v): await conns[v].prepare(sql.format(table="items_" + v.split("/")[1]))
            for op, sql in OPS.items()
            for v in VARIANTS
        }
        samples: dict[tuple[str, str], list[list[float]]] = {k: [] for k in stmts}
        fresh = 10 * cfg.rows
        for r in range(cfg.rounds + 1):  # round 0 warms up (plans, plpgsql compilation) and is not counted
            t0 = time.perf_counter()
            for op in OPS:
                # The same ids for every variant (they write different tables): alike work.
                if op.startswith("insert"):
                    ids = list(range(fresh, fresh + cfg.batch))
                    fresh += cfg.batch
                else:
                    ids = [pool.pop() for _ in range(cfg.batch)]
                times: dict[str, list[float]] = {v: [] for v in VARIANTS}
                order = list(VARIANTS)
                for i in ids:
                    rng.shuffle(order)
                    for v in order:
                        t = time.perf_counter()
                        await stmts[(op, v)].fetch(i)
                        times[v].append((time.perf_counter() - t) * 1000)
                if r:
                    for v in VARIANTS:
                        samples[(op, v)].append(times[v])
            common.log_round(r, cfg.rounds, t0)
        return {
            k: (statistics.median(x for b in s for x in b), [statistics.fmean(b) for b in s])
            for k, s in samples.items()
        }
    finally:
        for c in conns.values():
            await c.close()


def report(cfg: Config, res: dict[tuple[str, str], tuple[float, list[float]]], version: str) -> list[str]:
    out = [
        f"PostgreSQL {version}, {cfg.rows} rows per table, session {cfg.session_changes} changes, other "
        f"sessions {cfg.other_changes}; {cfg.rounds} rounds x {cfg.batch} ops; ms per op: median of all ops "
        "[min-max of the round means]",
        "",
        "| operation | " + " | ".join(VARIANTS) + " | session idx - noidx |",
        "|---" * (len(VARIANTS) + 2) + "|",
    ]
    for op in OPS:
        cells = []
        for v in VARIANTS:
            med, rounds = res[(op, v)]
            cells.append(f"{med:.3f} [{min(rounds):.3f}-{max(rounds):.3f}]")
        added = res[(op, "session/idx")][0] - res[(op, "session/noidx")][0]
        out.append(f"| {op} | " + " | ".join(cells) + f" | {added * 1000:+.0f} us |")
    return out


async def main_async(cfg: Config) -> None:
    rng = random.Random(cfg.seed)
    # Base ids for the other sessions, the measured session and the measured updates, none twice; live rows
    # (id % 5 <> 0), so that every measured update of `name` runs the lookup.
    need = cfg.other_changes + cfg.session_changes + 2 * (cfg.rounds + 1) * cfg.batch
    pool = rng.sample([i for i in range(1, cfg.rows + 1) if i % 5], need)
    with common.server(cfg.dsn, "256MB") as admin_dsn:
        async with common.scratch_database(admin_dsn, f"cowbench_u{os.getpid()}") as dsn:
            t0 = time.perf_counter()
            await build(dsn, cfg, pool)
            common.log(f"built in {time.perf_counter() - t0:.1f} s")
            version = str(await common.fetchval(dsn, "SHOW server_version"))
            res = await measure(dsn, cfg, pool[cfg.other_changes + cfg.session_changes :])
            print("\n".join(report(cfg, res, version)))


def main(argv: list[str] | None = None) -> int:
    return common.run_main("bench/unique_checks.py", main_async(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
