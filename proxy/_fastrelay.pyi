from collections.abc import Sequence

MAX_QUERY: int
API_VERSION: int

# (name, index of Python's statement or -1, text prepared on the C relay or None)
Named = tuple[bytes, int, bytes | None]
# (conn_id, reason, errno, status, inflight, untaken message type or -1, client bytes not forwarded,
# kinds of the replies owed, mid_batch, skip_until_sync, statements, portals, client messages taken)
Handback = tuple[int, str, int, str, int, int, bytes, str, int, int, list[Named], list[Named], int]
# (name, index of Python's statement, kind index, only Python may bind it, write slots)
Known = tuple[bytes, int, int, bool, Sequence[int]]
# (message type + text, kind index, write slots): a text of a tagged connection forwarded as is
Decision = tuple[bytes, int, Sequence[int]]

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
        /,
    ) -> None: ...
    def recall(self, conn_id: int, /) -> Handback | None: ...
    def release(self, conn_id: int, /) -> bool: ...
    def take_handbacks(self) -> list[Handback]: ...
    def states(self) -> dict[int, tuple[str, int]]: ...
    def stats(
        self,
    ) -> tuple[list[int], int, int, dict[str, int], list[int], float, int, list[int], list[int], int]: ...
    def kind(self, message: bytes, /) -> int: ...
    def accepts(self, message: bytes, /) -> bool: ...
    def close(self) -> None: ...
