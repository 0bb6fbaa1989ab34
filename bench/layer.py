"""CoW layer speed: the plain table against the overlay view, without and within a session, side by side.

One table of ``--rows`` rows (default 1M) exists twice in one database: ``plain.items`` (no layer: the
reference) and ``public.items`` (the layer installed on ``public``). Variants, one connection each:

- ``plain``      ``plain.items``: a database without cowproxy;
- ``untagged``   ``public.items`` with the default search_path: what untagged traffic runs (the base table
                 plus the layer's statement-level guard trigger);
- ``view``       the overlay view ``cow_overlay_public.items`` with no session set;
- ``session``    the overlay view in session ``bench``, which holds ``--session-changes`` changes (1k) while
                 other sessions hold ``--other-changes`` (100k). Its measured writes go to session
                 ``bench-writes`` (built alike), so that every round reads the same session size (before,
                 each round's writes grew ``bench`` by 3 x ``--batch`` changes: ~9k by the last round).
- ``proxy``      session ``bench``, the statements as cowproxy sends them (``proxy.sql.Analyzer``: its
                 rewrites, such as the split ``count(*)`` and the LATERAL key joins of docs/rewrites.md),
                 without the proxy's own round trip (bench/proxy.py measures that); only for the
                 operations the proxy rewrites (the others it sends as written: the session's figures).
                 Prepared ops run the form of a named statement; "unprepared" ones the unnamed form sent
                 unnamed, an upper bound: the proxy runs an unnamed rewritten read as a named statement of
                 its own (docs/proxy.md), which pgbench -M extended through the proxy measures.
- ``base``       (``--baseline REF``) the overlay view in session ``bench``, in a second database built
                 alike but with the layer's migrations as of git ref REF: a before/after of the layer in
                 one run (the variants take turns op by op, so the machine's load falls on both alike);
                 ``base-untagged`` the base table there with the default search_path (the baseline's
                 guard: what untagged traffic ran before).
- ``bound``      (``--bound``) the overlay view in session ``bench`` on a backend bound to it with
                 ``cow.bind_session`` and the binding secret, as cowproxy joins (``session`` joins with
                 ``cow.use_session``, the no-proxy path).
- ``stale``      (``--stale-session``, reads only) the overlay view in session ``bench-stale``, built like
                 ``bench`` but with each of its rows rewritten once after the last VACUUM: its pages are not
                 all-visible and ``<t>_cur`` still holds the entries of the retired versions, as in a session
                 that writes faster than autovacuum visits the changes table (autovacuum is off on the
                 changes table for the run, so that the two states stay as built).
- ``<shape>``, ``<shape> no session`` (``--shapes a,b``, reads only) candidate overlay view shapes for the
                 same table, built next to the layer's view (see ``SHAPES``), in session ``bench`` and
                 without a session: an A/B against the layer's shape in one run.

``--rls`` puts row-level security (a tenant-style policy on a setting that every row passes) on both tables
and runs every variant as a non-superuser role: ``session`` is then the RLS-aware overlay view against the
plain table with the same policy.

Operations (prepared statements through asyncpg, as a client would): PK point select, 100-row range, a
keyset page (``id >= $1 ORDER BY id LIMIT 100``), the last 20 rows (``ORDER BY id DESC LIMIT 20``), 10 rows
of a small table ``picks`` joined to items on the primary key and 1 joined on the indexed column ``grp``
(``--list-batch`` ops per batch: these read the whole table where the plan cannot use an index),
``count(*)``, single-row insert / update / delete (autocommit). The keyset page and the primary-key join also
run with a generic plan. The point select, the range and ``count(*)``
also run with ``plan_cache_mode = force_generic_plan`` (no planning per execution), the point select and
``count(*)`` with ``jit = on`` (default thresholds; the other connections run ``jit = off``), to catch plans
whose estimated cost triggers JIT compilation, and the point select and the range "unprepared" (an unnamed
statement per execution: parsed and planned every time, as for a client on the simple query protocol). The
variants take turns op by op, in a shuffled order each time, over a warm-up round and ``--rounds`` rounds of
``--batch`` ops; the figure is the median of every single op (robust against the spikes of a shared
machine), and the per-round ratios show the spread. The estimated cost of each generic plan is printed
against ``jit_above_cost``. ``--explain`` prints EXPLAIN ANALYZE per variant: the point select (custom and
generic plan), the range, ``count(*)`` with jit on, and an update (rolled back) with its trigger time.

    .venv/bin/python bench/layer.py [--rows 1000000] [--dsn DSN] [--rounds 7] [--explain] [--only REGEX]
        [--baseline REF] [--bound] [--rls]

Without ``--dsn`` an embedded PostgreSQL is started (``shared_buffers=512MB`` so both copies stay cached);
with ``--dsn`` a scratch database ``cowbench_<pid>`` (and ``cowbench_<pid>_a`` for ``--baseline``) is
created on that server and dropped at the end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import random
import re
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

# First: it takes this folder, whose other files are named like the packages, off the import path.
import _common as common
import asyncpg

from migrations import install_layer
from migrations.binding import new_secret
from proxy.sql import CATALOG_QUERY, Analyzer, Catalog

VARIANTS = ("plain", "untagged", "view", "session")
SESSION = "bench"
WRITE_SESSION = "bench-writes"  # the session variant's measured writes: they must not grow SESSION
STALE_SESSION = "bench-stale"
NO_SESSION = " no session"

# Candidate overlay view shapes (--shapes), written for the bench's table: {ch} is its changes table, {s} the
# session expression of the layer's view. Each is read through like the layer's view, in the same rounds.
_S = "nullif(pg_catalog.current_setting('cow.session_id', true), '')"
_B = "b.id, b.grp, b.name, b.qty, b.note"
_C = "c.id, c.grp, c.name, c.qty, c.note"
_CHANGES = (
    f"SELECT {_C} FROM {{ch}} c "
    f"WHERE {_S} IS NOT NULL AND c._cow_session = {_S} AND c._cow_current AND NOT c._cow_deleted"
)
SHAPES = {
    # Not an overlay: the base table minus the rows the session has a version of (a bare anti join written
    # on the table, no view, no session rows). Any overlay that hides changed base rows pays at least this,
    # so its ratio is the floor for the view shapes' reads.
    "floor": f"""
SELECT {_B} FROM public.items b WHERE NOT EXISTS (
    SELECT 1 FROM {{ch}} x WHERE x._cow_session = {_S} AND x._cow_current AND x.id = b.id)""",
    # The layer's shape with nested-loop anti joins only (a per-key probe of <t>_cur per base row).
    "nested-loop": "",
    # The layer's view without its binding gate (the InitPlan probing cow.my_binding): what the
    # gate costs. (Made from the view's definition: see no_gate_view.)
    "no-gate": "",
    # The base branch filters with a hashed NOT IN subplan instead of the anti join (no per-key form).
    "not-in": f"""
SELECT {_B} FROM public.items b WHERE {_S} IS NULL
UNION ALL SELECT {_B} FROM public.items b WHERE {_S} IS NOT NULL AND b.id NOT IN (
    SELECT c.id FROM {{ch}} c WHERE c._cow_session = {_S} AND c._cow_current AND c.id IS NOT NULL)
UNION ALL {_CHANGES}""",
    # Leaves without WHERE (so the UNION ALL becomes one append relation: no Subquery Scan/Result per row),
    # the branch conditions in the outer WHERE on a constant discriminator, folded per leaf; NOT IN.
    "flat": f"""
SELECT u.id, u.grp, u.name, u.qty, u.note FROM (
    SELECT 1 AS k, {_B}, NULL::text AS s, NULL::boolean AS cur, NULL::boolean AS del FROM public.items b
    UNION ALL SELECT 2, {_B}, NULL, NULL, NULL FROM public.items b
    UNION ALL SELECT 3, {_C}, c._cow_session, c._cow_current, c._cow_deleted FROM {{ch}} c) u
WHERE CASE u.k WHEN 1 THEN {_S} IS NULL
               WHEN 2 THEN {_S} IS NOT NULL AND u.id NOT IN (
                   SELECT c.id FROM {{ch}} c
                   WHERE c._cow_session = {_S} AND c._cow_current AND c.id IS NOT NULL)
               ELSE {_S} IS NOT NULL AND u.s = {_S} AND u.cur AND NOT u.del END""",
    # Flat leaves for the no-session base rows and the session's versions, the anti join kept in its own
    # leaf (a subquery with WHERE: not pulled up, so still a join): only the no-session reads change.
    "mixed": f"""
SELECT u.id, u.grp, u.name, u.qty, u.note FROM (
    SELECT 1 AS k, {_B}, NULL::text AS s, NULL::boolean AS cur, NULL::boolean AS del FROM public.items b
    UNION ALL SELECT 2, {_B}, NULL, NULL, NULL FROM public.items b WHERE NOT EXISTS (
        SELECT 1 FROM {{ch}} c WHERE c._cow_session = {_S} AND c._cow_current AND c.id = b.id)
    UNION ALL SELECT 3, {_C}, c._cow_session, c._cow_current, c._cow_deleted FROM {{ch}} c) u
WHERE CASE u.k WHEN 1 THEN {_S} IS NULL WHEN 2 THEN {_S} IS NOT NULL
               ELSE {_S} IS NOT NULL AND u.s = {_S} AND u.cur AND NOT u.del END""",
    # The same with NOT EXISTS: a correlated subplan with a hashed alternative (costed as the per-row one).
    "flat-exists": f"""
SELECT u.id, u.grp, u.name, u.qty, u.note FROM (
    SELECT 1 AS k, {_B}, NULL::text AS s, NULL::boolean AS cur, NULL::boolean AS del FROM public.items b
    UNION ALL SELECT 2, {_B}, NULL, NULL, NULL FROM public.items b
    UNION ALL SELECT 3, {_C}, c._cow_session, c._cow_current, c._cow_deleted FROM {{ch}} c) u
WHERE CASE u.k WHEN 1 THEN {_S} IS NULL
               WHEN 2 THEN {_S} IS NOT NULL AND NOT EXISTS (
                   SELECT 1 FROM {{ch}} c WHERE c._cow_session = {_S} AND c._cow_current AND c.id = u.id)
               ELSE {_S} IS NOT NULL AND u.s = {_S} AND u.cur AND NOT u.del END""",
    # Two flat leaves (base, changes) under one anti join whose condition names the base leaf.
    "anti-over-append": f"""
SELECT u.id, u.grp, u.name, u.qty, u.note FROM (
    SELECT 1 AS k, {_B}, NULL::text AS s, NULL::boolean AS cur, NULL::boolean AS del FROM public.items b
    UNION ALL SELECT 2, {_C}, c._cow_session, c._cow_current, c._cow_deleted FROM {{ch}} c) u
WHERE CASE u.k WHEN 1 THEN true ELSE {_S} IS NOT NULL AND u.s = {_S} AND u.cur AND NOT u.del END
  AND NOT EXISTS (SELECT 1 FROM {{ch}} x WHERE u.k = 1 AND {_S} IS NOT NULL AND x._cow_session = {_S}
                  AND x._cow_current AND x.id = u.id)""",
    # One branch for base rows with a LATERAL probe that cannot be pulled up (LIMIT): always per key.
    "lateral": f"""
SELECT {_B} FROM public.items b WHERE {_S} IS NULL
UNION ALL SELECT {_B} FROM public.items b LEFT JOIN LATERAL (
    SELECT true AS hit FROM {{ch}} c WHERE c._cow_session = {_S} AND c._cow_current AND c.id = b.id LIMIT 1) x
    ON true WHERE {_S} IS NOT NULL AND x.hit IS NULL
UNION ALL {_CHANGES}""",
}


# The gate as pg_get_viewdef shows it (in either form the layer has had): the first conjunct of the view's
# WHERE, up to the session condition.
_GATE = re.compile(r"WHERE \(\(.*?cow\._read_gate\(\)\)+ AND ", re.S)


async def no_gate_view(conn: asyncpg.Connection) -> str:
    """The definition of the layer's overlay view of items without the gate."""
    viewdef = str(await conn.fetchval("SELECT pg_get_viewdef('cow_overlay_public.items'::regclass)"))
    stripped, n = _GATE.subn("WHERE (", viewdef)
    if n != 1:
        raise SystemExit("bench/layer.py: --shapes no-gate: the view has no gate of the known form")
    return stripped


def shape_schema(shape: str) -> str:
    return "bench_shape_" + shape.replace("-", "_")


# layer.py's own tables next to common.create_items's: an index on grp (joins on a non-key column) and a
# small table whose rows point at scattered items (by primary key) and at a group.
EXTRA_DDL = """
CREATE INDEX ON {schema}.items (grp);
CREATE TABLE {schema}.picks (id bigint PRIMARY KEY, item_id bigint NOT NULL, grp int NOT NULL)
"""
FILL_PICKS = """
INSERT INTO {schema}.picks (id, item_id, grp)
SELECT g, (g * 7919) % $1::bigint + 1, g % 1000 FROM generate_series(1, $2::bigint) AS g
"""

# --rls: both tables get row-level security with a tenant-style policy on a setting, which every row passes
# here (bench.tenant = 'all'), and every variant runs as this role (superusers bypass policies): the
# session's figures are then those of the RLS-aware overlay view (migrations/sql/functions/38_rls.sql),
# against the plain table with the same policy.
RLS_ROLE = "cowbench_rls"
RLS_DDL = """
ALTER TABLE {schema}.items ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant ON {schema}.items USING (current_setting('bench.tenant', true) = 'all' OR grp % 2 = 1);
GRANT USAGE ON SCHEMA {schema} TO cowbench_rls;
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.items TO cowbench_rls;
GRANT SELECT ON {schema}.picks TO cowbench_rls;
"""
RLS_ROLE_DDL = """
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cowbench_rls') THEN
        CREATE ROLE cowbench_rls;
    END IF;
END $$
"""

SELECT_POINT = "SELECT * FROM items WHERE id = $1"
SELECT_RANGE = "SELECT * FROM items WHERE id BETWEEN $1 AND $1 + 99"
SELECT_COUNT = "SELECT count(*) FROM items"
# What list endpoints and joins run: a keyset page, the newest rows, 10 rows of another table joined on the
# primary key, one row joined on an indexed column (~rows/1000 items).
SELECT_PAGE = "SELECT * FROM items WHERE id >= $1 ORDER BY id LIMIT 100"
SELECT_LAST = "SELECT * FROM items ORDER BY id DESC LIMIT 20"
JOIN_PK = "SELECT i.* FROM picks p JOIN items i ON i.id = p.item_id WHERE p.id BETWEEN $1 AND $1 + 9"
JOIN_GRP = "SELECT i.* FROM picks p JOIN items i ON i.grp = p.grp WHERE p.id = $1"
INSERT_ONE = "INSERT INTO items (id, grp, name) VALUES ($1, 1, 'new')"
UPDATE_ONE = "UPDATE items SET qty = qty + 1 WHERE id = $1"
DELETE_ONE = "DELETE FROM items WHERE id = $1"


@dataclass(frozen=True)
class Config:
    rows: int
    dsn: str | None
    rounds: int
    batch: int  # ops per batch for the fast operations
    list_batch: int  # ops per batch for keyset pages and joins (slow where a plan reads the whole table)
    count_batch: int  # ops per batch for count(*)
    session_changes: int
    other_changes: int
    other_sessions: int
    explain: bool
    seed: int
    only: str | None  # regular expression: measure only the operations whose name it finds
    stale: bool  # add the read-only variant "stale"
    shapes: tuple[str, ...]  # candidate view shapes to read through (SHAPES)
    rls: bool = False  # row-level security on both tables, every variant as a non-superuser role (RLS_DDL)
    baseline: str | None = None  # git ref of the layer of variant "base" (its own database)
    bound: bool = False  # add variant "bound"
    # (op name, the statement as the proxy rewrites it) for the ops it rewrites, from the catalog
    proxied: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Op:
    name: str
    sql: str
    kind: str  # read | list | join | last | count | insert | update | delete
    mode: str  # custom | generic | jit | unprepared | write


OPS = (
    Op("point select", SELECT_POINT, "read", "custom"),
    Op("point select, generic plan", SELECT_POINT, "read", "generic"),
    Op("point select, jit on", SELECT_POINT, "read", "jit"),
    Op("point select, unprepared", SELECT_POINT, "read", "unprepared"),
    Op("range 100 rows", SELECT_RANGE, "read", "custom"),
    Op("range 100 rows, generic plan", SELECT_RANGE, "read", "generic"),
    Op("range 100 rows, unprepared", SELECT_RANGE, "read", "unprepared"),
    Op("keyset page 100 rows", SELECT_PAGE, "list", "custom"),
    Op("keyset page 100 rows, generic plan", SELECT_PAGE, "list", "generic"),
    Op("last 20 rows (ORDER BY id DESC)", SELECT_LAST, "last", "custom"),
    Op("join 10 rows on primary key", JOIN_PK, "join", "custom"),
    Op("join 10 rows on primary key, generic plan", JOIN_PK, "join", "generic"),
    Op("join 1 row on indexed grp", JOIN_GRP, "join", "custom"),
    Op("count(*)", SELECT_COUNT, "count", "custom"),
    Op("count(*), generic plan", SELECT_COUNT, "count", "generic"),
    Op("count(*), jit on", SELECT_COUNT, "count", "jit"),
    Op("insert 1 row", INSERT_ONE, "insert", "write"),
    Op("update 1 row", UPDATE_ONE, "update", "write"),
    Op("delete 1 row", DELETE_ONE, "delete", "write"),
)


def parse_args(argv: list[str] | None = None) -> Config:
    p = common.argument_parser(__doc__, rows=1_000_000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--batch", type=int, default=400)
    p.add_argument("--list-batch", type=int, default=100, help="ops per batch for keyset pages and joins")
    p.add_argument("--count-batch", type=int, default=4)
    p.add_argument("--session-changes", type=int, default=1_000)
    p.add_argument("--other-changes", type=int, default=100_000)
    p.add_argument("--other-sessions", type=int, default=100)
    p.add_argument("--explain", action="store_true", help="print the point select's plan per variant")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--only", default=None, help="measure only the operations whose name matches this regex")
    p.add_argument(
        "--shapes",
        default="",
        help=f"comma-separated candidate view shapes to compare, reads only ({', '.join(SHAPES)})",
    )
    p.add_argument(
        "--rls",
        action="store_true",
        help="row-level security on both tables (a policy on a setting), variants as a non-superuser role",
    )
    p.add_argument("--baseline", default=None, help="git ref: variant 'base' reads through its layer")
    p.add_argument("--bound", action="store_true", help="variant 'bound': the session on a bound backend")
    p.add_argument(
        "--stale-session",
        action="store_true",
        help="also read in a session whose changes are not vacuumed (variant 'stale', reads only)",
    )
    a = p.parse_args(argv)
    if a.rows < 10_000:
        p.error("--rows must be at least 10000")
    if a.rounds < 1 or a.batch < 1 or a.list_batch < 1 or a.count_batch < 1 or a.other_sessions < 1:
        p.error("--rounds, --batch, --list-batch, --count-batch and --other-sessions must be positive")
    if (a.session_changes + a.other_changes) * 2 > a.rows:
        p.error("--rows must be at least twice the number of changes")
    shapes = tuple(x for x in a.shapes.split(",") if x)
    for x in shapes:
        if x not in SHAPES:
            p.error(f"--shapes: unknown shape {x!r} ({', '.join(SHAPES)})")
    if a.only is not None:
        try:
            pattern = re.compile(a.only)
        except re.error as exc:
            p.error(f"--only: {exc}")
        if not any(pattern.search(op.name) for op in OPS):
            p.error(f"--only {a.only!r} matches no operation ({', '.join(op.name for op in OPS)})")
    return Config(
        rows=a.rows,
        dsn=a.dsn,
        rounds=a.rounds,
        batch=a.batch,
        list_batch=a.list_batch,
        count_batch=a.count_batch,
        session_changes=a.session_changes,
        other_changes=a.other_changes,
        other_sessions=a.other_sessions,
        explain=a.explain,
        seed=a.seed,
        only=a.only,
        stale=a.stale_session,
        shapes=shapes,
        rls=a.rls,
        baseline=a.baseline,
        bound=a.bound,
    )


READ_KINDS = ("read", "list", "join", "last", "count")
BASE = "a"  # the key of the baseline's database in the DSNs by database
SECRET = new_secret()  # the binding secret of this run's databases (variant "bound")


def writers(cfg: Config) -> tuple[str, ...]:
    """The variants that write: each has its own ids per round (``Plan``)."""
    base = ("base", "base-untagged") if cfg.baseline else ()
    return (*VARIANTS, *base, *(("bound",) if cfg.bound else ()))


def variants(cfg: Config, op: Op | None = None) -> tuple[str, ...]:
    """The variants that run op (all of them when op is None): "proxy" only what the proxy rewrites,
    "stale" and the shapes only read."""
    proxy = ("proxy",) if cfg.proxied and (op is None or op.name in dict(cfg.proxied)) else ()
    if op is not None and op.kind not in READ_KINDS:
        return (*writers(cfg), *proxy)
    extra = ("stale",) if cfg.stale else ()
    return (*writers(cfg), *proxy, *extra, *(f"{x}{w}" for x in cfg.shapes for w in ("", NO_SESSION)))


def database(variant: str) -> str:
    """Which database a variant reads: the baseline's for "base", else this checkout's ("")."""
    return BASE if variant.startswith("base") else ""


def sent_sql(cfg: Config, variant: str, sql: str, name: str | None = None) -> str | None:
    """What variant runs for statement ``sql`` (of op ``name``, else the first op of that statement, a
    prepared one): the proxy variant its rewrite (None if it has none)."""
    if variant != "proxy":
        return sql
    rewritten = dict(cfg.proxied)
    return next(
        (
            rewritten[op.name]
            for op in OPS
            if op.sql == sql and op.name in rewritten and name in (None, op.name)
        ),
        None,
    )


def selected_ops(cfg: Config) -> tuple[Op, ...]:
    return tuple(op for op in OPS if cfg.only is None or re.search(cfg.only, op.name))


def modes(ops: tuple[Op, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(op.mode for op in ops))


def picks(cfg: Config) -> int:
    """Rows of the small table joined to items."""
    return max(1000, cfg.rows // 100)


class Plan:
    """Which ids each variant and round touches, so that no write collides and no key is written twice."""

    def __init__(self, cfg: Config, rng: random.Random) -> None:
        n = cfg.rows
        # Session 'bench': 80 % updates, 10 % deletes of scattered base rows, 10 % inserts above the table.
        k = cfg.session_changes
        scattered = rng.sample(range(1, n + 1), k)
        self.session_changes = common.split_changes(scattered, n)
        taken = set(scattered)
        # Measured writes: per variant and round, base ids to update and delete, fresh ids to insert.
        pool = [
            i
            for i in rng.sample(
                range(1, n + 1), min(n, 2 * len(writers(cfg)) * (cfg.rounds + 1) * cfg.batch + k)
            )
            if i not in taken
        ]
        self.writes: dict[tuple[str, int], tuple[list[int], list[int], list[int]]] = {}
        fresh = 2 * n + 1
        for v in writers(cfg):
            for r in range(cfg.rounds + 1):  # + 1: the warm-up round
                upd = [pool.pop() for _ in range(cfg.batch)]
                dele = [pool.pop() for _ in range(cfg.batch)]
                ins = list(range(fresh, fresh + cfg.batch))
                fresh += cfg.batch
                self.writes[(v, r)] = (upd, dele, ins)


async def build(dsn: str, cfg: Config, plan: Plan, files: common.Layer | None = None) -> None:
    """One database of the bench; ``files``: the layer's migrations to install (default: this checkout's).
    Only this checkout's database gets the stale session and the candidate shapes."""
    conn = await asyncpg.connect(dsn)
    try:
        t0 = time.perf_counter()
        await common.create_items(conn, cfg.rows)
        for schema in ("public", "plain"):
            await conn.execute(EXTRA_DDL.format(schema=schema))
            await conn.execute(FILL_PICKS.format(schema=schema), cfg.rows, picks(cfg))
        if cfg.rls:
            await conn.execute(RLS_ROLE_DDL)
            for schema in ("public", "plain"):
                await conn.execute(RLS_DDL.format(schema=schema))
        for table in ("public.items", "plain.items", "public.picks", "plain.picks"):
            await conn.execute(f"VACUUM ANALYZE {table}")
        common.log(f"filled 2 x {cfg.rows} rows in {time.perf_counter() - t0:.1f} s")
        with common.installed_layer(files or common.this_layer()):
            await install_layer(conn, schemas=("public",))
        if files is None and cfg.bound:
            await conn.execute("SELECT cow.set_bind_secret($1)", SECRET)
        # Other sessions: the same mix (80 % updates, 10 % deletes, 10 % inserts) in ranges of their own.
        t0 = time.perf_counter()
        per = max(10, cfg.other_changes // cfg.other_sessions)
        # The measured ids are scattered everywhere; overlaps with the other sessions' are harmless.
        await common.write_other_sessions(conn, cfg.rows, cfg.other_sessions, per)
        common.log(
            f"other sessions: {cfg.other_sessions} x {per} changes in {time.perf_counter() - t0:.1f} s"
        )
        t0 = time.perf_counter()
        sessions = (SESSION, WRITE_SESSION, STALE_SESSION) if cfg.stale else (SESSION, WRITE_SESSION)
        for session in sessions:
            await common.write_session(conn, session, plan.session_changes)
        took = time.perf_counter() - t0
        common.log(f"sessions {', '.join(sessions)}: {cfg.session_changes} changes each in {took:.1f} s")
        await conn.execute("VACUUM ANALYZE")
        # A concurrent autovacuum ANALYZE of the freshly filled tables can hold back the VACUUM's horizon,
        # leaving the last pages of the changes table not all-visible: vacuum it again until they are.
        changes = await conn.fetchval(CHANGES_TABLE)
        for _ in range(10):
            pages, visible = await conn.fetchrow(ALL_VISIBLE)
            if visible >= pages:
                break
            await asyncio.sleep(1)
            await conn.execute(f"VACUUM {changes}")
        if files is not None:
            return
        for shape in cfg.shapes:
            if SHAPES[shape] or shape == "no-gate":
                await conn.execute(f"CREATE SCHEMA {shape_schema(shape)}")
                body = SHAPES[shape].format(ch=changes) if SHAPES[shape] else await no_gate_view(conn)
                await conn.execute(f"CREATE VIEW {shape_schema(shape)}.items AS " + body)
        if cfg.stale:
            await conn.execute(f"ALTER TABLE {changes} SET (autovacuum_enabled = false)")
            await conn.execute("SELECT cow.use_session($1)", STALE_SESSION)
            updates, _, inserts = plan.session_changes
            await conn.execute(common.UPDATE_ANY, updates + inserts)
            await conn.execute("SELECT cow.use_session(NULL)")
    finally:
        await conn.close()


CHANGES_TABLE = """
SELECT format('cow_changes.%I', changes_table) FROM cow.registry
WHERE table_schema = 'public' AND table_name = 'items'
"""
ALL_VISIBLE = """
SELECT c.relpages, c.relallvisible
FROM pg_class c JOIN cow.registry g ON c.oid = to_regclass('cow_changes.' || g.changes_table)
WHERE g.table_schema = 'public' AND g.table_name = 'items'
"""
# Rows the session has changed (each has one current version).
SESSION_ROWS = "SELECT count(DISTINCT (table_name, pk)) FROM cow.session_changes($1)"


Dsns = dict[str, str]  # by database(variant)


async def connect(dsns: Dsns, variant: str, mode: str, rls: bool = False) -> asyncpg.Connection:
    settings = {
        "jit": "on" if mode == "jit" else "off",
        "plan_cache_mode": "force_generic_plan" if mode == "generic" else "auto",
    }
    # unprepared: no statement cache, so every execution parses and plans an unnamed statement.
    cache = 0 if mode == "unprepared" else 100
    conn = await asyncpg.connect(
        dsns[database(variant)], server_settings=settings, statement_cache_size=cache
    )
    if variant == "plain":
        await conn.execute("SET search_path = plain")
    elif variant in ("untagged", "base-untagged"):
        pass  # the default search_path: the base table
    elif variant == "view":
        await conn.execute("SET search_path = cow_overlay_public, public")
    elif variant in ("session", "proxy", "base"):
        await conn.execute("SELECT cow.use_session($1)", WRITE_SESSION if mode == "write" else SESSION)
    elif variant == "bound":
        session = WRITE_SESSION if mode == "write" else SESSION
        await conn.execute("SELECT cow.bind_session($1, NULL, $2)", session, SECRET)
    elif variant == "stale":
        await conn.execute("SELECT cow.use_session($1)", STALE_SESSION)
    else:  # a candidate shape, in session bench or without a session
        shape = variant.removesuffix(NO_SESSION)
        if variant == shape:
            await conn.execute("SELECT cow.use_session($1)", SESSION)
        if shape == "nested-loop":
            await conn.execute("SET search_path = cow_overlay_public, public")
            await conn.execute("SET enable_hashjoin = off; SET enable_mergejoin = off")
        else:
            await conn.execute(f"SET search_path = {shape_schema(shape)}, public")
    if rls:
        await conn.execute(f"SET bench.tenant = 'all'; SET ROLE {RLS_ROLE}")
    return conn


def op_args(
    op: Op, cfg: Config, plan: Plan, *, variant: str, rnd: int, rng: random.Random
) -> list[tuple[Any, ...]]:
    """Arguments of one batch: random ids for reads, the ids reserved to this variant and round for writes."""
    if op.kind == "count":
        return [() for _ in range(cfg.count_batch)]
    if op.kind == "read":
        return [(rng.randint(1, cfg.rows - 100),) for _ in range(cfg.batch)]
    if op.kind == "list":
        return [(rng.randint(1, cfg.rows - 100),) for _ in range(cfg.list_batch)]
    if op.kind == "join":
        return [(rng.randint(1, picks(cfg) - 10),) for _ in range(cfg.list_batch)]
    if op.kind == "last":
        return [() for _ in range(cfg.list_batch)]
    upd, dele, ins = plan.writes[(variant, rnd)]
    return [(i,) for i in {"insert": ins, "update": upd, "delete": dele}[op.kind]]


Fetch = Callable[..., Awaitable[Any]]


async def statement(conn: asyncpg.Connection, op: Op, sql: str) -> Fetch:
    """What runs one op: a statement prepared once and kept (the server's plan cache sees every execution),
    or, unprepared, an unnamed statement parsed and planned at every execution."""
    if op.mode == "unprepared":
        return functools.partial(conn.fetch, sql)
    stmt = await conn.prepare(sql)
    return stmt.fetch  # type: ignore[no-any-return]


async def run_batch(
    stmts: dict[str, Fetch],
    args: dict[str, list[tuple[Any, ...]]],
    rng: random.Random,
    pids: dict[str, int] | None = None,
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Ms of every op per variant, and (with the backends' ``pids``, on this machine) the backend's CPU µs
    per op; the variants take turns op by op (in a shuffled order each time), so that load from the other
    users of the machine falls on all of them alike."""
    times: dict[str, list[float]] = {v: [] for v in stmts}
    spent = dict.fromkeys(stmts, 0)
    order = list(stmts)
    n = len(next(iter(args.values())))
    for i in range(n):
        rng.shuffle(order)
        for v in order:
            c0 = common.cpu_ns(pids[v]) or 0 if pids else 0
            t0 = time.perf_counter()
            await stmts[v](*args[v][i])
            times[v].append((time.perf_counter() - t0) * 1000)
            if pids:
                spent[v] += (common.cpu_ns(pids[v]) or 0) - c0
    return times, ({v: spent[v] / n / 1000 for v in stmts} if pids else {})


@dataclass(frozen=True)
class Result:
    median: float  # of every single op over all rounds: robust against the spikes of a shared machine
    rounds: tuple[float, ...]  # mean ms per op of each round
    cpu: tuple[float, ...] = ()  # the backend's CPU µs per op of each round (empty: not measurable)


async def measure(dsns: Dsns, cfg: Config, plan: Plan) -> dict[tuple[str, str], Result]:
    rng = random.Random(cfg.seed)
    ops = selected_ops(cfg)
    conns = {(v, op.mode): await connect(dsns, v, op.mode, cfg.rls) for op in ops for v in variants(cfg, op)}
    pids = {k: int(await c.fetchval("SELECT pg_backend_pid()")) for k, c in conns.items()}
    local = all(common.cpu_ns(pid) is not None for pid in pids.values())
    try:
        stmts = {
            op.name: {
                v: await statement(conns[(v, op.mode)], op, sent_sql(cfg, v, op.sql, op.name) or op.sql)
                for v in variants(cfg, op)
            }
            for op in ops
        }
        samples = {(op.name, v): list[list[float]]() for op in ops for v in variants(cfg, op)}
        cpu = {k: list[float]() for k in samples}
        # Round 0 warms up (ids of its own for the writes): caches, the first custom plans, the compilation
        # of the plpgsql trigger functions in each connection. It is not counted.
        for r in range(cfg.rounds + 1):
            t0 = time.perf_counter()
            for op in ops:
                args = {v: op_args(op, cfg, plan, variant=v, rnd=r, rng=rng) for v in variants(cfg, op)}
                backends = {v: pids[(v, op.mode)] for v in variants(cfg, op)} if local else None
                times, spent = await run_batch(stmts[op.name], args, rng, backends)
                if r:
                    for v, ms in times.items():
                        samples[(op.name, v)].append(ms)
                        if v in spent:
                            cpu[(op.name, v)].append(spent[v])
            common.log_round(r, cfg.rounds, t0)
        return {
            k: Result(
                median=statistics.median(x for batch in s for x in batch),
                rounds=tuple(statistics.fmean(batch) for batch in s),
                cpu=tuple(cpu[k]),
            )
            for k, s in samples.items()
        }
    finally:
        for c in conns.values():
            await c.close()


async def explain(dsns: Dsns, cfg: Config) -> list[str]:
    """EXPLAIN ANALYZE per variant: the point select (custom and generic plan), the range, count(*) with
    jit on, and a single-row update (in a transaction rolled back, to show the trigger's share)."""
    out: list[str] = []
    probe = cfg.rows // 3
    cases = [
        ("point select", SELECT_POINT, "(bigint)", f"({probe})", "custom"),
        ("point select", SELECT_POINT, "(bigint)", f"({probe})", "generic"),
        ("range 100 rows", SELECT_RANGE, "(bigint)", f"({probe})", "custom"),
        ("range 100 rows", SELECT_RANGE, "(bigint)", f"({probe})", "generic"),
        ("keyset page 100 rows", SELECT_PAGE, "(bigint)", f"({probe})", "custom"),
        ("join 10 rows on primary key", JOIN_PK, "(bigint)", "(100)", "generic"),
        ("join 1 row on indexed grp", JOIN_GRP, "(bigint)", "(100)", "custom"),
        ("count(*)", SELECT_COUNT, "", "", "jit"),
        ("update 1 row", UPDATE_ONE, "(bigint)", f"({probe + 1})", "custom"),
    ]
    for what, sql, types, args, mode in cases:
        for v in variants(cfg) if sql != UPDATE_ONE else writers(cfg):
            sent = sent_sql(cfg, v, sql)
            if sent is None:
                continue
            conn = await connect(dsns, v, mode, cfg.rls)
            try:
                await conn.execute(f"PREPARE p{types} AS {sent}")
                async with conn.transaction():
                    for _ in range(6):  # past the planner's five custom plans
                        await conn.execute(f"EXECUTE p{args}")
                    rows = await conn.fetch(f"EXPLAIN (ANALYZE, COSTS, SUMMARY ON) EXECUTE p{args}")
                    # Writes are undone: the measured state stays as built.
                    raise _Rollback
            except _Rollback:
                pass
            finally:
                await conn.close()
            out.append(f"-- {what}: {v}, {mode} plan")
            out.extend("   " + r[0] for r in rows)
    return out


class _Rollback(Exception):
    """Leaves ``conn.transaction()`` by rolling it back."""


def report(cfg: Config, res: dict[tuple[str, str], Result], version: str, jit: str) -> list[str]:
    every = variants(cfg)
    lines = [
        f"PostgreSQL {version}; jit available: {jit}; {cfg.rows} rows; session {SESSION} holds "
        f"{cfg.session_changes} changes, {cfg.other_sessions} other sessions {cfg.other_changes}; "
        f"{cfg.rounds} rounds of {cfg.batch} ops ({cfg.count_batch} for count(*)) per variant",
        "",
        "Median ms per op (all ops of all rounds) and ratio to plain:",
        "",
        "| operation | "
        + " | ".join(f"{v} ms" for v in every)
        + " | "
        + " | ".join(f"{v} ×" for v in every[1:])
        + " |",
        "|---|" + "---:|" * (2 * len(every) - 1),
    ]
    for op in selected_ops(cfg):
        base = res[(op.name, "plain")].median
        cells = [f"{res[(op.name, v)].median:.3f}" if (op.name, v) in res else "–" for v in every]
        ratios = [f"{res[(op.name, v)].median / base:.2f}" if (op.name, v) in res else "–" for v in every[1:]]
        lines.append(f"| {op.name} | " + " | ".join(cells + ratios) + " |")
    lines += cpu_table(cfg, res)
    lines += ["", "Ratio to plain of the mean ms per op, per round (spread = noise of the machine):", ""]
    for op in selected_ops(cfg):
        plain_rounds = res[(op.name, "plain")].rounds
        spread = []
        for v in variants(cfg, op)[1:]:
            per_round = [x / b for x, b in zip(res[(op.name, v)].rounds, plain_rounds, strict=True)]
            spread.append(
                f"{v} {min(per_round):.2f}-{max(per_round):.2f} (median {statistics.median(per_round):.2f})"
            )
        lines.append(f"- {op.name}: " + ", ".join(spread))
    lines += ["", *goals(res, selected_ops(cfg))]
    return lines


def cpu_table(cfg: Config, res: dict[tuple[str, str], Result]) -> list[str]:
    """The backends' CPU µs per op (median of the rounds' means), when the server runs on this machine."""
    every = variants(cfg)
    if not all(r.cpu for r in res.values()):
        return []
    lines = [
        "",
        "Backend CPU µs per op (median of the rounds' means; load on the machine does not inflate it):",
        "",
        "| operation | " + " | ".join(every) + " | " + " | ".join(f"{v} ×" for v in every[1:]) + " |",
        "|---|" + "---:|" * (2 * len(every) - 1),
    ]
    for op in selected_ops(cfg):
        med = {v: statistics.median(res[(op.name, v)].cpu) for v in every if (op.name, v) in res}
        cells = [f"{med[v]:.1f}" if v in med else "–" for v in every]
        ratios = [f"{med[v] / med['plain']:.2f}" if v in med else "–" for v in every[1:]]
        lines.append(f"| {op.name} | " + " | ".join(cells + ratios) + " |")
    return lines


def goals(res: dict[tuple[str, str], Result], ops: tuple[Op, ...]) -> list[str]:
    out = []
    for op in ops:
        base = res[(op.name, "plain")].median
        untagged = res[(op.name, "untagged")].median / base
        view = res[(op.name, "view")].median / base
        sess = res[(op.name, "session")].median / base
        limit = 1.5 if op.kind in READ_KINDS else 2.0
        stale = (op.name, "stale")
        proxy = (op.name, "proxy")
        # Without a session: untagged traffic (what an application runs then: the base table) and the
        # overlay view read with no session set (what the wording names); both against 1.05.
        out.append(
            f"{op.name}: untagged {untagged:.2f}x ({'met' if untagged <= 1.05 else 'NOT met'}), "
            f"view without session {view:.2f}x ({'met' if view <= 1.05 else 'NOT met'}), goal <= 1.05; "
            f"session {sess:.2f}x ({'met' if sess <= limit else 'NOT met'}, goal <= {limit})"
            + (
                f"; through cowproxy's rewrite {res[proxy].median / base:.2f}x "
                f"({'met' if res[proxy].median / base <= limit else 'NOT met'})"
                if proxy in res
                else ""
            )
            + (f"; session not vacuumed {res[stale].median / base:.2f}x" if stale in res else "")
            + "".join(against_baseline(res, op))
        )
    return out


def against_baseline(res: dict[tuple[str, str], Result], op: Op) -> list[str]:
    """This checkout's session (and bound backend) against the baseline's session: the median of every op,
    and the spread of the per-round ratios (both ran in the same rounds, op by op)."""
    if (op.name, "base") not in res:
        return []
    before = res[(op.name, "base")]
    out = []
    for v in ("session", "bound"):
        if (op.name, v) in res:
            after = res[(op.name, v)]
            per_round = [x / b for x, b in zip(after.rounds, before.rounds, strict=True)]
            cpu = (
                f", CPU {statistics.median(after.cpu) / statistics.median(before.cpu):.2f}"
                if after.cpu and before.cpu
                else ""
            )
            out.append(
                f"; {v} / base {after.median / before.median:.2f} "
                f"(per round {min(per_round):.2f}-{max(per_round):.2f}{cpu})"
            )
    return out


async def plan_costs(dsns: Dsns, cfg: Config) -> list[str]:
    """Estimated total cost of the generic plans per variant, against jit_above_cost: skipped UNION ALL
    branches still count, so a view can cross the JIT threshold long before the plain table does."""
    out = []
    cases = (
        ("point select", SELECT_POINT, "(bigint)", "(1)"),
        ("range 100 rows", SELECT_RANGE, "(bigint)", "(1)"),
        ("keyset page 100 rows", SELECT_PAGE, "(bigint)", "(1)"),
        ("last 20 rows", SELECT_LAST, "", ""),
        ("join 10 rows on primary key", JOIN_PK, "(bigint)", "(1)"),
        ("join 1 row on indexed grp", JOIN_GRP, "(bigint)", "(1)"),
        ("count(*)", SELECT_COUNT, "", ""),
    )
    for what, sql, types, args in cases:
        cells = []
        threshold = 0.0
        for v in variants(cfg):
            sent = sent_sql(cfg, v, sql)
            if sent is None:
                continue
            conn = await connect(dsns, v, "generic", cfg.rls)
            try:
                threshold = float(await conn.fetchval("SELECT current_setting('jit_above_cost')"))
                await conn.execute(f"PREPARE p{types} AS {sent}")
                plan = await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE p{args}")
                cost = float(json.loads(plan)[0]["Plan"]["Total Cost"])
            finally:
                await conn.close()
            more = f", JIT from ~{cfg.rows * threshold / cost / 1e6:.1f}M rows" if sql == SELECT_COUNT else ""
            cells.append(f"{v} {cost:.0f}{more}")
        out.append(f"- {what}: " + "; ".join(cells) + f" (jit_above_cost {threshold:.0f})")
    return out


async def main_async(cfg: Config) -> None:
    rng = random.Random(cfg.seed)
    plan = Plan(cfg, rng)
    with common.server(cfg.dsn, "512MB") as admin_dsn:
        names = [f"cowbench_{os.getpid()}", *([f"cowbench_{os.getpid()}_a"] if cfg.baseline else [])]
        async with common.scratch_databases(admin_dsn, names) as created:
            dsn = created[0]
            dsns = {"": dsn}
            await build(dsn, cfg, plan)
            if cfg.baseline:
                t0 = time.perf_counter()
                dsns[BASE] = created[1]
                await build(dsns[BASE], cfg, plan, common.baseline_layer(cfg.baseline))
                took = time.perf_counter() - t0
                common.log(f"built the baseline's database ({cfg.baseline}) in {took:.1f} s")
            conn = await asyncpg.connect(dsn)
            try:
                version = await conn.fetchval("SHOW server_version")
                jit = await conn.fetchval("SELECT pg_jit_available()")
                n = await conn.fetchval(SESSION_ROWS, SESSION)
                # Index-only scans of the changes table's indexes read the heap for pages not all-visible.
                pages, visible = await conn.fetchrow(ALL_VISIBLE)
                common.log(
                    f"session {SESSION}: {n} rows changed; changes table {visible}/{pages} pages all-visible"
                )
                await conn.execute("SELECT cow.use_session($1)", SESSION)
                catalog = Catalog.from_rows([tuple(r) for r in await conn.fetch(CATALOG_QUERY)])
            finally:
                await conn.close()
            analyzer = Analyzer()
            # Prepared once (all modes but "unprepared"), as asyncpg does: the text of a named statement.
            rewritten = {
                op.name: analyzer.analyze(op.sql, catalog, True, prepared=op.mode != "unprepared").rewritten
                for op in OPS
            }
            cfg = dataclasses.replace(
                cfg, proxied=tuple((name, sql) for name, sql in rewritten.items() if sql is not None)
            )
            if cfg.explain:
                print("\n".join(await explain(dsns, cfg)))
                print()
            costs = await plan_costs(dsns, cfg)
            res = await measure(dsns, cfg, plan)
            # The reads must have seen the session as built: the measured writes went elsewhere.
            after = await common.fetchval(dsn, SESSION_ROWS, SESSION)
            if after != n:
                raise SystemExit(f"bench/layer.py: session {SESSION} went from {n} to {after} changes")
            print("\n".join(report(cfg, res, str(version), str(jit))))
            print("\nEstimated total cost of the generic plan (linear in rows for count(*)):\n")
            print("\n".join(costs))


def main(argv: list[str] | None = None) -> int:
    return common.run_main("bench/layer.py", main_async(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
