"""pglast's AST as libpg_query's protobuf (sans-IO): the ``ParseResult`` message that
``pglast.parser.deparse_protobuf`` turns back into SQL in C.

``encode(stmts)`` writes what ``pglast.parser.parse_sql_protobuf`` gives for the same text, byte for byte,
but for one field pglast does not keep: ``A_Const.location`` (pglast's ``A_Const`` has no such slot). The
field numbers come from ``protobuf_schema`` (generated from the proto pglast bundles); the wire format is
proto3's as protobuf-c writes it: fields in number order, scalars at their default (0, false, "") left out,
repeated scalars packed, a ``Node`` a message with one field set (its type's number in ``Node``'s oneof).

The special cases, as libpg_query writes them:

- The value nodes (``String``, ``Integer``, ``Float``, ``Boolean``, ``BitString``) are messages of one field;
  where a ``Node`` is expected they go in ``Node``'s oneof like any node.
- A list (a tuple in pglast) in a ``repeated Node`` field is one ``Node`` per item; a list where one node is
  expected (a tuple in a ``Node`` field, or an item that is a tuple) is a ``Node`` holding a ``List``.
- ``A_Const``'s value is a oneof of the value messages themselves (no ``Node`` around them): present, even
  when empty (``Integer`` 0), whenever the constant is not NULL.
- Enums: proto's start with an UNDEFINED = 0 the C ones lack, so they are mapped by member name.

``EncodeError``: a node or value the table does not describe (a gap the caller falls back from).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from enum import Enum

import pglast
from pglast import ast, enums

from proxy.sql.protobuf_schema import ENUMS, MESSAGES


class EncodeError(ValueError):
    """The tree holds something the encoder does not know how to write."""


# The pglast whose bundled pg_query.proto ``protobuf_schema`` was generated from. Another release may bundle
# another libpg_query, whose numbers could put a value in another field (a valid but different statement):
# with any other, ``encode`` refuses and the deparse falls back to pglast's printer.
SCHEMA_PGLAST = "v8.8"


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _SMALL[value]
    value &= 0xFFFFFFFFFFFFFFFF  # (a negative int32/int64 is written as its 64-bit two's complement)
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL = [bytes((i,)) for i in range(0x80)]
_VARINT, _FIXED64, _BYTES = 0, 1, 2


def _tag(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


# A field's writer: (tag, value, the fields table in use) -> the bytes of the field, or b"" when it is left
# out.
_Field = tuple[str, bytes, "_Writer"]
_Table = dict[type, tuple[_Field, ...]]
_Writer = Callable[[bytes, object, _Table], bytes]


def _string(tag: bytes, value: object, _: _Table) -> bytes:
    if not value or value == "\0":  # (a C char 0 is no string: libpg_query leaves it out)
        return b""
    if not isinstance(value, str):
        raise EncodeError(f"a string field holds {value!r}")
    data = value.encode()
    return tag + _varint(len(data)) + data


def _int(tag: bytes, value: object, _: _Table) -> bytes:
    if not value:
        return b""
    if not isinstance(value, int):  # (bool is an int: True is 1, as protobuf-c writes it)
        raise EncodeError(f"an integer field holds {value!r}")
    return tag + _varint(value)


def _double(tag: bytes, value: object, _: _Table) -> bytes:
    if not value:
        return b""
    if not isinstance(value, int | float):
        raise EncodeError(f"a double field holds {value!r}")
    return tag + struct.pack("<d", value)


def _packed_uint64(tag: bytes, value: object, _: _Table) -> bytes:
    if not value:
        return b""
    if not isinstance(value, tuple | list | set | frozenset):
        raise EncodeError(f"a bitmapset field holds {value!r}")
    data = b"".join(_varint(int(v)) for v in sorted(value))
    return tag + _varint(len(data)) + data


def _enum_writer(name: str) -> _Writer:
    numbers = ENUMS[name]
    by_value: dict[object, bytes] = {}
    python_enum = getattr(enums, name, None)
    if python_enum is not None and issubclass(python_enum, Enum):
        # keyed by C value: an IntEnum's int or a char enum's str (a member hashes as its value)
        by_value = {member.value: _varint(numbers[member.name]) for member in python_enum}

    def write(tag: bytes, value: object, _: _Table) -> bytes:
        try:
            return tag + by_value[value]
        except (KeyError, TypeError):
            pass
        if value is None:
            return b""
        if isinstance(value, str) and value in numbers:  # (a member given by its name)
            return tag + _varint(numbers[value])
        raise EncodeError(f"{value!r} is no member of {name}")

    return write


def _location(tag: bytes, value: object, _: _Table) -> bytes:
    # pglast reads C's -1 ("no location") as None
    return _int(tag, -1 if value is None else value, _)


def _node_field(tag: bytes, value: object, table: _Table) -> bytes:
    if value is None:
        return b""
    body = _node(value, table)
    return tag + _varint(len(body)) + body


def _nodes_field(tag: bytes, value: object, table: _Table) -> bytes:
    if not value:
        return b""
    if not isinstance(value, tuple | list):
        raise EncodeError(f"a list field holds {value!r}")
    parts = []
    for item in value:
        body = _node(item, table)
        parts.append(tag + _varint(len(body)) + body)
    return b"".join(parts)


def _message_writer(name: str) -> _Writer:
    def write(tag: bytes, value: object, table: _Table) -> bytes:
        if value is None:
            return b""
        if type(value).__name__ != name:
            raise EncodeError(f"a {name} field holds {type(value).__name__}")
        body = _message(value, table)  # type: ignore[arg-type]
        return tag + _varint(len(body)) + body

    return write


def _writer(kind: str) -> tuple[int, _Writer]:
    """The wire type and writer of a field of this kind."""
    simple: dict[str, tuple[int, _Writer]] = {
        "string": (_BYTES, _string),
        "bool": (_VARINT, _int),
        "int32": (_VARINT, _int),
        "uint32": (_VARINT, _int),
        "int64": (_VARINT, _int),
        "uint64": (_VARINT, _int),
        "double": (_FIXED64, _double),
        "node": (_BYTES, _node_field),
        "nodes": (_BYTES, _nodes_field),
        "packed uint64": (_BYTES, _packed_uint64),
    }
    if kind in simple:
        return simple[kind]
    form, _, name = kind.partition(" ")
    if form == "enum":
        return _VARINT, _enum_writer(name)
    if form == "message":
        return _BYTES, _message_writer(name)
    raise KeyError(kind)  # (repeated strings and messages: only in messages the encoder does not write)


_FIELDS: _Table = {}  # every field
_NO_LOCATIONS: _Table = {}  # the locations left out (0), which the deparser does not read
_NODE_TAG: dict[type, bytes] = {}  # a node type's tag in Node's oneof
_LIST_TAG = b""


def _build() -> None:
    """Each pglast class' fields in number order (``A_Const`` apart), and its tag in ``Node``."""
    global _LIST_TAG  # noqa: PLW0603  (set once, at import)
    for name, number, _kind in MESSAGES["Node"]:
        cls = getattr(ast, name, None)
        if isinstance(cls, type) and issubclass(cls, ast.Node):
            _NODE_TAG[cls] = _tag(number, _BYTES)
        elif name == "List":
            _LIST_TAG = _tag(number, _BYTES)
    for cls in _NODE_TAG:
        fields = MESSAGES[cls.__name__]
        if cls is ast.A_Const:
            continue
        slots = cls.__slots__  # type: ignore[attr-defined]  # (pglast's stubs omit them)
        made = []
        for field, number, kind in sorted(fields, key=lambda f: f[1]):
            try:
                wire, write = _writer(kind)
            except KeyError:
                continue
            if field not in slots and f"{field}_" in slots:
                field = f"{field}_"  # noqa: PLW2901  (pglast's name for a Python keyword: def_)
            slot = slots.get(field)
            if slot is not None and getattr(slot, "c_type", None) == "ParseLoc":
                write = _location
            made.append((field, _tag(number, wire), write))
        _FIELDS[cls] = tuple(made)
        _NO_LOCATIONS[cls] = tuple(f for f in made if f[2] is not _location)


_VALUE_TAGS = {
    cls: _tag(number, _BYTES)
    for name, number, _kind in MESSAGES["A_Const"]
    if (cls := getattr(ast, _kind.partition(" ")[2], None)) is not None and name != "location"
}
_ISNULL_TAG = _tag(next(n for name, n, _ in MESSAGES["A_Const"] if name == "isnull"), _VARINT)


def _a_const(node: ast.A_Const, table: _Table) -> bytes:
    if node.isnull:
        return _ISNULL_TAG + b"\x01"
    value = node.val
    tag = _VALUE_TAGS.get(type(value))
    if tag is None or value is None:
        raise EncodeError(f"an A_Const holds {value!r}")
    body = _message(value, table)
    return tag + _varint(len(body)) + body


def _message(node: ast.Node, table: _Table) -> bytes:
    """The fields of one node's own message."""
    cls = type(node)
    if cls is ast.A_Const:
        return _a_const(node, table)  # type: ignore[arg-type]
    try:
        fields = table[cls]
    except KeyError:
        raise EncodeError(f"no message for {cls.__name__}") from None
    parts = []
    for name, tag, write in fields:
        value = getattr(node, name, None)
        if value is not None or write is _location:  # (most fields are unset: no call for them)
            parts.append(write(tag, value, table))
    return b"".join(parts)


def _node(value: object, table: _Table) -> bytes:
    """A ``Node`` message: the one oneof field holding this node (or list)."""
    if isinstance(value, tuple | list):
        items = _nodes_field(_ITEMS_TAG, value, table)
        return _LIST_TAG + _varint(len(items)) + items
    if value is None:
        return b""  # (a NULL list item: a Node with no field set)
    tag = _NODE_TAG.get(type(value))
    if tag is None:
        raise EncodeError(f"{value!r} is no node")
    body = _message(value, table)  # type: ignore[arg-type]
    return tag + _varint(len(body)) + body


_build()
SCHEMA_MATCHES = pglast.__version__ == SCHEMA_PGLAST
_ITEMS_TAG = _tag(MESSAGES["List"][0][1], _BYTES)
_RAW_STMT_TAG = _tag(next(n for name, n, _ in MESSAGES["ParseResult"] if name == "stmts"), _BYTES)
_VERSION_TAG = _tag(next(n for name, n, _ in MESSAGES["ParseResult"] if name == "version"), _VARINT)


def version_num() -> int:
    """PG_VERSION_NUM of the parser pglast bundles (``ParseResult.version``)."""
    from pglast import parser  # noqa: PLC0415  (pglast's C module, loaded when first needed)

    major, minor = parser.get_postgresql_version()
    return int(major) * 10000 + int(minor)


_VERSION = b""


def encode(stmts: Iterable[ast.RawStmt], *, locations: bool = True) -> bytes:
    """The ``ParseResult`` of these statements, as ``parse_sql_protobuf`` of their text gives it (its
    locations are byte offsets, pglast's are character offsets: the same for an ASCII text).
    ``locations=False`` leaves every location out, as a deparse needs none."""
    global _VERSION  # noqa: PLW0603  (computed once)
    if not SCHEMA_MATCHES:
        raise EncodeError(f"the protobuf table is pglast {SCHEMA_PGLAST}'s, not {pglast.__version__}'s")
    if not _VERSION:
        _VERSION = _VERSION_TAG + _varint(version_num())
    table = _FIELDS if locations else _NO_LOCATIONS
    parts = [_VERSION]
    for stmt in stmts:
        if not isinstance(stmt, ast.RawStmt):
            raise EncodeError(f"a statement list holds {stmt!r}")
        body = _message(stmt, table)
        parts.append(_RAW_STMT_TAG + _varint(len(body)) + body)
    return b"".join(parts)


def encode_node(value: ast.Node | tuple[object, ...] | None, *, locations: bool = True) -> bytes:
    """One ``Node`` message: ``value`` (a node, a list or None) where a ``Node`` field holds it."""
    return _node(value, _FIELDS if locations else _NO_LOCATIONS)
