"""A lone ``count(*)`` of a keyed CoW table is split into three counts of real tables (docs/rewrites.md,
"count(*) of a CoW table")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pglast import ast
from pglast.enums import (
    LimitOption,
    NullTestType,
)
from pglast.visitors import Ancestor, Skip

from proxy.sql.catalog import Catalog, CowTable
from proxy.sql.jsontree import JsonNode, any_select, child, children
from proxy.sql.rewrites.base import Context, Rule, Scan, Step
from proxy.sql.rewrites.nodes import (
    QUALIFIED_NAME_KINDS,
    Visit,
    all_of,
    bare_select,
    copy_tree,
    function_name,
    parse_select,
    plain_condition,
    quote,
    range_name,
    unqualified,
)
from proxy.sql.rewrites.tables import (
    CHANGES_SCHEMA,
    CURRENT_SESSION,
    base_readable,
)
from proxy.sql.visitor import Visitor


@dataclass(frozen=True)
class _Count:
    """What a lone ``count(*)`` counts: the rows of ``table`` (FROM item ``range_var``) under ``where``,
    skipping ``offset`` and at most ``limit`` of them (the expressions of a counted subquery, or None)."""

    table: CowTable
    range_var: ast.RangeVar
    where: ast.Node | None
    offset: ast.Node | None = None
    limit: ast.Node | None = None


class _Placeholders(Visitor):
    """Replaces the template's one-word column references named in ``values`` with copies of the client's
    expressions (NULL for a missing one)."""

    def __init__(self, values: dict[str, ast.Node | None]) -> None:
        self.values = values

    def visit_ColumnRef(self, _: Ancestor, node: ast.ColumnRef) -> Visit:
        fields = [getattr(f, "sval", None) for f in node.fields or ()]
        if len(fields) == 1 and fields[0] in self.values:
            value = self.values[fields[0]]
            return copy_tree(value) if value is not None else ast.A_Const(isnull=True)
        return None


def _own_columns(targets: Sequence[ast.ResTarget], item: ast.RangeVar, table: CowTable) -> bool:
    """Whether a target list holds only columns of ``table`` (FROM item ``item``) and stars."""
    name, qualified = range_name(item), item.alias is None
    schemas = (table.schema, table.overlay_schema) if qualified else ()
    stars = {("*",), (name, "*"), *((schema, name, "*") for schema in schemas)}
    for target in targets:
        ref = target.val
        if not isinstance(ref, ast.ColumnRef):
            return False
        fields = tuple(
            "*" if isinstance(f, ast.A_Star) else getattr(f, "sval", None) for f in ref.fields or ()
        )
        if fields not in stars and not plain_condition(ref, name, table, qualified=qualified):
            return False
    return True


class _SplitCounts(Visitor):
    """``SELECT count(*) FROM t [WHERE p]`` on a keyed CoW table becomes three counts of real tables
    (``count(x)`` too: the rows where x is not null).

    The overlay is the base rows minus those the session has a version of, plus the session's live
    versions, so its count is ``count(base WHERE p) - count(base WHERE p that the session has a version of)
    + count(session's live versions WHERE p)``: the first part is the plain table's own plan (a parallel or
    index-only scan), the others read the session's few rows by index. Through the view, every base row is
    probed against the session's keys: 2.4-2.8x the plain table on 1M rows, against 1.1-1.2x split
    (docs/benchmarks.md). Only a lone ``count(*)`` over one table (or over a query of its columns, as
    SQLAlchemy and Prisma count), with a WHERE of the table's own columns, constants, parameters and stable
    built-in functions, is split; anything else reads the view.
    """

    def __init__(self, catalog: Catalog, ctes: frozenset[str]) -> None:
        self.catalog = catalog
        self.ctes = ctes
        self.changed = False

    def visit_SelectStmt(self, _: Ancestor, node: ast.SelectStmt) -> Visit:
        count = self._counted(node)
        if count is None:
            return None
        table, where = count.table, count.where
        name = range_name(count.range_var)
        qualified = count.range_var.alias is None  # then schema.table.column names its columns too
        if where is not None and not plain_condition(where, name, table, qualified=qualified):
            return None
        alias = quote(name)
        base = f"{quote(table.schema)}.{quote(table.name)} AS {alias}"
        changes = f"{CHANGES_SCHEMA}.{quote(str(table.changes_table))}"
        has_version = " AND ".join(
            [f"_cow_x._cow_session = {CURRENT_SESSION}", "_cow_x._cow_current"]
            + [f"_cow_x.{quote(c)} = {alias}.{quote(c)}" for c in table.key]
        )
        split = (
            f"(SELECT count(*) FROM {base})"
            f" - (SELECT count(*) FROM {base} WHERE EXISTS (SELECT 1 FROM {changes} AS _cow_x"
            f" WHERE {has_version}))"
            f" + (SELECT count(*) FROM {changes} AS {alias} WHERE {alias}._cow_session = {CURRENT_SESSION}"
            f" AND {alias}._cow_current AND NOT {alias}._cow_deleted)"
        )
        column = quote((node.targetList or ())[0].name or "count")
        if count.offset is None and count.limit is None:
            new = parse_select(f"SELECT {split} AS {column}")
            parts = (new.targetList or ())[0].val
        else:
            # The rows OFFSET skips and LIMIT cuts; the subquery in WHERE lets PostgreSQL reject a negative
            # OFFSET or LIMIT (2201X, 2201W) as it would the client's query.
            new = parse_select(
                f"SELECT LEAST(GREATEST(_cow_n.n - COALESCE(CAST(_cow_off AS bigint), 0), 0),"
                f" COALESCE(CAST(_cow_lim AS bigint), _cow_n.n))"
                f" AS {column} FROM (SELECT {split} AS n) AS _cow_n"
                f" WHERE (SELECT count(*) FROM (SELECT 1 LIMIT _cow_lim OFFSET _cow_off) AS _cow_v) >= 0"
            )
            parts = (new.fromClause or ())[0].subquery.targetList[0].val
            _Placeholders({"_cow_off": count.offset, "_cow_lim": count.limit})(new)
        if where is not None:
            # a copy of the client's condition in each part (the deparser writes shared nodes thrice too,
            # but a copy keeps later edits of one part from reaching the others)
            first, second = parts.lexpr.lexpr.subselect, parts.lexpr.rexpr.subselect
            third = parts.rexpr.subselect
            first.whereClause = unqualified(where)
            second.whereClause = all_of(unqualified(where), second.whereClause)
            third.whereClause = all_of(third.whereClause, unqualified(where))
        node.targetList = new.targetList
        node.fromClause = new.fromClause
        node.whereClause = new.whereClause
        self.changed = True
        return Skip

    def _counted(self, node: ast.SelectStmt) -> _Count | None:
        """What this SELECT counts when it is a lone ``count(*)`` of a keyed CoW table's rows: ``FROM t
        [WHERE p]``, or ``FROM (SELECT <t's columns> FROM t [WHERE p] [ORDER BY …] [LIMIT n] [OFFSET m])
        alias`` (SQLAlchemy's ``Query.count()``; Prisma's ``count()``, with ``OFFSET $1``)."""
        if (
            not bare_select(node)
            or node.sortClause
            or node.limitCount is not None
            or node.limitOffset is not None
            or len(node.targetList or ()) != 1
        ):
            return None
        call = (node.targetList or ())[0].val
        if (
            not isinstance(call, ast.FuncCall)
            or function_name(call) not in (("count",), ("pg_catalog", "count"))
            or not (call.agg_star or len(call.args or ()) == 1)
            or call.agg_distinct
            or call.agg_order
            or call.agg_filter is not None
            or call.over is not None
        ):
            return None
        item, where = (node.fromClause or ())[0], node.whereClause
        if not call.agg_star:
            if not isinstance(item, ast.RangeVar):
                return None  # count(x) of a subquery's column: left to the view
            # count(x) counts the rows where x is not null
            (arg,) = call.args or ()
            counted = ast.NullTest(arg=arg, nulltesttype=NullTestType.IS_NOT_NULL, argisrow=False)
            where = counted if where is None else all_of(where, counted)
        offset = limit = None
        inner_targets: Sequence[ast.ResTarget] = ()  # a counted subquery's
        if isinstance(item, ast.RangeSubselect):
            inner = item.subquery
            if (
                item.lateral
                or where is not None
                or not bare_select(inner)
                or inner.limitOption == LimitOption.LIMIT_OPTION_WITH_TIES  # ties depend on the rows
            ):
                return None
            item, where = (inner.fromClause or ())[0], inner.whereClause
            inner_targets = inner.targetList or ()
            offset, limit = inner.limitOffset, inner.limitCount
            if not (plain_condition(offset) and plain_condition(limit)):
                return None
        if (
            not isinstance(item, ast.RangeVar)
            or not item.inh
            or (item.alias is not None and item.alias.colnames)
        ):
            return None
        table = self._table(item)
        if table is None or not table.key or table.changes_table is None or table.row_security:
            return None
        if item is not (node.fromClause or ())[0] and not _own_columns(inner_targets, item, table):
            return (
                None  # the subquery's targets must be the table's columns (a wrong name: the server's 42703)
            )
        return _Count(table, item, where, offset, limit)

    def _table(self, node: ast.RangeVar) -> CowTable | None:
        return base_readable(self.catalog, self.ctes, node)

    def visit_CreateFunctionStmt(self, _: Ancestor, node: ast.CreateFunctionStmt) -> Visit:
        return Skip


def detect(scan: Scan, node: JsonNode) -> bool:
    """A SELECT (or set-operation member) of count(*) alone over one CoW table: the rule decides whether
    to split it."""

    def counts(select: JsonNode) -> bool:
        targets = children(select, "targetList")
        items = children(select, "fromClause")
        if len(targets) != 1 or len(items) != 1:
            return False
        call = child(targets[0], "ResTarget", "val", "FuncCall")
        inner = child(items[0], "RangeSubselect", "subquery", "SelectStmt")
        if inner:  # SQLAlchemy's count of a query: FROM (SELECT ... FROM t WHERE ...) alias
            items = children(inner, "fromClause")
        counted = bool(call.get("agg_star")) or len(children(call, "args")) == 1
        return counted and len(items) == 1 and scan.cow(items[0].get("RangeVar"))

    return any_select(node, counts)


def apply(ctx: Context, node: ast.Node) -> Step | None:
    if not isinstance(node, QUALIFIED_NAME_KINDS):
        return None
    counts = _SplitCounts(ctx.catalog, ctx.ctes(node))
    counts(node)
    return Step(node) if counts.changed else None


# after qualify: its parts name the base tables, which qualify would point at the overlay
RULE = Rule("counts", frozenset({"SelectStmt"}), detect, apply, literal_template=True)
