"""Injected batches: the proxy's own statements, sent ahead of a client's (a join, a path check, a catalog
check or load), whose replies never reach the client.

At a safe point (no unfinished extended batch of the client's) they are a batch of their own, ending with
Sync; inside a client's batch they are followed by Flush, and their failure makes the server skip the rest of
the client's batch, as a failed statement of its own would. The client is held meanwhile: the connection
(the relay) replays what it held once the batch is answered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from proxy import protocol as p
from proxy.replies import Entry, Kind, ReplyQueue

# A parameterless utility statement of the proxy's (queue_utility): BEGIN READ WRITE, COMMIT.
WRITABLE_STATEMENT = "__cowproxy_writable"

Rows = list[tuple[str | None, ...]]
Done = Callable[[bool], None]


class Connection(Protocol):
    """What injected batches read and write of the connection's state (the relay's)."""

    replies: ReplyQueue  # what the server owes, its transaction status, the client's batch in progress
    to_server: list[bytes]

    def hold(self, until_idle: bool) -> None:
        """Stop reading the client (``until_idle``: until no reply is owed)."""


class InjectedBatches:
    """Queue the proxy's statements on one connection, and keep the error of the last injected batch."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        # The ErrorResponse of the injected batch in flight: the held statement that needed it is refused
        # with it (fail closed) rather than replayed.
        self.error: p.ErrorFields | None = None

    def start(self, trigger: bytes) -> bool | None:
        """Hold the client for statements the proxy sends ahead of ``trigger``: True at a safe point (they are
        their own batch, ending with Sync), False inside a client's batch (followed by Flush; a failure makes
        the server skip the client's batch); None: a simple query must not join an unfinished batch, so the
        client is held until the server has caught up."""
        connection = self.connection
        replies = connection.replies
        if trigger in (b"Q", b"F") and (replies.pending or replies.mid_batch):
            connection.hold(until_idle=True)
            return None
        connection.hold(until_idle=False)
        self.error = None
        return not replies.mid_batch

    def finish(self, close_last: bytes, standalone: bool, on_done: Done) -> None:
        """End an injected batch: ``close_last``, then Sync at a safe point, or Flush inside a batch."""
        if standalone:
            self.send(close_last, Kind.CLOSE, False)
            self.send(p.SYNC, Kind.SYNC, False, on_done=on_done)
        else:
            self.send(close_last, Kind.CLOSE, True, on_done=on_done)
            self.connection.to_server.append(p.FLUSH)

    def queue_query(
        self,
        name: str,
        sql: str,
        forward: bool,
        *,
        params: tuple[str | None, ...] = (),
        on_done: Done | None = None,
        capture: Rows | None = None,
    ) -> bytes:
        """Inject Parse/Bind/Execute/Close portal of ``sql``; return the Close of the statement (last).

        A Close of the statement goes first: when an earlier one failed, the server skipped the rest of its
        batch, its Close with it, and a Parse of that name would fail (42P05) at every try from then on."""
        self.send(p.encode_close("S", name), Kind.CLOSE, forward)
        self.send(p.encode_parse(name, sql), Kind.PARSE, forward)
        self.send(p.encode_bind(name, name, params), Kind.BIND, forward)
        self.send(p.encode_execute(name), Kind.EXECUTE, forward, on_done=on_done, capture=capture)
        self.send(p.encode_close("P", name), Kind.CLOSE, forward)
        return p.encode_close("S", name)

    def queue_utility(self, sql: str) -> None:
        """Inject a parameterless utility statement into a batch of the proxy's own (at a safe point)."""
        close = self.queue_query(WRITABLE_STATEMENT, sql, False)
        self.send(close, Kind.CLOSE, False)

    def rolled_back_on_failure(self, finished: Done) -> Done:
        """``finished`` of a join in a block of its own (``Relay._inject``): when the bind failed, the server
        skipped the COMMIT and the block is aborted (status E): roll it back before the client's statement
        is refused with the bind's error (``error`` stays: a ROLLBACK does not fail)."""

        def done(ok: bool) -> None:
            if ok or self.connection.replies.status != "E":
                finished(ok)
                return
            self.send(p.encode_query("ROLLBACK"), Kind.QUERY, False, on_done=lambda _ok: finished(False))

        return done

    def send(
        self, raw: bytes, kind: Kind, forward: bool, on_done: Done | None = None, capture: Rows | None = None
    ) -> None:
        """Send one message of the proxy's, owed a reply the client never sees (``forward``: its error
        excepted, inside the client's batch)."""
        connection = self.connection
        connection.replies.pending.append(
            Entry(kind, injected=True, forward_error=forward, on_done=on_done, capture=capture)
        )
        connection.to_server.append(raw)
