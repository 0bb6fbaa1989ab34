"""Read traces (``cowproxy serve --reads-dsn``): what tagged sessions read lands in ``cow.reads`` through a
real proxy, per operation; a full queue drops and counts and never holds up the relay; the trace goes with
the session; ``cowproxy session reads`` lists it."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import asyncpg
import psycopg
import pytest

from cowproxy.read_identity import identity
from proxy.reads import (
    _COPY_HEADER,
    _COPY_TRAILER,
    COLUMNS,
    COPY_COLUMNS,
    GATHER,
    RUN_COLUMNS,
    ReadRecord,
    ReadRecorder,
    _parts,
    _Rows,
    _run_parts,
    _Shapes,
    encode_copy,
    encode_rows,
    new_record,
    record_row,
)
from proxy.sql.catalog import Catalog
from tests.fix_db import PgServer
from tests.fix_layer import reads_as_layer_56
from tests.fix_proxy import RunningProxy, run_proxy
from tests.layer.test_cli import cli, one_error_line
from tests.proxy.test_fast_relay import scrape
from tests.proxy_sql.catalogs import sample_catalog

pytestmark = pytest.mark.timeout(120)
BOTH_RELAYS = True  # (tests/fix_proxy.py: each test on the C relay and on the Python relay)


@pytest.fixture
def recording(pg_server: PgServer, fast_relay: bool) -> Iterator[RunningProxy]:
    """A proxy that records reads, on the C relay (sessions are recorded there too) or the Python one."""
    with run_proxy(pg_server, reads_dsn=pg_server.dsn, fast_relay=fast_relay) as running:
        yield running


def tagged(proxy: RunningProxy, db: str, session: str, operation: str | None = None) -> str:
    options = f"-c%20cow.session_id%3D{session}"
    if operation is not None:
        options += f"%20-c%20cow.operation_id%3D{operation}"
    return proxy.dsn(db, options=options)


def flush(proxy: RunningProxy) -> None:
    assert proxy.server.reads is not None
    proxy.call(proxy.server.reads.flush(10))


def reads(db: str, session: str) -> list[dict[str, Any]]:
    """The session's rows of cow.reads, the identity as readers derive it (layer 52: the proxy stores the
    parameters, not the identity)."""
    with psycopg.connect(db, autocommit=True) as conn:
        cur = conn.execute(
            "SELECT operation, fingerprint, statement, identity, params, relations, rows, duration_us"
            " FROM cow.reads WHERE session = %s ORDER BY seq",
            (session,),
        )
        names = [d.name for d in cur.description or ()]
        got = [dict(zip(names, row, strict=True)) for row in cur]
    for row in got:
        assert row["identity"] is None  # (derived, not hashed on the proxy's path)
        params = row.pop("params")
        row["identity"] = identity(row["statement"], None if params is None else bytes(params))
    return got


def test_reads_are_recorded_per_operation(recording: RunningProxy, layer_db: str) -> None:
    with psycopg.connect(tagged(recording, layer_db, "s1", "op1"), autocommit=True) as conn:
        # Extended protocol, bound parameters: two lookups with different keys, one repeated.
        for key in (1, 2, 1):
            assert conn.execute("SELECT name FROM customers WHERE id = %s", (key,)).fetchone() is not None
        conn.execute("INSERT INTO customers (email, name) VALUES ('new@x', 'N')")  # a write: not a read
        # Simple query protocol, a join of two CoW tables, the operation switched by a comment.
        cur = psycopg.ClientCursor(conn)
        cur.execute(
            "/*cow_operation='op2'*/ SELECT c.name, o.qty"
            " FROM customers c JOIN orders o ON o.customer_id = c.id"
        )
        assert len(cur.fetchall()) == 4
        cur.execute("SELECT count(*) FROM customers")  # (op1 again: the comment tagged one statement)
        with pytest.raises(psycopg.errors.UndefinedTable):
            conn.execute("SELECT * FROM nope")  # failed: nothing read
    flush(recording)
    got = reads(layer_db, "s1")
    assert [(r["operation"], r["rows"], r["relations"]) for r in got] == [
        ("op1", 1, ["public.customers"]),
        ("op1", 1, ["public.customers"]),
        ("op1", 1, ["public.customers"]),
        ("op2", 4, ["public.customers", "public.orders"]),
        ("op1", 1, ["public.customers"]),
    ]
    lookups = got[:3]
    assert len({r["fingerprint"] for r in lookups}) == 1  # one normalised statement
    assert lookups[0]["identity"] == lookups[2]["identity"] != lookups[1]["identity"]  # key 1 twice
    assert got[3]["statement"].startswith("SELECT c.name")  # the tag comment stripped
    assert all(r["duration_us"] > 0 for r in got)


def test_untagged_traffic_and_a_proxy_without_recording_record_nothing(
    pg_server: PgServer, recording: RunningProxy, layer_db: str
) -> None:
    with psycopg.connect(recording.dsn(layer_db), autocommit=True) as conn:
        conn.execute("SELECT * FROM customers").fetchall()
    with (
        run_proxy(pg_server) as plain,
        psycopg.connect(tagged(plain, layer_db, "s2", "op1"), autocommit=True) as conn,
    ):
        conn.execute("SELECT * FROM customers").fetchall()
        assert plain.server.reads is None
    flush(recording)
    with psycopg.connect(layer_db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM cow.reads").fetchone() == (0,)


class _Silent:
    """A TCP port that accepts and never answers: a reads database that hangs the writer."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


def test_a_full_queue_drops_and_counts_without_holding_the_relay(
    pg_server: PgServer, layer_db: str, fast_relay: bool
) -> None:
    silent = _Silent()
    try:
        with run_proxy(
            pg_server,
            reads_dsn=f"postgresql://postgres@127.0.0.1:{silent.port}/x",
            reads_queue=2,
            fast_relay=fast_relay,
        ) as proxy:
            assert proxy.server.reads is not None
            proxy.server.reads.timeout = 4  # the writer's connect waits this long, then gives up
            with psycopg.connect(tagged(proxy, layer_db, "s3", "op1"), autocommit=True) as conn:
                conn.execute("SELECT 1").fetchone()
                time.sleep(GATHER + 0.3)  # the writer has taken it and hangs connecting
                started = time.monotonic()
                for i in range(30):
                    conn.execute("SELECT name FROM customers WHERE id = %s", (i % 3 + 1,)).fetchone()
                assert time.monotonic() - started < 3  # the relay never waited for the stuck writer
            samples = scrape(proxy)
            # The writer stuck with the first record, up to two queued, the others dropped. (Two on the
            # Python relay; on the C relay its rows of a take or a hand-back are queued or dropped whole: one
            # of them may not fit where a record would.)
            queued = samples["cowproxy_reads_queued"]  # (the one being written counts)
            assert queued == 3 or (fast_relay and queued == 2)
            assert samples['cowproxy_reads_dropped_total{reason="queue_full"}'] == 31 - queued
            proxy.call(proxy.server.reads.flush(15), timeout=30)
            samples = scrape(proxy)
            assert samples['cowproxy_reads_dropped_total{reason="write_failed"}'] == queued
            assert samples["cowproxy_reads_recorded_total"] == 0
    finally:
        silent.close()


def test_a_database_without_the_trace_table_counts_failed_writes(
    recording: RunningProxy, layer_db: str, create_database: Any, layer_template: str
) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        reads_as_layer_56(conn)
        conn.execute("DROP TABLE cow.reads")  # (a layer from before migration 50, as far as the writer sees)
    with psycopg.connect(tagged(recording, layer_db, "s4", "op1"), autocommit=True) as conn:
        conn.execute("SELECT 1").fetchone()
        conn.execute("SELECT 2").fetchone()
    flush(recording)
    samples = scrape(recording)
    assert samples['cowproxy_reads_dropped_total{reason="write_failed"}'] == 2
    # The writer lives on: another database's reads are written.
    other = create_database(template=layer_template)
    with psycopg.connect(tagged(recording, other, "s4", "op1"), autocommit=True) as conn:
        conn.execute("SELECT 1").fetchone()
    flush(recording)
    assert recording.server.reads is not None and recording.server.reads.recorded == 1
    assert len(reads(other, "s4")) == 1


def test_the_trace_goes_with_the_session_and_the_cli_lists_it(recording: RunningProxy, layer_db: str) -> None:
    with psycopg.connect(tagged(recording, layer_db, "s5", "lookup"), autocommit=True) as conn:
        conn.execute("SELECT * FROM customers WHERE tier = %s", ("basic",)).fetchall()
        conn.execute("SELECT * FROM customers WHERE tier = %s", ("basic",)).fetchall()
        conn.execute("/*cow_operation='edit'*/ UPDATE customers SET score = 1 WHERE id = 2")
        conn.execute("/*cow_operation='edit'*/ SELECT * FROM orders").fetchall()
    flush(recording)
    out = cli("session", "reads", "s5", "--format", "json", dsn=layer_db)
    assert out.returncode == 0, out.stderr
    trace = json.loads(out.stdout)
    ops = {o["operation_id"]: o for o in trace["operations"]}
    assert ops["lookup"]["statements"] == 2 and ops["lookup"]["repeated"] == 1
    assert ops["lookup"]["rows"] == 2 + 2 and ops["lookup"]["relations"] == ["public.customers"]
    assert ops["edit"]["statements"] == 1 and ops["edit"]["rows"] == 4
    assert ops["edit"]["relations"] == ["public.orders"]
    assert trace["statements"] == 3
    text = cli("session", "reads", "s5", dsn=layer_db)
    assert text.returncode == 0
    assert "operation lookup: 2 statements, 4 rows, 1 repeated; tables public.customers" in text.stdout
    one_error_line(cli("session", "reads", "nobody", dsn=layer_db), "unknown session nobody")
    one_error_line(cli("session", "reads", "bad id", dsn=layer_db), "invalid session id")
    assert cli("session", "discard", "s5", dsn=layer_db).returncode == 0
    assert reads(layer_db, "s5") == []
    assert "no reads recorded" in cli("session", "reads", "s5", dsn=layer_db).stdout  # (registered: known)


def test_a_text_with_tabs_newlines_and_backslashes_is_kept_as_sent(
    recording: RunningProxy, layer_db: str
) -> None:
    sql = "SELECT 'tab\there', E'back\\\\slash \\\\N',\n  name FROM customers WHERE id = %s"
    with psycopg.connect(tagged(recording, layer_db, "s6", "op1"), autocommit=True) as conn:
        assert conn.execute(sql, (1,)).fetchone() == ("tab\there", "back\\slash \\N", "Ada")
    flush(recording)
    (got,) = reads(layer_db, "s6")
    assert got["statement"] == sql.replace("%s", "$1")


@pytest.mark.parametrize("layer", ["trigger", "older"])
def test_a_session_that_only_reads_is_registered_and_can_be_discarded(
    pg_server: PgServer, fast_relay: bool, layer_db: str, layer: str
) -> None:
    """The layer registers the sessions of the rows the writer's COPY adds (cow_reads_register); with a
    layer from before that trigger the writer registers them itself, in the COPY's transaction."""
    if layer == "older":
        with psycopg.connect(layer_db, autocommit=True) as conn:
            reads_as_layer_56(conn)
            conn.execute("DROP TRIGGER cow_reads_register ON cow.reads")
    with run_proxy(pg_server, reads_dsn=pg_server.dsn, fast_relay=fast_relay) as recording:
        _read_only_session(recording, layer_db)


def test_a_layer_before_52_gets_identities_from_the_writer(
    pg_server: PgServer, fast_relay: bool, layer_db: str
) -> None:
    """A layer without cow.reads.params (before 52) stores identities: the writer derives them from the
    rows it sends (the relays no longer hash), the same that readers derive from a layer 52 row."""
    with psycopg.connect(layer_db, autocommit=True) as conn:
        reads_as_layer_56(conn)
        conn.execute("ALTER TABLE cow.reads DROP COLUMN params, ALTER COLUMN identity SET NOT NULL")
    with (
        run_proxy(pg_server, reads_dsn=pg_server.dsn, fast_relay=fast_relay) as recording,
        psycopg.connect(tagged(recording, layer_db, "l51", "op1"), autocommit=True) as conn,
    ):
        for key in (1, 2, 1):
            conn.execute("SELECT name FROM customers WHERE id = %s", (key,), prepare=True).fetchone()
        psycopg.ClientCursor(conn).execute("SELECT count(*) FROM customers")
        flush(recording)
    with psycopg.connect(layer_db, autocommit=True) as conn:
        got = conn.execute(
            "SELECT statement, identity FROM cow.reads WHERE session = 'l51' ORDER BY seq"
        ).fetchall()
    assert len(got) == 4
    assert got[0][1] == got[2][1] != got[1][1]
    assert got[3][1] == identity(got[3][0], None)
    out = cli("session", "reads", "l51", "--format", "json", dsn=layer_db)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["operations"][0]["repeated"] == 1


def _read_only_session(recording: RunningProxy, layer_db: str) -> None:
    with psycopg.connect(tagged(recording, layer_db, "ro1", "look"), autocommit=True) as conn:
        conn.execute("SELECT * FROM customers").fetchall()
    flush(recording)
    assert len(reads(layer_db, "ro1")) == 1
    listed_out = cli("session", "list", "--format", "json", dsn=layer_db)
    assert listed_out.returncode == 0, listed_out.stderr
    assert "ro1" in {s["session_id"] for s in json.loads(listed_out.stdout)}
    assert cli("session", "discard", "ro1", dsn=layer_db).returncode == 0
    assert reads(layer_db, "ro1") == []
    # A read recorded after the session closed goes too, as its trace went at the close.
    with psycopg.connect(tagged(recording, layer_db, "ro1", "late"), autocommit=True) as conn:
        conn.execute("SELECT * FROM customers").fetchall()
    flush(recording)
    assert reads(layer_db, "ro1") == []


def change_operations(db: str, session: str) -> list[str]:
    with psycopg.connect(db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT operation_id FROM cow.session_changes(%s) ORDER BY seq", (session,)
        ).fetchall()
        return [r[0] for r in rows]


def test_reads_without_an_operation_id_take_their_transactions(
    recording: RunningProxy, layer_db: str
) -> None:
    """No operation id in force: a read in a transaction that writes gets the layer's operation of those
    writes ('xact:' and the transaction id), whether it comes before or after the first write, by prepared,
    extended or simple statements; a read-only transaction gets an id of its own."""
    with psycopg.connect(tagged(recording, layer_db, "nx1")) as conn:
        conn.execute("SELECT name FROM customers WHERE id = %s", (1,), prepare=True).fetchone()
        conn.execute("UPDATE customers SET score = 3 WHERE id = %s", (1,))
        conn.execute("SELECT name FROM customers WHERE id = %s", (2,), prepare=True).fetchone()
        conn.commit()  # (psycopg: COMMIT as a simple query)
        conn.execute("SELECT count(*) FROM orders").fetchone()  # a transaction that only reads
        conn.commit()
        cur = psycopg.ClientCursor(conn)  # simple protocol, literals
        cur.execute("SELECT name FROM customers WHERE id = 3")
        cur.execute("UPDATE customers SET score = 4 WHERE id = 3")
        conn.commit()
    with psycopg.connect(tagged(recording, layer_db, "nx1"), autocommit=True) as conn:
        # Implicit transactions: a read alone, and a read and a write in one extended batch.
        conn.execute("SELECT name FROM customers WHERE id = %s", (2,)).fetchone()
        with conn.pipeline():
            conn.execute("SELECT name FROM customers WHERE id = %s", (3,))
            conn.execute("UPDATE customers SET score = 5 WHERE id = %s", (2,))
    flush(recording)
    got = [r["operation"] for r in reads(layer_db, "nx1")]
    first, second, third = dict.fromkeys(change_operations(layer_db, "nx1"))
    assert all(op.startswith("xact:") for op in (first, second, third))
    ro_txn, lone = got[2], got[4]
    assert got == [first, first, ro_txn, second, lone, third]
    assert ro_txn.startswith("readonly:") and lone.startswith("readonly:") and ro_txn != lone
    # Listed per operation, under the ids the writes have.
    out = cli("session", "reads", "nx1", "--format", "json", dsn=layer_db)
    assert out.returncode == 0, out.stderr
    listed = [(o["operation_id"], o["statements"]) for o in json.loads(out.stdout)["operations"]]
    assert listed == [(first, 2), (ro_txn, 1), (second, 1), (lone, 1), (third, 1)]


_KEYED = "SELECT * FROM projects p JOIN issues i ON i.project_id = p.id WHERE p.id = $1"


def _odd_records(session: str, catalog: Catalog, now: float) -> list[ReadRecord]:
    """Records with texts of any characters, NULL and non-NULL operations and rows, tables or none,
    parameters or none."""
    odd = "SELECT 'tab\there', E'\\\\N', 'é' FROM projects"
    return [
        ReadRecord("d", session, "op1", _KEYED, b"\0\x01\0\0\0\x011", 1, now, 7, catalog),
        ReadRecord("d", session, None, odd, None, None, now, 12, catalog),
        ReadRecord("d", session, "xact:99", "SELECT 1", b"", 0, now + 1, 1_000_000, None),
    ]


def _copy_and_read(
    layer_db: str, table: str, columns: Sequence[str], data: bytes, session: str
) -> list[tuple[Any, ...]]:
    """A binary COPY of ``data`` into cow.<table>, then the session's rows of cow.reads (COLUMNS) by seq."""

    async def run() -> list[tuple[Any, ...]]:
        conn = await asyncpg.connect(layer_db)
        try:
            await conn.copy_to_table(
                table, schema_name="cow", columns=columns, source=memoryview(data), format="binary"
            )
            got = await conn.fetch(
                f"SELECT {', '.join(COLUMNS)} FROM cow.reads WHERE session = $1 ORDER BY seq", session
            )
            return [tuple(r) for r in got]
        finally:
            await conn.close()

    return asyncio.run(run())


def test_the_binary_copy_writes_the_rows_record_row_describes(layer_db: str) -> None:
    """The writer's COPY (built as bytes) stores what the per-record tuples would: texts with any
    characters, NULL and non-NULL operations and rows, tables or none, parameters or none."""
    catalog = sample_catalog()
    records = _odd_records("cp1", catalog, time.time())
    shapes = _Shapes()
    expected = [record_row(r, shapes.get(r.sql, r.catalog)) for r in records]
    got = _copy_and_read(layer_db, "reads", COPY_COLUMNS, encode_copy(records, shapes), "cp1")
    assert [g[:2] + g[3:] for g in got] == [e[:2] + e[3:] for e in expected]
    assert got[0][6] == ["public.projects", "public.issues"] and got[2][6] == []
    assert all(abs((g[2] - e[2]).total_seconds()) < 2e-6 for g, e in zip(got, expected, strict=True))


def test_write_soon_ends_the_writers_gathering_and_only_with_records_queued() -> None:
    """The C relay's records are taken once per GATHER and written at once (``write_soon``): the writer
    does not gather a second time; records offered one by one (the Python relay) still wait GATHER for
    company; and ``write_soon`` on an empty queue leaves the next record to gather."""
    written: list[tuple[float, int]] = []

    async def scenario() -> list[tuple[float, int]]:
        recorder = ReadRecorder("postgresql://unused@127.0.0.1:1/x")

        async def write(batch: list[ReadRecord], rows: Sequence[Any] = ()) -> None:
            written.append((time.monotonic() - started, len(batch)))

        recorder._write = write  # type: ignore[method-assign]
        record = ReadRecord("d", "ws1", "op1", "SELECT 1", None, 1, time.time(), 5)
        recorder.start()
        started = time.monotonic()
        recorder.write_soon()  # (nothing queued: no effect)
        recorder.offer_many([record, record])
        recorder.write_soon()
        await asyncio.sleep(0.2)
        started = time.monotonic()
        recorder.offer(record)
        await asyncio.sleep(GATHER + 0.3)
        await recorder.close()
        return written

    got = asyncio.run(scenario())
    assert [n for _, n in got] == [2, 1]
    assert got[0][0] < 0.15  # written at once
    assert got[1][0] >= GATHER - 0.05  # gathered


def test_new_record_makes_the_named_tuple_the_constructor_makes() -> None:
    """The relays make records with ``new_record(ReadRecord, fields)`` (no Python frame): the same record,
    fields by name included, as ``ReadRecord(...)``."""
    fields = ("d", "nr1", None, "SELECT $1", b"\0\x01\0\0\0\x011", None, 1.5, 7, None)
    made = new_record(ReadRecord, fields)
    assert type(made) is ReadRecord
    assert made == ReadRecord(*fields)
    assert (made.session, made.params, made.rows, made.duration_us) == ("nr1", fields[4], None, 7)


def test_the_c_relays_encoded_rows_share_the_queues_bound_and_are_written_whole() -> None:
    """``offer_rows`` (a connection's records the C relay encoded): counted against the queue's bound with
    the records, queued whole or dropped whole and counted (``queue_full``), written in one COPY with the
    records queued beside them, in the order offered; half the bound of encoded rows ends the writer's
    gathering."""
    written: list[list[int | str]] = []

    async def scenario() -> tuple[dict[str, int], int, int]:
        recorder = ReadRecorder("postgresql://unused@127.0.0.1:1/x", queue_size=10)

        async def write(batch: Sequence[Any]) -> None:
            written.append([item.size if isinstance(item, _Rows) else item.sql for item in batch])

        recorder._write = write  # type: ignore[method-assign]
        record = ReadRecord("d", "er1", "op1", "SELECT 1", None, 1, time.time(), 5)
        recorder.offer_rows("d", "er1", b"x" * 6, 4)
        recorder.offer(record)
        recorder.offer_rows("d", "er1", b"y" * 9, 6)  # (4 + 1 + 6 > 10: dropped whole)
        pending = recorder.pending
        recorder.start()
        recorder.offer_rows("d", "er1", b"z", 1)  # (5 encoded: half the bound, written without gathering)
        await asyncio.sleep(0.3)
        gathered = len(written)
        await recorder.close()
        return recorder.dropped, pending, gathered

    dropped, pending, gathered = asyncio.run(scenario())
    assert pending == 5 and dropped["queue_full"] == 6
    assert gathered == 1 and written == [[4, "SELECT 1", 1]]


def test_a_batch_keeps_the_order_offered_across_python_records_and_c_rows() -> None:
    """The writer's COPY of one database: each run of Python's records encoded where it stands between the
    C relay's rows (a connection's rows of a hand-back, then the reads the Python relay recorded after it),
    byte for byte; another database's items go to its own COPY."""
    now = time.time()
    first, second, third = (
        ReadRecord("d", "or1", "op1", f"SELECT {i}", bytes([i, 0, 255]), i, now + i, 5, None)
        for i in range(3)
    )
    other = ReadRecord("e", "or1", "op1", "SELECT 9", None, None, now, 5, None)
    c_rows = _Rows("d", "or1", b"<C's rows>", 2)
    shapes = _Shapes()
    items = [first, second, c_rows, third]
    assert list(_parts(items, shapes)) == [
        encode_rows([first, second], shapes),
        b"<C's rows>",
        encode_rows([third], shapes),
    ]
    written: list[tuple[str, bytes]] = []

    async def scenario() -> None:
        recorder = ReadRecorder("postgresql://unused@127.0.0.1:1/x")

        async def connection(database: str) -> object:
            recorder._registers[database] = recorder._params[database] = True
            return database

        async def copy(conn: Any, data: Sequence[bytes], columns: Sequence[str]) -> None:
            written.append((conn, b"".join(data)))

        recorder._connection = connection  # type: ignore[method-assign]
        recorder._copy = copy  # type: ignore[method-assign,assignment]
        for item in (first, other, second):
            recorder.offer(item)
        recorder.offer_rows("d", "or1", b"<C's rows>", 2)
        recorder.offer(third)
        assert recorder.pending == 6
        await recorder._write(recorder._take())
        assert recorder.pending == 0 and recorder.recorded == 6

    asyncio.run(scenario())
    body = b"".join(_parts(items, shapes))
    assert written == [
        ("d", _COPY_HEADER + body + _COPY_TRAILER),
        ("e", _COPY_HEADER + encode_rows([other], shapes) + _COPY_TRAILER),
    ]


def test_the_writer_stores_a_run_a_session_not_a_row_a_read(recording: RunningProxy, layer_db: str) -> None:
    """Layer 57: the reads the writer takes in one batch are a row of cow.read_runs per session (per take of
    the C relay's), not a row each; cow.reads unpacks them in order, and nothing goes to cow.read_rows."""
    returned = []
    with psycopg.connect(tagged(recording, layer_db, "run1", "op1"), autocommit=True) as conn:
        for key in range(1, 41):
            returned.append(
                len(conn.execute("SELECT name FROM customers WHERE id = %s", (key % 4,)).fetchall())
            )
        psycopg.ClientCursor(conn).execute("SELECT count(*) FROM orders")
    flush(recording)
    got = reads(layer_db, "run1")
    assert len(got) == 41 and got[-1]["relations"] == ["public.orders"]
    assert [r["rows"] for r in got] == [*returned, 1] and 0 in returned
    with psycopg.connect(layer_db, autocommit=True) as conn:
        runs, held = conn.execute(
            "SELECT count(*), sum(reads) FROM cow.read_runs WHERE session = 'run1'"
        ).fetchone()
        assert held == 41 and 1 <= runs <= 4, runs  # (a take or two of C's, the Python relay's batches)
        assert conn.execute("SELECT count(*) FROM cow.read_rows").fetchone() == (0,)
        seqs = [r[0] for r in conn.execute("SELECT seq FROM cow.reads WHERE session = 'run1' ORDER BY seq")]
        assert len(set(seqs)) == 41


def test_a_batchs_runs_keep_the_order_offered_one_a_session_of_each_stretch() -> None:
    """The writer's COPY into cow.read_runs: a run for each take of C's rows as it came, and for each stretch
    of Python's records between them one run a session, its records in order."""
    now = time.time()
    a1, b1, a2 = (
        ReadRecord("d", s, "op1", f"SELECT {i}", None, i, now + i, 5, None)
        for i, s in enumerate(("ra", "rb", "ra"))
    )
    a3 = ReadRecord("d", "ra", None, "SELECT 3", b"\x01", None, now, 5, None)
    c_rows = _Rows("d", "rc", b"<C's rows>", 7)
    shapes = _Shapes()
    got = b"".join(_run_parts([a1, b1, a2, c_rows, a3], shapes))
    expected = [
        (b"ra", 2, encode_rows([a1, a2], shapes)),
        (b"rb", 1, encode_rows([b1], shapes)),
        (b"rc", 7, b"<C's rows>"),
        (b"ra", 1, encode_rows([a3], shapes)),
    ]
    assert got == b"".join(
        struct.pack("!hi", 3, len(s)) + s + struct.pack("!iii", 4, n, len(d)) + d for s, n, d in expected
    )


def test_a_run_unpacks_to_the_rows_record_row_describes(layer_db: str) -> None:
    """cow.reads' rows of a run (cow._run_reads over the COPY rows the writer and the C relay make) are the
    rows the records describe, NULLs, tables, odd texts and large values included."""
    catalog = sample_catalog()
    now = time.time()
    records = [
        *_odd_records("ur1", catalog, now),
        ReadRecord("d", "ur1", "op1", _KEYED, b"\xff" * 300, 2**40, now + 2.5, 0, catalog),
        ReadRecord("d", "ur1", "op2", "SELECT 2", None, 3, 1e9, 2**33, catalog),
    ]
    shapes = _Shapes()
    expected = [record_row(r, shapes.get(r.sql, r.catalog)) for r in records]
    data = _COPY_HEADER + b"".join(_run_parts(records, shapes)) + _COPY_TRAILER
    got = _copy_and_read(layer_db, "read_runs", RUN_COLUMNS, data, "ur1")
    # (at: the COPY's whole µs against record_row's float arithmetic, as in the test above)
    assert [g[:2] + g[3:] for g in got] == [e[:2] + e[3:] for e in expected]
    assert all(abs((g[2] - e[2]).total_seconds()) <= 1e-6 for g, e in zip(got, expected, strict=True))
