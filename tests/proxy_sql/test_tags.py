"""Comment tags: position, key order, URL-encoding, traceparent, bad ids; edge-comment stripping."""

from __future__ import annotations

import pytest

from proxy.errors import TagError
from proxy.sql import Tags, read_comment_tags, strip_edge_comments

TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("/*cow_session='S1',cow_operation='O1'*/ SELECT 1", Tags("S1", "O1")),
        ("SELECT 1 /*cow_session='S1',cow_operation='O1'*/", Tags("S1", "O1")),
        ("SELECT 1 /*cow_operation='O1',cow_session='S1'*/;", Tags("S1", "O1")),
        ("  /* cow_session = 'S1' , app='x%20y' */\nSELECT 1", Tags("S1", None)),
        ("SELECT 1 /*cow_session='a%3Ab.c-d_e',cow_operation='op%2D7'*/", Tags("a:b.c-d_e", "op-7")),
        (
            f"SELECT 1 /*cow_session='S',traceparent='{TRACE}'*/",
            Tags("S", "4bf92f3577b34da6a3ce929d0e0e4736"),
        ),
        (f"SELECT 1 /*traceparent='{TRACE}',cow_operation='O'*/", Tags(None, "O")),
        (f"SELECT 1 /*traceparent='{TRACE}'*/", Tags(None, "4bf92f3577b34da6a3ce929d0e0e4736")),
        # trailing wins key by key over leading
        ("/*cow_session='A',cow_operation='X'*/ SELECT 1 /*cow_session='B'*/", Tags("B", "X")),
    ],
)
def test_tags_are_read(sql: str, expected: Tags) -> None:
    assert read_comment_tags(sql) == expected


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1",
        "SELECT '/*cow_session=''S''*/'",  # inside a string, not a comment
        "SELECT 1 /* plain comment */",
        "SELECT /*cow_session='S'*/ 1",  # not at an edge
        "SELECT 1 /*app='x',controller='y'*/",
        "SELECT 1 /*traceparent='not-a-trace'*/",
        "SELECT 1 /*traceparent='00-00000000000000000000000000000000-00f067aa0ba902b7-01'*/",
        "-- cow_session='S'\nSELECT 1",
        "/* outer /* cow_session='S' */ */ SELECT 1",  # nested comment: not a sqlcommenter comment
    ],
)
def test_no_tags(sql: str) -> None:
    assert read_comment_tags(sql) is None


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1 /*cow_session='has space'*/",
        "SELECT 1 /*cow_session='x%20y'*/",  # decodes to a space
        "SELECT 1 /*cow_session=''*/",
        "SELECT 1 /*cow_operation='semi;colon'*/",
        "SELECT 1 /*cow_session='" + "a" * 129 + "'*/",
        "SELECT 1 /*cow_session='%27%3B DROP TABLE x'*/",
    ],
)
def test_bad_ids_raise_tag_error(sql: str) -> None:
    with pytest.raises(TagError) as info:
        read_comment_tags(sql)
    assert info.value.sqlstate == "22023"


def test_longest_valid_id() -> None:
    assert read_comment_tags("SELECT 1 /*cow_session='" + "a" * 128 + "'*/") == Tags("a" * 128, None)


def test_escaped_quote_in_other_key_does_not_break_parsing() -> None:
    assert read_comment_tags(r"SELECT 1 /*route='it\'s',cow_session='S'*/") == Tags("S", None)


@pytest.mark.parametrize(
    ("sql", "stripped"),
    [
        ("/*a*/ SELECT 1 /*b*/", "SELECT 1"),
        ("/*a*/ /*b*/\n SELECT 1", "SELECT 1"),
        ("SELECT 1 /*b*/;", "SELECT 1;"),
        ("  SELECT 1  ", "SELECT 1"),
        ("SELECT /*x*/ 1", "SELECT /*x*/ 1"),
        ("/* a /* nested */ */ SELECT 1", "/* a /* nested */ */ SELECT 1"),
    ],
)
def test_strip_edge_comments(sql: str, stripped: str) -> None:
    assert strip_edge_comments(sql) == stripped


def test_same_statement_with_different_tags_has_one_key() -> None:
    a = strip_edge_comments("SELECT * FROM t /*cow_session='A',cow_operation='1'*/")
    b = strip_edge_comments("/*cow_session='B'*/ SELECT * FROM t")
    assert a == b == "SELECT * FROM t"
