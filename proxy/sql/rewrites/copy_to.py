"""``COPY t TO`` of a CoW table becomes ``COPY (SELECT … FROM overlay.t) TO``: a view cannot be copied from
directly (docs/rewrites.md, "COPY")."""

from __future__ import annotations

from pglast import ast

from proxy.sql.catalog import CowTable
from proxy.sql.jsontree import JsonNode
from proxy.sql.rewrites.base import Context, Rule, Scan, Step
from proxy.sql.rewrites.nodes import (
    parse_select,
    quote,
)
from proxy.sql.rewrites.tables import (
    overlay,
)


def detect(scan: Scan, node: JsonNode) -> bool:
    return True


def apply(ctx: Context, node: ast.Node) -> Step | None:
    if not isinstance(node, ast.CopyStmt) or node.is_from or node.relation is None:
        return None
    table = ctx.cow(node.relation)
    if table is None:
        return None
    _from_view(node, table)
    return Step(node)


def _from_view(node: ast.CopyStmt, table: CowTable) -> None:
    if node.attlist:
        columns = [a.sval for a in node.attlist]
    else:  # COPY leaves generated columns out when no list is given
        columns = [c.name for c in table.columns if not c.generated]
    node.query = parse_select(f"SELECT {', '.join(quote(c) for c in columns)} FROM {overlay(table)}")
    node.relation = None
    node.attlist = None


RULE = Rule("copy_to", frozenset({"CopyStmt"}), detect, apply)
