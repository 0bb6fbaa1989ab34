"""The Python side of the fast relay (``proxy._fastrelay``, an epoll thread in C; see docs/proxy.md).

``FastRelay`` wraps one engine per ``ProxyServer``: the statement-kind table and the latency buckets are
given to C at start (the same objects ``query_kind`` and the metrics use), and its counters come back as a
``FastCounts`` at scrape time. Connections go fast and come back in ``proxy.server``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxy.analysis import QUICK_KINDS
from proxy.handoff import (
    Adoption,
    ConnectionState,
    Decision,
    Encoder,
    FastRead,
    Named,
    PromotionsBack,
    TxnCounts,
)
from proxy.metrics import LATENCY_BUCKETS

if TYPE_CHECKING:
    from proxy._fastrelay import Engine
    from proxy._fastrelay import Handback as RawHandback

API_VERSION = 16  # the C module's API_VERSION this code is written against (see proxy/_fastrelay.c)

try:
    from proxy import _fastrelay
except ImportError:  # built without a compiler, or not on Linux
    _fastrelay = None  # type: ignore[assignment]
    UNAVAILABLE: str | None = "proxy._fastrelay is not built (no C compiler at install?)"
else:
    _built = getattr(_fastrelay, "API_VERSION", 0)
    UNAVAILABLE = (
        None
        if _built == API_VERSION
        else f"proxy._fastrelay is a stale build (API {_built}, this code needs {API_VERSION}): "
        "run pip install again to rebuild it"
    )
    if UNAVAILABLE is not None:
        _fastrelay = None  # type: ignore[assignment]

AVAILABLE = _fastrelay is not None

# A Query text of a session C has no decision for, asked of Python: (conn_id, the request's number, the
# text's bytes without its NUL). Answered with FastRelay.answer.
Request = tuple[int, int, bytes]

# What take_reads gives per connection: (conn_id, records C had no head for, as FastRead, the others as one
# run of cow.read_runs (proxy/reads.py, DICT_RUN), how many reads it holds).
TakenReads = tuple[int, list[FastRead], bytes, int]


@dataclass(frozen=True, slots=True)
class Handback:
    """A connection the C relay gives back to Python, with the state Python resumes from (the C relay hands
    it over as a plain tuple; ``from_tuple`` names its fields and makes its ``ConnectionState``)."""

    conn_id: int
    reason: str  # "idle", "recalled", "client closed", "upstream error", ...
    errno: int  # of a socket error (0: none)
    inflight: int  # Query/Sync replies still owed by the server
    untaken: int  # type of the client message C did not take, or -1
    data: bytes  # client bytes read and not forwarded
    state: ConnectionState  # the server's side as C left it, and its transaction's read counts
    statements: list[Named]
    portals: list[Named]
    taken: int  # client messages C took during its stay
    reads: list[FastRead]  # read records done during the stay that C did not write as rows (as take_reads')
    # Reason "rerun": the Query or batch of a statement that may be run again (proxy/rerun.py), as sent, and
    # the server bytes from its ErrorResponse or NoticeResponse on, not forwarded (None and b"" otherwise).
    batch: bytes | None
    server: bytes
    promotions: PromotionsBack  # as C leaves those it was given (proxy/unnamed.py)
    # The done read records C wrote as a run itself (a connection adopted with an encoder: those with a
    # head whose operation is known), and how many: a closing connection's last records need no Python
    # object each, as a take's.
    rows: bytes = b""
    rows_count: int = 0
    # The ParameterStatus messages the server sent during the stay (whole, the last of each name, in the
    # order sent), for a reused server connection's next client (pool.Greeting.reported); None: one was not
    # kept (too long).
    parameters: bytes | None = b""

    @classmethod
    def from_tuple(cls, raw: RawHandback) -> Handback:
        (conn_id, reason, errno, status, inflight, untaken, data, owed, mid_batch, skip) = raw[:10]
        (statements, portals, taken, reads, owed_reads, txn, txn_reads, txn_wrote, txn_xid, batch) = raw[
            10:20
        ]
        # (C sends the flags as ints)
        counts = TxnCounts(txn, txn_reads, bool(txn_wrote), txn_xid)
        state = ConnectionState(status, owed, tuple(owed_reads), bool(mid_batch), bool(skip), counts)
        promotions = PromotionsBack(*raw[21:26])
        return cls(
            conn_id,
            reason,
            errno,
            inflight,
            untaken,
            data,
            state,
            statements,
            portals,
            taken,
            reads,
            batch,
            raw[20],
            promotions,
            raw[26],
            raw[27],
            raw[28],
        )


MAX_WRITE_SLOTS = 4096  # (proxy/_fastrelay.c's)
STMT_WRITES = 4
MAX_QUERY = _fastrelay.MAX_QUERY if _fastrelay is not None else 0


@dataclass(frozen=True)
class FastCounts:
    """What the C relay counted (since start), in the shapes of ``Metrics``."""

    statements: dict[tuple[str, bool], int]
    writes: dict[tuple[str, str], int]  # of tagged connections, by (table, kind)
    decision_hits: int  # tagged texts C took by a cached decision (analysis cache hits)
    shape_hits: int  # of those, taken by the decision of their shape (proxy/sql/shapes.py)
    rewrites: int  # texts sent rewritten: promotions' Parses, decisions' Queries (Metrics.rewrites)
    reads: int  # read records of recorded sessions made on the C relay
    bytes_up: int
    bytes_down: int
    errors: dict[str, int]
    latency_counts: tuple[int, ...]
    latency_sum: float
    connections: int


class FastRelay:
    def __init__(self) -> None:
        if _fastrelay is None:
            raise RuntimeError("proxy._fastrelay is not built")
        self.kinds = sorted({*QUICK_KINDS.values(), "utility", "other"})
        index = {kind: i for i, kind in enumerate(self.kinds)}
        words = [(word.encode(), index[kind]) for word, kind in QUICK_KINDS.items()]
        self.engine: Engine = _fastrelay.Engine(
            words, len(self.kinds), index["utility"], index["other"], LATENCY_BUCKETS
        )
        self.write_slots: dict[tuple[str, str], int] = {}  # (table, kind) -> C's counter of its writes

    def slots(self, writes: tuple[tuple[str, str], ...]) -> tuple[int, ...] | None:
        """C's write counters for a statement's writes; None: too many (Python must count them)."""
        if len(writes) > STMT_WRITES:
            return None
        found = []
        for key in writes:
            slot = self.write_slots.get(key)
            if slot is None:
                if len(self.write_slots) >= MAX_WRITE_SLOTS:
                    return None
                slot = self.write_slots[key] = len(self.write_slots)
            found.append(slot)
        return tuple(found)

    def fileno(self) -> int:
        return self.engine.fileno()

    def adopt(
        self,
        conn_id: int,
        client_fd: int,
        server_fd: int,
        max_message: int,
        adoption: Adoption | None = None,
        *,
        encode: Encoder | None = None,
    ) -> None:
        """Give the C relay a connection, with the state it carries on from (None: an untagged connection
        with no statements, at rest). ``encode``: C makes the runs of its read records itself
        (take_reads: proxy/reads.py, DICT_RUN)."""
        a = adoption or Adoption([], [], False, [], False, False)
        kind = self.kind_index("transaction") if a.resolve else None
        txn = a.state.txn
        given = a.promotions
        self.engine.adopt(
            conn_id,
            client_fd,
            server_fd,
            max_message,
            a.statements,
            a.portals,
            a.tagged,
            a.decisions,
            a.record,
            -1 if kind is None else kind,
            txn.count,
            txn.reads,
            txn.wrote,
            given.rows if given is not None else [],
            given.made if given is not None else 0,
            given.most if given is not None else 0,
            given.alias if given is not None else 0,
            given.alias_promotion if given is not None else -1,
            encode,
            a.ask,
            a.state.status,
        )

    @staticmethod
    def shape_key(text: bytes) -> bytes | None:
        """The C relay's shape key of a statement text (None: no literal, or not followed)."""
        assert _fastrelay is not None
        return _fastrelay.shape_key(text)

    def kind_index(self, kind: str) -> int | None:
        """The C relay's index of a statement kind (None: one it does not count)."""
        try:
            return self.kinds.index(kind)
        except ValueError:
            return None

    def recall(self, conn_id: int) -> Handback | None:
        raw = self.engine.recall(conn_id)
        return None if raw is None else Handback.from_tuple(raw)

    def release(self, conn_id: int) -> bool:
        return self.engine.release(conn_id)

    def take_handbacks(self) -> list[Handback]:
        return [Handback.from_tuple(raw) for raw in self.engine.take_handbacks()]

    def take_requests(self) -> list[Request]:
        """The texts C asks Python to decide, in order (each is to be answered, once)."""
        return self.engine.take_requests()

    def answer(self, conn_id: int, request: int, decision: Decision | None) -> bool:
        """Answer a request: C takes the Query by ``decision``, or hands the connection back at it (None).
        False: the request was void (the connection had left C, the Query with it)."""
        return self.engine.answer(conn_id, request, decision)

    def take_reads(self) -> tuple[int, list[TakenReads]]:
        """The read records done so far on connections still on the C relay, per connection and in order
        (those of a connection handed back come with its ``Handback``): as a run where it was adopted
        with an ``encode``, else as tuples; and how many were dropped since the last call (a connection's
        ring was full)."""
        return self.engine.take_reads()

    def states(self) -> dict[int, tuple[str, int]]:
        return self.engine.states()

    def kind(self, message: bytes) -> str:
        return self.kinds[self.engine.kind(message)]

    def counts(self) -> FastCounts:
        stats = self.engine.stats()
        statements, up, down, errors, latency, latency_sum, conns, tagged, writes = stats[:9]
        hits, reads, shapes, rewrites = stats[9:]
        counted = {(kind, False): n for kind, n in zip(self.kinds, statements, strict=True) if n}
        counted.update({(kind, True): n for kind, n in zip(self.kinds, tagged, strict=True) if n})
        return FastCounts(
            counted,
            {key: writes[slot] for key, slot in self.write_slots.items() if writes[slot]},
            hits,
            shapes,
            rewrites,
            reads,
            up,
            down,
            errors,
            tuple(latency),
            latency_sum,
            conns,
        )

    def close(self) -> None:
        self.engine.close()
