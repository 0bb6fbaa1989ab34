"""Row locks in a session: ``FOR UPDATE / NO KEY UPDATE / SHARE / KEY SHARE``, ``NOWAIT``, ``SKIP LOCKED``,
``OF``.

Each scenario runs twice with two connections: on a plain database, and as two connections of one session
through the proxy (the layer's database). The second connection must wait, fail (55P03) or skip exactly as
on the plain table. Waiting is observed with ``pg_blocking_pids`` from a monitor connection, not timed.
Then: other sessions and untagged connections are never blocked by a session's locks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from tests.fix_db import outcome
from tests.fix_proxy import RunningProxy
from tests.proxy.test_fast_relay import scrape

pytestmark = pytest.mark.timeout(120)

SCHEMA = """
CREATE TABLE lk_items (id int PRIMARY KEY, name text NOT NULL, n int NOT NULL DEFAULT 0);
CREATE TABLE lk_child (id int PRIMARY KEY, item_id int NOT NULL REFERENCES lk_items (id));
INSERT INTO lk_items (id, name) SELECT g, 'item ' || g FROM generate_series(1, 6) g;
INSERT INTO lk_child VALUES (10, 1), (11, 2);
"""
# Written in the session (and on the plain table) first: locks then cover base rows and the session's rows.
WRITES = [
    "UPDATE lk_items SET name = 'six' WHERE id = 6",
    "INSERT INTO lk_items (id, name) VALUES (7, 'seven')",
]
STRENGTHS = ("FOR KEY SHARE", "FOR SHARE", "FOR NO KEY UPDATE", "FOR UPDATE")

Conn = psycopg.Connection[Any]


class Side:
    """Connections to one side (plain or a session) and a monitor that sees their backends."""

    def __init__(self, name: str, connect: Callable[[], Conn], monitor: Conn) -> None:
        self.name = name
        self.connect = connect
        self.monitor = monitor

    @contextmanager
    def pair(self) -> Iterator[tuple[Conn, Conn]]:
        with self.connect() as a, self.connect() as b:
            yield a, b


def pid(conn: Conn) -> int:
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def wait_until_blocked(monitor: Conn, backend: int) -> None:
    """Until ``backend`` waits for another backend's lock (bounded: 2,000 polls)."""
    for _ in range(2000):
        row = monitor.execute("SELECT cardinality(pg_blocking_pids(%s))", (backend,)).fetchone()
        if row is not None and row[0] > 0:
            return
        time.sleep(0.01)
    raise AssertionError(f"backend {backend} never waited for a lock")


def command(conn: Conn, sql: str, params: tuple[Any, ...] | None = None) -> tuple[Any, ...]:
    """A write's outcome: ("ok", command tag) or ("error", SQLSTATE, message)."""
    try:
        return ("ok", conn.execute(sql, params).statusmessage)
    except psycopg.Error as exc:
        return ("error", exc.diag.sqlstate, exc.diag.message_primary)


class Background:
    """A statement run in a thread (it may block); ``result()`` joins it."""

    def __init__(
        self, conn: Conn, sql: str, params: tuple[Any, ...] | None = None, *, rows: bool = True
    ) -> None:
        self.value: tuple[Any, ...] | None = None
        self.thread = threading.Thread(target=self._run, args=(conn, sql, params, rows), daemon=True)
        self.thread.start()

    def _run(self, conn: Conn, sql: str, params: tuple[Any, ...] | None, rows: bool) -> None:
        self.value = outcome(conn, sql, params) if rows else command(conn, sql, params)

    def result(self) -> tuple[Any, ...]:
        self.thread.join(60)
        assert self.value is not None, "the statement did not finish"
        return self.value


@pytest.fixture
def sides(proxy: RunningProxy, databases: tuple[str, str]) -> Iterator[tuple[Side, Side, str]]:
    layer_db, plain = databases
    session = proxy.dsn(layer_db, options="-c%20cow.session_id%3Dlocks")
    with (
        psycopg.connect(plain, autocommit=True) as plain_monitor,
        psycopg.connect(layer_db, autocommit=True) as layer_monitor,
        psycopg.connect(session, autocommit=True) as writer,
    ):
        for sql in WRITES:
            writer.execute(sql)
            plain_monitor.execute(sql)
        yield (
            Side("plain", lambda: psycopg.connect(plain, autocommit=True), plain_monitor),
            Side("session", lambda: psycopg.connect(session, autocommit=True), layer_monitor),
            layer_db,
        )


def both(sides: tuple[Side, Side, str], scenario: Callable[[Side], Any]) -> Any:
    plain, session, _ = sides
    expected = scenario(plain)
    assert scenario(session) == expected
    return expected


def test_second_locker_waits_then_gets_the_row(sides: tuple[Side, Side, str]) -> None:
    def scenario(side: Side) -> Any:
        with side.pair() as (a, b):
            waiter = pid(b)
            a.execute("BEGIN")
            first = outcome(
                a, "SELECT id, name FROM lk_items WHERE id IN (1, 6) ORDER BY id FOR UPDATE", None
            )
            b.execute("BEGIN")
            waiting = Background(b, "SELECT id, name FROM lk_items WHERE id = %s FOR UPDATE", (6,))
            wait_until_blocked(side.monitor, waiter)
            a.execute("COMMIT")
            second = waiting.result()
            b.execute("COMMIT")
            return first, second

    got = both(sides, scenario)
    assert got == (("ok", "SELECT 2", [(1, "item 1"), (6, "six")]), ("ok", "SELECT 1", [(6, "six")]))


def _locked_by_a(side: Side, lock_sql: str, probes: list[str]) -> list[tuple[Any, ...]]:
    """a holds ``lock_sql``'s locks; what each probe (NOWAIT / SKIP LOCKED) gives b, each in a transaction."""
    with side.pair() as (a, b):
        a.execute("BEGIN")
        a.execute(lock_sql)
        seen = []
        for probe in probes:
            b.execute("BEGIN")
            seen.append(outcome(b, probe, None))
            b.execute("ROLLBACK")
        a.execute("ROLLBACK")
        return seen


def test_nowait_fails_with_55p03_on_a_locked_row(sides: tuple[Side, Side, str]) -> None:
    probes = [
        "SELECT id FROM lk_items WHERE id = 1 FOR UPDATE NOWAIT",
        "SELECT * FROM lk_items WHERE id = 7 FOR UPDATE NOWAIT",  # a row the session inserted
        "SELECT id FROM lk_items WHERE id = 2 FOR UPDATE NOWAIT",  # not locked
        "SELECT * FROM lk_items FOR SHARE NOWAIT",
    ]
    got = both(
        sides, lambda side: _locked_by_a(side, "SELECT 1 FROM lk_items WHERE id IN (1, 7) FOR UPDATE", probes)
    )
    assert got[0] == ("error", "55P03", 'could not obtain lock on row in relation "lk_items"')
    assert got[1][:2] == got[3][:2] == ("error", "55P03")
    assert got[2] == ("ok", "SELECT 1", [(2,)])


def test_skip_locked_skips_and_takes_the_next_rows(sides: tuple[Side, Side, str]) -> None:
    probes = [
        "SELECT id FROM lk_items ORDER BY id LIMIT 2 FOR UPDATE SKIP LOCKED",
        "SELECT id, name FROM lk_items WHERE id > 0 ORDER BY id DESC FOR NO KEY UPDATE SKIP LOCKED",
        "SELECT * FROM lk_items ORDER BY 1 LIMIT 1 OFFSET 1 FOR UPDATE SKIP LOCKED",
    ]
    got = both(
        sides,
        lambda side: _locked_by_a(side, "SELECT id FROM lk_items WHERE id IN (1, 3, 7) FOR UPDATE", probes),
    )
    assert got[0] == ("ok", "SELECT 2", [(2,), (4,)])
    assert [r[0] for r in got[1][2]] == [6, 5, 4, 2]


def test_skip_locked_locks_only_the_rows_a_limit_passes(sides: tuple[Side, Side, str]) -> None:
    """Two workers taking jobs: the second gets the next ones, not nothing (a lock of every row read)."""

    def scenario(side: Side) -> Any:
        with side.pair() as (a, b):
            a.execute("BEGIN")
            b.execute("BEGIN")
            sql = "SELECT id FROM lk_items WHERE n = %s ORDER BY id LIMIT 2 FOR UPDATE SKIP LOCKED"
            taken = [outcome(a, sql, (0,)), outcome(b, sql, (0,))]
            a.execute("ROLLBACK")
            b.execute("ROLLBACK")
            return taken

    assert both(sides, scenario) == [("ok", "SELECT 2", [(1,), (2,)]), ("ok", "SELECT 2", [(3,), (4,)])]


def test_lock_strengths_conflict_as_on_the_plain_table(sides: tuple[Side, Side, str]) -> None:
    def scenario(side: Side) -> Any:
        matrix = {}
        for held in STRENGTHS:
            probes = [f"SELECT id FROM lk_items WHERE id = 6 {wanted} NOWAIT" for wanted in STRENGTHS]
            results = _locked_by_a(side, f"SELECT id FROM lk_items WHERE id = 6 {held}", probes)
            matrix[held] = [r[0] for r in results]
        return matrix

    matrix = both(sides, scenario)
    assert matrix["FOR KEY SHARE"] == ["ok", "ok", "ok", "error"]
    assert matrix["FOR UPDATE"] == ["error"] * 4


def test_of_locks_only_the_named_table(sides: tuple[Side, Side, str]) -> None:
    lock = (
        "SELECT c.id, i.name FROM lk_child c JOIN lk_items i ON i.id = c.item_id WHERE c.id = 10 "
        "FOR UPDATE OF c"
    )
    probes = [
        "SELECT id FROM lk_items WHERE id = 1 FOR UPDATE NOWAIT",
        "SELECT id FROM lk_child WHERE id = 10 FOR UPDATE NOWAIT",
        "SELECT c.id FROM lk_child c JOIN lk_items i ON i.id = c.item_id FOR UPDATE OF c SKIP LOCKED",
    ]
    got = both(sides, lambda side: _locked_by_a(side, lock, probes))
    assert [g[:2] for g in got] == [("ok", "SELECT 1"), ("error", "55P03"), ("ok", "SELECT 1")]


def test_an_update_waits_for_a_locked_row(sides: tuple[Side, Side, str]) -> None:
    def scenario(side: Side) -> Any:
        with side.pair() as (a, b):
            waiter = pid(b)
            a.execute("BEGIN")
            a.execute("SELECT id FROM lk_items WHERE id IN (2, 7) FOR UPDATE")
            update = Background(b, "UPDATE lk_items SET n = n + 1 WHERE id IN (2, 7)", rows=False)
            wait_until_blocked(side.monitor, waiter)
            a.execute("COMMIT")
            done = update.result()
            b.execute("BEGIN")
            # FOR KEY SHARE does not hold an UPDATE of other columns back
            a.execute("BEGIN")
            a.execute("SELECT id FROM lk_items WHERE id = 3 FOR KEY SHARE")
            free = command(b, "UPDATE lk_items SET n = n + 1 WHERE id = 3")
            a.execute("ROLLBACK")
            b.execute("ROLLBACK")
            return done, free, outcome(a, "SELECT id, n FROM lk_items WHERE id IN (2, 7) ORDER BY id", None)

    assert both(sides, scenario) == (
        ("ok", "UPDATE 2"),
        ("ok", "UPDATE 1"),
        ("ok", "SELECT 2", [(2, 1), (7, 1)]),
    )


def test_a_row_deleted_while_waiting_is_skipped(sides: tuple[Side, Side, str]) -> None:
    def scenario(side: Side) -> Any:
        with side.pair() as (a, b):
            waiter = pid(b)
            a.execute("BEGIN")
            a.execute("SELECT id FROM lk_items WHERE id IN (4, 5) FOR UPDATE")
            b.execute("BEGIN")
            waiting = Background(b, "SELECT id FROM lk_items WHERE id IN (4, 5) ORDER BY id FOR UPDATE")
            wait_until_blocked(side.monitor, waiter)
            a.execute("DELETE FROM lk_child WHERE item_id = 4")
            a.execute("DELETE FROM lk_items WHERE id = 4")
            a.execute("COMMIT")
            got = waiting.result()
            b.execute("ROLLBACK")
            return got

    assert both(sides, scenario) == ("ok", "SELECT 1", [(5,)])


def _wait_for_a_change(side: Side, probe: str) -> tuple[Any, ...]:
    """b runs ``probe`` (FOR UPDATE of item 5) while a holds the row, adds 10 to its n and commits."""
    with side.pair() as (a, b):
        waiter = pid(b)
        a.execute("BEGIN")
        a.execute("SELECT id FROM lk_items WHERE id = 5 FOR UPDATE")
        b.execute("BEGIN")
        waiting = Background(b, probe)
        wait_until_blocked(side.monitor, waiter)
        a.execute("UPDATE lk_items SET n = n + 10 WHERE id = 5")
        a.execute("COMMIT")
        got = waiting.result()
        b.execute("ROLLBACK")
        a.execute("UPDATE lk_items SET n = n - 10 WHERE id = 5")
        return got


def test_a_row_changed_while_waiting_comes_in_its_new_version(sides: tuple[Side, Side, str]) -> None:
    """As PostgreSQL's EvalPlanQual: the waiter gets the row the lock holder committed, and the WHERE is
    checked again on it (a row that no longer matches is left out)."""

    def scenario(side: Side) -> Any:
        return [
            _wait_for_a_change(side, "SELECT id, n, name FROM lk_items WHERE id = 5 FOR UPDATE"),
            _wait_for_a_change(side, "SELECT * FROM lk_items WHERE id = 5 AND n = 0 FOR NO KEY UPDATE"),
            _wait_for_a_change(
                side, "SELECT n + 1 AS next FROM lk_items x WHERE x.id IN (4, 5) ORDER BY x.id FOR UPDATE"
            ),
        ]

    assert both(sides, scenario) == [
        ("ok", "SELECT 1", [(5, 10, "item 5")]),
        ("ok", "SELECT 0", []),
        ("ok", "SELECT 2", [(1,), (11,)]),
    ]


def test_a_joined_row_changed_while_waiting_is_40001_in_a_session(sides: tuple[Side, Side, str]) -> None:
    """The documented difference (docs/layer.md): with several tables in the FROM the statement's columns
    were read before the wait; the plain table returns the new version, a session fails with 40001 and a
    retry reads the new version."""
    plain, session, _ = sides
    probe = "SELECT i.id, i.n FROM lk_items i JOIN lk_child c ON c.id = 10 WHERE i.id = 5 FOR UPDATE OF i"
    assert _wait_for_a_change(plain, probe) == ("ok", "SELECT 1", [(5, 10)])
    assert _wait_for_a_change(session, probe)[:2] == ("error", "40001")


def test_other_sessions_and_untagged_connections_are_never_blocked(
    proxy: RunningProxy, sides: tuple[Side, Side, str]
) -> None:
    _, session, layer_db = sides
    other = proxy.dsn(layer_db, options="-c%20cow.session_id%3Dlocks-other")
    untagged = proxy.dsn(layer_db)
    with (
        session.connect() as a,
        psycopg.connect(other, autocommit=True) as b,
        psycopg.connect(untagged, autocommit=True) as c,
    ):
        a.execute("BEGIN")
        a.execute("SELECT id FROM lk_items FOR UPDATE")
        probe = "SELECT id FROM lk_items WHERE id = 1 FOR UPDATE NOWAIT"
        b.execute("BEGIN")
        assert outcome(b, probe, None) == ("ok", "SELECT 1", [(1,)])
        assert command(b, "UPDATE lk_items SET n = 5 WHERE id = 1") == ("ok", "UPDATE 1")
        b.execute("ROLLBACK")
        c.execute("BEGIN")
        assert outcome(c, probe, None) == ("ok", "SELECT 1", [(1,)])
        c.execute("ROLLBACK")
        a.execute("ROLLBACK")


def test_refusals_are_errors_not_silent_differences(
    proxy: RunningProxy, sides: tuple[Side, Side, str]
) -> None:
    plain, session, _ = sides
    shapes = [
        # PostgreSQL's own refusals stay (the clause is kept for them)
        "SELECT count(*) FROM lk_items FOR UPDATE",
        "SELECT DISTINCT name FROM lk_items FOR UPDATE",
        "SELECT id FROM lk_items FOR UPDATE OF nosuch",
        # the nullable side of an outer join: PostgreSQL's 0A000, raised by the rewrite
        "SELECT i.id FROM lk_items i LEFT JOIN lk_child c ON c.item_id = i.id FOR UPDATE",
    ]
    with plain.connect() as p, session.connect() as s:
        for sql in shapes:
            expected = outcome(p, sql, None)
            assert expected[0] == "error", sql
            assert outcome(s, sql, None)[:2] == expected[:2], sql
        # the non-nullable side may be locked, with OF
        sql = (
            "SELECT i.id FROM lk_items i LEFT JOIN lk_child c ON c.item_id = i.id WHERE i.id = 1 "
            "FOR UPDATE OF i"
        )
        assert outcome(s, sql, None) == outcome(p, sql, None) == ("ok", "SELECT 1", [(1,)])


# An autocommit UPDATE or DELETE that another transaction of the session changed a row under: on the plain
# table READ COMMITTED runs it on the row's new version (EvalPlanQual); in a session the layer fails it with
# its row-changed 40001, and the proxy runs it again (proxy/rerun.py) — on both relays.
RELAYS = pytest.mark.parametrize("proxy", [True, False], ids=["fast-relay", "python-relay"], indirect=True)


def _put_back_item_5(conn: Conn) -> None:
    conn.execute("DELETE FROM lk_items WHERE id = 5")
    conn.execute("INSERT INTO lk_items (id, name) VALUES (5, 'item 5')")


def _autocommit_write_after_a_change(side: Side, sql: str, params: tuple[Any, ...] | None) -> Any:
    """b runs ``sql`` in autocommit while a holds item 5 (FOR UPDATE), adds 10 to its n and commits; then
    what b got and the row (put back after). b has run ``sql`` once before: in a session the C relay then
    has the proxy's decision for its text (the run that waits must not stay on C)."""
    with side.pair() as (a, b):
        waiter = pid(b)
        outcome(b, sql, params)
        _put_back_item_5(a)
        a.execute("BEGIN")
        a.execute("SELECT id FROM lk_items WHERE id = 5 FOR UPDATE")
        write = Background(b, sql, params)
        wait_until_blocked(side.monitor, waiter)
        a.execute("UPDATE lk_items SET n = n + 10 WHERE id = 5")
        a.execute("COMMIT")
        got = write.result()
        row = outcome(a, "SELECT id, n, name FROM lk_items WHERE id = 5", None)
        _put_back_item_5(a)
        return got, row


@RELAYS
@pytest.mark.parametrize("protocol", ["simple", "extended"])
def test_an_autocommit_write_that_waited_runs_on_the_new_version(
    proxy: RunningProxy, sides: tuple[Side, Side, str], protocol: str
) -> None:
    """Django's ``get_or_create`` tests: ``filter(...).update(...)`` waits for ``update_or_create``'s lock,
    then must apply to the row the lock holder committed (the plain table's outcome, exactly). psycopg sends
    a statement without parameters as a simple Query, one with parameters as Parse/Bind/Describe/Execute/Sync.
    """
    writes = [
        "UPDATE lk_items SET name = 'waited', n = n + 1 WHERE id = {id}",
        "UPDATE lk_items SET n = n + 1 WHERE id = {id} RETURNING id, n, name",
        "UPDATE lk_items SET name = 'no' WHERE id = {id} AND n = 0",  # no longer matches
        "DELETE FROM lk_items WHERE id = {id} AND n >= 0",
        "DELETE FROM lk_items WHERE id = {id} AND n = 0 RETURNING id",  # no longer matches
    ]
    params = (5,) if protocol == "extended" else None
    key = "%s" if params else "5"

    def scenario(side: Side) -> Any:
        return [_autocommit_write_after_a_change(side, sql.format(id=key), params) for sql in writes]

    got = both(sides, scenario)
    assert got[0] == (("ok", "UPDATE 1", None), ("ok", "SELECT 1", [(5, 11, "waited")]))
    assert got[1] == (("ok", "UPDATE 1", [(5, 11, "item 5")]), ("ok", "SELECT 1", [(5, 11, "item 5")]))
    assert got[2] == (("ok", "UPDATE 0", None), ("ok", "SELECT 1", [(5, 10, "item 5")]))
    assert got[3] == (("ok", "DELETE 1", None), ("ok", "SELECT 0", []))
    assert got[4] == (("ok", "DELETE 0", []), ("ok", "SELECT 1", [(5, 10, "item 5")]))
    assert scrape(proxy)["cowproxy_reruns_total"] == len(writes)  # one new run each, in the session


@RELAYS
def test_a_40001_that_is_not_the_read_committed_one_reaches_the_client(
    sides: tuple[Side, Side, str],
) -> None:
    """REPEATABLE READ in autocommit: the plain table fails the waiting UPDATE with 40001 too, and so does the
    session, untouched (never run again). Inside a transaction block the layer's 40001 stays the client's
    (the documented difference: the plain table would run the UPDATE on the new version; a retry of the
    transaction does)."""
    plain, session, _ = sides
    repeatable = "SET default_transaction_isolation = 'repeatable read'"
    update = "UPDATE lk_items SET n = n + 1 WHERE id = 5"

    def scenario(side: Side, setup: str) -> Any:
        with side.pair() as (a, b):
            waiter = pid(b)
            b.execute(setup)
            a.execute("BEGIN")
            a.execute("SELECT id FROM lk_items WHERE id = 5 FOR UPDATE")
            write = Background(b, update, rows=False)
            wait_until_blocked(side.monitor, waiter)
            a.execute("UPDATE lk_items SET n = n + 10 WHERE id = 5")
            a.execute("COMMIT")
            got = write.result()
            if setup == "BEGIN":
                b.execute("ROLLBACK")
            _put_back_item_5(a)
            return got

    changed = ("error", "40001", "could not serialize access due to concurrent update")
    assert scenario(plain, repeatable) == scenario(session, repeatable) == changed
    assert scenario(plain, "BEGIN") == ("ok", "UPDATE 1")
    assert scenario(session, "BEGIN") == changed


@RELAYS
def test_an_autocommit_write_of_another_session_never_waits(
    proxy: RunningProxy, sides: tuple[Side, Side, str]
) -> None:
    _, session, layer_db = sides
    other = proxy.dsn(layer_db, options="-c%20cow.session_id%3Dlocks-other")
    with session.connect() as a, psycopg.connect(other, autocommit=True) as b:
        a.execute("BEGIN")
        a.execute("SELECT id FROM lk_items WHERE id = 5 FOR UPDATE")
        a.execute("UPDATE lk_items SET n = n + 10 WHERE id = 5")
        for _ in range(2):  # (the second time the C relay has the text's decision)
            assert command(b, "UPDATE lk_items SET n = n + 1 WHERE id = 5") == ("ok", "UPDATE 1")
        assert outcome(b, "SELECT n FROM lk_items WHERE id = 5", None) == ("ok", "SELECT 1", [(2,)])
        a.execute("ROLLBACK")
