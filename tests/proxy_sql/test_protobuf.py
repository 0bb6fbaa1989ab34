"""``proxy.sql.protobuf``: pglast's AST as libpg_query's protobuf. Each special case on literal bytes, then
the proof on a corpus (tests/proxy_sql/protobuf_corpus.json.gz: the SQL texts of tests/proxy_sql and
tests/proxy, and the texts a run of Django's full module list sent through a session, with the proxy's
rewrites of them; test_deparse.py adds the analyzer's rewrites of the tests' texts):
``encode(pglast.parse_sql(t))`` is ``parse_sql_protobuf(t)`` byte for byte (but for ``A_Const.location``,
which pglast does not keep; and for a non-ASCII text the locations, which pglast counts in characters and
libpg_query in bytes)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pglast
import pytest
from pglast import ast, enums
from pglast.parser import parse_sql_protobuf

from proxy.sql.protobuf import SCHEMA_MATCHES, EncodeError, encode, encode_node

from .protobuf_wire import rewrite

# by source: "tests" (the SQL texts of tests/proxy_sql and tests/proxy), "django" (the texts Django's full
# module list sent through a session, once each), "django_rewritten" (what the proxy sent for them instead)
_CORPUS_FILE = Path(__file__).parent / "protobuf_corpus.json.gz"
SOURCES: dict[str, list[str]] = json.loads(gzip.decompress(_CORPUS_FILE.read_bytes()))
CORPUS = [text for texts in SOURCES.values() for text in texts]
NO_LOCATION = b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"  # (-1 as a varint: ten bytes)


def reference(text: str) -> bytes:
    """libpg_query's own protobuf of ``text``, as pglast can know it."""
    data = rewrite(parse_sql_protobuf(text))
    return data if text.isascii() else rewrite(data, all_locations=True)


def test_the_corpus_is_large() -> None:
    assert len(CORPUS) >= 3000
    assert all(len(texts) >= 900 for texts in SOURCES.values())


@pytest.mark.parametrize("chunk", range(10))
def test_encode_equals_libpg_query(chunk: int) -> None:
    for text in CORPUS[chunk::10]:
        ours = encode(pglast.parse_sql(text))
        if not text.isascii():
            ours = rewrite(ours, all_locations=True)
        assert ours == reference(text), text


def test_value_nodes_in_node_oneof() -> None:
    # Node's oneof: Integer 263, Float 264, Boolean 265, String 266, BitString 267 (tag: number << 3 | 2)
    assert encode_node(ast.Integer(ival=5)) == b"\xba\x10\x02\x08\x05"
    assert encode_node(ast.Integer(ival=0)) == b"\xba\x10\x00"  # present, empty
    assert encode_node(ast.Integer(ival=-1)) == b"\xba\x10\x0b\x08" + NO_LOCATION
    assert encode_node(ast.Float(fval="1.5")) == b"\xc2\x10\x05\x0a\x031.5"
    assert encode_node(ast.Boolean(boolval=True)) == b"\xca\x10\x02\x08\x01"
    assert encode_node(ast.Boolean(boolval=False)) == b"\xca\x10\x00"
    assert encode_node(ast.String(sval="ab")) == b"\xd2\x10\x04\x0a\x02ab"
    assert encode_node(ast.BitString(bsval="b01")) == b"\xda\x10\x05\x0a\x03b01"


def test_a_const_oneof_holds_the_value_messages() -> None:
    # A_Const is 271 in Node; its oneof: ival 1, fval 2, boolval 3, sval 4, bsval 5; isnull 10
    def const(value: ast.Node | None, isnull: bool = False) -> bytes:
        return encode_node(ast.A_Const(isnull=isnull, val=value))

    assert const(ast.Integer(ival=7)) == b"\xfa\x10\x04\x0a\x02\x08\x07"
    assert const(ast.Integer(ival=0)) == b"\xfa\x10\x02\x0a\x00"  # the oneof set to an empty Integer
    assert const(ast.Float(fval="1.5")) == b"\xfa\x10\x07\x12\x05\x0a\x031.5"
    assert const(ast.Boolean(boolval=False)) == b"\xfa\x10\x02\x1a\x00"
    assert const(ast.String(sval="")) == b"\xfa\x10\x02\x22\x00"
    assert const(ast.BitString(bsval="xff")) == b"\xfa\x10\x07\x2a\x05\x0a\x03xff"
    assert const(None, isnull=True) == b"\xfa\x10\x02\x50\x01"
    assert encode_node(pglast.parse_sql("SELECT 0")[0].stmt.targetList[0].val) == const(ast.Integer(ival=0))


def test_lists() -> None:
    # List is 268 in Node, its items field 1; a NULL item is a Node with no field set
    string_a = b"\xd2\x10\x03\x0a\x01a"
    assert encode_node((ast.String(sval="a"),)) == b"\xe2\x10\x08\x0a\x06" + string_a
    assert encode_node((None,)) == b"\xe2\x10\x02\x0a\x00"
    assert encode_node(((ast.String(sval="a"),),)) == b"\xe2\x10\x0d\x0a\x0b\xe2\x10\x08\x0a\x06" + string_a
    assert encode_node(()) == b"\xe2\x10\x00"


def test_enums_are_shifted_by_undefined() -> None:
    # SortBy is 80 in Node: node 1, sortby_dir 2, sortby_nulls 3, useOp 4, location 5; C's SORTBY_DEFAULT
    # (0) is proto's 1, as every C member is one more in the proto (UNDEFINED = 0)
    sort = ast.SortBy(
        sortby_dir=enums.SortByDir.SORTBY_DESC, sortby_nulls=enums.SortByNulls.SORTBY_NULLS_DEFAULT
    )
    assert enums.SortByDir.SORTBY_DESC == 2
    assert encode_node(sort) == b"\x82\x05\x0f\x10\x03\x18\x01\x28" + NO_LOCATION
    assert encode_node(sort, locations=False) == b"\x82\x05\x04\x10\x03\x18\x01"
    # a char enum (FunctionParameterMode: 'd' is FUNC_PARAM_DEFAULT, the sixth member); FunctionParameter 206
    param = ast.FunctionParameter(mode=enums.FunctionParameterMode.FUNC_PARAM_DEFAULT)
    assert encode_node(param, locations=False) == b"\xf2\x0c\x02\x18\x06"


def test_parse_result_and_raw_stmt() -> None:
    # ParseResult: version 1 (180006 for PostgreSQL 18.6's parser), stmts 2; RawStmt: stmt 1,
    # stmt_location 2, stmt_len 3; SelectStmt 138 in Node, targetList 3, op 23 (SETOP_NONE: 1)
    data = encode(pglast.parse_sql("SELECT 1"))
    assert data == reference("SELECT 1")
    assert data.startswith(b"\x08\xa6\xfe\x0a\x12")
    assert b"\xd2\x08" in data  # SelectStmt's tag in Node


def test_a_value_the_schema_does_not_allow_is_an_error() -> None:
    bad = ast.RangeVar()
    object.__setattr__(bad, "relname", 5)  # (pglast's own check refuses it)
    with pytest.raises(EncodeError):
        encode_node(bad)
    sort = ast.SortBy()
    object.__setattr__(sort, "sortby_dir", 99)
    with pytest.raises(EncodeError):
        encode_node(sort)
    target = ast.ResTarget()
    object.__setattr__(target, "val", object())
    with pytest.raises(EncodeError):
        encode_node(target)
    with pytest.raises(EncodeError):
        encode([ast.SelectStmt()])  # type: ignore[list-item]  # (no RawStmt)


def test_the_table_is_the_running_pglasts() -> None:
    """The generated table belongs to one pglast (its bundled proto): an upgrade regenerates it
    (``python -m proxy.sql.protobuf_gen``), else every deparse falls back to pglast's printer."""
    assert SCHEMA_MATCHES, f"regenerate proxy/sql/protobuf_schema.py for pglast {pglast.__version__}"


def test_another_pglast_deparses_with_the_printer(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a table of another pglast the encoder refuses, and the deparse is pglast's printer's."""
    from proxy.sql import protobuf
    from proxy.sql.deparse import FALLBACKS, deparse, print_tree

    stmt = pglast.parse_sql("SELECT a FROM t WHERE b = 'x'")[0]
    monkeypatch.setattr(protobuf, "SCHEMA_MATCHES", False)
    before = FALLBACKS.by_reason["encode"]
    assert deparse(stmt) == print_tree(stmt)
    assert FALLBACKS.by_reason["encode"] == before + 1
