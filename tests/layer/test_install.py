"""install / uninstall: idempotent, upgrades in place, leaves the app schema as it was."""

from __future__ import annotations

import asyncio
import hashlib
import re
import subprocess
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import asyncpg
import psycopg
import pytest

from migrations import install_layer, layer, repeatables, uninstall_layer
from migrations.errors import LayerError, NotInstalledError, PermissionDeniedError
from migrations.layer import Repeatable
from tests.fix_db import PgServer
from tests.fix_layer import OLD_VERSIONS, SAMPLE_DATA, SAMPLE_SCHEMA, install_old_layer

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
        # Tables without a primary key that cannot be enabled as keyless tables (docs/layer.md).
        conn.execute("CREATE TABLE docs (n int, body json)")  # json has no equality operator
        conn.execute("CREATE TABLE codes (code text UNIQUE)")  # a UNIQUE index over a nullable column
    first = run(sample_db, install_layer)
    assert first.applied
    assert [n for n in first.notes if "no primary key" in n] == [
        "table public.codes has no primary key or NOT NULL unique index, and a UNIQUE index or exclusion "
        "constraint that cannot be its key (not supported without a key: codes_code_key (column code is "
        "nullable)): not enabled (it stays plain; writes to it in a session are refused)",
        "table public.docs has no primary key and columns whose type has no equality operator (body json): "
        "its rows cannot be told apart: not enabled (it stays plain; writes to it in a session are refused)",
    ]
    assert any("materialized view public.big_orders" in n for n in first.notes)
    second = run(sample_db, install_layer)
    assert second.applied == ()
    with psycopg.connect(sample_db) as conn:
        tables = conn.execute("SELECT table_name, pk_columns FROM cow.tables").fetchall()
        assert tables == [("customers", ["id"]), ("nopk", []), ("orders", ["id"])]  # nopk: keyless
        assert conn.execute("SELECT count(*) FROM cow.migrations").fetchone() == (len(first.applied),)
        guards = conn.execute(
            "SELECT tgrelid::regclass::text FROM pg_trigger WHERE tgname = 'cow_guard' ORDER BY 1"
        )
        assert guards.fetchall() == [("codes",), ("customers",), ("docs",), ("nopk",), ("orders",)]


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
        assert conn.execute("SELECT count(*) FROM cow.tables").fetchone() == (3,)  # customers, nopk, orders
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


# What the layer made, as the catalogs show it: every function in cow (its whole definition), and the
# per-table objects: the changes tables (columns, storage options), their indexes, the overlay views and
# twins, every function and trigger in cow_changes and the overlay schemas, the guards on app tables, the
# event triggers.
LAYER_OBJECTS = """
WITH ns AS (
    SELECT oid, nspname FROM pg_namespace
    WHERE nspname IN ('cow', 'cow_changes') OR nspname IN (SELECT overlay_schema FROM cow.schemas)
)
SELECT 'function', p.oid::regprocedure::text, pg_get_functiondef(p.oid)
FROM pg_proc p JOIN ns ON ns.oid = p.pronamespace
UNION ALL
SELECT 'relation', c.oid::regclass::text,
       concat_ws(' ', c.relkind, c.reloptions::text,
                 (SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', '
                                    ORDER BY a.attnum)
                  FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
                 CASE WHEN c.relkind = 'v' THEN pg_get_viewdef(c.oid) END,
                 CASE WHEN c.relkind = 'i' THEN pg_get_indexdef(c.oid) END)
FROM pg_class c JOIN ns ON ns.oid = c.relnamespace
UNION ALL
SELECT 'trigger', t.tgrelid::regclass::text || ' ' || t.tgname, pg_get_triggerdef(t.oid)
FROM pg_trigger t WHERE NOT t.tgisinternal
UNION ALL
SELECT 'event trigger', e.evtname, concat_ws(' ', e.evtevent, e.evtfoid::regprocedure, e.evtenabled)
FROM pg_event_trigger e
ORDER BY 1, 2
"""


def layer_objects(dsn: str) -> list[tuple[str, str, str]]:
    """The layer's objects, the changes tables' ids (t<id>, in every name made from them) replaced by their
    table's name: ids follow the order in which tables were enabled (an upgrade enables the tables an older
    version left plain after those it had)."""
    with psycopg.connect(dsn) as conn:
        ids = dict(
            conn.execute("SELECT id::text, table_schema || '.' || table_name FROM cow.registry").fetchall()
        )

        def norm(text: str) -> str:
            return re.sub(r"(?<![A-Za-z0-9])t([0-9]+)(?![0-9])", lambda m: f"t[{ids.get(m[1], m[1])}]", text)

        return sorted((r[0], norm(r[1]), norm(r[2])) for r in conn.execute(LAYER_OBJECTS))


def test_a_numbered_file_defines_no_function_and_each_function_has_one_repeatable_definition() -> None:
    import pglast

    defined: list[str] = []
    for migration in layer.migrations():
        for stmt in pglast.parse_sql(migration.sql):
            assert not isinstance(stmt.stmt, pglast.ast.CreateFunctionStmt), migration.name
    for repeatable in repeatables():
        for stmt in pglast.parse_sql(repeatable.sql):
            if isinstance(stmt.stmt, pglast.ast.CreateFunctionStmt):
                defined.append(".".join(n.sval for n in stmt.stmt.funcname))
    assert len(defined) == len(set(defined)) > 40


@pytest.mark.parametrize("version", OLD_VERSIONS)
def test_an_upgrade_from_each_older_version_ends_like_a_fresh_install(
    sample_db: str, layer_db: str, version: int
) -> None:
    fresh, old = layer_db, sample_db  # layer_db: the sample database with a fresh install
    install_old_layer(old, version)
    with psycopg.connect(old, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session('kept')")
        conn.execute("UPDATE customers SET score = 7 WHERE id = 1")
    before = layer_objects(old)
    result = run(old, install_layer)
    assert result.applied == tuple(m.version for m in layer.migrations() if m.version > 4)
    assert result.reapplied == tuple(r.name for r in repeatables())
    after = layer_objects(old)
    assert after != before
    assert after == layer_objects(fresh)
    with psycopg.connect(old, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session('kept')")
        assert conn.execute("SELECT score FROM customers WHERE id = 1").fetchone() == (7,)  # sessions survive
    second = run(old, install_layer)
    assert (second.applied, second.reapplied) == ((), ())


def test_second_install_applies_nothing_and_changes_nothing(sample_db: str) -> None:
    first = run(sample_db, install_layer)
    assert first.reapplied == tuple(r.name for r in repeatables())
    with psycopg.connect(sample_db) as conn:
        recorded = conn.execute(
            "SELECT name, checksum, applied_at FROM cow.repeatables ORDER BY 1"
        ).fetchall()
    before = layer_objects(sample_db)
    second = run(sample_db, install_layer)
    assert (second.applied, second.reapplied) == ((), ())
    assert layer_objects(sample_db) == before
    with psycopg.connect(sample_db) as conn:
        assert (
            conn.execute("SELECT name, checksum, applied_at FROM cow.repeatables ORDER BY 1").fetchall()
            == recorded
        )


def test_a_changed_repeatable_is_applied_again_an_unchanged_one_is_not(
    sample_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run(sample_db, install_layer)
    with psycopg.connect(sample_db, autocommit=True) as conn:
        # Changed behind install's back (not in a file): an unchanged file is not applied again, so it stays.
        conn.execute(
            "CREATE OR REPLACE FUNCTION cow._meta_columns() RETURNS text[] LANGUAGE sql IMMUTABLE"
            " AS $$ SELECT '{}'::text[] $$"
        )
        conn.execute("SELECT cow.use_session('kept')")
        conn.execute("UPDATE customers SET score = 7 WHERE id = 1")
        conn.execute("DROP FUNCTION cow_changes.t1_ins() CASCADE")  # refresh(true) puts it back
    shipped = repeatables()
    core = next(r for r in shipped if r.name == "10_core.sql")
    assert "length(p) <= 128 $$;" in core.sql
    edited = core.sql.replace("length(p) <= 128 $$;", "length(p) <= 64 $$;", 1)
    changed = [
        Repeatable(r.name, edited, hashlib.sha256(edited.encode()).hexdigest()) if r is core else r
        for r in shipped
    ]
    monkeypatch.setattr(layer, "repeatables", lambda: changed)
    result = run(sample_db, install_layer)
    assert (result.applied, result.reapplied) == ((), ("10_core.sql",))
    with psycopg.connect(sample_db, autocommit=True) as conn:
        assert conn.execute("SELECT cow.valid_id(repeat('a', 100))").fetchone() == (False,)
        assert conn.execute("SELECT cow._meta_columns()").fetchone() == ([],)
        assert conn.execute("SELECT checksum FROM cow.repeatables WHERE name = '10_core.sql'").fetchone() == (
            changed[0].checksum,
        )
        conn.execute("SELECT cow.use_session('kept')")
        assert conn.execute("SELECT score FROM customers WHERE id = 1").fetchone() == (7,)
        conn.execute("INSERT INTO customers (email, name) VALUES ('u@x', 'U')")  # the trigger is back
