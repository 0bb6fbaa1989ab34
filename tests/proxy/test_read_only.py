"""Read-only clients in a session through the proxy: a client whose transactions are read-only (its role's,
its database's or its startup options' ``default_transaction_read_only``, ``BEGIN READ ONLY``) behaves as on
the plain tables. Its reads work, its writes fail with PostgreSQL's own 25006 and land nowhere, although
the proxy's join records the binding (a write: it runs in a read-write block of its own between the
client's transactions). The session's rows, the base tables and the bindings are read directly."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg
import psycopg
import pytest

from tests.fix_db import PgServer
from tests.fix_proxy import RunningProxy, run_proxy

pytestmark = pytest.mark.timeout(120)

BOTH_RELAYS = True

SESSION = "ro1"
OTHER = "ro2"
BASE_EMAILS = ["ada@example.com", "bob@example.com", "cy@example.com"]
READER = f"cowt_ro_reader_{os.getpid()}"
WRITES = (
    "INSERT INTO customers (email, name) VALUES ('new@x', 'New')",
    "UPDATE customers SET score = 7 WHERE id = 2",
    "DELETE FROM orders WHERE id = 4",
)


def options(**settings: str) -> str:
    """A libpq ``options`` value (URL-encoded) with ``-c name=value`` per setting."""
    return quote(" ".join(f"-c {name.replace('__', '.')}={value}" for name, value in settings.items()))


def with_user(dsn: str, user: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=f"{user}@{parts.hostname}:{parts.port}"))


def prepare(db: str) -> None:
    """One change of ``SESSION`` and one of ``OTHER``, made directly (the no-proxy path)."""
    with psycopg.connect(db, autocommit=True) as conn:
        for session, email in ((SESSION, "pre@x"), (OTHER, "other@x")):
            conn.execute("SELECT cow.use_session(%s)", (session,))
            conn.execute("INSERT INTO customers (email, name) VALUES (%s, 'Pre')", (email,))
        conn.execute("SELECT cow.use_session(NULL)")


def plain_messages(db: str) -> list[str]:
    """PostgreSQL's own errors for ``WRITES`` on the base tables in a read-only transaction (directly)."""
    found = []
    with psycopg.connect(db, autocommit=True) as conn:
        for write in WRITES:
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction) as failure:
                conn.execute(f"BEGIN READ ONLY; {write}")
            found.append(failure.value.diag.message_primary or "")
            conn.execute("ROLLBACK")
    assert found[0] == "cannot execute INSERT in a read-only transaction"
    return found


def state(db: str) -> tuple[list[str], list[tuple[str, str]], list[tuple[Any, ...]]]:
    """(base emails, the two sessions' changes as (session, email or key), the bindings' sessions)."""
    with psycopg.connect(db, autocommit=True) as conn:
        base = [r[0] for r in conn.execute("SELECT email FROM public.customers ORDER BY id")]
        changes = [
            (s, str(r[0]))
            for s in (SESSION, OTHER)
            for r in conn.execute(
                "SELECT coalesce(row_data->>'email', pk::text) FROM cow.session_changes(%s) ORDER BY seq",
                (s,),
            )
        ]
        bindings = conn.execute("SELECT session FROM cow.bindings ORDER BY session").fetchall()
    return base, changes, bindings


BEFORE = (BASE_EMAILS, [(SESSION, "pre@x"), (OTHER, "other@x")])


def bound_to(db: str, pid: int) -> str | None:
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute("SELECT session FROM cow.bindings WHERE pid = %s", (pid,)).fetchone()
    return None if row is None else str(row[0])


def check_psycopg(conn: psycopg.Connection[Any], db: str, expected: list[str], prepare: bool | None) -> int:
    """Reads see the session; every write fails as on the plain table; returns the backend's pid."""
    emails = [r[0] for r in conn.execute("SELECT email FROM customers ORDER BY id", prepare=prepare)]
    assert emails == [*BASE_EMAILS, "pre@x"]
    assert conn.execute("SELECT current_setting('transaction_read_only')", prepare=prepare).fetchone() == (
        "on",
    )
    for write, message in zip(WRITES, expected, strict=True):
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction) as failure:
            conn.execute(write, prepare=prepare)
        assert failure.value.diag.message_primary == message
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    assert bound_to(db, row[0]) == SESSION  # the join recorded its binding
    return int(row[0])


@pytest.mark.parametrize("prepare_mode", [False, True], ids=["unprepared", "prepared"])
def test_startup_option_read_only_reads_and_fails_writes_as_on_the_plain_table(
    proxy: RunningProxy, layer_db: str, prepare_mode: bool
) -> None:
    prepare(layer_db)
    expected = plain_messages(layer_db)
    dsn = proxy.dsn(layer_db, options=options(cow__session_id=SESSION, default_transaction_read_only="on"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        check_psycopg(conn, layer_db, expected, prepare_mode)
        # As on the plain table, a read-write block it asks for writes (into its session).
        with conn.transaction():
            conn.execute("SET TRANSACTION READ WRITE")
            conn.execute("INSERT INTO customers (email, name) VALUES ('rw@x', 'Rw')", prepare=prepare_mode)
    base, changes, _ = state(layer_db)
    assert (base, changes) == (BASE_EMAILS, [*BEFORE[1][:1], (SESSION, "rw@x"), *BEFORE[1][1:]])


def test_simple_protocol_read_only_multi_statement(proxy: RunningProxy, layer_db: str) -> None:
    """The simple protocol with the client's own queries (psycopg's ClientCursor: literal texts)."""
    prepare(layer_db)
    expected = plain_messages(layer_db)
    dsn = proxy.dsn(layer_db, options=options(cow__session_id=SESSION, default_transaction_read_only="on"))
    with psycopg.connect(dsn, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
        check_psycopg(conn, layer_db, expected, None)
        cur = conn.execute("SELECT count(*) FROM customers; SELECT count(*) FROM orders")
        assert cur.fetchone() == (4,)
        assert cur.nextset() and cur.fetchone() == (4,)
    assert state(layer_db)[:2] == BEFORE


def test_asyncpg_read_only_client(proxy: RunningProxy, layer_db: str) -> None:
    prepare(layer_db)
    expected = plain_messages(layer_db)
    dsn = proxy.dsn(layer_db)

    async def run() -> int:
        conn = await asyncpg.connect(
            dsn, server_settings={"application_name": f"cow:{SESSION}", "default_transaction_read_only": "on"}
        )
        try:
            rows = await conn.fetch("SELECT email FROM customers ORDER BY id")
            assert [r[0] for r in rows] == [*BASE_EMAILS, "pre@x"]
            assert await conn.fetchval("SELECT email FROM customers WHERE id = $1", 1) == BASE_EMAILS[0]
            for write, message in zip(WRITES, expected, strict=True):
                with pytest.raises(asyncpg.ReadOnlySQLTransactionError, match=f"^{message}$"):
                    await conn.execute(write)
            with pytest.raises(asyncpg.ReadOnlySQLTransactionError, match=f"^{expected[0]}$"):
                await conn.execute("INSERT INTO customers (email, name) VALUES ($1, $2)", "p@x", "P")
            return int(await conn.fetchval("SELECT pg_backend_pid()"))
        finally:
            await conn.close()

    pid = asyncio.run(run())
    assert state(layer_db)[:2] == BEFORE
    assert bound_to(layer_db, pid) in (SESSION, None)  # (None: the backend ended and its row went)


def test_database_level_read_only(proxy: RunningProxy, layer_db: str) -> None:
    prepare(layer_db)
    expected = plain_messages(layer_db)
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(
            f"ALTER DATABASE {urlsplit(layer_db).path.lstrip('/')} SET default_transaction_read_only = on"
        )
    with psycopg.connect(proxy.dsn(layer_db, application_name=f"cow:{SESSION}"), autocommit=True) as conn:
        check_psycopg(conn, layer_db, expected, None)
    assert state(layer_db)[:2] == BEFORE


@pytest.fixture
def reader(pg_server: PgServer, layer_db: str) -> Iterator[str]:
    """A non-superuser login role whose transactions are read-only by default (``ALTER ROLE … SET``), with
    every privilege on the application's tables: its writes fail for being read-only, not for privileges."""
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (READER,)).fetchone() is None:
            conn.execute(f"CREATE ROLE {READER} LOGIN NOSUPERUSER")
        conn.execute(f"ALTER ROLE {READER} SET default_transaction_read_only = on")
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON customers, orders TO {READER}")
        conn.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {READER}")
    yield READER
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(f"REVOKE ALL ON customers, orders FROM {READER}")
        conn.execute(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {READER}")


def test_role_level_read_only(proxy: RunningProxy, layer_db: str, reader: str) -> None:
    prepare(layer_db)
    expected = plain_messages(layer_db)
    dsn = proxy.dsn(with_user(layer_db, reader), options=options(cow__session_id=SESSION))
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (reader,)
        check_psycopg(conn, layer_db, expected, None)
        check_psycopg(conn, layer_db, expected, True)
    assert state(layer_db)[:2] == BEFORE


def test_begin_read_only_of_a_normal_client(proxy: RunningProxy, layer_db: str) -> None:
    """``BEGIN READ ONLY`` as a tagged connection's first statement, and later: reads work, writes fail as on
    the plain table, and the proxy's join never makes the client's block read-write."""
    prepare(layer_db)
    expected = plain_messages(layer_db)
    dsn = proxy.dsn(layer_db, options=options(cow__session_id=SESSION))
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(2):
            conn.execute("BEGIN READ ONLY")
            assert conn.execute("SHOW transaction_read_only").fetchone() == ("on",)
            # An operation named by a comment joins again inside the block (no write: same session).
            assert conn.execute("/*cow_operation='o2'*/ SELECT count(*) FROM customers").fetchone() == (4,)
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction) as failure:
                conn.execute(WRITES[0])
            assert failure.value.diag.message_primary == expected[0]
            conn.execute("ROLLBACK")
        conn.execute("INSERT INTO customers (email, name) VALUES ('after@x', 'After')")
    base, changes, _ = state(layer_db)
    assert base == BASE_EMAILS and (SESSION, "after@x") in changes and len(changes) == 3


def test_read_only_rejoins_by_comment(proxy: RunningProxy, layer_db: str) -> None:
    """An untagged read-only connection that moves between sessions by comment (each move rebinds: a write
    in the proxy's own block) and back to no session (unbinds)."""
    prepare(layer_db)
    dsn = proxy.dsn(layer_db, options=options(default_transaction_read_only="on"))
    count = "SELECT email FROM customers ORDER BY id"
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        pid = row[0]
        for _ in range(2):
            for session, email in ((SESSION, "pre@x"), (OTHER, "other@x")):
                seen = [r[0] for r in conn.execute(f"/*cow_session='{session}'*/ {count}")]
                assert seen == [*BASE_EMAILS, email]
                assert bound_to(layer_db, pid) == session
                seen = [r[0] for r in conn.execute(f"/*cow_session='{session}',cow_operation='x'*/ {count}")]
                assert seen == [*BASE_EMAILS, email]
            assert [r[0] for r in conn.execute(count)] == BASE_EMAILS  # untagged: the base tables
            assert bound_to(layer_db, pid) is None
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                conn.execute(f"/*cow_session='{SESSION}'*/ {WRITES[0]}")
    assert state(layer_db)[:2] == BEFORE


def test_client_notices_arrive_once_through_a_join(proxy: RunningProxy, layer_db: str) -> None:
    """The proxy's own statements (the join's block) raise no notice the client sees; the client's own
    notices and warnings (also SQLSTATE 25P01, as a SET TRANSACTION outside a block would give) arrive."""
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION app_notice() RETURNS int LANGUAGE plpgsql AS"
            " $$ BEGIN RAISE NOTICE 'hello from the app'; RAISE WARNING 'careful'; RETURN 1; END $$"
        )
    for settings in ({"default_transaction_read_only": "on"}, {}):
        dsn = proxy.dsn(layer_db, options=options(cow__session_id=SESSION, **settings))
        with psycopg.connect(dsn, autocommit=True) as conn:
            seen: list[tuple[str, str, str]] = []
            conn.add_notice_handler(
                lambda d, seen=seen: seen.append(
                    (d.severity_nonlocalized or "", d.sqlstate or "", d.message_primary or "")
                )
            )
            assert conn.execute("SELECT app_notice()").fetchone() == (1,)  # the first statement: joins
            assert seen == [("NOTICE", "00000", "hello from the app"), ("WARNING", "01000", "careful")]
            seen.clear()
            conn.execute("ROLLBACK")
            conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
            assert seen == [
                ("WARNING", "25P01", "there is no transaction in progress"),
                ("WARNING", "25P01", "SET TRANSACTION can only be used in transaction blocks"),
            ]


def test_a_failed_bind_leaves_no_aborted_block(pg_server: PgServer, layer_db: str) -> None:
    """The join's block is rolled back when the bind fails (here: a proxy with a wrong secret): the client's
    statement is refused with the bind's error and the connection is idle, not in a failed block."""
    with run_proxy(pg_server, bind_secret="not-the-database-secret") as proxy:
        dsn = proxy.dsn(layer_db, options=options(cow__session_id=SESSION))
        with psycopg.connect(dsn, autocommit=True) as conn:
            for _ in range(2):
                with pytest.raises(psycopg.errors.InvalidPassword, match="wrong binding secret"):
                    conn.execute("SELECT count(*) FROM customers")
                assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with psycopg.connect(layer_db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM cow.bindings").fetchone() == (0,)
