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
