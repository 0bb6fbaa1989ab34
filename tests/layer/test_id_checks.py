"""The layer's id rule without a bounded repetition (migrations 51 and 54): ``cow.valid_id`` and the CHECKs of
cow.sessions, cow.bindings, cow.proxy_routes and cow.reads (its tables cow.read_rows and cow.read_runs from
layer 57) accept exactly the ids the pattern
``'^[A-Za-z0-9._:-]{1,128}$'`` accepted (1 to 128 characters of ``[A-Za-z0-9._:-]``), as PostgreSQL itself
matches that pattern, and as the proxy's own check does."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from cowproxy.ids import valid_id

OLD_RULE = "^[A-Za-z0-9._:-]{1,128}$"
ALL_IDS = [
    "s",
    "S1.op:2-x_y",
    "a" * 127,
    "a" * 128,
    "a" * 129,
    "",
    "-",
    "has space",
    "semi;colon",
    "new\nline",
    "trail\n",
    "tab\t",
    "é",
    "quote'",
    "ab/cd",
    "x" * 127 + "!",
    "x" * 200,
    "upper.lower_UNDER:9",
]
READS = (
    "INSERT INTO cow.reads (session, operation, at, fingerprint, statement, identity, duration_us)"
    " VALUES ({}, now(), 'f', 's', 'i', 1)"
)

INSERTS = {
    "sessions": "INSERT INTO cow.sessions (session_id) VALUES (%s)",
    "bindings": "INSERT INTO cow.bindings (pid, backend_start, token, session) VALUES (-1, now(), 't', %s)",
    "proxy_routes": "INSERT INTO cow.proxy_routes (database, session) VALUES ('db', %s)",
    "reads.session": READS.format("%s, NULL"),
    "reads.operation": READS.format("'ok', %s"),
}


def _accepted(conn: psycopg.Connection[Any], insert: str, value: str) -> bool:
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(insert, (value,))
    except psycopg.errors.CheckViolation:
        return False
    return True


@pytest.mark.parametrize("value", ALL_IDS, ids=range(len(ALL_IDS)))
def test_valid_id_and_the_checks_accept_what_the_bounded_pattern_accepted(layer_db: str, value: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        row = conn.execute("SELECT cow.valid_id(%s), %s ~ %s", (value, value, OLD_RULE)).fetchone()
        assert row is not None
        assert row[0] is row[1] is valid_id(value), (value, row)
        for table, insert in INSERTS.items():
            assert _accepted(conn, insert, value) is row[1], (table, value)
        assert conn.execute("SELECT cow.valid_id(NULL)").fetchone() == (None,)
        assert _accepted(conn, INSERTS["reads.operation"], None)  # (a read of no operation: NULL passes)


def test_no_bounded_repetition_in_the_id_rule(layer_db: str) -> None:
    with psycopg.connect(layer_db) as conn:
        checks = conn.execute(
            "SELECT conrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE connamespace = 'cow'::regnamespace AND contype = 'c'"
            "   AND pg_get_constraintdef(oid) LIKE '%A-Za-z0-9%'"
        ).fetchall()
        functions = conn.execute(
            "SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'cow'::regnamespace"
            " AND p.prosrc LIKE '%{1,128}%'"
        ).fetchall()
    assert sorted(t for t, _ in checks) == [
        "cow.bindings",
        "cow.proxy_routes",
        "cow.read_rows",
        "cow.read_rows",
        "cow.read_runs",
        "cow.sessions",
    ], checks
    assert not [c for _, c in checks if "{1,128}" in c], checks
    assert functions == [], functions
