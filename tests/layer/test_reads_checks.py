"""cow.reads checks its ids (migration 51) exactly as the layer's id rule, ``cow.valid_id``, does."""

from __future__ import annotations

import psycopg
import pytest

IDS = [
    "s",
    "S1.op:2-x_y",
    "a" * 128,
    "a" * 129,
    "",
    "has space",
    "semi;colon",
    "new\nline",
    "trail\n",
    "é",
    "quote'",
    "x" * 127 + "!",
]

INSERT = (
    "INSERT INTO cow.reads (session, operation, at, fingerprint, statement, identity, duration_us)"
    " VALUES (%s, %s, now(), 'f', 's', 'i', 1)"
)


def _accepted(conn: psycopg.Connection[tuple[object, ...]], session: str, operation: str | None) -> bool:
    try:
        with conn.transaction():
            conn.execute(INSERT, (session, operation))
    except psycopg.errors.CheckViolation:
        return False
    return True


@pytest.mark.parametrize("value", IDS, ids=range(len(IDS)))
def test_the_reads_checks_accept_what_valid_id_accepts(layer_db: str, value: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        row = conn.execute("SELECT cow.valid_id(%s)", (value,)).fetchone()
        assert row is not None
        valid = bool(row[0])
        assert _accepted(conn, value, None) is valid
        assert _accepted(conn, "ok", value) is valid
        assert _accepted(conn, "ok", None)  # (no operation id: NULL passes)


def test_no_bounded_repetition_in_the_reads_checks(layer_db: str) -> None:
    with psycopg.connect(layer_db) as conn:
        checks = [
            row[0]
            for row in conn.execute(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE conrelid = 'cow.reads'::regclass AND contype = 'c'"
            )
        ]
    assert len(checks) == 2, checks
    assert not [c for c in checks if "{1,128}" in c], checks
