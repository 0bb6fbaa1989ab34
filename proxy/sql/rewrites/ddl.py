"""DDL on a CoW table inside a session is refused (0A000): it would change the base table under every
session and production (docs/rewrites.md, "DDL")."""

from __future__ import annotations

from pglast import ast
from pglast.enums import (
    ObjectType,
)

from proxy.errors import RewriteError
from proxy.sql.jsontree import JsonNode
from proxy.sql.rewrites.base import Context, Rule, Scan, Step

NODES = frozenset(
    {
        "AlterTableStmt",
        "IndexStmt",
        "RenameStmt",
        "CreateTrigStmt",
        "RuleStmt",
        "AlterObjectSchemaStmt",
        "ClusterStmt",
        "CreatePolicyStmt",
        "AlterPolicyStmt",
        "DropStmt",
        "GrantStmt",
    }
)
# Drops by a name that, in a session, resolves to a CoW table's overlay view (first on the physical path).
_DROPS = frozenset({ObjectType.OBJECT_TABLE, ObjectType.OBJECT_VIEW})


def detect(scan: Scan, node: JsonNode) -> bool:
    return True


def apply(ctx: Context, node: ast.Node) -> Step | None:
    relations: list[ast.RangeVar | None] = []
    if isinstance(
        node,
        ast.AlterTableStmt
        | ast.IndexStmt
        | ast.RenameStmt
        | ast.CreateTrigStmt
        | ast.RuleStmt
        | ast.AlterObjectSchemaStmt
        | ast.ClusterStmt,
    ):
        relations.append(node.relation)
    elif isinstance(node, ast.CreatePolicyStmt | ast.AlterPolicyStmt):
        relations.append(node.table)
    elif isinstance(node, ast.GrantStmt) and node.objtype == ObjectType.OBJECT_TABLE:
        # GRANT/REVOKE … ON t would change the privileges of its overlay view, which every session reads.
        relations.extend(o for o in node.objects or () if isinstance(o, ast.RangeVar))
    elif isinstance(node, ast.DropStmt) and node.removeType in _DROPS:
        for name in node.objects or ():
            parts = [p.sval for p in name if isinstance(p, ast.String)]
            relations.append(
                ast.RangeVar(schemaname=parts[-2] if len(parts) > 1 else None, relname=parts[-1])
            )
    for relation in relations:
        table = ctx.cow(relation)
        if table is not None:
            raise RewriteError(
                f"DDL on copy-on-write table {table.qualified} is not allowed inside a cowproxy session; "
                "run it from a connection that is not in a session",
                "0A000",
            )
    return None


RULE = Rule("ddl", NODES, detect, apply)
