"""Promotion of unnamed statements: a tagged connection's unnamed rewritten reads run as named statements the
proxy owns, so that the server plans each text once, not at every Parse.

A client that sends each statement unnamed (node-postgres, psycopg before its fifth execution) makes the
server parse and plan the rewrite every time; as a named statement its plan is cached like a prepared one's.
This module keeps the names and which of the client's messages stand for them; the relay sends what it says.
"""

from __future__ import annotations

import re
import struct

from proxy import protocol as p
from proxy.handoff import Promotion, PromotionsBack, PromotionsGiven
from proxy.replies import Entry, Kind

# Named statements the proxy prepares for a client's unnamed ones: their prefix, and how many one server
# connection gets (names are never reused; evicted ones stay until the connection ends).
PROMOTED_PREFIX = "__cowproxy_unnamed_"
MAX_PROMOTED = 64
# Statements that may deallocate prepared statements, the proxy's with the client's (DEALLOCATE, DISCARD ALL).
_DEALLOCATES = re.compile(rb"deallocate|discard", re.I)

Key = tuple[str, tuple[int, ...]]  # (SQL sent, parameter types)


def types_bytes(param_types: tuple[int, ...]) -> bytes:
    """Parameter types as a Parse message carries them: their count, then the OIDs."""
    return struct.pack(f"!H{len(param_types)}I", len(param_types), *param_types)


def decision_key(sql: str, param_types: tuple[int, ...]) -> bytes:
    """The C relay's key of an unnamed Parse it promotes by Python's decision: U, then the Parse's body after
    its empty name (the client's text and parameter types: a Parse with other types is another decision)."""
    return b"U" + sql.encode() + b"\0" + types_bytes(param_types)


def key_types(key: bytes) -> tuple[int, ...]:
    """The parameter types of a ``decision_key`` (after the text's NUL: the text has none)."""
    types = key[key.index(0) + 1 :]
    (count,) = struct.unpack_from("!H", types)
    return struct.unpack_from(f"!{count}I", types, 2)


def number(name: str | None) -> int:
    """The number of one of the proxy's names (0: None)."""
    return int(name[len(PROMOTED_PREFIX) :]) if name is not None else 0


class Promotions:
    """One connection's promoted statements: (SQL sent, parameter types) -> name, once the server has
    prepared it; the name the client's unnamed statement stands for (``alias``); names made (``count``)."""

    def __init__(self) -> None:
        self.promoted: dict[Key, str] = {}
        self.promoting: set[Key] = set()  # Parse sent, not answered yet
        self._deallocations = 0  # texts that may have deallocated them, so far
        self.alias: str | None = None
        self.count = 0
        self._exported: dict[Key, int] = {}  # given to the C relay (export), by their index there
        self._rows: list[Promotion] = []

    def at_rest(self) -> bool:
        """No statement of the client's stands for one of the proxy's."""
        return self.alias is None

    def can_promote(self) -> bool:
        return self.count < MAX_PROMOTED or bool(self.promoted)

    def promote(self, sql: str, param_types: tuple[int, ...]) -> tuple[Entry, bytes] | None:
        """The Parse to send for the client's unnamed statement (a rewritten read, ``sql``) run as a named one
        the proxy owns, with its queue entry.

        The first time, the Parse goes out under a new name; once the server has prepared it, the client's
        Parse of the same text is answered by an empty unnamed statement (ParseComplete in its place, and the
        server's unnamed statement dropped as the client expects), and its Bind and Describe of the unnamed
        statement name the proxy's (``alias``). None when the statement goes out as usual: no names left, or
        the same text's Parse still unanswered (pipelined: it may yet fail, and a name per repetition would
        use up the names)."""
        key = (sql, param_types)
        name = self.promoted.get(key)
        if name is not None:
            self.alias = name
            return Entry(Kind.PARSE, rewritten=True), p.encode_parse("", "")
        if self.count >= MAX_PROMOTED or key in self.promoting:
            return None
        self.count += 1
        name = f"{PROMOTED_PREFIX}{self.count}"
        self.promoting.add(key)
        deallocations = self._deallocations

        def prepared(ok: bool) -> None:
            self.promoting.discard(key)
            if ok and deallocations == self._deallocations:  # (a DEALLOCATE pipelined after it)
                self.promoted[key] = name

        # Until the server has prepared it the alias stands: a failed Parse leaves no unnamed statement,
        # and a Bind of it must fail as it would (26000), not bind an older one.
        self.alias = name
        return Entry(Kind.PARSE, rewritten=True, on_done=prepared), p.encode_parse(name, sql, param_types)

    def forget_unnamed(self, body: bytes, unnamed: bool = True) -> None:
        """A Parse (``unnamed``: of the unnamed statement) or a simple Query (which drops the unnamed
        statement): the alias ends; a text that may deallocate statements (DEALLOCATE, DISCARD ALL) drops
        the proxy's too."""
        if unnamed:
            self.alias = None
        if (self.promoted or self.promoting) and _DEALLOCATES.search(body):
            self.promoted.clear()
            self._deallocations += 1

    def failed(self, name: str) -> None:
        """The proxy's statement ``name`` failed (a plan gone stale after app DDL: 0A000, 42601, ...): parse a
        new one the next time rather than fail for good; the old name stays unused."""
        self.promoted = {k: v for k, v in self.promoted.items() if v != name}

    def export(self, keys: list[Key]) -> dict[Key, int]:
        """For the C relay: every promoted statement and those of ``keys`` (its decisions' promotions), with
        their index in the list; C makes names as ``promote`` does and hands them back (``resume``)."""
        self._exported = {}
        rows: list[Promotion] = []
        for key in [*self.promoted, *keys]:
            if key in self._exported:
                continue
            self._exported[key] = len(rows)
            name = self.promoted.get(key)
            rows.append((key[0].encode(), types_bytes(key[1]), number(name), name is not None))
        self._rows = rows
        return self._exported

    def for_fast(self) -> PromotionsGiven:
        """What the C relay is given (``handoff.Adoption.promotions``), after ``export``."""
        return PromotionsGiven(self._rows, self.count, MAX_PROMOTED, *self.exported_alias())

    def exported_alias(self) -> tuple[int, int]:
        """The alias for the C relay: its name's number (0: none) and its promotion's index there (or -1)."""
        for key, name in self.promoted.items():
            if name == self.alias:
                return number(name), self._exported.get(key, -1)
        return number(self.alias), -1

    def resume(self, state: PromotionsBack) -> None:
        """Carry on from the C relay's promotions: what it prepared, failed or forgot of those exported."""
        if state.deallocations:
            self.promoted.clear()
            self._deallocations += state.deallocations
        for key, (no, prepared) in zip(self._exported, state.states, strict=True):
            if prepared:
                self.promoted[key] = f"{PROMOTED_PREFIX}{no}"
            else:
                self.promoted.pop(key, None)
        self.count = state.made
        self.alias = f"{PROMOTED_PREFIX}{state.alias}" if state.alias else None
        self._exported, self._rows = {}, []

    def forget_all(self) -> None:
        """The client may have deallocated statements where the proxy did not see it (on the C relay): the
        proxy's are forgotten (their names unused)."""
        self.promoted.clear()
        self.alias = None
        self._exported, self._rows = {}, []
