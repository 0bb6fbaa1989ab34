"""A reader of libpg_query's protobuf for the tests: a message's bytes again, with chosen fields left out
(``A_Const.location``, which pglast does not keep; or every location, to compare two parses of different
texts). It walks the wire format with the schema's table, so it knows which fields hold messages."""

from __future__ import annotations

import functools

from pglast import ast

from proxy.sql.protobuf_schema import MESSAGES


# Per message, its fields that hold a location (an offset into the text: ParseLoc in pglast's slots)
def _location_fields(message: str) -> set[str]:
    slots = getattr(getattr(ast, message, None), "__slots__", None)
    if not isinstance(slots, dict):
        return {"location"}
    return {f for f, slot in slots.items() if getattr(slot, "c_type", None) == "ParseLoc"} | {"location"}


_LOCATIONS = {name: _location_fields(name) for name in MESSAGES}


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def _put(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@functools.cache
def _kinds(message: str) -> dict[int, tuple[str, str]]:
    """Field number: (C name, message type it holds or "")."""
    out = {}
    for name, number, kind in MESSAGES[message]:
        form, _, type_ = kind.partition(" ")
        held = "Node" if kind in ("node", "nodes") else type_ if form in ("message", "repeated") else ""
        out[number] = (name, held if held in MESSAGES else "")
    return out


def rewrite(
    data: bytes,
    message: str = "ParseResult",
    *,
    all_locations: bool = False,
    drop: frozenset[str] = frozenset(),
) -> bytes:
    """``data`` (a ``message``) with A_Const's location left out, or every location if ``all_locations``,
    and the fields named in ``drop`` (in any message)."""
    kinds = _kinds(message)
    out = bytearray()
    pos = 0
    while pos < len(data):
        start = pos
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, pos = _varint(data, pos)
            pos += length
        else:
            raise ValueError(f"wire type {wire} in {message}")
        name, held = kinds.get(number, ("?", ""))
        if (
            (message == "A_Const" and name == "location")
            or (all_locations and name in _LOCATIONS[message])
            or name in drop
        ):
            continue
        if wire == 2 and held:
            body = rewrite(data[pos - length : pos], held, all_locations=all_locations, drop=drop)
            out += data[start : start + len(_put(key))] + _put(len(body)) + body
        else:
            out += data[start:pos]
    return bytes(out)
