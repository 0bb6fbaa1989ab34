"""Random SQL-ish input never crashes the analyzer or the tag reader with anything but ProxyError."""

from __future__ import annotations

import contextlib
from typing import Any
from urllib.parse import quote

import pglast
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.errors import ProxyError
from proxy.sql import KINDS, Analysis, Analyzer, Tags, read_comment_tags, strip_edge_comments

from .catalogs import sample_catalog

CATALOG = sample_catalog()
TOKENS = [
    "SELECT",
    "INSERT INTO",
    "UPDATE",
    "DELETE FROM",
    "TRUNCATE",
    "COPY",
    "MERGE INTO",
    "SET",
    "RESET",
    "ALL",
    "DISCARD",
    "DO",
    "$$",
    "ON CONFLICT",
    "(id)",
    "DO NOTHING",
    "DO UPDATE SET",
    "EXCLUDED.name",
    "RETURNING",
    "*",
    "VALUES",
    "(1, 'a')",
    "($1, $2)",
    "DEFAULT",
    "projects",
    "public.projects",
    "public.issues",
    "comments",
    "cow.session_id",
    "set_config('cow.x', 'y', false)",
    "cow.use_session('s')",
    "FROM",
    "WHERE",
    "=",
    ",",
    ";",
    "(",
    ")",
    "'",
    '"',
    "/*",
    "*/",
    "--",
    "\n",
    " ",
    "CASCADE",
    "RESTRICT",
    "RESTART IDENTITY",
    "TO STDOUT",
    "FROM STDIN",
    "WITH",
    "AS",
    "x",
    "name",
    "ALTER TABLE",
    "DROP TABLE",
    "CREATE INDEX ON",
    'U&"\\0070ublic"',
    "E'\\''",
    "cow_session='S'",
    "traceparent=",
    "%41",
    "\\",
]
sqlish = st.lists(st.sampled_from(TOKENS), max_size=25).map(" ".join)


def _check(result: Analysis) -> None:
    assert result.kind in (*KINDS, "multi")
    if result.error is not None:
        assert len(result.error[0]) == 5
        assert "cannot rewrite this statement" not in result.error[1]  # the rewriter's internal-error path


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sql=st.one_of(sqlish, st.text(max_size=80)), in_session=st.booleans())
def test_analyze_never_crashes(sql: str, in_session: bool) -> None:
    analyzer = Analyzer(server_version_num=150000)
    with contextlib.suppress(ProxyError):
        _check(analyzer.analyze(sql, CATALOG, in_session))


@settings(max_examples=300, deadline=None)
@given(
    sql=st.one_of(
        sqlish,
        st.text(max_size=80),
        st.builds(
            lambda a, b, body: f"{a}/*{body}*/{b}",
            st.sampled_from(["", " ", "SELECT 1 "]),
            st.sampled_from(["", ";", " SELECT 1"]),
            st.lists(
                st.sampled_from(["cow_session=", "cow_operation=", "'", "S", "%2", "%41", ",", "\\'", "x"])
            ).map("".join),
        ),
    )
)
def test_comment_tags_never_crash(sql: str) -> None:
    try:
        tags = read_comment_tags(sql)
    except ProxyError as exc:
        assert exc.sqlstate == "22023"
        return
    if tags is not None:
        assert tags.session is not None or tags.operation is not None
    assert isinstance(strip_edge_comments(sql), str)


VALUES_ITEMS = ["1", "$1", "'x'", "DEFAULT", "NULL", "2.5", "now()", "(SELECT 1)", "$2::text"]


@st.composite
def upserts(draw: st.DrawFn) -> str:
    table = draw(st.sampled_from(["projects", "public.projects", "issues", "members AS m", "app.events"]))
    columns = draw(
        st.sampled_from(["", "(id)", "(id, name)", "(id, project_id, title)", "(name, id, budget)"])
    )
    width = columns.count(",") + 1 if columns else draw(st.integers(1, 3))
    rows = draw(
        st.lists(
            st.lists(st.sampled_from(VALUES_ITEMS), min_size=width, max_size=width), min_size=1, max_size=3
        )
    )
    source = draw(
        st.sampled_from(
            [
                "VALUES " + ", ".join("(" + ", ".join(r) + ")" for r in rows),
                "SELECT * FROM projects",
                "DEFAULT VALUES",
            ]
        )
    )
    target = draw(
        st.sampled_from(
            ["", "(id)", "(name)", "(title, project_id)", "ON CONSTRAINT projects_pkey", "(email)"]
        )
    )
    action = draw(
        st.sampled_from(
            [
                "DO NOTHING",
                "DO UPDATE SET name = EXCLUDED.name",
                "DO UPDATE SET budget = EXCLUDED.budget + 1 WHERE projects.budget > 0",
                "DO UPDATE SET (name, budget) = (EXCLUDED.name, 3)",
            ]
        )
    )
    returning = draw(st.sampled_from(["", " RETURNING *", " RETURNING id, upper(name)", " RETURNING m.*"]))
    sql = f"INSERT INTO {table} {columns} {source} ON CONFLICT {target} {action}{returning}"
    if draw(st.booleans()):
        sql = f"WITH w AS ({sql}) SELECT 1"
    return sql


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sql=upserts(), version=st.sampled_from([0, 150000, 170000]))
def test_upsert_rewrites_are_valid_sql_or_clear_refusals(sql: str, version: int) -> None:
    result = Analyzer(server_version_num=version).analyze(sql, CATALOG, in_session=True)
    _check(result)
    if result.rewritten is not None:
        assert pglast.parse_sql(result.rewritten)


ids = st.text(alphabet="abcXYZ0129._:-", min_size=1, max_size=128)


@settings(max_examples=200, deadline=None)
@given(
    session=ids,
    operation=ids,
    others=st.dictionaries(st.sampled_from(["app", "route", "db_driver"]), st.text(max_size=10), max_size=3),
    order=st.randoms(use_true_random=False),
    leading=st.booleans(),
    encode_all=st.booleans(),
)
def test_comment_tags_round_trip(
    session: str, operation: str, others: dict[str, str], order: Any, *, leading: bool, encode_all: bool
) -> None:
    def enc(value: str) -> str:
        return "".join(f"%{b:02X}" for b in value.encode()) if encode_all else quote(value, safe="")

    pairs = [f"cow_session='{enc(session)}'", f"cow_operation='{enc(operation)}'"]
    pairs += [f"{k}='{quote(v, safe='')}'" for k, v in others.items()]
    order.shuffle(pairs)
    comment = "/*" + ",".join(pairs) + "*/"
    sql = f"{comment} SELECT 1" if leading else f"SELECT 1 {comment}"
    assert read_comment_tags(sql) == Tags(session, operation)
    assert strip_edge_comments(sql) == "SELECT 1"
