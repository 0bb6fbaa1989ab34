"""The client's events the relay holds: while the proxy's own statements go ahead of one (a join, a check of
the catalog or the path), or while a statement that may run again is in flight (nothing may run between two
runs). The caller stops reading the client meanwhile, so what is held is bounded by its read buffer."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from proxy import protocol as p


class HeldEvents:
    """Held client events, in order; ``replay`` dispatches them until one makes the relay hold again."""

    def __init__(self) -> None:
        self.holding = False
        self.until_idle = False  # held until no reply is owed (a simple query behind an unfinished batch)
        self.events: deque[p.ClientEvent] = deque()

    def at_rest(self) -> bool:
        return not self.holding and not self.events

    def hold(self, until_idle: bool = False) -> None:
        """Stop dispatching (``until_idle``: until no reply is owed)."""
        self.holding = True
        if until_idle:
            self.until_idle = True

    def add(self, event: p.ClientEvent) -> None:
        """An event that came while holding: after those held already."""
        self.events.append(event)

    def put_back(self, event: p.ClientEvent) -> None:
        """The event that made the relay hold: first when replayed."""
        self.events.appendleft(event)

    def replay(self, dispatch: Callable[[p.ClientEvent], None]) -> None:
        """Stop holding and dispatch the held events in order; one that holds again stops the replay (the
        rest wait for the next)."""
        self.holding = False
        self.until_idle = False
        events = self.events
        while events and not self.holding:
            dispatch(events.popleft())
