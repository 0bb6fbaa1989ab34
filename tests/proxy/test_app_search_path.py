"""The application's own search_path on a tagged connection: a schema per tenant in a session.

The application switches ``search_path`` (``SET``, ``SET LOCAL``, ``RESET``, ``set_config``, ``-c
search_path`` at startup); in a session each enabled schema's overlay goes right before it, the application's
path is kept in ``cow.app_search_path``, and every tenant's writes land in the session under that tenant's
table — never in a base table, never in another tenant's table.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import asyncpg
import psycopg
import pytest

from migrations import install_layer
from migrations.binding import set_secret
from tests.fix_db import TEST_BIND_SECRET
from tests.fix_proxy import RunningProxy

BOTH_RELAYS = True

SCHEMA = """
CREATE TABLE public.tenants (id int PRIMARY KEY, schema_name text NOT NULL UNIQUE);
INSERT INTO public.tenants VALUES (1, 'tenant_a'), (2, 'tenant_b');
CREATE SCHEMA tenant_a;
CREATE SCHEMA tenant_b;
CREATE SCHEMA "Tenant C";
CREATE SCHEMA tenant_plain;
CREATE TABLE tenant_a.docs (id serial PRIMARY KEY, body text NOT NULL);
CREATE TABLE tenant_b.docs (id serial PRIMARY KEY, body text NOT NULL);
CREATE TABLE "Tenant C".docs (id serial PRIMARY KEY, body text NOT NULL);
CREATE TABLE tenant_plain.docs (id serial PRIMARY KEY, body text NOT NULL);
INSERT INTO tenant_a.docs (body) VALUES ('a1'), ('a2');
INSERT INTO tenant_b.docs (body) VALUES ('b1');
INSERT INTO "Tenant C".docs (body) VALUES ('c1');
INSERT INTO tenant_plain.docs (body) VALUES ('p1');
"""
ENABLED = ("public", "tenant_a", "tenant_b", "Tenant C")


@pytest.fixture
def tenants_db(create_database: Callable[..., str]) -> str:
    dsn = create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)

    async def install() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await install_layer(conn, ENABLED)
            await set_secret(conn, TEST_BIND_SECRET)  # the test proxies bind with it
        finally:
            await conn.close()

    asyncio.run(install())
    return dsn


def base(db: str, schema: str) -> list[str]:
    with psycopg.connect(db, autocommit=True) as conn:
        return [r[0] for r in conn.execute(f'SELECT body FROM "{schema}".docs ORDER BY id')]


def session_writes(db: str, session: str) -> list[tuple[str, str, str]]:
    """(schema, table, body or "deleted <key>") per write of ``session``, read directly."""
    with psycopg.connect(db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT table_schema, table_name, CASE WHEN deleted THEN 'deleted ' || (pk->>'id')"
            " ELSE row_data->>'body' END FROM cow.session_changes(%s) ORDER BY seq",
            (session,),
        ).fetchall()
    return [(str(a), str(b), str(c)) for a, b, c in rows]


def paths(conn: psycopg.Connection[Any]) -> tuple[str, str]:
    """(the application's path as the layer keeps it, the physical path). ``current_setting('search_path')``
    and ``SHOW`` answer with the application's path in a session; ``pg_settings`` has the physical one."""
    row = conn.execute(
        "SELECT current_setting('cow.app_search_path', true),"
        " (SELECT setting FROM pg_catalog.pg_settings WHERE name = 'search_path')"
    ).fetchone()
    assert row is not None
    # and what the application is shown is its own path (docs/rewrites.md, "Introspection")
    assert conn.execute("SHOW search_path").fetchone() == (row[0],)
    return str(row[0]), str(row[1])


def bodies(conn: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in conn.execute("SELECT body FROM docs ORDER BY id")]


@pytest.mark.parametrize("prepare", [False, True], ids=["simple", "extended"])
def test_set_search_path_switches_tenant_in_the_session(
    proxy: RunningProxy, tenants_db: str, prepare: bool
) -> None:
    with psycopg.connect(proxy.dsn(tenants_db, application_name="cow:s1"), autocommit=True) as conn:
        cur = conn.execute("SET search_path = tenant_a, public", prepare=prepare)
        assert cur.statusmessage == "SET"
        assert paths(conn) == (
            "tenant_a, public",
            "cow_overlay_tenant_a, tenant_a, cow_overlay_public, public",
        )
        conn.execute("INSERT INTO docs (body) VALUES ('a3')", prepare=prepare)
        assert bodies(conn) == ["a1", "a2", "a3"]
        conn.execute("SET search_path TO tenant_b, public", prepare=prepare)
        conn.execute("INSERT INTO docs (body) VALUES ('b2')", prepare=prepare)
        conn.execute("UPDATE docs SET body = 'b1!' WHERE body = 'b1'", prepare=prepare)
        assert bodies(conn) == ["b1!", "b2"]
        conn.execute('SET search_path = "Tenant C", public', prepare=prepare)
        assert paths(conn) == (
            '"Tenant C", public',
            '"cow_overlay_Tenant C", "Tenant C", cow_overlay_public, public',
        )
        conn.execute("DELETE FROM docs", prepare=prepare)
        assert bodies(conn) == []
        # the shared table in public is the session's view too
        assert conn.execute("SELECT count(*) FROM tenants").fetchone() == (2,)
        conn.execute("SET search_path = tenant_a, public", prepare=prepare)
        assert bodies(conn) == ["a1", "a2", "a3"]
    assert base(tenants_db, "tenant_a") == ["a1", "a2"]
    assert base(tenants_db, "tenant_b") == ["b1"]
    assert base(tenants_db, "Tenant C") == ["c1"]
    assert session_writes(tenants_db, "s1") == [
        ("tenant_a", "docs", "a3"),
        ("tenant_b", "docs", "b2"),
        ("tenant_b", "docs", "b1!"),
        ("Tenant C", "docs", "deleted 1"),
    ]


def test_set_local_and_rollback_revert_both_paths(proxy: RunningProxy, tenants_db: str) -> None:
    with psycopg.connect(proxy.dsn(tenants_db, application_name="cow:s2"), autocommit=True) as conn:
        conn.execute("SET search_path = tenant_a, public")
        with conn.transaction():
            conn.execute("SET LOCAL search_path = tenant_b")
            assert paths(conn) == ("tenant_b", "cow_overlay_tenant_b, tenant_b")
            conn.execute("INSERT INTO docs (body) VALUES ('local b')")
        assert paths(conn)[0] == "tenant_a, public"
        with pytest.raises(psycopg.errors.DivisionByZero), conn.transaction():
            conn.execute("SET search_path = tenant_b")
            conn.execute("SELECT 1 / 0")
        assert paths(conn)[0] == "tenant_a, public"
        assert bodies(conn) == ["a1", "a2"]
        # set_config returns what it returns outside a session: the application's path
        row = conn.execute("SELECT set_config('search_path', 'tenant_b,public', false)").fetchone()
        assert row == ("tenant_b,public",)
        assert paths(conn) == (
            "tenant_b,public",
            "cow_overlay_tenant_b, tenant_b, cow_overlay_public, public",
        )
        assert bodies(conn) == ["b1", "local b"]
        # RESET goes back to the connection's own default
        assert conn.execute("RESET search_path").statusmessage == "RESET"
        assert paths(conn) == ('"$user", public', '"$user", cow_overlay_public, public')
    assert base(tenants_db, "tenant_b") == ["b1"]
    assert session_writes(tenants_db, "s2") == [("tenant_b", "docs", "local b")]


def test_search_path_at_startup_is_the_session_path(proxy: RunningProxy, tenants_db: str) -> None:
    """Rails' ``schema_search_path`` (``SET search_path`` at connect) and ``-c search_path`` at startup."""
    options = "-c%20search_path%3Dtenant_b,public%20-c%20cow.session_id%3Ds3"
    with psycopg.connect(proxy.dsn(tenants_db, options=options), autocommit=True) as conn:
        assert paths(conn) == (
            "tenant_b,public",
            "cow_overlay_tenant_b, tenant_b, cow_overlay_public, public",
        )
        conn.execute("INSERT INTO docs (body) VALUES ('b at startup')")
        assert bodies(conn) == ["b1", "b at startup"]
        conn.execute("RESET search_path")
        assert paths(conn)[0] == "tenant_b,public"
    assert session_writes(tenants_db, "s3") == [("tenant_b", "docs", "b at startup")]


def test_a_schema_without_the_layer_reads_base_rows(proxy: RunningProxy, tenants_db: str) -> None:
    with psycopg.connect(proxy.dsn(tenants_db, application_name="cow:s4"), autocommit=True) as conn:
        conn.execute("SET search_path = tenant_plain, public")
        assert paths(conn) == ("tenant_plain, public", "tenant_plain, cow_overlay_public, public")
        assert bodies(conn) == ["p1"]
        with pytest.raises(
            psycopg.errors.InsufficientPrivilege, match="cowproxy install --schema tenant_plain"
        ):
            conn.execute("INSERT INTO tenant_plain.docs (body) VALUES ('p2')")
    assert base(tenants_db, "tenant_plain") == ["p1"]


UNLAYERED = "schema tenant_plain has no copy-on-write layer"


@pytest.mark.parametrize("prepare", [False, True], ids=["simple", "extended"])
def test_an_unqualified_write_to_a_schema_without_the_layer_is_refused(
    proxy: RunningProxy, tenants_db: str, prepare: bool
) -> None:
    """Its tables have no guard: the proxy asks the server where the name resolves before the write runs."""
    with psycopg.connect(proxy.dsn(tenants_db, application_name="cow:s4b"), autocommit=True) as conn:
        conn.execute("SET search_path = tenant_plain, public")
        for sql in (
            "INSERT INTO docs (body) VALUES ('p2')",
            "UPDATE docs SET body = 'p1!'",
            "DELETE FROM docs",
            "WITH x AS (DELETE FROM docs RETURNING 1) SELECT count(*) FROM x",
            "TRUNCATE docs",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match=UNLAYERED):
                conn.execute(sql, prepare=prepare)
        with (
            pytest.raises(psycopg.errors.InsufficientPrivilege, match=UNLAYERED),
            conn.cursor().copy("COPY docs (body) FROM STDIN") as copy,
        ):
            copy.write_row(("p3",))
        # schema-qualified: refused from the statement alone; reads see the base rows
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=UNLAYERED):
            conn.execute("INSERT INTO tenant_plain.docs (body) VALUES ('p2')", prepare=prepare)
        assert bodies(conn) == ["p1"]
        # the session's own tables and temporary tables stay writable on the same path
        conn.execute("INSERT INTO tenants VALUES (3, 'tenant_c')", prepare=prepare)
        conn.execute("CREATE TEMPORARY TABLE scratch (x int)")
        conn.execute("INSERT INTO scratch VALUES (1)", prepare=prepare)
        # a path without it again: writes go to the session
        conn.execute("SET search_path = tenant_a, public")
        conn.execute("INSERT INTO docs (body) VALUES ('a3')", prepare=prepare)
    assert base(tenants_db, "tenant_plain") == ["p1"]
    assert session_writes(tenants_db, "s4b") == [("public", "tenants", "None"), ("tenant_a", "docs", "a3")]


def test_an_unlayered_path_is_followed_through_transactions(proxy: RunningProxy, tenants_db: str) -> None:
    """SET LOCAL and a rollback put the unlayered schema on the path and take it off again; set_config and a
    statement prepared before the path changed (PostgreSQL resolves its names again) are checked too."""
    with psycopg.connect(proxy.dsn(tenants_db, application_name="cow:s4c"), autocommit=True) as conn:
        conn.execute("SET search_path = tenant_a, public")
        conn.execute("INSERT INTO docs (body) VALUES ('a3')")  # the path is known clean from here
        with conn.transaction():
            conn.execute("SET LOCAL search_path = tenant_plain")
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match=UNLAYERED):
                conn.execute("INSERT INTO docs (body) VALUES ('p2')")
            raise psycopg.Rollback
        conn.execute("INSERT INTO docs (body) VALUES ('a4')")  # tenant_a again after the transaction
        with conn.transaction():
            conn.execute("SAVEPOINT s")
            conn.execute("SET search_path = tenant_plain")
            conn.execute("ROLLBACK TO SAVEPOINT s")
            conn.execute("INSERT INTO docs (body) VALUES ('a5')")
            assert bodies(conn)[-1] == "a5"  # (tenant_a: the savepoint undid the path)
            conn.execute("SET search_path = tenant_plain")
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match=UNLAYERED):
                conn.execute("INSERT INTO docs (body) VALUES ('p2')")
            raise psycopg.Rollback
        assert conn.execute("SELECT set_config('search_path', 'tenant_plain', false)").fetchone() == (
            "tenant_plain",
        )
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=UNLAYERED):
            conn.execute("INSERT INTO docs (body) VALUES ('p2')")
        # prepared under tenant_a (through the protocol and in SQL), run under tenant_plain
        conn.execute("SET search_path = tenant_a")
        cur = conn.cursor()
        cur.execute("INSERT INTO docs (body) VALUES (%s)", ("a6",), prepare=True)
        conn.execute("PREPARE ins (text) AS INSERT INTO docs (body) VALUES ($1)")
        conn.execute("EXECUTE ins ('a7')")
        conn.execute("SET search_path = tenant_plain")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=UNLAYERED):
            cur.execute("INSERT INTO docs (body) VALUES (%s)", ("p2",), prepare=True)
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="EXECUTE of a statement prepared"):
            conn.execute("EXECUTE ins ('p2')")
        # a query string that changes the path and writes is refused as a whole
        conn.execute("SET search_path = tenant_a")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="statement of its own"):
            conn.execute(
                "SELECT set_config('search_path', 'tenant_plain', false);"
                " INSERT INTO docs (body) VALUES ('p')"
            )
        assert bodies(conn) == ["a1", "a2", "a3", "a4", "a6", "a7"]
    assert base(tenants_db, "tenant_plain") == ["p1"]
    assert base(tenants_db, "tenant_a") == ["a1", "a2"]


def test_a_role_whose_schema_lacks_the_layer_is_followed(proxy: RunningProxy, tenants_db: str) -> None:
    """``"$user"`` on the default path stands for the current role: SET ROLE to a role with a schema of its
    name (without the layer) makes unqualified names resolve there, and writes to it are refused."""
    role = f"cow_i20_{os.getpid()}"
    with psycopg.connect(tenants_db, autocommit=True) as conn:
        conn.execute(
            f"DO $$BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN "
            f"CREATE ROLE {role}; END IF; END$$"
        )
        conn.execute(f"CREATE SCHEMA {role} AUTHORIZATION {role}")
        conn.execute(f"CREATE TABLE {role}.tenants (id int PRIMARY KEY, schema_name text)")
        conn.execute(f"ALTER TABLE {role}.tenants OWNER TO {role}")
        conn.execute(f"GRANT SELECT, INSERT ON public.tenants TO {role}")
    with psycopg.connect(proxy.dsn(tenants_db, application_name="cow:s9"), autocommit=True) as conn:
        conn.execute("INSERT INTO tenants VALUES (5, 'e')")  # public.tenants: the session's (path clean)
        conn.execute(f"SET ROLE {role}")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"schema {role} has no copy-on-write"):
            conn.execute("INSERT INTO tenants VALUES (6, 'f')")
        conn.execute("RESET ROLE")
        conn.execute("INSERT INTO tenants VALUES (7, 'g')")
    with psycopg.connect(tenants_db, autocommit=True) as conn:
        assert conn.execute(f"SELECT count(*) FROM {role}.tenants").fetchone() == (0,)
        conn.execute(f"DROP SCHEMA {role} CASCADE")
        conn.execute(f"REVOKE ALL ON public.tenants FROM {role}")
        conn.execute(f"DROP ROLE {role}")
        keys = conn.execute("SELECT pk->>'id' FROM cow.session_changes('s9') ORDER BY seq").fetchall()
    assert keys == [("5",), ("7",)]


def path_checks(proxy: RunningProxy) -> list[int]:
    return proxy.run(
        lambda: [c.relay.path.checks for c in proxy.server.connections.values() if c.relay is not None]
    )


@pytest.mark.parametrize("prepare", [False, True], ids=["simple", "extended"])
def test_a_layered_path_is_asked_about_once_per_change(
    proxy: RunningProxy, tenants_db: str, prepare: bool
) -> None:
    """The cost: on a path of layered schemas the server is asked once after each change of path (then no
    more, transactions included; at the connection's start with its join: Relay.start); on a path with a
    schema without the layer, before every such write."""
    with psycopg.connect(proxy.dsn(tenants_db, application_name="cow:s8"), autocommit=True) as conn:
        for _ in range(5):
            conn.execute("INSERT INTO tenants VALUES (%s, %s)", (_ + 10, f"t{_}"), prepare=prepare)
            with conn.transaction():
                conn.execute("UPDATE tenants SET schema_name = schema_name || '!' WHERE id = 1")
        assert path_checks(proxy) == [0]  # (answered with the join)
        for tenant_schema in ("tenant_a", "tenant_b"):
            conn.execute(f"SET search_path = {tenant_schema}, public")
            for _ in range(3):
                conn.execute("INSERT INTO docs (body) VALUES (%s)", ("x",), prepare=prepare)
        assert path_checks(proxy) == [2]
        conn.execute("SET search_path = tenant_plain, public")
        for _ in range(3):
            conn.execute("INSERT INTO tenants VALUES (%s, %s)", (_ + 20, f"p{_}"), prepare=prepare)
        assert path_checks(proxy) == [5]


def test_parameter_status_shows_the_application_path(proxy: RunningProxy, tenants_db: str) -> None:
    """PostgreSQL 18 reports search_path (ParameterStatus): the client is told the application's path, as
    SHOW says, never the overlay path (introspection answers as outside the session)."""
    with psycopg.connect(proxy.dsn(tenants_db, application_name="cow:s7"), autocommit=True) as conn:
        if conn.info.server_version < 180000:
            assert conn.info.parameter_status("search_path") is None  # (not reported before 18)
            return
        assert conn.info.parameter_status("search_path") == '"$user", public'
        for sql in (
            "SET search_path = tenant_a, public",
            'SET search_path = "Tenant C", public',
            "RESET search_path",
            "SET search_path = tenant_plain, public",
        ):
            conn.execute(sql)
            assert conn.info.parameter_status("search_path") == paths(conn)[0], sql
        with conn.transaction():
            conn.execute("SET LOCAL search_path = tenant_b")
            assert conn.info.parameter_status("search_path") == "tenant_b"
        assert conn.info.parameter_status("search_path") == "tenant_plain, public"


def test_other_path_changes_stay_refused(proxy: RunningProxy, tenants_db: str) -> None:
    with psycopg.connect(proxy.dsn(tenants_db, application_name="cow:s5"), autocommit=True) as conn:
        for sql in (
            "SET search_path = tenant_a; SELECT 1",  # not a statement of its own
            "SELECT set_config(lower('SEARCH_PATH'), 'tenant_a', false)",  # a computed name
            "DO $$BEGIN SET search_path = tenant_a; END$$",
            "SET search_path = cow_changes, public",  # the layer's schemas stay out of reach
            "SELECT set_config('search_path', 'cow', false)",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql)
        assert paths(conn)[0] == '"$user", public'


def test_asyncpg_switches_tenants(proxy: RunningProxy, tenants_db: str) -> None:
    async def run() -> list[Any]:
        conn = await asyncpg.connect(proxy.dsn(tenants_db, application_name="cow:s6"))
        try:
            await conn.execute("SET search_path TO tenant_a")
            await conn.execute("INSERT INTO docs (body) VALUES ($1)", "a via asyncpg")
            await conn.execute("SET search_path TO tenant_b")
            await conn.execute("INSERT INTO docs (body) VALUES ($1)", "b via asyncpg")
            return [r["body"] for r in await conn.fetch("SELECT body FROM docs ORDER BY id")]
        finally:
            await conn.close()

    assert asyncio.run(run()) == ["b1", "b via asyncpg"]
    assert session_writes(tenants_db, "s6") == [
        ("tenant_a", "docs", "a via asyncpg"),
        ("tenant_b", "docs", "b via asyncpg"),
    ]
