"""The overlay of tables with row-level security (migrations/sql/functions/38_rls.sql) follows app DDL, and
tables without it keep the generated view and triggers."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.layer.test_plans import nodes

SCHEMA = """
CREATE TABLE docs (id int PRIMARY KEY, tenant text NOT NULL, body text);
INSERT INTO docs SELECT g, 't' || (g % 3), 'b' || g FROM generate_series(1, 20000) g;
CREATE TABLE plain_docs (id int PRIMARY KEY, tenant text NOT NULL);
ALTER TABLE docs ENABLE ROW LEVEL SECURITY;
ALTER TABLE docs FORCE ROW LEVEL SECURITY;
CREATE POLICY by_tenant ON docs USING (tenant = current_setting('app.tenant', true));
"""


def shape(conn: psycopg.Connection[Any], table: str) -> tuple[Any, ...]:
    """(reloptions of the overlay view, its INSTEAD OF triggers)."""
    row = conn.execute(
        "SELECT v.reloptions, array(SELECT t.tgname::text FROM pg_trigger t WHERE t.tgrelid = v.oid"
        " AND NOT t.tgisinternal ORDER BY t.tgname) FROM pg_class v"
        " WHERE v.oid = to_regclass('cow_overlay_public.' || %s)",
        (table,),
    ).fetchone()
    assert row is not None
    return tuple(row)


def test_rls_overlay_follows_ddl_and_plain_tables_keep_theirs(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(SCHEMA)
        rls = shape(conn, "docs")
        assert rls[0] == ["security_invoker=true"] and "cow_0rls" in rls[1]
        assert shape(conn, "plain_docs") == (None, ["cow_delete", "cow_insert", "cow_update"])
        assert shape(conn, "customers")[0] is None  # the sample's tables: untouched
        conn.execute("ALTER TABLE docs NO FORCE ROW LEVEL SECURITY")
        conn.execute("ALTER TABLE docs DISABLE ROW LEVEL SECURITY")
        assert shape(conn, "docs") == (None, ["cow_delete", "cow_insert", "cow_update"])
        conn.execute("ALTER TABLE docs ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY")
        assert shape(conn, "docs") == rls
        # a policy change (no ALTER TABLE) reaches the session's rows too
        conn.execute("CREATE ROLE cow_rls_ddl_tmp NOLOGIN")
        try:
            conn.execute("GRANT SELECT, INSERT, UPDATE ON docs TO cow_rls_ddl_tmp")
            conn.execute("ALTER POLICY by_tenant ON docs USING (tenant = current_setting('app.tenant', true))"
                         " WITH CHECK (body IS NOT NULL)")  # fmt: skip
            conn.execute("SELECT cow.use_session('rls-ddl')")
            conn.execute("SET ROLE cow_rls_ddl_tmp")
            conn.execute("SET app.tenant = 't1'")
            conn.execute(
                "INSERT INTO docs VALUES (100001, 't1', 'x'), (100002, 't2', 'y')"
            )  # WITH CHECK allows t2
            assert conn.execute("SELECT count(*) FROM docs WHERE id > 100000").fetchone() == (1,)
            conn.execute("SET app.tenant = 't2'")
            assert conn.execute("SELECT id FROM docs WHERE id > 100000").fetchall() == [(100002,)]
            conn.execute("RESET ROLE")
            conn.execute("SELECT cow.use_session(NULL)")
            conn.execute("DROP POLICY by_tenant ON docs")  # no policy: nothing is visible to the role
            conn.execute("SELECT cow.use_session('rls-ddl')")
            conn.execute("SET ROLE cow_rls_ddl_tmp")
            assert conn.execute("SELECT count(*) FROM docs").fetchone() == (0,)
        finally:
            conn.execute("RESET ROLE")
            conn.execute("SELECT cow.use_session(NULL)")
            conn.execute("DROP OWNED BY cow_rls_ddl_tmp")
            conn.execute("DROP ROLE cow_rls_ddl_tmp")


def test_rls_view_plans_use_the_indexes(layer_db: str) -> None:
    """The RLS view keeps the generated shape's plans: a key read in a session probes both indexes."""
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute("ANALYZE docs")
        conn.execute("CREATE ROLE cow_rls_plan_tmp NOLOGIN")
        try:
            conn.execute("GRANT SELECT ON docs TO cow_rls_plan_tmp")
            conn.execute("SELECT cow.use_session('rls-plan')")
            conn.execute("UPDATE docs SET body = 'x' WHERE id < 50")
            conn.execute("SET app.tenant = 't1'")
            conn.execute("SET ROLE cow_rls_plan_tmp")
            conn.execute("SET plan_cache_mode = force_generic_plan")
            conn.execute("PREPARE p(int) AS SELECT * FROM docs WHERE id = $1")
            plan = conn.execute("EXPLAIN (FORMAT JSON) EXECUTE p(7)").fetchone()
            assert plan is not None
            kinds = {n["Node Type"] for n in nodes(plan[0][0]["Plan"])}
            assert "Seq Scan" not in kinds and "Subquery Scan" not in kinds, kinds
            assert conn.execute("EXECUTE p(7)").fetchall() == [(7, "t1", "x")]
            assert conn.execute("EXECUTE p(8)").fetchall() == []  # another tenant's
            conn.execute("DEALLOCATE p")
        finally:
            conn.execute("RESET ROLE")
            conn.execute("SELECT cow.use_session(NULL)")
            conn.execute("DROP OWNED BY cow_rls_plan_tmp")
            conn.execute("DROP ROLE cow_rls_plan_tmp")
