"""Two transactions of one session writing one row at the same time (cow._lock_code, 30_generators.sql).

On a plain table the second writer waits on the first's row lock and then works on the new row version.
Through the overlay view it waits too (on the version the first retired, or on the layer's ``<t>_cur`` index);
an UPDATE or DELETE whose row the first changed then fails with 40001 (retryable: the retry sees the new
version), where it used to fail with 23505 on the layer's own index or silently overwrite the first writer's
change (cow._rec_code, 30_generators.sql). Other sessions never wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from proxy.rerun import RERUN_HINT

pytestmark = pytest.mark.timeout(60)


def session(dsn: str, name: str) -> psycopg.Connection[Any]:
    """A connection in session ``name``, registered (its first write would otherwise insert the registry row,
    which a concurrent first write of the same new session waits for)."""
    conn = psycopg.connect(dsn)
    conn.execute(
        "SELECT cow.create_session(%s) WHERE NOT EXISTS (SELECT 1 FROM cow.sessions WHERE session_id = %s)",
        (name, name),
    )
    conn.execute("SELECT cow.use_session(%s)", (name,))
    conn.commit()
    return conn


class Background:
    """A statement run on ``conn`` in a thread (it may block); ``seen()`` is ("ok", rows) or ("error",
    SQLSTATE, constraint)."""

    def __init__(self, conn: psycopg.Connection[Any], sql: str) -> None:
        self.conn = conn
        self.result: tuple[Any, ...] | None = None
        self.hint: str | None = None
        self.thread = threading.Thread(target=self._run, args=(sql,))
        self.thread.start()

    def _run(self, sql: str) -> None:
        try:
            cur = self.conn.execute(sql)
            self.result = ("ok", cur.fetchall() if cur.description else cur.rowcount)
            self.conn.commit()
        except psycopg.Error as exc:
            self.result = ("error", exc.diag.sqlstate, exc.diag.constraint_name)
            self.hint = exc.diag.message_hint
            self.conn.rollback()

    def seen(self) -> tuple[Any, ...]:
        self.thread.join(30)
        assert self.result is not None, "the statement did not finish"
        return self.result


def wait_until_blocked(dsn: str, conn: psycopg.Connection[Any]) -> None:
    """Until ``conn``'s backend waits for a lock (not a fixed sleep: the thread may start late)."""
    pid = conn.info.backend_pid
    with psycopg.connect(dsn, autocommit=True) as watcher:
        for _ in range(300):
            row = watcher.execute(
                "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", (pid,)
            ).fetchone()
            if row is not None and row[0] > 0:
                return
            time.sleep(0.02)
    raise AssertionError("the second writer never waited")


Writers = tuple[psycopg.Connection[Any], psycopg.Connection[Any]]


@pytest.fixture
def writers(layer_db: str) -> Iterator[Writers]:
    """Two connections in session s1."""
    with session(layer_db, "s1") as first, session(layer_db, "s1") as second:
        yield first, second


def race(
    dsn: str, first: psycopg.Connection[Any], second: psycopg.Connection[Any], sqls: tuple[str, str]
) -> Any:
    """``first`` runs its statement, ``second`` runs its own and waits; ``first`` commits: what ``second``
    got."""
    first.execute(sqls[0])
    blocked = Background(second, sqls[1])
    wait_until_blocked(dsn, second)
    first.commit()
    return blocked.seen()


@pytest.mark.parametrize("versioned", [False, True], ids=["base row", "session version"])
def test_the_second_writer_of_a_row_waits_then_gets_40001(
    layer_db: str, versioned: bool, writers: Writers
) -> None:
    first, second = writers
    if versioned:  # the session already holds a version of the row
        first.execute("UPDATE customers SET score = 100 WHERE id = 2")
        first.commit()
    statements = (
        "UPDATE customers SET score = score + 10 WHERE id = 2",
        "UPDATE customers SET score = score + 1 WHERE id = 2",
    )
    assert race(layer_db, first, second, statements) == ("error", "40001", None)
    # nothing lost: the first writer's change stands, and the retry works on it
    second.execute("UPDATE customers SET score = score + 1 WHERE id = 2")
    second.commit()
    start = 100 if versioned else 0
    assert first.execute("SELECT score FROM customers WHERE id = 2").fetchone() == (start + 11,)


def test_a_row_changed_after_the_statement_read_it_gets_40001(layer_db: str, writers: Writers) -> None:
    """The first writer commits while the second's statement runs, before its trigger sees the row: no wait,
    but the row it read is gone."""
    first, second = writers
    first.execute("UPDATE customers SET score = 100 WHERE id = 2")
    first.commit()
    first.execute("UPDATE customers SET score = score + 10 WHERE id = 2")
    slow = Background(
        second, "UPDATE customers SET score = score + 1 WHERE id = 2 AND pg_sleep(0.5) IS NOT NULL"
    )
    with psycopg.connect(layer_db, autocommit=True) as watcher:  # until its statement has read the row
        for _ in range(300):
            row = watcher.execute(
                "SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (second.info.backend_pid,)
            ).fetchone()
            if row is not None and row[0] == "PgSleep":
                break
            time.sleep(0.01)
    first.commit()
    assert slow.seen() == ("error", "40001", None)
    assert first.execute("SELECT score FROM customers WHERE id = 2").fetchone() == (110,)


def test_a_delete_of_a_row_another_transaction_updated_gets_40001(layer_db: str, writers: Writers) -> None:
    first, second = writers
    statements = (
        "UPDATE customers SET name = 'Bobby' WHERE id = 2",
        "DELETE FROM customers WHERE id = 2",
    )
    assert race(layer_db, first, second, statements) == ("error", "40001", None)
    assert first.execute("SELECT name FROM customers WHERE id = 2").fetchone() == ("Bobby",)


@pytest.mark.parametrize(
    ("isolation", "again"),
    [(psycopg.IsolationLevel.READ_COMMITTED, True), (psycopg.IsolationLevel.REPEATABLE_READ, False)],
    ids=["read committed", "repeatable read"],
)
def test_the_40001_hint_says_whether_the_statement_may_run_again(
    layer_db: str, writers: Writers, isolation: psycopg.IsolationLevel, again: bool
) -> None:
    """In READ COMMITTED the plain table would have run the statement on the row's new version: the hint
    on which the proxy runs a statement alone in its transaction again (proxy/rerun.py). In REPEATABLE READ
    the plain table fails too (40001; here PostgreSQL's own, on the changes table): never run again."""
    first, second = writers
    second.isolation_level = isolation
    first.execute("UPDATE customers SET score = score + 10 WHERE id = 2")
    blocked = Background(second, "UPDATE customers SET score = score + 1 WHERE id = 2")
    wait_until_blocked(layer_db, second)
    first.commit()
    assert blocked.seen() == ("error", "40001", None)
    assert (blocked.hint == RERUN_HINT) is again


def test_writers_of_different_rows_of_one_session_do_not_wait(writers: Writers) -> None:
    first, second = writers
    first.execute("UPDATE customers SET score = 5 WHERE id = 3")
    second.execute("SET lock_timeout = '2s'")  # a wait would fail the test, not hang it
    second.execute("UPDATE customers SET score = 7 WHERE id = 2")
    first.commit()
    second.commit()
    rows = first.execute("SELECT id, score FROM customers WHERE id IN (2, 3) ORDER BY id").fetchall()
    assert rows == [(2, 7), (3, 5)]


def test_concurrent_inserts_of_one_key_fail_with_23505(layer_db: str, plain_db: str) -> None:
    """As on the plain table, but the constraint named is the layer's ``<t>_cur`` (docs/layer.md)."""
    insert = "INSERT INTO customers (id, email, name) VALUES (50, 'new@example.com', 'New')"
    outcomes = []
    for dsn, name in ((layer_db, "s1"), (plain_db, None)):
        first = session(dsn, name) if name else psycopg.connect(dsn)
        second = session(dsn, name) if name else psycopg.connect(dsn)
        with first, second:
            outcomes.append(race(dsn, first, second, (insert, insert)))
    assert outcomes[1] == ("error", "23505", "customers_pkey")
    assert outcomes[0][:2] == ("error", "23505") and str(outcomes[0][2]).endswith("_cur")


def test_a_key_update_onto_a_key_another_transaction_inserted_fails_with_23505(
    layer_db: str, writers: Writers
) -> None:
    first, second = writers
    statements = (
        "INSERT INTO customers (id, email, name) VALUES (50, 'new@example.com', 'New')",
        "UPDATE customers SET id = 50 WHERE id = 3",
    )
    assert race(layer_db, first, second, statements) == ("error", "23505", "customers_pkey")


def test_other_sessions_and_untagged_writers_do_not_wait(layer_db: str) -> None:
    first = session(layer_db, "s1")
    with first, session(layer_db, "s2") as other, psycopg.connect(layer_db) as untagged:
        first.execute("UPDATE customers SET score = 1 WHERE id = 2")
        for conn in (other, untagged):
            conn.execute("SET lock_timeout = '2s'")  # a wait would fail the test, not hang it
            conn.execute("UPDATE customers SET score = 2 WHERE id = 2")
            conn.commit()
        first.commit()
        assert first.execute("SELECT score FROM customers WHERE id = 2").fetchone() == (1,)
        assert other.execute("SELECT score FROM customers WHERE id = 2").fetchone() == (2,)
        assert untagged.execute("SELECT score FROM customers WHERE id = 2").fetchone() == (2,)
