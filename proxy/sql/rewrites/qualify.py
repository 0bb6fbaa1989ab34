"""Schema-qualified names of CoW tables (``public.t``) are pointed at the overlay, which the session's
``search_path`` alone would not reach (docs/rewrites.md, "Schema-qualified names")."""

from __future__ import annotations

from pglast import ast
from pglast.visitors import Ancestor, Skip

from proxy.sql.catalog import Catalog
from proxy.sql.jsontree import JsonNode
from proxy.sql.rewrites.base import RELATION, Context, Rule, Scan, Step
from proxy.sql.rewrites.nodes import (
    QUALIFIED_NAME_KINDS,
    Visit,
)
from proxy.sql.rewrites.tables import (
    MERGE_ON_VIEWS,
    unsupported,
)
from proxy.sql.visitor import Visitor


class _Qualify(Visitor):
    """Points schema-qualified names of CoW tables (relations and column references) at the overlay."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.changed = False

    def visit_RangeVar(self, _: Ancestor, node: ast.RangeVar) -> None:
        if node.schemaname:
            table = self.catalog.table(node.schemaname, node.relname)
            if table is not None:
                node.schemaname = table.overlay_schema
                self.changed = True

    def visit_ColumnRef(self, _: Ancestor, node: ast.ColumnRef) -> None:
        fields = list(node.fields or ())
        if len(fields) < 3 or not all(isinstance(f, ast.String) for f in fields[-3:-1]):
            return
        table = self.catalog.table(fields[-3].sval, fields[-2].sval)
        if table is not None:
            fields[-3] = ast.String(sval=table.overlay_schema)
            node.fields = tuple(fields)
            self.changed = True

    def visit_CreateFunctionStmt(self, _: Ancestor, node: ast.CreateFunctionStmt) -> Visit:
        return Skip


def detect(scan: Scan, node: JsonNode) -> bool:
    return scan.cow(node)


def apply(ctx: Context, node: ast.Node) -> Step | None:
    if not isinstance(node, QUALIFIED_NAME_KINDS):
        return None
    qualify = _Qualify(ctx.catalog)
    qualify(node)
    if not qualify.changed:
        return None
    if isinstance(node, ast.MergeStmt) and 0 < ctx.version < MERGE_ON_VIEWS:
        # pglast deparses MERGE in PostgreSQL 17 syntax (WHEN NOT MATCHED BY TARGET)
        raise unsupported(
            "MERGE naming a copy-on-write table with its schema on PostgreSQL before 17 (use the "
            "unqualified name)"
        )
    return Step(node)


RULE = Rule("qualify", frozenset({RELATION}), detect, apply, literal_template=True)
