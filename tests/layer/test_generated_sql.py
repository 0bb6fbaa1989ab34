"""Golden snapshots of the SQL the layer's generators write for a sample schema.

What ``cow.enable_schema`` generates per table (the overlay views, the INSTEAD OF and statement trigger
functions, the constraint triggers on the changes tables, and the triggers that call them) is compared, as
PostgreSQL prints it back (``pg_get_viewdef``, ``pg_get_functiondef``, ``pg_get_triggerdef``), with
``tests/layer/generated/pg<major>.sql``. A change to a generator in ``migrations/sql/functions/`` shows as a
diff of that file: review it, then regenerate it with ``COW_REGEN_FIXTURES=1`` (the same switch as the
rewrite fixtures) on each server major version (the default embedded 18, and
``COW_TEST_DSN=postgresql://postgres@127.0.0.1:5432/postgres`` for 15).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from tests.fix_db import install_layer_at

GOLDEN = Path(__file__).parent / "generated"

# Every shape a generator branches on: a primary key, UNIQUE (NULLS NOT DISTINCT, partial, deferrable), an
# exclusion constraint (deferrable too), CHECK, NOT NULL, defaults, identity and generated columns, foreign
# keys with each action (deferrable too, self-referencing too), and a keyless table with a foreign key.
SCHEMA = """
CREATE TABLE parent (
    id int PRIMARY KEY,
    code text NOT NULL UNIQUE NULLS NOT DISTINCT,
    name text DEFAULT 'x' CHECK (name <> ''),
    span int4range,
    EXCLUDE USING gist (span WITH &&) DEFERRABLE INITIALLY DEFERRED
);
CREATE TABLE child (
    id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    parent_id int REFERENCES parent (id) ON DELETE CASCADE ON UPDATE CASCADE,
    parent_code text REFERENCES parent (code) ON DELETE SET NULL,
    kept_id int REFERENCES parent (id) ON DELETE RESTRICT,
    later_id int REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED,
    up int REFERENCES child (id),
    fallback_id int DEFAULT 1 REFERENCES parent (id) ON DELETE SET DEFAULT ON UPDATE SET NULL,
    qty int NOT NULL DEFAULT 1 CHECK (qty > 0),
    twice int GENERATED ALWAYS AS (qty * 2) STORED,
    slot text,
    during int4range,
    UNIQUE (slot) DEFERRABLE,
    EXCLUDE USING gist (during WITH &&)
);
CREATE UNIQUE INDEX child_slot_big ON child (qty) WHERE qty > 100;
CREATE TABLE events (
    kind text NOT NULL,
    parent_id int REFERENCES parent (id) ON DELETE CASCADE,
    note text
);
"""

# The generated objects: functions, views and triggers of the changes and overlay schemas.
GENERATED = """
WITH ns AS (
    SELECT oid, nspname FROM pg_namespace
    WHERE nspname = 'cow_changes' OR nspname IN (SELECT overlay_schema FROM cow.schemas)
)
SELECT 'function ' || p.oid::regprocedure::text, pg_get_functiondef(p.oid)
FROM pg_proc p JOIN ns ON ns.oid = p.pronamespace
UNION ALL
SELECT 'view ' || c.oid::regclass::text, pg_get_viewdef(c.oid)
FROM pg_class c JOIN ns ON ns.oid = c.relnamespace WHERE c.relkind = 'v'
UNION ALL
SELECT 'trigger ' || t.tgrelid::regclass::text || ' ' || t.tgname, pg_get_triggerdef(t.oid)
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN ns ON ns.oid = c.relnamespace
WHERE NOT t.tgisinternal
ORDER BY 1
"""


def generated_sql(dsn: str) -> tuple[int, str]:
    """(server major version, the generated objects as one text)."""
    with psycopg.connect(dsn) as conn:
        major = int(str(conn.execute("SHOW server_version_num").fetchone()[0])) // 10000  # type: ignore[index]
        rows = conn.execute(GENERATED).fetchall()
    text = "".join(f"-- {name}\n{definition.strip()}\n\n" for name, definition in rows)
    return major, re.sub(r"[ \t]+$", "", text, flags=re.M)


def test_the_generated_sql_is_the_golden_snapshot(create_database: Callable[..., str]) -> None:
    dsn = create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    install_layer_at(dsn)
    major, text = generated_sql(dsn)
    golden = GOLDEN / f"pg{major}.sql"
    if os.environ.get("COW_REGEN_FIXTURES") == "1":
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(text)
    if not golden.exists():
        pytest.skip(f"no snapshot for PostgreSQL {major} (COW_REGEN_FIXTURES=1 writes {golden.name})")
    assert text == golden.read_text(), f"the generated SQL differs from {golden} (see the module docstring)"
