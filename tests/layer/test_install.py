"""install / uninstall: idempotent, upgrades in place, leaves the app schema as it was."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import asyncpg
import psycopg
import pytest

from migrations import install_layer, uninstall_layer
from migrations.errors import LayerError, NotInstalledError, PermissionDeniedError
from tests.conftest import PgServer
from tests.layer.conftest import SAMPLE_DATA, SAMPLE_SCHEMA

T = TypeVar("T")


def run(dsn: str, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    async def go() -> T:
        conn = await asyncpg.connect(dsn)
        try:
            return await work(conn)
        finally:
            await conn.close()

    return asyncio.run(go())


def dump(pg_server: PgServer, dsn: str) -> str:
    parts = urlsplit(dsn)
    out = subprocess.run(
        [
            pg_server.tool("pg_dump"),
            "--schema-only",
            "--schema=public",
            "-h",
            parts.hostname or "127.0.0.1",
            "-p",
            str(parts.port or 5432),
            "-U",
            parts.username or "postgres",
            parts.path.lstrip("/"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0 and "server version mismatch" in out.stderr:
        pytest.skip(f"pg_dump on this machine does not match the server: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    # The dump names the pg_dump/server versions and a random \restrict key (PostgreSQL >= 17.6).
    return "\n".join(
        line
        for line in out.stdout.splitlines()
        if not line.startswith(("-- Dumped", "\\restrict", "\\unrestrict"))
    )


@pytest.fixture
def sample_db(create_database: Callable[..., str]) -> str:
    dsn = create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SAMPLE_SCHEMA)
        conn.execute(SAMPLE_DATA)
    return dsn


def test_pg_dump_of_the_app_schema_is_unchanged_by_install_then_uninstall(
    pg_server: PgServer, sample_db: str
) -> None:
    before = dump(pg_server, sample_db)
    run(sample_db, install_layer)
    during = dump(pg_server, sample_db)
    assert "cow_guard" in during  # the one visible trace (docs/layer.md)
    assert during.replace("cow_guard", "") != before
    run(sample_db, uninstall_layer)
    assert dump(pg_server, sample_db) == before
    with psycopg.connect(sample_db) as conn:
        left = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'cow%' UNION ALL "
            "SELECT evtname FROM pg_event_trigger"
        ).fetchall()
    assert left == []


def test_install_is_idempotent_and_reports_skipped_tables(sample_db: str) -> None:
    with psycopg.connect(sample_db, autocommit=True) as conn:
        conn.execute("CREATE MATERIALIZED VIEW big_orders AS SELECT * FROM orders WHERE qty > 1")
    first = run(sample_db, install_layer)
    assert first.applied and any("nopk" in n and "no primary key" in n for n in first.notes)
    assert any("materialized view public.big_orders" in n for n in first.notes)
    second = run(sample_db, install_layer)
    assert second.applied == ()
    with psycopg.connect(sample_db) as conn:
        assert conn.execute("SELECT table_name FROM cow.tables").fetchall() == [("customers",), ("orders",)]
        assert conn.execute("SELECT count(*) FROM cow.migrations").fetchone() == (len(first.applied),)
        guards = conn.execute(
            "SELECT tgrelid::regclass::text FROM pg_trigger WHERE tgname = 'cow_guard' ORDER BY 1"
        )
        assert guards.fetchall() == [("customers",), ("nopk",), ("orders",)]


def test_install_upgrades_an_older_install_in_place(sample_db: str) -> None:
    run(sample_db, install_layer)
    with psycopg.connect(sample_db, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session('keep')")
        conn.execute("UPDATE customers SET score = 7 WHERE id = 1")
        conn.execute("SELECT cow.use_session(NULL)")
        # Pretend the install is one version behind.
        latest = conn.execute("SELECT max(version) FROM cow.migrations").fetchone()
        assert latest is not None
        conn.execute("DELETE FROM cow.migrations WHERE version = %s", latest)
        conn.execute("DROP FUNCTION cow_changes.t1_ins() CASCADE")
    result = run(sample_db, install_layer)
    assert result.applied == (latest[0],)
    with psycopg.connect(sample_db, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session('keep')")
        assert conn.execute("SELECT score FROM customers WHERE id = 1").fetchone() == (7,)
        conn.execute("INSERT INTO customers (email, name) VALUES ('u@x', 'U')")  # the trigger is back


def test_exclude_and_other_schemas(sample_db: str) -> None:
    with psycopg.connect(sample_db, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA app2; CREATE TABLE app2.items (id int PRIMARY KEY, v text)")
    with pytest.raises(LayerError, match="no such table"):
        run(sample_db, lambda c: install_layer(c, ["public"], ["nothere"]))
    with pytest.raises(LayerError, match="does not exist"):
        run(sample_db, lambda c: install_layer(c, ["nosuchschema"]))
    with psycopg.connect(sample_db) as conn:
        assert conn.execute("SELECT to_regnamespace('cow')").fetchone() == (None,)
    result = run(sample_db, lambda c: install_layer(c, ["public", "app2"], ["nopk", "public.orders"]))
    assert not any("nopk" in n for n in result.notes)
    with psycopg.connect(sample_db, autocommit=True) as conn:
        tables = conn.execute("SELECT table_schema, table_name, overlay_schema FROM cow.tables").fetchall()
        assert tables == [
            ("app2", "items", "cow_overlay_app2"),
            ("public", "customers", "cow_overlay_public"),
        ]
        conn.execute("SET search_path = app2, public")
        conn.execute("SELECT cow.use_session('s')")
        assert conn.execute("SHOW search_path").fetchone() == (
            "cow_overlay_app2, app2, cow_overlay_public, public",
        )
        conn.execute("INSERT INTO items VALUES (1, 'x')")
        conn.execute("INSERT INTO nopk VALUES (5, 'excluded: a plain table, written for real')")
        conn.execute("SELECT cow.use_session(NULL)")
        assert conn.execute("SELECT count(*) FROM app2.items").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM nopk").fetchone() == (2,)


def test_uninstall_refuses_while_sessions_hold_changes(sample_db: str) -> None:
    run(sample_db, install_layer)
    with psycopg.connect(sample_db, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session('busy')")
        conn.execute("DELETE FROM orders WHERE id = 1")
    with pytest.raises(LayerError, match="busy"):
        run(sample_db, uninstall_layer)
    with psycopg.connect(sample_db) as conn:
        assert conn.execute("SELECT count(*) FROM cow.tables").fetchone() == (2,)
    run(sample_db, lambda c: uninstall_layer(c, discard_sessions=True))
    with pytest.raises(NotInstalledError):
        run(sample_db, uninstall_layer)
    with psycopg.connect(sample_db) as conn:
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (4,)


def test_install_without_permission_is_a_clear_error(sample_db: str) -> None:
    role = "cow_unpriv"
    with psycopg.connect(sample_db, autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {role}")
        conn.execute(f"CREATE ROLE {role} LOGIN")
        db = urlsplit(sample_db).path.lstrip("/")
        conn.execute(f"GRANT CREATE ON DATABASE {db} TO {role}")
    parts = urlsplit(sample_db)
    dsn = parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}").geturl()
    try:
        with pytest.raises(PermissionDeniedError, match="superuser"):
            run(dsn, install_layer)
        with psycopg.connect(sample_db) as conn:
            assert conn.execute("SELECT to_regnamespace('cow')").fetchone() == (None,)
    finally:
        with psycopg.connect(sample_db, autocommit=True) as conn:
            conn.execute(f"REVOKE ALL ON DATABASE {db} FROM {role}")
            conn.execute(f"DROP ROLE {role}")


def test_python_api_is_exported() -> None:
    import migrations

    assert {"install_layer", "uninstall_layer"} <= set(migrations.__all__)
    _: Any = migrations.install_layer
