"""The fast relay (proxy._fastrelay): untagged connections relayed by a C thread, handed back to Python when
Python must decide. Each test first checks that the connection is on the C relay (admin API or metrics)."""

from __future__ import annotations

import re
import socket
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy import protocol as p
from proxy.admin import admin_request
from proxy.analysis import query_kind
from proxy.fastrelay import AVAILABLE, MAX_WRITE_SLOTS, UNAVAILABLE, FastRelay
from proxy.handoff import Adoption
from tests.fix_db import PgServer
from tests.fix_proxy import RunningProxy, backends, run_proxy
from tests.proxy.test_adversity import RawClient, dbname, wait_for
from tests.proxy.test_tagging import base_customers, changes, insert

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not AVAILABLE, reason=f"{UNAVAILABLE}"),
]


def relays(proxy: RunningProxy) -> dict[str, int]:
    """How many connections the admin API lists on each relay ("fast" or "python")."""
    counts: dict[str, int] = {}
    for conn in listed(proxy):
        counts[conn["relay"]] = counts.get(conn["relay"], 0) + 1
    return counts


def listed(proxy: RunningProxy) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = admin_request(proxy.admin_url, "GET", "/connections")
    return result


def scrape(proxy: RunningProxy) -> dict[str, float]:
    """The /metrics samples, by name with labels (as printed)."""
    text = urllib.request.urlopen(proxy.metrics_url, timeout=5).read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def on_fast(proxy: RunningProxy, n: int = 1) -> bool:
    return wait_for(lambda: relays(proxy).get("fast", 0) == n, 5)


def test_connections_go_fast_and_are_counted(proxy: RunningProxy, empty_db: str) -> None:
    before = scrape(proxy)
    with psycopg.connect(proxy.dsn(empty_db), autocommit=True) as conn:
        assert on_fast(proxy)
        assert scrape(proxy)["cowproxy_fast_relay_connections"] == 1
        conn.execute("CREATE TABLE t (id int)")
        for i in range(10):
            conn.execute(f"INSERT INTO t VALUES ({i})")
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (10,)
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        with pytest.raises(psycopg.errors.UndefinedTable):
            conn.execute("SELECT * FROM nope")
        conn.execute("BEGIN")
        conn.execute("SELECT 1")
        (info,) = listed(proxy)
        assert info["relay"] == "fast"
        assert (info["state"], info["transaction_status"]) == ("idle_in_transaction", "T")
        states = scrape(proxy)
        assert states['cowproxy_connections{side="client",state="idle_in_transaction"}'] == 1
        conn.execute("COMMIT")
        assert relays(proxy) == {"fast": 1}  # all of it relayed in C
        after = scrape(proxy)

    def delta(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    assert delta('cowproxy_statements_total{kind="insert",tagged="false"}') == 10
    assert delta('cowproxy_statements_total{kind="select",tagged="false"}') == 4
    assert delta('cowproxy_statements_total{kind="ddl",tagged="false"}') == 1
    assert delta('cowproxy_statements_total{kind="transaction",tagged="false"}') == 2
    assert delta('cowproxy_errors_total{sqlstate_class="22"}') == 1
    assert delta('cowproxy_errors_total{sqlstate_class="42"}') == 1
    assert delta("cowproxy_query_duration_seconds_count") == 17
    assert delta('cowproxy_query_duration_seconds_bucket{le="+Inf"}') == 17
    assert delta("cowproxy_query_duration_seconds_sum") > 0
    assert delta('cowproxy_bytes_total{direction="client_to_server"}') > 17 * 10
    assert delta('cowproxy_bytes_total{direction="server_to_client"}') > 17 * 10
    assert wait_for(lambda: scrape(proxy)["cowproxy_fast_relay_connections"] == 0)


def test_comment_tags_go_to_python_and_land_in_the_session(proxy: RunningProxy, layer_db: str) -> None:
    with psycopg.connect(proxy.dsn(layer_db), autocommit=True) as conn:
        assert on_fast(proxy)
        insert(conn, "plain@x")
        insert(conn, "tagged@x", "/*cow_session='s1'*/ ")
        assert relays(proxy) == {"python": 1}
        insert(conn, "plain2@x")
        # Untagged again (set at the next untagged statement), the connection goes back to the C relay.
        assert on_fast(proxy)
        insert(conn, "plain3@x")
    assert "tagged@x" not in base_customers(layer_db)
    assert {"plain@x", "plain2@x", "plain3@x"} <= set(base_customers(layer_db))
    assert [row[2] for row in changes(layer_db, "s1")] == ["tagged@x"]


def test_route_takes_effect_from_the_next_transaction(proxy: RunningProxy, layer_db: str) -> None:
    database = dbname(layer_db)
    with psycopg.connect(proxy.dsn(layer_db), autocommit=True) as conn:
        assert on_fast(proxy)
        conn.execute("BEGIN")
        insert(conn, "before@x")
        admin_request(proxy.admin_url, "POST", "/routes", {"database": database, "session": "r1"})
        insert(conn, "same-txn@x")  # the transaction started untagged: it stays so
        conn.execute("COMMIT")
        insert(conn, "routed@x")
        assert on_fast(proxy)  # in the session now, on the C relay too (tests/proxy/test_fast_sessions.py)
        insert(conn, "routed2@x")
        admin_request(proxy.admin_url, "DELETE", f"/routes/{database}")
        insert(conn, "unrouted@x")
        assert on_fast(proxy)
        insert(conn, "fast-again@x")
    base = set(base_customers(layer_db))
    assert {"before@x", "same-txn@x", "unrouted@x", "fast-again@x"} <= base
    assert "routed@x" not in base
    assert [row[2] for row in changes(layer_db, "r1")] == ["routed@x", "routed2@x"]


def test_an_idle_connection_is_recalled_at_once(proxy: RunningProxy, layer_db: str) -> None:
    database = dbname(layer_db)
    with psycopg.connect(proxy.dsn(layer_db), autocommit=True) as conn:
        assert on_fast(proxy)
        admin_request(proxy.admin_url, "POST", "/routes", {"database": database, "session": "r2"})
        assert relays(proxy) == {"python": 1}
        insert(conn, "routed@x")
    assert "routed@x" not in base_customers(layer_db)
    assert [row[2] for row in changes(layer_db, "r2")] == ["routed@x"]


def fast_counted(proxy: RunningProxy) -> dict[tuple[str, bool], int]:
    """Statements counted by the C relay itself (not by the Python relay)."""
    fast = proxy.server.fast
    assert fast is not None
    return fast.counts().statements


def test_extended_protocol_on_the_fast_relay(proxy: RunningProxy, empty_db: str) -> None:
    with psycopg.connect(proxy.dsn(empty_db), autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int, v text)")
        conn.execute("INSERT INTO t VALUES (1, 'a')")
        assert on_fast(proxy)
        before = fast_counted(proxy)
        conn.execute("INSERT INTO t VALUES (%s, %s)", (2, "b"))
        assert conn.execute("SELECT v FROM t WHERE id = %s", (2,)).fetchone() == ("b",)
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT %s::int / 0", (1,))
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (2,)
        assert relays(proxy) == {"fast": 1}
        after = fast_counted(proxy)
        assert after.get(("insert", False), 0) - before.get(("insert", False), 0) == 1
        assert after.get(("select", False), 0) - before.get(("select", False), 0) == 3
        # In a transaction, with the extended messages pipelined behind a simple query still in flight.
        c = RawClient(proxy.host, proxy.port, dbname(empty_db))
        assert on_fast(proxy, 2)
        c.query("BEGIN")
        c.sock.sendall(
            p.encode_query("SELECT pg_sleep(0.2)")
            + p.encode_parse("", "SELECT $1::int + 1")
            + p.encode_bind("", "", ("41",))
            + p.encode_execute("")
            + p.SYNC
        )
        c.read_until(b"Z")
        replies = c.read_until(b"Z")
        assert (b"D", b"\x00\x01\x00\x00\x00\x0242") in replies
        assert replies[-1] == (b"Z", b"T")
        assert c.query("COMMIT")[-1] == (b"Z", b"I")
        assert relays(proxy) == {"fast": 2}
        c.sock.close()


def test_error_mid_batch_flush_and_pipelined_syncs(
    proxy: RunningProxy, empty_db: str, pg_server: PgServer
) -> None:
    """An error makes the server skip to Sync; Flush answers mid-batch; several Syncs in one write."""
    batch = (
        p.encode_parse("s1", "SELECT $1::int * 2")
        + p.message(b"D", b"Ss1\0")
        + p.FLUSH
        + p.encode_bind("", "s1", ("21",))
        + p.encode_execute("")
        + p.SYNC
        + p.encode_parse("", "SELECT 1/0")
        + p.encode_bind("", "", ())
        + p.encode_execute("")
        + p.encode_bind("", "s1", ("5",))  # skipped by the server: after the error, before Sync
        + p.encode_execute("")
        + p.SYNC
        + p.encode_bind("p1", "s1", ("7",))
        + p.encode_execute("p1", 0)
        + p.encode_close("P", "p1")
        + p.encode_close("S", "s1")
        + p.SYNC
    )

    def run(host: str, port: int) -> list[tuple[bytes, bytes]]:
        c = RawClient(host, port, dbname(empty_db))
        c.sock.sendall(batch)
        replies = c.read_until(b"Z") + c.read_until(b"Z") + c.read_until(b"Z")
        replies += c.query("SELECT 'after'")
        c.sock.close()
        return [(k, b) for k, b in replies if k not in (b"S", b"N")]

    through = run(proxy.host, proxy.port)
    assert relays(proxy).get("python", 0) == 0
    assert through == run(pg_server.host, pg_server.port)
    kinds = [k for k, _ in through]
    assert kinds.count(b"E") == 1 and kinds.count(b"Z") == 4


def test_asyncpg_and_psycopg_pipeline_stay_fast(proxy: RunningProxy, empty_db: str) -> None:
    import asyncio

    import asyncpg

    before = fast_counted(proxy)

    async def main() -> list[Any]:
        conn = await asyncpg.connect(proxy.dsn(empty_db))
        try:
            await conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
            stmt = await conn.prepare("INSERT INTO t VALUES ($1, $2)")
            await stmt.fetch(1, "a")
            await conn.executemany("INSERT INTO t VALUES ($1, $2)", [(i, f"v{i}") for i in range(2, 100)])
            assert relays(proxy) == {"fast": 1}
            async with conn.transaction():
                await conn.execute("UPDATE t SET v = $1 WHERE id < $2", "u", 10)
            with pytest.raises(asyncpg.UniqueViolationError):
                await stmt.fetch(1, "dup")
            rows = await conn.fetch("SELECT id, v FROM t WHERE id <= $1 ORDER BY id", 11)
            assert relays(proxy) == {"fast": 1}
            return [tuple(r) for r in rows]
        finally:
            await conn.close()

    rows = asyncio.run(main())
    assert rows == [(i, "u") for i in range(1, 10)] + [(10, "v10"), (11, "v11")]
    counted = fast_counted(proxy)
    assert counted.get(("insert", False), 0) - before.get(("insert", False), 0) >= 100
    with psycopg.connect(proxy.dsn(empty_db), autocommit=True) as conn:
        assert on_fast(proxy)
        with conn.pipeline():
            for i in range(100, 150):
                conn.execute("INSERT INTO t VALUES (%s, %s)", (i, "p"))
            cur = conn.execute("SELECT count(*) FROM t WHERE v = %s", ("p",))
        assert cur.fetchone() == (50,)
        assert relays(proxy) == {"fast": 1}
    with psycopg.connect(empty_db, autocommit=True) as direct:
        assert direct.execute("SELECT count(*) FROM t").fetchone() == (149,)


@pytest.mark.parametrize("mode", ["extended", "prepared"])
def test_pgbench_extended_and_prepared_stay_fast(
    proxy: RunningProxy, pg_server: PgServer, create_database: Any, mode: str
) -> None:
    import subprocess

    pgbench = pg_server.tool("pgbench")
    dsn = create_database()
    init = subprocess.run(
        [pgbench, "-i", "-s", "1", "-q", dsn], capture_output=True, text=True, timeout=60, check=False
    )
    assert init.returncode == 0, init.stderr
    before = fast_counted(proxy)
    run = subprocess.run(
        [pgbench, "-M", mode, "-c", "2", "-t", "50", "-n", proxy.dsn(dsn)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    counted = fast_counted(proxy)
    # TPC-B: three UPDATEs, one SELECT, one INSERT per transaction, all counted by the C relay.
    assert counted.get(("update", False), 0) - before.get(("update", False), 0) == 300
    assert counted.get(("insert", False), 0) - before.get(("insert", False), 0) == 100
    with psycopg.connect(dsn, autocommit=True) as direct:
        assert direct.execute("SELECT count(*) FROM pgbench_history").fetchone() == (100,)
        (delta,) = direct.execute("SELECT sum(delta) FROM pgbench_history").fetchone() or (None,)
        assert direct.execute("SELECT sum(abalance) FROM pgbench_accounts").fetchone() == (delta,)


@pytest.mark.parametrize("fast", [True, False], ids=["fast-relay", "python-relay"])
def test_statement_prepared_untagged_then_routed(pg_server: PgServer, layer_db: str, fast: bool) -> None:
    """Prepared on the C relay, then the database routed: the next transaction's Bind/Execute of that
    statement lands in the session (as on the Python relay), the base table is untouched."""
    database = dbname(layer_db)
    with run_proxy(pg_server, fast_relay=fast) as proxy, psycopg.connect(proxy.dsn(layer_db)) as conn:
        conn.autocommit = True
        if fast:
            assert on_fast(proxy)
        c = RawClient(proxy.host, proxy.port, database)
        if fast:
            assert on_fast(proxy, 2)
        c.sock.sendall(
            p.encode_parse("ins", "INSERT INTO customers (email, name) VALUES ($1, 'x')")
            + p.encode_bind("", "ins", ("plain@x",))
            + p.encode_execute("")
            + p.SYNC
        )
        assert c.read_until(b"Z")[-1] == (b"Z", b"I")
        if fast:
            assert relays(proxy) == {"fast": 2}
        admin_request(proxy.admin_url, "POST", "/routes", {"database": database, "session": "rs"})
        c.sock.sendall(p.encode_bind("", "ins", ("routed@x",)) + p.encode_execute("") + p.SYNC)
        replies = c.read_until(b"Z")
        assert not [k for k, _ in replies if k == b"E"], replies
        c.sock.close()
    base = set(base_customers(layer_db))
    assert "plain@x" in base
    assert "routed@x" not in base
    assert [row[2] for row in changes(layer_db, "rs")] == ["routed@x"]


def test_comment_tagged_parse_hands_back_and_lands_in_its_session(proxy: RunningProxy, layer_db: str) -> None:
    c = RawClient(proxy.host, proxy.port, dbname(layer_db))
    assert on_fast(proxy)
    c.sock.sendall(
        p.encode_parse("", "INSERT INTO customers (email, name) VALUES ($1, 'x')")
        + p.encode_bind("", "", ("plain@x",))
        + p.encode_execute("")
        + p.encode_parse("", "/*cow_session='ct'*/ INSERT INTO customers (email, name) VALUES ($1, 'x')")
        + p.encode_bind("", "", ("tagged@x",))
        + p.encode_execute("")
        + p.SYNC
    )
    replies = c.read_until(b"Z")
    assert not [k for k, _ in replies if k == b"E"], replies
    c.sock.sendall(
        p.encode_parse("", "INSERT INTO customers (email, name) VALUES ($1, 'x')")
        + p.encode_bind("", "", ("plain2@x",))
        + p.encode_execute("")
        + p.SYNC
    )
    assert c.read_until(b"Z")[-1] == (b"Z", b"I")
    assert on_fast(proxy)  # untagged again: back on the C relay
    c.sock.close()
    base = set(base_customers(layer_db))
    assert {"plain@x", "plain2@x"} <= base
    assert "tagged@x" not in base
    assert [row[2] for row in changes(layer_db, "ct")] == ["tagged@x"]


def test_copy_both_ways_on_the_fast_relay(proxy: RunningProxy, empty_db: str) -> None:
    with psycopg.connect(proxy.dsn(empty_db), autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int, v text)")
        assert on_fast(proxy)
        with conn.cursor().copy("COPY t (id, v) FROM STDIN") as copy:
            for i in range(5000):
                copy.write_row((i, "copied" * 20))
        with conn.cursor().copy("COPY t (id, v) FROM STDIN") as copy:  # one CopyData of ~300 KB
            copy.write(b"".join(b"%d\tbig\n" % i for i in range(5000, 40000)))
        out = bytearray()
        with conn.cursor().copy("COPY (SELECT id, v FROM t ORDER BY id) TO STDOUT") as copy:
            for block in copy:
                out += block
        assert out.count(b"\n") == 40000
        # A failing COPY (bad data) and CopyFail from the client.
        with (
            pytest.raises(psycopg.errors.InvalidTextRepresentation),
            conn.cursor().copy("COPY t (id) FROM STDIN") as copy,
        ):
            copy.write(b"not a number\n")
        with (
            pytest.raises(psycopg.errors.QueryCanceled),
            conn.cursor().copy("COPY t (id) FROM STDIN") as copy,
        ):
            copy.write(b"1\n")
            raise psycopg.errors.QueryCanceled("client gave up")
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (40000,)
        assert relays(proxy) == {"fast": 1}


def test_oversized_copy_data_mid_copy_is_handed_back(pg_server: PgServer, empty_db: str) -> None:
    with run_proxy(pg_server, max_message_size=100_000) as proxy:
        c = RawClient(proxy.host, proxy.port, dbname(empty_db))
        c.query("CREATE TABLE t (v text)")
        assert on_fast(proxy)
        c.sock.sendall(p.encode_query("COPY t FROM STDIN"))
        c.read_until(b"G")
        c.sock.sendall(p.message(b"d", b"ok\n") + p.message(b"d", b"x" * 200_000 + b"\n") + p.message(b"c"))
        replies = c.read_until(b"Z")
        assert [p.decode_error(body).sqlstate for kind, body in replies if kind == b"E"] == ["54000"]
        assert c.query("SELECT count(*) FROM t")[1] == (b"D", b"\x00\x01\x00\x00\x00\x010")
        c.sock.close()


def test_pipelined_simple_queries(proxy: RunningProxy, empty_db: str, pg_server: PgServer) -> None:
    statements = [f"SELECT {i}, repeat('x', {i * 7})" for i in range(300)] + ["SELECT 1/0", "SELECT 'end'"]
    batch = b"".join(p.encode_query(sql) for sql in statements)

    def run(host: str, port: int) -> list[tuple[bytes, bytes]]:
        c = RawClient(host, port, dbname(empty_db))
        c.sock.sendall(batch)  # all at once: far more than MAX_INFLIGHT, in one go
        replies: list[tuple[bytes, bytes]] = []
        for _ in statements:
            replies += c.read_until(b"Z")
        c.sock.close()
        return replies

    through = run(proxy.host, proxy.port)
    assert relays(proxy).get("python", 0) == 0
    assert through == run(pg_server.host, pg_server.port)


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_100_mb_row_to_a_slow_reader_in_bounded_memory(proxy: RunningProxy, empty_db: str) -> None:
    size = 100 * 1024 * 1024
    c = RawClient(proxy.host, proxy.port, dbname(empty_db))
    assert on_fast(proxy)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    rss = _rss()
    c.sock.sendall(p.encode_query(f"SELECT repeat('x', {size})"))
    time.sleep(1)  # stall: the server keeps sending; the relay must stop reading it
    peak = _rss()
    with psycopg.connect(proxy.dsn(empty_db), autocommit=True) as other:
        assert other.execute("SELECT 3").fetchone() == (3,)
    # Read the reply in small pieces, slowly at first (the test's own memory stays small too).
    got = 0
    buf = bytearray()
    while not buf.endswith(b"Z\x00\x00\x00\x05I"):
        chunk = c.sock.recv(65536)
        assert chunk
        got += len(chunk)
        buf = (buf + chunk)[-16:]
        if got < 4 * 1024 * 1024:
            time.sleep(0.001)
        if got % (8 * 1024 * 1024) < 65536:
            peak = max(peak, _rss())
    assert got > size
    assert peak - rss < 32 * 1024 * 1024, f"RSS grew by {peak - rss} bytes"
    assert relays(proxy) == {"fast": 1}
    c.sock.close()


def test_client_killed_mid_query_and_mid_copy(
    proxy: RunningProxy, empty_db: str, pg_server: PgServer
) -> None:
    db = dbname(empty_db)
    with psycopg.connect(proxy.dsn(empty_db), autocommit=True) as other:
        other.execute("CREATE TABLE t (v text)")
        c = RawClient(proxy.host, proxy.port, db)
        d = RawClient(proxy.host, proxy.port, db)
        assert on_fast(proxy, 3)
        c.sock.sendall(p.encode_query("SELECT pg_sleep(1)"))  # the backend notices when it answers
        d.sock.sendall(p.encode_query("COPY t FROM STDIN"))
        d.read_until(b"G")
        d.sock.sendall(p.message(b"d", b"half a ro"))
        time.sleep(0.2)
        c.abort()
        d.abort()
        assert wait_for(lambda: len(proxy.server.connections) == 1)
        assert other.execute("SELECT count(*) FROM t").fetchone() == (0,)
    assert wait_for(lambda: backends(pg_server, db) == 0), "leaked upstream backend"


def test_upstream_killed_on_the_fast_relay(proxy: RunningProxy, empty_db: str, pg_server: PgServer) -> None:
    db = dbname(empty_db)
    victim = psycopg.connect(proxy.dsn(empty_db), autocommit=True)
    bystander = psycopg.connect(proxy.dsn(empty_db), autocommit=True)
    row = victim.execute("SELECT pg_backend_pid()").fetchone()
    assert on_fast(proxy, 2)
    with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", row)
    with pytest.raises(psycopg.OperationalError):
        victim.execute("SELECT 1")
    victim.close()
    assert bystander.execute("SELECT 2").fetchone() == (2,)
    assert wait_for(lambda: len(proxy.server.connections) == 1)
    bystander.close()
    assert wait_for(lambda: backends(pg_server, db) == 0)


def test_drain_lets_fast_transactions_finish(proxy: RunningProxy, empty_db: str) -> None:
    with psycopg.connect(proxy.dsn(empty_db), autocommit=True) as setup:
        setup.execute("CREATE TABLE t (id int)")
    busy = psycopg.connect(proxy.dsn(empty_db), autocommit=True)
    idle = psycopg.connect(proxy.dsn(empty_db), autocommit=True)
    assert on_fast(proxy, 2)
    busy.execute("BEGIN")
    busy.execute("INSERT INTO t VALUES (1)")
    done = threading.Event()

    def drain() -> None:
        proxy.call(proxy.server.drain(10))
        done.set()

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    assert wait_for(lambda: len(proxy.server.connections) == 1)  # the idle one went at once
    with pytest.raises(psycopg.OperationalError):
        idle.execute("SELECT 1")
    busy.execute("INSERT INTO t VALUES (2)")
    busy.execute("COMMIT")
    assert done.wait(10)
    with pytest.raises(psycopg.OperationalError):
        busy.execute("SELECT 1")
    busy.close()
    idle.close()
    with psycopg.connect(empty_db, autocommit=True) as direct:
        assert direct.execute("SELECT count(*) FROM t").fetchone() == (2,)


def test_sigterm_drains_fast_connections(pg_server: PgServer, empty_db: str, tmp_path: Path) -> None:
    """`cowproxy serve` as a process: SIGTERM with a fast connection mid-transaction."""
    import signal
    import subprocess
    import sys

    log_path = tmp_path / "serve.log"
    log_file = log_path.open("w")
    # Port 0: the proxy binds a free port itself and logs it (a port picked here could be taken meanwhile).
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "cowproxy", "serve"),
            *("--upstream", f"{pg_server.host}:{pg_server.port}", "--listen", "127.0.0.1:0"),
            *("--drain-timeout", "10"),
        ],
        stderr=log_file,
    )
    try:
        assert wait_for(lambda: re.search(r"listen=\S+:(\d+)", log_path.read_text()) is not None, 20)
        found = re.search(r"listen=\S+:(\d+)", log_path.read_text())
        assert found is not None
        dsn = empty_db.replace(f"{pg_server.host}:{pg_server.port}", f"127.0.0.1:{found.group(1)}")
        assert wait_for(lambda: _connects(dsn), 20)
        conn = psycopg.connect(dsn, autocommit=True)
        conn.execute("CREATE TABLE t (id int)")
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t VALUES (1)")
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        conn.execute("INSERT INTO t VALUES (2)")
        conn.execute("COMMIT")
        assert proc.wait(10) == 0
        conn.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log_file.close()
    log = log_path.read_text()
    assert "fast_relay=on" in log, log
    with psycopg.connect(empty_db, autocommit=True) as direct:
        assert direct.execute("SELECT count(*) FROM t").fetchone() == (2,)


def _connects(dsn: str) -> bool:
    try:
        psycopg.connect(dsn, connect_timeout=2).close()
    except psycopg.OperationalError:
        return False
    return True


def test_a_stale_build_is_reported_and_left_unused() -> None:
    """An editable install that was not rebuilt after a pull keeps an old proxy/_fastrelay*.so: the proxy
    says so and relays in Python, instead of failing at the first call with a changed signature."""
    import subprocess
    import sys

    probe = (
        "import proxy._fastrelay as m; m.API_VERSION -= 1; import proxy.fastrelay as f; "
        "print(f.AVAILABLE, f.UNAVAILABLE)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.startswith("False proxy._fastrelay is a stale build"), out


def test_no_fast_relay_flag(pg_server: PgServer, empty_db: str) -> None:
    with run_proxy(pg_server, fast_relay=False) as proxy:
        assert proxy.server.fast is None
        with psycopg.connect(proxy.dsn(empty_db), autocommit=True) as conn:
            conn.execute("SELECT 1")
            assert relays(proxy) == {"python": 1}


# ---- the C relay against the Python relay, message stream by message stream


@pytest.fixture(scope="module")
def relay_pair(pg_server: PgServer, create_database: Any) -> Any:
    dsn = create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 20) g")
    with run_proxy(pg_server, fast_relay=True) as fast, run_proxy(pg_server, fast_relay=False) as slow:
        yield dsn, fast, slow


_TEXTS = st.sampled_from(
    [
        "SELECT 1",
        "select v from t where id = 3",
        "  (SELECT id FROM t ORDER BY id LIMIT 2)",
        "-- a comment\nSELECT 'é'",
        "SELECT 1/0",
        "SELECT * FROM nope",
        "",
        ";",
        "BEGIN",
        "COMMIT",
        "ROLLBACK",
        "SELECT 1; SELECT 2",
        "SELECT 'a' /* a comment */",
        "/*cow_session='s9'*/ SELECT 1",
        "INSERT INTO t VALUES (1000, 'x') ON CONFLICT DO NOTHING",
        "UPDATE t SET v = v WHERE id = 1",
        "SHOW server_version_num",
        "COPY (SELECT id FROM t ORDER BY id) TO STDOUT",
        "VALUES (1), (2)",
        "NOTIFY chan, 'x'",
    ]
)


def _message(kind: str, text: str) -> bytes:
    if kind == "query":
        return p.encode_query(text)
    if kind == "nul":
        return p.message(b"Q", text.encode() + b"\0SELECT 2\0")
    if kind == "latin1":
        return p.message(b"Q", b"SELECT '\xe9'\0")
    if kind == "parse":
        return p.encode_parse("", text) + p.encode_bind("", "", ()) + p.encode_execute("") + p.SYNC
    if kind == "named":  # a named statement and portal, described, run a row at a time, closed
        return (
            p.encode_parse("s", text)
            + p.message(b"D", b"Ss\0")
            + p.encode_bind("p", "s", ())
            + p.message(b"D", b"Pp\0")
            + p.encode_execute("p", 1)
            + p.encode_execute("p", 0)
            + p.encode_close("P", "p")
            + p.encode_close("S", "s")
            + p.SYNC
        )
    if kind == "keep":  # prepared now, run by "again" later (or an error: it exists already)
        return p.encode_parse("keep", text) + p.SYNC
    if kind == "again":
        return p.encode_bind("", "keep", ()) + p.encode_execute("") + p.SYNC
    if kind == "flush":  # answered up to the Flush before the Sync is sent
        return p.encode_parse("", text) + p.FLUSH + p.encode_bind("", "", ()) + p.encode_execute("") + p.SYNC
    if kind == "errmid":  # an error mid-batch: the server skips the rest up to Sync
        return (
            p.encode_parse("", "SELECT 1/0")
            + p.encode_bind("", "", ())
            + p.encode_execute("")
            + p.encode_parse("", text)
            + p.encode_bind("", "", ())
            + p.encode_execute("")
            + p.SYNC
        )
    raise AssertionError(kind)


_KINDS = ["query"] * 6 + ["nul", "latin1", "parse"] + ["named", "keep", "again", "flush", "errmid", "parse"]
_MESSAGES = st.lists(st.tuples(st.sampled_from(_KINDS), _TEXTS), min_size=1, max_size=8)


def _exchange(
    proxy: RunningProxy, database: str, messages: list[bytes], pipelined: bool, session: str | None = None
) -> list[Any]:
    """Send the messages (each waits for its reply unless pipelined); the replies, as decoded values.
    ``session``: the connection's startup tag."""
    params = {"options": f"-c cow.session_id={session}"} if session else {}
    c = RawClient(proxy.host, proxy.port, database, **params)
    c.sock.settimeout(10)
    out: list[Any] = []
    try:
        if pipelined:
            c.sock.sendall(b"".join(messages))
        for raw in messages:
            if not pipelined:
                c.sock.sendall(raw)
            while True:
                kind, body = c.read_message()
                if kind == b"E":
                    fields = p.decode_error(body)
                    out.append(("E", fields.sqlstate, fields.message))
                elif kind in (b"S", b"N", b"A"):
                    continue  # ParameterStatus/Notice/Notification: not what is compared
                else:
                    out.append((kind, body))
                if kind == b"Z":
                    break
    except ConnectionError:
        out.append("closed")
    finally:
        c.sock.close()
    return out


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=_MESSAGES, pipelined=st.booleans())
def test_fast_relay_matches_the_python_relay(
    relay_pair: Any, stream: list[tuple[str, str]], pipelined: bool
) -> None:
    dsn, fast, slow = relay_pair
    database = dbname(dsn)
    messages = [_message(kind, text) for kind, text in stream]
    if any(kind in ("nul", "latin1") for kind, _ in stream):
        # A malformed message ends the connection (FATAL 08P01). Pipelined behind others, the C relay has
        # already forwarded (and answers) those before it, the Python relay drops the whole read: the
        # same only one message at a time.
        pipelined = False
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM t WHERE id > 20")
    expected = _exchange(slow, database, messages, pipelined)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM t WHERE id > 20")
    assert _exchange(fast, database, messages, pipelined) == expected
    assert wait_for(lambda: not fast.server.connections and not slow.server.connections)


@pytest.fixture(scope="module")
def kinds() -> Any:
    fast = FastRelay()
    yield fast
    fast.close()


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=40)
    | st.sampled_from(["SELECT", " (\tselect", "--x\n\u2003(( Update", "\x1c\x85with", "--x"])
)
def test_statement_kind_matches_query_kind(kinds: FastRelay, text: str) -> None:
    """The C relay counts statements by the kind ``query_kind`` gives (from the table it is passed)."""
    message = p.encode_query(text)
    assert kinds.kind(message) == query_kind(message)


def test_statements_prepared_in_python_carry_over_to_the_fast_relay(
    proxy: RunningProxy, layer_db: str
) -> None:
    """Prepared.statements go to the C relay at adoption: an untagged one is bound and counted there, a
    comment-tagged one hands back (its Bind switches to the session) and lands in its session."""
    sql = "INSERT INTO customers (email, name) VALUES ($1, 'x')"
    c = RawClient(proxy.host, proxy.port, dbname(layer_db))
    assert on_fast(proxy)
    c.sock.sendall(p.encode_parse("tag", f"/*cow_session='cx'*/ {sql}") + p.SYNC)
    assert c.read_until(b"Z")[-1] == (b"Z", b"I")
    assert relays(proxy) == {"python": 1}
    c.sock.sendall(
        p.encode_parse("plain", sql) + p.encode_bind("", "plain", ("a@x",)) + p.encode_execute("") + p.SYNC
    )
    assert c.read_until(b"Z")[-1] == (b"Z", b"I")
    assert on_fast(proxy)
    before = fast_counted(proxy).get(("insert", False), 0)
    c.sock.sendall(p.encode_bind("", "plain", ("b@x",)) + p.encode_execute("") + p.SYNC)
    assert c.read_until(b"Z")[-1] == (b"Z", b"I")
    assert fast_counted(proxy).get(("insert", False), 0) - before == 1
    assert relays(proxy) == {"fast": 1}
    c.sock.sendall(p.encode_bind("", "tag", ("t@x",)) + p.encode_execute("") + p.SYNC)
    replies = c.read_until(b"Z")
    assert not [k for k, _ in replies if k == b"E"], replies
    c.sock.close()
    base = set(base_customers(layer_db))
    assert {"a@x", "b@x"} <= base
    assert "t@x" not in base
    assert [row[2] for row in changes(layer_db, "cx")] == ["t@x"]


def test_an_unnamed_key_read_bound_again_after_its_session_ended(proxy: RunningProxy, layer_db: str) -> None:
    """In a session the client's unnamed key read runs as the proxy's named statement (docs/proxy.md). When
    the route is removed and the client binds its unnamed statement again without a new Parse, that
    statement still answers (outside the session now): the connection stays on the Python relay, which
    knows what the unnamed statement stands for, until the client parses another one."""
    database = dbname(layer_db)
    read = p.encode_bind("", "", ("1",)) + p.encode_execute("") + p.SYNC
    admin_request(proxy.admin_url, "POST", "/routes", {"database": database, "session": "ru"})
    c = RawClient(proxy.host, proxy.port, database)
    try:
        c.sock.sendall(p.encode_query("UPDATE customers SET name = 'Ada in ru' WHERE id = 1"))
        c.read_until(b"Z")
        for _ in range(2):  # the second Parse is answered by an empty unnamed statement
            c.sock.sendall(p.encode_parse("", "SELECT name FROM customers WHERE id = $1") + read)
            rows = [body for kind, body in c.read_until(b"Z") if kind == b"D"]
            assert [p.decode_data_row(r) for r in rows] == [("Ada in ru",)]
        admin_request(proxy.admin_url, "DELETE", f"/routes/{database}")
        c.sock.sendall(p.encode_parse("other", "SELECT 2") + p.SYNC)  # untagged now, and leaves "" alone
        assert [kind for kind, _ in c.read_until(b"Z")] == [b"1", b"Z"]
        for _ in range(2):  # (the C relay would bind the empty unnamed statement)
            c.sock.sendall(read)
            rows = [body for kind, body in c.read_until(b"Z") if kind == b"D"]
            assert [p.decode_data_row(r) for r in rows] == [("Ada",)]  # the base row: no session now
        assert relays(proxy) == {"python": 1}
        c.sock.sendall(
            p.encode_parse("", "SELECT 1") + p.encode_bind("", "", ()) + p.encode_execute("") + p.SYNC
        )
        kinds = [kind for kind, _ in c.read_until(b"Z")]
        assert kinds == [b"1", b"2", b"D", b"C", b"Z"], kinds
        assert on_fast(proxy)
    finally:
        c.sock.close()


def test_write_slots_hold_a_large_applications_tables() -> None:
    """Every (table, kind) a session writes gets one of C's counters, given for good: Django's full list
    writes 1,019 pairs (256 slots sent the writes of the pairs after the 256th back to Python). A pair past
    the last slot, or a statement with more writes than C counts, is Python's (None); C counts each slot's
    writes apart."""
    relay = FastRelay()
    try:
        pairs = [(f"public.t{i}", kind) for i in range(MAX_WRITE_SLOTS // 2) for kind in ("insert", "update")]
        assert len(pairs) == MAX_WRITE_SLOTS > 1_019 * 2
        given = [relay.slots((pair,)) for pair in pairs]
        assert given == [(i,) for i in range(len(pairs))]
        assert relay.slots(tuple(pairs[:2])) == (0, 1)  # (the same slots again)
        assert relay.slots((("public.more", "insert"),)) is None  # (all given)
        assert relay.slots(tuple(pairs[:5])) is None  # (more than STMT_WRITES)
        # C takes the last slot in a decision (and no slot past it).
        client, server = socket.socketpair()
        kind = relay.kind_index("insert") or 0
        try:
            for slot, loads in ((MAX_WRITE_SLOTS - 1, True), (MAX_WRITE_SLOTS, False)):
                row = (b"QINSERT INTO t VALUES (1)", kind, (slot,), False, False, -1, None)
                adoption = Adoption([], [], True, [row], False, False)
                if loads:
                    relay.adopt(1, client.fileno(), server.fileno(), p.PG_MAX_MESSAGE, adoption)
                    assert relay.release(1)
                else:
                    with pytest.raises(ValueError, match="bad write slot"):
                        relay.adopt(2, client.fileno(), server.fileno(), p.PG_MAX_MESSAGE, adoption)
        finally:
            client.close()
            server.close()
    finally:
        relay.close()
