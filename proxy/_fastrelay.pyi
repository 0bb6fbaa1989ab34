from collections.abc import Sequence

MAX_QUERY: int
API_VERSION: int

# (name, index of Python's statement or -1, text prepared on the C relay or None, a recorded read's portal:
# its Bind parameters, or None)
Named = tuple[bytes, int, bytes | None, bytes | None]
# A read record: (index of Python's statement, or -(decision index + 1); rows of SELECT n or None; wall-clock
# end; duration in µs; Bind parameters or None; its transaction's number on the connection; its id or 0; a
# Query taken by its shape's decision: its text, else None)
Read = tuple[int, int | None, float, int, bytes | None, int, int, bytes | None]
# How C encodes a connection's records as COPY rows: (session field, operation field or None, read_ids,
# [(ref as in Read, its rows' head, whether a shape's: its records bring their own texts)])
Encoder = tuple[bytes, bytes | None, bytes, Sequence[tuple[int, bytes, bool]]]
# A read still in flight at hand-back: (position among the replies owed, ref as in Read, monotonic start,
# Bind parameters or None, own text or None)
OwedRead = tuple[int, int, float, bytes | None, bytes | None]
# (conn_id, reason, errno, status, inflight, untaken message type or -1, client bytes not forwarded,
# kinds of the replies owed, mid_batch, skip_until_sync, statements, portals, client messages taken,
# read records, reads in flight, transactions ended, reads with no operation id and a statement that may
# write sent since the connection was last idle, the open transaction's id or 0, a watched statement's Query
# or batch or None, server bytes not forwarded, the promotions given at adoption as (name number, prepared),
# names made, texts taken that may have deallocated them, a rewritten statement failed as on a stale catalog,
# the name number the unnamed statement stands for or 0, the done read records C wrote as COPY rows (those
# with a head whose operation is known: the read records above are the others), how many rows)
Handback = tuple[
    int,
    str,
    int,
    str,
    int,
    int,
    bytes,
    str,
    int,
    int,
    list[Named],
    list[Named],
    int,
    list[Read],
    list[OwedRead],
    int,
    int,
    int,
    int,
    bytes | None,
    bytes,
    list[tuple[int, bool]],
    int,
    int,
    bool,
    int,
    bytes,
    int,
    bytes | None,
]
# (name, index of Python's statement, kind index, only Python may bind it, write slots, its Executes are
# recorded reads, watched when it starts an implicit transaction: it may be run again)
Known = tuple[bytes, int, int, bool, Sequence[int], bool, bool]
# (message type + text, kind index, write slots, a recorded read, watched when it starts an implicit
# transaction, a promotion's index or -1, the rewritten text sent in its place or None): a text of a tagged
# connection forwarded as is or rewritten (a lower-case type: the text's shape key, for every text of that
# shape; U: an unnamed Parse's body after its name, run as the promotion's named statement; a rewritten text:
# a Q key's only)
Decision = tuple[bytes, int, Sequence[int], bool, bool, int, bytes | None]
# (rewritten text, parameter types as in a Parse, name number or 0, prepared on the server)
Promotion = tuple[bytes, bytes, int, bool]

def shape_key(text: bytes, /) -> bytes | None: ...
def encode_rows(encode: Encoder, records: Sequence[Read], /) -> bytes: ...

class Engine:
    def __init__(
        self,
        words: Sequence[tuple[bytes, int]],
        kinds: int,
        utility: int,
        other: int,
        buckets: Sequence[float],
    ) -> None: ...
    def fileno(self) -> int: ...
    def adopt(
        self,
        conn_id: int,
        client_fd: int,
        server_fd: int,
        max_message: int,
        statements: Sequence[Known] = ...,
        portals: Sequence[Known] = ...,
        tagged: bool = ...,
        decisions: Sequence[Decision] = ...,
        record: bool = ...,
        resolve: int = ...,
        txn: int = ...,
        txn_reads: int = ...,
        txn_wrote: bool = ...,
        promotions: Sequence[Promotion] = ...,
        promoted: int = ...,
        max_promoted: int = ...,
        alias: int = ...,
        alias_promotion: int = ...,
        encode: Encoder | None = ...,
        ask: bool = ...,
        status: str = ...,
        /,
    ) -> None: ...
    def take_requests(self) -> list[tuple[int, int, bytes]]: ...
    def answer(self, conn_id: int, request: int, decision: Decision | None, /) -> bool: ...
    def recall(self, conn_id: int, /) -> Handback | None: ...
    def release(self, conn_id: int, /) -> bool: ...
    def take_handbacks(self) -> list[Handback]: ...
    def take_reads(self) -> tuple[int, list[tuple[int, list[Read], bytes, int]]]: ...
    def states(self) -> dict[int, tuple[str, int]]: ...
    def stats(
        self,
    ) -> tuple[
        list[int], int, int, dict[str, int], list[int], float, int, list[int], list[int], int, int, int, int
    ]: ...
    def kind(self, message: bytes, /) -> int: ...
    def accepts(self, message: bytes, /) -> bool: ...
    def close(self) -> None: ...
