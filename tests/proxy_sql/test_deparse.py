"""``deparse``: pglast's printer with the back-links set by ``populate``, equal to ``RawStream()`` on every
statement of the golden fixtures (inputs and expected rewrites) and on odd trees, and leaving no reference
cycle behind."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pglast
import pytest
from pglast import ast
from pglast.stream import RawStream
from pglast.visitors import Ancestor, populate_ancestors

from proxy.sql.deparse import deparse, populate

FIXTURES = [
    p for p in sorted((Path(__file__).parent / "fixtures").glob("*.sql")) if "syntax_error" not in p.stem
]
# Trees with lists of lists (VALUES, ROWS FROM), nested expressions, a DO body, a CTE, several statements.
ODD = [
    "SELECT * FROM ROWS FROM (generate_series(10, 11), get_users()) AS r(a, b)",
    "INSERT INTO t (a, b) VALUES (1, 'x'), (2, NULL), (-3, E'\\n') ON CONFLICT (a) DO UPDATE SET b = 7",
    "SELECT 1 + 2 * (3 - -4) / 5 AS v, ARRAY[[1, 2], [3, 4]], (SELECT max(x) FROM u WHERE u.y = t.y)",
    "WITH c AS (DELETE FROM t WHERE a IN (1, 2, 3) RETURNING *) SELECT count(*) FROM c",
    "DO $$BEGIN PERFORM 1; END$$",
    "SELECT CASE WHEN a = 1 THEN 'one' WHEN a = 2 THEN 'two' ELSE 'many' END FROM t ORDER BY 1 DESC",
]


def _statements() -> Iterator[str]:
    for fixture in FIXTURES:
        for raw in pglast.parse_sql(fixture.read_text()):
            start = raw.stmt_location or 0
            yield (
                fixture.read_text()[start : start + raw.stmt_len]
                if raw.stmt_len
                else fixture.read_text()[start:]
            )
    yield from ODD


STATEMENTS = list(_statements())


def _nodes(tree: object) -> Iterator[ast.Node]:
    stack = [tree]
    while stack:
        value = stack.pop()
        if isinstance(value, tuple):
            stack.extend(reversed(value))
        elif isinstance(value, ast.Node):
            yield value
            stack.extend(
                getattr(value, name, None)
                for name in reversed(type(value).__slots__)  # type: ignore[attr-defined]
            )


def _members(root: tuple[object, ...], node: ast.Node) -> list[object]:
    """The members from the root to ``node`` along its chain, each link checked to name the node (or list)
    that holds the next one, from ``root`` down."""
    links = []
    link: Ancestor | None = node.ancestors
    while link is not None:
        links.append(link)
        link = link.parent
    links.reverse()
    assert links[0].node is None and links[0].member is None  # the root's link
    current: object = root
    for link in links[1:]:
        assert link.node is current
        member = link.member
        current = current[member] if isinstance(member, int) else getattr(current, member)  # type: ignore[index]
    assert current is node
    return [link.member for link in links]


@pytest.mark.parametrize("sql", STATEMENTS)
def test_deparse_equals_raw_stream(sql: str) -> None:
    for raw, again in zip(pglast.parse_sql(sql), pglast.parse_sql(sql), strict=True):
        assert deparse(raw) == RawStream()(again)
        assert deparse(raw.stmt) == RawStream()(again.stmt)


@pytest.mark.parametrize("sql", STATEMENTS)
def test_populate_sets_pglast_chains(sql: str) -> None:
    ours, theirs = pglast.parse_sql(sql), pglast.parse_sql(sql)
    populate(ours)
    populate_ancestors(theirs)
    for mine, pglasts in zip(_nodes(ours), _nodes(theirs), strict=True):
        assert _members(ours, mine) == _members(theirs, pglasts)


def test_no_cycle_left() -> None:
    """A printed tree is freed by reference counting: pglast's own printer leaves it to the collector."""
    sql = ODD[3]

    def garbage(printer: object) -> int:
        gc.collect()
        gc.disable()
        try:
            tree = pglast.parse_sql(sql)
            assert printer(tree[0])  # type: ignore[operator]
            del tree
            return gc.collect()
        finally:
            gc.enable()

    assert garbage(RawStream()) > 0  # (the test can tell)
    assert garbage(deparse) == 0
