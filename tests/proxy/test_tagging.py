"""Tagging through the proxy on a database with the CoW layer: every source, precedence, routes, and
every attempt to leave a session. The base tables are read directly (not through the proxy) each time."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import asyncpg
import psycopg
import pytest

from proxy import protocol as p
from proxy.admin import admin_request
from tests.fix_proxy import RunningProxy, run_proxy
from tests.proxy.test_adversity import RawClient

pytestmark = pytest.mark.timeout(90)

BASE_CUSTOMERS = 3


def base_customers(db: str) -> list[str]:
    """Emails in the base table, read directly from PostgreSQL (never through the proxy)."""
    with psycopg.connect(db, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT email FROM public.customers ORDER BY id")]


def changes(db: str, session: str) -> list[tuple[str, str, str]]:
    """(operation, table, email-or-id) per write of ``session``, read directly."""
    with psycopg.connect(db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT operation_id, table_name, coalesce(row_data->>'email', pk::text)"
            " FROM cow.session_changes(%s) ORDER BY seq",
            (session,),
        ).fetchall()
    return [(str(a), str(b), str(c)) for a, b, c in rows]


def insert(conn: psycopg.Connection[Any], email: str, comment: str = "") -> None:
    conn.execute(f"{comment}INSERT INTO customers (email, name) VALUES ('{email}', 'x')")


def test_startup_options_tag_the_connection(proxy: RunningProxy, layer_db: str) -> None:
    dsn = proxy.dsn(layer_db, options="-c%20cow.session_id%3Ds1%20-c%20cow.operation_id%3Dop1")
    with psycopg.connect(dsn, autocommit=True) as conn:
        insert(conn, "s1@x")
        # Extended protocol with bound parameters, too.
        conn.execute("INSERT INTO customers (email, name) VALUES (%s, %s)", ("s1b@x", "y"))
        seen = [r[0] for r in conn.execute("SELECT email FROM customers ORDER BY id")]
        assert "s1@x" in seen and "s1b@x" in seen and len(seen) == BASE_CUSTOMERS + 2
    assert changes(layer_db, "s1") == [("op1", "customers", "s1@x"), ("op1", "customers", "s1b@x")]
    assert len(base_customers(layer_db)) == BASE_CUSTOMERS


def test_application_name_tags_and_operations_are_fresh_per_transaction(
    proxy: RunningProxy, layer_db: str
) -> None:
    with psycopg.connect(proxy.dsn(layer_db, application_name="cow:s2"), autocommit=True) as conn:
        insert(conn, "a@x")
        with conn.transaction():
            insert(conn, "b@x")
            insert(conn, "c@x")
    got = changes(layer_db, "s2")
    assert [c[2] for c in got] == ["a@x", "b@x", "c@x"]
    assert got[0][0] != got[1][0] and got[1][0] == got[2][0]
    assert len(base_customers(layer_db)) == BASE_CUSTOMERS


def test_comment_tags_switch_per_statement_not_a_fixed_session(proxy: RunningProxy, layer_db: str) -> None:
    with psycopg.connect(proxy.dsn(layer_db), autocommit=True) as conn:
        insert(conn, "c1@x", "/*cow_session='s3',cow_operation='o1'*/ ")
        insert(conn, "plain@x")  # untagged: the base table, as without the proxy
        conn.execute(
            "INSERT INTO customers (email, name) VALUES (%s, 'p') /*cow_session='s3',cow_operation='o2'*/",
            ("c2@x",),
        )
    # On a connection whose session is fixed at startup a comment may name the operation, not another session.
    with psycopg.connect(proxy.dsn(layer_db, application_name="cow:s4"), autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as info:
            insert(conn, "c3@x", "/*cow_session='s3',cow_operation='o3'*/ ")
        assert info.value.sqlstate == "42501" and 'rule "session"' in str(info.value)
        insert(conn, "s4@x", "/*cow_session='s4',cow_operation='o4'*/ ")
        insert(conn, "s4b@x", "/*cow_operation='o5'*/ ")
    assert changes(layer_db, "s3") == [("o1", "customers", "c1@x"), ("o2", "customers", "c2@x")]
    assert changes(layer_db, "s4") == [("o4", "customers", "s4@x"), ("o5", "customers", "s4b@x")]
    assert base_customers(layer_db)[BASE_CUSTOMERS:] == ["plain@x"]


@pytest.mark.parametrize(
    "first",
    [
        "/*cow_session='s7b'*/ SELECT 1",  # another session than the startup one
        "/*cow_session='bad id!'*/ SELECT 1",  # a malformed tag
    ],
)
def test_a_statement_pipelined_behind_a_refused_tag_stays_in_the_session(
    proxy: RunningProxy, layer_db: str, first: str
) -> None:
    """The refused statement is the connection's first: what follows it in the same batch still runs in the
    connection's session (the refusal comes before the tags are decided), never untagged on the base table."""
    c = RawClient(proxy.host, proxy.port, layer_db.rsplit("/", 1)[1], options="-c cow.session_id=s7")
    c.sock.settimeout(10)
    write = "INSERT INTO customers (email, name) VALUES ('piped@x', 'p')"
    c.sock.sendall(p.encode_query(first) + p.encode_query(write))
    replies = c.read_until(b"Z") + c.read_until(b"Z")
    c.sock.close()
    assert replies[0][0] == b"E" and (b"C", b"INSERT 0 1\0") in replies
    assert len(base_customers(layer_db)) == BASE_CUSTOMERS
    assert [c[2] for c in changes(layer_db, "s7")] == ["piped@x"]


def test_malformed_tags_are_refused(proxy: RunningProxy, layer_db: str) -> None:
    with psycopg.connect(proxy.dsn(layer_db), autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as info:
            insert(conn, "bad@x", "/*cow_session='no%20spaces',cow_operation='o'*/ ")
        assert info.value.sqlstate == "22023"
        assert conn.execute("SELECT 1").fetchone() == (1,)
    with pytest.raises(psycopg.OperationalError, match="invalid session id"):
        psycopg.connect(proxy.dsn(layer_db, application_name="cow:bad%20id"))
    assert len(base_customers(layer_db)) == BASE_CUSTOMERS


TAMPERING = [
    "SET cow.session_id = ''",
    "RESET cow.session_id",
    "RESET ALL; SELECT 1",
    "DISCARD ALL; INSERT INTO customers (email, name) VALUES ('discard@x', 'd')",
    "SET search_path = public; RESET ALL",
    "SELECT set_config('cow.session_id', '', false)",
    "SELECT cow.use_session(NULL)",
    "SET SESSION AUTHORIZATION postgres",
    "SELECT 1; RESET cow.session_id; INSERT INTO customers (email, name) VALUES ('multi@x', 'm')",
]


def test_tampering_is_refused_and_base_stays_untouched(proxy: RunningProxy, layer_db: str) -> None:
    with psycopg.connect(proxy.dsn(layer_db, application_name="cow:s5"), autocommit=True) as conn:
        for statement in TAMPERING:
            with pytest.raises(psycopg.Error) as info:
                conn.execute(statement, prepare=False)
            assert info.value.sqlstate == "42501", statement
            # Extended protocol too (a Parse of the same text).
            if ";" not in statement:
                with pytest.raises(psycopg.Error) as info:
                    conn.execute(statement, prepare=True)
                assert info.value.sqlstate == "42501", statement
            insert(conn, f"after{TAMPERING.index(statement)}@x")
        # Inside a transaction the refusal aborts it, like a server error would.
        with pytest.raises(psycopg.Error), conn.transaction():
            insert(conn, "intx@x")
            conn.execute("SET LOCAL cow.session_id = 'x'")
        assert conn.execute("SHOW cow.session_id").fetchone() == ("s5",)
    assert len(base_customers(layer_db)) == BASE_CUSTOMERS
    written = [c[2] for c in changes(layer_db, "s5")]
    assert written == [f"after{i}@x" for i in range(len(TAMPERING))]


def test_a_pool_reset_keeps_the_connection_in_its_session(proxy: RunningProxy, layer_db: str) -> None:
    """Pools end each use with RESET ALL / DISCARD ALL: it runs, and the session is joined again."""
    import asyncpg

    async def run() -> None:
        settings = {"application_name": "cow:s9"}
        pool = await asyncpg.create_pool(
            proxy.dsn(layer_db), min_size=1, max_size=1, server_settings=settings
        )
        try:
            for email in ("pool1@x", "pool2@x"):
                async with pool.acquire() as conn:  # released with "...; RESET ALL"
                    await conn.execute("INSERT INTO customers (email, name) VALUES ($1, 'p')", email)
                    assert await conn.fetchval("SHOW cow.session_id") == "s9"
        finally:
            await pool.close()

    asyncio.run(asyncio.wait_for(run(), 30))
    with psycopg.connect(proxy.dsn(layer_db, application_name="cow:s9"), autocommit=True) as conn:
        conn.execute("DISCARD ALL", prepare=False)
        assert conn.execute("SHOW cow.session_id").fetchone() == ("s9",)
        insert(conn, "pool3@x")
        with pytest.raises(psycopg.Error) as info:  # a Bind could run before the reset: refused
            conn.execute("RESET ALL", prepare=True)
        assert info.value.sqlstate == "42501"
    assert [c[2] for c in changes(layer_db, "s9")] == ["pool1@x", "pool2@x", "pool3@x"]
    assert len(base_customers(layer_db)) == BASE_CUSTOMERS


def test_rolled_back_switch_is_reapplied(proxy: RunningProxy, layer_db: str) -> None:
    tag = "/*cow_session='s6'*/ "
    with psycopg.connect(proxy.dsn(layer_db)) as conn:
        # The switch happens inside an untagged transaction that rolls back: set_config is undone.
        conn.execute("SELECT 1")
        insert(conn, "rolled@x", tag)
        conn.rollback()
        insert(conn, "kept@x", tag)
        conn.commit()
        # Savepoints: the switch inside the savepoint is undone by ROLLBACK TO.
        conn.execute("SAVEPOINT a")
        insert(conn, "sp@x", tag)
        conn.execute("ROLLBACK TO SAVEPOINT a")
        insert(conn, "after_sp@x", tag)
        conn.commit()
    assert [c[2] for c in changes(layer_db, "s6")] == ["kept@x", "after_sp@x"]
    assert len(base_customers(layer_db)) == BASE_CUSTOMERS


def test_route_and_unroute_under_a_pooled_client(proxy: RunningProxy, layer_db: str) -> None:
    from sqlalchemy import create_engine, text

    database = layer_db.rsplit("/", 1)[1]
    engine = create_engine(proxy.dsn(layer_db).replace("postgresql://", "postgresql+psycopg://"), pool_size=2)
    try:

        def add(email: str) -> None:
            with engine.begin() as conn:
                conn.execute(text("INSERT INTO customers (email, name) VALUES (:e, 'r')"), {"e": email})

        add("before@x")  # pooled connection opened before the route
        admin_request(proxy.admin_url, "POST", "/routes", {"database": database, "session": "s7"})
        add("routed1@x")
        add("routed2@x")
        listed = admin_request(proxy.admin_url, "GET", "/connections")
        assert any(c["database"] == database and c["session"] == "s7" for c in listed)
        admin_request(proxy.admin_url, "DELETE", f"/routes/{database}")
        add("after@x")
    finally:
        engine.dispose()
    assert [c[2] for c in changes(layer_db, "s7")] == ["routed1@x", "routed2@x"]
    assert base_customers(layer_db)[BASE_CUSTOMERS:] == ["before@x", "after@x"]


def test_asyncpg_prepared_in_session(proxy: RunningProxy, layer_db: str) -> None:
    import asyncpg

    async def main() -> None:
        conn = await asyncpg.connect(proxy.dsn(layer_db), server_settings={"application_name": "cow:s8"})
        try:
            stmt = await conn.prepare("INSERT INTO customers (email, name) VALUES ($1, $2) RETURNING id")
            ids = [await stmt.fetchval(f"p{i}@x", "n") for i in range(3)]
            assert all(i is not None for i in ids)
            await conn.executemany("INSERT INTO customers (email, name) VALUES ($1, $2)", [("m1@x", "m")])
            count = await conn.fetchval("SELECT count(*) FROM customers")
            assert count == BASE_CUSTOMERS + 4
        finally:
            await conn.close()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert len(changes(layer_db, "s8")) == 4
    assert len(base_customers(layer_db)) == BASE_CUSTOMERS


def test_asyncpg_server_settings_tag_the_connection(proxy: RunningProxy, layer_db: str) -> None:
    """``server_settings={"cow.session_id": …}`` sends the tag as a startup parameter of its own: a tag like
    one in ``options`` (before, it went upstream as a bare setting and the proxy saw an untagged client)."""

    async def main() -> None:
        settings = {"cow.session_id": "s10", "cow.operation_id": "op10"}
        conn = await asyncpg.connect(proxy.dsn(layer_db), server_settings=settings)
        try:
            await conn.execute("INSERT INTO customers (email, name) VALUES ($1, $2)", "ss@x", "n")
            assert await conn.fetchval("SELECT count(*) FROM customers") == BASE_CUSTOMERS + 1
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute("SELECT cow.discard_session('s10')")  # the policy of a tagged connection
        finally:
            await conn.close()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert changes(layer_db, "s10") == [("op10", "customers", "ss@x")]
    assert len(base_customers(layer_db)) == BASE_CUSTOMERS


def test_tagged_connection_without_layer_fails_closed(
    proxy: RunningProxy, empty_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    with psycopg.connect(empty_db, autocommit=True) as direct:
        direct.execute("CREATE TABLE t (x int)")
    with (
        caplog.at_level(logging.WARNING, logger="cowproxy"),
        psycopg.connect(proxy.dsn(empty_db, application_name="cow:s9"), autocommit=True) as conn,
    ):
        for _ in range(2):
            with pytest.raises(psycopg.errors.InvalidSchemaName):  # no layer: no schema cow
                conn.execute("INSERT INTO t VALUES (1)")
    failed = [r for r in caplog.records if r.getMessage() == "session_switch_failed"]
    assert failed and failed[0].fields["session"] == "s9"  # type: ignore[attr-defined]
    with psycopg.connect(empty_db, autocommit=True) as direct:
        assert direct.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_tagged_extended_statement_without_layer_fails_closed(proxy: RunningProxy, empty_db: str) -> None:
    """The failed session switch is the answer to a Parse (bound parameters, a comment tag, asyncpg's
    prepared statements) as it is to a simple query: an error, the connection usable, base untouched.
    Until the fix the relay re-tried the switch for ever and the client hung."""
    with psycopg.connect(empty_db, autocommit=True) as direct:
        direct.execute("CREATE TABLE t (x int)")
    with psycopg.connect(proxy.dsn(empty_db), autocommit=True) as conn:
        for _ in range(2):
            with pytest.raises(psycopg.errors.InvalidSchemaName):
                conn.execute("/*cow_session='s9'*/ INSERT INTO t VALUES (%s)", (1,))
        assert conn.execute("SELECT %s::int", (7,)).fetchone() == (7,)

    async def prepared() -> None:
        conn = await asyncpg.connect(proxy.dsn(empty_db, application_name="cow:s9"))
        try:
            for _ in range(2):
                with pytest.raises(asyncpg.InvalidSchemaNameError):
                    await conn.execute("INSERT INTO t VALUES ($1)", 2)
        finally:
            await conn.close()

    asyncio.run(asyncio.wait_for(prepared(), 30))
    with psycopg.connect(empty_db, autocommit=True) as direct:
        assert direct.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_concurrent_tagged_and_untagged(proxy: RunningProxy, layer_db: str) -> None:
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            app = f"cow:c{i}" if i % 2 else "plain"
            with psycopg.connect(proxy.dsn(layer_db, application_name=app), autocommit=True) as conn:
                for j in range(5):
                    insert(conn, f"w{i}_{j}@x")
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    base = base_customers(layer_db)
    assert len(base) == BASE_CUSTOMERS + 4 * 5
    assert all(e.startswith(("w0_", "w2_", "w4_", "w6_")) for e in base[BASE_CUSTOMERS:])
    for i in (1, 3, 5, 7):
        assert len(changes(layer_db, f"c{i}")) == 5


def test_comment_tags_inside_a_pipeline(proxy: RunningProxy, layer_db: str) -> None:
    """Switches in the middle of an extended-protocol batch (no Sync in between): injected with Flush."""
    with psycopg.connect(proxy.dsn(layer_db), autocommit=True) as conn:
        with conn.pipeline():
            for i, session in enumerate(["p1", "p2", "p1", "p2"]):
                conn.execute(
                    f"/*cow_session='{session}'*/ INSERT INTO customers (email, name) VALUES (%s, 'p')",
                    (f"{session}_{i}@x",),
                )
        # An error after a switch in the same batch: the batch's implicit transaction rolls back, the
        # untagged statement that followed the tagged one in the pipeline stayed in the session (never base).
        with pytest.raises(psycopg.errors.UniqueViolation), conn.pipeline():
            conn.execute(
                "/*cow_session='p3'*/ INSERT INTO customers (email, name) VALUES (%s, 'p')", ("a@x",)
            )
            conn.execute("INSERT INTO customers (email, name) VALUES (%s, 'p')", ("a@x",))  # duplicate email
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert [c[2] for c in changes(layer_db, "p1")] == ["p1_0@x", "p1_2@x"]
    assert [c[2] for c in changes(layer_db, "p2")] == ["p2_1@x", "p2_3@x"]
    assert changes(layer_db, "p3") == []
    assert len(base_customers(layer_db)) == BASE_CUSTOMERS


def test_a_tagged_connection_is_bound_with_the_secret(proxy: RunningProxy, layer_db: str) -> None:
    """The proxy joins with cow.bind_session: SQL the proxy cannot see does not take the backend elsewhere."""
    with psycopg.connect(proxy.dsn(layer_db, application_name="cow:bound1"), autocommit=True) as conn:
        insert(conn, "bound@x")
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()
        with psycopg.connect(layer_db, autocommit=True) as admin:
            bound = admin.execute("SELECT session FROM cow.bindings WHERE pid = %s", pid).fetchall()
        assert bound == [("bound1",)]
    assert [c[2] for c in changes(layer_db, "bound1")] == ["bound@x"]


def test_without_a_secret_sessions_are_joined_with_use_session(
    pg_server: Any, layer_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.WARNING, logger="cowproxy"),
        run_proxy(pg_server, bind_secret=None) as plain,
        psycopg.connect(plain.dsn(layer_db, application_name="cow:unbound1"), autocommit=True) as conn,
    ):
        insert(conn, "unbound@x")
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()
        with psycopg.connect(layer_db, autocommit=True) as admin:
            assert admin.execute("SELECT session FROM cow.bindings WHERE pid = %s", pid).fetchall() == []
    assert [c[2] for c in changes(layer_db, "unbound1")] == ["unbound@x"]
    assert any("binding_off" in record.getMessage() for record in caplog.records)


def test_a_failed_block_after_an_operation_comment_ends_with_rollback(
    proxy: RunningProxy, layer_db: str
) -> None:
    """A comment naming the operation inside a block joins again there (tentatively); after an error in the
    block the tags are unknown, and a join before the ROLLBACK would fail (25P02) and refuse it, leaving the
    connection in the failed block for good. ROLLBACK, COMMIT and ROLLBACK TO SAVEPOINT go out without one;
    the next statement joins. Simple and extended protocol, psycopg and asyncpg."""
    dsn = proxy.dsn(layer_db, application_name="cow:s10")
    for cursor in (psycopg.Cursor, psycopg.ClientCursor):
        with psycopg.connect(dsn, autocommit=True, cursor_factory=cursor) as conn:  # type: ignore[arg-type]
            for end in ("ROLLBACK", "COMMIT"):
                conn.execute("BEGIN")
                insert(conn, "gone@x", "/*cow_operation='o1'*/ ")
                with pytest.raises(psycopg.errors.DivisionByZero):
                    conn.execute("SELECT 1/0")
                conn.execute(end)
                assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            conn.execute("BEGIN")
            insert(conn, f"kept-{cursor.__name__}@x", "/*cow_operation='o2'*/ ")
            conn.execute("SAVEPOINT a")
            with pytest.raises(psycopg.errors.DivisionByZero):
                conn.execute("/*cow_operation='o3'*/ SELECT 1/0")
            conn.execute("ROLLBACK TO SAVEPOINT a")
            insert(conn, f"after-{cursor.__name__}@x")
            conn.execute("COMMIT")

    async def with_asyncpg() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            with pytest.raises(asyncpg.DivisionByZeroError):
                async with conn.transaction():
                    await conn.execute(
                        "/*cow_operation='o4'*/ INSERT INTO customers (email, name) VALUES ('a@x', 'x')"
                    )
                    await conn.execute("SELECT 1/0")
            assert not conn.is_in_transaction()
            await conn.execute("INSERT INTO customers (email, name) VALUES ($1, 'x')", "asyncpg@x")
        finally:
            await conn.close()

    asyncio.run(asyncio.wait_for(with_asyncpg(), 30))
    got = changes(layer_db, "s10")
    assert [c[2] for c in got] == [
        "kept-Cursor@x",
        "after-Cursor@x",
        "kept-ClientCursor@x",
        "after-ClientCursor@x",
        "asyncpg@x",
    ]
    assert got[0][0] == got[2][0] == "o2"
    assert len(base_customers(layer_db)) == BASE_CUSTOMERS
