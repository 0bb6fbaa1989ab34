"""Server connections reused across client connections (``server_reuse``), against PostgreSQL over real
sockets: reuse happens, the reset resets, a backend bound to a session never serves another client still
bound, what is not idle or was challenged is not pooled, cancel and ParameterStatus as for a new backend,
the limits."""

from __future__ import annotations

import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from proxy import protocol as p
from proxy.pool import UNBOUND_CHECK_SQL
from tests.fix_db import TEST_BIND_SECRET, PgServer
from tests.fix_proxy import RunningProxy, backends, run_proxy
from tests.proxy.test_adversity import RawClient, dbname, wait_for
from tests.proxy.test_startup import METHODS, password_users  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(params=[True, False], ids=["fast-relay", "python-relay"])
def reuse(pg_server: PgServer, request: pytest.FixtureRequest) -> Iterator[RunningProxy]:
    with run_proxy(pg_server, server_reuse=True, fast_relay=request.param) as running:
        yield running


def idle(proxy: RunningProxy) -> int:
    return proxy.run(lambda: len(proxy.server.pool) if proxy.server.pool is not None else 0)


def pid_of(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def one(conn: psycopg.Connection[Any], sql: str, *args: Any) -> Any:
    row = conn.execute(sql, args or None).fetchone()
    assert row is not None
    return row[0]


def leave(proxy: RunningProxy, conn: psycopg.Connection[Any], pooled: int = 1) -> None:
    """Close ``conn`` and wait until the pool holds ``pooled`` reset connections."""
    conn.close()
    assert wait_for(lambda: idle(proxy) == pooled), f"pool has {idle(proxy)}, expected {pooled}"


def test_the_next_client_gets_the_same_backend(reuse: RunningProxy, empty_db: str) -> None:
    dsn = reuse.dsn(empty_db)
    conn = psycopg.connect(dsn, autocommit=True)
    pid = pid_of(conn)
    leave(reuse, conn)
    with psycopg.connect(dsn, autocommit=True) as again:
        assert pid_of(again) == pid
        assert idle(reuse) == 0
        # A second client at once opens a backend of its own.
        with psycopg.connect(dsn, autocommit=True) as other:
            assert pid_of(other) != pid
    m = reuse.server.metrics
    assert (m.servers_reused, m.servers_opened) == (1, 2)
    assert wait_for(lambda: idle(reuse) == 2)
    assert reuse.run(reuse.server._idle_servers) == {dbname(empty_db): 2}
    # Another startup (here another application_name) is another key: a new backend.
    with psycopg.connect(dsn, autocommit=True, application_name="other") as other:
        assert pid_of(other) not in (pid, 0)


def test_the_reset_leaves_nothing_of_the_last_client(
    reuse: RunningProxy, pg_server: PgServer, empty_db: str
) -> None:
    with psycopg.connect(empty_db, autocommit=True) as admin:
        admin.execute("DROP ROLE IF EXISTS cow_pool_role")
        admin.execute("CREATE ROLE cow_pool_role")
    dsn = reuse.dsn(empty_db)
    conn = psycopg.connect(dsn, autocommit=True)
    pid = pid_of(conn)
    default_work_mem = one(conn, "SHOW work_mem")
    conn.execute("SET work_mem = '77MB'")
    conn.execute("SELECT set_config('cow.session_id', 'leftover', false)")  # the layer's GUC
    conn.execute("PREPARE leftover AS SELECT 1")
    conn.execute("LISTEN leftover")
    conn.execute("SELECT pg_advisory_lock(4242)")
    conn.execute("SET ROLE cow_pool_role")
    with conn.transaction():
        conn.execute("DECLARE leftover CURSOR WITH HOLD FOR SELECT 1")
    assert one(conn, "SELECT current_user") == "cow_pool_role"
    leave(reuse, conn)
    with psycopg.connect(dsn, autocommit=True) as again:
        assert pid_of(again) == pid
        assert one(again, "SHOW work_mem") == default_work_mem
        assert one(again, "SELECT current_setting('cow.session_id', true)") in (None, "")
        assert one(again, "SELECT count(*) FROM pg_prepared_statements") == 0
        assert one(again, "SELECT count(*) FROM pg_listening_channels()") == 0
        assert one(again, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s", pid) == 0
        assert one(again, "SELECT current_user") == "postgres"
        assert one(again, "SELECT count(*) FROM pg_cursors") == 0
        # The lock is free for others.
        with psycopg.connect(pg_server.dsn_for(dbname(empty_db)), autocommit=True) as direct:
            assert one(direct, "SELECT pg_try_advisory_lock(4242)") is True


@pytest.mark.parametrize("database", ["empty_db", "layer_db"])
def test_a_client_that_made_temporary_tables_leaves_its_backend_for_the_next(
    reuse: RunningProxy, database: str, request: pytest.FixtureRequest
) -> None:
    # DISCARD ALL drops them but the backend keeps its temporary schema, as a bind's: without the layer
    # nothing can have bound it; with the layer, the layer says it is not bound (its binding row).
    db = request.getfixturevalue(database)
    dsn = reuse.dsn(db)
    conn = psycopg.connect(dsn, autocommit=True)
    pid = pid_of(conn)
    conn.execute("CREATE TEMP TABLE leftover (x int)")
    conn.execute("INSERT INTO leftover VALUES (1)")
    leave(reuse, conn)
    with psycopg.connect(dsn, autocommit=True) as again:
        assert pid_of(again) == pid
        assert one(again, "SELECT to_regclass('pg_temp.leftover')") is None
        again.execute("CREATE TEMP TABLE leftover (y text)")  # (the name is free)
        if database == "layer_db":
            assert one(again, "SELECT cow.current_session()") is None
            assert one(again, "SELECT cow.bound_session()") is None
    assert reuse.server.metrics.server_reset_failures == 0
    assert reuse.server.metrics.servers_reused == 1


def test_a_backend_the_client_bound_itself_is_not_reused(
    reuse: RunningProxy, pg_server: PgServer, layer_db: str
) -> None:
    # An untagged client that knows the secret binds its backend: the proxy joined no session, but the
    # layer's check finds the binding, and the backend is closed rather than given to anyone.
    conn = psycopg.connect(reuse.dsn(layer_db), autocommit=True)
    pid = pid_of(conn)
    assert one(conn, "SELECT cow.bind_session('pool-own', NULL, %s)", TEST_BIND_SECRET) is not None
    assert one(conn, "SELECT cow.bound_session()") == "pool-own"
    conn.close()
    assert wait_for(lambda: reuse.server.metrics.server_reset_failures == 1)
    assert idle(reuse) == 0
    with psycopg.connect(reuse.dsn(layer_db), autocommit=True) as again:
        assert pid_of(again) != pid
        assert one(again, "SELECT cow.bound_session()") is None
    with psycopg.connect(pg_server.dsn_for(dbname(layer_db)), autocommit=True) as direct:
        assert wait_for(lambda: one(direct, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", pid) == 0)


def _session_dsn(proxy: RunningProxy, db: str, session: str) -> str:
    return proxy.dsn(db, options=f"-c%20cow.session_id%3D{session}")


def test_a_backend_bound_to_a_session_serves_no_one_still_bound(reuse: RunningProxy, layer_db: str) -> None:
    agent = psycopg.connect(_session_dsn(reuse, layer_db, "pool-s1"), autocommit=True)
    pid = pid_of(agent)
    assert one(agent, "SELECT cow.bound_session()") == "pool-s1"
    agent.execute("INSERT INTO customers (email, name) VALUES ('pool@x', 'p')")
    agent.execute("SET work_mem = '5MB'")  # (a SET in a session: reset too)
    leave(reuse, agent)
    # An untagged client on the same backend: unbound, no session, the base rows only.
    with psycopg.connect(reuse.dsn(layer_db), autocommit=True) as plain:
        assert pid_of(plain) == pid
        assert one(plain, "SELECT cow.bound_session()") is None
        assert one(plain, "SELECT cow.current_session()") is None
        assert one(plain, "SELECT count(*) FROM customers WHERE email = 'pool@x'") == 0
    assert wait_for(lambda: idle(reuse) == 1)
    # Another session's client on it: bound to its own session, which does not see the first one's row.
    with psycopg.connect(_session_dsn(reuse, layer_db, "pool-s2"), autocommit=True) as other:
        assert pid_of(other) == pid
        assert one(other, "SELECT cow.bound_session()") == "pool-s2"
        assert one(other, "SELECT count(*) FROM customers WHERE email = 'pool@x'") == 0
    assert wait_for(lambda: idle(reuse) == 1)
    # The first session again: its row is there (it lives in the session, not the backend).
    with psycopg.connect(_session_dsn(reuse, layer_db, "pool-s1"), autocommit=True) as back:
        assert pid_of(back) == pid
        assert one(back, "SELECT count(*) FROM customers WHERE email = 'pool@x'") == 1
    with psycopg.connect(layer_db, autocommit=True) as direct:
        assert one(direct, "SELECT count(*) FROM public.customers WHERE email = 'pool@x'") == 0
    assert reuse.server.metrics.server_reset_failures == 0


def test_a_session_without_a_secret_is_reset_and_a_backend_that_cannot_unbind_is_closed(
    pg_server: PgServer, layer_db: str
) -> None:
    # A proxy without a secret joins with cow.use_session (the GUCs only): nothing to unbind, the reset's
    # check finds the backend unbound and it is reused. A backend bound by a proxy whose secret the layer no
    # longer takes (rotated meanwhile) cannot be unbound: its reset fails and it is closed.
    with run_proxy(pg_server, server_reuse=True, bind_secret=None) as proxy:
        agent = psycopg.connect(_session_dsn(proxy, layer_db, "pool-s3"), autocommit=True)
        pid = pid_of(agent)
        assert one(agent, "SELECT cow.current_session()") == "pool-s3"
        assert one(agent, "SELECT cow.bound_session()") is None
        leave(proxy, agent)
        with psycopg.connect(proxy.dsn(layer_db), autocommit=True) as plain:
            assert pid_of(plain) == pid
            assert one(plain, "SELECT cow.current_session()") is None
    with run_proxy(pg_server, server_reuse=True) as proxy:
        agent = psycopg.connect(_session_dsn(proxy, layer_db, "pool-s4"), autocommit=True)
        pid = pid_of(agent)
        assert one(agent, "SELECT cow.bound_session()") == "pool-s4"
        with psycopg.connect(layer_db, autocommit=True) as owner:
            owner.execute("SELECT cow.set_bind_secret('another-secret-of-twenty')")
        agent.close()
        assert wait_for(lambda: proxy.server.metrics.server_reset_failures == 1)
        assert idle(proxy) == 0
        with psycopg.connect(layer_db, autocommit=True) as direct:
            assert wait_for(
                lambda: one(direct, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", pid) == 0
            )


def test_a_client_leaving_mid_transaction_or_mid_query_is_not_pooled(
    reuse: RunningProxy, pg_server: PgServer, empty_db: str
) -> None:
    db = dbname(empty_db)
    # Mid-transaction, with a Terminate.
    conn = psycopg.connect(reuse.dsn(empty_db))
    conn.execute("SELECT 1")  # (psycopg opened a block)
    conn.close()
    assert wait_for(lambda: backends(pg_server, db) == 0), "kept mid-transaction"
    # Mid-query: a Query, then the socket closed before its reply. (A Terminate right after the Query is
    # read by the C relay only once the Query is answered: the backend is idle by then, and reused.)
    raw = RawClient(reuse.host, reuse.port, db)
    raw.sock.sendall(p.encode_query("SELECT pg_sleep(0.3)"))
    time.sleep(0.1)
    raw.sock.close()
    assert wait_for(lambda: backends(pg_server, db) == 0), "kept mid-query"
    # Mid-COPY FROM STDIN, the socket closed.
    raw = RawClient(reuse.host, reuse.port, db)
    raw.sock.sendall(p.encode_query("COPY (SELECT 1) TO STDOUT"))
    raw.read_until(b"Z")
    raw.sock.sendall(p.encode_query("CREATE TABLE IF NOT EXISTS c (x int)"))
    raw.read_until(b"Z")
    raw.sock.sendall(p.encode_query("COPY c FROM STDIN"))
    raw.read_until(b"G")
    raw.sock.close()
    assert wait_for(lambda: backends(pg_server, db) == 0), "a backend that was not idle was kept"
    assert idle(reuse) == 0
    assert reuse.server.metrics.servers_reused == 0


def test_cancel_reaches_the_reused_backend(reuse: RunningProxy, empty_db: str) -> None:
    dsn = reuse.dsn(empty_db)
    conn = psycopg.connect(dsn, autocommit=True)
    pid = pid_of(conn)
    leave(reuse, conn)
    with psycopg.connect(dsn, autocommit=True) as again:
        assert again.info.backend_pid == pid  # (from the BackendKeyData the proxy replayed)
        assert pid_of(again) == pid
        # cancel_safe: the blocking cancel() holds the GIL, which would stall the in-process proxy.
        timer = threading.Timer(0.5, again.cancel_safe)
        timer.start()
        started = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled):
            again.execute("SELECT pg_sleep(20)")
        timer.join()
        assert time.monotonic() - started < 10
        assert one(again, "SELECT 1") == 1


class GreetedClient(RawClient):
    """A RawClient that keeps what authentication sent."""

    def __init__(self, host: str, port: int, database: str, **params: str) -> None:
        self.sock = socket.create_connection((host, port), timeout=10)
        startup = p.StartupMessage(
            p.PROTOCOL_3_0, (("user", "postgres"), ("database", database), *params.items())
        )
        self.sock.sendall(startup.encode())
        self.params: list[tuple[str, str]] = []
        self.pid = 0
        for kind, body in self.read_until(b"Z"):
            if kind == b"S":
                self.params.append(p.decode_parameter_status(body))
            elif kind == b"K":
                self.pid = struct.unpack("!I", body[:4])[0]

    def bye(self) -> None:
        self.sock.sendall(p.TERMINATE)
        self.sock.close()


def on_c_relay(proxy: RunningProxy) -> bool:
    """Whether the proxy's one client connection is on the C relay (it goes there once idle)."""

    def relays() -> list[bool]:
        return [c.fast for c in proxy.server.connections.values()]

    return wait_for(lambda: proxy.run(relays) == [True], 5)


def test_the_reused_backends_parameter_status_is_a_new_backends(
    reuse: RunningProxy, pg_server: PgServer, empty_db: str
) -> None:
    db = dbname(empty_db)
    startup = {"application_name": "greet", "DateStyle": "ISO, DMY"}
    direct = GreetedClient(pg_server.host, pg_server.port, db, **startup)
    direct.bye()
    first = GreetedClient(reuse.host, reuse.port, db, **startup)
    assert first.params == direct.params
    if reuse.server.fast is not None:
        assert on_c_relay(reuse)  # (so the C relay moves the SETs' replies)
    # What the client changes, the reset puts back (and the server reports it, the pool takes it).
    first.query("SET application_name = 'changed'")
    first.query("SET DateStyle = 'German'")
    first.query("SET TimeZone = 'Asia/Tokyo'")
    first.query("SET IntervalStyle = 'iso_8601'")
    first.query("SET standard_conforming_strings = off")
    first.bye()
    assert wait_for(lambda: idle(reuse) == 1)
    second = GreetedClient(reuse.host, reuse.port, db, **startup)
    assert second.pid == first.pid
    assert second.params == direct.params  # (names, values and order)
    assert dict(second.params)["DateStyle"] == "ISO, DMY"
    second.bye()


def test_a_value_reported_mid_session_that_the_reset_keeps_reaches_the_next_client(
    reuse: RunningProxy, pg_server: PgServer, empty_db: str
) -> None:
    """A reload changes a reported setting under a client (PostgreSQL reports it at the next statement's
    end); DISCARD ALL resets to that same value, so the reset reports nothing: only the value the relay saw
    go by tells the next client the backend's truth (as a new backend's startup would)."""
    if not pg_server.disposable:
        pytest.skip("changes the server's configuration (ALTER SYSTEM, reload): only on a server tests own")
    db = dbname(empty_db)
    first = GreetedClient(reuse.host, reuse.port, db)
    assert dict(first.params)["application_name"] == ""
    if reuse.server.fast is not None:
        assert on_c_relay(reuse)
    with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
        try:
            admin.execute("ALTER SYSTEM SET application_name = 'from-reload'")
            admin.execute("SELECT pg_reload_conf()")

            def reported() -> bool:
                seen = first.query("SHOW application_name")
                return (b"S", p.encode_parameter_status("application_name", "from-reload")[5:]) in seen

            assert wait_for(reported, 5)
            first.bye()
            assert wait_for(lambda: idle(reuse) == 1)
            direct = GreetedClient(pg_server.host, pg_server.port, db)
            direct.bye()
            second = GreetedClient(reuse.host, reuse.port, db)
            assert second.pid == first.pid
            assert dict(second.params)["application_name"] == "from-reload"
            assert second.params == direct.params
            second.bye()
        finally:
            admin.execute("ALTER SYSTEM RESET application_name")
            admin.execute("SELECT pg_reload_conf()")


def test_an_idle_server_connection_is_closed_after_the_idle_timeout(
    pg_server: PgServer, empty_db: str
) -> None:
    db = dbname(empty_db)
    with run_proxy(pg_server, server_reuse=True, server_idle_timeout=0.4) as proxy:
        conn = psycopg.connect(proxy.dsn(empty_db), autocommit=True)
        leave(proxy, conn)
        assert backends(pg_server, db) == 1
        assert wait_for(lambda: backends(pg_server, db) == 0)
        assert idle(proxy) == 0
        assert proxy.server.metrics.servers_closed_idle == {"idle timeout": 1}


def test_a_backend_that_died_while_idle_is_not_handed_out(
    reuse: RunningProxy, pg_server: PgServer, empty_db: str
) -> None:
    dsn = reuse.dsn(empty_db)
    conn = psycopg.connect(dsn, autocommit=True)
    pid = pid_of(conn)
    leave(reuse, conn)
    with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        # (a backend still ending can be handed out, as by any pool: the check sees only a dead one)
        gone = "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = %s"
        assert wait_for(lambda: one(admin, gone, pid) is True)
    # Whether the loop saw its FATAL yet or the check before reuse finds it: a new backend, no error.
    with psycopg.connect(dsn, autocommit=True) as again:
        assert pid_of(again) != pid
    assert reuse.server.metrics.servers_reused == 0


def _last_query(pg_server: PgServer, db: str, pid: int) -> str:
    with psycopg.connect(pg_server.dsn_for(db), autocommit=True) as direct:
        return str(one(direct, "SELECT query FROM pg_stat_activity WHERE pid = %s", pid))


def test_a_connection_idle_past_the_check_delay_answers_an_empty_query_first(
    pg_server: PgServer, empty_db: str
) -> None:
    db = dbname(empty_db)
    for delay, last in ((0.0, ""), (30.0, UNBOUND_CHECK_SQL)):
        with run_proxy(pg_server, server_reuse=True, server_check_delay=delay) as proxy:
            first = GreetedClient(proxy.host, proxy.port, db)
            first.bye()
            assert wait_for(lambda: idle(proxy) == 1)
            second = GreetedClient(proxy.host, proxy.port, db)  # (it sends no statement)
            assert second.pid == first.pid
            assert _last_query(pg_server, db, second.pid) == last  # the check's, or the reset's
            second.bye()


def test_a_connection_that_does_not_answer_its_check_is_closed_and_the_client_gets_another(
    pg_server: PgServer, empty_db: str
) -> None:
    # A backend that stops answering (SIGSTOP: as a host gone, or a flow a NAT dropped, which no peek can
    # see) is found by the check within connect_timeout; the client gets a new backend, no error.
    if pg_server.host not in ("127.0.0.1", "localhost", "::1"):
        pytest.skip("stops a backend with a signal: the server must run on this machine")
    with run_proxy(pg_server, server_reuse=True, server_check_delay=0, connect_timeout=0.5) as proxy:
        conn = psycopg.connect(proxy.dsn(empty_db), autocommit=True)
        pid = pid_of(conn)
        leave(proxy, conn)
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with psycopg.connect(proxy.dsn(empty_db), autocommit=True) as again:
                assert pid_of(again) != pid
            assert time.monotonic() - started < 4
            assert proxy.server.metrics.servers_closed_idle == {"check failed": 1}
            assert proxy.server.metrics.servers_reused == 0
        finally:
            os.kill(pid, signal.SIGCONT)


def test_the_limits_and_shutdown_close_idle_connections(pg_server: PgServer, empty_db: str) -> None:
    db = dbname(empty_db)
    with run_proxy(pg_server, server_reuse=True, server_idle_per_startup=2) as proxy:
        conns = [psycopg.connect(proxy.dsn(empty_db), autocommit=True) for _ in range(3)]
        for conn in conns:
            conn.close()
        assert wait_for(lambda: idle(proxy) == 2 and backends(pg_server, db) == 2)
        proxy.call(proxy.server.drain(1))
        assert wait_for(lambda: backends(pg_server, db) == 0)
        assert proxy.server.metrics.servers_closed_idle == {"pool full": 1, "shutdown": 2}


def test_off_by_default_a_backend_ends_with_its_client(
    proxy: RunningProxy, pg_server: PgServer, empty_db: str
) -> None:
    conn = psycopg.connect(proxy.dsn(empty_db), autocommit=True)
    conn.close()
    assert wait_for(lambda: backends(pg_server, dbname(empty_db)) == 0)
    assert proxy.server.pool is None


def test_a_challenged_startup_is_never_pooled(pg_server: PgServer, password_users: str) -> None:  # noqa: F811
    with run_proxy(pg_server, server_reuse=True) as proxy:
        for user in METHODS:
            dsn = f"postgresql://{user}:pw-{user}@{proxy.host}:{proxy.port}/postgres"
            pids = []
            for _ in range(2):
                with psycopg.connect(dsn, autocommit=True) as conn:
                    pids.append(pid_of(conn))
                time.sleep(0.1)
            assert pids[0] != pids[1]
        assert idle(proxy) == 0
        assert proxy.server.metrics.servers_reused == 0
