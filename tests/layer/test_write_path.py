"""The in-session write path: the registry check (skipped while the connection's stamp matches, still
refusing closed sessions and bad operation ids, still refreshing last_write_at), the INSERT's primary-key
lookup that retires a tombstone only when there is one, and the base snapshot taken from the row the write
read. Real PostgreSQL, two or three connections where it matters."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import psycopg
import pytest
from psycopg import errors


def rows(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def tagged(dsn: str, session: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("SELECT cow.use_session(%s)", (session,))
    return conn


def test_write_to_a_session_closed_by_another_connection_is_refused(layer_db: str) -> None:
    # The writer has already passed the registry check in earlier transactions of its connection: each new
    # transaction must check again, so a commit or discard elsewhere stops its next write.
    for close in ("SELECT cow.commit_session('w1')", "SELECT cow.discard_session('w1')"):
        rows(layer_db, "DELETE FROM cow.sessions WHERE session_id = 'w1'")
        with tagged(layer_db, "w1") as writer:
            writer.execute("UPDATE customers SET score = 1 WHERE id = 1")
            writer.execute("UPDATE customers SET score = 2 WHERE id = 2")
            rows(layer_db, close)
            with pytest.raises(errors.ObjectNotInPrerequisiteState, match="it takes no more writes"):
                writer.execute("UPDATE customers SET score = 3 WHERE id = 3")
            with pytest.raises(errors.ObjectNotInPrerequisiteState):
                writer.execute("INSERT INTO customers (email, name) VALUES ('new@example.com', 'New')")
            with pytest.raises(errors.ObjectNotInPrerequisiteState):
                writer.execute("DELETE FROM customers WHERE id = 3")
        if "discard" in close:
            assert rows(layer_db, "SELECT count(*) FROM cow.session_changes('w1')") == [(0,)]


def test_a_status_changed_or_a_row_deleted_directly_is_seen_by_the_next_write(layer_db: str) -> None:
    with tagged(layer_db, "w6") as writer:
        writer.execute("UPDATE customers SET score = 1 WHERE id = 1")
        rows(layer_db, "UPDATE cow.sessions SET status = 'discarded' WHERE session_id = 'w6'")
        with pytest.raises(errors.ObjectNotInPrerequisiteState, match="w6 is discarded"):
            writer.execute("UPDATE customers SET score = 2 WHERE id = 2")
        rows(layer_db, "DELETE FROM cow.sessions WHERE session_id = 'w6'")
        writer.execute("UPDATE customers SET score = 2 WHERE id = 2")  # registered again
    got = rows(layer_db, "SELECT kind, status FROM cow.sessions WHERE session_id = 'w6'")
    assert got == [("other", "open")]


def blocked(dsn: str, pid: int) -> bool:
    """Whether backend pid waits for a lock (polled: the other thread's statement may not have started)."""
    for _ in range(200):
        waiting = rows(dsn, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,))
        if waiting == [(True,)]:
            return True
        time.sleep(0.05)
    return False


def in_thread(conn: psycopg.Connection[Any], sql: str) -> tuple[threading.Thread, list[BaseException]]:
    """Runs sql on conn in a thread; its error, if any, lands in the list."""
    errs: list[BaseException] = []

    def run() -> None:
        try:
            conn.execute(sql)
        except BaseException as exc:
            errs.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errs


def test_a_write_during_a_close_is_checked_again_after_it(layer_db: str) -> None:
    # The close bumps the counter before it commits, so a writer can read the new counter and the session's
    # row as it was before the close: that check may pass (the close has not happened yet), but must not be
    # kept for the connection, or its writes would pass after the close commits. Nor may it wait.
    with tagged(layer_db, "w7") as writer, psycopg.connect(layer_db) as closer:
        writer.execute("UPDATE customers SET score = 1 WHERE id = 1")
        closer.execute("UPDATE cow.sessions SET status = 'committed' WHERE session_id = 'w7'")
        writer.execute("SET statement_timeout = '5s'")
        writer.execute("UPDATE customers SET score = 2 WHERE id = 2")
        closer.commit()
        with pytest.raises(errors.ObjectNotInPrerequisiteState, match="w7 is committed"):
            writer.execute("UPDATE customers SET score = 3 WHERE id = 3")


@pytest.mark.parametrize(
    "write",
    [
        "UPDATE customers SET score = 5 + (SELECT 0 FROM pg_advisory_lock(7001) AS l) WHERE id = 1",
        "DELETE FROM customers WHERE id = 1 AND (SELECT true FROM pg_advisory_lock(7001) AS l)",
    ],
)
def test_a_base_change_committed_while_a_write_runs_is_a_commit_conflict(layer_db: str, write: str) -> None:
    # The write reads row 1 from the base with its statement's snapshot, then waits (the advisory lock) while
    # another connection changes that row in the base. Its base snapshot must be the row it read, so that
    # committing the session reports the conflict instead of overwriting the base change.
    with tagged(layer_db, "w8") as writer, psycopg.connect(layer_db, autocommit=True) as gate:
        gate.execute("SELECT pg_advisory_lock(7001)")
        pid = writer.info.backend_pid
        thread, errs = in_thread(writer, write)
        try:
            assert blocked(layer_db, pid)
            rows(layer_db, "UPDATE customers SET name = 'Base' WHERE id = 1")
        finally:
            gate.execute("SELECT pg_advisory_unlock(7001)")
            thread.join()
        assert errs == []
    [(changes,)] = rows(layer_db, "SELECT changes_table FROM cow.registry WHERE table_name = 'customers'")
    base = f"SELECT _cow_base->>'name' FROM cow_changes.\"{changes}\" WHERE _cow_session = 'w8' AND id = 1"
    assert rows(layer_db, base) == [("Ada",)]
    with pytest.raises(errors.SerializationFailure, match=r"\(id\)=\(1\) of table public.customers"):
        rows(layer_db, "SELECT cow.commit_session('w8')")
    assert rows(layer_db, "SELECT name FROM public.customers WHERE id = 1") == [("Base",)]


def test_write_in_an_open_transaction_is_checked_once_and_new_sessions_register(layer_db: str) -> None:
    with tagged(layer_db, "w2") as writer, writer.transaction():
        writer.execute("UPDATE customers SET score = 1 WHERE id = 1")
        writer.execute("UPDATE customers SET score = 2 WHERE id = 2")
    got = rows(
        layer_db, "SELECT kind, status, first_write_at IS NOT NULL FROM cow.sessions WHERE session_id = 'w2'"
    )
    assert got == [("other", "open", True)]
    assert rows(layer_db, "SELECT count(*) FROM cow.session_changes('w2')") == [(2,)]


def test_an_invalid_operation_id_set_directly_is_refused(layer_db: str) -> None:
    with tagged(layer_db, "w3") as writer:
        writer.execute("UPDATE customers SET score = 1 WHERE id = 1")  # registered, valid
        writer.execute("SET cow.operation_id = 'bad op'")
        with pytest.raises(psycopg.Error, match="operation"):
            writer.execute("UPDATE customers SET score = 2 WHERE id = 2")
        writer.execute("SET cow.operation_id = 'op-2'")
        writer.execute("UPDATE customers SET score = 2 WHERE id = 2")
    got = rows(
        layer_db, "SELECT DISTINCT operation_id FROM cow.session_changes('w3') WHERE operation_id = 'op-2'"
    )
    assert got == [("op-2",)]


def test_a_stale_last_write_at_is_refreshed(layer_db: str) -> None:
    with tagged(layer_db, "w4") as writer:
        writer.execute("UPDATE customers SET score = 1 WHERE id = 1")
        rows(
            layer_db,
            "UPDATE cow.sessions SET last_write_at = now() - interval '1 hour' WHERE session_id = 'w4'",
        )
        # The connection checks the registry again in a transaction that starts in a later second.
        time.sleep(1.1)
        writer.execute("UPDATE customers SET score = 2 WHERE id = 2")
    assert rows(
        layer_db,
        "SELECT last_write_at > now() - interval '10 minutes' FROM cow.sessions WHERE session_id = 'w4'",
    ) == [(True,)]


def test_insert_after_delete_retires_the_tombstone_and_duplicates_still_fail(layer_db: str) -> None:
    with tagged(layer_db, "w5") as writer:
        with pytest.raises(errors.UniqueViolation, match="customers_pkey"):
            writer.execute("INSERT INTO customers (id, email, name) VALUES (1, 'x@example.com', 'X')")
        writer.execute("DELETE FROM customers WHERE id = 3")
        writer.execute("INSERT INTO customers (id, email, name) VALUES (3, 'cy2@example.com', 'Cy2')")
        with pytest.raises(errors.UniqueViolation, match="customers_pkey"):
            writer.execute("INSERT INTO customers (id, email, name) VALUES (3, 'cy3@example.com', 'Cy3')")
        writer.execute("INSERT INTO customers (id, email, name) VALUES (10, 'ten@example.com', 'Ten')")
        with pytest.raises(errors.UniqueViolation, match="customers_pkey"):
            writer.execute("INSERT INTO customers (id, email, name) VALUES (10, 'ten2@example.com', 'Ten2')")
        # The session's view frees and takes the UNIQUE email like the table would.
        with pytest.raises(errors.UniqueViolation, match="customers_email_key"):
            writer.execute("INSERT INTO customers (id, email, name) VALUES (11, 'ada@example.com', 'A2')")
        writer.execute("UPDATE customers SET email = 'ada2@example.com' WHERE id = 1")
        writer.execute("INSERT INTO customers (id, email, name) VALUES (11, 'ada@example.com', 'A2')")
        with pytest.raises(errors.UniqueViolation, match="customers_email_key"):
            writer.execute("UPDATE customers SET email = 'bob@example.com' WHERE id = 11")
        assert writer.execute(
            "SELECT id, email FROM customers WHERE id IN (1, 3, 10, 11) ORDER BY id"
        ).fetchall() == [
            (1, "ada2@example.com"),
            (3, "cy2@example.com"),
            (10, "ten@example.com"),
            (11, "ada@example.com"),
        ]
    # One current version per key; the re-inserted key keeps its base snapshot (commit sees an update of 3).
    [(changes,)] = rows(layer_db, "SELECT changes_table FROM cow.registry WHERE table_name = 'customers'")
    assert rows(
        layer_db,
        "SELECT id, count(*) FILTER (WHERE _cow_current),"
        " (array_agg(_cow_base->>'name' ORDER BY _cow_seq DESC))[1] "
        f"FROM cow_changes.\"{changes}\" WHERE _cow_session = 'w5' AND id IN (3, 10) GROUP BY id ORDER BY id",
    ) == [(3, 1, "Cy"), (10, 1, None)]
    diff = rows(
        layer_db,
        "SELECT pk->>'id', action FROM cow.session_diff('w5') WHERE table_name = 'customers' ORDER BY 1",
    )
    assert diff == [("1", "update"), ("10", "insert"), ("11", "insert"), ("3", "update")]


@pytest.mark.parametrize(
    ("call", "types"),
    [
        ("cow._row_lock_key($1, $2, $3, $4)", "text, text, jsonb, int"),
        ("cow._row_lock_hash($1, $2, $3, $4)", "text, text, jsonb, int"),
        ("cow._session()", ""),
        ("cow._open_stamp($1)", "text"),
        ("cow._write_operation()", ""),
    ],
)
def test_the_functions_every_generated_write_calls_are_inlined(layer_db: str, call: str, types: str) -> None:
    # A SQL function the planner cannot inline (a FROM, a sub-select) runs through the SQL function executor,
    # which parses and plans its body at every call of a trigger: _row_lock_key in that form cost ~190 us of
    # every UPDATE and DELETE in a session. In the generic plan of a call with parameters, an inlined
    # function's name is gone from the plan.
    name = call.split("(", maxsplit=1)[0]
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE q{'(' + types + ')' if types else ''} AS SELECT {call}")  # type: ignore[arg-type]
        args = {"text, text, jsonb, int": "('s', 't1', '[1]', 1)", "text": "('s')", "": ""}[types]
        plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN (VERBOSE) EXECUTE q{args}"))  # type: ignore[arg-type]
    assert name.split(".")[1] + "(" not in plan, plan


def test_write_path_plans_made_on_vacuumed_tables_probe_the_key(layer_db: str) -> None:
    """The INSERT's key lookup and the retiring UPDATE of an UPDATE or DELETE, one row a statement, in a
    backend whose trigger plans were made (at each statement's sixth run) while the changes table was empty
    after a vacuum: each write's own statements read the key's versions, not every version of the session.
    A lookup index (the mirror of `item_n`), the newest index of the changes table, is there to take such a
    probe by the session alone if its predicate could serve it. The trigger statements' plans are read with
    auto_explain (nested statements, as run): the overlay view's own plan of each UPDATE and DELETE is made
    anew for each statement, on the table as it is then, and is not what this checks."""
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE item (id int PRIMARY KEY, n int, note text)")
        conn.execute("CREATE INDEX item_n ON item (n)")
        row = conn.execute(
            "SELECT format('cow_changes.%I', changes_table) FROM cow.registry WHERE table_name = 'item'"
        ).fetchone()
        assert row is not None
        conn.execute(f"VACUUM {row[0]}")
    plans: list[str] = []
    statements = (
        "INSERT INTO item VALUES ($1, $2, 'a')",
        "UPDATE item SET note = 'b' WHERE id = $1",
        "DELETE FROM item WHERE id = $1",
    )
    with psycopg.connect(layer_db, autocommit=True) as conn:  # a new backend: plans made from here on
        conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
        conn.execute("SELECT cow.use_session('plans')")

        def writes(ids: range) -> None:
            for i in ids:
                conn.execute(statements[0].replace("$1", "%s").replace("$2", "%s"), (i, i))
            for sql in statements[1:]:
                for i in ids:
                    conn.execute(sql.replace("$1", "%s"), (i,))

        with conn.transaction(force_rollback=True):
            writes(range(10))  # the plans are made here
        conn.execute("LOAD 'auto_explain'")
        conn.execute(
            "SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = on;"
            " SET auto_explain.log_analyze = on; SET auto_explain.log_timing = off;"
            " SET auto_explain.log_level = notice; SET client_min_messages = notice"
        )
        with conn.transaction(force_rollback=True):
            writes(range(100, 400))
        conn.execute("SET auto_explain.log_min_duration = -1")
    nested = [p for p in plans if "Query Text:" in p and not any(s in p for s in statements)]
    assert len(nested) >= 900, len(nested)
    removed = sum(int(n) for p in nested for n in re.findall(r"Rows Removed by (?:Join )?Filter: (\d+)", p))
    # A probe by key reads the key's current version; a scan of the session's versions by each of the 900
    # writes would filter out ~135,000.
    assert removed <= 900, (removed, [p for p in nested if "Rows Removed" in p][:3])
