"""The Python side of the fast relay (``proxy._fastrelay``, an epoll thread in C; see docs/proxy.md).

``FastRelay`` wraps one engine per ``ProxyServer``: the statement-kind table and the latency buckets are
given to C at start (the same objects ``query_kind`` and the metrics use), and its counters come back as a
``FastCounts`` at scrape time. Connections go fast and come back in ``proxy.server``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxy.analysis import QUICK_KINDS
from proxy.metrics import LATENCY_BUCKETS

if TYPE_CHECKING:
    from proxy._fastrelay import Engine
    from proxy._fastrelay import Handback as RawHandback

API_VERSION = 7  # the C module's API_VERSION this code is written against (see proxy/_fastrelay.c)

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

# A prepared statement or portal as the C relay hands it back: (name, index into the Statements Python gave
# at adoption or -1, the text of one prepared on the C relay or None, a recorded read's portal: its Bind
# parameters, or None).
Named = tuple[bytes, int, bytes | None, bytes | None]

# A read record made on the C relay: (Python's statement index, or -(decision index + 1); rows of SELECT n or
# None; wall-clock end; duration in µs; Bind parameters or None; its transaction's number on the connection,
# as Relay.trace.txn counts them; the transaction's id once it ended, if C asked and it had one, else 0);
# and one in flight at hand-back: (position among the replies owed, ref, monotonic start, Bind parameters
# or None).
FastRead = tuple[int, int | None, float, int, bytes | None, int, int]
OwedRead = tuple[int, int, float, bytes | None]


@dataclass(frozen=True, slots=True)
class Handback:
    """A connection the C relay gives back to Python, with the state Python resumes from (the C relay hands
    it over as a plain tuple in this field order; ``from_tuple`` names the fields)."""

    conn_id: int
    reason: str  # "idle", "recalled", "client closed", "upstream error", ...
    errno: int  # of a socket error (0: none)
    status: str  # transaction status: I, T or E
    inflight: int  # Query/Sync replies still owed by the server
    untaken: int  # type of the client message C did not take, or -1
    data: bytes  # client bytes read and not forwarded
    owed: str  # kinds of the replies owed (Relay.pending), as Kind letters: Q S P B D E C
    mid_batch: bool
    skip_until_sync: bool
    statements: list[Named]
    portals: list[Named]
    taken: int  # client messages C took during its stay
    reads: list[FastRead]  # read records done during the stay (see FastRelay.take_reads)
    owed_reads: list[OwedRead]  # (position in ``owed``, ref, started, Bind parameters): reads in flight
    # Relay.trace.txn as C left it: transactions ended, reads with no operation id and a statement that may
    # write sent since the connection was last idle.
    txn: int
    txn_reads: int
    txn_wrote: bool
    txn_xid: int  # the open transaction's id, when C asked and it had one (else 0)
    # Reason "rerun": the Query or batch of a statement that may be run again (proxy/rerun.py), as sent, and
    # the server bytes from its ErrorResponse or NoticeResponse on, not forwarded (None and b"" otherwise).
    batch: bytes | None
    server: bytes

    @classmethod
    def from_tuple(cls, raw: RawHandback) -> Handback:
        # C sends the flags as ints
        return cls(*raw[:8], bool(raw[8]), bool(raw[9]), *raw[10:17], bool(raw[17]), *raw[18:])


# What Python knows at adoption: (name, index, kind index, only Python may bind it, write slots, its
# Executes are reads of a recorded session, it may be run again after the layer's row-changed 40001:
# watched when it starts an implicit transaction, proxy/rerun.py)
Known = tuple[bytes, int, int, bool, tuple[int, ...], bool, bool]
# A statement text of a tagged connection that C forwards as is: (message type + text, kind index, write
# slots, a read of a recorded session, as Known's last) — Relay.decisions; a lower-case type: the key is the
# text's shape, and the decision holds for every text of that shape (proxy/sql/shapes.py).
Decision = tuple[bytes, int, tuple[int, ...], bool, bool]
MAX_WRITE_SLOTS = 256
STMT_WRITES = 4
MAX_QUERY = _fastrelay.MAX_QUERY if _fastrelay is not None else 0


@dataclass(frozen=True)
class FastCounts:
    """What the C relay counted (since start), in the shapes of ``Metrics``."""

    statements: dict[tuple[str, bool], int]
    writes: dict[tuple[str, str], int]  # of tagged connections, by (table, kind)
    decision_hits: int  # tagged texts C took by a cached decision (analysis cache hits)
    shape_hits: int  # of those, taken by the decision of their shape (proxy/sql/shapes.py)
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
        *,
        statements: list[Known] | None = None,
        portals: list[Known] | None = None,
        tagged: bool = False,
        decisions: list[Decision] | None = None,
        record: bool = False,
        resolve: bool = False,
        txn: tuple[int, int, bool] = (0, 0, False),
    ) -> None:
        """``record``: its session's reads are recorded (the statements and decisions say which are reads).
        ``resolve``: they have no operation id, and take their transaction's: C asks the server the
        transaction's id before the end of one that read and may have written, as Relay does (docs/proxy.md).
        ``txn``: Relay.trace.txn's (count, reads, wrote)."""
        kind = self.kind_index("transaction") if resolve else None
        count, reads, wrote = txn
        self.engine.adopt(
            conn_id,
            client_fd,
            server_fd,
            max_message,
            statements or [],
            portals or [],
            tagged,
            decisions or [],
            record,
            -1 if kind is None else kind,
            count,
            reads,
            wrote,
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

    def take_reads(self) -> tuple[int, list[tuple[int, list[FastRead]]]]:
        """The read records done so far on connections still on the C relay, per connection and in order
        (those of a connection handed back come with its ``Handback``), and how many were dropped since
        the last call (a connection's ring was full)."""
        return self.engine.take_reads()

    def states(self) -> dict[int, tuple[str, int]]:
        return self.engine.states()

    def kind(self, message: bytes) -> str:
        return self.kinds[self.engine.kind(message)]

    def counts(self) -> FastCounts:
        statements, up, down, errors, latency, latency_sum, conns, tagged, writes, hits, reads, shapes = (
            self.engine.stats()
        )
        counted = {(kind, False): n for kind, n in zip(self.kinds, statements, strict=True) if n}
        counted.update({(kind, True): n for kind, n in zip(self.kinds, tagged, strict=True) if n})
        return FastCounts(
            counted,
            {key: writes[slot] for key, slot in self.write_slots.items() if writes[slot]},
            hits,
            shapes,
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
