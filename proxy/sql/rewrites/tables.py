"""What the rules know of the layer: its schemas and names, and how a FROM item resolves to a CoW table."""

from __future__ import annotations

from pglast import ast

from proxy.errors import RewriteError
from proxy.sql.catalog import Catalog, CowTable
from proxy.sql.rewrites.nodes import (
    quote,
)

CHANGES_SCHEMA = "cow_changes"  # the layer's changes tables and their constraint triggers


MERGE_ON_VIEWS = 170000  # PostgreSQL 17 runs MERGE on views through INSTEAD OF triggers


# The session of the rewritten statement's reads of the changes tables: the backend's binding when bound, else
# the GUC (cow._session()), once per statement (an InitPlan). Not the bare GUC: SQL the proxy did not see may
# have changed it on a bound backend.
CURRENT_SESSION = "(SELECT cow._session())"


def overlay(table: CowTable) -> str:
    return f"{quote(table.overlay_schema)}.{quote(table.name)}"


def unsupported(message: str) -> RewriteError:
    return RewriteError(message + " inside a cowproxy session", "0A000")


def cow_range(catalog: Catalog, ctes: frozenset[str], node: ast.RangeVar) -> CowTable | None:
    """The CoW table a FROM item's RangeVar names (not a CTE of that name, not another database's)."""
    if node.catalogname or (not node.schemaname and node.relname in ctes):
        return None
    return catalog.lookup(node.schemaname, node.relname)


def base_readable(catalog: Catalog, ctes: frozenset[str], node: ast.RangeVar) -> CowTable | None:
    """The CoW table a RangeVar names, for a rewrite that reads its base and changes tables directly (after
    _Qualify): None when an unqualified name could denote several (the session's search_path picks one)."""
    tables = catalog.tables.values()
    if node.schemaname is None and sum(t.name == node.relname for t in tables) > 1:
        return None
    for table in tables:
        # _Qualify has run: a schema-qualified name may already point at the overlay
        overlay = (table.overlay_schema, table.name)
        if (node.schemaname, node.relname) == overlay and not node.catalogname:
            return table
    return cow_range(catalog, ctes, node)


def row_keys(table: CowTable) -> list[tuple[str, ...]]:
    """The column sets that identify a row: the primary key and the plain unique indexes."""
    return [key for key in (table.pk, *(u.columns for u in table.unique if u.inferable)) if key]
