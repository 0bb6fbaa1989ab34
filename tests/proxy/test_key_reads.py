"""Key reads in a session: the proxy reads the base and changes tables instead of the overlay view.

``SELECT … FROM t WHERE key = $1`` (``IN``, ``= ANY``, ``BETWEEN``, a lower and an upper bound) becomes the
base rows the session has no version of plus the session's live versions, with the session's versions read
only for the keys in the client's conditions (docs/rewrites.md, "Key reads"). Compared side by side with a
plain database holding the same tables and the same writes (key moves, deletes, re-inserts, NULLs), through
psycopg's unnamed and named prepared statements, and checked to have taken the rewrite (its CTE in the plan).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.sql import CATALOG_QUERY, Analyzer, Catalog
from proxy.sql.rewrites import KEY_READ_HASHED_ROWS
from proxy.unnamed import PROMOTED_PREFIX
from tests.fix_db import outcome
from tests.fix_proxy import RunningProxy
from tests.proxy.k_items import TABLES, k_items_writes, side_by_side
from tests.proxy.k_items import WRITES as K_WRITES

pytestmark = pytest.mark.timeout(120)

SCHEMA = (
    TABLES
    + """
CREATE TABLE k_pair (a int, b text, v int, PRIMARY KEY (a, b));
CREATE TABLE k_addr (ip inet PRIMARY KEY, host text);
CREATE TABLE "K Mixed" ("Id" bigint PRIMARY KEY, "Val" text, "select" int);
INSERT INTO "K Mixed" SELECT g, 'v' || g, g FROM generate_series(1, 50) g;
INSERT INTO k_pair SELECT g % 20, 'b' || g, g FROM generate_series(1, 400) g;
INSERT INTO k_addr SELECT ('10.0.0.' || g)::inet, 'h' || g FROM generate_series(1, 50) g;
ANALYZE k_items, k_coded, k_pair, k_addr, k_bag;
"""
)
WRITES = [
    *K_WRITES,
    "UPDATE k_pair SET v = -v WHERE a = 3",
    "UPDATE k_pair SET b = b || 'y' WHERE a = 4 AND v < 100",
    "INSERT INTO k_pair VALUES (3, 'zz', 0)",
    "UPDATE k_addr SET host = 'moved' WHERE ip = '10.0.0.7'",
    'UPDATE "K Mixed" SET "Val" = \'changed\', "select" = -1 WHERE "Id" = 3',
]
PRISMA = (
    'SELECT "public"."k_items"."id", "public"."k_items"."name" FROM "public"."k_items" '
    'WHERE ("public"."k_items"."id" = %s AND 1=1) LIMIT %s OFFSET %s'
)
# (statement, parameters, taken by the rewrite; None: not checked (an error; a plan PostgreSQL folds away))
QUERIES: list[tuple[str, tuple[Any, ...], bool | None]] = [
    ("SELECT * FROM k_items WHERE id = %s", (50,), True),  # changed by the session
    ("SELECT * FROM k_items WHERE id = %s", (51,), True),  # not changed
    ("SELECT * FROM k_items WHERE id = %s", (91,), True),  # deleted
    ("SELECT * FROM k_items WHERE id = %s", (4005,), True),  # moved away
    ("SELECT * FROM k_items WHERE id = %s", (14005,), True),  # moved here
    ("SELECT * FROM k_items WHERE id = %s", (6005,), True),  # inserted and deleted
    ("SELECT * FROM k_items WHERE id = %s", (77,), True),  # deleted and inserted
    ("SELECT * FROM k_items WHERE id BETWEEN %s AND %s ORDER BY id", (90, 190), True),
    ("SELECT * FROM k_items WHERE id BETWEEN %s AND %s ORDER BY id", (3990, 14020), True),
    ("SELECT name, qty FROM k_items WHERE id IN (%s, %s, %s) ORDER BY 1", (77, 100, 6010), True),
    ("SELECT * FROM k_items WHERE id = ANY(%s) ORDER BY id", ([77, 91, 100, 6005, 6010, 14001],), True),
    (
        "SELECT * FROM k_items i WHERE %s <= i.id AND i.id < %s AND i.qty IS NULL ORDER BY i.id DESC LIMIT 5",
        (90, 200),
        True,
    ),
    ("SELECT max(qty), count(*), sum(grp) FROM k_items WHERE id BETWEEN %s AND 300", (1,), True),
    ("SELECT DISTINCT grp FROM k_items WHERE id BETWEEN %s AND %s ORDER BY grp", (95, 160), False),
    (PRISMA, (120, 1, 0), True),
    (  # SQLAlchemy
        "SELECT k_items.id AS k_items_id, k_items.name AS k_items_name FROM k_items WHERE k_items.id = %s",
        (130,),
        True,
    ),
    (
        'SELECT "k_items"."id", "k_items"."grp" FROM "k_items" WHERE "k_items"."id" = %s LIMIT 21',
        (150,),
        True,
    ),
    ("SELECT * FROM k_coded WHERE code = %s", ("c4",), True),  # its key moved to c4x
    ("SELECT * FROM k_coded WHERE code IN (%s, %s) ORDER BY n", ("c4x", "c201"), True),
    ("SELECT * FROM k_pair WHERE a = %s ORDER BY b", (3,), True),  # a composite key's first column
    ("SELECT * FROM k_pair WHERE a = %s AND b LIKE %s ORDER BY b", (4, "b%"), True),
    ("SELECT * FROM k_pair WHERE b = %s", ("b24y",), True),  # its second column
    ("SELECT * FROM k_items WHERE id = %s AND qty > %s", (None, 1), None),  # a one-time false filter
    # quoted names: mixed case, a space, a keyword
    ('SELECT "Val", "select" FROM "K Mixed" WHERE "Id" IN (%s, %s) ORDER BY "Id"', (3, 4), True),
    ('SELECT m.* FROM public."K Mixed" m WHERE m."Id" = %s', (3,), True),
    # left to the view
    ("SELECT * FROM k_items WHERE id >= %s ORDER BY id LIMIT 3", (4995,), False),  # not bounded
    ("SELECT * FROM k_items WHERE id = %s OR id = %s ORDER BY id", (50, 51), False),
    ("SELECT k_items FROM k_items WHERE id = %s", (50,), False),  # a whole row
    ("SELECT * FROM k_items WHERE id = %s AND grp IN (SELECT 3)", (50,), False),  # a subquery
    ("SELECT * FROM k_items WHERE id = %s FOR SHARE", (51,), False),
    ("SELECT * FROM k_items WHERE grp = %s AND name = %s", (3, "item 50"), False),  # no key condition
    ("SELECT * FROM k_addr WHERE ip = %s", ("10.0.0.7",), False),  # inet: not a hashed key type
    ("SELECT * FROM k_bag WHERE v = %s ORDER BY w", (1,), False),  # no key
    # errors: PostgreSQL's own, through the view or not
    ("SELECT * FROM k_items WHERE id = %s AND nosuch = 1", (50,), None),
    ("SELECT * FROM k_items WHERE id = %s::bigint", ("abc",), None),
    ("SELECT * FROM k_items WHERE id = %s LIMIT %s", (50, -1), None),
]


def plan(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...]) -> str:
    row = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()
    assert row is not None
    return json.dumps(row[0])


def rewritten(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...]) -> bool:
    """Whether the statement ran as a key read: the plan reads the CTE of the session's versions."""
    return '"CTE Name": "_cow_versions"' in plan(conn, sql, params)


@pytest.mark.parametrize(
    ("prepare", "large"),
    [(False, False), (True, False), (False, True)],
    ids=["unnamed", "prepared", "large-changes-table"],
)
def test_key_reads_in_a_session_as_on_the_plain_tables(
    proxy: RunningProxy, databases: tuple[str, str], prepare: bool, large: bool
) -> None:
    """``large``: the catalog gives the changes tables more rows than KEY_READ_HASHED_ROWS (pg_class edited
    by hand), so the base rows are hidden with an anti join instead of a hashed NOT IN."""
    layer_db, _ = databases
    if large:
        with psycopg.connect(layer_db, autocommit=True) as admin:
            for (changes,) in admin.execute("SELECT changes_table FROM cow.registry").fetchall():
                # autovacuum's ANALYZE would set the real count again
                admin.execute(f"ALTER TABLE cow_changes.{changes} SET (autovacuum_enabled = false)")
            admin.execute(
                "UPDATE pg_class SET reltuples = %s WHERE relnamespace = 'cow_changes'::regnamespace "
                "AND relkind = 'r'",
                (KEY_READ_HASHED_ROWS * 2,),
            )
    with side_by_side(proxy, databases, "keys", WRITES, prepare=prepare) as (conn, ref):
        hashed = plan(conn, "SELECT * FROM k_items WHERE id BETWEEN %s AND %s", (1, 2000))
        assert ("hashed SubPlan" in hashed) is not large, hashed
        assert ('"Join Type": "Anti"' in hashed or '"Join Type": "Right Anti"' in hashed) is large, hashed
        for sql, params, taken in QUERIES:
            expected = outcome(ref, sql, params)
            assert expected[0] == "ok" or taken is None, (sql, expected)
            got = outcome(conn, sql, params)
            if "ORDER BY" not in sql:  # no order asked for: base rows come first, as through the view
                got, expected = (
                    (*got[:2], sorted(got[2], key=repr)),
                    (*expected[:2], sorted(expected[2], key=repr)),
                )
            assert got == expected, (sql, params)
            if taken is not None:
                assert rewritten(conn, sql, params) is taken, sql
        cur = conn.execute(PRISMA, (120, 1, 0))
        assert cur.description is not None and [d.name for d in cur.description] == ["id", "name"]
        cur = conn.execute("SELECT * FROM k_items WHERE id = %s", (1,))
        assert cur.description is not None
        assert [d.name for d in cur.description] == ["id", "grp", "name", "qty"]
    with psycopg.connect(layer_db) as direct:  # the session's writes stayed in the session
        assert direct.execute("SELECT count(*) FROM k_items WHERE id > 5000").fetchone() == (0,)


def test_asyncpg_sees_the_plain_tables_parameter_and_column_types(
    proxy: RunningProxy, databases: tuple[str, str]
) -> None:
    """asyncpg describes a statement before running it: the rewritten key read must describe like the
    plain table's (parameter types inferred from the key, the table's columns and types)."""
    layer_db, plain = databases
    sql = "SELECT * FROM k_items WHERE id = ANY($1) AND name <> $2 ORDER BY id"

    async def describe(dsn: str) -> tuple[Any, ...]:
        conn = await asyncpg.connect(dsn)
        try:
            stmt = await conn.prepare(sql)
            rows = await stmt.fetch([77, 91, 100], "")
            return (
                [t.name for t in stmt.get_parameters()],
                [(a.name, a.type.name) for a in stmt.get_attributes()],
                [tuple(r) for r in rows],
            )
        finally:
            await conn.close()

    async def main() -> None:
        session = proxy.dsn(layer_db, options="-c%20cow.session_id%3Dtypes")
        with psycopg.connect(session, autocommit=True) as conn:
            conn.execute("DELETE FROM k_items WHERE id = 91")
            conn.execute("UPDATE k_items SET name = 'seen' WHERE id = 77")
            assert rewritten(conn, sql.replace("$1", "%s").replace("$2", "%s"), ([1], ""))
        with psycopg.connect(plain, autocommit=True) as ref:
            ref.execute("DELETE FROM k_items WHERE id = 91")
            ref.execute("UPDATE k_items SET name = 'seen' WHERE id = 77")
        got, expected = await describe(session), await describe(plain)
        assert got == expected
        assert expected[0] == ["int8[]", "text"] and expected[2][0] == (77, 7, "seen", None)

    asyncio.run(asyncio.wait_for(main(), 60))


@pytest.mark.parametrize(
    ("ddl", "columns"),
    [
        ("ALTER TABLE k_items ADD COLUMN extra text DEFAULT 'x'", ["id", "grp", "name", "qty", "extra"]),
        ("ALTER TABLE k_items DROP COLUMN qty", ["id", "grp", "name"]),
    ],
    ids=["column-added", "column-dropped"],
)
def test_app_ddl_elsewhere_costs_one_failed_key_read_not_a_wrong_one(
    proxy: RunningProxy, databases: tuple[str, str], ddl: str, columns: list[str]
) -> None:
    """The key read names the table's columns as the catalog had them. After the application changes the
    columns on another connection, the next key read fails (its branches differ: never the old columns
    silently), and the relay checks the catalog before the one after, which reads the new columns."""
    layer_db, _ = databases
    sql = "SELECT * FROM k_items WHERE id = %s"
    with psycopg.connect(proxy.dsn(layer_db, options="-c%20cow.session_id%3Dddl"), autocommit=True) as conn:
        conn.execute("UPDATE k_items SET name = 'in session' WHERE id = 5")
        assert conn.execute(sql, (5,)).fetchone() == (5, 5, "in session", 5)
        with psycopg.connect(layer_db, autocommit=True) as app:
            app.execute(ddl)
        first = outcome(conn, sql, (5,))
        assert first[0] == "error" and first[1] in ("42601", "42703"), first
        cur = conn.execute(sql, (5,))
        assert cur.description is not None and [d.name for d in cur.description] == columns
        row = cur.fetchone()
        assert row is not None and row[:3] == (5, 5, "in session")
        assert rewritten(conn, sql, (5,))


BIG_WRITES = ["UPDATE k_big SET v = -1 WHERE id % 100 = 3", "DELETE FROM k_big WHERE id % 100 = 4"]


def big_table(databases: tuple[str, str]) -> None:
    """k_big (200k rows) in both databases: large enough that the plain table keeps custom plans for a
    100-row range."""
    for dsn in databases:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE k_big (id bigint PRIMARY KEY, v int)")
            conn.execute("INSERT INTO k_big SELECT g, g % 7 FROM generate_series(1, 200000) g")
            conn.execute("ANALYZE k_big")


def test_unnamed_key_reads_run_as_the_proxys_named_statement(
    proxy: RunningProxy, databases: tuple[str, str]
) -> None:
    """asyncpg without a statement cache sends every statement unnamed (Parse and Describe, then Bind and
    Execute). The proxy prepares the rewritten read once under a name of its own and answers the next
    Parses of that text with an empty unnamed statement, so the server plans it like a prepared one (a
    cached generic plan from the sixth execution); the client sees the plain table's rows and types. After
    DEALLOCATE ALL the proxy prepares it anew."""
    layer_db, plain = databases
    big_table(databases)
    sql = "SELECT * FROM k_big WHERE id BETWEEN $1 AND $1 + 99"
    plans = "SELECT name, generic_plans, custom_plans FROM pg_prepared_statements ORDER BY name"

    async def main() -> None:
        session = proxy.dsn(layer_db, options="-c%20cow.session_id%3Dunnamed")
        conn = await asyncpg.connect(session, statement_cache_size=0)
        ref = await asyncpg.connect(plain, statement_cache_size=0)
        try:
            for write, done in zip(BIG_WRITES, ("UPDATE 2000", "DELETE 2000"), strict=True):
                assert await conn.execute(write) == await ref.execute(write) == done
            for low in range(1, 100000, 10000):  # ten reads
                got = sorted(tuple(r) for r in await conn.fetch(sql, low))
                assert got == sorted(tuple(r) for r in await ref.fetch(sql, low)) and len(got) == 99, low
            assert [tuple(r) for r in await conn.fetch(plans)] == [(f"{PROMOTED_PREFIX}1", 5, 5)]
            assert await ref.fetch(plans) == []  # each unnamed statement planned anew
            await conn.execute("DEALLOCATE ALL")
            assert len(await conn.fetch(sql, 5)) == 99
            assert [tuple(r) for r in await conn.fetch(plans)] == [(f"{PROMOTED_PREFIX}2", 0, 1)]
        finally:
            await conn.close()
            await ref.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_pipelined_unnamed_key_reads_as_on_the_plain_tables(
    proxy: RunningProxy, databases: tuple[str, str]
) -> None:
    """psycopg's pipeline mode sends many unnamed key reads before the first reply: the repetitions sent
    before the proxy's Parse of that text is answered go out unnamed; later ones reuse its statement."""
    sql = "SELECT * FROM k_items WHERE id BETWEEN %s AND %s + 9 ORDER BY id"
    with side_by_side(proxy, databases, "pipelined", K_WRITES) as (conn, ref):
        for round_ in range(2):
            with conn.pipeline():
                cursors = [conn.execute(sql, (low, low)) for low in range(40, 140, 10)]
            for cur, low in zip(cursors, range(40, 140, 10), strict=True):
                assert cur.fetchall() == ref.execute(sql, (low, low)).fetchall(), (round_, low)
        promoted = conn.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE %s", (PROMOTED_PREFIX + "%",)
        ).fetchone()
        assert promoted == (1,)


def test_a_named_key_range_reaches_a_cached_plan(proxy: RunningProxy, databases: tuple[str, str]) -> None:
    """A named statement's key range hides its bounds from the planner in the base branch, so PostgreSQL
    caches its generic plan after five custom ones, where the plain table plans every range anew: on 200k
    rows its generic estimate of a range (0.5 %: 1,000 rows) costs more than the custom plans' 100."""
    layer_db, plain = databases
    big_table(databases)
    sql = "SELECT * FROM k_big WHERE id BETWEEN %s AND %s + 99"
    plans = "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE %s"
    with (
        psycopg.connect(
            proxy.dsn(layer_db, options="-c%20cow.session_id%3Dcached"), prepare_threshold=0
        ) as conn,
        psycopg.connect(plain, prepare_threshold=0) as ref,
    ):
        for write in BIG_WRITES:
            assert conn.execute(write).rowcount == ref.execute(write).rowcount == 2000
        for low in range(1, 30000, 3000):  # ten executions (of one statement: psycopg sends int2 values)
            got = sorted(conn.execute(sql, (low, low)).fetchall())  # base rows first, then the session's
            assert got == sorted(ref.execute(sql, (low, low)).fetchall()) and len(got) == 99, low
        assert conn.execute(plans, ("WITH _cow_versions%",)).fetchall() == [(5, 5)]
        assert ref.execute(plans, ("SELECT * FROM k_big%",)).fetchall() == [(0, 10)]


@pytest.mark.parametrize("named", [False, True], ids=["unnamed-form", "named-form"])
def test_a_prepared_key_read_follows_the_connections_session(databases: tuple[str, str], named: bool) -> None:
    """The rewritten statement names no session: prepared once, it reads session a, then b, then the base
    tables when the connection has left the session (the proxy keeps named statements across sessions),
    with the generic plan cached from the sixth execution on."""
    layer_db, _ = databases
    sql = "SELECT name FROM k_items WHERE id BETWEEN $1 AND $2 ORDER BY id"
    with psycopg.connect(layer_db, autocommit=True) as conn:
        catalog = Catalog.from_rows(conn.execute(CATALOG_QUERY).fetchall())
        sent = Analyzer().analyze(sql, catalog, True, prepared=named).rewritten
        assert sent is not None and "_cow_versions" in sent and ("(SELECT $1)" in sent) is named
        conn.execute("SELECT cow.use_session('a')")
        conn.execute("UPDATE k_items SET name = 'in a' WHERE id = 10")
        conn.execute("SELECT cow.use_session('b')")
        conn.execute("DELETE FROM k_items WHERE id = 11")
        conn.execute("SELECT cow.use_session(NULL)")
        changes = catalog.tables[("public", "k_items")].changes_table
        assert changes is not None
        conn.execute(f"ANALYZE cow_changes.{changes}")
        analyzed = Catalog.from_rows(conn.execute(CATALOG_QUERY).fetchall()).tables[("public", "k_items")]
        assert analyzed.changes_rows == 2  # the catalog reads the changes table's row estimate
        conn.execute("SELECT cow.use_session('b')")
        conn.execute(f"PREPARE kr AS {sent}")
        read = "EXECUTE kr(10, 11)"
        for _ in range(6):  # past the plan cache's five custom plans: the generic plan reads the GUC too
            assert conn.execute(read).fetchall() == [("item 10",)]
        conn.execute("SELECT cow.use_session('a')")
        assert conn.execute(read).fetchall() == [("in a",), ("item 11",)]
        conn.execute("SELECT cow.use_session(NULL)")
        assert conn.execute(read).fetchall() == [("item 10",), ("item 11",)]
        plans = conn.execute("SELECT generic_plans FROM pg_prepared_statements WHERE name = 'kr'").fetchone()
        assert plans is not None and (plans[0] == 3 or not named), plans


# -- property: any mix of writes, any bounded key condition and any other condition: the plain table ------


KEYS = st.integers(1, 400)  # narrow, so that reads often meet the rows the writes changed


@st.composite
def key_conditions(draw: st.DrawFn) -> tuple[str, tuple[Any, ...]]:
    kind = draw(st.sampled_from(["eq", "in", "any", "between", "bounds"]))
    if kind == "eq":
        return "id = %s", (draw(KEYS),)
    if kind == "in":
        ids = draw(st.lists(KEYS, min_size=1, max_size=4))
        return "id IN (" + ", ".join(["%s"] * len(ids)) + ")", tuple(ids)
    if kind == "any":
        ids = draw(st.lists(st.one_of(KEYS, st.integers(20000, 20400)), min_size=1, max_size=5))
        return "id = ANY(%s)", (ids,)
    low = draw(KEYS)
    high = low + draw(st.integers(1, 300))  # an empty range: a plan without the CTE
    if kind == "between":
        return "id BETWEEN %s AND %s", (low, high)
    lower, upper = draw(st.sampled_from(["<", "<="])), draw(st.sampled_from(["<", "<="]))
    return f"%s {lower} id AND id {upper} %s", (low, high)


OTHER = st.sampled_from(["true", "qty IS NULL", "grp = 3", "name LIKE 'new%%'", "qty > 50 OR grp < 2"])


def test_key_reads_equal_the_plain_table_for_any_writes_and_condition(
    proxy: RunningProxy, databases: tuple[str, str]
) -> None:
    sessions = iter(range(10**6))

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        writes=st.lists(k_items_writes(KEYS), max_size=8),
        reads=st.lists(st.tuples(key_conditions(), OTHER), max_size=4),
        prepare=st.booleans(),  # named statements: key ranges take the form with a cacheable plan
    )
    def check(
        writes: list[tuple[str, tuple[Any, ...]]],
        reads: list[tuple[tuple[str, tuple[Any, ...]], str]],
        prepare: bool,
    ) -> None:
        session = f"prop{next(sessions)}"
        with side_by_side(proxy, databases, session, writes, prepare=prepare, rollback=True) as (conn, ref):
            for (key, params), other in reads:
                sql = f"SELECT * FROM k_items WHERE {key} AND ({other}) ORDER BY id"
                assert outcome(conn, sql, params) == outcome(ref, sql, params), (sql, params, writes)
                assert rewritten(conn, sql, params), sql

    check()
