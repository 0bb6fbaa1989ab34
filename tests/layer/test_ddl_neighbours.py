"""App DDL on one table regenerates only what changed, and leaves the same objects as regenerating everything.

`cow._refresh_tables` rebuilds the view and triggers of the tables a DDL statement names, and the triggers of
their FOREIGN KEY neighbours only when a neighbour's signature changed (docs/layer.md, "App DDL"). Each
statement below runs through the event trigger; then every generated object (functions, views, triggers,
indexes, policies, reloptions, privileges) is compared with what `cow.refresh(true)` (every table regenerated)
leaves: a neighbour skipped that needed new code shows as a difference.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import psycopg
import pytest

from tests.fix_db import install_layer_at
from tests.layer.test_generated_sql import SCHEMA

EXTRA = """
CREATE TABLE grandchild (
    id int PRIMARY KEY,
    child_id int REFERENCES child (id) ON DELETE CASCADE,
    label text UNIQUE
);
CREATE TABLE loner (id int PRIMARY KEY, v text);
"""

# Everything the layer generates, by name (no oids): what a regeneration could change.
OBJECTS = """
WITH ns AS (
    SELECT oid, nspname FROM pg_namespace
    WHERE nspname = 'cow_changes' OR nspname IN (SELECT overlay_schema FROM cow.schemas)
)
SELECT 'function ' || p.oid::regprocedure::text, pg_get_functiondef(p.oid)
FROM pg_proc p JOIN ns ON ns.oid = p.pronamespace
UNION ALL
SELECT 'relation ' || c.oid::regclass::text,
       concat_ws(' | ', c.relkind, c.reloptions::text, c.relacl::text, c.relrowsecurity::text,
                 CASE WHEN c.relkind = 'v' THEN pg_get_viewdef(c.oid) END,
                 CASE WHEN c.relkind = 'i' THEN pg_get_indexdef(c.oid) END,
                 (SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
                                    || coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), ''),
                                    ', ' ORDER BY a.attnum)
                  FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                  WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped))
FROM pg_class c JOIN ns ON ns.oid = c.relnamespace WHERE c.relkind IN ('r', 'v', 'i')
UNION ALL
SELECT 'trigger ' || t.tgrelid::regclass::text || ' ' || t.tgname,
       pg_get_triggerdef(t.oid) || ' ' || t.tgenabled::text
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN ns ON ns.oid = c.relnamespace
WHERE NOT t.tgisinternal
UNION ALL
SELECT 'policy ' || p.polrelid::regclass::text || ' ' || p.polname,
       concat_ws(' | ', p.polcmd, pg_get_expr(p.polqual, p.polrelid), pg_get_expr(p.polwithcheck, p.polrelid))
FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid JOIN ns ON ns.oid = c.relnamespace
UNION ALL
SELECT 'registry ' || g.table_name,
       concat_ws(' | ', g.changes_table, g.pk_columns::text, g.col_names::text, g.col_types::text,
                 g.signature)
FROM cow.registry g
ORDER BY 1
"""

# One statement each, on a fresh database: an added column (neighbours skipped), and changes that the
# neighbours' triggers must follow (a referenced column renamed, a FOREIGN KEY dropped or added, a referencing
# table renamed).
STATEMENTS = {
    "add column to a parent": "ALTER TABLE parent ADD COLUMN extra int",
    "add column to a middle table": "ALTER TABLE child ADD COLUMN extra text DEFAULT 'e'",
    "rename a referenced column": "ALTER TABLE parent RENAME COLUMN code TO code2",
    "drop a foreign key": "ALTER TABLE child DROP CONSTRAINT child_kept_id_fkey",
    "drop a referencing column": "ALTER TABLE grandchild DROP COLUMN child_id",
    "add a foreign key": "ALTER TABLE loner ADD COLUMN pid int REFERENCES parent (id) ON DELETE SET NULL",
    "rename a referencing table": "ALTER TABLE grandchild RENAME TO grandkid",
    # the names the text holds: folded from upper case, or quoted (every overlay view's name tested)
    "an upper-case name": "ALTER TABLE LONER ADD COLUMN loud int",
    "a quoted name": 'ALTER TABLE "child" ADD COLUMN quoted int',
}


def _objects(conn: psycopg.Connection) -> dict[str, str]:
    return {name: definition for name, definition in conn.execute(OBJECTS).fetchall()}


def _diff(a: dict[str, str], b: dict[str, str]) -> list[str]:
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


@pytest.mark.parametrize("statement", list(STATEMENTS), ids=list(STATEMENTS))
def test_app_ddl_leaves_what_a_full_regeneration_makes(
    create_database: Callable[..., str], statement: str
) -> None:
    dsn = create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA + EXTRA)
    install_layer_at(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        views = dict(conn.execute("SELECT relname, oid FROM pg_class WHERE relkind = 'v'").fetchall())
        conn.execute(STATEMENTS[statement])
        targeted = _objects(conn)
        kept = dict(conn.execute("SELECT relname, oid FROM pg_class WHERE relkind = 'v'").fetchall())
        conn.execute("SELECT count(*) FROM cow.refresh(true)")
        full = _objects(conn)
    assert _diff(targeted, full) == []
    # the view of the altered table was made anew; of the others only those the text names (`parent` in
    # REFERENCES parent) may be
    text = STATEMENTS[statement].lower()
    table = text.split()[2].strip('"')
    assert views[table] != kept.get(table)
    named = {n for n in views if re.search(rf"\b{n}\b", text)}
    assert {n for n, oid in views.items() if kept.get(n) != oid} <= named


def test_a_dropped_foreign_key_no_longer_acts_in_a_session(create_database: Callable[..., str]) -> None:
    """The parent's triggers lose the dropped constraint's RESTRICT: a delete the plain table allows."""
    dsn = create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA + EXTRA)
        conn.execute("INSERT INTO parent (id, code) VALUES (1, 'a'), (2, 'b')")
        conn.execute("INSERT INTO child (parent_id, kept_id, fallback_id) VALUES (1, 2, 1)")
    install_layer_at(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE child DROP CONSTRAINT child_kept_id_fkey")
        conn.execute("SELECT cow.use_session('s')")
        assert conn.execute("DELETE FROM parent WHERE id = 2").rowcount == 1
        assert conn.execute("SELECT kept_id FROM child").fetchall() == [(2,)]


# Functions in cow_changes that belong to no registered table's changes table (named t<id>_*).
ORPHANS = """
SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'cow_changes'
  AND NOT EXISTS (SELECT 1 FROM cow.registry g WHERE starts_with(p.proname, g.changes_table || '_'))
"""

# DROP TABLE: the dropped tables leave the registry, their FOREIGN KEY neighbours are brought in step, and no
# other table is touched (each drop rebuilt every table's triggers: seconds at a few hundred tables).
# (statement, the tables it drops, their neighbours)
DROPS = {
    "drop a table": ("DROP TABLE loner", {"loner"}, set()),
    "drop a referencing table": ("DROP TABLE grandchild", {"grandchild"}, {"child"}),
    "drop a referenced table and its foreign keys": (
        "DROP TABLE child CASCADE",
        {"child"},
        {"grandchild", "parent"},
    ),
    "drop two tables": ("DROP TABLE loner, grandchild", {"loner", "grandchild"}, {"child"}),
}

# The row versions of each overlay view's triggers: a rebuilt trigger (CREATE OR REPLACE) has a new one.
TRIGGERS = """
SELECT c.relname, array_agg(t.xmin::text ORDER BY t.oid)
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname IN (SELECT overlay_schema FROM cow.schemas) AND NOT t.tgisinternal GROUP BY c.relname
"""


@pytest.mark.parametrize("statement", list(DROPS), ids=list(DROPS))
def test_a_dropped_table_leaves_what_a_full_regeneration_makes(
    create_database: Callable[..., str], statement: str
) -> None:
    sql, dropped, neighbours = DROPS[statement]
    dsn = create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA + EXTRA)
    install_layer_at(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        triggers = dict(conn.execute(TRIGGERS).fetchall())
        conn.execute(sql)
        targeted = _objects(conn)
        orphans = conn.execute(ORPHANS).fetchall()
        kept = dict(conn.execute(TRIGGERS).fetchall())
        conn.execute("SELECT count(*) FROM cow.refresh(true)")
        full = _objects(conn)
    assert _diff(targeted, full) == []
    assert orphans == []
    assert {name.split()[1] for name in full if name.startswith("registry ")} & dropped == set()
    assert {name for name in triggers if kept.get(name) != triggers[name]} <= dropped | neighbours


def test_a_refresh_drops_functions_left_by_tables_dropped_before(create_database: Callable[..., str]) -> None:
    """Older layers left a dropped table's constraint-trigger functions (t<id>_fkcheck, _mark, _dfr)."""
    dsn = create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA + EXTRA)
    install_layer_at(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "SET cow.in_layer = on; CREATE FUNCTION cow_changes.t999_fkcheck() RETURNS trigger "
            "LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END'; RESET cow.in_layer"
        )
        assert conn.execute(ORPHANS).fetchall() == [("t999_fkcheck",)]
        before = _objects(conn)
        conn.execute("SELECT count(*) FROM cow.refresh()")
        assert conn.execute(ORPHANS).fetchall() == []
        assert _diff(before, _objects(conn)) == ["function cow_changes.t999_fkcheck()"]


# App objects that are not tables of the layer, for the statements below.
OTHER_OBJECTS = """
CREATE SCHEMA other;
CREATE TABLE other.plain (id int PRIMARY KEY, v text);
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE FUNCTION seven() RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT 7';
CREATE SEQUENCE tick;
CREATE TABLE moods (
    id int PRIMARY KEY, m mood, n posint, s int DEFAULT seven(), t bigint DEFAULT nextval('tick')
);
CREATE VIEW loner_v AS SELECT id, v FROM loner;
CREATE INDEX loner_v_idx ON loner (v);
"""

# DDL of objects other than the layer's tables: it changes the tables that depend on the object (a CASCADE
# drops a column, a default, an overlay view), the overlay twins of app views, or nothing; never every table
# (which took seconds at a few hundred tables, and ran out of PostgreSQL's lock table at about 600).
# (statement, the tables whose triggers it may rebuild)
OTHER_DDL = {
    "alter a table outside the layer": ("ALTER TABLE other.plain ADD COLUMN w int", set()),
    "drop a table outside the layer": ("DROP TABLE other.plain", set()),
    "drop a type a column uses": ("DROP TYPE mood CASCADE", {"moods"}),
    "add a value to an enum": ("ALTER TYPE mood ADD VALUE 'meh'", set()),
    "drop a domain a column uses": ("DROP DOMAIN posint CASCADE", {"moods"}),
    "drop a function a default uses": ("DROP FUNCTION seven() CASCADE", {"moods"}),
    "drop a sequence a default uses": ("DROP SEQUENCE tick CASCADE", {"moods"}),
    "drop an index": ("DROP INDEX loner_v_idx", {"loner"}),
    "create an app view": ("CREATE VIEW loner_w AS SELECT id FROM loner", set()),
    "replace an app view": ("CREATE OR REPLACE VIEW loner_v AS SELECT id, v, 1 AS one FROM loner", set()),
    "rename an app view": ("ALTER VIEW loner_v RENAME TO loner_view", set()),
    "drop an app view": ("DROP VIEW loner_v", set()),
    "drop an unused type": ("CREATE TYPE unused AS (a int); DROP TYPE unused", set()),
    "grant on a table": ("GRANT SELECT, UPDATE (v) ON loner TO PUBLIC", {"loner"}),
    "revoke on tables": ("REVOKE ALL ON TABLE loner, other.plain FROM PUBLIC", {"loner"}),
    "grant outside the layer": ("GRANT SELECT ON other.plain TO PUBLIC", set()),
    "grant on every table": (
        "GRANT SELECT ON ALL TABLES IN SCHEMA public TO PUBLIC",
        {"parent", "child", "events", "grandchild", "loner", "moods"},
    ),
}


@pytest.mark.parametrize("statement", list(OTHER_DDL), ids=list(OTHER_DDL))
def test_ddl_of_other_objects_touches_only_the_tables_that_depend_on_them(
    create_database: Callable[..., str], statement: str
) -> None:
    sql, touched = OTHER_DDL[statement]
    dsn = create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA + EXTRA + OTHER_OBJECTS)
    install_layer_at(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        triggers = dict(conn.execute(TRIGGERS).fetchall())
        conn.execute(sql)
        targeted = _objects(conn)
        kept = dict(conn.execute(TRIGGERS).fetchall())
        conn.execute("SELECT count(*) FROM cow.refresh(true)")
        full = _objects(conn)
    assert _diff(targeted, full) == []
    assert {name for name in triggers if kept.get(name) != triggers[name]} <= touched


@pytest.mark.parametrize(
    "sql", ["DROP TYPE mood", "DROP FUNCTION seven()", "DROP SEQUENCE tick", "DROP DOMAIN posint"]
)
def test_a_drop_that_the_plain_tables_refuse_is_refused_and_changes_nothing(
    create_database: Callable[..., str], sql: str
) -> None:
    dsn = create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA + EXTRA + OTHER_OBJECTS)
    install_layer_at(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        before = _objects(conn)
        with pytest.raises(psycopg.errors.DependentObjectsStillExist, match="depend"):
            conn.execute(sql)
        assert _diff(before, _objects(conn)) == []
