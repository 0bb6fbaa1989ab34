"""MERGE into a CoW table needs PostgreSQL 17, which runs MERGE on views through INSTEAD OF triggers;
before, it is refused (0A000) rather than left to fail on the view."""

from __future__ import annotations

from pglast import ast

from proxy.sql.jsontree import JsonNode
from proxy.sql.rewrites.base import Context, Rule, Scan, Step
from proxy.sql.rewrites.tables import (
    MERGE_ON_VIEWS,
    unsupported,
)


def detect(scan: Scan, node: JsonNode) -> bool:
    return True


def apply(ctx: Context, node: ast.Node) -> Step | None:
    if isinstance(node, ast.MergeStmt):
        table = ctx.cow(node.relation)
        if table is not None and 0 < ctx.version < MERGE_ON_VIEWS:
            raise unsupported(
                f"MERGE into copy-on-write table {table.qualified} needs PostgreSQL 17 or later"
            )
    return None


RULE = Rule("merge", frozenset({"MergeStmt"}), detect, apply)
