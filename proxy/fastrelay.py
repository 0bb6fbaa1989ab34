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

API_VERSION = 2  # the C module's API_VERSION this code is written against (see proxy/_fastrelay.c)

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
# at adoption or -1, the text of one prepared on the C relay or None).
Named = tuple[bytes, int, bytes | None]
# (conn_id, reason, errno, transaction status, Query/Sync replies in flight, type of the client message C did
# not take or -1, client bytes read and not forwarded, kinds of the replies owed (Relay.pending, as Kind
# letters: Q S P B D E C), mid_batch, skip_until_sync, statements, portals)
Handback = tuple[int, str, int, str, int, int, bytes, str, int, int, list[Named], list[Named]]
# What Python knows at adoption: (name, index, kind index, only Python may bind it)
Known = tuple[bytes, int, int, bool]
MAX_QUERY = _fastrelay.MAX_QUERY if _fastrelay is not None else 0


@dataclass(frozen=True)
class FastCounts:
    """What the C relay counted (since start), in the shapes of ``Metrics``."""

    statements: dict[tuple[str, bool], int]
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
    ) -> None:
        self.engine.adopt(conn_id, client_fd, server_fd, max_message, statements or [], portals or [])

    def kind_index(self, kind: str) -> int | None:
        """The C relay's index of a statement kind (None: one it does not count)."""
        try:
            return self.kinds.index(kind)
        except ValueError:
            return None

    def recall(self, conn_id: int) -> Handback | None:
        return self.engine.recall(conn_id)

    def release(self, conn_id: int) -> bool:
        return self.engine.release(conn_id)

    def take_handbacks(self) -> list[Handback]:
        return self.engine.take_handbacks()

    def states(self) -> dict[int, tuple[str, int]]:
        return self.engine.states()

    def kind(self, message: bytes) -> str:
        return self.kinds[self.engine.kind(message)]

    def counts(self) -> FastCounts:
        statements, up, down, errors, latency, latency_sum, conns = self.engine.stats()
        return FastCounts(
            {(kind, False): n for kind, n in zip(self.kinds, statements, strict=True) if n},
            up,
            down,
            errors,
            tuple(latency),
            latency_sum,
            conns,
        )

    def close(self) -> None:
        self.engine.close()
