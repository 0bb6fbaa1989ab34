"""Read-trace bookkeeping of one connection: which statements are recorded reads, when they end, and the
operation of those sent with no operation id in force (docs/proxy.md, "Read traces").

The relay asks ``pending_read`` what to report of a statement it sends, hands the answer to the statement's
queue entry, and calls ``read_done`` with its CommandComplete. A read with no operation id takes its
transaction's: the one the layer gives the transaction's writes ('xact:' and the server's transaction id,
asked before the transaction's end: ``ask_xact``), or, when it wrote nothing, a read-only id of the
connection's. Such reads wait in ``TxnReads.held`` until the transaction ends (``ended``).
"""

from __future__ import annotations

import secrets
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from proxy import protocol as p
from proxy.injected import InjectedBatches
from proxy.replies import Entry, Kind
from proxy.sql import Analysis
from proxy.tags import Tags

# Asked before the end of a transaction that read with no operation id in force and may have written: the
# layer's operation for its writes is 'xact:' and this id (cow._write_operation), which its reads then take.
XACT_STATEMENT = "__cowproxy_xact"
XACT_SQL = "SELECT pg_current_xact_id_if_assigned()"

_INT32 = struct.Struct("!I")
_C = ord("C")


class PendingRead(NamedTuple):
    """A read statement of a tagged session on its way (immutable, and a tuple: one is made per recorded
    read)."""

    sql: str
    session: str
    operation: str | None
    params: bytes | None


# A read of a transaction still open, waiting for the transaction's operation: (the read, rows, seconds,
# wall-clock end).
HeldRead = tuple[PendingRead, int | None, float, float]
ReadsCallback = Callable[[PendingRead, int | None, float, float], None]


def new_read_ids() -> str:
    """The prefix of a connection's read-only transaction ids (``<prefix>.<n>``): unique per connection,
    so that two connections' transactions never share an operation."""
    return "readonly:" + secrets.token_hex(6)


@dataclass(slots=True)
class TxnReads:
    """The operation of a connection's reads with no operation id in force: its transaction's. That is the
    one the layer gives the transaction's writes, 'xact:' and the server's transaction id (asked before the
    transaction's end: ``ReadTrace.ask_xact``), or, when it has none (it wrote nothing), ``read_ids`` + '.' +
    the transaction's number on this connection. The records wait in ``held`` until then."""

    read_ids: str
    count: int = 0  # transactions ended on this connection (ReadyForQuery with status I)
    # Sent since the connection was last idle (no reply owed, status I): reads with no operation id, and
    # whether a statement that may write went too (then the server is asked at the transaction's end).
    reads: int = 0
    wrote: bool = False
    held: list[HeldRead] = field(default_factory=list)
    xid: str | None = None  # the server's answer for the open transaction


class ReadTrace:
    """One connection's recorded reads: ``reads`` is called with each read of a tagged session as it ends
    (its row count from CommandComplete, its duration in seconds, the wall-clock end); None: not recorded."""

    def __init__(self, reads: ReadsCallback | None, read_ids: str | None) -> None:
        self.reads = reads
        self.bind_params: dict[str, bytes] = {}  # portal -> its Bind's parameters, while reads are recorded
        self.txn = TxnReads(read_ids or new_read_ids())

    def records(self, tags: Tags, verdict: Analysis) -> bool:
        """Whether a statement of these tags with this verdict is a recorded read."""
        return (
            self.reads is not None
            and tags.session is not None
            and verdict.kind == "select"
            and not verdict.writes
        )

    def pending_read(
        self, tags: Tags, verdict: Analysis, sql: str, params: bytes | None
    ) -> PendingRead | None:
        """What to report of a statement when it ends: reads (no writes) of a tagged session, if recorded."""
        if not self.records(tags, verdict):
            return None
        assert tags.session is not None
        return PendingRead(sql, tags.session, tags.operation, params)

    def bound(self, portal: str, body: bytes) -> None:
        """A Bind of a statement whose text is kept: its parameters (after the portal's name), with the text
        the identity of the read."""
        self.bind_params[portal] = body[body.index(0) + 1 :]

    def read_done(self, entry: Entry, tag: str) -> None:
        """The CommandComplete of ``entry``'s read came: report it (or hold it for its transaction's
        operation)."""
        read = entry.read
        assert read is not None and self.reads is not None
        entry.read = None  # (a simple query's entry waits on for ReadyForQuery)
        command, _, count = tag.partition(" ")
        rows = int(count) if command == "SELECT" and count.isdigit() else None
        if read.operation is None:  # (its transaction's operation is known at its end: ended)
            self.txn.held.append((read, rows, time.perf_counter() - entry.started, time.time()))
        else:
            self.reads(read, rows, time.perf_counter() - entry.started, time.time())

    def fast_read_done(self, head: Entry, data: bytes, end: int) -> None:
        """A recorded read answered on the fast path: its CommandComplete tag from the reply's headers."""
        pos = 0
        while pos < end:
            length = _INT32.unpack_from(data, pos + 1)[0]
            if data[pos] == _C:
                self.read_done(head, data[pos + 5 : pos + length].decode("utf-8", "replace"))
                return
            pos += length + 1

    def sent(self, verdict: Analysis | None, read: PendingRead | None) -> None:
        """A statement of a recorded connection goes out: count a read with no operation id, or note that
        the transaction may write (anything but a read or a transaction statement; conservative: a
        statement the relay knows nothing of counts as one)."""
        if read is not None:
            if read.operation is None:
                self.txn.reads += 1
        elif verdict is None or not (
            verdict.kind == "transaction" or (verdict.kind == "select" and not verdict.writes)
        ):
            self.txn.wrote = True

    def wants_xact(self, status: str, current: bool) -> bool:
        """Ask the server for the transaction's id before the message that may end it: it read with no
        operation id and may have written. Not when the status is not ``current`` (a reply that ends with
        ReadyForQuery is still owed: a pipelined failure would make the question fail and the server skip
        the client's COMMIT; or a batch the server skips, or COPY), nor in a failed block (the writes are
        gone)."""
        return self.txn.reads > 0 and self.txn.wrote and status != "E" and current

    def ask_xact(self, injector: InjectedBatches, standalone: bool) -> None:
        """Queue ``pg_current_xact_id_if_assigned()`` ahead of the client's message; its replies never reach
        the client. Inside the client's batch (``standalone`` False) a failure is the client's to see (the
        server then skips its batch, as a failed statement of its own would make it); before a simple Query
        it is a batch of its own, ending with Sync."""
        found: list[tuple[str | None, ...]] = []

        def learned(ok: bool) -> None:
            if ok and found:
                self.txn.xid = found[0][0]
            elif not ok:
                injector.error = None  # (not a join's failure: nothing held is to be refused for it)

        close = injector.queue_query(XACT_STATEMENT, XACT_SQL, not standalone, on_done=learned, capture=found)
        injector.send(close, Kind.CLOSE, not standalone)
        if standalone:
            injector.send(p.SYNC, Kind.SYNC, False)

    def ended(self, idle: bool) -> None:
        """ReadyForQuery with status I (``idle``: no reply owed any more): the held reads take the
        transaction's operation."""
        self._release_held()
        txn = self.txn
        txn.xid = None
        txn.count += 1
        if idle:
            txn.reads = 0
            txn.wrote = False

    def _release_held(self) -> None:
        """The held reads' transaction ended: they take its operation (``TxnReads``)."""
        txn = self.txn
        if txn.held:
            assert self.reads is not None
            operation = f"xact:{txn.xid}" if txn.xid else f"{txn.read_ids}.{txn.count}"
            for read, rows, seconds, ended in txn.held:
                self.reads(read._replace(operation=operation), rows, seconds, ended)
            txn.held.clear()
