"""The rewriter's deparse: pglast's printer (``RawStream``), with the back-links it needs set by a walk of our
own and cut again once the text is written.

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
from pglast.stream import RawStream
from pglast.visitors import Ancestor

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


def deparse(node: ast.Node) -> str:
    """``RawStream()(node)``: the SQL text of one statement (or expression) node."""
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
