"""Rewrites per shape (proxy/sql/templates.py): a shape is rewritten once, as a probe, and each text of it is
the probe's rewrite with its own constants; every text must get exactly what the rewriter gives it alone."""

from __future__ import annotations

import pglast
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy.sql import Analysis, Analyzer, analyze
from proxy.sql.analyze import _shape_fields
from proxy.sql.deparse import deparse
from proxy.sql.shapes import INT, NUM, STR, lex
from proxy.sql.templates import written

from .catalogs import sample_catalog

CATALOG = sample_catalog()

CHAIN = "FROM comments c JOIN issues i ON i.id = c.issue_id JOIN projects p ON p.id = i.project_id"
# Texts each rewriting rule changes or looks at, with literals; {i} an integer, {f} a number, {s} a string.
_SHAPES = [
    # on_conflict (Django's M2M adds, upserts), also a refusal of the rule's (42601)
    "INSERT INTO issues (id, title) VALUES ({i}, {s}) ON CONFLICT (id) DO NOTHING",
    "INSERT INTO issues (id, title) VALUES ({i}, {s}), (-{i}, {s}) ON CONFLICT DO NOTHING RETURNING id",
    "INSERT INTO issues (id, title, points) VALUES ({i}, {s}, {i}) ON CONFLICT (id) DO UPDATE SET "
    "title = {s} || EXCLUDED.title, points = issues.points + {i} WHERE issues.points < {f}",
    "INSERT INTO comments (issue_id, body) SELECT id, {s} FROM issues WHERE id > {i} ON CONFLICT DO NOTHING",
    "INSERT INTO issues (id) VALUES ({i}, {i}) ON CONFLICT DO NOTHING",
    # counts: a lone count(*), its condition copied into three parts; a counted subquery's LIMIT/OFFSET
    "SELECT count(*) FROM issues WHERE id = {i} AND title = {s}",
    "SELECT count(*) AS n FROM issues WHERE id IN ({i}, {i}, {i}) OR points = - -{i} OR points < -{f}",
    "SELECT count(*) FROM (SELECT id FROM issues WHERE points > {i} LIMIT {i} OFFSET {i}) AS sub",
    "SELECT count(title) FROM issues WHERE title <> {s}",
    # group_by, row_locks, lateral, qualify, key_reads, introspection
    "SELECT p.name, count(*) FROM projects p WHERE p.budget > {f} GROUP BY p.id HAVING count(*) > {i}",
    "SELECT id FROM issues WHERE project_id = {i} AND title = {s} FOR SHARE",
    "SELECT i.title, count(*) FROM issues i JOIN comments c ON c.issue_id = i.id AND c.body = {s} "
    "GROUP BY i.id FOR SHARE",
    f"SELECT * {CHAIN} WHERE c.id = {{i}} AND i.points > {{i}} LIMIT {{i}}",
    "SELECT * FROM comments c LEFT JOIN issues i ON c.issue_id = i.id AND i.points > {i} LIMIT {i}",
    "SELECT title FROM public.issues WHERE id = {i} AND title LIKE {s}",
    "UPDATE public.issues SET title = {s}, points = {i} WHERE id = {i}",
    "DELETE FROM public.comments WHERE body = {s} OR id = -{i}",
    "SELECT name FROM projects WHERE id = $1 AND budget > {f} AND name <> {s}",
    "SELECT current_schema(), {i}, {s}",
    # visibility as a set, or per row where a constant pins the relation (the choice reads no value)
    "SELECT c.relname, {i} FROM pg_class c WHERE c.relkind IN ({s}, {s}) AND pg_table_is_visible(c.oid)",
    "SELECT c.relname FROM pg_class c WHERE c.relname = {s} AND pg_table_is_visible(c.oid)"
    " AND c.relpages > {i} AND c.relkind = {s}",
    "SELECT c.relname FROM pg_class c WHERE c.oid = {i} AND pg_table_is_visible(c.oid)",
    # constants pglast's printer reads: a type modifier, EXTRACT's field; a cast to a plain type
    "SELECT count(*) FROM issues WHERE title = {s}::varchar({i}) AND {s}::char(1) = 'x'",
    "SELECT count(*) FROM issues WHERE EXTRACT({s} FROM now()) > {i}",
    "SELECT count(*) FROM issues WHERE points > {f}::numeric AND title = lower({s})",
    # a text of two statements is rewritten on its own
    "SELECT count(*) FROM issues WHERE id = {i}; SELECT count(*) FROM issues WHERE id = {i}",
]
_STRINGS = st.sampled_from(
    ["x", "", "it's", "''", "é ü", "c0wq00001", "1987600000", "year", "-1", "a\nb", "%", "NFC"]
)
_LITERALS = st.fixed_dictionaries(
    {
        # an integer the server lexes as one (INT), with leading zeros too, or a larger one (NUM)
        "i": st.one_of(
            st.integers(min_value=0, max_value=2**31 - 1).map(str),
            st.sampled_from(["0", "007", "00", "2147483647", "2147483648", "99999999999"]),
        ),
        "f": st.sampled_from(["1.5", ".5", "1e5", "1.", "0.0", "99999999999", "2.50", "1E-3"]),
        "s": _STRINGS.map(lambda v: "'" + v.replace("'", "''") + "'"),
    }
)


def _fields(verdict: Analysis) -> tuple[object, ...]:
    return (*_shape_fields(verdict), verdict.error_detail)


def _alone(sql: str, prepared: bool) -> Analysis:
    """The oracle: the text rewritten on its own (no template)."""
    return Analyzer(templates=False).analyze(sql, CATALOG, True, prepared=prepared)


@settings(max_examples=400, deadline=None)
@given(
    shape=st.sampled_from(_SHAPES),
    literals=st.lists(_LITERALS, min_size=3, max_size=5),
    prepared=st.booleans(),
)
@example(  # the sign folded into a zero: -0 is 0, - -5 is 5, - -1.5 is 1.5
    shape=_SHAPES[6],
    literals=[{"i": "5", "f": "1.5", "s": "'a'"}, {"i": "0", "f": "0.0", "s": "'b'"}],
    prepared=False,
)
def test_a_text_rewritten_by_its_shapes_template_is_rewritten_as_alone(
    shape: str, literals: list[dict[str, str]], prepared: bool
) -> None:
    """Texts of one shape through one analyzer (the second makes the template, the rest fill it) get what a
    cold analyzer without templates gives each of them, byte for byte, refusals with their SQLSTATEs."""
    warm = Analyzer()
    for values in literals:
        sql = shape.format(**values)
        assert _fields(warm.analyze(sql, CATALOG, True, prepared=prepared)) == _fields(_alone(sql, prepared))


_IN_LISTS = [
    'SELECT COUNT(*) AS "__count" FROM issues WHERE issues.points IN ({})',
    "SELECT count(*) FROM issues WHERE title NOT IN ({}) AND id > 5",
    "SELECT id FROM issues WHERE project_id IN ({}) FOR SHARE",
    "INSERT INTO comments (issue_id, body) SELECT id, 'x' FROM issues WHERE id IN ({})"
    " ON CONFLICT DO NOTHING",
    "SELECT count(*) FROM issues WHERE (id, points) IN (({}), (1, 2))",
]
_ITEMS = st.one_of(
    st.integers(min_value=-(2**40), max_value=2**40).map(str),
    st.sampled_from(["0", "007", "1.5", "-1.5", "- -2", "'a'", "'it''s'", "''", "1e3"]),
)


@settings(max_examples=200, deadline=None)
@given(
    shape=st.sampled_from(_IN_LISTS),
    items=st.lists(_ITEMS, min_size=1, max_size=150),
    separator=st.sampled_from([", ", ",", " ,\n  "]),
    again=st.booleans(),
)
def test_a_text_with_an_in_list_is_rewritten_as_alone(
    shape: str, items: list[str], separator: str, again: bool
) -> None:
    """An IN list of constants is one sentinel in the probe, from the first text when the text may hold a
    long one (64 commas); the list the template writes is the text's, as the deparser would write it."""
    warm = Analyzer()
    sql = shape.format(separator.join(items))
    if again:  # (a template made by another text of the shape)
        warm.analyze(shape.format(separator.join(reversed(items))), CATALOG, True)
        warm.analyze(shape.format(separator.join(sorted(items))), CATALOG, True)
    assert _fields(warm.analyze(sql, CATALOG, True)) == _fields(_alone(sql, False))


def test_a_long_in_list_is_rewritten_as_one_constant() -> None:
    """Django's ``filter(pk__in=…)`` count of 2,000 ids: the rules and the deparser see one constant."""
    analyzer = Analyzer()
    sql = _IN_LISTS[0].format(", ".join(str(n) for n in range(2000)))
    assert analyzer.analyze(sql, CATALOG, True) == _alone(sql, False)
    assert len(analyzer._templates) == 1  # (made at the first text)
    other = _IN_LISTS[0].format(", ".join(str(n) for n in range(1, 2001)))
    expected = _alone(other, False)
    parsed = []
    original = pglast.parse_sql
    try:
        pglast.parse_sql = lambda text: parsed.append(text) or original(text)  # type: ignore[assignment]
        assert Analyzer().analyze(other, CATALOG, True) == expected
    finally:
        pglast.parse_sql = original
    assert parsed and all(text.count(",") < 100 for text in parsed)  # (the probe, the rule's own template)


# Shapes of Django's kinds that are rewritten once (the rest are each text's own rewrite).
_TEMPLATED = [
    ("INSERT INTO issues (id, title) VALUES ({}, '{}') ON CONFLICT (id) DO NOTHING", "WITH cow_rows AS"),
    ("SELECT count(*) FROM issues WHERE project_id = {} AND title <> '{}'", "(SELECT count(*) FROM"),
    ("SELECT id FROM issues WHERE project_id = {} AND title = '{}' FOR SHARE", "cow.lock_row("),
    ("UPDATE public.issues SET points = {} WHERE title = '{}'", "UPDATE cow_public.issues"),
]


@pytest.mark.parametrize(("sql", "rewritten"), _TEMPLATED)
def test_a_shape_is_rewritten_twice(sql: str, rewritten: str) -> None:
    """Its first text alone (most shapes come once), its second as the probe that makes the template; the
    texts after it fill the template in."""
    analyzer = Analyzer()
    first = analyzer.analyze(sql.format(1, "a"), CATALOG, True)
    assert first.rewritten is not None and rewritten in first.rewritten
    for number, text in enumerate(("it''s", "", "x", "é"), 2):
        assert analyzer.analyze(sql.format(number, text), CATALOG, True) == _alone(
            sql.format(number, text), False
        )
    assert analyzer.template_hits == 3
    # a named prepared statement's text is another template (key reads take another form there)
    analyzer.analyze(sql.format(6, "b"), CATALOG, True, prepared=True)
    assert analyzer.template_hits == 3


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT count(*) FROM issues WHERE title = 'a'::varchar({})",  # a type modifier (char(1): char)
        "SELECT count(*) FROM issues WHERE EXTRACT('{}' FROM now()) > 1",  # EXTRACT(YEAR FROM …)
        "SELECT count(*) FROM issues WHERE id = {0}; SELECT count(*) FROM issues WHERE id = {0}",
        "INSERT INTO members (id, email) VALUES ({}, 'x') ON CONFLICT DO NOTHING RETURNING id",  # RLS mark
        "SELECT count(*) FROM issues ORDER BY {}",  # an ordinal: the shape's literals are not data
    ],
)
def test_shapes_rewritten_text_by_text(sql: str) -> None:
    analyzer = Analyzer()
    for value in ("1", "2", "3", "4"):
        text = sql.format(value)
        assert analyzer.analyze(text, CATALOG, True) == _alone(text, False)
    assert analyzer.template_hits == 0


@given(
    token=st.one_of(
        st.integers(min_value=0, max_value=2**31 - 1).map(lambda n: (str(n), INT)),
        st.sampled_from([("007", INT), ("1.50", NUM), (".5", NUM), ("1e3", NUM), ("1.", NUM)]),
        st.sampled_from([("99999999999", NUM), ("2147483648", NUM), ("'it''s'", STR), ("''", STR)]),
    ),
    signs=st.integers(min_value=0, max_value=3),
)
def test_a_constant_is_written_as_the_deparser_writes_it(token: tuple[str, int], signs: int) -> None:
    """``templates.written`` against the deparse of the constant with its unary minus signs (the
    parser folds them into numbers only: a string's stay an operator, and its constant has none)."""
    text, kind = token
    signs = 0 if kind == STR else signs
    sql = "SELECT " + "- " * signs + text
    shape = lex(sql.encode())
    assert shape is not None and [literal.kind for literal in shape.literals] == [kind]
    assert "SELECT " + written(text, kind, signs) == deparse(pglast.parse_sql(sql)[0])


def test_a_refused_shape_is_not_probed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Django's permission query orders by an ordinal (``ORDER BY …, 2``): its literals are not data, which
    is the shape's, so its probe is refused once and its later texts are rewritten alone without a probe."""
    probes: list[str] = []
    probe = analyze._probe
    monkeypatch.setattr(analyze, "_probe", lambda target: probes.append(target.text) or probe(target))
    analyzer = Analyzer()
    sql = "SELECT i.title FROM issues i JOIN comments c ON c.issue_id = i.id WHERE i.id IN ({}) ORDER BY 1"
    for value in range(1, 6):
        assert analyzer.analyze(sql.format(value), CATALOG, True) == _alone(sql.format(value), False)
    assert probes == [sql.format(2)] and analyzer.template_hits == 0
