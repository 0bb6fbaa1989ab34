"""Read traces of sessions on the C relay: the same workload through a proxy on the Python relay
(``--no-fast-relay``) and through one on the C relay records the same rows into ``cow.reads`` — operation,
fingerprint, text, identity (text and Bind parameters), tables, row count — for simple queries, unnamed
extended statements and prepared ones, pipelined batches, a portal run in steps and a batch the C relay
hands back in its middle."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy import protocol as p
from proxy import server as server_module
from proxy.fastrelay import AVAILABLE, UNAVAILABLE
from tests.fix_db import PgServer, install_layer_at
from tests.fix_proxy import RunningProxy, run_proxy
from tests.proxy.test_adversity import RawClient, dbname, wait_for
from tests.proxy.test_fast_relay import _exchange, _message, on_fast, scrape
from tests.proxy.test_reads import flush, tagged

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(not AVAILABLE, reason=f"{UNAVAILABLE}"),
]

# Reads the proxy does not rewrite (C takes their texts once decided) and one it does (a key read: Python).
BY_TIER = "SELECT name FROM customers WHERE tier = %s ORDER BY id"
JOINED = (
    "SELECT c.name, o.qty FROM customers c JOIN orders o ON o.customer_id = c.id"
    " WHERE o.qty >= %s ORDER BY o.id"
)
BY_KEY = "SELECT name FROM customers WHERE id = %s"
# (identity NULL from layer 52: params stands for it)
COLUMNS = "operation, fingerprint, statement, identity, params, relations, rows"


@pytest.fixture
def proxies(pg_server: PgServer) -> Iterator[dict[str, RunningProxy]]:
    """Two recording proxies: on the Python relay and on the C relay."""
    with (
        run_proxy(pg_server, reads_dsn=pg_server.dsn, fast_relay=False) as python,
        run_proxy(pg_server, reads_dsn=pg_server.dsn) as fast,
    ):
        yield {"python": python, "fast": fast}


def c_reads(proxy: RunningProxy) -> int:
    """Read records the C relay made (0 for a proxy without it)."""
    return proxy.server.fast.counts().reads if proxy.server.fast is not None else 0


def c_rows(proxy: RunningProxy) -> int:
    """Read records the C relay wrote as COPY rows itself (taken while their connection was on it)."""
    assert proxy.server.reads is not None
    return proxy.server.reads.encoded


def recorded(db: str, session: str) -> list[tuple[Any, ...]]:
    """The session's reads in order; the operations of transactions (``xact:`` and the server's
    transaction id, ``readonly:`` and the connection's) by their order of first appearance, which two runs
    share."""
    with psycopg.connect(db, autocommit=True) as conn:
        rows = conn.execute(
            f"SELECT {COLUMNS} FROM cow.reads WHERE session = %s ORDER BY seq", (session,)
        ).fetchall()
    seen: dict[str, str] = {}
    out = []
    for operation, *rest in rows:
        shown = operation
        if operation is not None and operation.startswith(("xact:", "readonly:")):
            shown = seen.setdefault(operation, f"{operation.split(':')[0]}#{len(seen)}")
        out.append((shown, *rest))
    return out


def _psycopg_reads(conn: psycopg.Connection[Any], prepare: bool | None) -> None:
    for tier in ("basic", "pro", "basic", "basic", "nobody"):
        conn.execute(BY_TIER, (tier,), prepare=prepare).fetchall()
    for qty in (1, 2, 1, 1):
        conn.execute(JOINED, (qty,), prepare=prepare).fetchall()
    for key in (1, 2, 1):
        conn.execute(BY_KEY, (key,), prepare=prepare).fetchall()
    with pytest.raises(psycopg.errors.DivisionByZero):
        conn.execute("SELECT 1 / (id - id) FROM customers WHERE tier = %s", ("pro",), prepare=prepare)
    conn.execute("INSERT INTO customers (email, name) VALUES (%s, 'N')", ("n@x",), prepare=prepare)
    conn.execute(BY_TIER, ("basic",), prepare=prepare).fetchall()  # (the session's row too)


def _simple_reads(conn: psycopg.Connection[Any], prepare: bool | None) -> None:
    cur = psycopg.ClientCursor(conn)
    for _ in range(3):
        cur.execute("SELECT name FROM customers WHERE tier = 'basic' ORDER BY id")
        cur.execute(
            "SELECT c.name, o.qty FROM customers c JOIN orders o ON o.customer_id = c.id ORDER BY o.id"
        )
        cur.execute("SELECT name FROM customers WHERE id = 2")
    with pytest.raises(psycopg.errors.DivisionByZero):
        cur.execute("SELECT 1 / (id - id) FROM customers")
    cur.execute("/*cow_operation='other'*/ SELECT name FROM customers WHERE tier = 'pro'")
    cur.execute("SELECT name FROM customers WHERE tier = 'basic' ORDER BY id")


MODES: dict[str, tuple[Callable[[psycopg.Connection[Any], bool | None], None], bool | None]] = {
    "simple": (_simple_reads, None),
    "extended": (_psycopg_reads, False),
    "prepared": (_psycopg_reads, True),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_reads_on_the_c_relay_are_recorded_as_on_the_python_relay(
    proxies: dict[str, RunningProxy], layer_db: str, mode: str
) -> None:
    run, prepare = MODES[mode]
    began = datetime.now(UTC)
    for name, proxy in proxies.items():
        with psycopg.connect(tagged(proxy, layer_db, f"fr-{name}-{mode}", "op1"), autocommit=True) as conn:
            run(conn, prepare)
            _more_reads(conn, prepare)
            flush(proxy)  # (the C relay's records taken while it holds the connection: its own COPY rows)
        flush(proxy)
    ended = datetime.now(UTC)
    python, fast = (recorded(layer_db, f"fr-{name}-{mode}") for name in proxies)
    assert len(python) >= 15
    assert fast == python
    # Their times are the wall clock's (C reads the monotonic clock per read, the wall clock per take).
    with psycopg.connect(layer_db, autocommit=True) as db:
        at = db.execute("SELECT min(at), max(at) FROM cow.reads WHERE session LIKE 'fr-%'").fetchone()
    assert at is not None and began - timedelta(seconds=1) <= at[0] <= at[1] <= ended
    assert c_reads(proxies["fast"]) >= len(python) // 2  # (the first of each text, and key reads: Python)
    assert c_rows(proxies["fast"]) >= 4


def _more_reads(conn: psycopg.Connection[Any], prepare: bool | None) -> None:
    """Five reads of a decided text: on the C relay until the flush takes their records."""
    for _ in range(5):
        if prepare is None:
            psycopg.ClientCursor(conn).execute("SELECT name FROM customers WHERE tier = 'basic' ORDER BY id")
        else:
            conn.execute(BY_TIER, ("basic",), prepare=prepare).fetchall()


def test_literal_texts_stay_on_the_c_relay_and_are_recorded_as_on_the_python_relay(
    proxies: dict[str, RunningProxy], layer_db: str
) -> None:
    """Texts that differ only in their literals (pgbench -M simple's): C takes them by their shape's
    decision and records each with its own text — statement, identity and rows as the Python relay's, the
    fingerprint and tables of the shape — with and without an operation id."""
    for operation in ("op1", None):
        for name, proxy in proxies.items():
            session = f"frl-{name}-{operation}"
            with psycopg.connect(tagged(proxy, layer_db, session, operation), autocommit=True) as conn:
                cur = psycopg.ClientCursor(conn)
                for i in range(40):
                    tier = ("basic", "pro")[i % 2]
                    cur.execute(f"SELECT name FROM customers WHERE tier = '{tier}' AND id > {i % 3}")
                    cur.fetchall()
                    if i % 10 == 9:
                        cur.execute(f"UPDATE customers SET score = {i} WHERE id = 1")
                flush(proxy)  # (taken from C while the connection is there)
            flush(proxy)
        python, fast = (recorded(layer_db, f"frl-{name}-{operation}") for name in proxies)
        assert len(python) == 40 and len({r[2] for r in python}) == 6  # (six texts, one fingerprint)
        assert len({r[1] for r in python}) == 1
        assert fast == python
    counts = proxies["fast"].server.fast.counts()
    assert counts.shape_hits >= 60  # (each session's texts after its first of the shape)
    assert c_rows(proxies["fast"]) >= 30


def _raw_batches(c: RawClient) -> None:
    """Pipelined extended batches, by hand: a portal run in steps (PortalSuspended: no record, then the
    rest), an error that skips the rest of its batch, and batches with a message C does not take (an empty
    query, a comment) in their middle: the reads before it are in flight when C hands the connection back."""
    read = "SELECT name FROM customers WHERE tier = $1 ORDER BY id"
    c.sock.sendall(p.encode_parse("r", read) + p.SYNC)
    c.read_until(b"Z")
    batches = [
        p.encode_bind("", "r", ("basic",))
        + p.encode_execute("", 1)
        + p.encode_execute("")
        + p.encode_bind("", "r", ("pro",))
        + p.encode_execute(""),
        p.encode_bind("", "r", ("basic",))
        + p.encode_execute("")
        + p.encode_parse("", "SELECT 1 / 0")
        + p.encode_bind("", "", ())
        + p.encode_execute("")
        + p.encode_bind("", "r", ("pro",))
        + p.encode_execute(""),
        p.encode_bind("", "r", ("pro",))
        + p.encode_execute("")
        + p.encode_parse("", "")
        + p.encode_bind("", "", ())
        + p.encode_execute(""),
        p.encode_bind("", "r", ("basic",))
        + p.encode_execute("")
        + p.encode_parse("", "/*cow_operation='op2'*/ SELECT count(*) FROM orders")
        + p.encode_bind("", "", ())
        + p.encode_execute("")
        + p.encode_bind("", "r", ("pro",))
        + p.encode_execute(""),
    ]
    # Simple queries pipelined, one failing among them (its text decided too, from the second round on).
    queries = [
        "SELECT name FROM customers WHERE tier = 'pro'",
        "SELECT 1 / (id - id) FROM customers",
        "SELECT email FROM customers ORDER BY id",
    ]
    for _ in range(3):
        for batch in batches:
            c.sock.sendall(batch + p.SYNC)
            c.read_until(b"Z")
        c.sock.sendall(b"".join(p.encode_query(q) for q in (*queries, queries[0])))
        for _ in range(4):
            c.read_until(b"Z")


def test_pipelined_batches_are_recorded_as_on_the_python_relay(
    proxies: dict[str, RunningProxy], layer_db: str
) -> None:
    for name, proxy in proxies.items():
        options = f"-c cow.session_id=frb-{name} -c cow.operation_id=op1"
        c = RawClient(proxy.host, proxy.port, dbname(layer_db), options=options)
        _raw_batches(c)
        c.sock.close()
    for proxy in proxies.values():
        flush(proxy)
    python, fast = (recorded(layer_db, f"frb-{name}") for name in proxies)
    assert len(python) == 3 * (2 + 1 + 1 + 3 + 3)
    assert fast == python
    assert c_reads(proxies["fast"]) >= 6  # (the simple queries of the last two rounds at least)


def test_a_full_ring_on_the_c_relay_drops_and_counts_without_waiting(
    pg_server: PgServer, layer_db: str
) -> None:
    """With the proxy's event loop blocked, nothing takes the C relay's records: the session runs on, its
    connection's ring fills (4,096 records, READ_CAP) and the rest are dropped and counted
    (``relay_full``)."""
    with (
        run_proxy(pg_server, reads_dsn=pg_server.dsn) as proxy,
        psycopg.connect(tagged(proxy, layer_db, "frf", "op1"), autocommit=True) as conn,
    ):
        conn.execute(BY_TIER, ("pro",), prepare=True).fetchall()  # (prepared by Python, run on C)
        assert on_fast(proxy)
        proxy.run(proxy.server.take_fast_reads)  # (that first record: the ring is empty)
        blocked, release = threading.Event(), threading.Event()

        def block() -> None:
            blocked.set()
            release.wait(60)

        proxy.loop.call_soon_threadsafe(block)
        assert blocked.wait(10)
        try:
            for _ in range(4200):
                assert conn.execute(BY_TIER, ("pro",), prepare=True).fetchall() == [("Ada",)]
        finally:
            release.set()
        flush(proxy)
        samples = scrape(proxy)
    assert samples['cowproxy_reads_dropped_total{reason="relay_full"}'] == 4200 - 4096
    assert samples["cowproxy_reads_recorded_total"] == 1 + 4096
    assert len(recorded(layer_db, "frf")) == 1 + 4096


# ---- the comparison of both relays on random tagged streams (tests/proxy/test_fast_sessions.py), recording


@pytest.fixture(scope="module")
def recording_pair(
    pg_server: PgServer, create_database: Any
) -> Iterator[tuple[str, RunningProxy, RunningProxy]]:
    dsn = create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 20) g")
    install_layer_at(dsn)
    with (
        run_proxy(pg_server, reads_dsn=pg_server.dsn) as fast,
        run_proxy(pg_server, reads_dsn=pg_server.dsn, fast_relay=False) as slow,
    ):
        yield dsn, fast, slow


# Mostly reads: rewritten ones (a key read: Python), decided ones (C), one in another operation, one that
# fails; writes, transaction control and a refusal between them.
_READ_TEXTS = st.sampled_from(
    [
        "SELECT v FROM t WHERE id = 3",
        "SELECT id, v FROM t ORDER BY id LIMIT 3",
        "SELECT v FROM t WHERE v LIKE 'v1%' ORDER BY id",
        "SELECT count(*) FROM t WHERE v <> 'x'",
        "/*cow_operation='op2'*/ SELECT id FROM t WHERE id > 15 ORDER BY id",
        "SELECT id FROM t WHERE id > 1 / (id - id)",
        "UPDATE t SET v = v || '!' WHERE id = 1",
        "BEGIN",
        "COMMIT",
        "ROLLBACK",
        "SET cow.session_id TO 'elsewhere'",
    ]
)
_READ_STREAMS = st.lists(
    st.tuples(st.sampled_from(["query", "query", "parse", "named", "keep", "again", "errmid"]), _READ_TEXTS),
    min_size=1,
    max_size=6,
)
_examples = iter(range(1_000_000))
_c_made: list[int] = []  # read records the C relay made, per example below


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=_READ_STREAMS, pipelined=st.booleans())
def test_random_tagged_streams_record_the_same_reads_on_both_relays(
    recording_pair: tuple[str, RunningProxy, RunningProxy], stream: list[tuple[str, str]], pipelined: bool
) -> None:
    """Each stream runs three times on one connection (its texts decided, then taken by C): the replies and
    the read traces are the same."""
    dsn, fast, slow = recording_pair
    run = next(_examples)
    made = c_reads(fast)
    replies = []
    for proxy, side in ((slow, "s"), (fast, "f")):
        messages = [_message(kind, text) for kind, text in stream] * 3
        replies.append(_exchange(proxy, dbname(dsn), messages, pipelined, session=f"rs{run}{side}"))
        flush(proxy)
    assert replies[1] == replies[0]
    assert recorded(dsn, f"rs{run}f") == recorded(dsn, f"rs{run}s")
    _c_made.append(c_reads(fast) - made)


def test_the_random_streams_made_records_on_the_c_relay() -> None:
    if not _c_made:
        pytest.skip("the comparison did not run in this session")
    assert sum(_c_made) > 0, _c_made


def test_flush_and_the_queued_gauge_see_records_still_in_the_c_relay(
    pg_server: PgServer, layer_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without waiting for the periodic take (turned off here), a scrape's ``cowproxy_reads_queued`` and the
    recorder's flush include the records the C relay holds: a client that waits for its trace to be written
    (the demo, before scoring) finds all of it."""
    monkeypatch.setattr(server_module, "_TAKE_READS", 3600.0)
    with (
        run_proxy(pg_server, reads_dsn=pg_server.dsn) as proxy,
        psycopg.connect(tagged(proxy, layer_db, "frq", "op1"), autocommit=True) as conn,
    ):
        conn.execute(BY_TIER, ("pro",), prepare=True).fetchall()
        assert on_fast(proxy)
        for _ in range(20):
            conn.execute(BY_TIER, ("pro",), prepare=True).fetchall()
        assert c_reads(proxy) >= 20
        assert scrape(proxy)["cowproxy_reads_queued"] >= 20  # (taken into the queue by the scrape)
        flush(proxy)
        assert len(recorded(layer_db, "frq")) == 21  # (while the connection is still open, on C)
        assert c_rows(proxy) == 21  # (every one: the first was prepared by Python, run on C)
        more = [conn.execute(BY_TIER, ("basic",), prepare=True).fetchall() for _ in range(5)]
        assert all(len(rows) == 2 for rows in more)
        flush(proxy)  # (nothing took them before)
        assert len(recorded(layer_db, "frq")) == 26


@pytest.mark.parametrize("operation", ["op1", None])
def test_a_closing_connections_last_reads_are_the_c_relays_rows(
    proxies: dict[str, RunningProxy], layer_db: str, operation: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection that closes on the C relay hands back the records its ring still holds (here all of
    them: the periodic take is off): C writes their COPY rows as at a take, no Python object per record,
    and they are the rows the Python relay records for the same reads, in the same order. Without an
    operation id each autocommit read is a read-only transaction of its own, ended before the close."""
    monkeypatch.setattr(server_module, "_TAKE_READS", 3600.0)
    session = f"frc-{operation}"
    fast_proxy = proxies["fast"]
    before = c_rows(fast_proxy)
    for name, proxy in proxies.items():
        dsn = tagged(proxy, layer_db, f"{session}-{name}", operation)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for tier in ("pro", "basic", "nobody", "é\x01'") * 6:
                conn.execute(BY_TIER, (tier,), prepare=True).fetchall()
            conn.execute(JOINED, (2,), prepare=True).fetchall()
            assert name == "python" or on_fast(proxy)
        if name == "fast":  # (the hand-back comes when the C relay sees the close)
            assert wait_for(lambda: c_rows(fast_proxy) - before >= 25, 10), c_rows(proxy) - before
        flush(proxy)
    python, fast = (recorded(layer_db, f"{session}-{name}") for name in proxies)
    assert len(python) == 25 and fast == python
    assert c_rows(fast_proxy) - before == 25  # (every one: the first was prepared by Python, run on C)


def test_reads_without_an_operation_id_on_the_c_relay_take_their_transactions(
    pg_server: PgServer, layer_db: str
) -> None:
    """No operation id in force, on the C relay: each transaction's reads take the operation of its writes
    — a prepared COMMIT (C asks the server before it, as pgbench's END), a simple-query COMMIT (handed
    back: Python asks), a pipelined implicit transaction (C asks before its Sync) — and each read-only
    transaction gets an id of its own."""
    with (
        run_proxy(pg_server, reads_dsn=pg_server.dsn) as proxy,
        psycopg.connect(tagged(proxy, layer_db, "fxo"), autocommit=True) as conn,
    ):
        conn.execute(BY_TIER, ("pro",), prepare=True).fetchall()  # (decided: then taken by C)
        assert on_fast(proxy)
        made = c_reads(proxy)
        for i in range(3):
            conn.execute("BEGIN", prepare=True)
            conn.execute(BY_TIER, ("pro",), prepare=True).fetchall()
            conn.execute("UPDATE customers SET score = %s WHERE id = 1", (i,), prepare=True)
            conn.execute(BY_TIER, ("basic",), prepare=True).fetchall()
            conn.execute("COMMIT", prepare=True)
        with conn.transaction():  # (COMMIT as a simple query)
            conn.execute(BY_TIER, ("pro",), prepare=True).fetchall()
            conn.execute("UPDATE customers SET score = 9 WHERE id = 2", prepare=True)
        with conn.pipeline():
            conn.execute(BY_TIER, ("basic",), prepare=True)
            conn.execute("UPDATE customers SET score = 8 WHERE id = 2", prepare=True)
        for _ in range(2):
            conn.execute(BY_TIER, ("basic",), prepare=True).fetchall()
        assert c_reads(proxy) - made >= 6  # (the prepared transactions at least)
        flush(proxy)
        assert c_rows(proxy) >= 3  # (those after the simple COMMIT's hand-back: C wrote their operations)
    with psycopg.connect(layer_db, autocommit=True) as db:
        ops = [r[0] for r in db.execute("SELECT operation FROM cow.reads WHERE session = 'fxo' ORDER BY seq")]
        writes = db.execute("SELECT operation_id FROM cow.session_changes('fxo') ORDER BY seq").fetchall()
    xacts = list(dict.fromkeys(r[0] for r in writes))
    assert len(xacts) == 5 and all(x.startswith("xact:") for x in xacts)
    first, rest = ops[0], ops[1:]
    assert rest[:6] == [x for x in xacts[:3] for _ in range(2)]
    assert rest[6:8] == xacts[3:5]
    readonly = [first, *rest[8:]]
    assert len(readonly) == 3 == len(set(readonly)) and all(op.startswith("readonly:") for op in readonly)
