"""Read traces: what each tagged operation reads, recorded into ``cow.reads`` without slowing the relay.

With ``cowproxy serve --reads-dsn DSN`` the relay hands a ``ReadRecord`` to ``ReadRecorder.offer`` for each
read statement of a tagged session when its CommandComplete arrives (a SELECT with no writes: its rows from
``SELECT n``). ``offer`` never waits: it puts the record in a bounded queue, and when the queue is full it
drops the record and counts it (``cowproxy_reads_dropped_total``). A writer task of the recorder empties the
queue in batches, one COPY per batch and database, on connections of its own (the DSN's host and role, the
database of the client connection the record came from), and describes each statement there, off the
reply path: its normalised fingerprint (pglast's, constants stripped), the CoW tables it names (from the
JSON parse tree, resolved through the connection's catalog); a read's Bind parameters are stored as they
came, its identity (text and parameters) derived by readers (``cowproxy.read_identity``).
``close`` flushes what is queued. Sessions on the C relay are recorded there: it keeps a compact record per
read and the server offers them here in batches (``ClientConnection.fast_reads``); docs/proxy.md, "Read
traces".
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import struct
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

import asyncpg
from pglast.parser import ParseError, fingerprint, parse_sql_json

from cowproxy.ids import valid_id
from cowproxy.read_identity import identity_of_bytes
from proxy.handoff import Encoder
from proxy.read_trace import PendingRead, ReadsCallback
from proxy.sql.catalog import Catalog
from proxy.tags import strip_edge_comments

log = logging.getLogger("cowproxy")

# Records waiting for the writer; beyond this they are dropped (and counted). ~200 bytes each: ~10 MB. At
# high rates the C relay's records come in takes of ~1,024 per connection (its READ_MARK): room for ~40
# connections' takes at once.
DEFAULT_QUEUE = 50_000
BATCH = 1000  # records per COPY
# The C relay's records come encoded (ReadRecorder.offer_rows): the writer gathers them until half the
# queue's bound, not BATCH. A batch cost the proxy ~0.7 ms of CPU whatever its size (its transaction and
# the COPY's round trips; ~0.4 ms as the COPY alone), which at -S's rates (a take of ~2,000 records each
# time a ring reaches its mark, each a batch) was ~1 µs per read; an encoded record costs ~0.2 µs.
ROWS_BATCH_SHARE = 2
# After the first record of a batch the writer waits this long for more, or until a batch is full (or a
# flush asks): each batch costs the proxy ~0.4 ms of CPU besides its records' (the COPY's exchange; ~0.8 ms
# with a transaction and the session registration), which at 0.2 s was 3 µs per read at TPC-B's rate
# (docs/benchmarks.md, "Read traces").
GATHER = 1.0
MAX_TEXT = 4000  # characters of a statement's text kept
# A session that only reads is still a session: registered as the layer registers one at its first write
# (so it can be listed, scored and discarded); reads that arrive after it was committed or discarded go, as
# its trace went then. A layer installed by this version does it in a trigger of the COPY's own statement
# (cow_reads_register, functions/62_reads.sql): the COPY goes alone, one exchange a batch. An older layer's
# batch is a transaction of the COPY and this statement (four exchanges: ~0.4 ms more of the proxy's CPU).
# Layer 52 stores a read's parameters (cow.reads.params), and readers derive its identity: an older layer's
# rows need the identity itself, which the writer then computes from the rows (``with_identities``).
# Layer 57 stores a run of one session's reads as one row of cow.read_runs (its COPY rows as they are, in a
# bytea; cow.reads is a view that unpacks them): the server's row, key entry, CHECK and trigger are paid once
# per run, not once per read. Its reader cow._run_reads (functions/62_reads.sql) also reads dictionary runs
# (DICT_RUN, which the C relay writes) where cow._dict_run_reads exists; for a layer without it the writer
# decodes them into COPY rows (``run_rows``).
_LAYER_FEATURES = """
SELECT EXISTS (
    SELECT 1 FROM pg_catalog.pg_trigger
    WHERE tgrelid = pg_catalog.to_regclass('cow.reads') AND tgname = 'cow_reads_register'
), EXISTS (
    SELECT 1 FROM pg_catalog.pg_attribute
    WHERE attrelid = pg_catalog.to_regclass('cow.reads') AND attname = 'params' AND NOT attisdropped
), pg_catalog.to_regclass('cow.read_runs') IS NOT NULL,
pg_catalog.to_regclass('cow.read_runs') IS NOT NULL
    AND pg_catalog.to_regprocedure('cow._dict_run_reads(bytea)') IS NOT NULL
"""
_REGISTER = """
WITH ids AS (SELECT unnest($1::text[]) AS id),
registered AS (
    INSERT INTO cow.sessions (session_id) SELECT id FROM ids ON CONFLICT (session_id) DO NOTHING
)
DELETE FROM cow.reads r USING cow.sessions s, ids
WHERE s.session_id = ids.id AND s.status <> 'open' AND r.session = s.session_id
"""
COLUMNS = (
    "session",
    "operation",
    "at",
    "fingerprint",
    "statement",
    "params",
    "relations",
    "rows",
    "duration_us",
)
_CACHE = 4096
# The writer's COPY does not wait for its WAL to reach the disk: at -S's rates a batch is megabytes of WAL,
# and an fsync behind other writers' (on a shared disk, seconds) held the writer while the queue filled and
# dropped records (docs/benchmarks.md, "Read traces: a run of reads a row"). A crash of the server may lose
# the last batches written (under wal_writer_delay's ~3 times), never a session's changes, which are not
# written here.
_WRITER_SETTINGS = {"synchronous_commit": "off"}
# The batch goes as one binary COPY built here (no per-record Python objects for asyncpg to encode): the
# columns a statement's shape fixes first, then the record's own (the statement last of the first: the C relay
# writes a record's own text there for a Query it took by its shape's decision).
COPY_COLUMNS: tuple[str, ...] = (
    "fingerprint",
    "relations",
    "statement",
    "session",
    "operation",
    "at",
    "params",
    "rows",
    "duration_us",
)
# An older layer's (before 52): the same rows with the identity in place of the parameters (with_identities).
COPY_COLUMNS_IDENTITY: tuple[str, ...] = tuple("identity" if c == "params" else c for c in COPY_COLUMNS)
_STATEMENT_FIELD = COPY_COLUMNS.index("statement")
_PARAMS_FIELD = COPY_COLUMNS.index("params")
_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # signature, flags, header extension length
_COPY_TRAILER = b"\xff\xff"
_NULL = b"\xff\xff\xff\xff"
_FIELDS = struct.pack("!h", len(COPY_COLUMNS))
_LENGTH = struct.Struct("!i")
# A record's at (timestamptz: µs since 2000-01-01) before its parameters, and its rows and duration_us after
# them; the same with rows NULL.
_AT = struct.Struct("!iq")
_END = struct.Struct("!iqiq")
_END_NO_ROWS = struct.Struct("!4siq")
_PG_EPOCH = 946_684_800  # 2000-01-01 in Unix time
_TEXT_OID = 25
# A row of cow.read_runs (layer 57): the session, how many reads, their COPY rows (``encode_rows``' format).
RUN_COLUMNS: tuple[str, ...] = ("session", "reads", "data")
_RUN_FIELDS = struct.pack("!h", len(RUN_COLUMNS))
_RUN_COUNT = struct.Struct("!ii")
MAX_RUN = 65_535  # reads a run holds (the layer's CHECK; readers order a run's reads by seq * 65,536 + place)
# A dictionary run (the C relay's takes): each distinct statement once, each read a small entry naming it,
# 30-38 bytes a read besides its parameters where a COPY row of COPY_COLUMNS is ~185 at pgbench -S (the
# bytes C builds, the writer sends and the server compresses and writes: docs/benchmarks.md, "Read traces:
# recording's cost per read, halved"). All integers big-endian; a field is an int32 length (-1: NULL) and
# its bytes, as in binary COPY:
#   int16 -2 (DICT_MARK: an older run starts with its first row's field count, 9)
#   field read_ids (the operations of read-only transactions are "<read_ids>.<n>")
#   int16 k, then k statements: fields fingerprint, relations (binary text[]), statement (NULL: each of its
#     reads brings its own text: a Query C took by its shape's decision)
#   then until the end, one entry per read: int16 its statement's index; its operation: int32 n >= 0 and n
#   bytes, or -1 NULL, -2 the previous entry's, -3 and an int8 t: "<read_ids>.<t>"; int8 at (µs since
#   2000-01-01); field params; int8 rows (-1: NULL); int8 duration_us; field statement if its statement's is
#   NULL.
DICT_MARK = b"\xff\xfe"
_OP_NULL, _OP_SAME, _OP_READONLY = -1, -2, -3
_INT2 = struct.Struct("!h")
_INT8 = struct.Struct("!q")


class ReadRecord(NamedTuple):
    """One read statement of a tagged session, as the relay saw it end (immutable; a tuple: one is made
    per read on the relay's path, at a fraction of a frozen dataclass's cost)."""

    database: str
    session: str
    operation: str | None
    sql: str  # the client's text (not the proxy's rewrite)
    params: bytes | None  # the Bind message's parameters (extended protocol), None for a simple query
    rows: int | None  # from CommandComplete ``SELECT n``
    ended: float  # time.time() when it ended
    duration_us: int
    catalog: Catalog | None = None  # resolves the tables read


class _Rows(NamedTuple):
    """COPY rows the C relay encoded (``encode_rows``' format): ``count`` records of one connection."""

    database: str
    session: str
    data: bytes
    size: int  # records


def _records(items: Iterable[ReadRecord | _Rows]) -> int:
    """How many records a batch holds (a _Rows item is ``size`` of them)."""
    return sum(item.size if isinstance(item, _Rows) else 1 for item in items)


def _parts(items: Sequence[ReadRecord | _Rows], shapes: _Shapes) -> Iterator[bytes]:
    """One database's batch as COPY rows, in order: the C relay's as they came, each run of records between
    them encoded here."""
    run: list[ReadRecord] = []
    for item in items:
        if isinstance(item, _Rows):
            if run:
                yield encode_rows(run, shapes)
                run = []
            yield item.data
        else:
            run.append(item)
    if run:
        yield encode_rows(run, shapes)


def _run_head(session: str, count: int, size: int) -> bytes:
    """A cow.read_runs COPY row up to its data: the session, the run's reads, the data's length."""
    return _RUN_FIELDS + _copy_text(session) + _RUN_COUNT.pack(4, count) + _LENGTH.pack(size)


def _run_parts(items: Sequence[ReadRecord | _Rows], shapes: _Shapes) -> Iterator[bytes]:
    """One database's batch as COPY rows of cow.read_runs, in the order offered: a run for each take of the
    C relay's rows (one connection's: one session), and for each stretch of records between them one run a
    session (a session's records keep their order), of at most MAX_RUN reads."""
    stretch: dict[str, list[ReadRecord]] = {}
    for item in [*items, None]:
        if isinstance(item, ReadRecord):
            stretch.setdefault(item.session, []).append(item)
            continue
        for session, records in stretch.items():
            for start in range(0, len(records), MAX_RUN):
                run = records[start : start + MAX_RUN]
                data = encode_rows(run, shapes)
                yield _run_head(session, len(run), len(data))
                yield data
        stretch = {}
        if item is not None:
            yield _run_head(item.session, item.size, len(item.data))
            yield item.data


# ``new_record(ReadRecord, (nine fields, in order))``: a ReadRecord without the generated __new__'s Python
# frame, a third of the cost of ``ReadRecord(...)``; at one per read on the relays' paths that matters
# (docs/benchmarks.md, "Read traces: the cost of taking and writing records").
new_record = tuple.__new__


@dataclass(frozen=True, slots=True)
class ReadShape:
    """What the text of a read says: its normalised fingerprint and the CoW tables it names."""

    fingerprint: str
    relations: tuple[str, ...]
    text: str = ""  # as kept in cow.reads: tag comments stripped, at most MAX_TEXT characters


@dataclass(frozen=True, slots=True)
class _CopyShape:
    """A shape as the binary COPY needs it, made once per text: the row's start (field count, fingerprint,
    tables, text)."""

    head: bytes
    prefix: bytes  # the head without the text (the C relay's head for a shape's decision)


def _copy_text(value: str) -> bytes:
    data = value.encode()
    return _LENGTH.pack(len(data)) + data


def _copy_text_array(items: tuple[str, ...]) -> bytes:
    """text[] in PostgreSQL's binary format (one dimension from 1; none for an empty array)."""
    if items:
        body = struct.pack("!iiiii", 1, 0, _TEXT_OID, len(items), 1) + b"".join(map(_copy_text, items))
    else:
        body = struct.pack("!iii", 0, 0, _TEXT_OID)
    return _LENGTH.pack(len(body)) + body


def copy_shape(shape: ReadShape) -> _CopyShape:
    prefix = _FIELDS + _copy_text(shape.fingerprint) + _copy_text_array(shape.relations)
    return _CopyShape(prefix + _copy_text(shape.text), prefix)


def _range_vars(tree: Any) -> Iterator[tuple[str | None, str]]:
    """(schema, name) of every relation the JSON parse tree names, CTE references included."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(reversed(node))  # (reversed: popped in the text's order)
        elif isinstance(node, dict):
            rv = node.get("RangeVar")
            if isinstance(rv, dict) and isinstance(rv.get("relname"), str):
                yield rv.get("schemaname"), rv["relname"]
            stack.extend(reversed(node.values()))


def _cte_names(tree: Any) -> set[str]:
    names: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            cte = node.get("CommonTableExpr")
            if isinstance(cte, dict) and isinstance(cte.get("ctename"), str):
                names.add(cte["ctename"])
            stack.extend(node.values())
    return names


def relations_read(sql: str, catalog: Catalog | None) -> tuple[str, ...]:
    """The CoW tables (``schema.table``, in first-mention order) a read's text names."""
    if catalog is None or not catalog.has_cow_tables:
        return ()
    try:
        tree = json.loads(parse_sql_json(sql))
    except ParseError:
        return ()
    ctes = _cte_names(tree)
    found: dict[str, None] = {}
    for schema, name in _range_vars(tree):
        if schema is None and name in ctes:
            continue  # a CTE's name shadows a table's
        table = catalog.lookup(schema, name)
        if table is not None:
            found[table.qualified] = None
    return tuple(found)


def read_fingerprint(sql: str) -> str:
    """pglast's fingerprint (constants stripped); for a text pglast cannot parse, a digest of the text."""
    try:
        return str(fingerprint(sql))
    except ParseError:  # (the server ran it: only a text pglast's grammar lags behind on)
        return "text:" + hashlib.blake2b(sql.encode(), digest_size=8).hexdigest()


def describe_read(sql: str, catalog: Catalog | None) -> ReadShape:
    """The fingerprint and CoW tables of a read's text (uncached; ``_Shapes`` caches)."""
    return ReadShape(read_fingerprint(sql), relations_read(sql, catalog), strip_edge_comments(sql).strip())


class _Shapes:
    """``describe_read`` with LRU caches: by text (agents repeat their reads), and the tables read by
    fingerprint (texts that differ only in their constants, pgbench's, parse once)."""

    def __init__(self, size: int = _CACHE) -> None:
        self.size = size
        self._texts: OrderedDict[tuple[str, int], ReadShape] = OrderedDict()
        self._relations: OrderedDict[tuple[str, int], tuple[str, ...]] = OrderedDict()
        self._copies: dict[ReadShape, _CopyShape] = {}  # (bounded with _texts: cleared when it is full)

    def copy(self, sql: str, catalog: Catalog | None) -> _CopyShape:
        shape = self.get(sql, catalog)
        found = self._copies.get(shape)
        if found is None:
            if len(self._copies) >= self.size:
                self._copies.clear()
            found = self._copies[shape] = copy_shape(shape)
        return found

    def get(self, sql: str, catalog: Catalog | None) -> ReadShape:
        key = (sql, catalog.ident if catalog is not None else 0)
        shape = self._texts.get(key)
        if shape is not None:
            self._texts.move_to_end(key)
            return shape
        print_ = read_fingerprint(sql)
        by_print = (print_, key[1])
        relations = self._relations.get(by_print)
        if relations is None:
            relations = self._relations[by_print] = relations_read(sql, catalog)
            _bound(self._relations, self.size)
        else:
            self._relations.move_to_end(by_print)
        shape = self._texts[key] = ReadShape(print_, relations, strip_edge_comments(sql).strip()[:MAX_TEXT])
        _bound(self._texts, self.size)
        return shape


def _bound(cache: OrderedDict[Any, Any], size: int) -> None:
    if len(cache) > size:
        cache.popitem(last=False)


def encode_copy(records: list[ReadRecord], shapes: _Shapes, rows: tuple[bytes, ...] = ()) -> bytes:
    """The records as one binary COPY of ``COPY_COLUMNS`` (the rows ``record_row`` describes), followed by
    ``rows`` already encoded (the C relay's: ``encode_rows``' format)."""
    return b"".join((_COPY_HEADER, encode_rows(records, shapes), *rows, _COPY_TRAILER))


def encode_rows(records: list[ReadRecord], shapes: _Shapes) -> bytes:
    """The records' COPY rows, without the COPY's header and trailer (the C relay writes the same bytes for
    the records it takes: ``ReadRecorder.encoder``)."""
    parts: list[bytes] = []
    append = parts.append
    sessions: dict[str, bytes] = {}
    seen: dict[tuple[str, int], _CopyShape] = {}  # (a batch repeats its texts; its records hold the catalogs)
    for _, session, operation, sql, params, rows, ended, duration_us, catalog in records:
        key = (sql, id(catalog))
        shape = seen.get(key)
        if shape is None:
            shape = seen[key] = shapes.copy(sql, catalog)
        who = sessions.get(session)
        if who is None:
            who = sessions[session] = _copy_text(session)
        started = int((ended - _PG_EPOCH) * 1e6) - duration_us
        append(shape.head)
        append(who)
        append(_NULL if operation is None else _copy_text(operation))
        append(_AT.pack(8, started))
        if params is None:
            append(_NULL)
        else:
            append(_LENGTH.pack(len(params)))
            append(params)
        if rows is None:
            append(_END_NO_ROWS.pack(_NULL, 8, duration_us))
        else:
            append(_END.pack(8, rows, 8, duration_us))
    return b"".join(parts)


def with_identities(rows: bytes) -> bytes:
    """COPY rows of ``COPY_COLUMNS`` as rows of ``COPY_COLUMNS_IDENTITY``: each row's parameters replaced by
    its identity (for a layer before 52, which stores the identity; the proxy's path no longer hashes)."""
    out: list[bytes] = []
    append = out.append
    unpack = _LENGTH.unpack_from
    pos, end = 0, len(rows)
    while pos < end:
        append(rows[pos : pos + 2])  # (the field count)
        pos += 2
        statement = b""
        for field in range(len(COPY_COLUMNS)):
            (size,) = unpack(rows, pos)
            value = None if size < 0 else rows[pos + 4 : pos + 4 + size]
            if field == _PARAMS_FIELD:
                append(_copy_text(identity_of_bytes(statement, value)))
            else:
                append(rows[pos : pos + 4 + max(size, 0)])
                if field == _STATEMENT_FIELD:
                    statement = value or b""
            pos += 4 + max(size, 0)
    return b"".join(out)


def _field(data: bytes, pos: int) -> tuple[bytes, int]:
    """A field at ``pos`` as COPY writes it (its length and bytes; NULL's length alone), and where it ends."""
    (size,) = _LENGTH.unpack_from(data, pos)
    end = pos + 4 + max(size, 0)
    return data[pos:end], end


def run_rows(run: bytes, session: str) -> bytes:
    """A run of ``session``'s reads as COPY rows of ``COPY_COLUMNS`` (``encode_rows``' bytes): a dictionary
    run (DICT_MARK) decoded, an older run as it is. For a layer whose reader has no dictionary runs (before
    cow._dict_run_reads), and the tests that compare the C relay's runs with ``encode_rows``."""
    if not run.startswith(DICT_MARK):
        return run
    read_ids, pos = _field(run, 2)
    (count,) = _INT2.unpack_from(run, pos)
    pos += 2
    heads: list[tuple[bytes, bool]] = []  # (the row's first fields, whether its reads bring their text)
    for _ in range(count):
        start = pos
        for _ in range(3):
            field, pos = _field(run, pos)
        own = field == _NULL
        heads.append((_FIELDS + run[start : pos - 4 if own else pos], own))
    who, operation = _copy_text(session), _NULL
    out: list[bytes] = []
    append = out.append
    while pos < len(run):
        (index,) = _INT2.unpack_from(run, pos)
        (tag,) = _LENGTH.unpack_from(run, pos + 2)
        pos += 6
        if tag >= 0:
            operation, pos = run[pos - 4 : pos + tag], pos + tag
        elif tag == _OP_READONLY:
            (number,) = _INT8.unpack_from(run, pos)
            operation, pos = _copy_text(f"{read_ids[4:].decode()}.{number}"), pos + 8
        elif tag == _OP_NULL:
            operation = _NULL
        (at,) = _INT8.unpack_from(run, pos)
        params, pos = _field(run, pos + 8)
        rows, duration_us = struct.unpack_from("!qq", run, pos)
        pos += 16
        head, own = heads[index]
        append(head)
        if own:
            text, pos = _field(run, pos)
            append(text)
        append(who)
        append(operation)
        append(_AT.pack(8, at))
        append(params)
        append(_END_NO_ROWS.pack(_NULL, 8, duration_us) if rows < 0 else _END.pack(8, rows, 8, duration_us))
    return b"".join(out)


def _as_rows(item: ReadRecord | _Rows) -> ReadRecord | _Rows:
    """An item as an older layer takes it: the C relay's run as COPY rows (``run_rows``)."""
    return item._replace(data=run_rows(item.data, item.session)) if isinstance(item, _Rows) else item


def record_row(record: ReadRecord, shape: ReadShape) -> tuple[Any, ...]:
    """The ``cow.reads`` row (``COLUMNS``) of a record."""
    text = shape.text
    started = record.ended - record.duration_us / 1e6
    return (
        record.session,
        record.operation,
        datetime.fromtimestamp(started, UTC),
        shape.fingerprint,
        text,
        record.params,
        list(shape.relations),
        record.rows,
        record.duration_us,
    )


class _Pieces:
    """A COPY's bytes for asyncpg as CopyData messages of ~``PIECE`` bytes each, from its parts (the C
    relay's rows of each connection's take), joined only while they are smaller: asyncpg copies a buffer
    given whole into one message grown by doubling, and the batch's join was a copy of its own; pieces
    took a 24,576-row COPY from 8.3 to 3.5 ms of the proxy's CPU (docs/benchmarks.md, "Read traces: the
    identity off the proxy, fewer takes")."""

    PIECE = 256 * 1024

    def __init__(self, parts: Sequence[bytes]) -> None:
        self._parts = iter(parts)

    def __aiter__(self) -> _Pieces:
        return self

    async def __anext__(self) -> bytes:
        group: list[bytes] = []
        size = 0
        for part in self._parts:
            group.append(part)
            size += len(part)
            if size >= self.PIECE:
                break
        if not group:
            raise StopAsyncIteration
        return group[0] if len(group) == 1 else b"".join(group)


class ReadRecorder:
    """The bounded queue between the relay and ``cow.reads``, and the task that writes it."""

    def __init__(self, dsn: str, queue_size: int = DEFAULT_QUEUE, timeout: float = 10.0) -> None:
        self.dsn = dsn
        self.timeout = timeout
        # A deque and an event, not an asyncio.Queue: offer() runs once per read on the relay's path.
        # Records and the C relay's rows (encoded there: offer_rows) in one queue, in the order offered: a
        # connection's reads are written in the order they ended whichever side encoded them (the C relay's
        # rows of a hand-back, then the Python relay's records of the same connection).
        self.queue: deque[ReadRecord | _Rows] = deque()
        self._chunks = 0  # _Rows items in ``queue``
        self._rows_count = 0  # records in those: the queue's bound counts them with the ReadRecords
        self._rows_batch = max(queue_size // ROWS_BATCH_SHARE, 1)  # encoded records that make a batch
        self.queue_size = queue_size
        self._wake = asyncio.Event()
        self._full = asyncio.Event()  # a batch is ready (BATCH records queued, or a flush): no more gathering
        self.recorded = 0
        self.encoded = 0  # of the records offered, those the C relay encoded itself (offer_rows)
        # (relay_full: the C relay's ring of a connection's records was full before Python took them)
        self.dropped: dict[str, int] = {"queue_full": 0, "write_failed": 0, "shutdown": 0, "relay_full": 0}
        self._conns: dict[str, Any] = {}
        # By database, what its layer does (_LAYER_FEATURES): registers sessions; stores parameters.
        self._registers: dict[str, bool] = {}
        self._params: dict[str, bool] = {}
        self._runs: dict[str, bool] = {}  # (layer 57: cow.read_runs)
        self._dict_runs: dict[str, bool] = {}  # (its reader takes dictionary runs: DICT_RUN)
        self._shapes = _Shapes()
        self._task: asyncio.Task[None] | None = None
        self._busy = False
        self._failing: set[str] = set()  # databases whose last write failed (logged once per streak)
        self._closing = False  # flushing for shutdown: no waiting for more records
        self._inflight = 0  # records taken from the queue, not yet written or dropped
        # Offers what was recorded elsewhere and not offered yet (the C relay's records: the server sets it);
        # flush calls it first, so that "everything recorded so far" includes them.
        self.collect: Callable[[], None] = lambda: None

    @property
    def pending(self) -> int:
        """Records queued or being written: 0 when everything offered so far is written (or dropped)."""
        return self._queued_records() + self._inflight

    def _queued_records(self) -> int:
        return len(self.queue) - self._chunks + self._rows_count

    def offer(self, record: ReadRecord) -> None:
        """Called by the relay: queue the record, or drop and count it. Never waits."""
        queue = self.queue
        if len(queue) - self._chunks + self._rows_count >= self.queue_size:
            self.dropped["queue_full"] += 1
            return
        queue.append(record)
        if len(queue) == 1:  # (it was empty: the writer may be waiting)
            self._wake.set()
        elif len(queue) == BATCH:
            self._full.set()

    def offer_many(self, records: list[ReadRecord]) -> None:
        """``offer`` for a batch (the C relay's records): what fits is queued, the rest dropped, counted."""
        queue = self.queue
        room = self.queue_size - self._queued_records()
        if room < len(records):
            self.dropped["queue_full"] += len(records) - max(room, 0)
            records = records[: max(room, 0)]
        if records:
            queue.extend(records)
            self._queued()

    def offer_rows(self, database: str, session: str, data: bytes, count: int) -> None:
        """``offer`` for ``count`` records the C relay encoded as COPY rows (one connection's take): queued
        whole, or dropped whole and counted when they do not fit."""
        if count <= 0:
            return
        if self._queued_records() + count > self.queue_size:
            self.dropped["queue_full"] += count
            return
        self.queue.append(_Rows(database, session, data, count))
        self._chunks += 1
        self._rows_count += count
        self.encoded += count
        self._queued()

    def _queued(self) -> None:
        self._wake.set()  # (the writer may be waiting)
        if len(self.queue) - self._chunks >= BATCH or self._rows_count >= self._rows_batch:
            self._full.set()

    def encoder(
        self,
        session: str,
        operation: str | None,
        read_ids: str,
        texts: Iterable[tuple[int, str, bool]],
        catalog: Catalog | None,
    ) -> Encoder:
        """How the C relay encodes a connection's records itself (``FastRelay.adopt``'s ``encode``): the
        session's and operation's fields, and for each read it may record (ref, text, a shape's) the head of
        its rows, as ``encode_rows`` makes them. A shape's text is an example of the shape
        (``proxy.sql.shapes.example``: its fingerprint and tables are every one of its texts'); each record
        brings its own text, which C writes."""
        heads: list[tuple[int, bytes, bool]] = []
        for ref, sql, shape_of in texts:
            shape = self._shapes.copy(sql, catalog)
            heads.append((ref, shape.prefix, True) if shape_of else (ref, shape.head, False))
        operation_field = None if operation is None else _copy_text(operation)
        return _copy_text(session), operation_field, read_ids.encode(), heads

    def write_soon(self) -> None:
        """What is queued is a batch: the writer stops gathering (the C relay's records, taken once per
        GATHER, have waited that long already; a second wait would only add a wake-up of the loop)."""
        if self.queue:
            self._full.set()

    def for_connection(self, database: str, catalog: Callable[[], Catalog | None]) -> ReadsCallback:
        """The relay's ``reads`` callback for one client connection to ``database``."""
        offer, new = self.offer, new_record

        def ended(read: PendingRead, rows: int | None, seconds: float, at: float) -> None:
            session, operation, sql, params = read.session, read.operation, read.sql, read.params
            duration_us = int(seconds * 1e6)
            fields = (database, session, operation, sql, params, rows, at, duration_us, catalog())
            offer(new(ReadRecord, fields))

        return ended

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        queue = self.queue
        while True:
            if not queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            self._busy = True
            batch: list[ReadRecord | _Rows] = []
            try:
                if (
                    len(queue) - self._chunks < BATCH
                    and self._rows_count < self._rows_batch
                    and not self._closing
                    and not self._full.is_set()
                ):
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(GATHER):
                            await self._full.wait()
                self._full.clear()
                batch = self._take()
                self._inflight = _records(batch)
                await self._write(batch)
            except Exception as exc:
                lost = _records(batch)
                self.dropped["write_failed"] += lost
                log.warning("event=reads_write_failed records=%d error=%r", lost, str(exc))
            finally:
                self._busy = False
                self._inflight = 0

    def _take(self) -> list[ReadRecord | _Rows]:
        """A batch from the queue's front, in order: up to BATCH records, and the encoded rows among and after
        them (their count is bounded by the queue's: one COPY takes them)."""
        queue, records = self.queue, 0
        batch: list[ReadRecord | _Rows] = []
        while queue and (records < BATCH or isinstance(queue[0], _Rows)):
            item = queue.popleft()
            if isinstance(item, _Rows):
                self._chunks -= 1
                self._rows_count -= item.size
            else:
                records += 1
            batch.append(item)
        return batch

    async def _write(self, batch: list[ReadRecord | _Rows]) -> None:
        by_database: dict[str, list[ReadRecord | _Rows]] = {}
        for item in batch:
            by_database.setdefault(item.database, []).append(item)
        for database, items in by_database.items():
            count = _records(items)
            try:
                await self._send(await self._connection(database), database, items)
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                self.dropped["write_failed"] += count
                await self._forget(database)
                if database not in self._failing:
                    self._failing.add(database)
                    log.warning(
                        "event=reads_write_failed database=%s records=%d error=%r",
                        database,
                        count,
                        str(exc),
                    )
                continue
            self._failing.discard(database)
            self.recorded += count

    async def _send(self, conn: Any, database: str, items: list[ReadRecord | _Rows]) -> None:
        """One database's items in one COPY: as runs (layer 57), else a row per read (an older layer's); the C
        relay's runs decoded into COPY rows for a layer that does not read them (``run_rows``)."""
        if not self._dict_runs.get(database, False):
            items = [_as_rows(item) for item in items]
        if self._runs.get(database, False):
            runs = (_COPY_HEADER, *_run_parts(items, self._shapes), _COPY_TRAILER)
            await self._copy(conn, runs, RUN_COLUMNS, "read_runs")
            return
        parts = tuple(_parts(items, self._shapes))
        columns = COPY_COLUMNS
        if not self._params[database]:
            parts, columns = (with_identities(b"".join(parts)),), COPY_COLUMNS_IDENTITY
        data = (_COPY_HEADER, *parts, _COPY_TRAILER)
        if self._registers[database]:
            await self._copy(conn, data, columns)
        else:
            names = {item.session for item in items}
            async with conn.transaction():
                await self._copy(conn, data, columns)
                await conn.execute(_REGISTER, sorted(s for s in names if valid_id(s)))

    @staticmethod
    async def _copy(conn: Any, data: Sequence[bytes], columns: Sequence[str], table: str = "reads") -> None:
        await conn.copy_to_table(
            table, schema_name="cow", columns=columns, source=_Pieces(data), format="binary"
        )

    async def _connection(self, database: str) -> Any:
        conn = self._conns.get(database)
        if conn is None or conn.is_closed():
            async with asyncio.timeout(self.timeout):
                conn = await asyncpg.connect(
                    self.dsn, database=database, timeout=self.timeout, server_settings=_WRITER_SETTINGS
                )
                try:
                    features = await conn.fetchrow(_LAYER_FEATURES)
                    assert features is not None  # (one row, always)
                    self._registers[database], self._params[database] = bool(features[0]), bool(features[1])
                    self._runs[database], self._dict_runs[database] = bool(features[2]), bool(features[3])
                except BaseException:
                    conn.terminate()
                    raise
            self._conns[database] = conn
        return conn

    async def _forget(self, database: str) -> None:
        conn = self._conns.pop(database, None)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.terminate()

    async def flush(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """Wait until every record offered or collected so far is written (or dropped), up to ``timeout``."""
        self.collect()
        self._full.set()  # (the writer stops gathering: write what is queued now)
        deadline = time.monotonic() + timeout
        while (self.queue or self._busy) and time.monotonic() < deadline:
            if self._task is None or self._task.done():
                break
            await asyncio.sleep(0.01)

    async def close(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """Flush, then stop the writer and close its connections."""
        self._closing = True
        await self.flush(timeout)
        self.dropped["shutdown"] += self._queued_records()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for database in list(self._conns):
            conn = self._conns.pop(database)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 2)
