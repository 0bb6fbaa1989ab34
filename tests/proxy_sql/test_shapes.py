"""Literal-normalised keys (proxy/sql/shapes.py): the lexer on bytes, the C relay's lexer against it, and the
proof that a shape's literals cannot change the analysis' verdict."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pglast.parser import ParseError, parse_sql_json, scan

from proxy.fastrelay import AVAILABLE, UNAVAILABLE, FastRelay
from proxy.sql import Analysis, Analyzer
from proxy.sql.analyze import _shape_fields
from proxy.sql.shapes import INT, NAME, NUM, STR, key, lex, literals_irrelevant

from .catalogs import sample_catalog

CATALOG = sample_catalog()
INT_, NUM_, STR_, NAME_ = bytes([INT]), bytes([NUM]), bytes([STR]), bytes([NAME])


LEXED = [
    (b"SELECT 1", b"SELECT " + INT_),
    (b"SELECT -1, - 2", b"SELECT -" + INT_ + b", - " + INT_),
    (b"SELECT 1e5, 1E-5, 1.5, .5, 1., 1.e3", b"SELECT " + b", ".join([NUM_] * 6)),
    # the server's integer class: at most 2147483647, leading zeros aside
    (
        b"SELECT 2147483647, 2147483648, 0002147483647, 00000000000",
        b"SELECT " + b", ".join([INT_, NUM_, INT_, INT_]),
    ),
    (b'SELECT x1, _2, a$1, "1", "a""2"', None),
    (b"SELECT $1, $12 + 3", b"SELECT $1, $12 + " + INT_),
    (b"SELECT 'a', 'it''s', ''", b"SELECT " + b", ".join([STR_] * 3)),
    (b"SELECT 'a\\b'", None),  # standard_conforming_strings off would end it elsewhere: no key
    (b"SELECT E'\\'', e'\\\\', E'''', 4", b"SELECT E'\\'', e'\\\\', E'''', " + INT_),
    (
        b"SELECT U&'d\\0061t', U&\"x\", B'101', X'1F', N'x', 1",
        b"SELECT U&'d\\0061t', U&\"x\", B'101', X'1F', N'x', " + INT_,
    ),
    (b"SELECT N'a\\'", None),
    (b"SELECT $$a 'b' 1$$, $t$ $$ 2 $t$, 3", b"SELECT $$a 'b' 1$$, $t$ $$ 2 $t$, " + INT_),
    (b"SELECT $a$b$c$a$, 4", b"SELECT $a$b$c$a$, " + INT_),
    (
        b"SELECT $" + b"t" * 62 + b"$x$" + b"t" * 62 + b"$, 4",
        b"SELECT $" + b"t" * 62 + b"$x$" + b"t" * 62 + b"$, " + INT_,
    ),
    (b"SELECT $" + b"t" * 63 + b"$x$" + b"t" * 63 + b"$, 4", None),  # (a delimiter of 65 bytes)
    (b"SELECT 1 -- 2 'x\n, 3", b"SELECT " + INT_ + b" -- 2 'x\n, " + INT_),
    (b"SELECT 1 -- 2\r, 3", b"SELECT " + INT_ + b" -- 2\r, " + INT_),
    (b"/*cow_session='s1'*/ SELECT 1", b"/*cow_session='s1'*/ SELECT " + INT_),
    (
        b"SELECT 1 /*cow_session=7,cow_operation='o1'*/",
        b"SELECT " + INT_ + b" /*cow_session=7,cow_operation='o1'*/",
    ),
    (b"SELECT /* a /* 1 */ '2' */ 3", b"SELECT /* a /* 1 */ '2' */ " + INT_),
    (b"SELECT /**/ 1, /*/ 2 */ 3", b"SELECT /**/ " + INT_ + b", /*/ 2 */ " + INT_),
    # what another server version lexes otherwise stays verbatim
    (b"SELECT 0x1F, 1_000, 1abc, 1e, 5$", None),
    (b"SELECT 1..2, ..1.5, ...5", b"SELECT 1.." + INT_ + b", .." + NUM_ + b", .." + NUM_),
    (b"SELECT 1.5.2", b"SELECT 1.5" + NUM_),  # (the server too reads 1.5 and .2)
    (
        b"SELECT 1::text, '2'::int, 3::regclass",
        b"SELECT " + INT_ + b"::text, " + STR_ + b"::int, " + INT_ + b"::regclass",
    ),
    (b"SELECT a-1, a--1\n", b"SELECT a-" + INT_ + b", a--1\n"),
    (b"SELECT \xc3\xa91, 1\xc3\xa9", None),
    (b"SELECT '\xc3\xa9', 2", b"SELECT " + STR_ + b", " + INT_),
    (b"SELECT 'a'\n'b'", b"SELECT " + STR_ + b"\n" + STR_),
    (b"SELECT e1, E 'x'", b"SELECT e1, E " + STR_),
    (b"SELECT u&1, U & 'x'", b"SELECT u&" + INT_ + b", U & " + STR_),
    (b"SELECT 'unterminated", None),
    (b'SELECT "x', None),
    (b"SELECT 1 /* x", None),
    (b"SELECT $$x", None),
    (b"SELECT E'x\\'", None),
    (b"SELECT 1 /* a /* b */", None),
    (b"END", None),
    (b"", None),
    # savepoint commands: the name is the placeholder, when it is surely an identifier
    (b'SAVEPOINT "s140234_x1"', b"SAVEPOINT " + NAME_),
    (b'RELEASE SAVEPOINT "s1"', b"RELEASE SAVEPOINT " + NAME_),
    (b'release "a""b"', b"release " + NAME_),
    (b"ROLLBACK TO SAVEPOINT sa_savepoint_1", b"ROLLBACK TO SAVEPOINT " + NAME_),
    (b"rollback work to a1", b"rollback work to " + NAME_),
    (b" \tROLLBACK\r\nTRANSACTION TO \xc3\xa91 \n", b" \tROLLBACK\r\nTRANSACTION TO " + NAME_ + b" \n"),
    (b"RELEASE SAVEPOINTa1", b"RELEASE " + NAME_),  # (one identifier to the server too)
    (b"SAVEPOINT foo", None),  # (no digit: it could be a keyword)
    (b'SAVEPOINT ""', None),  # (a zero-length identifier: an error)
    (b'SAVEPOINT "x', None),
    (b'SAVEPOINT"a"', None),
    (b'SAVEPOINT "a";', None),
    (b'SAVEPOINT "a" -- c', None),
    (b'SAVEPOINT /* c */ "a"', None),
    (b'SAVEPOINT "a"\v', None),
    (b"ROLLBACK TO", None),
    (b"ROLLBACK WORKTO a1", None),
    (b"ROLLBACK TO SAVEPOINT", None),
    (b'SAVEPOINT "a"; SELECT 1', b'SAVEPOINT "a"; SELECT ' + INT_),  # (lexed as any text)
    (b"SAVEPOINT a1 a2", None),
    # cursor commands (psycopg's, named by Django): the name is a placeholder, the rest as any text
    (
        b'DECLARE "_django_curs_140234_sync_1" NO SCROLL CURSOR WITH HOLD FOR SELECT id FROM t WHERE a = 5',
        b"DECLARE " + NAME_ + b" NO SCROLL CURSOR WITH HOLD FOR SELECT id FROM t WHERE a = " + INT_,
    ),
    (b"declare\tc1 cursor for select 'x'", b"declare\t" + NAME_ + b" cursor for select " + STR_),
    (b'DECLARE "c" CURSOR FOR SELECT id FROM t', b"DECLARE " + NAME_ + b" CURSOR FOR SELECT id FROM t"),
    (b"DECLARE c CURSOR FOR SELECT 1", b"DECLARE c CURSOR FOR SELECT " + INT_),  # (no digit: as any text)
    (b'DECLARE "c"CURSOR FOR SELECT 1', b'DECLARE "c"CURSOR FOR SELECT ' + INT_),
    (b"DECLARE \"c\" CURSOR FOR SELECT 'a\\'", None),
    (b'FETCH FORWARD 2000 FROM "_django_curs_1_sync_2"', b"FETCH FORWARD 2000 FROM " + NAME_),
    (b"fetch all in c1 ", b"fetch all in " + NAME_ + b" "),
    (b'MOVE ABSOLUTE -5 FROM "c"', b"MOVE ABSOLUTE -5 FROM " + NAME_),
    (b'FETCH FROM "c"', b"FETCH FROM " + NAME_),
    (b'FETCH fromage FROM "c"', b"FETCH fromage FROM " + NAME_),
    (b'CLOSE "_django_curs_1_sync_2"', b"CLOSE " + NAME_),
    (b"close\r\nc1", b"close\r\n" + NAME_),
    (b"FETCH 5 FROM c", b"FETCH " + INT_ + b" FROM c"),  # (no digit in the name: as any text)
    (b'FETCH "c"', None),
    (b'FETCH FORWARD 5 FROM "c"; SELECT 1', b"FETCH FORWARD " + INT_ + b' FROM "c"; SELECT ' + INT_),
    (b'CLOSE "c" -- x', None),
    (b"CLOSE ALL", None),
    (b'FETCH FROM "a" "b"', None),
]


@pytest.mark.parametrize(("text", "expected"), LEXED)
def test_the_lexer_on_bytes(text: bytes, expected: bytes | None) -> None:
    assert key(text) == expected


@pytest.mark.skipif(not AVAILABLE, reason=f"{UNAVAILABLE}")
@pytest.mark.parametrize(("text", "expected"), LEXED)
def test_the_c_lexer_on_bytes(text: bytes, expected: bytes | None) -> None:
    assert FastRelay.shape_key(text) == expected


def test_literal_spans_are_what_the_key_replaced() -> None:
    text = b"UPDATE t SET v = 'it''s' WHERE id = -12 AND f > 1.5"
    shape = lex(text)
    assert shape is not None
    assert [text[x.start : x.end] for x in shape.literals] == [b"'it''s'", b"12", b"1.5"]
    assert [x.kind for x in shape.literals] == [STR, INT, NUM]


# Fragments that meet at every lexing decision: quotes, escapes, prefixes, dollar quotes, comments, numbers
# next to identifiers, dots and signs.
_FRAGMENTS = st.sampled_from(
    [
        "SELECT ", " ", "1", "42", "2147483648", "'", "''", "'x'", "\\", "E", "e'", "U&", "&", '"', '""', "$",
        "$1", "$$", "$a$", "--", "\n", "\r", "/*", "*/", "-", ".", "..", "e5", "E+", "0x", "_", "\u00e9",
        "x1", ",", "(", ")", "::", ";", "N'", "b'", "*", "/",
    ]
)  # fmt: skip
# Savepoint commands: their words, names of each kind (and almost names), and the whitespace between.
_SAVEPOINT_FRAGMENTS = st.sampled_from(
    [
        "SAVEPOINT", "savepoint", "RELEASE", "Release", "ROLLBACK", "rollback", "WORK", "transaction", "TO",
        "to", " ", "\t", "\r\n", "\v", '"s1_x2"', '"a""b"', '""', '"', "a1", "sa_savepoint_1", "x",
        "1", "\u00e91", "$", ";", "--", "/*",
    ]
)  # fmt: skip


@pytest.mark.skipif(not AVAILABLE, reason=f"{UNAVAILABLE}")
@settings(max_examples=3000, deadline=None)
@given(st.lists(_FRAGMENTS, max_size=24))
@example(["SELECT ", "x", "'ab'", " -- c\n", "'ab'", ", 1"])  # (continued prefixed strings: no key)
@example(["SELECT ", "U&", "'ab'", " \t\r ", "'cd'", ", 1"])
@example(["SELECT ", "x", "'ab'", " /* c */\n", "'cd'", ", 1"])  # (not continued: a key)
def test_the_c_lexer_matches_pythons(fragments: list[str]) -> None:
    text = "".join(fragments).encode()
    assert FastRelay.shape_key(text) == key(text)


@pytest.mark.skipif(not AVAILABLE, reason=f"{UNAVAILABLE}")
@settings(max_examples=3000, deadline=None)
@given(st.lists(_SAVEPOINT_FRAGMENTS, max_size=8))
@example(["ROLLBACK", " ", "WORK", " ", "TO", " ", "SAVEPOINT", " ", '"a""b"', "\r\n"])
@example(["RELEASE", " ", "SAVEPOINT", " ", "a1"])
def test_the_c_lexer_matches_pythons_on_savepoint_commands(fragments: list[str]) -> None:
    text = "".join(fragments).encode()
    assert FastRelay.shape_key(text) == key(text)


def _identifier(spelled: str) -> str:
    """The identifier the server reads: unquoted and folded to lower case, or unquoted, then truncated to 63
    bytes (NAMEDATALEN - 1) at a character's end, as its scanner does."""
    name = spelled[1:-1].replace('""', '"') if spelled.startswith('"') else spelled.lower()
    return name.encode()[:63].decode(errors="ignore")


@settings(max_examples=1000, deadline=None)
@given(st.lists(_SAVEPOINT_FRAGMENTS, max_size=8))
@example(["SAVEPOINT", " ", '"a""b"'])
@example(["ROLLBACK", " ", "TO", " ", "SAVEPOINT", " ", "a1", " "])
@example(
    [
        "SAVEPOINT",
        " ",
        "SAVEPOINT",
        "SAVEPOINT",
        "transaction",
        "transaction",
        "transaction",
        "sa_savepoint_1",
    ]
)
def test_a_savepoint_name_is_an_identifier_to_the_server(fragments: list[str]) -> None:
    """PostgreSQL's parser (pglast's) as the oracle: a text lexed as a savepoint command parses to that one
    command, named by the span the key replaced."""
    text = "".join(fragments)
    shape = lex(text.encode())
    if shape is None or not shape.literals or shape.literals[0].kind != NAME:
        return
    (name,) = shape.literals
    stmts = json.loads(parse_sql_json(text))["stmts"]
    assert literals_irrelevant(text.encode(), stmts, shape), text
    spelled = text.encode()[name.start : name.end].decode()
    expected = _identifier(spelled)
    assert stmts[0]["stmt"]["TransactionStmt"]["savepoint_name"] == expected


# Cursor commands: their words, names of each kind (and almost names), a query and the whitespace between.
_CURSOR_FRAGMENTS = st.sampled_from(
    [
        "DECLARE", "declare", "FETCH", "fetch", "MOVE", "CLOSE", "close", "FORWARD", "ALL", "5", "-5", "FROM",
        "from", "IN", "in", "fromage", "NO SCROLL CURSOR", "WITH HOLD", "FOR", "SELECT 1", "'x'", " ", "\t",
        "\r\n", "\v", '"_django_curs_1_sync_2"', '"a""b"', '""', '"', "c1", "c", "x_1", "\u00e91", "$",
        ";", "--", "/*",
    ]
)  # fmt: skip


@pytest.mark.skipif(not AVAILABLE, reason=f"{UNAVAILABLE}")
@settings(max_examples=3000, deadline=None)
@given(st.lists(_CURSOR_FRAGMENTS, max_size=10))
@example(["FETCH", " ", "fromage", " ", "FROM", " ", "in", " ", "c1", " "])
@example(["FETCH", " ", "FROM", " ", "c1", " ", "FROM", " ", '"a""b"'])
@example(["DECLARE", " ", "c1", " ", "NO SCROLL CURSOR", " ", "FOR", " ", "SELECT 1", " ", "'x'"])
def test_the_c_lexer_matches_pythons_on_cursor_commands(fragments: list[str]) -> None:
    text = "".join(fragments).encode()
    assert FastRelay.shape_key(text) == key(text)


_CURSOR_COMMANDS = ("DeclareCursorStmt", "FetchStmt", "ClosePortalStmt")


@settings(max_examples=1000, deadline=None)
@given(st.lists(_CURSOR_FRAGMENTS, max_size=10))
@example(["DECLARE", " ", '"a""b"', " ", "NO SCROLL CURSOR", " ", "FOR", " ", "SELECT 1"])
@example(["MOVE", " ", "-5", " ", "IN", " ", "c1"])
@example(["close", "\t", '"_django_curs_1_sync_2"'])
def test_a_cursor_name_is_an_identifier_to_the_server(fragments: list[str]) -> None:
    """pglast's parser as the oracle: a text lexed with a cursor's name whose proof holds parses to one cursor
    command of that name, by the span the key replaced."""
    text = "".join(fragments)
    shape = lex(text.encode())
    if shape is None or not shape.literals or shape.literals[0].kind != NAME:
        return
    name = shape.literals[0]
    try:
        stmts = json.loads(parse_sql_json(text))["stmts"]
    except ParseError:
        return  # (the server refuses the text whatever the name)
    if not literals_irrelevant(text.encode(), stmts, shape):
        assert len(stmts) != 1 or next(iter(stmts[0]["stmt"])) not in _CURSOR_COMMANDS, text
        return
    ((_, body),) = stmts[0]["stmt"].items()
    spelled = text.encode()[name.start : name.end].decode()
    assert body["portalname"] == _identifier(spelled)


@pytest.mark.skipif(not AVAILABLE, reason=f"{UNAVAILABLE}")
@settings(max_examples=1000, deadline=None)
@given(st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=64))
def test_the_c_lexer_matches_pythons_on_any_text(text: str) -> None:
    assert FastRelay.shape_key(text.encode()) == key(text.encode())


_TOKEN_NAMES = {INT: "ICONST", NUM: "FCONST", STR: "SCONST"}
_CONSTANTS = frozenset({"SCONST", "BCONST", "XCONST", "USCONST"})
# Whole tokens beside the fragments: more of the texts then lex to the end.
_WHOLE = st.sampled_from(["'ab'", "E'\\''", "$$x$$", '"q"', "1.5", "7", " -- c\n", "/* c */", "x", "$2"])


@settings(max_examples=3000, deadline=None)
@given(st.lists(_FRAGMENTS | _WHOLE, max_size=16))
@example(["x", "'ab'", " -- c\n", "'ab'", "'ab'"])  # (X'…' continued on a later line: one XCONST)
@example(["e", "'ab'", "\n", "'ab'"])
def test_each_literal_is_a_token_of_the_servers_class(fragments: list[str]) -> None:
    """PostgreSQL's own lexer (pglast's, of 18) as the oracle: every span the key replaces is one literal
    token of that class (a plain string may also be a part of a constant continued on the next line)."""
    text = "SELECT " + "".join(fragments)
    shape = lex(text.encode())
    if shape is None or not shape.literals:
        return
    try:
        tokens = scan(text)
    except ParseError:
        return  # (the server refuses the text whatever its literals)
    offsets = [len(text[:i].encode()) for i in range(len(text) + 1)]  # scan counts characters
    spans = {(offsets[t.start], offsets[t.end + 1]): t.name for t in tokens}
    assert shape is not None
    for literal in shape.literals:
        name = spans.get((literal.start, literal.end))
        if name is None and literal.kind == STR:  # (no A_Const starts there: the proof refuses it)
            inside = [n for (a, b), n in spans.items() if a <= literal.start and literal.end <= b]
            assert len(inside) == 1 and inside[0] in _CONSTANTS, (text, literal)
        else:
            assert name == _TOKEN_NAMES[literal.kind], (text, literal, name)


@given(st.lists(_FRAGMENTS, max_size=24))
def test_a_key_is_the_text_with_its_literals_replaced(fragments: list[str]) -> None:
    text = "".join(fragments).encode()
    shape = lex(text)
    if shape is None:
        return
    rebuilt, at = bytearray(), 0
    for literal in shape.literals:
        rebuilt += text[at : literal.start] + bytes([literal.kind])
        at = literal.end
    assert bytes(rebuilt + text[at:]) == shape.key


# ---- the proof: which shapes may stand for all their texts


def shaped(sql: str) -> bytes | None:
    """The shape ``sql`` is decided by once its shape recurs (a proof that needs a parse of its own waits
    for a second text of the shape: ``Analyzer._first_sight``)."""
    analyzer = Analyzer()
    verdict = analyzer.analyze(sql, CATALOG, True)
    return analyzer.shape(sql, CATALOG, verdict) or analyzer.shape(sql, CATALOG, verdict)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT abalance FROM pgbench_accounts WHERE aid = 81234",
        "UPDATE pgbench_accounts SET abalance = abalance + -4076 WHERE aid = 81234",
        "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (5, 1, 6160, -4076, now())",
        "SELECT id, name FROM projects WHERE name = 'cow.sessions' AND budget > 1.5 LIMIT 21",
        "UPDATE issues SET title = 'x', points = 3 WHERE id = 7",
        "DELETE FROM comments WHERE issue_id IN (1, 2, 3)",
        "INSERT INTO comments (issue_id, body) VALUES (1, 'a@b'), (2, 'c@d') RETURNING id",
        "SELECT id FROM issues WHERE created > '2024-01-01'::date AND lower(title) LIKE 'a%' ORDER BY id",
        "SELECT id FROM issues WHERE title = 'x' ORDER BY points + 1",
        "SELECT CASE WHEN points > 3 THEN 'big' ELSE 'small' END FROM issues WHERE id = - 5",
        "SELECT id FROM issues WHERE project_id = (SELECT id FROM projects WHERE name = 'p')",
        "SELECT name FROM projects WHERE id = 5",  # key_reads looks (no $n: not a key read)
        # lateral looks, leaves it
        "SELECT i.title FROM issues i JOIN comments c ON c.issue_id = i.id WHERE c.body = 'x'",
        'SAVEPOINT "s140234_x1"',
        'RELEASE SAVEPOINT "s140234_x1"',
        'ROLLBACK TO SAVEPOINT "s140234_x1"',
        "rollback transaction to sa_savepoint_2",
        'DECLARE "_django_curs_1_sync_1" NO SCROLL CURSOR WITH HOLD FOR SELECT id FROM issues WHERE id = 5',
        'DECLARE "_django_curs_140234_sync_1" NO SCROLL CURSOR WITHOUT HOLD FOR SELECT id FROM issues',
        'FETCH FORWARD 2000 FROM "_django_curs_140234_sync_1"',
        'MOVE ABSOLUTE 5 FROM "_django_curs_140234_sync_1"',
        'CLOSE "_django_curs_140234_sync_1"',
    ],
)
def test_shapes_whose_literals_are_data(sql: str) -> None:
    shape = lex(sql.encode())
    assert shape is not None
    assert shaped(sql) == shape.key


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 'cow.sessions'::regclass",  # a name, resolved on the path
        "SELECT 16384::regclass",
        "SELECT 16384::oid",
        "SELECT regclass 'issues'",
        "SELECT 'issues'::my_domain",  # (a domain may be over regclass)
        "SELECT set_config('cow.session_id', 'x', false)",
        "SELECT nextval('cow.x')",
        "SELECT to_regclass('issues')",
        "SELECT has_table_privilege('issues', 'select')",
        "SELECT current_setting('cow.session_id')",
        "SELECT relname FROM pg_class WHERE oid = 5",
        "SELECT table_name FROM information_schema.tables WHERE table_name = 'x'",
        "SELECT id FROM issues ORDER BY 1",  # an ordinal, not a value
        "SELECT project_id, count(*) FROM issues GROUP BY 1",
        "SELECT DISTINCT ON (1) id FROM issues",
        "SELECT count(1) FROM issues",  # a rule's detection fired (counts)
        "INSERT INTO issues (id) VALUES (1) ON CONFLICT (id) DO UPDATE SET points = 2",
        "SET statement_timeout = 5",
        "SET search_path = 'public'",
        "DO $$BEGIN PERFORM 1; END$$",
        "PREPARE TRANSACTION 'x'",
        "COPY issues FROM '/tmp/x'",
        "SELECT 'a'\n'b'",  # one constant of two tokens
        "SELECT 1 INTO t2",
        "EXPLAIN SELECT 1",
        "SELECT id FROM issues WHERE id = 1 FOR UPDATE",  # row locks: rewritten
        "SELECT pg_terminate_backend(5)",
        "SELECT name FROM projects WHERE id = $1 AND budget > 5",  # a key read: rewritten
        "SELECT dblink('x', 'y')",
        "SELECT * FROM generate_series(1, 5)",
        "SELECT id FROM issues WHERE title = 'x' COLLATE \"C\" AND 1 = 1",
        'DECLARE "c1" CURSOR FOR SELECT 5::regclass',  # (a DECLARE's query: the same proof)
        'DECLARE "c1" CURSOR FOR SELECT relname FROM pg_class WHERE oid = 5',
        'DECLARE "c1" CURSOR FOR SELECT id FROM issues ORDER BY 1',
        'DECLARE "c1" CURSOR FOR SELECT 1; DELETE FROM issues WHERE id = 2',
    ],
)
def test_shapes_whose_literals_may_matter(sql: str) -> None:
    if sql.endswith('COLLATE "C" AND 1 = 1'):
        assert shaped(sql) is not None  # (a collation is a name, but no literal's)
        return
    assert shaped(sql) is None


def test_a_text_without_literals_has_no_shape() -> None:
    assert shaped("SELECT id FROM issues") is None
    assert shaped("BEGIN") is None


# Statements with literals in many places, among them some the proof refuses; {i} an integer, {f} a
# number, {s} a string.
_TEMPLATES = [
    "SELECT id FROM issues WHERE id = {i}",
    "SELECT id FROM issues WHERE title = {s} AND points > {f}",
    "UPDATE issues SET points = points + {i} WHERE id = {i}",
    "INSERT INTO comments (issue_id, body) VALUES ({i}, {s})",
    "DELETE FROM comments WHERE id = -{i}",
    "SELECT {s}::regclass",
    "SELECT id FROM issues ORDER BY {i}",
    "SELECT set_config({s}, {s}, false)",
    "SELECT count({i}) FROM issues",
    "INSERT INTO issues (id) VALUES ({i}) ON CONFLICT (id) DO NOTHING",
    "SELECT relname FROM pg_class WHERE relname = {s}",
    "SELECT id FROM issues WHERE project_id = {i} FOR SHARE",
    "SELECT lower({s}), {f}::numeric, {s}::date FROM projects LIMIT {i}",
    "SET search_path = {s}",
    "SELECT name FROM projects WHERE id = {i}",
    "SELECT name FROM projects WHERE id = $1 AND budget > {f}",
    "SELECT i.title FROM issues i JOIN comments c ON c.issue_id = i.id WHERE i.id = {i} AND c.body = {s}",
    "SAVEPOINT {n}",
    "RELEASE {n}",
    "ROLLBACK WORK TO SAVEPOINT {n}",
    "DECLARE {n} NO SCROLL CURSOR WITH HOLD FOR SELECT id FROM issues WHERE title = {s} AND points > {f}",
    "DECLARE {n} CURSOR FOR SELECT {s}::regclass",
    "DECLARE {n} CURSOR FOR SELECT id FROM issues WHERE id = {i} FOR UPDATE",
    "FETCH FORWARD 2000 FROM {n}",
    "MOVE RELATIVE -1 IN {n}",
    "CLOSE {n}",
]
_STRINGS = st.sampled_from(["x", "", "cow.sessions", "public", "it's", "cow_changes.t", "search_path", "1"])
_LITERALS = st.fixed_dictionaries(
    {
        "i": st.integers(min_value=0, max_value=2**31 - 1).map(str),
        "f": st.sampled_from(["1.5", ".5", "1e5", "99999999999"]),
        "s": _STRINGS.map(lambda v: "'" + v.replace("'", "''") + "'"),
        "n": st.sampled_from(['"s140234_x1"', '"a""b"', "sa_savepoint_1", '"select"', '"\u00e9 1"', "x1$"]),
    }
)


@settings(max_examples=300, deadline=None)
@given(template=st.sampled_from(_TEMPLATES), first=_LITERALS, second=_LITERALS)
def test_texts_of_one_shape_get_the_shapes_verdict(template: str, first: dict, second: dict) -> None:
    """Where a shape is accepted, every text of it is analysed as the first one was (fresh analyzers: no
    cache between them)."""
    one, two = template.format(**first), template.format(**second)
    analyzed = Analyzer().analyze(one, CATALOG, True)
    shape = shaped(one)
    assert shape is None or shape == key(two.encode())
    if shape is not None:
        assert _shape_fields(Analyzer().analyze(two, CATALOG, True)) == _shape_fields(analyzed)


def _fields(verdict: Analysis) -> tuple[object, ...]:
    return (*_shape_fields(verdict), verdict.error_detail)


@settings(max_examples=300, deadline=None)
@given(template=st.sampled_from(_TEMPLATES), first=_LITERALS, second=_LITERALS, prepared=st.booleans())
def test_a_text_taken_by_its_shape_gets_the_cold_verdict(
    template: str, first: dict, second: dict, prepared: bool
) -> None:
    """An analyzer that proved a shape answers the next text of it without a parse, with the verdict a cold
    analyzer gives that text; the proof made on the analysis' own parse is the one a cold proof makes."""
    one, two = template.format(**first), template.format(**second)
    warm = Analyzer()
    analyzed = warm.analyze(one, CATALOG, True)
    shape = warm.shape(one, CATALOG, analyzed) or warm.shape(one, CATALOG, analyzed)
    assert shape == shaped(one)  # (a fresh analyzer parses again)
    before = warm.shape_hits
    assert _fields(warm.analyze(two, CATALOG, True, prepared=prepared)) == _fields(
        Analyzer().analyze(two, CATALOG, True, prepared=prepared)
    )
    if warm.shape_hits > before:  # (texts the fast path clears take it before the shape)
        assert shape is not None and (one != two or prepared) and key(two.encode()) == shape


def test_a_shape_whose_proof_needs_a_parse_is_proven_at_its_second_text() -> None:
    """A text the fast path answered (no parse) leaves its shape unproven the first time: most such shapes
    never come again, and the proof would cost the parse the fast path spared. The next text of the shape
    proves it; a text that was parsed proves its shape at once (the analysis' own parse)."""
    analyzer = Analyzer()
    fast = "SELECT title FROM issues WHERE title = '{}'"
    first = analyzer.analyze(fast.format("a"), CATALOG, True)
    assert analyzer.shape(fast.format("a"), CATALOG, first) is None
    second = analyzer.analyze(fast.format("b"), CATALOG, True)
    assert analyzer.shape(fast.format("b"), CATALOG, second) == key(fast.format("c").encode())
    assert analyzer.shape(fast.format("c"), CATALOG, second) == key(fast.format("c").encode())
    parsed = "INSERT INTO comments (issue_id, body) VALUES (1, '{}') RETURNING id"
    verdict = analyzer.analyze(parsed.format("a"), CATALOG, True)
    assert analyzer.shape(parsed.format("a"), CATALOG, verdict) is not None


def test_a_django_insert_of_a_known_shape_skips_the_parse() -> None:
    analyzer = Analyzer()
    sql = "INSERT INTO comments (issue_id, body) VALUES ({}, '{}') RETURNING id"
    first = analyzer.analyze(sql.format(1, "a"), CATALOG, True)
    assert analyzer.shape(sql.format(1, "a"), CATALOG, first) is not None
    assert analyzer.analyze(sql.format(2, "b"), CATALOG, True) == first
    assert analyzer.shape_hits == 1
    # Not outside a session; a named prepared statement's text too (a proven shape is never rewritten, and
    # only the key-read rule's rewrite differs there).
    analyzer.analyze(sql.format(3, "c"), CATALOG, False)
    assert analyzer.analyze(sql.format(4, "d"), CATALOG, True, prepared=True) == first
    assert analyzer.shape_hits == 2


def test_a_django_cursor_of_a_known_shape_skips_the_parse() -> None:
    """psycopg declares each server-side cursor anew, as an unnamed Parse the relay analyses both as a named
    statement's text and not; FETCH and CLOSE follow by name."""
    analyzer = Analyzer()
    declare = (
        'DECLARE "_django_curs_1_sync_{}" NO SCROLL CURSOR WITH HOLD FOR SELECT id FROM issues WHERE id > {}'
    )
    first = analyzer.analyze(declare.format(1, 5), CATALOG, True)
    assert first.kind == "utility" and first.rewritten is None
    assert analyzer.shape(declare.format(1, 5), CATALOG, first) == key(declare.format(2, 6).encode())
    for n in (2, 3):
        assert analyzer.analyze(declare.format(n, n), CATALOG, True) == first
        assert analyzer.analyze(declare.format(n, n), CATALOG, True, prepared=True) == first
    assert analyzer.shape_hits == 4
    for command in ('FETCH FORWARD 2000 FROM "_django_curs_140_sync_{}"', 'CLOSE "_django_curs_140_sync_{}"'):
        verdict = analyzer.analyze(command.format(1), CATALOG, True)
        assert verdict.kind == "utility"
        assert analyzer.shape(command.format(1), CATALOG, verdict) is None  # (the fast path's: a second text)
        assert analyzer.shape(command.format(2), CATALOG, verdict) == key(command.format(3).encode())
