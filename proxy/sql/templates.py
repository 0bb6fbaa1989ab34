"""Rewrites per shape: a rewritten statement as a template on its shape, the text's constants filled back in.

Texts that differ only in their constants (proxy/sql/shapes.py) are rewritten alike when no rule that
rewrites them reads a constant's value (``Rule.literal_template``) and the shape's literals are data
(``shapes.literals_irrelevant``): the rules carry the constants into their output as they are, so the
rewrite of one text is that of another with the constants swapped. The analysis rewrites a *probe*
instead of a text of the shape (its second: most shapes come once): the text with each literal replaced by
a sentinel of its class that names it (``probe``). In the probe's rewritten text each sentinel stands
where the deparser wrote that constant; cut there, it is the template (``build``), and any text of the shape
is the template with its own constants written as the deparser writes them (``Template.fill``): an integer
as its value (``007`` is ``7``), a number as its token, a string as its token (no backslash: the lexer's
rule), each with the unary minus signs the parser folded into it.

A list of constants after ``IN`` (``x IN (1, 2, …)``: Django's bulk filters, up to 2,000 of them) is one
sentinel in the probe, and the template writes the text's list there, its constants joined by ``, `` as
the deparser joins them: the rules copy the list as a whole and never read its length, and the deparser
writes each item alone. So a text of such a list pays the rewrite and deparse of one constant, not of
thousands, even the first time (``Analyzer._rewrite``).

Refused, so that the text is rewritten on its own: a sentinel the output does not hold exactly as the
deparser writes it, or any trace of one elsewhere (a printer that changed it), and a constant that pglast's
printer reads rather than writes (a type modifier, ``char(1)`` printed as ``char``; the arguments of its
special functions, ``EXTRACT('year' FROM …)`` printed as ``EXTRACT(YEAR FROM …)``), and a negative integer
in a cast (libpg_query's deparser writes ``(-5)::int`` but ``0::int``, and ``-0`` is the constant 0).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

from pglast.printers import SPECIAL_FUNCTIONS

from proxy.sql.jsontree import svals
from proxy.sql.shapes import INT, NUM, STR, Literal, Shape, const_location

# The sentinels: an integer (ICONST: at most 2147483647), a number with a dot (FCONST) and a string, each with
# the literal's index in five digits. The marks are long enough not to occur in a rewrite by chance; any
# occurrence of one that is not a whole sentinel refuses the template.
_INT_MARK, _NUM_MARK, _STR_MARK = "19876", "98765", "c0wq"
MAX_LITERALS = 100_000
_SENTINELS = {
    INT: lambda i: f"{_INT_MARK}{i:05d}",
    NUM: lambda i: f"{_NUM_MARK}{i:05d}.5",
    STR: lambda i: f"'{_STR_MARK}{i:05d}'",
}
_FOUND = re.compile(
    rf"(?<![\w$.])(?P<sign>-?)(?:{_INT_MARK}(?P<int>\d{{5}})(?![\w$.])|{_NUM_MARK}(?P<num>\d{{5}})\.5(?![\w$.]))"
    rf"|'{_STR_MARK}(?P<str>\d{{5}})'"
)
_TRACE = re.compile(f"{_INT_MARK}|{_NUM_MARK}|{_STR_MARK}", re.I)


@dataclass(frozen=True, slots=True)
class Constants:
    """What the probe of a text stands for: its literals in groups (``groups``: literal indices; an ``IN``
    list's are one group, any other literal is a group of its own), one sentinel per group, and per literal
    the minus signs the parser folded into its constant (``signs``: ``- -5`` is the constant 5 at the
    first sign)."""

    groups: tuple[tuple[int, ...], ...]
    signs: tuple[int, ...]


def constants(text: bytes, shape: Shape, stmts: list[Any]) -> Constants | None:
    """The groups and signs of a text's literals, from the A_Const locations of its JSON parse tree; None
    when a literal is no constant the deparser writes as it is (``_constants``)."""
    locations: dict[int, bool] = {}
    lists: dict[int, int] = {}
    _constants(stmts, True, locations, lists)
    signs = []
    for literal in shape.literals:
        location = const_location(text, literal.start, locations)
        if location is None or not locations[location]:
            return None
        signs.append(text.count(b"-", location, literal.start))
    return Constants(_groups(text, shape, lists), tuple(signs))


_LIST_SEPARATOR = re.compile(rb"[ \t\n\r]*,[ \t\n\r]*")


def _groups(text: bytes, shape: Shape, lists: dict[int, int]) -> tuple[tuple[int, ...], ...]:
    """The literals in groups: those of an ``IN`` list of two or more constants of one class, nothing but
    commas and whitespace between them (``lists``: the location of such a list's first constant -> its
    length), as one group; every other literal alone."""
    literals = shape.literals
    groups: list[tuple[int, ...]] = []
    index = 0
    while index < len(literals):
        length = lists.get(literals[index].start, 0)
        end = index + length
        if length >= 2 and end <= len(literals) and _one_list(text, literals[index:end]):
            groups.append(tuple(range(index, end)))
            index = end
        else:
            groups.append((index,))
            index += 1
    return tuple(groups)


def _one_list(text: bytes, run: tuple[Literal, ...]) -> bool:
    kind = run[0].kind
    return all(
        literal.kind == kind and _LIST_SEPARATOR.fullmatch(text, before.end, literal.start) is not None
        for before, literal in itertools.pairwise(run)
    )


def probe(text: bytes, shape: Shape, found: Constants) -> tuple[str, bytes] | None:
    """``text`` with each group of literals replaced by its sentinel, and the key the probe must have (the
    text's, a list's literals as one); None when the shape has other placeholders (a savepoint's or
    cursor's name) or too many literals."""
    literals = shape.literals
    if len(found.groups) >= MAX_LITERALS or any(literal.kind not in _SENTINELS for literal in literals):
        return None
    parts, key, pos = [], bytearray(), 0
    for index, group in enumerate(found.groups):
        first, last = literals[group[0]], literals[group[-1]]
        parts.append(text[pos : first.start].decode())
        parts.append(_SENTINELS[first.kind](index))
        key += text[pos : first.start]
        key.append(first.kind)
        pos = last.end
    parts.append(text[pos:].decode())
    key += text[pos:]
    return "".join(parts), bytes(key)


def _constants(node: object, as_is: bool, locations: dict[int, bool], lists: dict[int, int]) -> None:
    """Records each A_Const's location with whether the deparser writes it as it is (``as_is``: not below a
    type name, whose modifiers pglast's printer reads, nor a special function's arguments), and each ``IN``
    list of constants only by its first one's location and its length."""
    if isinstance(node, list):
        for item in node:
            _constants(item, as_is, locations, lists)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key == "A_Const" and isinstance(value, dict):
            location = value.get("location")
            if isinstance(location, int):
                locations[location] = locations.get(location, True) and as_is
            continue
        if key == "A_Expr" and isinstance(value, dict) and value.get("kind") == "AEXPR_IN":
            _in_list(value.get("rexpr"), lists)
        inner = as_is and key != "typeName" and not (key == "FuncCall" and _special(value))
        _constants(value, inner, locations, lists)


def _in_list(rexpr: object, lists: dict[int, int]) -> None:
    items = rexpr.get("List", {}).get("items") if isinstance(rexpr, dict) else None
    if not isinstance(items, list) or not items:
        return
    locations = [
        item.get("A_Const", {}).get("location") if isinstance(item, dict) else None for item in items
    ]
    first = locations[0]
    if isinstance(first, int) and all(isinstance(location, int) for location in locations):
        lists[first] = len(items)


def _special(call: object) -> bool:
    names = svals(call.get("funcname")) if isinstance(call, dict) else []
    return ".".join(names) in SPECIAL_FUNCTIONS or ".".join(["pg_catalog", *names]) in SPECIAL_FUNCTIONS


@dataclass(frozen=True, slots=True)
class Template:
    """A rewritten text cut at its constants: ``parts[0]``, group ``slots[0]`` of ``constants``,
    ``parts[1]``, …"""

    parts: tuple[str, ...]
    slots: tuple[int, ...]
    constants: Constants

    def fill(self, text: bytes, shape: Shape) -> str:
        """The rewrite of ``text`` (of the template's shape, lexed as ``shape``)."""
        literals, groups, signs = shape.literals, self.constants.groups, self.constants.signs
        out = [self.parts[0]]
        for slot, part in zip(self.slots, self.parts[1:], strict=True):
            out.append(
                ", ".join(
                    written(text[literals[i].start : literals[i].end].decode(), literals[i].kind, signs[i])
                    for i in groups[slot]
                )
            )
            out.append(part)
        return "".join(out)


def written(token: str, kind: int, signs: int) -> str:
    """A literal's token as pglast's deparser writes its constant, with ``signs`` unary minus signs folded
    into it by the parser: an integer as its value, a number as its token (a sign each negation toggles,
    as the parser's ``doNegateFloat``), a string as it was written (the lexer took no backslash, and the
    deparser doubles quotes as the token does)."""
    if kind == INT:
        return str(-int(token) if signs % 2 else int(token))
    if kind == NUM:
        return "-" + token if signs % 2 else token
    return token


def build(rewritten: str, shape: Shape, found: Constants) -> Template | None:
    """The template of a probe's rewritten text, or None when a sentinel is not where and as the deparser
    writes it (then the texts are rewritten one by one)."""
    parts: list[str] = []
    slots: list[int] = []
    pos = 0
    literals, groups = shape.literals, found.groups
    for match in _FOUND.finditer(rewritten):
        digits = match.group("int") or match.group("num") or match.group("str")
        index = int(digits)
        if index >= len(groups):
            return None
        kind = INT if match.group("int") else NUM if match.group("num") else STR
        first = groups[index][0]
        negative = match.group("sign") == "-"
        if literals[first].kind != kind or (kind != STR and negative != bool(found.signs[first] % 2)):
            return None
        if kind == INT and negative and _cast_parens(rewritten, match.start(), match.end()):
            return None  # (C writes (-5)::int but 0::int, and -0 is 0: the parentheses depend on the value)
        parts.append(rewritten[pos : match.start()])
        slots.append(index)
        pos = match.end()
    parts.append(rewritten[pos:])
    if any(_TRACE.search(part) for part in parts):
        return None  # a sentinel written otherwise (a printer that changed it)
    return Template(tuple(parts), tuple(slots), found)


def _cast_parens(rewritten: str, start: int, end: int) -> bool:
    """Whether the sentinel at ``start:end`` is in the parentheses libpg_query's deparser writes around a
    negative integer cast (``(-5)::int``)."""
    return rewritten[start - 1 : start] == "(" and rewritten.startswith(")::", end)
