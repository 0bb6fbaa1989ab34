"""Layer 56: the generated trigger functions plan without sequential scans, and their probes by key can use
the key index alone (30_generators.sql, cow._plan_settings and cow._live; the plans themselves are checked in
tests/layer/test_write_path.py and tests/layer/test_deferrable.py). An upgrade from layer 55 with a session
holding changes regenerates every table's triggers and keeps the session."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from migrations import install_layer
from tests.fix_layer import apply_old_functions, files_at, reads_as_layer_56
from tests.layer.test_install import run

# main at layer 55, before this change: its repeatable files are the exact text such installs ran.
LAYER_55_COMMIT = "74d6deb"

SCHEMA = """
CREATE TABLE parent (id int PRIMARY KEY, name text);
CREATE TABLE child (id int PRIMARY KEY, parent_id int REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);
"""


def layer_55_functions() -> list[str]:
    return [sql for _, sql in files_at(LAYER_55_COMMIT, "migrations/sql/functions")]


def settings(conn: psycopg.Connection[Any]) -> set[tuple[str, str]]:
    """(function, its SET clauses) of the generated trigger functions of table child (<t>_ins, ...)."""
    rows = conn.execute(
        "SELECT substr(p.proname, length(g.changes_table) + 1),"
        " coalesce(array_to_string(p.proconfig, ' '), '')"
        " FROM pg_proc p JOIN cow.registry g ON p.proname LIKE g.changes_table || '\\_%'"
        " WHERE p.pronamespace = 'cow_changes'::regnamespace AND g.table_name = 'child'"
    ).fetchall()
    return {(str(r[0]), str(r[1])) for r in rows}


def test_the_upgrade_from_55_regenerates_the_triggers_and_keeps_sessions(layer_db: str) -> None:
    old_files = layer_55_functions()
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(SCHEMA)
        reads_as_layer_56(conn)  # (layer 57 made cow.reads a view: 55's read triggers need the table)
        # Layer 55: its function files applied (as install did, in one transaction), every table's objects
        # made by them, version 56 not applied.
        apply_old_functions(
            conn,
            old_files,
            "layer 55",
            "DROP FUNCTION cow._view_exists(text, text, text[], text, text, text[])",
            "DROP FUNCTION cow._sexists(oid, text, text[])",
            "DROP FUNCTION cow._live(text, boolean), cow._plan_settings()",
        )
        conn.execute("DELETE FROM cow.migrations WHERE version = 56")
        conn.execute("SELECT * FROM cow.refresh(true)")
        assert ("_ins", "") in settings(conn)
        conn.execute("SELECT cow.use_session('kept')")
        conn.execute("INSERT INTO parent VALUES (10, 'p')")
        conn.execute("INSERT INTO child VALUES (11, 10)")
    result = run(layer_db, install_layer)
    assert result.applied == (56, 57)
    assert "30_generators.sql" in result.reapplied
    with psycopg.connect(layer_db, autocommit=True) as conn:
        assert conn.execute(
            "SELECT to_regprocedure('cow._view_exists(text, text, text[], text, text)'),"
            " to_regprocedure('cow._sexists(oid, text)')"
        ).fetchone() == (None, None)
        got = settings(conn)
        assert {name for name, _ in got} >= {"_ins", "_upd", "_del", "_dfr1", "_fkcheck", "_fkdq"}
        # (_mark sets nothing; _fkdq runs only inside _fkcheck, with its settings in force.)
        plans = "enable_seqscan=off jit=off plan_cache_mode=force_generic_plan"
        assert all(config == plans for name, config in got if name not in ("_mark", "_fkdq")), got
        conn.execute("SELECT cow.use_session('kept')")
        assert conn.execute("SELECT parent_id FROM child WHERE id = 11").fetchone() == (10,)
        conn.execute("INSERT INTO child VALUES (12, 10)")
        with pytest.raises(psycopg.errors.ForeignKeyViolation), conn.transaction():
            conn.execute("DELETE FROM parent WHERE id = 10")
        assert conn.execute("SELECT count(*) FROM child WHERE parent_id = 10").fetchone() == (2,)
