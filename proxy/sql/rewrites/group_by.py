"""``GROUP BY`` a CoW table's primary key: its other columns are added to the GROUP BY, since the view has
no key for PostgreSQL to infer them from (docs/rewrites.md, "GROUP BY a primary key")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pglast import ast
from pglast.visitors import Ancestor, Skip

from proxy.sql.catalog import Catalog, CowTable
from proxy.sql.jsontree import JsonNode, any_select, from_relations
from proxy.sql.rewrites.base import Context, Rule, Scan, Step
from proxy.sql.rewrites.nodes import (
    QUALIFIED_NAME_KINDS,
    Visit,
)
from proxy.sql.rewrites.tables import (
    cow_range,
)
from proxy.sql.visitor import Visitor

# Types without an equality operator: a GROUP BY on them fails (42883), so such columns are not added.
_UNGROUPABLE = frozenset(
    {
        "json",
        "xml",
        "point",
        "line",
        "lseg",
        "box",
        "path",
        "polygon",
        "circle",
        "txid_snapshot",
        "pg_snapshot",
    }
)


@dataclass(frozen=True)
class _FromItem:
    """One relation a SELECT's column references can name: ``names`` the qualifiers that denote it."""

    names: tuple[tuple[str, ...], ...]
    table: CowTable | None  # None: columns unknown (a subquery, function, other table, aliased join)
    qualifier: tuple[str, ...] = ()  # how added columns are qualified


class _GroupByKeys(Visitor):
    """Adds the other columns of a CoW table whose primary key a SELECT groups by to its GROUP BY.

    PostgreSQL lets ``SELECT t.*, count(c.id) … GROUP BY t.id`` through on a table because the other
    columns depend on its primary key; the overlay view has no key (42803). Grouping by them as well is
    the same grouping. Anything not resolved for certain is left alone (PostgreSQL's own error follows).
    """

    def __init__(self, catalog: Catalog, ctes: frozenset[str]) -> None:
        self.catalog = catalog
        self.ctes = ctes  # names a CTE may shadow a table with (any level: conservative)
        self.changed = False

    def visit_SelectStmt(self, _: Ancestor, node: ast.SelectStmt) -> None:
        groups = tuple(node.groupClause or ())
        if not groups or any(isinstance(g, ast.GroupingSet) for g in groups):
            return
        items = self._from_items(node.fromClause or ())
        grouped: dict[int, set[str]] = {}
        outputs = _output_columns(tuple(node.targetList or ()), items)
        for group in groups:
            found = self._resolve(_by_position(group, outputs), items)
            if found is not None:
                grouped.setdefault(found[0], set()).add(found[1])
        added: list[ast.ColumnRef] = []
        for index, columns in grouped.items():
            item = items[index]
            table = item.table
            if table is None or not table.pk or not set(table.pk) <= columns:
                continue
            for column in table.columns:
                if column.name not in columns and column.type.removesuffix("[]") not in _UNGROUPABLE:
                    added.append(_column_ref((*item.qualifier, column.name)))
        if added:
            node.groupClause = (*groups, *added)
            self.changed = True

    def _from_items(self, from_clause: Sequence[ast.Node]) -> list[_FromItem]:
        items: list[_FromItem] = []
        stack: list[ast.Node | None] = list(reversed(from_clause))
        while stack:
            item = stack.pop()
            if isinstance(item, ast.JoinExpr) and item.alias is None:
                stack.extend((item.rarg, item.larg))
            elif isinstance(item, ast.RangeVar):
                items.append(self._range_var(item))
            else:
                alias = getattr(item, "alias", None)
                names = ((alias.aliasname,),) if alias is not None else ()
                items.append(_FromItem(names, None))
        return items

    def _range_var(self, node: ast.RangeVar) -> _FromItem:
        relname = str(node.relname)  # the parser always sets it (as it does an alias's name)
        if node.alias is not None:
            table = None if node.alias.colnames else self._table(node)
            alias = str(node.alias.aliasname)
            return _FromItem(((alias,),), table, (alias,))
        if node.schemaname:
            qualifier = (node.schemaname, relname)
            return _FromItem((qualifier, (relname,)), self._table(node), qualifier)
        return _FromItem(((relname,),), self._table(node), (relname,))

    def _table(self, node: ast.RangeVar) -> CowTable | None:
        return cow_range(self.catalog, self.ctes, node)

    @staticmethod
    def _resolve(group: ast.Node, items: Sequence[_FromItem]) -> tuple[int, str] | None:
        """(index of the FROM item, column) a plain column reference denotes, when certain."""
        if not isinstance(group, ast.ColumnRef):
            return None
        fields = tuple(group.fields or ())
        if not fields or not all(isinstance(f, ast.String) for f in fields):
            return None
        *qualifier, column = (f.sval for f in fields)
        if qualifier:
            found = [i for i, item in enumerate(items) if tuple(qualifier) in item.names]
        elif all(item.table is not None for item in items):
            found = [i for i, item in enumerate(items) if item.table and item.table.column(column)]
        else:
            return None  # a relation of unknown columns may hold a column of that name
        if len(found) != 1:
            return None
        table = items[found[0]].table
        return (found[0], column) if table is not None and table.column(column) else None

    def visit_CreateFunctionStmt(self, _: Ancestor, node: ast.CreateFunctionStmt) -> Visit:
        return Skip


def _output_columns(targets: Sequence[ast.ResTarget], items: Sequence[_FromItem]) -> list[ast.Node]:
    """The SELECT list's output columns in order, as far as they are certain: ``t.*`` of a CoW table in the
    FROM expands to its columns; the list stops at a bare ``*`` or a ``*`` of anything else."""
    columns: list[ast.Node] = []
    for target in targets:
        value = target.val
        if value is None:
            break
        fields = tuple(value.fields or ()) if isinstance(value, ast.ColumnRef) else ()
        if not any(isinstance(f, ast.A_Star) for f in fields):
            columns.append(value)
            continue
        qualifier = tuple(f.sval for f in fields[:-1] if isinstance(f, ast.String))
        found = [item for item in items if qualifier and qualifier in item.names]
        table = found[0].table if len(found) == 1 else None
        if table is None:
            break
        columns.extend(_column_ref((*found[0].qualifier, c.name)) for c in table.columns)
    return columns


def _by_position(group: ast.Node, columns: Sequence[ast.Node]) -> ast.Node:
    """The expression ``GROUP BY 2`` names (the second output column: Django groups by positions), or the
    item itself (an expression, or a position that is not certain or out of range: PostgreSQL decides)."""
    position = (
        group.val.ival if isinstance(group, ast.A_Const) and isinstance(group.val, ast.Integer) else None
    )
    return columns[position - 1] if position is not None and 1 <= position <= len(columns) else group


def _column_ref(fields: Sequence[str]) -> ast.ColumnRef:
    return ast.ColumnRef(fields=tuple(ast.String(sval=f) for f in fields))


def detect(scan: Scan, node: JsonNode) -> bool:
    """A GROUP BY over a CoW table in this SELECT or its set-operation members."""
    return any_select(
        node,
        lambda s: (
            bool(s.get("groupClause")) and any(scan.cow(r) for r in from_relations(s.get("fromClause")))
        ),
    )


def apply(ctx: Context, node: ast.Node) -> Step | None:
    if not isinstance(node, QUALIFIED_NAME_KINDS):
        return None
    keys = _GroupByKeys(ctx.catalog, ctx.ctes(node))
    keys(node)
    return Step(node) if keys.changed else None


# before qualify: columns added for public.t are then pointed at the overlay with the rest
RULE = Rule("group_by", frozenset({"SelectStmt"}), detect, apply, literal_template=True)
