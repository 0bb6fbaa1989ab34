"""Joins across several overlay views in a session: the plain tables against the views, side by side.

A chain of four tables ``a`` (``--rows``), ``b`` (``--rows``, ``b.a_id`` indexed), ``c`` (``--rows`` / 5,
``c.b_id`` indexed) and ``d`` (``--rows`` / 50) exists twice in one database: ``plain.*`` (no layer) and
``public.*`` (the layer installed on ``public``). Session ``joins`` holds 1k changes in each of ``a``, ``b``
and ``c``. Variants, one connection each:

- ``plain``       the plain tables;
- ``session``     the overlay views in session ``joins``, the statements as written (a client that joins the
                  session with ``cow.use_session`` directly);
- ``proxy``       the same session, the statements as the proxy sends them (its rewrites, here the LATERAL
                  key joins of docs/rewrites.md, applied by ``proxy.sql.Analyzer``; without the proxy's own
                  round trip, which bench/proxy.py measures);
- ``session, nl`` the statements as written with ``enable_hashjoin``, ``enable_mergejoin`` off and no
                  parallel workers: the planner settings that would also hide the problem, at a price (last
                  op).

PostgreSQL keeps no statistics for the columns of a ``UNION ALL`` view, so it estimates a join on a view's
key with its default of 200 distinct values: joining 10 rows to a 1M-row view is estimated at 50k rows, and
with every further join the error multiplies until the plan reads whole tables. Operations: 10 rows of ``d``
(or ``c``) joined along the chain to 2, 3 and 4 tables, the rows of ``b`` under one ``a`` (the foreign-key
index), the rows of ``b`` and ``c`` under 100 rows of ``a``, an aggregate over 20k rows of ``c`` joined to
``b`` and ``a``, and an aggregate over a join on columns without an index (``d.y = c.x``). Each op runs
``--batch`` times per round over ``--rounds`` rounds after a warm-up, variants interleaved; the figure is the
median. An op that exceeds ``--timeout`` seconds is cancelled and reported as such.

    .venv/bin/python bench/joins.py [--rows 1000000] [--dsn DSN] [--rounds 3] [--batch 10] [--timeout 10]
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

# First: it takes this folder, whose other files are named like the packages, off the import path.
import _common as common
import asyncpg

from migrations import install_layer
from proxy.sql import CATALOG_QUERY, Analyzer, Catalog

SESSION = "joins"
SCHEMA = """
CREATE TABLE {s}.a (id bigint PRIMARY KEY, v int NOT NULL, note text);
CREATE TABLE {s}.b (id bigint PRIMARY KEY, a_id bigint NOT NULL REFERENCES {s}.a, w int NOT NULL);
CREATE INDEX ON {s}.b (a_id);
CREATE TABLE {s}.c (id bigint PRIMARY KEY, b_id bigint NOT NULL REFERENCES {s}.b, x int NOT NULL);
CREATE INDEX ON {s}.c (b_id);
CREATE TABLE {s}.d (id bigint PRIMARY KEY, c_id bigint NOT NULL REFERENCES {s}.c, y int NOT NULL);
INSERT INTO {s}.a SELECT g, g % 100, 'n' || g FROM generate_series(1, $1::bigint) g;
INSERT INTO {s}.b SELECT g, (g * 7919) % $1 + 1, g % 10 FROM generate_series(1, $1::bigint) g;
INSERT INTO {s}.c SELECT g, (g * 104729) % $1 + 1, g FROM generate_series(1, $1::bigint / 5) g;
INSERT INTO {s}.d SELECT g, (g * 31) % ($1 / 5) + 1, g FROM generate_series(1, $1::bigint / 50) g;
"""
SESSION_WRITES = """
UPDATE a SET v = v + 1 WHERE id % ($1::bigint / 1000) = 0;
UPDATE b SET w = w + 1 WHERE id % ($1::bigint / 1000) = 0;
UPDATE c SET x = x + 1 WHERE id % ($1::bigint / 5000) = 0;
"""
VARIANTS = {
    "plain": "SET search_path = plain",
    "session": "SELECT cow.use_session('joins')",
    "proxy": "SELECT cow.use_session('joins')",
    "session, nl": "SELECT cow.use_session('joins'); SET enable_hashjoin = off; SET enable_mergejoin = off; "
    "SET max_parallel_workers_per_gather = 0",
}


@dataclass(frozen=True)
class Op:
    name: str
    sql: str
    keyed: bool  # takes $1, a key that moves with every execution


OPS = (
    Op(
        "join 2 tables, 10 rows",
        "SELECT c.id, b.w FROM c JOIN b ON b.id = c.b_id WHERE c.id BETWEEN $1 AND $1 + 9",
        True,
    ),
    Op(
        "join 3 tables, 10 rows",
        "SELECT c.id, b.w, a.note FROM c JOIN b ON b.id = c.b_id JOIN a ON a.id = b.a_id "
        "WHERE c.id BETWEEN $1 AND $1 + 9",
        True,
    ),
    Op(
        "join 4 tables, 10 rows",
        "SELECT d.id, c.x, b.w, a.note FROM d JOIN c ON c.id = d.c_id JOIN b ON b.id = c.b_id "
        "JOIN a ON a.id = b.a_id WHERE d.id BETWEEN $1 AND $1 + 9",
        True,
    ),
    Op("children by foreign key", "SELECT b.* FROM a JOIN b ON b.a_id = a.id WHERE a.id = $1", True),
    Op(
        "children and grandchildren of 100 rows",
        "SELECT a.id, b.w, c.x FROM a JOIN b ON b.a_id = a.id JOIN c ON c.b_id = b.id "
        "WHERE a.id BETWEEN $1 AND $1 + 99",
        True,
    ),
    Op(
        "aggregate over 3 tables, 20k rows",
        "SELECT a.v, count(*) FROM c JOIN b ON b.id = c.b_id JOIN a ON a.id = b.a_id WHERE c.id <= 20000 "
        "GROUP BY a.v",
        False,
    ),
    Op("aggregate over a join without index", "SELECT count(*) FROM d JOIN c ON c.x = d.y", False),
)


@dataclass(frozen=True)
class Config:
    rows: int
    dsn: str | None
    rounds: int
    batch: int
    timeout: float


def parse_args(argv: list[str] | None = None) -> Config:
    p = common.argument_parser(__doc__, rows=1_000_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--timeout", type=float, default=10.0, help="seconds after which an op is cancelled")
    a = p.parse_args(argv)
    if a.rows < 100_000:
        p.error("--rows must be at least 100000")
    if a.rounds < 1 or a.batch < 1 or a.timeout <= 0:
        p.error("--rounds, --batch and --timeout must be positive")
    return Config(a.rows, a.dsn, a.rounds, a.batch, a.timeout)


async def build(dsn: str, cfg: Config) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        t0 = time.perf_counter()
        await conn.execute("CREATE SCHEMA plain")
        for schema in ("public", "plain"):
            for stmt in SCHEMA.format(s=schema).split(";\n"):
                if stmt.strip():
                    await conn.execute(stmt, *([cfg.rows] if "$1" in stmt else []))
        await conn.execute("VACUUM ANALYZE")
        common.log(f"filled 2 x {cfg.rows * 2.22:.0f} rows in {time.perf_counter() - t0:.1f} s")
        await install_layer(conn, schemas=("public",))
        await conn.execute("SELECT cow.use_session($1)", SESSION)
        for stmt in SESSION_WRITES.strip().split(";\n"):
            await conn.execute(stmt.rstrip(";"), cfg.rows)
        await conn.execute("SELECT cow.use_session(NULL)")
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


async def measure(dsn: str, cfg: Config) -> dict[tuple[str, str], list[float | None]]:
    conns = {}
    for v, setup in VARIANTS.items():
        conn = await asyncpg.connect(dsn, server_settings={"jit": "off"})
        await conn.execute(setup)
        await conn.execute(f"SET statement_timeout = {int(cfg.timeout * 1000)}")
        conns[v] = conn
    times: dict[tuple[str, str], list[float | None]] = {(op.name, v): [] for op in OPS for v in VARIANTS}
    catalog = Catalog.from_rows([tuple(r) for r in await conns["proxy"].fetch(CATALOG_QUERY)])
    analyzer = Analyzer()
    sent = {op.name: analyzer.analyze(op.sql, catalog, True).rewritten or op.sql for op in OPS}
    try:
        for r in range(cfg.rounds + 1):
            started = time.perf_counter()
            for op in OPS:
                for v, conn in conns.items():
                    if None in times[(op.name, v)]:
                        continue  # timed out once: not again
                    for i in range(cfg.batch):
                        args = [(r * cfg.batch + i) * 997 % (cfg.rows // 60) + 1] if op.keyed else []
                        t0 = time.perf_counter()
                        try:
                            await conn.fetch(sent[op.name] if v == "proxy" else op.sql, *args)
                        except asyncpg.QueryCanceledError:
                            times[(op.name, v)].append(None)
                            break
                        if r:
                            times[(op.name, v)].append(time.perf_counter() - t0)
            common.log_round(r, cfg.rounds, started)
    finally:
        for conn in conns.values():
            await conn.close()
    return times


def report(cfg: Config, times: dict[tuple[str, str], list[float | None]], version: str) -> list[str]:
    names = list(VARIANTS)
    lines = [
        f"PostgreSQL {version}; a, b: {cfg.rows} rows, c: {cfg.rows // 5}, d: {cfg.rows // 50}; session "
        f"{SESSION} holds 1k changes in each of a, b, c. Median ms per op and ratio to plain:",
        "",
        "| operation | "
        + " | ".join(f"{v} ms" for v in names)
        + " | "
        + " | ".join(f"{v} ×" for v in names[1:])
        + " |",
        "|---|" + "---:|" * (2 * len(names) - 1),
    ]
    for op in OPS:
        med: dict[str, float | None] = {}
        for v in names:
            ts = times[(op.name, v)]
            med[v] = None if None in ts or not ts else statistics.median(t for t in ts if t is not None)
        cells = [f"> {cfg.timeout * 1000:.0f}" if med[v] is None else f"{med[v] * 1000:.3f}" for v in names]
        base = med["plain"]
        ratios = [
            "–"
            if base is None
            else (f"> {cfg.timeout / base:.0f}" if med[v] is None else f"{med[v] / base:.2f}")
            for v in names[1:]
        ]
        lines.append(f"| {op.name} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    return lines


async def main_async(cfg: Config) -> None:
    with common.server(cfg.dsn, "512MB") as admin_dsn:
        async with common.scratch_database(admin_dsn, f"cowbench_{os.getpid()}") as dsn:
            await build(dsn, cfg)
            version = await common.fetchval(dsn, "SHOW server_version")
            times = await measure(dsn, cfg)
            print("\n".join(report(cfg, times, str(version))))


def main(argv: list[str] | None = None) -> int:
    return common.run_main("bench/joins.py", main_async(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
