"""The client's prepared statements and portals, by name (the unnamed ones under ""), with what the relay
decided of each: the comment tags of its text and its verdict, which later Binds and Executes rely on. They
move with the connection between the relays (docs/proxy.md, "Prepared statements across the relays")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from proxy import rerun
from proxy.decisions import Writes
from proxy.handoff import Known, Named
from proxy.path_check import PathCheck
from proxy.read_trace import ReadTrace
from proxy.sql import Analysis
from proxy.tags import Tags

KindIndex = Callable[
    [str], int | None
]  # the C relay's index of a statement kind (None: one it does not count)
Slots = Callable[[Writes], tuple[int, ...] | None]  # its write counters for a statement's writes


@dataclass
class Statement:
    tags: Tags | None  # comment tags of its text
    verdict: Analysis
    sql: str | None = None  # its text, kept only while reads are recorded


class Prepared:
    """One connection's statements and portals; a portal shares its statement's ``Statement``."""

    def __init__(self) -> None:
        self.statements: dict[str, Statement] = {}
        self.portals: dict[str, Statement] = {}

    def close(self, kind: str, name: str) -> None:
        """A Close of a statement (``kind`` S) or a portal."""
        (self.statements if kind == "S" else self.portals).pop(name, None)

    def known(
        self, kind_index: KindIndex, slots: Slots, tags: Tags, path: PathCheck, trace: ReadTrace
    ) -> tuple[list[Known], list[Known], list[Statement]]:
        """The statements and portals for the C relay (``handoff.Known``), and the ``Statement``s their
        indexes name. Python only: bound with comment tags (a session switch), a kind C does not count, or
        (in a session) a command tag to map, writes C cannot count, or write targets whose schema the server
        is to tell first (``PathCheck``)."""
        objects: list[Statement] = []
        index: dict[int, int] = {}
        tagged = tags.tagged

        def known(table: dict[str, Statement]) -> list[Known]:
            rows = []
            for name, statement in table.items():
                i = index.get(id(statement))
                if i is None:
                    i = index[id(statement)] = len(objects)
                    objects.append(statement)
                verdict = statement.verdict
                kind = kind_index(verdict.kind)
                found = slots(verdict.writes)
                pyonly = (
                    statement.tags is not None
                    or kind is None
                    or (tagged and (verdict.tag_map is not None or found is None))
                    or (tagged and path.unknown_for(verdict))
                )
                records = statement.sql is not None and trace.records(tags, verdict)
                again = tagged and rerun.may_rerun(verdict)
                rows.append((name.encode(), i, kind or 0, pyonly, found or (), records, again))
            return rows

        return known(self.statements), known(self.portals), objects

    def restore(
        self,
        statements: list[Named],
        portals: list[Named],
        objects: list[Statement],
        prepared_there: Callable[[str], Statement],
        trace: ReadTrace,
    ) -> None:
        """The tables the C relay gives back (they started as ``known``'s): ``objects[i]`` for one Python
        gave, ``prepared_there(text)`` for one prepared on C (once per text); a recorded read's portal comes
        with its Bind parameters."""
        made: dict[bytes, Statement] = {}

        def resolve(i: int, text: bytes | None) -> Statement:
            if i >= 0:
                return objects[i]
            assert text is not None
            statement = made.get(text)
            if statement is None:
                statement = made[text] = prepared_there(text.decode())
            return statement

        self.statements = {name.decode(): resolve(i, text) for name, i, text, _ in statements}
        self.portals = {name.decode(): resolve(i, text) for name, i, text, _ in portals}
        for name, _, _, params in portals:
            if params is not None:
                trace.bind_params[name.decode()] = params
