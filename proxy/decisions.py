"""Decisions: the statement texts of a tagged connection that went out as they are or rewritten, which the C
relay may then forward (or send rewritten) without asking Python (docs/proxy.md, "Sessions on the C relay").

A text is decided when its verdict needs nothing of the relay but, for a simple Query, its rewritten text: no
refusal, command tag to map, path change or catalog check, and no comment that may carry tags. Texts that
differ only in literals share one decision by their shape when no literal's value can change the verdict
(proxy/sql/shapes.py); a rewritten text is decided by its exact text (its rewrite is made of its literals).
Decisions are made against one catalog: a new catalog voids them. A decision depends on the text and the
catalog alone (what depends on the connection — whether its path is known, whether it records reads — is
applied at ``export``), so the connections of a database share the table of its latest catalog
(``catalogs.SharedCatalogs.decisions``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy import rerun
from proxy.analysis import ProxyAnalyzer
from proxy.fastrelay import MAX_QUERY
from proxy.handoff import Decision
from proxy.read_trace import ReadTrace
from proxy.sql import Analysis
from proxy.tags import Tags
from proxy.unnamed import Key, decision_key, key_types

# Statement texts of tagged connections the C relay may forward as is, per table (a catalog's): two
# generations of at most half as many each (Table.add).
MAX_DECISIONS = 1024
GENERATION = MAX_DECISIONS // 2
# A connection that asks the C relay's questions (Adoption.ask) takes the list made for the table's version
# up to this many decisions ago: C asks about a Query text the list lacks, and a list made anew at every
# adoption of a table that grows with each answer cost Python O(table) each time (a decision is never wrong
# for its catalog, so an older list is only shorter).
STALE_LIST = 64

Writes = tuple[tuple[str, str], ...]
_UNMADE: Any = object()  # (a row not made yet: a str is why C may not take the decision)


# What ``export`` keeps of a table per (path known clean, reads recorded): the table's version when made, the
# rows without and with the promoted texts (U), the promoted texts' keys, the table's ``parses`` when made.
Export = tuple[int, list[Decision], list[Decision], dict[bytes, Key], int]


@dataclass(frozen=True)
class _RowFor:
    """What a decision's row depends on besides its verdict: the connection's tags, the C relay's kinds and
    write slots, and whether the connection's path is known clean."""

    tags: Tags
    kind_index: Callable[[str], int | None]
    slots: Callable[[Writes], tuple[int, ...] | None]
    path_clean: bool


class Table(dict[bytes, Analysis]):
    """The decisions made against one catalog, and the rows ``export`` made of them, which every connection
    sharing the table takes as long as the table has not changed (``version``; a text decided again by its
    shape keeps an equal verdict).

    A table fills with texts that never come back (a Django run: each test's own texts; 3,564 of the 5,178
    texts and shapes Python saw in the full list came once), and the C relay cannot say which decisions it
    still takes. So decisions live in two generations, as a generational cache keeps them: a new decision
    joins the young one; when that one is full (``GENERATION``) the old one is dropped and the young one
    becomes old. A text still in use whose decision was dropped comes back to Python once and is decided
    again, into the young generation; a text of a test long gone goes for good."""

    def __init__(self) -> None:
        super().__init__()
        self.exports: dict[tuple[bool, bool], Export] = {}
        self.version = 0  # changed by every decision added or dropped (exports are made per version)
        self.parses = 0  # changed by every decision of a Parse added (the C relay does not ask about those)
        self.rows: dict[tuple[bool, bool], dict[bytes, Decision | str]] = {}  # Decisions._rows
        self.young: set[bytes] = set()  # decided since the last turn; the other keys are the old generation
        self.turns = 0

    def add(self, key: bytes, verdict: Analysis) -> None:
        """Decide ``key`` (into the young generation), dropping the old generation first when the young one
        is full."""
        if key in self:
            return
        if len(self.young) >= GENERATION:
            for old in [k for k in self if k not in self.young]:
                del self[old]
                for made in self.rows.values():
                    made.pop(old, None)
            self.young = set()
            self.turns += 1
        self[key] = verdict
        self.young.add(key)
        self.version += 1
        if key[:1] not in (b"Q", b"q"):
            self.parses += 1


def _own_table(catalog: Any, make: Callable[[], Table]) -> Table:
    return make()


def undecidable(sql: str, verdict: Analysis) -> str | None:
    """Why no decision may stand for this text of a session (what Python must do for it each time it comes:
    ``Relay._prepare``), or None. The reasons label the C relay's requests answered "hand back"."""
    if verdict.tampers or verdict.error is not None:
        return "refusal"
    if verdict.path_change:
        return "path change"  # (the relay must see it: PathCheck.followed)
    if verdict.catalog_dependent:
        return "catalog check"
    if verdict.tag_map is not None:
        return "tag map"
    if "/*" in sql:
        return "comment"  # (C takes no text with a comment opener: it may carry tags)
    return None


def rewritten_text(key: bytes, verdict: Analysis) -> bytes | None:
    """The text C sends in place of a simple Query decided by ``key`` (None: the client's, as it is)."""
    if key[:1] != b"Q" or verdict.rewritten is None:
        return None
    return verdict.rewritten.encode()


class Decisions:
    """One connection's decisions: (message type + UTF-8 text, or lower-case type + shape) -> verdict, in the
    table ``tables`` gives for its catalog (shared with the other connections of its database)."""

    def __init__(
        self,
        analysis: ProxyAnalyzer,
        trace: ReadTrace,
        tables: Callable[[Any, Callable[[], Table]], Table] = _own_table,
    ) -> None:
        self.analysis = analysis
        self.trace = trace
        self.tables = tables
        self.table = Table()
        self._catalog: Any = None  # the catalog they were made against

    def _decidable(self, sql: str, verdict: Analysis, catalog: Any) -> bool:
        """May the C relay take this text of a tagged connection by a decision (and is there room for one)."""
        if undecidable(sql, verdict) is not None:
            return False
        if self._catalog is not catalog:
            self._current(catalog)
        return True

    def decide_promoted(
        self, sql: str, param_types: tuple[int, ...], verdict: Analysis, catalog: Any
    ) -> None:
        """Remember that this unnamed Parse of a tagged connection (text and parameter types) runs as one of
        the proxy's named statements (the C relay promotes it as ``Promotions.promote`` does)."""
        if self._decidable(sql, verdict, catalog):
            self.table.add(decision_key(sql, param_types), verdict)

    def decide(self, kind: bytes, sql: str, verdict: Analysis, tags: Tags, catalog: Any) -> bytes | None:
        """Remember that this text of a tagged connection went out as it is, or a Query's as its rewritten
        text (for the C relay): the key it is decided by (its text's or its shape's), or None: not one C may
        take."""
        if (verdict.rewritten is not None and kind != b"Q") or not self._decidable(sql, verdict, catalog):
            return None
        exact = kind + sql.encode()
        if exact in self.table:
            return exact
        table = self.table  # (the catalog's: _decidable takes it when the catalog changed)
        # Its shape, when no literal's value can change the verdict: one entry for every text of the shape
        # (the simple protocol's ever-new texts), keyed by the lower-case type (proxy/sql/shapes.py). For a
        # recorded read, a Query's only: C keeps the text of a Query it records (a prepared statement's
        # record names the statement's text, which C finds by the exact one only). A rewritten text by its
        # own text: the rewritten one is made of its literals.
        by_text = verdict.rewritten is not None or (kind != b"Q" and self.trace.records(tags, verdict))
        shape = None if by_text else self.analysis.shape(sql, catalog, verdict)
        key = kind.lower() + shape if shape is not None else exact
        table.add(key, verdict)
        return key

    def row(
        self,
        key: bytes,
        tags: Tags,
        kind_index: Callable[[str], int | None],
        slots: Callable[[Writes], tuple[int, ...] | None],
        path_clean: bool,
    ) -> Decision | str:
        """The C relay's row of one decision of the table (``key``, as ``decide`` gave it) for a connection
        whose reads are not recorded (a request's answer: ``Relay.decide_for_fast``), made once per table as
        ``export`` makes its rows; or why C may not take it (a ``fast_request_handbacks`` reason)."""
        verdict = self.table.get(key)
        if verdict is None:
            return "not decided"
        made = self.table.rows.setdefault((path_clean, False), {})
        return self._made_row(made, key, verdict, _RowFor(tags, kind_index, slots, path_clean))

    def _made_row(
        self,
        made: dict[bytes, Decision | str],
        key: bytes,
        verdict: Analysis,
        c: _RowFor,
    ) -> Decision | str:
        """``key``'s row from ``made`` (``Table.rows``), made the first time it is asked for."""
        row = made.get(key, _UNMADE)
        if row is _UNMADE:
            row = made[key] = self._row(key, verdict, c)
        return row  # type: ignore[no-any-return]

    def export(
        self,
        tags: Tags,
        catalog: Any,
        kind_index: Callable[[str], int | None],
        slots: Callable[[Writes], tuple[int, ...] | None],
        path_clean: bool,
        *,
        promote: Callable[[list[Key]], dict[Key, int]] | None = None,
        stale: int = 0,
    ) -> list[Decision]:
        """The decisions for the C relay, those it can count (a kind it knows, writes it has slots for) and
        may take (unless ``path_clean``, none whose write targets the server is to resolve first). Promoted
        texts (U) only with ``promote`` (``Promotions.export``), which gives their promotions' indexes.

        The rows depend on the connection only by ``path_clean`` and whether its reads are recorded: made
        once per table version for each, and shared by the connections of the table (kinds and write slots of
        the C relay never change once given). ``stale``: a list made up to that many versions ago will do
        (``STALE_LIST``: the connection asks about the Query texts it lacks), unless a Parse's decision came
        since (C does not ask about those: it would hand back at that Parse at every stay)."""
        self._current(catalog)
        table = self.table
        recording = self.trace.reads is not None and tags.session is not None
        made = table.exports.get((path_clean, recording))
        if made is None or table.version - made[0] > stale or table.parses != made[4]:
            made = self._rows(_RowFor(tags, kind_index, slots, path_clean), recording)
            table.exports[path_clean, recording] = made
        _, plain, rows, promoted, _ = made
        if promote is None:
            return plain
        if not promoted:  # (the shared list: C keeps the table it loaded for that list object)
            promote([])
            return plain
        index = promote(list(promoted.values()))
        return [row if row[0] not in promoted else (*row[:5], index[promoted[row[0]]], None) for row in rows]

    def _rows(self, c: _RowFor, recording: bool) -> Export:
        """The rows of the table, each made once per (path_clean, recording) and kept (``Table.rows``): a
        table that changes with every new text is listed again at each change."""
        rows = []
        promoted: dict[bytes, Key] = {}
        made = self.table.rows.setdefault((c.path_clean, recording), {})
        for key, verdict in self.table.items():
            row = self._made_row(made, key, verdict, c)
            if isinstance(row, str):
                continue
            if key[:1] == b"U":
                assert verdict.rewritten is not None
                promoted[key] = (verdict.rewritten, key_types(key))
            rows.append(row)
        plain = [row for row in rows if row[0][:1] != b"U"] if promoted else rows
        return self.table.version, plain, rows, promoted, self.table.parses

    def _row(self, key: bytes, verdict: Analysis, c: _RowFor) -> Decision | str:
        """A decision's row for the C relay, or why it may not take it (a ``fast_request_handbacks``
        reason)."""
        if verdict.resolves_writes and not c.path_clean:
            return "path unknown"  # (PathCheck: the server is to say where its writes resolve first)
        if key[:1] == b"U" and verdict.rewritten is None:
            return "promoted as it is"  # (C promotes a rewritten text only)
        records = self.trace.records(c.tags, verdict)
        if records and key[:1] == b"p":
            return "prepared read record"  # (a read record names the statement's text: a shape has none)
        sent = rewritten_text(key, verdict)
        if sent is not None and records:
            return "rewritten read record"  # (C records no read it rewrites)
        if sent is not None and len(sent) + 6 > MAX_QUERY:
            return "rewritten too long"  # (C sends and watches one Query of up to MAX_QUERY)
        kind = c.kind_index(verdict.kind)
        if kind is None:
            return f"kind {verdict.kind}"  # (a kind C does not count: multi, merge)
        found = c.slots(verdict.writes)
        if found is None:
            return "writes"  # (more than C counts for one statement, or no slot left)
        return (key, kind, found, records, rerun.may_rerun(verdict), -1, sent)

    def _current(self, catalog: Any) -> None:
        if self._catalog is not catalog:
            self.table = self.tables(catalog, Table)
            self._catalog = catalog
