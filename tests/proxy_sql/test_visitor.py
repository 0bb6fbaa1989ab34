"""``proxy.sql.visitor.Visitor``: the same visits, actions and result as pglast's own ``Visitor`` (whose
dispatch it only caches per class), over every statement of the golden fixtures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pglast
import pytest
from pglast import ast, visitors
from pglast.stream import RawStream

from proxy.sql.visitor import Visitor

FIXTURES = [
    p for p in sorted((Path(__file__).parent / "fixtures").glob("*.sql")) if "syntax_error" not in p.stem
]


def _recorder(base: type[Any]) -> type[Any]:
    """A visitor that records what it sees, skips subqueries, renames tables and relies on ``visit`` for
    the rest: one of each kind of dispatch and action."""

    class Recorder(base):  # type: ignore[valid-type,misc]
        def __init__(self) -> None:
            self.seen: list[str] = []

        def visit(self, _: visitors.Ancestor, node: ast.Node) -> None:
            self.seen.append(type(node).__name__)

        def visit_SubLink(self, _: visitors.Ancestor, node: ast.SubLink) -> Any:
            self.seen.append("SubLink!")
            return visitors.Skip

        def visit_RangeVar(self, _: visitors.Ancestor, node: ast.RangeVar) -> Any:
            self.seen.append(f"RangeVar:{node.relname}")
            return ast.RangeVar(relname=f"{node.relname}_x", inh=True, relpersistence="p", alias=node.alias)

    return Recorder


Ours, Theirs = _recorder(Visitor), _recorder(visitors.Visitor)


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.stem)
def test_visits_and_actions_as_pglast(fixture: Path) -> None:
    sql = fixture.read_text()
    for ours_stmt, theirs_stmt in zip(pglast.parse_sql(sql), pglast.parse_sql(sql), strict=True):
        ours, theirs = Ours(), Theirs()
        ours_result, theirs_result = ours(ours_stmt.stmt), theirs(theirs_stmt.stmt)
        assert ours.seen == theirs.seen
        assert RawStream()(ours_result) == RawStream()(theirs_result)


def test_dispatch_table_is_built_once_per_class_and_not_shared_with_subclasses() -> None:
    where = pglast.parse_sql("SELECT 1 FROM t WHERE a = (SELECT 1)")[0].stmt.whereClause
    Ours()(where)
    table = Ours.__dict__["_cow_visit_table"]
    Ours()(where)
    assert Ours.__dict__["_cow_visit_table"] is table
    assert set(table) == {ast.SubLink, ast.RangeVar}

    class Sub(Ours):  # type: ignore[valid-type,misc]
        def visit_ColumnRef(self, _: visitors.Ancestor, node: ast.ColumnRef) -> None:
            self.seen.append("ColumnRef!")

    sub = Sub()
    sub(where)
    assert "ColumnRef!" in sub.seen
    assert ast.ColumnRef not in Ours.__dict__["_cow_visit_table"]
