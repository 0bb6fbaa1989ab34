"""What a write in a session calls (branch i16lay3; docs/benchmarks.md, "The layer's first writes and deferred
checks"): a version whose foreign key has a NULL column carries no check, so its deferred constraint trigger
does not fire; the statement triggers look the binding up only when they have something to check; a backend
that was never bound (no temporary schema) does not look it up at all. Counted with the transaction's
function statistics (``track_functions = all``); the semantics side by side with the plain tables."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from migrations import install_layer
from tests.fix_layer import apply_old_functions, files_at
from tests.layer.test_deferrable import SCHEMA, TABLES, same_tx
from tests.layer.test_install import run
from tests.layer.test_semantics import Pair, session_pair

SECRET = "s3cret-binding-for-tests-0123456789"


@pytest.fixture
def pair(plain_db: str, layer_db: str) -> Iterator[Pair]:
    with session_pair(plain_db, layer_db, SCHEMA) as p:
        yield p


def counting(conn: psycopg.Connection[Any]) -> None:
    """Count function calls from now on (a superuser's setting: the tests' servers run as one)."""
    conn.execute("SET track_functions = 'all'")


def calls(conn: psycopg.Connection[Any], function: str) -> int:
    """Calls of ``function`` in the current transaction (a trigger function by its table's changes table:
    ``child_dfr`` is the changes table of ``child`` with ``_dfr``; ``_dfr`` counts every constraint
    trigger's function, ``_dfr<k>``)."""
    table, _, suffix = function.partition("_")
    if "." not in function:
        pattern = suffix + (r"\d+" if suffix == "dfr" else "") + "$"
        found = conn.execute(
            "SELECT array_agg(p.oid::regproc::text) FROM cow.registry g JOIN pg_proc p"
            " ON p.pronamespace = 'cow_changes'::regnamespace"
            " AND p.proname ~ ('^' || g.changes_table || '_' || %s)"
            " WHERE g.table_name = %s",
            (pattern, table),
        ).fetchone()
        assert found is not None and found[0], function
        functions = list(found[0])
    else:
        functions = [function]
    row = conn.execute(
        "SELECT sum(pg_stat_get_xact_function_calls(f::regproc)) FROM unnest(%s::text[]) AS f", (functions,)
    ).fetchone()
    assert row is not None
    return int(row[0] or 0)


def test_null_keys_fire_no_deferred_check(pair: Pair) -> None:
    conn = pair.cow
    counting(conn)
    conn.execute("BEGIN")
    for i in range(10, 15):
        conn.execute("INSERT INTO child VALUES (%s, NULL, 'no parent')", (i,))
    conn.execute("INSERT INTO node VALUES (10, NULL)")
    conn.execute("UPDATE child SET note = 'still none' WHERE id = 10")
    conn.execute("SET CONSTRAINTS ALL IMMEDIATE")
    assert (calls(conn, "child_dfr"), calls(conn, "node_dfr")) == (0, 0)
    # A key set later is checked (once for the update that set it).
    conn.execute("UPDATE child SET parent_id = 2 WHERE id = 11")
    conn.execute("INSERT INTO child VALUES (15, 1, 'a parent')")
    conn.execute("SET CONSTRAINTS ALL IMMEDIATE")
    assert calls(conn, "child_dfr") == 2
    conn.execute("ROLLBACK")


def test_null_keys_keep_the_checks_of_the_plain_tables(pair: Pair) -> None:
    # NULL, then a missing parent: the update's check fails at COMMIT as on the plain table.
    err = same_tx(
        pair, "INSERT INTO child VALUES (10, NULL, 'x')", "UPDATE child SET parent_id = 9 WHERE id = 10"
    )
    assert err[:3] == (2, "23503", "child_parent_id_fkey")
    # A missing parent, then NULL: nothing to check at COMMIT.
    assert (
        same_tx(
            pair, "INSERT INTO child VALUES (10, 9, 'x')", "UPDATE child SET parent_id = NULL WHERE id = 10"
        )
        == ()
    )
    # NULL then a parent that comes later in the transaction; a self-reference set after a NULL one.
    assert (
        same_tx(
            pair,
            "INSERT INTO child VALUES (11, NULL, 'y')",
            "UPDATE child SET parent_id = 7 WHERE id = 11",
            "INSERT INTO parent VALUES (7, 'seven')",
        )
        == ()
    )
    err = same_tx(pair, "INSERT INTO node VALUES (20, NULL)", "UPDATE node SET up = 21 WHERE id = 20")
    assert err[:2] == (2, "23503")
    assert same_tx(pair, "INSERT INTO node VALUES (20, NULL)", "UPDATE node SET up = 20 WHERE id = 20") == ()
    for table in TABLES:
        pair.same_table(table)


def test_statement_triggers_look_the_binding_up_only_to_check(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as admin:
        admin.execute("SELECT cow.set_bind_secret(%s)", (SECRET,))
        admin.execute(SCHEMA)
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute("SELECT cow.bind_session('s1', NULL, %s)", (SECRET,))
        counting(conn)
        conn.execute("BEGIN")
        conn.execute("INSERT INTO parent VALUES (10, 'p')")  # (the registry check's first write)
        before = calls(conn, "cow._bound")
        for i in range(10, 20):
            conn.execute("INSERT INTO child VALUES (%s, 10, 'c')", (i,))
        # One lookup a row (the INSTEAD OF trigger's); cow_fk_mark and cow_fk_check of a table whose foreign
        # keys are all deferred asked for two more a statement.
        assert calls(conn, "cow._bound") - before == 10
        assert (calls(conn, "child_mark"), calls(conn, "child_fkcheck")) == (10, 10)
        conn.execute("COMMIT")
        assert conn.execute("SELECT count(*) FROM child WHERE parent_id = 10").fetchone() == (10,)


def test_a_backend_never_bound_does_not_look_the_binding_up(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as admin:
        admin.execute(SCHEMA)
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session('s1')")
        counting(conn)
        conn.execute("BEGIN")
        conn.execute("INSERT INTO parent VALUES (10, 'p')")
        conn.execute("INSERT INTO child VALUES (10, 10, 'c')")
        conn.execute("DELETE FROM child WHERE id = 1")
        row = conn.execute("SELECT pg_my_temp_schema() = 0, cow.current_session()").fetchone()
        assert row == (True, "s1")
        assert calls(conn, "cow._bound") == 0
        conn.execute("COMMIT")
        # A temporary table of its own: then the binding is looked up, and found absent.
        conn.execute("CREATE TEMPORARY TABLE scratch (x int)")
        conn.execute("BEGIN")
        conn.execute("INSERT INTO child VALUES (11, 10, 'd')")
        assert calls(conn, "cow._bound") >= 1
        assert conn.execute("SELECT cow.current_session(), cow.bound_session()").fetchone() == ("s1", None)
        conn.execute("COMMIT")
        assert conn.execute("SELECT count(*) FROM child WHERE parent_id = 10").fetchone() == (2,)


# main at layer 57, before this change (its generators and binding are layer 56's): its repeatable files are
# the exact text such installs ran.
LAYER_57_COMMIT = "76cc8ab"


def fk_bits(conn: psycopg.Connection[Any], table: str) -> list[tuple[int, int]]:
    """(id, _cow_fk) of the session's current versions of ``table``, by id."""
    found = conn.execute("SELECT changes_table FROM cow.registry WHERE table_name = %s", (table,)).fetchone()
    assert found is not None
    query = sql.SQL(
        "SELECT id, _cow_fk FROM cow_changes.{} WHERE _cow_session = 's1' AND _cow_current ORDER BY id"
    ).format(sql.Identifier(str(found[0])))
    rows = conn.execute(query).fetchall()
    return [(int(r[0]), int(r[1])) for r in rows]


def test_the_upgrade_from_57_regenerates_the_triggers_and_keeps_sessions(layer_db: str) -> None:
    old_files = [sql for _, sql in files_at(LAYER_57_COMMIT, "migrations/sql/functions")]
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(SCHEMA)
        # Layer 57: its function files applied (as install did, in one transaction), every table's objects
        # made by them.
        apply_old_functions(conn, old_files, "layer 57")
        conn.execute("SELECT * FROM cow.refresh(true)")
        conn.execute("SELECT cow.use_session('s1')")
        conn.execute("INSERT INTO child VALUES (10, NULL, 'layer 57'), (11, 2, 'layer 57')")
        assert fk_bits(conn, "child") == [(10, 1), (11, 1)]  # (layer 57: a bit for the NULL key too)
    result = run(layer_db, install_layer)
    assert result.applied == ()
    assert {"11_binding.sql", "30_generators.sql"} <= set(result.reapplied)
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session('s1')")
        counting(conn)
        conn.execute("BEGIN")
        conn.execute("INSERT INTO child VALUES (12, NULL, 'this layer')")
        # Layer 57's version of row 10 still carries its bit into the update that keeps its NULL key; its
        # check finds nothing to check.
        conn.execute("UPDATE child SET note = 'updated' WHERE id IN (10, 11)")
        assert fk_bits(conn, "child") == [(10, 1), (11, 1), (12, 0)]
        conn.execute("SET CONSTRAINTS ALL IMMEDIATE")
        assert (calls(conn, "child_dfr"), calls(conn, "child_mark"), calls(conn, "cow._bound")) == (2, 2, 0)
        conn.execute("COMMIT")
        rows = conn.execute("SELECT id, parent_id, note FROM child WHERE id >= 10 ORDER BY id").fetchall()
        assert rows == [(10, None, "updated"), (11, 2, "updated"), (12, None, "this layer")]
        with pytest.raises(psycopg.errors.ForeignKeyViolation), conn.transaction():
            conn.execute("UPDATE child SET parent_id = 9 WHERE id = 12")


def checks_run(conn: psycopg.Connection[Any], *stmts: str) -> list[str]:
    """The query texts of the statements ``stmts`` and the layer's functions run for them (auto_explain,
    nested statements too); a foreign key violation of the last one ends the list with " (23503)"."""
    plans: list[str] = []
    conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    conn.execute(
        "SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = on;"
        " SET auto_explain.log_level = notice; SET client_min_messages = notice"
    )
    try:
        for sql_text in stmts:
            conn.execute(sql_text)
    except psycopg.errors.ForeignKeyViolation:
        plans.append("Query Text: (23503)")
    return [p.split("Query Text:", 1)[1] for p in plans if "Query Text:" in p]


def test_deferred_checks_run_the_steps_a_version_needs(pair: Pair) -> None:
    """The check of a deferred foreign key for one version (branch i16lay4): the parent's side of a
    self-referencing key (one constraint trigger checks both sides) queries nothing for a version that is
    no tombstone, and the child's side probes the parent with the version's own key, not in one query joined
    to the version's row. The errors stay PostgreSQL's (also tests/layer/test_deferrable.py)."""
    conn = pair.cow
    conn.execute("BEGIN")
    texts = checks_run(
        conn,
        "INSERT INTO node VALUES (10, 1), (11, 10)",
        "UPDATE node SET up = 11 WHERE id = 2",
        "SET CONSTRAINTS ALL IMMEDIATE",
    )
    nested = [t for t in texts if "cow_changes." in t]
    assert [t for t in nested if "z.id = NEW.up" in t], texts  # the parent probed by the version's key
    assert not [t for t in nested if "still referenced" in t or ".up = NEW.id" in t or ".up = c.id" in t], (
        nested
    )
    # A tombstone of a referenced key: the parent's side runs and fails at SET CONSTRAINTS.
    texts = checks_run(
        conn,
        "SET CONSTRAINTS ALL DEFERRED",
        "DELETE FROM node WHERE id = 10",
        "SET CONSTRAINTS ALL IMMEDIATE",
    )
    assert texts[-1] == " (23503)"
    assert [t for t in texts if ".up = NEW.id" in t], texts
    conn.execute("ROLLBACK")
    err = same_tx(pair, "DELETE FROM node WHERE id = 1")
    assert err[:3] == (1, "23503", "node_up_fkey")


# Layer 59's function files (main before branch i16lay4): each deferred check one query joining the version.
LAYER_59_COMMIT = "25432fe"


def test_the_upgrade_from_59_regenerates_the_deferred_checks_and_keeps_sessions(layer_db: str) -> None:
    old_files = [sql for _, sql in files_at(LAYER_59_COMMIT, "migrations/sql/functions")]
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(SCHEMA)
        apply_old_functions(conn, old_files, "layer 59")
        conn.execute("SELECT * FROM cow.refresh(true)")
        conn.execute("SELECT cow.use_session('s1')")
        conn.execute("INSERT INTO child VALUES (10, 1, 'layer 59')")
        conn.execute("INSERT INTO node VALUES (10, 1)")
        conn.execute("BEGIN")
        texts = checks_run(conn, "INSERT INTO node VALUES (11, 10)", "SET CONSTRAINTS ALL IMMEDIATE")
        assert [t for t in texts if "still referenced" in t], texts  # (layer 59: the parent's side too)
        conn.execute("ROLLBACK")
    result = run(layer_db, install_layer)
    assert result.applied == ()
    assert {"10_core.sql", "30_generators.sql"} <= set(result.reapplied)
    with psycopg.connect(layer_db, autocommit=True) as conn:
        # Every table's functions regenerated: this layer's assignments (branch i16lay6).
        found = conn.execute(
            "SELECT string_agg(prosrc, ' ') FROM pg_proc WHERE pronamespace = 'cow_changes'::regnamespace"
        ).fetchone()
        assert found is not None
        bodies = str(found[0])
        assert "_g := cow._write_session()" in bodies and "set_config(" in bodies
        assert "PERFORM cow._write_session" not in bodies and "PERFORM set_config" not in bodies
        assert "PERFORM pg_catalog.set_config" not in bodies
        conn.execute("SELECT cow.use_session('s1')")
        conn.execute("BEGIN")
        texts = checks_run(conn, "INSERT INTO node VALUES (11, 10)", "SET CONSTRAINTS ALL IMMEDIATE")
        assert not [t for t in texts if "still referenced" in t], texts
        assert [t for t in texts if "z.id = NEW.up" in t], texts
        conn.execute("COMMIT")
        rows = conn.execute("SELECT id, up FROM node WHERE id >= 10 ORDER BY id").fetchall()
        assert rows == [(10, 1), (11, 10)]
        assert conn.execute("SELECT note FROM child WHERE id = 10").fetchone() == ("layer 59",)
        with pytest.raises(psycopg.errors.ForeignKeyViolation), conn.transaction():
            conn.execute("UPDATE child SET parent_id = 9 WHERE id = 10")


def test_a_write_runs_no_statement_for_its_settings(pair: Pair) -> None:
    """The nested statements of writes in a session (branch i16lay6): the registry check's call, the
    statement triggers' marks and the deferred checks' flags and session switch are assignments (simple
    expressions, no executor run; a ``PERFORM`` is one, a statement of its own). Fails on main."""
    conn = pair.cow
    conn.execute("BEGIN")
    texts = checks_run(
        conn,
        "INSERT INTO child VALUES (10, 1, 'new')",
        "UPDATE child SET parent_id = 2 WHERE id = 10",
        "DELETE FROM child WHERE id = 10",
        "INSERT INTO node VALUES (10, 1)",
        "SET CONSTRAINTS ALL IMMEDIATE",
        "INSERT INTO node VALUES (11, 10)",
    )
    assert [t for t in texts if "node" in t and "cow_changes." in t], texts  # (the nested ones are seen)
    assert not [t for t in texts if "set_config" in t or "_write_session" in t], texts
    conn.execute("ROLLBACK")


def test_deferred_checks_switch_to_the_writers_session(pair: Pair) -> None:
    """At COMMIT the deferred checks read the session that wrote each version, whatever cow.session_id says
    then, and put it back (the switch is an assignment since branch i16lay6)."""
    conn = pair.cow
    # A missing parent: refused; the rollback takes the leave back too.
    conn.execute("BEGIN")
    conn.execute("INSERT INTO child VALUES (10, 9, 'x')")
    conn.execute("SELECT cow.use_session(NULL)")
    with pytest.raises(psycopg.errors.ForeignKeyViolation) as exc:
        conn.execute("COMMIT")
    assert exc.value.diag.constraint_name == "child_parent_id_fkey"
    assert conn.execute("SELECT cow.current_session()").fetchone() == ("s1",)
    # A parent the writer's session sees: committed, the connection out of the session as it asked.
    conn.execute("BEGIN")
    conn.execute("INSERT INTO child VALUES (10, 1, 'x')")
    conn.execute("SELECT cow.use_session(NULL)")
    conn.execute("COMMIT")
    assert conn.execute("SELECT cow.current_session()").fetchone() == (None,)
    conn.execute("SELECT cow.use_session('s1')")
    assert conn.execute("SELECT parent_id FROM child WHERE id = 10").fetchone() == (1,)
