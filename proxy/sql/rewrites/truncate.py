"""``TRUNCATE`` of CoW tables becomes one statement of chained DELETEs on the overlay views, referencing
tables first, with PostgreSQL's foreign-key refusal and CASCADE (docs/rewrites.md, "TRUNCATE")."""

from __future__ import annotations

from pglast import ast
from pglast.enums import (
    DropBehavior,
)

from proxy.errors import RewriteError
from proxy.sql.catalog import CowTable
from proxy.sql.jsontree import JsonNode
from proxy.sql.rewrites.base import Context, Rule, Scan, Step
from proxy.sql.rewrites.nodes import (
    parse_as,
)
from proxy.sql.rewrites.tables import (
    overlay,
    unsupported,
)


def detect(scan: Scan, node: JsonNode) -> bool:
    return True


def apply(ctx: Context, node: ast.Node) -> Step | None:
    if not isinstance(node, ast.TruncateStmt):
        return None
    deletes = _deletes(ctx, node)
    if deletes is None:
        return None
    return Step(deletes, ("DELETE", "TRUNCATE TABLE"), final=True)


def _deletes(ctx: Context, node: ast.TruncateStmt) -> ast.Node | None:
    tables: list[CowTable] = []
    others: list[str] = []
    for relation in node.relations or ():
        table = ctx.cow(relation)
        if table is None:
            others.append(relation.relname)
        elif table not in tables:
            tables.append(table)
    if not tables:
        return None
    if others:
        raise unsupported(f"TRUNCATE of copy-on-write and other tables ({', '.join(others)}) together")
    # RESTART IDENTITY is accepted but not applied: the sequences are shared with the base tables, and
    # restarting them would hand production ids that already exist (docs/rewrites.md).
    cascade = node.behavior == DropBehavior.DROP_CASCADE
    members = {(t.schema, t.name) for t in tables}
    pending = list(tables)
    while pending:
        table = pending.pop()
        for ref in table.referenced_by:
            if (ref.schema, ref.table) in members:
                continue
            child = ctx.catalog.table(ref.schema, ref.table)
            if not cascade:
                # PostgreSQL's own check and message, raised whether or not rows exist
                raise RewriteError("cannot truncate a table referenced in a foreign key constraint", "0A000")
            if child is None:
                raise unsupported(
                    f"TRUNCATE ... CASCADE reaching {ref.schema}.{ref.table}, which is not copy-on-write"
                )
            members.add((child.schema, child.name))
            tables.append(child)
            pending.append(child)
    order = _children_first(tables)
    # One statement, deletes chained so that each runs after the ones it depends on: a data-modifying
    # CTE referenced from a scalar subquery runs to completion before the statement reading it starts.
    ctes: list[str] = []
    previous = None
    for i, table in enumerate(order[:-1]):
        gate = f" WHERE (SELECT count(*) FROM {previous}) >= 0" if previous else ""
        ctes.append(f"cow_truncate_{i} AS (DELETE FROM {overlay(table)}{gate} RETURNING 1)")
        previous = f"cow_truncate_{i}"
    gate = f" WHERE (SELECT count(*) FROM {previous}) >= 0" if previous else ""
    last = f"DELETE FROM {overlay(order[-1])}{gate}"
    deletes = parse_as(ast.DeleteStmt, (f"WITH {', '.join(ctes)} " if ctes else "") + last)
    return deletes


def _children_first(tables: list[CowTable]) -> list[CowTable]:
    """Referencing tables before the tables they reference (cycles broken in list order)."""
    by_key = {(t.schema, t.name): t for t in tables}
    done: list[CowTable] = []
    visiting: set[tuple[str, str]] = set()

    def visit(table: CowTable) -> None:
        key = (table.schema, table.name)
        if table in done or key in visiting:
            return
        visiting.add(key)
        for ref in table.referenced_by:
            child = by_key.get((ref.schema, ref.table))
            if child is not None and child is not table:
                visit(child)
        done.append(table)

    for table in tables:
        visit(table)
    return done


RULE = Rule("truncate", frozenset({"TruncateStmt"}), detect, apply)
