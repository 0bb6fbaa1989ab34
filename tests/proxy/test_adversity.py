"""Adversity: clients and servers that vanish, stall or misbehave. No hang, no leaked upstream backend,
other clients keep working, and nothing from a tagged session lands in the base tables."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from urllib.parse import urlsplit

import psycopg
import pytest

from proxy import protocol as p
from tests.fix_db import PgServer
from tests.fix_proxy import RunningProxy, backends, run_proxy
from tests.proxy.faults import faulty_relay

BOTH_RELAYS = True  # untagged traffic: run on the C relay and on the Python relay
pytestmark = pytest.mark.timeout(120)


def dbname(dsn: str) -> str:
    return urlsplit(dsn).path.lstrip("/")


def wait_for(predicate: Callable[[], bool], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


class RawClient:
    """A client speaking the protocol by hand, to misbehave precisely."""

    def __init__(self, host: str, port: int, database: str, **params: str) -> None:
        self.sock = socket.create_connection((host, port), timeout=10)
        startup = p.StartupMessage(
            p.PROTOCOL_3_0, (("user", "postgres"), ("database", database), *params.items())
        )
        self.sock.sendall(startup.encode())
        self.read_until(b"Z")

    def read_message(self) -> tuple[bytes, bytes]:
        header = self._exact(5)
        (length,) = struct.unpack("!I", header[1:])
        return header[:1], self._exact(length - 4)

    def _exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return bytes(buf)

    def read_until(self, kind: bytes) -> list[tuple[bytes, bytes]]:
        seen = []
        while True:
            msg = self.read_message()
            seen.append(msg)
            if msg[0] == kind:
                return seen

    def query(self, sql: str) -> list[tuple[bytes, bytes]]:
        self.sock.sendall(p.encode_query(sql))
        return self.read_until(b"Z")

    def abort(self) -> None:
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


def test_client_gone_mid_transaction_and_mid_copy(
    proxy: RunningProxy, layer_db: str, pg_server: PgServer
) -> None:
    db = dbname(layer_db)
    # Tagged, mid-transaction.
    c = RawClient(proxy.host, proxy.port, db, application_name="cow:gone")
    c.query("BEGIN")
    c.query("INSERT INTO customers (email, name) VALUES ('gone@x', 'g')")
    c.abort()
    # Untagged, mid-COPY: half a row sent.
    c = RawClient(proxy.host, proxy.port, db)
    c.sock.sendall(p.encode_query("COPY customers (email, name) FROM STDIN"))
    c.read_until(b"G")
    c.sock.sendall(p.message(b"d", b"copy@x\tc\nhalf"))
    c.abort()
    assert wait_for(lambda: backends(pg_server, db) == 0), "leaked upstream backend"
    assert wait_for(lambda: not proxy.server.connections)
    with psycopg.connect(layer_db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM public.customers").fetchone() == (3,)
        assert conn.execute("SELECT count(*) FROM cow.session_changes('gone')").fetchone() == (0,)
    with psycopg.connect(proxy.dsn(layer_db), autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_upstream_killed(pg_server: PgServer, empty_db: str, fast_relay: bool) -> None:
    db = dbname(empty_db)
    with (
        faulty_relay(pg_server.host, pg_server.port) as relay,
        run_proxy(pg_server, fast_relay=fast_relay) as proxy,
    ):
        proxy.server.config = replace(
            proxy.server.config, upstream=replace(proxy.server.config.upstream, port=relay.port)
        )
        victim = psycopg.connect(proxy.dsn(empty_db), autocommit=True)
        victim.execute("SELECT 1")
        relay.kill_all()
        with pytest.raises(psycopg.OperationalError):
            victim.execute("SELECT 1")
        victim.close()
        # Killed by the server itself (pg_terminate_backend) too.
        other = psycopg.connect(proxy.dsn(empty_db), autocommit=True)
        pid = other.execute("SELECT pg_backend_pid()").fetchone()
        with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", pid)
        with pytest.raises(psycopg.OperationalError):
            other.execute("SELECT 1")
        other.close()
        assert wait_for(lambda: not proxy.server.connections)
        with psycopg.connect(proxy.dsn(empty_db), autocommit=True) as conn:
            assert conn.execute("SELECT 2").fetchone() == (2,)
    assert wait_for(lambda: backends(pg_server, db) == 0)


def test_upstream_unreachable_is_a_clear_error(pg_server: PgServer, empty_db: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    with run_proxy(pg_server) as proxy:
        proxy.server.config = replace(
            proxy.server.config, upstream=replace(proxy.server.config.upstream, port=dead)
        )
        with pytest.raises(psycopg.OperationalError, match="cannot connect to upstream"):
            psycopg.connect(proxy.dsn(empty_db))


def test_slow_reader_is_backpressured(proxy: RunningProxy, empty_db: str, pg_server: PgServer) -> None:
    """A client that reads a 100 MB result slowly: the proxy buffers a bounded amount, others go on."""
    size = 100 * 1024 * 1024
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        for conn in list(proxy.server.connections.values()):
            buffered = conn.reader.buffered
            if conn.transport is not None:
                buffered += conn.transport.get_write_buffer_size()
            if conn.upstream is not None and conn.upstream.transport is not None:
                buffered += conn.upstream.transport.get_write_buffer_size()
            peak[0] = max(peak[0], buffered)

    def sampler() -> None:
        while not stop.is_set():
            proxy.loop.call_soon_threadsafe(sample)
            time.sleep(0.02)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    try:
        c = RawClient(proxy.host, proxy.port, dbname(empty_db))
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        c.sock.sendall(p.encode_query(f"SELECT repeat('x', {size})"))
        time.sleep(1)  # stall: the server keeps sending, the proxy must stop reading it
        with psycopg.connect(proxy.dsn(empty_db), autocommit=True) as other:
            assert other.execute("SELECT 3").fetchone() == (3,)
        got = 0
        while True:
            kind, body = c.read_message()
            if kind == b"D":
                (n,) = struct.unpack_from("!i", body, 2)
                got = n
            if kind == b"Z":
                break
        assert got == size
        c.sock.close()
    finally:
        stop.set()
        thread.join(5)
    assert peak[0] < 16 * 1024 * 1024, f"proxy buffered {peak[0]} bytes"


def test_large_copy_in_streams(proxy: RunningProxy, empty_db: str) -> None:
    size = 100 * 1024 * 1024
    with psycopg.connect(proxy.dsn(empty_db), autocommit=True) as conn:
        conn.execute("CREATE TABLE big (v text)")
        with conn.cursor().copy("COPY big FROM STDIN") as copy:
            copy.write(b"y" * size + b"\n")
        assert conn.execute("SELECT length(v) FROM big").fetchone() == (size,)


def test_malformed_and_oversized_messages(pg_server: PgServer, layer_db: str, fast_relay: bool) -> None:
    db = dbname(layer_db)
    with run_proxy(pg_server, max_message_size=1024 * 1024, fast_relay=fast_relay) as proxy:
        # Oversized query, parse and copy data: ErrorResponse 54000, the connection keeps working.
        dsn = proxy.dsn(layer_db, application_name="cow:big")
        with psycopg.connect(dsn, autocommit=True) as conn:
            big = "x" * (2 * 1024 * 1024)
            with pytest.raises(psycopg.Error) as info:
                conn.execute(f"INSERT INTO customers (email, name) VALUES ('big@x', '{big}')", prepare=False)
            assert info.value.sqlstate == "54000"
            with pytest.raises(psycopg.Error) as info:
                conn.execute("INSERT INTO customers (email, name) VALUES ('big2@x', %s)", (big,))
            assert info.value.sqlstate == "54000"
            conn.execute("INSERT INTO customers (email, name) VALUES ('small@x', 's')")
        # One oversized CopyData message (psycopg would split it): the COPY fails, the connection lives.
        c = RawClient(proxy.host, proxy.port, db)
        c.sock.sendall(p.encode_query("COPY nopk (y) FROM STDIN"))
        c.read_until(b"G")
        c.sock.sendall(p.message(b"d", big.encode() + b"\n") + p.message(b"c"))
        replies = c.read_until(b"Z")
        errors = [p.decode_error(body).sqlstate for kind, body in replies if kind == b"E"]
        assert errors == ["54000"]
        assert c.query("SELECT count(*) FROM nopk")[1] == (b"D", b"\x00\x01\x00\x00\x00\x011")
        c.sock.close()
        # Garbage after authentication: a FATAL protocol error, the upstream backend goes away.
        c = RawClient(proxy.host, proxy.port, db)
        c.sock.sendall(b"Q\x00\x00\x00\x01")
        kind, body = c.read_message()
        assert kind == b"E" and p.decode_error(body).sqlstate == "08P01"
        c.sock.close()
        # Garbage as a startup packet.
        with socket.create_connection((proxy.host, proxy.port), timeout=5) as s:
            s.sendall(b"\x00\x00\x00\x08\x00\x09\x00\x00")
            assert s.recv(1) == b"E"
        assert wait_for(lambda: not proxy.server.connections)
    assert wait_for(lambda: backends(pg_server, db) == 0)
    with psycopg.connect(layer_db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM public.customers").fetchone() == (3,)
        assert conn.execute("SELECT count(*) FROM public.nopk").fetchone() == (1,)
        rows = conn.execute("SELECT row_data->>'email' FROM cow.session_changes('big')").fetchall()
        assert rows == [("small@x",)]


def test_untagged_query_framing_is_checked_on_the_fast_path(proxy: RunningProxy, empty_db: str) -> None:
    """A whole untagged Query takes the fast path only if it is what decode_query accepts."""
    db = dbname(empty_db)
    c = RawClient(proxy.host, proxy.port, db)
    assert c.query("SELECT 'é'")[1] == (b"D", b"\x00\x01\x00\x00\x00\x02" + "é".encode())
    c.sock.sendall(p.message(b"Q", b"SELECT 1\0SELECT 2\0"))  # a NUL inside the text
    kind, body = c.read_message()
    assert kind == b"E" and p.decode_error(body).sqlstate == "08P01"
    c.sock.close()
    c = RawClient(proxy.host, proxy.port, db)
    c.sock.sendall(p.message(b"Q", b"SELECT '\xff'\0"))  # not UTF-8
    kind, body = c.read_message()
    assert kind == b"E" and p.decode_error(body).sqlstate == "08P01"
    c.sock.close()
    assert wait_for(lambda: not proxy.server.connections)


def test_many_concurrent_connections(proxy: RunningProxy, empty_db: str, pg_server: PgServer) -> None:
    import asyncpg

    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        row = conn.execute("SHOW max_connections").fetchone()
        used = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
        ).fetchone()
    assert row is not None and used is not None
    # 500 on the embedded server (max_connections=600); on a smaller server, max_connections - 20 - in use.
    count = min(500, int(row[0]) - 20 - int(used[0]))
    dsn = proxy.dsn(empty_db)

    async def one(i: int) -> int:
        conn = await asyncpg.connect(dsn, timeout=60)
        try:
            return int(await conn.fetchval("SELECT $1::int", i))
        finally:
            await conn.close()

    async def main() -> list[int]:
        sem = asyncio.Semaphore(count)

        async def limited(i: int) -> int:
            async with sem:
                return await one(i)

        return await asyncio.gather(*(limited(i) for i in range(count)))

    results = asyncio.run(asyncio.wait_for(main(), 100))
    assert sorted(results) == list(range(count))
    assert wait_for(lambda: backends(pg_server, dbname(empty_db)) == 0, 20)


def test_copy_from_stdin_over_the_extended_protocol(proxy: RunningProxy, layer_db: str) -> None:
    """libpq's order for a COPY sent with the extended protocol: Execute and Sync, the data, CopyDone and
    Sync. The server ignores the first Sync, so one ReadyForQuery answers both; afterwards statements that
    switch sessions by comment (an injected cow.use_session each) must still get their own answers (they
    hung before: the relay owed the first Sync a reply)."""
    c = RawClient(proxy.host, proxy.port, dbname(layer_db))
    try:
        for email in ("copy1@x", "copy2@x"):
            c.sock.sendall(
                p.encode_parse("", "COPY customers (email, name) FROM STDIN")
                + p.encode_bind("", "", ())
                + p.encode_execute()
                + p.SYNC
            )
            assert [k for k, _ in c.read_until(b"G")] == [b"1", b"2", b"G"]
            c.sock.sendall(p.message(b"d", f"{email}\tc\n".encode()) + p.message(b"c") + p.SYNC)
            assert [k for k, _ in c.read_until(b"Z")] == [b"C", b"Z"]
        for i in range(2):
            got = c.query(
                f"/*cow_session='copyx{i}'*/ INSERT INTO customers (email, name) VALUES ('t{i}@x', 't')"
            )
            assert (b"C", b"INSERT 0 1\0") in got
        c.sock.sendall(p.encode_parse("", "SELECT 41 + 1") + p.encode_bind("", "", ()) + p.encode_execute())
        c.sock.sendall(p.SYNC)
        assert [k for k, _ in c.read_until(b"Z")] == [b"1", b"2", b"D", b"C", b"Z"]
    finally:
        c.sock.close()
    with psycopg.connect(layer_db, autocommit=True) as conn:
        emails = conn.execute("SELECT email FROM public.customers WHERE email LIKE '%@x' ORDER BY 1")
        assert emails.fetchall() == [("copy1@x",), ("copy2@x",)]
        sessions = conn.execute(
            "SELECT session_id FROM cow.sessions WHERE session_id LIKE 'copyx%' ORDER BY 1"
        )
        assert sessions.fetchall() == [("copyx0",), ("copyx1",)]
