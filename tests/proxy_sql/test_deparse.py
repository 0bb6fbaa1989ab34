"""``deparse``: libpg_query's deparser on the encoded tree, whose text parses to the tree pglast's printer's
does on every statement of the protobuf corpus and on every rewrite of the analyzer over it; and
``print_tree`` (pglast's printer, where C cannot serve) with the back-links set by ``populate``, equal to
``RawStream()`` on every statement of the golden fixtures (inputs and expected rewrites) and on odd trees,
both leaving no reference cycle behind."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pglast
import pytest
from pglast import ast
from pglast.parser import ParseError, parse_sql_protobuf
from pglast.stream import RawStream
from pglast.visitors import Ancestor, populate_ancestors

from proxy.sql import Analyzer, rewrites
from proxy.sql.deparse import FALLBACKS, deparse, populate, print_tree
from proxy.sql.protobuf import encode
from proxy.sql.rewrites import app_path

from .catalogs import sample_catalog
from .protobuf_wire import rewrite
from .test_protobuf import CORPUS, SOURCES

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
def test_print_tree_equals_raw_stream(sql: str) -> None:
    for raw, again in zip(pglast.parse_sql(sql), pglast.parse_sql(sql), strict=True):
        assert print_tree(raw) == RawStream()(again)
        assert print_tree(raw.stmt) == RawStream()(again.stmt)


def _tree(text: str, drop: frozenset[str] = frozenset()) -> bytes:
    """The parse tree of ``text`` as libpg_query's protobuf, locations (and ``drop``) left out."""
    return rewrite(parse_sql_protobuf(text), all_locations=True, drop=drop)


# pglast's printer writes SQL-standard calls as plain ones (``SUBSTRING(a FROM 2)`` as
# ``pg_catalog.substring(a, 2)``): the same call, its display form (``funcformat``) aside
FORMAT = frozenset({"funcformat"})
PRINTER_BUGS: list[str] = []  # what pglast's printer writes that does not parse


def _same_statement(node: ast.Node) -> str:
    """``deparse(node)``, checked to parse to the tree itself (locations aside) and to the tree pglast's
    printer's text parses to (where that text parses)."""
    ours = deparse(node)
    raw = node if isinstance(node, ast.RawStmt) else ast.RawStmt(stmt=node)
    assert _tree(ours) == rewrite(encode((raw,), locations=False), all_locations=True), ours
    printed = print_tree(node)
    try:
        theirs = _tree(printed, FORMAT)
    except ParseError:
        PRINTER_BUGS.append(printed)
    else:
        assert _tree(ours, FORMAT) == theirs, ours
    return ours


@pytest.mark.parametrize("chunk", range(10))
def test_c_deparse_parses_to_the_printers_tree(chunk: int) -> None:
    before = dict(FALLBACKS.by_reason)
    for text in CORPUS[chunk::10]:
        for raw in pglast.parse_sql(text):
            if raw.stmt is not None:
                _same_statement(raw)
    assert FALLBACKS.by_reason == before  # (C wrote every one)


def test_the_analyzers_rewrites_parse_to_the_printers_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tree the rules deparse while the analyzer rewrites the tests' texts of the corpus (in a
    session, the fixtures' catalog)."""
    seen: list[str] = []

    def checked(node: ast.Node) -> str:
        seen.append(_same_statement(node))
        return seen[-1]

    monkeypatch.setattr(rewrites, "deparse", checked)
    monkeypatch.setattr(app_path, "deparse", checked)
    analyzer = Analyzer(server_version_num=170000, templates=False)
    catalog = sample_catalog()
    for text in SOURCES["tests"]:
        analyzer.analyze(text, catalog, in_session=True)
    assert len(seen) >= 250


def test_what_c_cannot_take_is_printed_by_pglast() -> None:
    before = dict(FALLBACKS.by_reason)
    expression = pglast.parse_sql("SELECT a + 1")[0].stmt.targetList[0].val
    assert deparse(expression) == "a + 1"
    odd = pglast.parse_sql("SELECT 1")[0]
    object.__setattr__(odd.stmt, "limitOption", 99)  # (no LimitOption: the encoder refuses it)
    assert deparse(odd) == "SELECT 1"
    assert FALLBACKS.by_reason == {
        **before,
        "expression": before["expression"] + 1,
        "encode": before["encode"] + 1,
    }


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
    assert garbage(print_tree) == 0
    assert garbage(deparse) == 0
