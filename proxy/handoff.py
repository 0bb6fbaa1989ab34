"""The hand-off between the relays: one model of a connection's state at the points where it moves between
the Python relay (``proxy/relay.py``) and the C relay (``proxy/_fastrelay.c``).

Python keeps a connection's state in the relay's collaborators (``ReplyQueue``: the transaction status, the
replies owed, the batch; ``ReadTrace.txn``; the tables of prepared statements and portals; ``Decisions``), C
in its ``conn_t``. At a hand-off both describe it with the frozen values here, which map field for field onto
what ``Engine.adopt`` takes and what C's hand-back tuple gives (docs/proxy.md, "The hand-off state"):

- ``ConnectionState``, both ways: the server's side of the connection (status, replies owed, batch) and the
  counts of its transaction's reads. Python hands over only at rest (``Relay.at_rest``: status I, or T for a
  session, nothing owed, no batch), which is the state C starts a connection in; C hands back from wherever
  it stopped.
- ``Adoption``, Python to C: that state with the tables of statements and portals as C gets them (``Known``),
  the decisions it may apply (``Decision``), and whether it records and resolves reads.
- ``fastrelay.Handback``, C to Python: the state with the tables as C gives them back (``Named``), the read
  records made meanwhile (``FastRead``) and what was left untaken.
"""

from __future__ import annotations

from dataclasses import dataclass

# A statement or portal as the C relay gets it: (name, index into the Statements given with it, kind index,
# only Python may bind or execute it, write slots, its Executes are reads of a recorded session, it may be run
# again after the layer's row-changed 40001: watched when it starts an implicit transaction, proxy/rerun.py).
Known = tuple[bytes, int, int, bool, tuple[int, ...], bool, bool]
# A statement or portal as the C relay gives it back: (name, index into the Statements Python gave at adoption
# or -1, the text of one prepared on the C relay or None, a recorded read's portal: its Bind parameters, or
# None).
Named = tuple[bytes, int, bytes | None, bytes | None]
# A statement text of a tagged connection that C forwards as is or rewritten (proxy/decisions.py): (message
# type + text, kind index, write slots, a read of a recorded session, it may be run again, a promotion's index
# in ``PromotionsGiven.rows`` or -1, the rewritten text C sends in its place or None); a lower-case type: the
# key is the text's shape, and the decision holds for every text of that shape (proxy/sql/shapes.py); type
# U: an unnamed Parse that runs as a named statement of the proxy's (proxy/unnamed.py: the key is the
# Parse's body after its empty name, text and parameter types). A rewritten text only with type Q (its exact
# text: the rewrite depends on the literals) and no read record.
Decision = tuple[bytes, int, tuple[int, ...], bool, bool, int, bytes | None]
# A promotion as C gets it: (rewritten text, parameter types as a Parse has them, the number of the proxy's
# name for it or 0, prepared on the server).
Promotion = tuple[bytes, bytes, int, bool]
# A read record made on the C relay: (Python's statement index, or -(decision index + 1); rows of SELECT n or
# None; wall-clock end; duration in µs; Bind parameters or None; its transaction's number on the connection,
# as TxnCounts.count counts them; the transaction's id once it ended, if C asked and it had one, else 0; the
# Query's own text when C took it by its shape's decision, else None).
FastRead = tuple[int, int | None, float, int, bytes | None, int, int, bytes | None]
# A recorded read in flight at hand-back: (position among the replies owed, ref as FastRead's, monotonic
# start, Bind parameters or None, own text or None).
OwedRead = tuple[int, int, float, bytes | None, bytes | None]
# How C encodes a recorded connection's read records as runs itself (proxy/reads.py, DICT_RUN; decoded by
# run_rows into encode_rows' bytes): the session's COPY field, the operation id's (None: each record takes
# its transaction's, as ClientConnection.fast_reads names it), TxnReads.read_ids, and per read C may record
# (its ref, as FastRead's; its rows' first fields; whether it is a shape's decision, whose records' own texts
# are written). The parameters are written as they came, not hashed (readers derive the identity).
# ReadRecorder.encoder makes it.
Encoder = tuple[bytes, bytes | None, bytes, list[tuple[int, bytes, bool]]]


@dataclass(frozen=True, slots=True)
class TxnCounts:
    """The open transaction's reads with no operation id (``read_trace.TxnReads``; C: ``conn_t.txn``,
    ``txn_reads``, ``txn_wrote``, ``txn_xid``)."""

    count: int = 0  # transactions ended on the connection
    reads: int = 0  # reads with no operation id sent since the connection was last idle
    wrote: bool = False  # and a statement that may write
    xid: int = 0  # the open transaction's id, when C asked and it had one (0: none; given back only)


@dataclass(frozen=True, slots=True)
class ConnectionState:
    """The server's side of a connection as both relays keep it (``ReplyQueue``; C: ``conn_t``)."""

    status: str = "I"  # transaction status of the last ReadyForQuery (C: status)
    # The replies owed, in order, as ``replies.KIND_LETTERS`` (C: its queue's kinds; "q": a Query C sent
    # rewritten).
    owed: str = ""
    owed_reads: tuple[OwedRead, ...] = ()  # the recorded reads among them (C: qrec)
    mid_batch: bool = False  # extended-protocol messages forwarded since the last Sync (C: mid_batch)
    skip_until_sync: bool = False  # the server discards messages until Sync (C: skip)
    txn: TxnCounts = TxnCounts()


AT_REST = ConnectionState()


@dataclass(frozen=True, slots=True)
class PromotionsGiven:
    """A session's promotions as the C relay gets them (``unnamed.Promotions.for_fast``; C: ``conn_t.promos``,
    ``promo_count``, ``promo_max``, and the unnamed statement's ``alias``)."""

    rows: list[Promotion]
    made: int  # names made on this server connection
    most: int  # names it may have (MAX_PROMOTED)
    alias: int  # the number of the name the unnamed statement stands for (0: none)
    alias_promotion: int  # its index in ``rows`` (-1: none)


@dataclass(frozen=True, slots=True)
class PromotionsBack:
    """The promotions as the C relay leaves them (``unnamed.Promotions.resume``)."""

    states: list[tuple[int, bool]]  # per row given, in order: (its name's number, prepared)
    made: int
    deallocations: int  # texts taken that may have deallocated statements (DEALLOCATE, DISCARD)
    suspect: bool  # a rewritten statement failed as on a stale catalog (CatalogGate.suspect)
    alias: int


@dataclass(frozen=True, slots=True)
class Adoption:
    """What the C relay gets with a connection (``Engine.adopt``'s arguments after the sockets and the message
    limit, in this order; ``state``: only its ``status`` and ``txn`` are passed, the rest is ``AT_REST``,
    where C starts)."""

    statements: list[Known]
    portals: list[Known]
    tagged: bool  # in a session: C takes only the texts of ``decisions`` and Python's statements
    decisions: list[Decision]
    record: bool  # its session's reads are recorded (C makes the records)
    # Reads with no operation id take their transaction's: C asks the server the transaction's id before the
    # end of one that read and may have written, as Python does (read_trace.ReadTrace.ask_xact).
    resolve: bool
    state: ConnectionState = AT_REST
    promotions: PromotionsGiven | None = None  # in a session: its unnamed reads C promotes as Python does
    # In a session whose reads are not recorded: a Query with no decision is asked of Python (a request,
    # ``Relay.decide_for_fast``) instead of handing the connection back.
    ask: bool = False
