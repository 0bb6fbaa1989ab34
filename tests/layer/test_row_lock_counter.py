"""The generated UPDATE and DELETE triggers wait for other transactions' row locks in a session only once row
locks were taken in the database (branch i16wp; docs/layer.md, "Row locks in a session"): ``cow._lock_one``
moves the counter ``cow.row_locks`` (migration 59) before its first lock, and until it has moved no such lock
can be held, so the wait, its key's hash and its lock-table round trip are skipped. The locks are held here
the way the layer holds them (``cow.lock_row``, what the proxy's rewrite of ``FOR UPDATE`` calls, or the
transaction-level advisory lock of a row's key that it takes), and a write that would wait fails on
``lock_timeout`` instead of hanging the test."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from migrations import install_layer
from tests.fix_layer import apply_old_functions, files_at
from tests.layer.test_install import run

# main at layer 58 (before migration 59): its function files are the text such installs ran.
LAYER_58_COMMIT = "d36dd5a"

# Key B of the row customers(id = 2) in session s1, which an UPDATE that keeps the key waits for (seed 2).
HOLD_KEY_B = (
    "SELECT pg_catalog.pg_advisory_xact_lock(k[1], k[2]) FROM (SELECT cow._row_lock_key('s1', changes_table,"
    " '[2]', 2) AS k FROM cow.registry WHERE table_name = 'customers') x"
)


def counter(conn: psycopg.Connection[Any]) -> int | None:
    row = conn.execute("SELECT pg_catalog.pg_sequence_last_value('cow.row_locks')").fetchone()
    assert row is not None
    return None if row[0] is None else int(row[0])


def writer(dsn: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("SELECT cow.use_session('s1')")
    conn.execute("SET lock_timeout = '300ms'")  # a wait fails the write, it does not hang the test
    return conn


def test_a_write_waits_for_row_locks_only_once_some_were_taken(layer_db: str) -> None:
    with psycopg.connect(layer_db) as holder, writer(layer_db) as me:
        assert counter(me) is None  # a fresh install: no row lock taken yet
        # A lock on the row's key held by a transaction that is not the layer's cow._lock_one: it moved no
        # counter, so the write does not look for it.
        holder.execute(HOLD_KEY_B)
        me.execute("UPDATE customers SET score = 3 WHERE id = 2")
        me.execute("DELETE FROM customers WHERE id = 3")
        # Once the counter moved, the same lock holds the next write back, as PostgreSQL's row lock would.
        me.execute("SELECT pg_catalog.nextval('cow.row_locks')")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            me.execute("UPDATE customers SET score = 4 WHERE id = 2")
        holder.commit()
        me.execute("UPDATE customers SET score = 4 WHERE id = 2")
        assert me.execute("SELECT score FROM customers WHERE id IN (2, 3)").fetchall() == [(4,)]


def test_a_row_lock_of_the_session_moves_the_counter_and_holds_its_writers(layer_db: str) -> None:
    with psycopg.connect(layer_db) as holder, writer(layer_db) as me:
        holder.execute("SELECT cow.use_session('s1')")
        # FOR NO KEY UPDATE (strength 3, wait) of the row, as the proxy's rewrite locks it.
        locked = holder.execute(
            "SELECT (cow.lock_row(c, (SELECT changes_table FROM cow.registry WHERE table_name = 'customers'),"
            " 3, 0, '[2]'::jsonb)).id FROM customers c WHERE c.id = 2"
        ).fetchall()
        assert locked == [(2,)]
        assert counter(me) is not None
        with pytest.raises(psycopg.errors.LockNotAvailable):
            me.execute("UPDATE customers SET score = 5 WHERE id = 2")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            me.execute("DELETE FROM customers WHERE id = 2")
        me.execute("UPDATE customers SET score = 5 WHERE id = 1")  # another row: no wait
        holder.commit()
        me.execute("UPDATE customers SET score = 5 WHERE id = 2")


def test_the_upgrade_from_58_moves_the_counter_for_a_lock_held_then(layer_db: str) -> None:
    old_files = [text for _, text in files_at(LAYER_58_COMMIT, "migrations/sql/functions")]
    with psycopg.connect(layer_db, autocommit=True) as conn:
        # Layer 58: its function files, every table's triggers made by them, no migration 59.
        apply_old_functions(conn, old_files, "layer 58")
        conn.execute("DROP SEQUENCE cow.row_locks")
        conn.execute("DELETE FROM cow.migrations WHERE version = 59")
        conn.execute("SELECT * FROM cow.refresh(true)")
    with psycopg.connect(layer_db) as holder, writer(layer_db) as me:
        # A row lock that layer 58's cow._lock_one took (it moved no counter), held across the upgrade.
        holder.execute(HOLD_KEY_B)
        result = run(layer_db, install_layer)
        assert result.applied == (59,)
        assert "90_row_locks.sql" in result.reapplied
        assert counter(me) is not None
        with pytest.raises(psycopg.errors.LockNotAvailable):
            me.execute("UPDATE customers SET score = 6 WHERE id = 2")
        holder.commit()
        me.execute("UPDATE customers SET score = 6 WHERE id = 2")
        assert me.execute("SELECT score FROM customers WHERE id = 2").fetchall() == [(6,)]


def test_a_row_lock_in_a_read_only_transaction_is_taken_without_moving_the_counter(layer_db: str) -> None:
    # nextval is refused in a read-only transaction (and on a standby): the lock is taken as before it.
    with psycopg.connect(layer_db) as holder:
        holder.execute("SELECT cow.use_session('s1')")
        holder.execute("SET TRANSACTION READ ONLY")
        locked = holder.execute(
            "SELECT (cow.lock_row(c, (SELECT changes_table FROM cow.registry WHERE table_name = 'customers'),"
            " 4, 0, '[2]'::jsonb)).id FROM customers c WHERE c.id = 2"
        ).fetchall()
        assert locked == [(2,)]
        assert counter(holder) is None
