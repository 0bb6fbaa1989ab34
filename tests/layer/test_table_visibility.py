"""``cow.pg_table_is_visible`` (the proxy's stand-in for ``pg_table_is_visible`` on a tagged connection)
answers in a session for every relation as ``pg_table_is_visible`` does outside it, under the application's
path: base tables visible, their overlay views not, and the catalogs, temporary tables and relations of a
schema without the layer (shadowed by an app table or not) as without a session."""

from __future__ import annotations

import psycopg

SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, name text);
CREATE VIEW item_names AS SELECT name FROM items;
CREATE SCHEMA other;
CREATE TABLE other.items (id int);  -- shadowed by public.items
CREATE TABLE other.own (id int);
CREATE SEQUENCE other.counter;
"""

ALL_RELATIONS = (
    "SELECT n.nspname || '.' || c.relname, {fn}(c.oid)"
    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace ORDER BY c.oid"
)


def test_visibility_in_a_session_is_visibility_outside_it(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute("SELECT cow.refresh()")
        conn.execute("SET search_path = public, other")
        conn.execute("CREATE TEMP TABLE scratch (id int)")
        outside = conn.execute(ALL_RELATIONS.format(fn="pg_catalog.pg_table_is_visible")).fetchall()
        conn.execute("SELECT cow.use_session('s1')")
        assert conn.execute("SHOW search_path").fetchone() == ("cow_overlay_public, public, other",)
        inside = conn.execute(ALL_RELATIONS.format(fn="cow.pg_table_is_visible")).fetchall()
    assert inside == outside
    visible = {name for name, seen in outside if seen}
    assert {
        "public.items",
        "public.item_names",
        "other.own",
        "other.counter",
        "pg_catalog.pg_class",
    } <= visible
    assert "scratch" in {name.split(".")[1] for name in visible}
    assert "other.items" not in visible
    assert "cow_overlay_public.items" not in visible


# Every kind of relation, names that two schemas of a path have, a schema named after the user ("$user").
KINDS = """
CREATE SCHEMA other;
CREATE SCHEMA postgres;
CREATE TABLE public.things (id int PRIMARY KEY, name text);
CREATE TABLE other.things (id int);
CREATE TABLE postgres.things (id int);
CREATE TABLE postgres.mine (id int);
CREATE VIEW other.item_view AS SELECT 1 AS one;
CREATE MATERIALIZED VIEW other.item_mat AS SELECT 1 AS one;
CREATE SEQUENCE other.counter;
CREATE TABLE public.parts (id int) PARTITION BY RANGE (id);
CREATE TABLE public.parts_1 PARTITION OF public.parts FOR VALUES FROM (0) TO (10);
CREATE TYPE other.pair AS (a int, b int);
CREATE FOREIGN DATA WRAPPER i16vis_fdw;
CREATE SERVER i16vis_server FOREIGN DATA WRAPPER i16vis_fdw;
CREATE FOREIGN TABLE other.remote (id int) SERVER i16vis_server;
CREATE TABLE other.pg_class (id int);  -- shadowed by the catalog unless pg_catalog comes later in the path
CREATE TABLE other.tables (id int);  -- information_schema.tables' name
CREATE SCHEMA "Odd Schema";
CREATE TABLE "Odd Schema".things (id int);
"""
PATHS = (
    "public",
    "other, public",
    "public, other",
    '"$user", public',
    '"$user", other, public',
    "other, pg_catalog, public",
    "pg_temp, public, other",
    "information_schema, other",
    "no_such_schema, public",
    "cow_overlay_public, public",
    "cow, public",
    '"Odd Schema", public',
    "",
)
VISIBLE_BY_RULE = "SELECT oid FROM pg_catalog.pg_class WHERE pg_catalog.pg_table_is_visible(oid)"


def _set(conn: psycopg.Connection[tuple[object, ...]], sql: str, *params: object) -> set[int]:
    return {row[0] for row in conn.execute(sql, params).fetchall()}


def test_visible_set_is_pg_table_is_visible(layer_db: str) -> None:
    """``cow._visible_relations(path)`` (the set behind ``x IN (SELECT cow.visible_relations())``) holds
    exactly the relations ``pg_table_is_visible`` shows under that path, for every path of ``PATHS``, and
    leaves the caller's path as it was."""
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(KINDS)
        conn.execute("SELECT cow.refresh()")
        conn.execute("CREATE TEMP TABLE things (id int)")  # the temp schema first: shadows public.things
        conn.execute("CREATE TEMP TABLE scratch (id int)")
        kinds = {row[0] for row in conn.execute("SELECT DISTINCT relkind::text FROM pg_class").fetchall()}
        assert {"r", "v", "m", "S", "p", "i", "c", "f", "t"} <= kinds
        for path in PATHS:
            conn.execute("SELECT set_config('search_path', %s, false)", (path,))
            expected = _set(conn, VISIBLE_BY_RULE)
            got = _set(conn, "SELECT cow._visible_relations(%s)", path)
            assert got == expected, path
            assert conn.execute("SELECT current_setting('search_path')").fetchone() == (path,)
        conn.execute("SET search_path = public, other")
        names = dict(conn.execute("SELECT oid::regclass::text, oid FROM pg_class").fetchall())
        visible = _set(conn, "SELECT cow._visible_relations('\"$user\", public, other')")
        assert names["postgres.mine"] in visible  # "$user"
        assert names["postgres.things"] not in visible  # the temporary "things" comes first
        assert names["things"] in visible and names["public.things"] not in visible  # (names["things"]: temp)
        assert names["pg_class"] in visible and names["other.pg_class"] not in visible


def test_visible_set_in_a_session_is_the_application_path(layer_db: str) -> None:
    """In a session ``cow.visible_relations()`` answers under the application's path (base tables, not their
    overlay views), as ``pg_table_is_visible`` outside it, and the session keeps its physical path."""
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute("SELECT cow.refresh()")
        conn.execute("SET search_path = other, public")
        conn.execute("CREATE TEMP TABLE scratch (id int)")
        outside = _set(conn, VISIBLE_BY_RULE)
        conn.execute("SELECT cow.use_session('s1')")
        physical = conn.execute("SHOW search_path").fetchone()
        assert physical == ("other, cow_overlay_public, public",)
        assert _set(conn, "SELECT cow.visible_relations()") == outside
        assert conn.execute("SHOW search_path").fetchone() == physical
        with conn.transaction():
            assert _set(conn, "SELECT cow.visible_relations()") == outside
            assert conn.execute("SHOW search_path").fetchone() == physical
        overlay = _set(conn, "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                             "WHERE n.nspname = 'cow_overlay_public'")  # fmt: skip
        assert overlay and not overlay & outside
