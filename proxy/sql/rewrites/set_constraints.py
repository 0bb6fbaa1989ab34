"""``SET CONSTRAINTS name`` also names the layer's constraint trigger of that name (docs/rewrites.md,
"SET CONSTRAINTS")."""

from __future__ import annotations

from pglast import ast

from proxy.sql.catalog import Catalog
from proxy.sql.jsontree import JsonNode
from proxy.sql.rewrites.base import Context, Rule, Scan, Step
from proxy.sql.rewrites.tables import (
    CHANGES_SCHEMA,
)


def detect(scan: Scan, node: JsonNode) -> bool:
    return bool(node.get("constraints"))


def apply(ctx: Context, node: ast.Node) -> Step | None:
    if not isinstance(node, ast.ConstraintsSetStmt):
        return None
    return Step(node, final=True) if _add_triggers(ctx.catalog, node) else None


def _add_triggers(catalog: Catalog, node: ast.ConstraintsSetStmt) -> bool:
    """Adds ``cow_changes.<trigger>`` for each name that is a deferrable constraint of a CoW table.

    PostgreSQL resolves an unqualified name in the first schema on ``search_path`` that has a
    constraint of that name: in a session the app's own, which session writes never queue events for;
    the session's checks are the layer's constraint triggers of the same name in ``cow_changes``.
    Only existing triggers are added (an added unknown name would raise 42704); ``ALL``, unknown names
    and ``catalog.schema.name`` (PostgreSQL's 0A000) stay as they are."""
    names = list(node.constraints or ())
    present = {r.relname for r in names if r.schemaname == CHANGES_SCHEMA and not r.catalogname}
    added: list[ast.RangeVar] = []
    for relation in names:
        if relation.catalogname or relation.schemaname == CHANGES_SCHEMA:
            continue
        for trigger in catalog.constraint_triggers(relation.schemaname, relation.relname):
            if trigger not in present:
                present.add(trigger)
                added.append(
                    ast.RangeVar(schemaname=CHANGES_SCHEMA, relname=trigger, inh=True, relpersistence="p")
                )
    if not added:
        return False
    node.constraints = tuple(names + added)
    return True


RULE = Rule("set_constraints", frozenset({"ConstraintsSetStmt"}), detect, apply)
