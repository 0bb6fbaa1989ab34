"""What each message sent upstream will be answered with: the entries of a connection's reply queue.

The relay appends an ``Entry`` for every message it forwards or injects and takes it off when the reply that
ends it comes (``Kind`` says which one that is).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (the relay imports this module: annotations only)
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
    copy_epoch: int = 0  # the client's CopyDone/CopyFail count when it was sent (see Relay._copy_started)
    rewritten: bool = False  # a Query or Parse sent with the analysis' SQL instead of the client's
    promoted: str | None = None  # a Bind or Describe sent to this proxy-owned statement (proxy/unnamed.py)
    read: PendingRead | None = None  # a tagged session's read to report when its CommandComplete comes
    # A statement the proxy may run again (proxy/rerun.py): its replies so far, held until one shows whether
    # it failed with the layer's row-changed 40001 (None: forwarded as they come).
    held: list[bytes] | None = None
    echo: bool = False  # sent again for a new run: the client already has its reply (dropped)
