"""Held client events: replayed in order, the one that made the relay hold first, until one holds again."""

from __future__ import annotations

from proxy import protocol as p
from proxy.held import HeldEvents


def frame(sql: str) -> p.Frame:
    raw = p.encode_query(sql)
    return p.Frame(b"Q", raw[5:], raw)


def test_held_events_replay_in_order_until_one_holds_again() -> None:
    held = HeldEvents()
    first, second, third = frame("SELECT 1"), frame("SELECT 2"), frame("SELECT 3")
    held.hold()
    held.add(second)  # (came while holding)
    held.add(third)
    held.put_back(first)  # the statement that made the relay hold goes first
    assert not held.at_rest()
    seen: list[bytes] = []

    def dispatch(event: p.ClientEvent) -> None:
        assert isinstance(event, p.Frame)
        seen.append(event.raw)
        if event is second and len(seen) == 2:
            held.hold(until_idle=True)  # (say, a simple query behind an unfinished batch)
            held.put_back(event)

    held.replay(dispatch)
    assert seen == [first.raw, second.raw] and held.holding and held.until_idle
    assert list(held.events) == [second, third]
    held.replay(dispatch)  # (the second replayed again, now without holding)
    assert seen[2:] == [second.raw, third.raw] and held.at_rest() and not held.until_idle
