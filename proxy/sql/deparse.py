"""The rewriter's deparse: libpg_query's deparser in C (``deparse_protobuf``) on the tree encoded by
``proxy.sql.protobuf``, and pglast's printer (``RawStream``) where that cannot serve.

A rewritten count took 4.4 ms to analyze, of which pglast's printer was more than half; the C deparser
writes the same statement in tens of microseconds (with the encoding in Python before it). Both write SQL
that parses to the same tree (tests/proxy_sql/test_protobuf.py); they differ in formatting only (the C
deparser quotes fewer identifiers and string lists, ``SET x TO a`` for ``SET x TO 'a'``). pglast's printer
serves what C cannot take: a node that is no statement (an expression), a tree the encoder has no field for
(``EncodeError``) and one libpg_query's deparser refuses (``DeparseError``); those are counted in
``FALLBACKS`` (``cowproxy_deparse_fallbacks_total``).

pglast's printer, with the back-links it needs set by a walk of our own and cut again once the text is
written:

pglast's printers read each node's ``ancestors`` (its chain of parents), which ``RawStream.__call__`` sets
first with ``visitors.populate_ancestors``: a generic ``Visitor`` (a class made per call, a breadth-first
generator, an action per node) that was a third of the deparse of Django's rewritten texts. ``populate``
sets the very same chains — an ``Ancestor(parent, node, member)`` per node, per list item and per field
that holds one, as pglast's ``Visitor.iterate`` makes them — with a plain stack.

The chains make every node of a printed tree part of a reference cycle (a node's ``ancestors`` names its
parent, which holds the node), so each rewritten tree waited for the cyclic garbage collector, which then
walked the proxy's whole heap more often (a sixth of the analysis' CPU in Django's full list). ``deparse``
cuts the chains after printing (``node`` and ``parent`` of each link made), so the tree is freed when the
rewriter drops it. Nothing reads ``ancestors`` outside the printer (the rules' visitors get their chains
from pglast's walk).
"""

from __future__ import annotations

from collections.abc import Callable

from pglast import ast
from pglast.parser import DeparseError, deparse_protobuf
from pglast.stream import RawStream
from pglast.visitors import Ancestor

from proxy.sql.protobuf import EncodeError, encode

_Push = Callable[[tuple[Ancestor, object]], None]
_set_slot = object.__setattr__  # (Node.__setattr__ checks field values; ``ancestors`` is no field)


def populate(root: ast.Node | tuple[object, ...]) -> list[Ancestor]:
    """Sets the ``ancestors`` of every node under ``root`` as ``pglast.visitors.populate_ancestors`` does;
    returns the links it made."""
    node_type = ast.Node
    made: list[Ancestor] = []
    keep = made.append
    stack: list[tuple[Ancestor, object]] = [(Ancestor(), root)]
    pop, push = stack.pop, stack.append
    while stack:
        above, value = pop()
        keep(above)
        if isinstance(value, tuple):
            for index, item in enumerate(value):
                link = Ancestor(above, value, index)
                keep(link)
                if isinstance(item, node_type):
                    _fields(item, link, push)
                elif isinstance(item, tuple):
                    for inner, child in enumerate(item):
                        if isinstance(child, tuple | node_type):
                            push((Ancestor(link, item, inner), child))
        elif isinstance(value, node_type):
            _fields(value, above, push)
    return made


def _fields(node: ast.Node, link: Ancestor, push: _Push) -> None:
    """The node's own chain, and its fields that hold nodes or lists, to visit."""
    _set_slot(node, "ancestors", link)
    for name in type(node).__slots__:  # type: ignore[attr-defined]  # (pglast's stubs omit them)
        child = getattr(node, name, None)
        if isinstance(child, tuple | ast.Node):
            push((Ancestor(link, node, name), child))


class Fallbacks:
    """Deparses pglast's printer wrote because C could not (by reason; read by proxy/metrics.py)."""

    def __init__(self) -> None:
        self.by_reason: dict[str, int] = {"expression": 0, "encode": 0, "deparse": 0}

    def count(self, reason: str) -> None:
        self.by_reason[reason] += 1


FALLBACKS = Fallbacks()


def deparse(node: ast.Node) -> str:
    """The SQL text of one statement (a ``RawStmt`` or the statement in it) or expression node."""
    if isinstance(node, ast.RawStmt):
        raw = node
    elif type(node).__name__.endswith("Stmt"):
        raw = ast.RawStmt(stmt=node)
    else:
        FALLBACKS.count("expression")
        return print_tree(node)
    if raw.stmt is None:
        return ""
    try:
        data = encode((raw,), locations=False)
    except EncodeError:
        FALLBACKS.count("encode")
        return print_tree(node)
    try:
        return deparse_protobuf(data)
    except DeparseError:
        FALLBACKS.count("deparse")
        return print_tree(node)


def print_tree(node: ast.Node) -> str:
    """``RawStream()(node)``: pglast's printer's text of one statement (or expression) node."""
    made = populate((node,))
    try:
        if isinstance(node, ast.RawStmt) and node.stmt is None:
            return ""
        stream = RawStream()
        stream.print_node(node)
        return stream.getvalue()
    finally:
        for link in made:  # (the cycles through the printed tree)
            link.node = link.parent = None
