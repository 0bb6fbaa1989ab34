"""``copy_tree``: the rewrites' copy of client expressions equals ``copy.deepcopy``'s, shares no node with the
original, and prints the same SQL, for every statement of the golden fixtures."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pglast
import pytest
from pglast import ast
from pglast.stream import RawStream

from proxy.sql.rewrites.nodes import copy_tree

FIXTURES = [
    p for p in sorted((Path(__file__).parent / "fixtures").glob("*.sql")) if "syntax_error" not in p.stem
]


def _nodes(tree: object) -> Iterator[ast.Node]:
    if isinstance(tree, ast.Node):
        yield tree
        for name in type(tree).__slots__:  # type: ignore[attr-defined]
            yield from _nodes(getattr(tree, name, None))
    elif isinstance(tree, (tuple, list)):
        for item in tree:
            yield from _nodes(item)


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.stem)
def test_copy_equals_deepcopy_and_shares_nothing(fixture: Path) -> None:
    for raw in pglast.parse_sql(fixture.read_text()):
        original = raw.stmt
        deep = copy.deepcopy(original)  # before printing: with the back-links set it can exhaust the stack
        printed = RawStream()(original)  # sets the ancestors back-links that copy_tree leaves out
        copied = copy_tree(original)
        assert copied == original == deep
        assert RawStream()(copied) == printed
        assert not {id(n) for n in _nodes(copied)} & {id(n) for n in _nodes(original)}


def test_edit_of_the_copy_leaves_the_original() -> None:
    where = pglast.parse_sql("SELECT 1 FROM t WHERE a = 1 AND b IN (2, 3)")[0].stmt.whereClause
    copied = copy_tree(where)
    copied.args[0].rexpr.val.ival = 9
    copied.args = (*copied.args, copied.args[0])
    assert RawStream()(where) == "a = 1 AND b IN (2, 3)"
    assert RawStream()(copied) == "a = 9 AND b IN (2, 3) AND a = 9"
