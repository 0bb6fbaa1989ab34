"""The reply queue: what each message sent upstream will be answered with, and the server's replies read by
their headers against it.

The relay pushes an ``Entry`` for every message it forwards or injects; ``ReplyQueue`` takes it off when the
reply that ends it comes (``Kind`` says which one that is), keeps the transaction status, the extended batch
and COPY FROM STDIN the server is in, relays the replies nobody needs to see whole (the scanner's PASS), drops
those of the proxy's own statements, and asks its ``Owner`` (the relay) about the rest: a reply of a statement
it watches, an ErrorResponse, a ReadyForQuery.
"""

from __future__ import annotations

import enum
import struct
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from proxy import protocol as p
from proxy.sql.rewrites import app_path

if TYPE_CHECKING:  # (the relay imports this module: annotations only)
    from proxy.handoff import ConnectionState
    from proxy.read_trace import PendingRead


class Kind(enum.IntEnum):
    """What a forwarded message will be answered with (and so which reply ends it)."""

    QUERY = 1  # simple Query: ends with ReadyForQuery
    FUNC = 2  # FunctionCall: ends with ReadyForQuery
    SYNC = 3  # ends with ReadyForQuery
    PARSE = 4  # ParseComplete
    BIND = 5  # BindComplete
    DESCRIBE = 6  # RowDescription or NoData (after ParameterDescription for a statement)
    EXECUTE = 7  # CommandComplete, EmptyQueryResponse or PortalSuspended
    CLOSE = 8  # CloseComplete


@dataclass(slots=True)
class Entry:
    kind: Kind
    injected: bool = False
    replace_error: bytes | None = None  # send this instead of the server's ErrorResponse
    forward_error: bool = False  # an injected entry whose error the client must see
    tag_map: tuple[str, str] | None = None
    capture: list[tuple[str | None, ...]] | None = None
    on_done: Callable[[bool], None] | None = None  # injected: called with ok when answered
    started: float = 0.0
    copy_epoch: int = (
        0  # the client's CopyDone/CopyFail count when it was sent (see ReplyQueue._copy_started)
    )
    rewritten: bool = False  # a Query or Parse sent with the analysis' SQL instead of the client's
    promoted: str | None = None  # a Bind or Describe sent to this proxy-owned statement (proxy/unnamed.py)
    read: PendingRead | None = None  # a tagged session's read to report when its CommandComplete comes
    # A statement the proxy may run again (proxy/rerun.py): its replies so far, held until one shows whether
    # it failed with the layer's row-changed 40001 (None: forwarded as they come).
    held: list[bytes] | None = None
    echo: bool = False  # sent again for a new run: the client already has its reply (dropped)


ENDS_WITH_READY = (Kind.QUERY, Kind.FUNC, Kind.SYNC)
# The replies owed as the C relay reports them (fastrelay.Handback.owed): one letter per entry.
KIND_LETTERS = {
    "Q": Kind.QUERY,
    "S": Kind.SYNC,
    "P": Kind.PARSE,
    "B": Kind.BIND,
    "D": Kind.DESCRIBE,
    "E": Kind.EXECUTE,
    "C": Kind.CLOSE,
}
_TERMINATOR: dict[int, tuple[Kind, ...]] = {
    ord("1"): (Kind.PARSE,),
    ord("2"): (Kind.BIND,),
    ord("3"): (Kind.CLOSE,),
    ord("T"): (Kind.DESCRIBE,),
    ord("n"): (Kind.DESCRIBE,),
    ord("C"): (Kind.EXECUTE,),
    ord("I"): (Kind.EXECUTE,),
    ord("s"): (Kind.EXECUTE,),
}
_COPY_IN = (ord("G"), ord("W"))  # CopyInResponse, CopyBothResponse
_READY_HEADER = b"Z\x00\x00\x00\x05"
_STATUSES = frozenset(b"ITE")
_STATUS_CHARS = {c: chr(c) for c in b"ITE"}
_INT32 = struct.Struct("!I")
_Z = ord("Z")
_E = ord("E")
_C = ord("C")
_D = ord("D")
_A = ord("A")
_S = ord("S")


class Owner(Protocol):
    """What the reply queue asks its connection (the relay) about the replies of the client's statements."""

    def answer(self, head: Entry, kind: int, body: bytes, raw: bytes) -> bytes | None:
        """A reply to ``head``, a statement whose replies are watched (``Entry.watched``): what the client
        gets (None: nothing, and the entry is not done)."""

    def failed(self, head: Entry | None, fields: p.ErrorFields, raw: bytes) -> bytes:
        """An ErrorResponse for ``head`` (None: nothing owed): what the client gets."""

    def ready(self, head: Entry | None, status: str, raw: bytes) -> bytes:
        """A ReadyForQuery that ends ``head`` (None: no entry waited for it): what the client gets."""


class ReplyQueue:
    """The replies one connection is owed, in order, and the server's state they show."""

    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self.pending: deque[Entry] = deque()
        self.status = "I"  # transaction status of the last ReadyForQuery
        self.mid_batch = False  # extended-protocol messages forwarded since the last Sync
        self.skip_until_sync = False  # the server is discarding messages until Sync
        self.copy_ends = 0  # CopyDone/CopyFail messages the client has sent
        self.copy_in: int | None = None  # in COPY FROM STDIN: copy_ends when it started (Syncs are ignored)
        # Every ParameterStatus value the server reports, the proxy's own statements' too, as sent (None: not
        # kept): what a reused server connection's next client is told (proxy/pool.py, Greeting).
        self.parameters: dict[str, str] | None = None
        # A DataRow's or CopyData's decision hangs on the head of the queue, which no message of a run moves.
        self.scanner = p.ServerScanner(self._classify, self._handle, self._on_pass, runs=b"Dd")
        self.feed = self.scanner.feed  # server bytes in, what the client gets out

    def push(self, entry: Entry) -> None:
        entry.copy_epoch = self.copy_ends
        self.pending.append(entry)

    def at_rest(self, in_block: bool = False) -> bool:
        """The state the C relay starts a connection in (``handoff.AT_REST``): status I (``in_block``: or T,
        inside a transaction block that has not failed), nothing owed, no batch, at a message boundary of
        the server's."""
        return (
            (self.status == "I" or (in_block and self.status == "T"))
            and not self.pending
            and not self.mid_batch
            and not self.skip_until_sync
            and self.scanner.idle
        )

    def resume(self, state: ConnectionState, reads: Iterable[tuple[int, PendingRead, float]]) -> None:
        """Carry on from the state the C relay hands back. Only messages forwarded as they are are ever in
        flight there (it hands back inside an extended batch, or with a COPY FROM STDIN running, at once);
        ``reads``: (position in ``state.owed``, the read, when it started): the recorded reads among them."""
        self.status = state.status
        now = time.perf_counter()
        # ("q": a Query C sent as its decision's rewritten text: its error may mean a stale catalog)
        entries = [
            Entry(KIND_LETTERS[kind.upper()], started=now, copy_epoch=self.copy_ends, rewritten=kind == "q")
            for kind in state.owed
        ]
        for position, read, started in reads:
            entries[position].read = read
            entries[position].started = started
        self.pending.extend(entries)
        self.mid_batch = state.mid_batch
        self.skip_until_sync = state.skip_until_sync

    def at_transaction_start(self) -> bool:
        return self.status == "I" and not self.pending and not self.mid_batch

    def status_current(self) -> bool:
        """The status of the last ReadyForQuery is the server's now: no reply that ends with one is owed, no
        batch the server skips, no COPY FROM STDIN running."""
        return (
            not self.skip_until_sync
            and self.copy_in is None
            and not any(entry.kind in ENDS_WITH_READY for entry in self.pending)
        )

    def fast_ready(self, data: bytes) -> Entry | None:
        """The common reply, taken off with the least work: everything up to one ReadyForQuery, for one plain
        query or batch whose replies nobody watches. Its entry, taken off the queue (the status kept), or None
        (nothing done: ``feed`` it)."""
        pending = self.pending
        if len(pending) != 1 or data[-6:-1] != _READY_HEADER or not self.scanner.idle:
            return None
        head = pending[0]
        if head.kind not in ENDS_WITH_READY or head.injected or head.tag_map is not None:
            return None
        # Walk the headers to make sure there is no other ReadyForQuery and no ErrorResponse (Owner.failed).
        pos, end = 0, len(data) - 6
        while pos < end:
            kind = data[pos]
            if kind in (_E, _Z, _S):  # (ParameterStatus: shown_parameter_status)
                return None
            pos += _INT32.unpack_from(data, pos + 1)[0] + 1
        if pos != end or data[-1] not in _STATUSES:
            return None
        pending.popleft()
        status = self.status = _STATUS_CHARS[data[-1]]
        if status == "I":
            self.mid_batch = False
        return head

    def _classify(self, kind: int, length: int) -> int:
        if kind in (_Z, _E, _S):
            return p.BODY
        if self.pending:
            head = self.pending[0]
            if head.injected or head.on_done is not None or head.held is not None or head.echo:
                return p.BODY
            if kind == _C and (head.tag_map is not None or head.read is not None):
                return p.BODY
        return p.PASS

    def _on_pass(self, kind: int) -> None:
        if self.pending:
            kinds = _TERMINATOR.get(kind)
            if kinds is not None and self.pending[0].kind in kinds:
                self.pending.popleft()
            elif kind in _COPY_IN:
                self._copy_started()

    def _copy_started(self) -> None:
        """CopyInResponse: until the client's CopyDone or CopyFail the server ignores Sync (protocol docs,
        "COPY Operations"), so the Syncs the client sent after the COPY's Execute and before that message
        get no ReadyForQuery: libpq pipelines Execute, Sync and then sends CopyDone, Sync. Counting them
        would leave the queue owing a reply for good (the next injected cow.use_session waited forever)."""
        head = self.pending[0]
        self.copy_in = epoch = head.copy_epoch
        kept = [e for e in self.pending if e is head or e.kind != Kind.SYNC or e.copy_epoch != epoch]
        if len(kept) != len(self.pending):
            self.pending = deque(kept)
            if head.kind == Kind.EXECUTE:
                self.mid_batch = True  # the batch stays open until a Sync the server reads

    def _handle(self, kind: int, body: bytes, raw: bytes) -> bytes:
        if kind == _Z:
            return self._ready(body, raw)
        if kind == _E:
            return self._error(body, raw)
        head = self.pending[0] if self.pending else None
        if kind == _S and self.parameters is not None:
            name, value = p.decode_parameter_status(body)
            self.parameters[name] = value
        if kind == _S and (head is None or not head.injected):
            return shown_parameter_status(body, raw)
        if head is None:
            return raw
        if head.injected:
            if kind == _D and head.capture is not None:
                head.capture.append(p.decode_data_row(body))
            self._done(head, kind)
            return raw if kind == _A else b""  # (a notification is not the proxy's statement's)
        if head.echo and kind != _A:
            # Sent again for a new run (proxy/rerun.py): the client has this reply already.
            self._done(head, kind)
            return b""
        if head.held is not None or (kind == _C and (head.tag_map is not None or head.read is not None)):
            out = self.owner.answer(head, kind, body, raw)
            if out is None:
                return b""
            raw = out
        self._done(head, kind)
        return raw

    def _done(self, head: Entry, kind: int) -> None:
        """Take ``head`` off when ``kind`` is the reply that ends it."""
        kinds = _TERMINATOR.get(kind)
        if kinds is not None and head.kind in kinds:
            self.pending.popleft()
            if head.on_done is not None:
                head.on_done(True)

    def _error(self, body: bytes, raw: bytes) -> bytes:
        fields = p.decode_error(body)
        self.copy_in = None  # an error ends COPY FROM STDIN: from here on the server reads Syncs again
        head = self.pending[0] if self.pending else None
        out = self.owner.failed(head, fields, raw)
        if head is not None and head.kind not in ENDS_WITH_READY:
            # Extended protocol: the server now skips everything up to the next Sync.
            callbacks: list[Callable[[bool], None]] = []
            while self.pending and self.pending[0].kind != Kind.SYNC:
                entry = self.pending.popleft()
                if entry.on_done is not None:
                    callbacks.append(entry.on_done)
            if not self.pending:
                self.skip_until_sync = True
            for callback in callbacks:
                callback(False)
        return out

    def _ready(self, body: bytes, raw: bytes) -> bytes:
        status = self.status = p.decode_ready(body)
        self.copy_in = None
        head = None
        while self.pending:
            entry = self.pending.popleft()
            if entry.kind in ENDS_WITH_READY:
                head = entry
                break
        if status == "I" and not self.pending:
            self.mid_batch = False
        return self.owner.ready(head, status, raw)


def shown_parameter_status(body: bytes, raw: bytes) -> bytes:
    """PostgreSQL 18 reports ``search_path``: in a session that is the overlay path, which the client is not
    shown (introspection answers as outside the session): it gets the application's path. (Those of the
    proxy's own statements, a join's, are dropped with the rest of their replies.)"""
    name, value = p.decode_parameter_status(body)
    if name != "search_path":
        return raw
    shown = app_path.visible_path(value)
    return raw if shown == value else p.encode_parameter_status(name, shown)
