"""The tagged connections' allow-list end to end, through a real proxy: a refusal names its rule and how to
lift it, a deployment lifts ``ddl`` for a migration agent (``session_allow``), DDL on a copy-on-write table
stays refused in a session, and temporary tables are an application's own at any time. The base tables are
read directly."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from proxy.sql.policy import Policy
from tests.fix_db import PgServer
from tests.fix_proxy import RunningProxy, run_proxy

pytestmark = pytest.mark.timeout(120)

SESSION = "pol1"


def tagged(proxy: RunningProxy, db: str) -> psycopg.Connection[Any]:
    return psycopg.connect(proxy.dsn(db, application_name=f"cow:{SESSION}"), autocommit=True)


def relations(db: str) -> set[str]:
    with psycopg.connect(db, autocommit=True) as conn:
        rows = conn.execute("SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace")
        return {r[0] for r in rows}


def test_ddl_is_refused_naming_its_rule_and_temporary_tables_are_allowed(
    proxy: RunningProxy, layer_db: str
) -> None:
    before = relations(layer_db)
    with tagged(proxy, layer_db) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
            conn.execute("CREATE TABLE extra (id int PRIMARY KEY)")
        assert 'rule "ddl"' in str(refused.value) and 'session_allow = ["ddl"]' in str(refused.value)
        conn.execute("CREATE TEMP TABLE scratch (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO scratch SELECT id, email FROM customers")
        assert conn.execute("SELECT count(*) FROM scratch").fetchone() == (3,)
        conn.execute("ALTER TABLE pg_temp.scratch ADD COLUMN w int")
        conn.execute("CREATE INDEX ON pg_temp.scratch (v)")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match='rule "ddl"'):
            conn.execute("DROP TABLE scratch")  # (unqualified: it might name a permanent table)
        conn.execute("DROP TABLE pg_temp.scratch")
        conn.execute("CREATE TEMP TABLE scratch2 (id int)")
        conn.execute("DISCARD TEMP")
        conn.execute("INSERT INTO customers (email, name) VALUES ('in-session@x', 'S')")
    assert relations(layer_db) == before


def test_a_migration_agent_with_ddl_lifted(pg_server: PgServer, layer_db: str) -> None:
    with (
        run_proxy(pg_server, session_allow=Policy.from_names(["ddl"])) as proxy,
        tagged(proxy, layer_db) as conn,
    ):
        # (Qualified: in a session the first schema of the physical search_path is the layer's overlay.)
        conn.execute("CREATE TABLE public.extra (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO extra VALUES (1, 'in the session')")  # the layer enabled it: a CoW table
        with pytest.raises(psycopg.errors.FeatureNotSupported):  # a copy-on-write table's DDL: 0A000
            conn.execute("ALTER TABLE customers ADD COLUMN nickname text")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match='rule "function"'):
            conn.execute("CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match='rule "layer"'):
            conn.execute("DROP SCHEMA cow CASCADE")
        # Unqualified, it would be made in the overlay schema (first on the session's physical path).
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="without a schema"):
            conn.execute("CREATE TABLE extra2 (id int PRIMARY KEY)")
        conn.execute("INSERT INTO customers (email, name) VALUES ('migrated@x', 'M')")
    assert "extra" in relations(layer_db)
    with psycopg.connect(layer_db, autocommit=True) as conn:
        columns = conn.execute(
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_name = 'customers' AND column_name = 'nickname'"
        ).fetchone()
        assert columns == (0,)
        assert conn.execute("SELECT count(*) FROM public.customers").fetchone() == (3,)
        rows = conn.execute(
            "SELECT table_name, coalesce(row_data->>'email', row_data->>'note')"
            " FROM cow.session_changes(%s) ORDER BY seq",
            (SESSION,),
        ).fetchall()
        assert rows == [("extra", "in the session"), ("customers", "migrated@x")]
        assert conn.execute("SELECT count(*) FROM public.extra").fetchone() == (0,)
