"""Literal-normalised keys of statement texts ("shapes"), and the proof that a shape's literals cannot change
what the analysis decides.

Clients that bind parameters on their side (the simple protocol: pgbench ``-M simple``, psql, Django's
client-side binding, Rails) send texts that differ only in their constants, so a decision cached per exact
text is never reused. ``lex`` gives a text's *shape*: the text with each numeric literal and each plain
string literal replaced by one byte that names its token class (``INT``, ``NUM``, ``STR``: bytes no UTF-8
text contains, so a key is never ambiguous). The C relay computes the same key with the same lexer
(``shape_key`` in ``proxy/_fastrelay.c``) and looks up the decision Python made for the shape.

The lexer follows PostgreSQL's (``scan.l``) where a literal's boundaries are concerned, and keeps
verbatim whatever it is not sure of:

- a number followed by a dot (``1.5.2``); ``..`` is a token of its own, as the server's (``1..2`` is 1,
  .., 2);
- E'', U&'', B'', X'', N'' strings and dollar quotes, quoted identifiers, ``$n`` and comments (``--`` up to
  a newline or carriage return, ``/* */`` nested): a comment tag is never normalised away; a prefixed string
  continued on a later line (``X'ab'`` newline ``'cd'``: one constant of the prefix's class to the server)
  gives no key;
- a text with an unterminated quote or comment, or with a backslash in a plain string, gets no key at all
  (with ``standard_conforming_strings`` off the server would end that string elsewhere), nor does one with
  a dollar-quote delimiter longer than ``MAX_DOLLAR_TAG`` or a number run into an identifier character or
  ``$`` (``0x1F``, ``1_000``: one number to PostgreSQL 16, an error to 15, ``1abc`` to older ones).

A savepoint command as a whole text (``SAVEPOINT n``, ``RELEASE [SAVEPOINT] n``, ``ROLLBACK [WORK |
TRANSACTION] TO [SAVEPOINT] n``: Django names each savepoint anew) has one placeholder instead, ``NAME`` for
its name, when the name is surely an identifier (quoted and not empty, or unquoted with a digit, which no
keyword has) and the text has only spaces, tabs and line breaks besides (no comment, no semicolon); the proof
then asks that it parses to that one ``TransactionStmt`` (the relay reads only its kind).

Cursor commands get the same placeholder for the cursor's name (psycopg's server-side cursors, which Django
names anew: ``"_django_curs_140234_sync_1"``), with the same test of the name and of what surrounds it:
``DECLARE n`` at the start of a text (the rest lexed as any text: the query's literals are literals), and
``FETCH|MOVE … FROM|IN n`` and ``CLOSE n`` as whole texts whose other words stay verbatim (a count too).
The proof asks that the text parses to that one ``DeclareCursorStmt``, ``FetchStmt`` or ``ClosePortalStmt``
with a name, and, for a DECLARE, that its query's literals are data as in any SELECT.

The integer class is the server's: digits only and at most 2147483647 (a larger one is a NUM to the server),
so two texts with one key also parse to the same tree but for the values of their constants.

``literals_irrelevant`` is the other half: it maps each literal to its ``A_Const`` in the JSON parse tree
(by byte location; a unary minus moves the constant's location to the sign) and accepts the shape only when
every one sits where the analysis never reads a value (proxy/sql/analyze.py, policy.py, rewrites/): in
expressions of SELECT, INSERT, UPDATE and DELETE, through a small list of value functions and casts to
plain types, and not as an ordinal (ORDER BY 1, GROUP BY 1, DISTINCT ON). Casts to reg* types or oid,
functions that take names (``set_config``, ``nextval``, ``to_regclass`` …), any other statement type and
any catalog relation make the shape fail; the relay then caches the exact text only, as before.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from proxy.sql.jsontree import JsonNode, svals

INT = 0xFF  # an integer the server lexes as one (ICONST)
NUM = 0xFE  # any other numeric literal (FCONST)
STR = 0xFD  # a plain string literal 'x' (no backslash)
NAME = 0xFC  # the name of a savepoint or cursor command (SAVEPOINT n, DECLARE n, FETCH … FROM n): _NAMED
INT_MAX = 2147483647
# A longer dollar-quote delimiter gives no key: C searches for its end byte by byte, and a crafted text could
# make that search quadratic in the C relay's thread.
MAX_DOLLAR_TAG = 64

# One token at a position; the order of the alternatives decides (a comment before an operator, …).
# Possessive loops: an unterminated quote fails at once instead of backtracking over its content.
_TOKEN = re.compile(
    rb"""
      (?P<plain>[^-/'"$.0-9A-Za-z_\x80-\xff]++)
    | (?P<line>--[^\n\r]*+)
    | (?P<ident>[A-Za-z_\x80-\xff][A-Za-z0-9_$\x80-\xff]*+)
    | (?P<number>(?:[0-9]++(?:\.(?!\.)[0-9]*+)?|\.[0-9]++)(?:[eE][+-]?[0-9]++)?)
    | (?P<string>'(?:[^']++|'')*+')
    | (?P<quoted>"(?:[^"]++|"")*+")
    | (?P<param>\$[0-9]++)
    | (?P<dollar>\$(?:[A-Za-z_\x80-\xff][A-Za-z0-9_\x80-\xff]*+)?\$)
    | (?P<block>/\*)
    | (?P<other>\.\.|[-/.$])
    """,
    re.X,
)
# A run of what no literal can hide in (whitespace, operators, identifiers, a one-letter identifier that
# starts no prefixed string): matched in one step, so that the loop below sees only the interesting tokens.
_SKIP = re.compile(
    rb"""(?:
      [^-/'"$.0-9A-Za-z_\x80-\xff]++
    | [A-Za-z_\x80-\xff][A-Za-z0-9_$\x80-\xff]++
    | [A-Za-z_\x80-\xff](?![&'])
    | -(?!-) | /(?!\*) | \.(?![.0-9])
    )++""",
    re.X,
)
_PLAIN_STRING = re.compile(rb"'(?:[^']++|'')*+'")
_QUOTED = re.compile(rb"\"(?:[^\"]++|\"\")*+\"")
_ESCAPED_STRING = re.compile(rb"'(?:[^'\\]++|\\.|'')*+'", re.S)  # E'…': a backslash escapes any byte
# A quote on a later line across whitespace and -- comments only: the server continues the string before it
# there ('…'\n'…' is one constant, in the class of the first part's prefix).
_CONTINUED = re.compile(rb"(?:[ \t\f\v]|--[^\n\r]*+)*+[\n\r](?:[ \t\n\r\f\v]|--[^\n\r]*+)*+'")
# A savepoint command as a whole text (Django names each savepoint anew: "s140234_x1"): its name (_NAME) is
# the one thing that varies, and what the relay decides for it never reads the name. Only the server's
# whitespace common to all versions (no \v, no comment: a comment may carry tags), no semicolon, and a name
# that is surely an identifier to the server: a quoted one (not empty), or an unquoted one with a digit (no
# keyword has one, so it is never a reserved word). Anything else is lexed as any text (no literal: no key).
_NAME = rb"""(?P<name>"(?:[^"]++|"")++"|[A-Za-z_\x80-\xff][A-Za-z0-9_$\x80-\xff]*+)"""
_SAVEPOINT = re.compile(
    rb"""[ \t\n\r]*+
    (?:savepoint
      | release(?:[ \t\n\r]++savepoint(?=[ \t\n\r]))?
      | rollback(?:[ \t\n\r]++(?:work|transaction)(?=[ \t\n\r]))?
        [ \t\n\r]++to(?:[ \t\n\r]++savepoint(?=[ \t\n\r]))?
    )[ \t\n\r]++"""
    + _NAME
    + rb"[ \t\n\r]*+",
    re.X | re.I,
)
# Cursor commands with a name (psycopg's: DECLARE "n" NO SCROLL CURSOR …, FETCH FORWARD 2000 FROM "n",
# MOVE ABSOLUTE 5 FROM "n", CLOSE "n"), by the same rules. FETCH and MOVE: the words between the command and
# FROM|IN are directions and counts, verbatim. DECLARE: only its start; the query after the name is lexed as
# any text.
_CURSOR = re.compile(
    rb"""[ \t\n\r]*+
    (?:(?:fetch|move)(?:[ \t\n\r]++[A-Za-z0-9+-]++)*?[ \t\n\r]++(?:from|in) | close)
    [ \t\n\r]++"""
    + _NAME
    + rb"[ \t\n\r]*+",
    re.X | re.I,
)
_DECLARE = re.compile(rb"[ \t\n\r]*+declare[ \t\n\r]++" + _NAME + rb"(?=[ \t\n\r])", re.X | re.I)
_IDENT = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_$") | frozenset(
    range(0x80, 0x100)
)
_DIGITS = frozenset(b"0123456789")
_DOT = ord(".")
_MINUS = ord("-")


@dataclass(frozen=True, slots=True)
class Literal:
    start: int  # byte offsets in the text
    end: int
    kind: int  # INT, NUM or STR


@dataclass(frozen=True, slots=True)
class Shape:
    key: bytes
    literals: tuple[Literal, ...]


# A function from a text to its key (None: no literal): ``key``, or the C relay's ``shape_key`` (the same
# lexer, compared by the tests, at about a hundredth of the cost).
KeyFunction = Callable[[bytes], bytes | None]


class _Unfollowed(Exception):
    """A text the lexer does not follow to its end (no key)."""


def lex(text: bytes) -> Shape | None:
    """The shape of a statement text (UTF-8, no NUL), or None when the lexer does not follow it."""
    named = _named(_SAVEPOINT, text) or _named(_CURSOR, text)
    if named is not None:
        return named
    key = bytearray()
    literals: list[Literal] = []
    pos = 0
    declare = _DECLARE.match(text)
    if declare is not None and _surely_a_name(text, *declare.span("name")):
        pos = declare.end("name")
        key += text[: declare.start("name")] + bytes((NAME,))
        literals.append(Literal(declare.start("name"), pos, NAME))
    try:
        for start, end, kind in _tokens(text, pos):
            if kind is None:
                key += text[start:end]
            else:
                key.append(kind)
                literals.append(Literal(start, end, kind))
    except _Unfollowed:
        return None
    return Shape(bytes(key), tuple(literals))


def _named(command: re.Pattern[bytes], text: bytes) -> Shape | None:
    """The shape of a savepoint or cursor command as a whole text (``_SAVEPOINT``, ``_CURSOR``) whose name
    is surely an identifier, else None."""
    match = command.fullmatch(text)
    if match is None or not _surely_a_name(text, *match.span("name")):
        return None
    start, end = match.span("name")
    return Shape(text[:start] + bytes((NAME,)) + text[end:], (Literal(start, end, NAME),))


def _surely_a_name(text: bytes, start: int, end: int) -> bool:
    """A quoted identifier (not empty: the pattern), or an unquoted one with a digit: no keyword has one."""
    return text[start] == ord('"') or any(b in _DIGITS for b in text[start:end])


def key(text: bytes) -> bytes | None:
    """The shape's key alone, None also for a text without literals (as the C relay's ``shape_key``)."""
    shape = lex(text)
    return shape.key if shape is not None and shape.literals else None


# A constant of each literal class, as the server lexes it (ICONST, FCONST, SCONST), and a savepoint's name.
_EXAMPLES = {INT: b"0", NUM: b"0.0", STR: b"''", NAME: b'"s"'}


def example(key: bytes) -> str:
    """A text of the shape ``key``: each literal replaced by a constant of its class. It parses to the tree
    every text of the shape parses to but for its constants' values, so it has their fingerprint (pglast's,
    which ignores constants) and names their tables: the read records of a shape name it (proxy/reads.py)."""
    return b"".join(_EXAMPLES.get(byte, bytes((byte,))) for byte in key).decode()


def _tokens(text: bytes, pos: int = 0) -> Iterator[tuple[int, int, int | None]]:
    """(start, end, literal class or None for verbatim bytes), covering the text from ``pos``."""
    n = len(text)
    while pos < n:
        skip = _SKIP.match(text, pos)
        if skip is not None:
            yield pos, skip.end(), None
            pos = skip.end()
            if pos == n:
                break
        match = _TOKEN.match(text, pos)
        if match is None:
            raise _Unfollowed  # an unterminated string or quoted identifier
        group, end = match.lastgroup, match.end()
        kind: int | None = None
        if group == "ident" and end - pos == 1:
            end = _prefixed(text, pos, end)
        elif group == "number":
            kind = _number(text, pos, end)
        elif group == "string":
            if b"\\" in text[pos:end]:
                raise _Unfollowed
            kind = STR
        elif group == "dollar":
            if end - pos > MAX_DOLLAR_TAG:
                raise _Unfollowed
            close = text.find(text[pos:end], end)
            if close < 0:
                raise _Unfollowed
            end = close + (end - pos)
        elif group == "block":
            end = _comment_end(text, pos)
        yield pos, end, kind
        pos = end


def _prefixed(text: bytes, pos: int, end: int) -> int:
    """The end of E'…', B'…', X'…', N'…', U&'…' or U&"…" when the one-letter identifier at ``pos`` starts one
    (kept verbatim), else ``end``."""
    letter = text[pos : pos + 1].lower()
    rest = text[end : end + 2]
    if letter == b"e" and rest[:1] == b"'":
        match = _ESCAPED_STRING.match(text, end)
    elif letter in (b"b", b"x", b"n") and rest[:1] == b"'":
        match = _PLAIN_STRING.match(text, end)
        if match is not None and b"\\" in match.group():
            raise _Unfollowed  # (N'…' is a plain string to the server: the same rule)
    elif letter == b"u" and rest in (b"&'", b'&"'):
        match = (_PLAIN_STRING if rest == b"&'" else _QUOTED).match(text, end + 1)
    else:
        return end
    if match is None or _CONTINUED.match(text, match.end()):
        raise _Unfollowed  # (unterminated, or continued on a later line: a constant of the prefix's class)
    return match.end()


def _number(text: bytes, pos: int, end: int) -> int | None:
    """The class of the number at [pos, end), or None to keep it verbatim (a dot after it)."""
    if end < len(text) and text[end] in _IDENT:
        raise _Unfollowed  # (0x1F, 1_000: a number to a newer server, an error to an older one)
    if end < len(text) and text[end] == _DOT:
        return None
    token = text[pos:end]
    if not token.isdigit():
        return NUM
    digits = token.lstrip(b"0")
    return INT if len(digits) <= 10 and int(digits or b"0") <= INT_MAX else NUM


def _comment_end(text: bytes, pos: int) -> int:
    """The end of the (nested) block comment opened at ``pos``."""
    depth, i, n = 0, pos + 2, len(text)
    while i < n - 1:
        pair = text[i : i + 2]
        if pair == b"/*":
            depth += 1
            i += 2
        elif pair == b"*/":
            if depth == 0:
                return i + 2
            depth -= 1
            i += 2
        else:
            i += 1
    raise _Unfollowed


# ---- the proof on the parse tree --------------------------------------------------------------------------

# Statements whose expressions' literal values no part of the analysis reads (their relations and columns
# it does read: those are identifiers, verbatim in the key).
_STATEMENTS = frozenset({"SelectStmt", "InsertStmt", "UpdateStmt", "DeleteStmt"})
# Statements that may stand beside them (BEGIN …; COMMIT): their constants come from keywords, and a
# literal of theirs (PREPARE TRANSACTION 'x') is no A_Const, so it fails the proof.
_ALLOWED = _STATEMENTS | {"TransactionStmt"}
# Nodes through which a literal's value stays a value: operators, boolean logic, row and array
# constructors, CASE, COALESCE, subqueries, the targets of SELECT and UPDATE, VALUES lists.
_TRANSPARENT = frozenset(
    {
        *_STATEMENTS, "ResTarget", "A_Expr", "BoolExpr", "NullTest", "BooleanTest", "SubLink", "CaseExpr",
        "CaseWhen", "CoalesceExpr", "MinMaxExpr", "A_ArrayExpr", "RowExpr", "List", "A_Indirection",
        "A_Indices", "JoinExpr", "RangeSubselect", "CommonTableExpr", "MultiAssignRef", "SortBy",
        "CollateClause",
    }
)  # fmt: skip
# Functions of values only (in pg_catalog): none takes a name or runs SQL, so a constant argument is data.
_VALUE_FUNCTIONS = frozenset(
    {
        "lower", "upper", "length", "char_length", "octet_length", "abs", "round", "trunc", "floor", "ceil",
        "ceiling", "mod", "power", "sqrt", "concat", "concat_ws", "substring", "substr", "replace", "btrim",
        "ltrim", "rtrim", "lpad", "rpad", "left", "right", "strpos", "position", "md5", "date_trunc",
        "date_part", "extract", "to_char", "to_date", "to_timestamp", "to_number", "make_date",
        "make_interval", "age", "now", "jsonb_build_object", "json_build_object", "jsonb_build_array",
        "json_build_array", "array_length", "cardinality", "count", "sum", "avg", "min", "max",
        "string_agg", "array_agg", "timezone",
    }
)  # fmt: skip
# Casts of a constant to these types read no name (unlike regclass, regtype, oid, …).
_PLAIN_TYPES = frozenset(
    {
        "bool", "boolean", "int2", "int4", "int8", "smallint", "integer", "int", "bigint", "numeric",
        "decimal", "float4", "float8", "real", "text", "varchar", "bpchar", "char", "date", "time", "timetz",
        "timestamp", "timestamptz", "interval", "json", "jsonb", "uuid", "bytea", "inet", "cidr",
    }
)  # fmt: skip
# Fields whose directly held constant is an ordinal (a position in the SELECT list), not a value.
_ORDINAL_FIELDS = frozenset({"groupClause", "distinctClause"})
_CATALOG_SCHEMAS = frozenset({"pg_catalog", "information_schema"})


class _Refused(Exception):
    """The statement is not one whose literals the proof can judge."""


def literals_irrelevant(text: bytes, stmts: list[Any], shape: Shape) -> bool:
    """Whether no literal of ``shape`` (of ``text``, whose JSON parse tree has the statements ``stmts``)
    can change what the analysis decides: each one is an ``A_Const`` the analysis never reads the value of,
    and nothing else in the statement calls for a closer look (module docstring)."""
    literals = shape.literals
    if literals and literals[0].kind == NAME:  # (a savepoint's or cursor's name: then the first one)
        body = _named_command(stmts, literals[0])
        if body is None:
            return False
        query = body.get("query")  # DECLARE's: its literals are the shape's others
        stmts, literals = ([{"stmt": query}] if isinstance(query, dict) else []), literals[1:]
    consts: dict[int, bool] = {}  # A_Const location -> its value is data only
    try:
        for raw in stmts:
            _walk(raw.get("stmt"), True, consts)
    except _Refused:
        return False
    return all(_const_of(text, literal, consts) for literal in literals)


# The TransactionStmt kinds of a savepoint command (pglast's JSON names them).
_SAVEPOINT_KINDS = frozenset({"TRANS_STMT_SAVEPOINT", "TRANS_STMT_RELEASE", "TRANS_STMT_ROLLBACK_TO"})
# The cursor commands whose name the lexer replaces, by the field that holds the name.
_CURSOR_COMMANDS = frozenset({"DeclareCursorStmt", "FetchStmt", "ClosePortalStmt"})


def _named_command(stmts: list[Any], name: Literal) -> JsonNode | None:
    """The body of the one statement a text lexed as a savepoint or cursor command parses to, when it is
    one, named (where the server gives a location, at the lexer's name), else None. The analysis only passes
    the name on: the relay reads a savepoint command's kind ("transaction"), a FETCH, MOVE or CLOSE is a
    "utility", and a DECLARE is its query's reads (docs/proxy.md, "Savepoint commands", "Cursor commands")."""
    if len(stmts) != 1 or not isinstance(stmts[0], dict):
        return None
    node = stmts[0].get("stmt")
    if not isinstance(node, dict) or len(node) != 1:
        return None
    ((kind, body),) = node.items()
    if not isinstance(body, dict):
        return None
    if kind == "TransactionStmt":
        named = body.get("kind") in _SAVEPOINT_KINDS and bool(body.get("savepoint_name"))
    else:
        named = kind in _CURSOR_COMMANDS and bool(body.get("portalname"))
    return body if named and body.get("location", name.start) == name.start else None


def const_location(text: bytes, start: int, consts: dict[int, bool]) -> int | None:
    """The A_Const location (a key of ``consts``) of the literal at ``start``: its own or, negated by a unary
    minus, the sign's before it (only minus signs and whitespace between); None when it is no A_Const."""
    if start in consts:
        return start
    for location in range(start - 1, -1, -1):
        if text[location] not in b"- \t\n\r\f\v":
            return None
        if text[location] == _MINUS and location in consts:
            return location
    return None


def _const_of(text: bytes, literal: Literal, consts: dict[int, bool]) -> bool:
    """Whether the literal is an A_Const whose value is data only (``const_location``)."""
    location = const_location(text, literal.start, consts)
    return location is not None and consts[location]


def _walk(node: object, safe: bool, consts: dict[int, bool], ordinal: bool = False) -> None:
    """Records every A_Const below ``node`` with whether its value is data only (``safe``: all the way up
    through transparent nodes; ``ordinal``: a constant directly in a list of positions)."""
    if isinstance(node, list):
        for item in node:
            _walk(item, safe, consts, ordinal)
        return
    if not isinstance(node, dict):
        return
    if len(node) != 1 or not next(iter(node))[:1].isupper():
        # the fields of a node of fixed type (a relation, a type name, an ON CONFLICT clause)
        _relation(node)
        for key, value in node.items():
            _walk(value, safe, consts, key in _ORDINAL_FIELDS)
        return
    ((name, body),) = node.items()
    if not isinstance(body, dict):
        return
    _relation(body)
    if name == "A_Const":
        location = body.get("location")
        if isinstance(location, int):
            consts[location] = consts.get(location, True) and safe and not ordinal
        return
    if name.endswith("Stmt") and (name not in _ALLOWED or "intoClause" in body):
        raise _Refused
    inner = safe and _passes_values(name, body)
    for key, value in body.items():
        if name == "SortBy" and key == "node":
            _walk(value, inner, consts, True)  # ORDER BY 1: a position
        else:
            _walk(value, inner, consts, key in _ORDINAL_FIELDS)


def _passes_values(name: str, body: JsonNode) -> bool:
    """Whether a constant below this node stays data to the analysis."""
    if name == "FuncCall":
        names = [n.lower() for n in svals(body.get("funcname"))]
        return _builtin(names) in _VALUE_FUNCTIONS
    if name == "TypeCast":
        type_name = body.get("typeName")
        names = [n.lower() for n in svals(type_name.get("names"))] if isinstance(type_name, dict) else []
        return _builtin(names) in _PLAIN_TYPES
    return name in _TRANSPARENT


def _builtin(names: list[str]) -> str | None:
    if len(names) == 1 or (len(names) == 2 and names[0] == "pg_catalog"):
        return names[-1]
    return None


def _relation(node: JsonNode) -> None:
    """Refuses a catalog relation: its reads may be rewritten for what literals name (introspection.py)."""
    if "relname" not in node:
        return
    schema, name = node.get("schemaname"), node.get("relname")
    if isinstance(schema, str) and schema.lower() in _CATALOG_SCHEMAS:
        raise _Refused
    if schema is None and isinstance(name, str) and name.lower().startswith("pg_"):
        raise _Refused
