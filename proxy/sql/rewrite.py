"""Rewrites of statements on CoW tables inside a session (issue 3).

The overlay views take plain INSERT/UPDATE/DELETE/SELECT and COPY FROM through INSTEAD OF triggers; the
rest is rewritten here into statements on the views that give the client what the plain table would.
New statements are built from templates whose only variable parts are identifiers from the catalog;
the client's expressions, literals and ``$n`` parameters are spliced in as AST nodes, never as text.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import pglast
from pglast import ast
from pglast.enums import (
    A_Expr_Kind,
    BoolExprType,
    DropBehavior,
    JoinType,
    LimitOption,
    NullTestType,
    ObjectType,
    OnConflictAction,
    SetOperation,
)
from pglast.stream import RawStream
from pglast.visitors import Skip, Visitor

from proxy.errors import RewriteError
from proxy.sql.catalog import Catalog, CowTable, UniqueKey

CHANGES_SCHEMA = "cow_changes"  # the layer's changes tables and their constraint triggers
MERGE_ON_VIEWS = 170000  # PostgreSQL 17 runs MERGE on views through INSTEAD OF triggers


@dataclass(frozen=True)
class Outcome:
    sql: str | None
    tag_map: tuple[str, str] | None


def _q(name: str) -> str:
    """A quoted identifier (names come from the catalog, never from client values)."""
    return '"' + name.replace('"', '""') + '"'


def _overlay(table: CowTable) -> str:
    return f"{_q(table.overlay_schema)}.{_q(table.name)}"


def _parse(sql: str) -> Any:
    return pglast.parse_sql(sql)[0].stmt


@lru_cache(maxsize=256)
def _type_name(type_name: str) -> Any:
    # Shared between trees: nothing edits TypeName nodes after they are spliced in.
    return _parse(f"SELECT CAST(NULL AS {type_name})").targetList[0].val.typeName


def _unsupported(message: str) -> RewriteError:
    return RewriteError(message + " inside a cowproxy session", "0A000")


def _and(left: Any, right: Any) -> ast.BoolExpr:
    return ast.BoolExpr(boolop=BoolExprType.AND_EXPR, args=(left, right))


def _all(*conditions: Any) -> ast.BoolExpr:
    """The conditions' top-level AND terms under one AND (as the parser builds ``a AND b AND c``)."""
    terms = tuple(term for condition in conditions for term in _conjuncts(condition))
    return ast.BoolExpr(boolop=BoolExprType.AND_EXPR, args=terms)


def _match(left: str, right: str, key: UniqueKey) -> str:
    """SQL for 'rows left and right collide on key' (NULLs collide only under NULLS NOT DISTINCT)."""
    op = "IS NOT DISTINCT FROM" if key.nulls_not_distinct else "="
    return " AND ".join(f"{left}.{_q(c)} {op} {right}.{_q(c)}" for c in key.columns)


def _command_of(node: Any) -> str | None:
    """The command word of the CommandComplete tag a statement produces (for tag_map clashes)."""
    if isinstance(node, ast.SelectStmt):
        return "SELECT"
    if isinstance(node, ast.InsertStmt):
        return "INSERT"
    if isinstance(node, ast.UpdateStmt):
        return "UPDATE"
    if isinstance(node, ast.DeleteStmt):
        return "DELETE"
    if isinstance(node, ast.MergeStmt):
        return "MERGE"
    return None


class _Qualify(Visitor):
    """Points schema-qualified names of CoW tables (relations and column references) at the overlay."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.changed = False

    def visit_RangeVar(self, _: Any, node: Any) -> None:
        if node.schemaname:
            table = self.catalog.table(node.schemaname, node.relname)
            if table is not None:
                node.schemaname = table.overlay_schema
                self.changed = True

    def visit_ColumnRef(self, _: Any, node: Any) -> None:
        fields = list(node.fields or ())
        if len(fields) < 3 or not all(isinstance(f, ast.String) for f in fields[-3:-1]):
            return
        table = self.catalog.table(fields[-3].sval, fields[-2].sval)
        if table is not None:
            fields[-3] = ast.String(sval=table.overlay_schema)
            node.fields = tuple(fields)
            self.changed = True

    def visit_CreateFunctionStmt(self, _: Any, node: Any) -> Any:
        return Skip


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

    def visit_SelectStmt(self, _: Any, node: Any) -> None:
        groups = tuple(node.groupClause or ())
        if not groups or any(isinstance(g, ast.GroupingSet) for g in groups):
            return
        items = self._from_items(node.fromClause or ())
        grouped: dict[int, set[str]] = {}
        for group in groups:
            found = self._resolve(group, items)
            if found is not None:
                grouped.setdefault(found[0], set()).add(found[1])
        added: list[Any] = []
        for index, columns in grouped.items():
            item = items[index]
            table = item.table
            if table is None or not table.pk or not set(table.pk) <= columns:
                continue
            for column in table.columns:
                if column.name not in columns and column.type.removesuffix("[]") not in _UNGROUPABLE:
                    fields = (*item.qualifier, column.name)
                    added.append(ast.ColumnRef(fields=tuple(ast.String(sval=f) for f in fields)))
        if added:
            node.groupClause = (*groups, *added)
            self.changed = True

    def _from_items(self, from_clause: Sequence[Any]) -> list[_FromItem]:
        items: list[_FromItem] = []
        stack = list(reversed(from_clause))
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

    def _range_var(self, node: Any) -> _FromItem:
        if node.alias is not None:
            table = None if node.alias.colnames else self._table(node)
            return _FromItem(((node.alias.aliasname,),), table, (node.alias.aliasname,))
        if node.schemaname:
            qualifier = (node.schemaname, node.relname)
            return _FromItem((qualifier, (node.relname,)), self._table(node), qualifier)
        return _FromItem(((node.relname,),), self._table(node), (node.relname,))

    def _table(self, node: Any) -> CowTable | None:
        return _cow_range(self.catalog, self.ctes, node)

    @staticmethod
    def _resolve(group: Any, items: Sequence[_FromItem]) -> tuple[int, str] | None:
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

    def visit_CreateFunctionStmt(self, _: Any, node: Any) -> Any:
        return Skip


def _cow_range(catalog: Catalog, ctes: frozenset[str], node: Any) -> CowTable | None:
    """The CoW table a FROM item's RangeVar names (not a CTE of that name, not another database's)."""
    if node.catalogname or (not node.schemaname and node.relname in ctes):
        return None
    return catalog.lookup(node.schemaname, node.relname)


def _join_tree_ranges(from_clause: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """The RangeVars and the JoinExprs of a FROM list, through unaliased joins."""
    ranges: list[Any] = []
    joins: list[Any] = []
    stack = list(from_clause)
    while stack:
        item = stack.pop()
        if isinstance(item, ast.JoinExpr):
            joins.append(item)
            if item.alias is None:
                stack.extend((item.rarg, item.larg))
        elif isinstance(item, ast.RangeVar):
            ranges.append(item)
    return ranges, joins


# Joins of at least this many CoW tables in one FROM get their key joins as LATERAL subqueries when the first
# relation is restricted; two tables when it is pinned to a few rows by a key, or when the joined table is at
# least LATERAL_SIZE_RATIO times as large: then even every row of the first relation probing the joined view
# by index costs less than a hash join reading the joined view whole (a probe of a view is three index
# probes, ~5 us, against ~0.1 us per row hashed; bench/joins.py).
LATERAL_MIN_TABLES = 3
LATERAL_SIZE_RATIO = 50
_TRUE = _parse("SELECT 1 FROM a JOIN b ON true").fromClause[0].quals


class _LateralJoins(Visitor):
    """Key joins to CoW tables become ``JOIN LATERAL (SELECT * FROM t WHERE <on> OFFSET 0) t ON true``.

    PostgreSQL keeps no statistics for the columns of a UNION ALL view, so it estimates a join on a view's
    key with its default of 200 distinct values (10 rows joined to a 1M-row view: 50k rows), and the error
    multiplies with every further join until the plan reads whole tables: 4 tables joined for 10 rows took
    over 10 s instead of 0.8 ms (bench/joins.py). Inside the subquery the equality restricts the view, so
    each of its leaves is estimated from its own table's statistics and probed by index; OFFSET 0 keeps
    PostgreSQL from pulling the subquery back up into a join. Only SELECTs that join at least three CoW
    tables from a restricted first relation, or two from a first relation pinned by its key or dwarfed by the
    other table, are changed (a probe per outer row would be slower than the hash join of a query over whole
    tables), and only joins
    on an indexed column or a whole key of the joined table. USING, NATURAL, RIGHT/FULL, aliased joins,
    column aliases and FOR UPDATE are left as written (docs/rewrites.md).
    """

    def __init__(self, catalog: Catalog, ctes: frozenset[str]) -> None:
        self.catalog = catalog
        self.ctes = ctes
        self.changed = False

    def visit_SelectStmt(self, _: Any, node: Any) -> None:
        if node.lockingClause or not node.fromClause or len(node.fromClause) != 1:
            return
        ranges, joins = _join_tree_ranges(node.fromClause)
        tables = sum(_cow_range(self.catalog, self.ctes, r) is not None for r in ranges)
        if tables < 2:
            return
        driver = self._driver(node, ranges)
        if driver == "pinned" or (
            driver == "restricted" and (tables >= LATERAL_MIN_TABLES or self._dwarfed(node, ranges))
        ):
            for join in joins:
                self._lateral(join)

    def _dwarfed(self, node: Any, ranges: Sequence[Any]) -> bool:
        """Whether the first relation is a CoW table that every other CoW table of the join outsizes by
        LATERAL_SIZE_RATIO (row estimates from the catalog; an unanalyzed table does not count)."""
        first = _first_range(node)
        driver = _cow_range(self.catalog, self.ctes, first) if first is not None else None
        if driver is None or driver.rows < 0:
            return False
        others = [_cow_range(self.catalog, self.ctes, r) for r in ranges if r is not first]
        return all(t is None or t.rows >= LATERAL_SIZE_RATIO * max(driver.rows, 1.0) for t in others)

    def _driver(self, node: Any, ranges: Sequence[Any]) -> str:
        """How the first relation of the join tree is restricted: "pinned" (equality or IN on a whole key:
        a few rows), "restricted" (a WHERE condition compares one of its columns with values, or a LIMIT
        with no ORDER BY beyond it), else "open".

        Each joined row costs a probe per join, as on the plain tables; a filter on a later relation would
        make every row of the first one probe (a query counting rows by a condition on the last table of a
        chain went from 0.25 s to 2.5 s that way), so those are left as written.
        """
        driver = _first_range(node)
        if driver is None:
            return "open"
        names = {_range_name(r) for r in ranges}
        name = _range_name(driver)
        restricted = node.limitCount is not None and all(
            _qualifier(sort.node) == name for sort in node.sortClause or ()
        )
        pinned: set[str] = set()
        for conjunct in _conjuncts(node.whereClause):
            if not isinstance(conjunct, ast.A_Expr) or conjunct.kind not in _RESTRICTING:
                continue
            sides: list[Any] = [conjunct.lexpr, conjunct.rexpr]
            for column, values in (sides, sides[::-1]):
                if _qualifier(column) == name and not _reads_relations(values, names):
                    restricted = True
                    if conjunct.kind != A_Expr_Kind.AEXPR_BETWEEN and _operator(conjunct) == "=":
                        pinned.add(column.fields[-1].sval)
        table = _cow_range(self.catalog, self.ctes, driver)
        if table is not None and any(set(key) <= pinned for key in _keys(table)):
            return "pinned"
        return "restricted" if restricted else "open"

    def _lateral(self, join: Any) -> None:
        rarg = join.rarg
        if (
            join.jointype not in (JoinType.JOIN_INNER, JoinType.JOIN_LEFT)
            or join.isNatural
            or join.usingClause
            or join.quals is None
            or not isinstance(rarg, ast.RangeVar)
            or (rarg.alias is not None and rarg.alias.colnames)
            or (rarg.alias is None and rarg.schemaname)  # columns may be named schema.table.column
        ):
            return
        table = _cow_range(self.catalog, self.ctes, rarg)
        if table is None:
            return
        name = _range_name(rarg)
        quals = join.quals
        keyed: set[str] = set()
        for conjunct in _conjuncts(quals):
            if not (
                isinstance(conjunct, ast.A_Expr)
                and conjunct.kind == A_Expr_Kind.AEXPR_OP
                and _operator(conjunct) == "="
            ):
                continue
            for mine, other in ((conjunct.lexpr, conjunct.rexpr), (conjunct.rexpr, conjunct.lexpr)):
                column = _own_column(mine, name, table)
                if column is not None and not _reads_relations(other, {name}):
                    keyed.add(column)
        if not keyed & table.indexed and not any(set(key) <= keyed for key in _keys(table)):
            return
        sub = _parse("SELECT * FROM x OFFSET 0")
        sub.fromClause = (rarg,)
        sub.whereClause = quals
        join.rarg = ast.RangeSubselect(lateral=True, subquery=sub, alias=ast.Alias(aliasname=name))
        join.quals = _TRUE
        self.changed = True

    def visit_CreateFunctionStmt(self, _: Any, node: Any) -> Any:
        return Skip


# Built-in functions that are immutable or stable: a count split into three parts evaluates its WHERE on each
# part, so a volatile function (random(), nextval()) could answer differently for the same row.
_STABLE_FUNCTIONS = frozenset(
    {
        "abs", "age", "array_length", "btrim", "cardinality", "ceil", "ceiling", "char_length",
        "character_length", "concat", "concat_ws", "current_setting", "date_part",
        "date_trunc", "extract", "floor", "initcap", "jsonb_extract_path_text",
        "json_extract_path_text", "jsonb_typeof", "left", "length", "lower", "ltrim", "now",
        "octet_length", "position", "replace", "right", "round", "rtrim", "split_part", "starts_with",
        "strpos", "substr", "substring", "timezone", "to_char", "to_date", "to_timestamp", "trim", "trunc",
        "upper",
    }
)  # fmt: skip
# Expression nodes a split count's WHERE may hold (no subqueries, no aggregates, no whole-row references).
_PLAIN_EXPRESSION_NODES = (
    ast.A_Const,
    ast.A_Expr,
    ast.A_ArrayExpr,
    ast.A_Indices,
    ast.A_Indirection,
    ast.BoolExpr,
    ast.BooleanTest,
    ast.CaseExpr,
    ast.CaseWhen,
    ast.CoalesceExpr,
    ast.CollateClause,
    ast.MinMaxExpr,
    ast.NullTest,
    ast.ParamRef,
    ast.RowExpr,
    ast.SQLValueFunction,
    ast.TypeCast,
    ast.TypeName,
    ast.String,
    ast.Integer,
    ast.Float,
    ast.Boolean,
    ast.BitString,
)
_SESSION = "pg_catalog.current_setting('cow.session_id', true)"


@dataclass(frozen=True)
class _Count:
    """What a lone ``count(*)`` counts: the rows of ``table`` (FROM item ``range_var``) under ``where``,
    skipping ``offset`` and at most ``limit`` of them (the expressions of a counted subquery, or None)."""

    table: CowTable
    range_var: Any
    where: Any
    offset: Any = None
    limit: Any = None


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

    def visit_SelectStmt(self, _: Any, node: Any) -> Any:
        count = self._counted(node)
        if count is None:
            return None
        table, where = count.table, count.where
        name = _range_name(count.range_var)
        qualified = count.range_var.alias is None  # then schema.table.column names its columns too
        if where is not None and not _plain_condition(where, name, table, qualified=qualified):
            return None
        alias = _q(name)
        base = f"{_q(table.schema)}.{_q(table.name)} AS {alias}"
        changes = f"{CHANGES_SCHEMA}.{_q(str(table.changes_table))}"
        has_version = " AND ".join(
            [f"_cow_x._cow_session = {_SESSION}", "_cow_x._cow_current"]
            + [f"_cow_x.{_q(c)} = {alias}.{_q(c)}" for c in table.key]
        )
        split = (
            f"(SELECT count(*) FROM {base})"
            f" - (SELECT count(*) FROM {base} WHERE EXISTS (SELECT 1 FROM {changes} AS _cow_x"
            f" WHERE {has_version}))"
            f" + (SELECT count(*) FROM {changes} AS {alias} WHERE {alias}._cow_session = {_SESSION}"
            f" AND {alias}._cow_current AND NOT {alias}._cow_deleted)"
        )
        column = _q(node.targetList[0].name or "count")
        if count.offset is None and count.limit is None:
            new = _parse(f"SELECT {split} AS {column}")
            parts = new.targetList[0].val
        else:
            # The rows OFFSET skips and LIMIT cuts; the subquery in WHERE lets PostgreSQL reject a negative
            # OFFSET or LIMIT (2201X, 2201W) as it would the client's query.
            new = _parse(
                f"SELECT LEAST(GREATEST(_cow_n.n - COALESCE(CAST(_cow_off AS bigint), 0), 0),"
                f" COALESCE(CAST(_cow_lim AS bigint), _cow_n.n))"
                f" AS {column} FROM (SELECT {split} AS n) AS _cow_n"
                f" WHERE (SELECT count(*) FROM (SELECT 1 LIMIT _cow_lim OFFSET _cow_off) AS _cow_v) >= 0"
            )
            parts = new.fromClause[0].subquery.targetList[0].val
            _Placeholders({"_cow_off": count.offset, "_cow_lim": count.limit})(new)
        if where is not None:
            # a copy of the client's condition in each part (the deparser writes shared nodes thrice too,
            # but a copy keeps later edits of one part from reaching the others)
            first, second = parts.lexpr.lexpr.subselect, parts.lexpr.rexpr.subselect
            third = parts.rexpr.subselect
            first.whereClause = _unqualified(where)
            second.whereClause = _all(_unqualified(where), second.whereClause)
            third.whereClause = _all(third.whereClause, _unqualified(where))
        node.targetList = new.targetList
        node.fromClause = new.fromClause
        node.whereClause = new.whereClause
        self.changed = True
        return Skip

    def _counted(self, node: Any) -> _Count | None:
        """What this SELECT counts when it is a lone ``count(*)`` of a keyed CoW table's rows: ``FROM t
        [WHERE p]``, or ``FROM (SELECT <t's columns> FROM t [WHERE p] [ORDER BY …] [LIMIT n] [OFFSET m])
        alias`` (SQLAlchemy's ``Query.count()``; Prisma's ``count()``, with ``OFFSET $1``)."""
        if (
            not _bare_select(node)
            or node.sortClause
            or node.limitCount is not None
            or node.limitOffset is not None
            or len(node.targetList) != 1
        ):
            return None
        call = node.targetList[0].val
        if (
            not isinstance(call, ast.FuncCall)
            or _function_name(call) not in (("count",), ("pg_catalog", "count"))
            or not (call.agg_star or len(call.args or ()) == 1)
            or call.agg_distinct
            or call.agg_order
            or call.agg_filter is not None
            or call.over is not None
        ):
            return None
        item, where = node.fromClause[0], node.whereClause
        if not call.agg_star:
            if not isinstance(item, ast.RangeVar):
                return None  # count(x) of a subquery's column: left to the view
            # count(x) counts the rows where x is not null
            (arg,) = call.args or ()
            counted = ast.NullTest(arg=arg, nulltesttype=NullTestType.IS_NOT_NULL, argisrow=False)
            where = counted if where is None else _all(where, counted)
        offset = limit = None
        if isinstance(item, ast.RangeSubselect):
            inner: Any = item.subquery
            if (
                item.lateral
                or where is not None
                or not _bare_select(inner)
                or inner.limitOption == LimitOption.LIMIT_OPTION_WITH_TIES  # ties depend on the rows
            ):
                return None
            item, where = inner.fromClause[0], inner.whereClause
            offset, limit = inner.limitOffset, inner.limitCount
            if not (_plain_condition(offset) and _plain_condition(limit)):
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
        if item is not node.fromClause[0] and not _own_columns(inner.targetList, item, table):
            return (
                None  # the subquery's targets must be the table's columns (a wrong name: the server's 42703)
            )
        return _Count(table, item, where, offset, limit)

    def _table(self, node: Any) -> CowTable | None:
        return _base_readable(self.catalog, self.ctes, node)

    def visit_CreateFunctionStmt(self, _: Any, node: Any) -> Any:
        return Skip


def _base_readable(catalog: Catalog, ctes: frozenset[str], node: Any) -> CowTable | None:
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
    return _cow_range(catalog, ctes, node)


# Key types whose equality PostgreSQL hashes: a key read's NOT IN of the session's keys is then a hashed
# subplan; with another type it would compare every base row with every key.
_HASHED_KEY_TYPES = frozenset(
    {
        "smallint", "integer", "bigint", "numeric", "text", "character varying", "character", "uuid",
        "date", "timestamp without time zone", "timestamp with time zone", "boolean", "citext",
    }
)  # fmt: skip
_VERSIONS = "_cow_versions"  # the CTE of a key read: the session's versions of the keys read
# A key read hides the base rows the session has versions of with a hashed NOT IN, which PostgreSQL builds
# only when its estimate of those versions fits the hash memory (work_mem x hash_mem_multiplier: 8 MB by
# default, ~260k bigint keys); else it would compare each base row with each version. Up to this many rows
# in the changes table (all sessions) that cannot happen with work_mem >= 2 MB; beyond, an anti join.
KEY_READ_HASHED_ROWS = 100_000
_BOUNDS = {"=": "both", "<": "upper", "<=": "upper", ">": "lower", ">=": "lower"}
_FLIPPED = {"=": "=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


@dataclass(frozen=True)
class _KeyCondition:
    """A WHERE conjunct restricting key column ``column`` to a bounded set (``both``) or a half-line."""

    expr: Any
    column: str
    bound: str  # both | lower | upper
    has_param: bool
    source: Any  # the client's conjunct
    ranged: bool  # a range (BETWEEN, < <= > >=) rather than a set of values


def _key_read(node: Any, catalog: Catalog, ctes: frozenset[str], *, cached_plan: bool = False) -> bool:
    """``SELECT … FROM t WHERE <key = $1 | key IN (…) | key BETWEEN $1 AND $2 | …> [AND …]`` on a keyed CoW
    table, at the top of a statement, reads the base and changes tables directly (docs/rewrites.md, "Key
    reads"): ``t`` becomes

        (SELECT _cow_b.* FROM base AS _cow_b
         WHERE key NOT IN (SELECT key FROM _cow_versions WHERE key IS NOT NULL)
         UNION ALL SELECT cols FROM _cow_versions WHERE NOT _cow_deleted) AS t

    with ``_cow_versions`` a materialized CTE of the session's versions restricted by the client's key
    conditions (NOT EXISTS instead of NOT IN past KEY_READ_HASHED_ROWS). The view's anti join reads all of
    the session's keys and its plan re-plans three relations; this form plans in about half the time and
    reads only the keys in range: a 100-row range 2.2-2.6x the plain table through the view, 1.6-1.7x
    rewritten (docs/benchmarks.md). The client's WHERE stays outside,
    where PostgreSQL pushes it into both branches. Taken only with a ``$n`` parameter among the key
    conditions (a text the proxy parses once: a client that writes literals into each statement would pay
    a parse per statement), a bounded key set, one FROM item and only the table's own columns (no whole-row
    references, subqueries, GROUP BY or locking clause); anything else reads the view.

    With ``cached_plan`` (the text of a named prepared statement) the key ranges with a parameter restrict
    the base branch directly, each ``$n`` written ``(SELECT $n)``, instead of from the outer WHERE: the
    planner then estimates the range the same way for every value, its custom plans cost what the generic
    plan costs, and PostgreSQL caches the generic plan after the fifth execution instead of planning every
    range anew (the plain table keeps custom plans: its generic estimate of a range is worse than the 100
    rows a custom plan sees)."""
    if not _bare_select(node) or node.whereClause is None or not isinstance(node.fromClause[0], ast.RangeVar):
        return False
    item = node.fromClause[0]
    if not item.inh or (item.alias is not None and item.alias.colnames):
        return False
    table = _base_readable(catalog, ctes, item)
    if (
        table is None
        or not table.key
        or table.changes_table is None
        or table.row_security
        or any(getattr(table.column(k), "type", None) not in _HASHED_KEY_TYPES for k in table.key)
    ):
        return False
    name = _range_name(item)
    qualified = item.alias is None
    if name.startswith("_cow_") or not _only_own_columns(node, name, table, qualified=qualified):
        return False  # (an alias among the rewrite's own names)
    conditions = [
        c
        for c in (_key_condition(e, name, table, qualified=qualified) for e in _conjuncts(node.whereClause))
        if c is not None
    ]
    bounds = {(c.column, c.bound) for c in conditions}
    bounded = any((k, "both") in bounds or {(k, "lower"), (k, "upper")} <= bounds for k in table.key)
    if not bounded or not any(c.has_param for c in conditions):
        return False
    cols = ", ".join(_q(c.name) for c in table.columns)
    key = ", ".join(_q(k) for k in table.key)
    if table.changes_rows <= KEY_READ_HASHED_ROWS:  # -1: never analyzed, the planner counts pages
        # NOT IN of a NULL would hide every row; the layer keeps keys NOT NULL, this holds if one slipped in
        not_null = " AND ".join(f"{_q(k)} IS NOT NULL" for k in table.key)
        key_row = key if len(table.key) == 1 else f"({key})"
        hidden = f"{key_row} NOT IN (SELECT {key} FROM {_VERSIONS} WHERE {not_null})"
    else:
        # An estimate beyond the hash memory would make NOT IN compare every base row with every version
        hidden = (
            f"NOT EXISTS (SELECT FROM {_VERSIONS} AS _cow_v WHERE "
            + " AND ".join(f"_cow_v.{_q(k)} = _cow_b.{_q(k)}" for k in table.key)
            + ")"
        )
    changes = f"{CHANGES_SCHEMA}.{_q(str(table.changes_table))}"
    # The base branch's columns are the table's own (*): if app DDL on another connection changed them
    # since the catalog was read, the statement fails (the branches differ) instead of silently reading
    # the old columns, and the relay checks the catalog before its next rewritten statement.
    new = _parse(
        f"WITH {_VERSIONS} AS MATERIALIZED (SELECT {cols}, _cow_deleted FROM {changes}"
        f" WHERE _cow_session = {_SESSION} AND _cow_current)"
        f" SELECT FROM (SELECT _cow_b.* FROM {_q(table.schema)}.{_q(table.name)} AS _cow_b WHERE {hidden}"
        f" UNION ALL SELECT {cols} FROM {_VERSIONS} WHERE NOT _cow_deleted) AS {_q(name)}"
    )
    versions = new.withClause.ctes[0].ctequery
    versions.whereClause = _all(versions.whereClause, *(c.expr for c in conditions))
    if cached_plan:
        opaque = [c for c in conditions if c.ranged and c.has_param]
        if opaque:
            base = new.fromClause[0].subquery.larg
            base.whereClause = _all(
                *(_OpaqueParams()(copy.deepcopy(c.expr)) for c in opaque), base.whereClause
            )
            rest = [e for e in _conjuncts(node.whereClause) if not any(e is c.source for c in opaque)]
            node.whereClause = rest[0] if len(rest) == 1 else _all(*rest) if rest else None
    node.withClause = new.withClause
    node.fromClause = new.fromClause
    _Shorten()(node)  # schema.t.c names the subquery's columns as t.c
    return True


def _key_condition(expr: Any, name: str, table: CowTable, *, qualified: bool) -> _KeyCondition | None:
    """``expr`` as a restriction of one key column by expressions of no column (a copy naming the column
    bare, for the versions CTE), else None."""
    if not isinstance(expr, ast.A_Expr) or _operator(expr) is None:
        return None
    kind, op = expr.kind, _operator(expr)
    rexpr: Any = expr.rexpr
    flipped = False
    column = _key_column(expr.lexpr, name, table, qualified=qualified)
    if column is None and kind == A_Expr_Kind.AEXPR_OP:
        column, rexpr, flipped = _key_column(rexpr, name, table, qualified=qualified), expr.lexpr, True
    if column is None:
        return None
    if kind == A_Expr_Kind.AEXPR_OP and op in _BOUNDS:
        bound = _BOUNDS[_FLIPPED[op] if flipped else op]
    elif (kind in (A_Expr_Kind.AEXPR_IN, A_Expr_Kind.AEXPR_OP_ANY) and op == "=") or (
        kind in (A_Expr_Kind.AEXPR_BETWEEN, A_Expr_Kind.AEXPR_BETWEEN_SYM)
    ):
        bound = "both"
    else:
        return None
    values = tuple(rexpr) if isinstance(rexpr, (list, tuple)) else (rexpr,)
    if not all(_plain_condition(v) for v in values):
        return None
    params: list[Any] = []

    class Params(Visitor):
        def visit_ParamRef(self, _: Any, ref: Any) -> None:
            params.append(ref)

    Params()(values)
    bare = ast.ColumnRef(fields=(ast.String(sval=column),))
    new = copy.deepcopy(expr)
    if flipped:
        new.rexpr = bare
    else:
        new.lexpr = bare
    ranged = kind in (A_Expr_Kind.AEXPR_BETWEEN, A_Expr_Kind.AEXPR_BETWEEN_SYM) or op != "="
    return _KeyCondition(new, column, bound, bool(params), expr, ranged)


def _key_column(node: Any, name: str, table: CowTable, *, qualified: bool) -> str | None:
    """The key column ``node`` names (``c``, ``t.c``, ``s.t.c``), else None."""
    if not isinstance(node, ast.ColumnRef) or not _plain_condition(node, name, table, qualified=qualified):
        return None
    column = getattr((node.fields or (None,))[-1], "sval", None)
    return column if column in table.key else None


def _only_own_columns(node: Any, name: str, table: CowTable, *, qualified: bool) -> bool:
    """Whether every column reference of a one-table SELECT names one of ``table``'s columns (``*`` and
    ``t.*`` as targets too), with no subquery: no whole-row reference, system column or outer scope."""
    stars = {("*",), (name, "*")} | (
        {(s, name, "*") for s in (table.schema, table.overlay_schema)} if qualified else set()
    )

    def foreign(ref: Any) -> bool:
        return not _plain_condition(ref, name, table, qualified=qualified)

    for target in node.targetList:
        ref = target.val
        fields = tuple(
            "*" if isinstance(f, ast.A_Star) else getattr(f, "sval", None)
            for f in getattr(ref, "fields", None) or ()
        )
        if not (isinstance(ref, ast.ColumnRef) and fields in stars) and _subquery_or_column(target, foreign):
            return False
    if any(part and _subquery_or_column(part, foreign) for part in (node.whereClause, node.sortClause)):
        return False
    return _plain_condition(node.limitCount) and _plain_condition(node.limitOffset)


class _OpaqueParams(Visitor):
    """Each ``$n`` written ``(SELECT $n)``: the same value, which the planner does not see when it plans
    (an initplan's output), in custom plans as in the generic one."""

    def visit_ParamRef(self, _: Any, ref: Any) -> Any:
        return _parse(f"SELECT (SELECT ${ref.number})").targetList[0].val


class _Shorten(Visitor):
    """``schema.table.column`` written ``table.column``, where the table became a subquery of that name."""

    def visit_ColumnRef(self, _: Any, node: Any) -> None:
        if len(node.fields or ()) == 3:
            node.fields = tuple(node.fields[1:])


class _Placeholders(Visitor):
    """Replaces the template's one-word column references named in ``values`` with copies of the client's
    expressions (NULL for a missing one)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values

    def visit_ColumnRef(self, _: Any, node: Any) -> Any:
        fields = [getattr(f, "sval", None) for f in node.fields or ()]
        if len(fields) == 1 and fields[0] in self.values:
            value = self.values[fields[0]]
            return copy.deepcopy(value) if value is not None else ast.A_Const(isnull=True)
        return None


def _unqualified(where: Any) -> Any:
    """A copy of ``where`` with ``schema.table.column`` written ``table.column`` (each part names the table
    by its name, as an alias)."""
    where = copy.deepcopy(where)
    _Shorten()(where)
    return where


def _bare_select(node: Any) -> bool:
    """A SELECT with targets and one FROM item, and only WHERE, ORDER BY, LIMIT and OFFSET besides: no set
    operation, WITH, INTO, DISTINCT, GROUP BY, HAVING, window or locking clause."""
    return (
        isinstance(node, ast.SelectStmt)
        and node.op == SetOperation.SETOP_NONE
        and not (node.withClause or node.intoClause or node.distinctClause or node.groupClause)
        and not (node.havingClause or node.windowClause or node.lockingClause)
        and bool(node.targetList)
        and len(node.fromClause or ()) == 1
    )


def _function_name(call: Any) -> tuple[str | None, ...]:
    return tuple(getattr(n, "sval", None) for n in call.funcname or ())


def _plain_condition(
    where: Any, name: str = "", table: CowTable | None = None, *, qualified: bool = False
) -> bool:
    """Whether an expression reads only the FROM item's own columns (``c``, ``name.c``, and with
    ``qualified`` ``schema.name.c``; none without ``table``), constants, parameters and stable built-in
    functions: the same answer for a row wherever it is evaluated."""
    plain = True

    def own(fields: list[str | None]) -> bool:
        if table is None or fields[-1] is None or table.column(fields[-1]) is None:
            return False
        if len(fields) == 3:
            return qualified and fields[1] == name and fields[0] in (table.schema, table.overlay_schema)
        return len(fields) == 1 or (len(fields) == 2 and fields[0] == name)

    class Check(Visitor):
        def visit(self, _: Any, node: Any) -> Any:
            nonlocal plain
            if isinstance(node, ast.ColumnRef):
                plain = plain and own([getattr(f, "sval", None) for f in node.fields or ()])
                return Skip
            if isinstance(node, ast.FuncCall):
                names = _function_name(node)
                plain = plain and (
                    names[-1] in _STABLE_FUNCTIONS
                    and names[:-1] in ((), ("pg_catalog",))
                    and not (node.agg_star or node.agg_distinct or node.agg_order or node.agg_filter)
                    and node.over is None
                )
                return Skip if not plain else None
            if not isinstance(node, _PLAIN_EXPRESSION_NODES):
                plain = False
            return Skip if not plain else None

    if where is not None:
        Check()(where)
    return plain


def _own_columns(targets: Sequence[Any], item: Any, table: CowTable) -> bool:
    """Whether a target list holds only columns of ``table`` (FROM item ``item``) and stars."""
    name, qualified = _range_name(item), item.alias is None
    schemas = (table.schema, table.overlay_schema) if qualified else ()
    stars = {("*",), (name, "*"), *((schema, name, "*") for schema in schemas)}
    for target in targets:
        ref = target.val
        if not isinstance(ref, ast.ColumnRef):
            return False
        fields = tuple(
            "*" if isinstance(f, ast.A_Star) else getattr(f, "sval", None) for f in ref.fields or ()
        )
        if fields not in stars and not _plain_condition(ref, name, table, qualified=qualified):
            return False
    return True


def _first_range(node: Any) -> Any:
    """The RangeVar a SELECT's FROM tree starts with (through unaliased joins), else None."""
    first = node.fromClause[0]
    while isinstance(first, ast.JoinExpr):
        if first.alias is not None:
            return None
        first = first.larg
    return first if isinstance(first, ast.RangeVar) else None


_RESTRICTING = frozenset(
    (A_Expr_Kind.AEXPR_OP, A_Expr_Kind.AEXPR_OP_ANY, A_Expr_Kind.AEXPR_IN, A_Expr_Kind.AEXPR_BETWEEN)
)


def _conjuncts(expr: Any) -> Sequence[Any]:
    """The top-level AND terms of a condition (none for a missing one)."""
    if expr is None:
        return ()
    if isinstance(expr, ast.BoolExpr) and expr.boolop == BoolExprType.AND_EXPR:
        return expr.args or ()
    return (expr,)


def _operator(expr: Any) -> str | None:
    """The operator of an A_Expr (``=`` also for ``IN`` and ``= ANY``), when it is an unqualified one."""
    names = [getattr(n, "sval", None) for n in expr.name or ()]
    return names[0] if len(names) == 1 else None


def _keys(table: CowTable) -> list[tuple[str, ...]]:
    """The column sets that identify a row: the primary key and the plain unique indexes."""
    return [key for key in (table.pk, *(u.columns for u in table.unique if u.inferable)) if key]


def _range_name(node: Any) -> str:
    """The name a FROM item's columns are qualified with (its alias, else its table name)."""
    return str(node.alias.aliasname if node.alias is not None else node.relname)


def _qualifier(node: Any) -> str | None:
    """``t`` for a column reference ``t.c`` (``s.t.c`` too), else None."""
    if not isinstance(node, ast.ColumnRef):
        return None
    fields = [getattr(f, "sval", None) for f in node.fields or ()]
    return fields[-2] if len(fields) >= 2 and None not in fields else None


def _reads_relations(node: Any, names: set[str]) -> bool:
    """Whether ``node`` may read a column of the FROM items ``names`` (unqualified columns and subqueries
    count: conservative)."""
    return _subquery_or_column(node, lambda ref: _qualifier(ref) in names or len(ref.fields or ()) < 2)


def _subquery_or_column(node: Any, test: Callable[[Any], bool]) -> bool:
    """Whether ``node`` (or a list of nodes) holds a subquery, or a column reference for which ``test``
    holds."""
    found = False

    class Refs(Visitor):
        def visit_SubLink(self, _: Any, sub: Any) -> Any:
            nonlocal found
            found = True
            return Skip

        def visit_ColumnRef(self, _: Any, ref: Any) -> None:
            nonlocal found
            found = found or test(ref)

    if isinstance(node, (list, tuple)):
        return any(_subquery_or_column(item, test) for item in node)
    Refs()(node)
    return found


def _own_column(node: Any, name: str, table: CowTable) -> str | None:
    """The column of ``table`` (FROM item ``name``) that ``node`` is, if it is ``name.column``."""
    if not isinstance(node, ast.ColumnRef):
        return None
    fields = tuple(node.fields or ())
    if len(fields) != 2 or not all(isinstance(f, ast.String) for f in fields) or fields[0].sval != name:
        return None
    return fields[1].sval if table.column(fields[1].sval) is not None else None


def _expand_stars(targets: Sequence[Any], alias: str, columns: Sequence[str]) -> tuple[Any, ...]:
    """A RETURNING list with ``*`` / ``alias.*`` spelled out as the table's columns."""
    out: list[Any] = []
    for target in targets:
        fields: tuple[Any, ...] = tuple(getattr(target.val, "fields", None) or ())
        star = isinstance(target.val, ast.ColumnRef) and bool(fields) and isinstance(fields[-1], ast.A_Star)
        if star and (len(fields) == 1 or (len(fields) == 2 and getattr(fields[0], "sval", None) == alias)):
            out.extend(
                ast.ResTarget(val=ast.ColumnRef(fields=(ast.String(sval=alias), ast.String(sval=c))))
                for c in columns
            )
        else:
            out.append(target)
    return tuple(out)


def _cte_names(node: Any) -> frozenset[str]:
    names: set[str] = set()

    class Ctes(Visitor):
        def visit_CommonTableExpr(self, _: Any, cte: Any) -> None:
            names.add(cte.ctename)

    Ctes()(node)
    return frozenset(names)


# Statements whose schema-qualified CoW names are pointed at the overlay (DDL keeps the base tables).
_QUALIFIED_NAME_KINDS = (
    ast.SelectStmt,
    ast.InsertStmt,
    ast.UpdateStmt,
    ast.DeleteStmt,
    ast.MergeStmt,
    ast.CopyStmt,
    ast.ExplainStmt,
    ast.PrepareStmt,
    ast.DeclareCursorStmt,
)


class Rewriter:
    def __init__(
        self,
        catalog: Catalog,
        server_version_num: int,
        qualified: bool = True,
        on_conflicts: int | None = None,
        *,
        group_by: bool = True,
        lateral: bool = True,
        counts: bool = True,
        key_reads: bool = True,
        ctes: frozenset[str] | None = None,
        cached_plan: bool = False,
    ) -> None:
        """``qualified`` / ``on_conflicts``: what a cheaper walk already found (schema-qualified CoW names;
        ON CONFLICT inserts into CoW tables, nested included), so that big statements skip full visits."""
        self.catalog = catalog
        self.version = server_version_num
        self.qualified = qualified
        self.on_conflicts = on_conflicts
        self.group_by = group_by  # a SELECT groups a CoW table's rows (the walk found one)
        self.lateral = lateral  # a SELECT joins several CoW tables (the walk found one)
        self.counts = counts  # a SELECT counts the rows of a CoW table (the walk found one)
        self.key_reads = key_reads  # a top-level SELECT of one CoW table with WHERE (the walk found one)
        self.ctes = ctes  # the statement's CTE names, when the walk collected them
        self.cached_plan = cached_plan  # the text of a named prepared statement (key reads: _key_read)

    # -- entry -------------------------------------------------------------------------------------

    def rewrite(self, stmts: Sequence[Any], text: str | None = None) -> Outcome:
        """Rewrite parsed statements; with the source ``text``, unchanged statements keep their own text."""
        changed = False
        changed_at: set[int] = set()
        tag_map: tuple[str, str] | None = None
        mapped: set[int] = set()
        finals: list[Any] = []
        for index, raw in enumerate(stmts):
            node, node_changed, node_map = self._statement(raw.stmt)
            if node_changed:
                raw.stmt = node
                changed = True
                changed_at.add(index)
            if node_map is not None:
                # one tag_map serves the whole string; statements may share it (TRUNCATE a; TRUNCATE b)
                if tag_map is not None and node_map != tag_map:
                    raise _unsupported(
                        "two statements needing different command-tag fixes in one query string"
                    )
                tag_map = node_map
                mapped.add(index)
            finals.append(node)
        if tag_map is not None and len(finals) > 1:
            command = tag_map[0]
            if any(_command_of(n) == command for i, n in enumerate(finals) if i not in mapped):
                raise _unsupported(
                    f"a rewritten statement next to another {command} in one query string "
                    "(send it as a separate statement)"
                )
        if not changed:
            return Outcome(None, None)
        parts = []
        for index, raw in enumerate(stmts):
            if text is not None and index not in changed_at:
                # pglast gives the offsets in characters; stmt_len 0 means "to the end"
                end = raw.stmt_location + raw.stmt_len if raw.stmt_len else len(text)
                parts.append(text[raw.stmt_location : end].strip().rstrip(";").strip())
            else:
                parts.append(RawStream()(raw))
        # the newline ends a line comment the client's text may finish with, before the semicolon
        return Outcome("\n; ".join(parts), tag_map)

    def _statement(self, node: Any) -> tuple[Any, bool, tuple[str, str] | None]:
        self._refuse_ddl(node)
        hoisted = self._hoist_on_conflict_ctes(node) + self._wrapped_on_conflict(node)
        top_level = isinstance(node, ast.InsertStmt) and node.onConflictClause is not None
        handled = hoisted + (1 if top_level and self._cow(node.relation) else 0)
        if self.on_conflicts is None or self.on_conflicts > handled:
            self._refuse_nested_on_conflict(node)
        if isinstance(node, ast.MergeStmt):
            table = self._cow(node.relation)
            if table is not None and 0 < self.version < MERGE_ON_VIEWS:
                raise _unsupported(
                    f"MERGE into copy-on-write table {table.qualified} needs PostgreSQL 17 or later"
                )
        if isinstance(node, ast.ConstraintsSetStmt):
            return node, self._set_constraints(node), None
        if isinstance(node, ast.TruncateStmt):
            truncated = self._truncate(node)
            if truncated is not None:
                return truncated, True, ("DELETE", "TRUNCATE TABLE")
            return node, False, None
        tag_map = None
        changed = hoisted > 0
        if isinstance(node, ast.InsertStmt) and node.onConflictClause is not None:
            table = self._cow(node.relation)
            if table is not None:
                node, tag_map = self._on_conflict(node, table)
                changed = True
        if isinstance(node, ast.CopyStmt) and not node.is_from and node.relation is not None:
            table = self._cow(node.relation)
            if table is not None:
                self._copy_to(node, table)
                changed = True
        if self.group_by and isinstance(node, _QUALIFIED_NAME_KINDS):
            # before _Qualify: columns added for public.t are then pointed at the overlay with the rest
            keys = _GroupByKeys(self.catalog, self._ctes(node))
            keys(node)
            changed = changed or keys.changed
        if self.lateral and isinstance(node, _QUALIFIED_NAME_KINDS):
            # after _GroupByKeys, which only knows the columns of plain FROM items
            joins = _LateralJoins(self.catalog, self._ctes(node))
            joins(node)
            changed = changed or joins.changed
        if self.qualified and isinstance(node, _QUALIFIED_NAME_KINDS):
            qualify = _Qualify(self.catalog)
            qualify(node)
            changed = changed or qualify.changed
            if qualify.changed and isinstance(node, ast.MergeStmt) and 0 < self.version < MERGE_ON_VIEWS:
                # pglast deparses MERGE in PostgreSQL 17 syntax (WHEN NOT MATCHED BY TARGET)
                raise _unsupported(
                    "MERGE naming a copy-on-write table with its schema on PostgreSQL before 17 (use the "
                    "unqualified name)"
                )
        if self.counts and isinstance(node, _QUALIFIED_NAME_KINDS):
            # last: its parts name the base tables, which _Qualify would point at the overlay
            counts = _SplitCounts(self.catalog, self._ctes(node))
            counts(node)
            changed = changed or counts.changed
        if self.key_reads:
            # last too (same reason); a count split above no longer has the table as its FROM item
            select = node.query if isinstance(node, ast.ExplainStmt) else node  # EXPLAIN shows what runs
            changed = (
                _key_read(select, self.catalog, self._ctes(node), cached_plan=self.cached_plan) or changed
            )
        return node, changed, tag_map

    def _ctes(self, node: Any) -> frozenset[str]:
        """The statement's CTE names (which may shadow a CoW table's name)."""
        return self.ctes if self.ctes is not None else _cte_names(node)

    def _cow(self, relation: Any) -> CowTable | None:
        if relation is None:
            return None
        return self.catalog.lookup(relation.schemaname, relation.relname)

    # -- refusals ----------------------------------------------------------------------------------

    def _refuse_ddl(self, node: Any) -> None:
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
        elif isinstance(node, ast.DropStmt) and node.removeType == ObjectType.OBJECT_TABLE:
            for name in node.objects or ():
                parts = [p.sval for p in name if isinstance(p, ast.String)]
                relations.append(
                    ast.RangeVar(schemaname=parts[-2] if len(parts) > 1 else None, relname=parts[-1])
                )
        for relation in relations:
            table = self._cow(relation)
            if table is not None:
                raise RewriteError(
                    f"DDL on copy-on-write table {table.qualified} is not allowed inside a cowproxy session; "
                    "run it from a connection that is not in a session",
                    "0A000",
                )

    def _wrapped_on_conflict(self, node: Any) -> int:
        """Rewrites an ON CONFLICT insert under EXPLAIN or PREPARE in place; returns how many (0 or 1).

        EXPLAIN reports no row count, so any form serves; a prepared statement's tag comes with EXECUTE,
        where no tag fix can follow it, so only DO NOTHING (whose own tag is right) is allowed there."""
        if not isinstance(node, ast.ExplainStmt | ast.PrepareStmt):
            return 0
        query: Any = node.query
        table = self._cow(query.relation) if isinstance(query, ast.InsertStmt) else None
        if table is None or query.onConflictClause is None:
            return 0
        prepare = isinstance(node, ast.PrepareStmt)
        if prepare and query.onConflictClause.action == OnConflictAction.ONCONFLICT_UPDATE:
            raise _unsupported("PREPARE of INSERT ... ON CONFLICT DO UPDATE (the protocol's Parse works)")
        new, _ = self._on_conflict(query, table, nested=prepare)
        node.query = new
        return 1

    def _hoist_on_conflict_ctes(self, node: Any) -> int:
        """Rewrites ON CONFLICT inserts in the statement's WITH (the get-or-create idiom); data-modifying
        CTEs must be top-level, so the helpers are hoisted next to the CTE. Returns how many."""
        with_clause = getattr(node, "withClause", None)
        if with_clause is None:
            return 0
        count = 0
        ctes: list[Any] = []
        for cte in with_clause.ctes:
            query = cte.ctequery
            table = self._cow(query.relation) if isinstance(query, ast.InsertStmt) else None
            if table is not None and query.onConflictClause is not None:
                count += 1
                final, _ = self._on_conflict(query, table, suffix=f"_{count}", nested=True)
                ctes.extend(final.withClause.ctes)
                if final.withClause.recursive:
                    with_clause.recursive = True
                final.withClause = None
                cte.ctequery = final
            ctes.append(cte)
        if count:
            with_clause.ctes = tuple(ctes)
        return count

    def _refuse_nested_on_conflict(self, node: Any) -> None:
        rewriter = self

        class Nested(Visitor):
            def visit_InsertStmt(self, ancestors: Any, insert: Any) -> None:
                if insert is node or insert.onConflictClause is None:
                    return
                table = rewriter._cow(insert.relation)
                if table is not None:
                    raise _unsupported(
                        f"INSERT ... ON CONFLICT on {table.qualified} inside another statement"
                    )

        Nested()(node)

    # -- SET CONSTRAINTS ---------------------------------------------------------------------------

    def _set_constraints(self, node: Any) -> bool:
        """Adds ``cow_changes.<trigger>`` for each name that is a deferrable constraint of a CoW table.

        PostgreSQL resolves an unqualified name in the first schema on ``search_path`` that has a
        constraint of that name: in a session the app's own, which session writes never queue events for;
        the session's checks are the layer's constraint triggers of the same name in ``cow_changes``.
        Only existing triggers are added (an added unknown name would raise 42704); ``ALL``, unknown names
        and ``catalog.schema.name`` (PostgreSQL's 0A000) stay as they are."""
        names = list(node.constraints or ())
        present = {r.relname for r in names if r.schemaname == CHANGES_SCHEMA and not r.catalogname}
        added: list[Any] = []
        for relation in names:
            if relation.catalogname or relation.schemaname == CHANGES_SCHEMA:
                continue
            for trigger in self.catalog.constraint_triggers(relation.schemaname, relation.relname):
                if trigger not in present:
                    present.add(trigger)
                    added.append(
                        ast.RangeVar(schemaname=CHANGES_SCHEMA, relname=trigger, inh=True, relpersistence="p")
                    )
        if not added:
            return False
        node.constraints = tuple(names + added)
        return True

    # -- COPY TO -----------------------------------------------------------------------------------

    def _copy_to(self, node: Any, table: CowTable) -> None:
        if node.attlist:
            columns = [a.sval for a in node.attlist]
        else:  # COPY leaves generated columns out when no list is given
            columns = [c.name for c in table.columns if not c.generated]
        node.query = _parse(f"SELECT {', '.join(_q(c) for c in columns)} FROM {_overlay(table)}")
        node.relation = None
        node.attlist = None

    # -- TRUNCATE ----------------------------------------------------------------------------------

    def _truncate(self, node: Any) -> Any:
        tables: list[CowTable] = []
        others: list[str] = []
        for relation in node.relations or ():
            table = self._cow(relation)
            if table is None:
                others.append(relation.relname)
            elif table not in tables:
                tables.append(table)
        if not tables:
            return None
        if others:
            raise _unsupported(f"TRUNCATE of copy-on-write and other tables ({', '.join(others)}) together")
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
                child = self.catalog.table(ref.schema, ref.table)
                if not cascade:
                    # PostgreSQL's own check and message, raised whether or not rows exist
                    raise RewriteError(
                        "cannot truncate a table referenced in a foreign key constraint", "0A000"
                    )
                if child is None:
                    raise _unsupported(
                        f"TRUNCATE ... CASCADE reaching {ref.schema}.{ref.table}, which is not copy-on-write"
                    )
                members.add((child.schema, child.name))
                tables.append(child)
                pending.append(child)
        order = self._children_first(tables)
        # One statement, deletes chained so that each runs after the ones it depends on: a data-modifying
        # CTE referenced from a scalar subquery runs to completion before the statement reading it starts.
        ctes: list[str] = []
        previous = None
        for i, table in enumerate(order[:-1]):
            gate = f" WHERE (SELECT count(*) FROM {previous}) >= 0" if previous else ""
            ctes.append(f"cow_truncate_{i} AS (DELETE FROM {_overlay(table)}{gate} RETURNING 1)")
            previous = f"cow_truncate_{i}"
        gate = f" WHERE (SELECT count(*) FROM {previous}) >= 0" if previous else ""
        last = f"DELETE FROM {_overlay(order[-1])}{gate}"
        return _parse((f"WITH {', '.join(ctes)} " if ctes else "") + last)

    def _children_first(self, tables: list[CowTable]) -> list[CowTable]:
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

    # -- INSERT ... ON CONFLICT --------------------------------------------------------------------

    def _on_conflict(
        self, stmt: Any, table: CowTable, suffix: str = "", nested: bool = False
    ) -> tuple[Any, tuple[str, str] | None]:
        """The statement replacing ``stmt``; its WITH holds the helper CTEs (named with ``suffix``)."""
        rows, inp, upd, ins = (
            f"{n}{suffix}" for n in ("cow_rows", "cow_input", "cow_updated", "cow_inserted")
        )
        clause = stmt.onConflictClause
        alias = stmt.relation.alias.aliasname if stmt.relation.alias is not None else table.name
        columns, rows_select = self._conflict_input(stmt, table)
        keys = self._arbiters(clause, table, columns)
        view = _overlay(table)
        qalias = _q(alias)
        collisions = " AND ".join(
            f"NOT EXISTS (SELECT 1 FROM {view} AS cow_t WHERE {_match('cow_t', 'excluded', k)})" for k in keys
        )
        column_list = ", ".join(_q(c) for c in columns)
        picked = ", ".join(f"excluded.{_q(c)}" for c in columns)
        returning = stmt.returningClause

        if clause.action == OnConflictAction.ONCONFLICT_NOTHING:
            if len(keys) <= 1:
                # A row colliding with an earlier input row is skipped, as PostgreSQL does (it sees the rows
                # the same command inserted); with one key, the first of equal rows is the one inserted.
                earlier = " AND ".join(
                    f"NOT EXISTS (SELECT 1 FROM {rows} AS cow_e WHERE {_match('cow_e', 'excluded', k)} "
                    "AND cow_e.cow_ord < excluded.cow_ord)"
                    for k in keys
                )
                where = " AND ".join(w for w in (collisions, earlier) if w) or "true"
                sql = (
                    f"WITH {rows} AS (SELECT 1) INSERT INTO {view} AS {qalias} ({column_list}) "
                    f"SELECT {picked} FROM {rows} AS excluded WHERE {where} ORDER BY excluded.cow_ord"
                )
            else:
                # Several arbiters: a row skipped for one key must not block a later row on another, so
                # walk the rows in order, keeping the positions actually inserted (quadratic, only here).
                clash = " OR ".join(f"({_match('cow_e', 'excluded', k)})" for k in keys)
                walk = f"cow_walk{suffix}"
                sql = (
                    f"WITH RECURSIVE {rows} AS (SELECT 1), "
                    f"{walk} (cow_ord, cow_picked) AS (SELECT CAST(0 AS bigint), CAST(ARRAY[] AS bigint[]) "
                    "UNION ALL SELECT CAST(excluded.cow_ord AS bigint), "
                    f"CASE WHEN {collisions} AND NOT EXISTS (SELECT 1 "
                    f"FROM {rows} AS cow_e WHERE cow_e.cow_ord = ANY (cow_w.cow_picked) AND ({clash})) "
                    "THEN cow_w.cow_picked || CAST(excluded.cow_ord AS bigint) ELSE cow_w.cow_picked END "
                    f"FROM {walk} AS cow_w JOIN {rows} AS excluded ON excluded.cow_ord = cow_w.cow_ord + 1) "
                    f"INSERT INTO {view} AS {qalias} ({column_list}) SELECT {picked} "
                    f"FROM {rows} AS excluded, "
                    f"(SELECT cow_picked FROM {walk} ORDER BY cow_ord DESC LIMIT 1) AS cow_final "
                    "WHERE excluded.cow_ord = ANY (cow_final.cow_picked) ORDER BY excluded.cow_ord"
                )
            new = _parse(sql)
            new.withClause.ctes[0].ctequery = rows_select
            new.returningClause = returning
            new.override = stmt.override
            self._prepend_ctes(new, stmt)
            return new, None

        key = keys[0]
        # Two input rows on the same key: PostgreSQL raises 21000 (the row would be affected twice); a
        # scalar subquery returning more than one row raises the same SQLSTATE.
        twice = (
            f"(SELECT 1 FROM {rows} AS cow_a JOIN {rows} AS cow_b ON "
            f"{_match('cow_a', 'cow_b', key)} AND cow_a.cow_ord <> cow_b.cow_ord)"
        )
        update = (
            f"UPDATE {view} AS {qalias} SET cow_placeholder = 1 FROM {inp} AS excluded "
            f"WHERE {_match(qalias, 'excluded', key)}"
        )
        insert = (
            f"INSERT INTO {view} AS {qalias} ({column_list}) SELECT {picked} FROM {inp} AS excluded "
            f"WHERE {collisions} ORDER BY excluded.cow_ord"
        )
        head = (
            f"WITH {rows} AS (SELECT 1), "
            f"{inp} AS (SELECT * FROM {rows} WHERE {twice} IS NULL), "
            f"{upd} AS ({update} RETURNING 1)"
        )
        if returning is None and self.version >= MERGE_ON_VIEWS and not nested:
            # PostgreSQL 17 runs MERGE on the view: one statement whose count is inserted + updated rows.
            # MATERIALIZED: inlined into MERGE, the scalar subquery trips a planner bug in PostgreSQL 18
            # ("wrong varnullingrels", XX000).
            new = _parse(
                f"WITH {rows} AS (SELECT 1), "
                f"{inp} AS MATERIALIZED (SELECT * FROM {rows} WHERE {twice} IS NULL) "
                f"MERGE INTO {view} AS {qalias} USING {inp} AS excluded "
                f"ON {_match(qalias, 'excluded', key)} "
                "WHEN MATCHED THEN UPDATE SET cow_placeholder = 1 "
                f"WHEN NOT MATCHED THEN INSERT ({column_list}) VALUES ({picked})"
            )
            new.withClause.ctes[0].ctequery = rows_select
            matched, not_matched = new.mergeWhenClauses
            matched.targetList = clause.targetList
            matched.condition = clause.whereClause
            not_matched.override = stmt.override
            self._prepend_ctes(new, stmt)
            return new, ("MERGE", "INSERT 0")
        if returning is None:
            # Without RETURNING the INSERT is the statement, so no rows reach the client; its tag counts
            # the inserted rows only (see docs/rewrites.md).
            new = _parse(f"{head} {insert}")
            insert_node = new
            update_node = new.withClause.ctes[2].ctequery
            update_node.returningClause = None
            tag_map = None
        else:
            # Both parts return whole rows with the input position, so the client's RETURNING list is
            # evaluated once over them in input order, as PostgreSQL returns them (inserted rows find
            # their position through the conflict key they were inserted with).
            new = _parse(
                f"{head}, {ins} AS ({insert} RETURNING {qalias}.*) "
                f"SELECT 1 FROM (SELECT * FROM {upd} UNION ALL SELECT cow_i.cow_ord, cow_r.* "
                f"FROM {ins} AS cow_r LEFT JOIN {inp} AS cow_i ON {_match('cow_r', 'cow_i', key)}) "
                f"AS {qalias} ORDER BY {qalias}.cow_ord"
            )
            insert_node = new.withClause.ctes[3].ctequery
            update_node = new.withClause.ctes[2].ctequery
            update_node.returningClause = _parse(
                f"UPDATE x SET y = 1 RETURNING excluded.cow_ord, {qalias}.*"
            ).returningClause
            # pglast 8 wraps RETURNING in a ReturningClause (PostgreSQL 18), earlier versions give the list
            exprs = getattr(returning, "exprs", returning)
            new.targetList = _expand_stars(exprs, alias, [c.name for c in table.columns])
            tag_map = ("SELECT", "INSERT 0")
        new.withClause.ctes[0].ctequery = rows_select
        insert_node.override = stmt.override
        # SET and WHERE keep the client's names: with the input aliased EXCLUDED, a bare column name is
        # ambiguous exactly where PostgreSQL's ON CONFLICT finds it ambiguous (42702).
        update_node.targetList = clause.targetList
        if clause.whereClause is not None:
            update_node.whereClause = _and(update_node.whereClause, clause.whereClause)
        self._prepend_ctes(new, stmt)
        return new, tag_map

    @staticmethod
    def _prepend_ctes(new: Any, stmt: Any) -> None:
        if stmt.withClause is not None:
            new.withClause.ctes = tuple(stmt.withClause.ctes) + tuple(new.withClause.ctes)
            new.withClause.recursive = bool(stmt.withClause.recursive or new.withClause.recursive)

    def _conflict_input(self, stmt: Any, table: CowTable) -> tuple[list[str], Any]:
        """The INSERT's columns, and a SELECT of its rows as (cow_ord, columns...) typed like the table."""
        if stmt.cols:
            if any(rt.indirection for rt in stmt.cols):
                raise _unsupported("INSERT ... ON CONFLICT into subfields or array elements")
            columns = [rt.name for rt in stmt.cols]
        else:
            columns = [c.name for c in table.columns]
        source = stmt.selectStmt
        if source is None:
            raise _unsupported("INSERT ... DEFAULT VALUES ON CONFLICT")
        plain_values = (
            source.valuesLists is not None
            and source.sortClause is None
            and source.limitCount is None
            and source.limitOffset is None
            and source.withClause is None
        )
        if plain_values:
            rows = [list(r) for r in source.valuesLists]
            width = len(rows[0])
            if width > len(columns):
                raise RewriteError("INSERT has more expressions than target columns", "42601")
            if not stmt.cols:
                columns = columns[:width]
            elif width > len(columns):
                raise RewriteError("INSERT has more expressions than target columns", "42601")
            elif width < len(columns):
                raise RewriteError("INSERT has more target columns than expressions", "42601")
            # A column that is DEFAULT in every row is left to the view's default; elsewhere DEFAULT
            # becomes the column's default expression, evaluated per row as PostgreSQL does (conflicting
            # rows included).
            keep = [j for j in range(width) if not all(isinstance(r[j], ast.SetToDefault) for r in rows)]
            keep = keep or list(
                range(width)
            )  # all DEFAULT: spell the defaults out rather than list no column
            for j in keep:
                if any(isinstance(r[j], ast.SetToDefault) for r in rows):
                    default = self._default_expr(table, columns[j])
                    for r in rows:
                        if isinstance(r[j], ast.SetToDefault):
                            r[j] = default
            columns = [columns[j] for j in keep]
            # EXCLUDED.col of a column the INSERT does not give is that column's default
            for name in self._excluded_extra(stmt.onConflictClause, table, columns):
                default = self._default_expr(table, name)
                for r in rows:
                    r.append(default)
                keep.append(len(rows[0]) - 1)
                columns.append(name)
            types = self._column_types(table, columns)
            lists = tuple(
                (
                    ast.A_Const(val=ast.Integer(ival=i + 1)),
                    *(
                        ast.TypeCast(arg=r[j], typeName=_type_name(t))
                        for j, t in zip(keep, types, strict=True)
                    ),
                )
                for i, r in enumerate(rows)
            )
            names = ", ".join(["cow_ord", *(_q(c) for c in columns)])
            select = _parse(f"SELECT * FROM (VALUES (1)) AS cow_v ({names})")
            select.fromClause[0].subquery.valuesLists = lists
            return columns, select
        if self._excluded_extra(stmt.onConflictClause, table, columns):
            raise _unsupported("EXCLUDED of a column an INSERT ... SELECT does not give")
        types = self._column_types(table, columns)
        casts = ", ".join(
            f"CAST(cow_s.{_q(c)} AS {t}) AS {_q(c)}" for c, t in zip(columns, types, strict=True)
        )
        select = _parse(
            f"SELECT row_number() OVER () AS cow_ord, {casts} FROM (SELECT 1) AS cow_s "
            f"({', '.join(_q(c) for c in columns)})"
        )
        select.fromClause[0].subquery = source
        return columns, select

    @staticmethod
    def _default_expr(table: CowTable, name: str) -> Any:
        column = table.column(name)
        if column is None:
            raise RewriteError(f'column "{name}" of relation "{table.name}" does not exist', "42703")
        if column.identity_always or column.generated:
            raise _unsupported(
                f"DEFAULT or EXCLUDED for {table.name}.{name} (generated) in INSERT ... ON CONFLICT"
            )
        # catalog SQL from pg_get_expr, not client text
        return _parse(f"SELECT {column.default or 'NULL'}").targetList[0].val

    @staticmethod
    def _excluded_extra(clause: Any, table: CowTable, columns: list[str]) -> list[str]:
        """Columns of the table that the DO UPDATE reads from EXCLUDED but the INSERT does not give."""
        if clause is None or clause.action != OnConflictAction.ONCONFLICT_UPDATE:
            return []
        found: list[str] = []

        class Refs(Visitor):
            def visit_ColumnRef(self, _: Any, node: Any) -> None:
                fields: tuple[Any, ...] = tuple(node.fields or ())
                if len(fields) != 2 or not all(isinstance(f, ast.String) for f in fields):
                    return
                name = str(fields[1].sval)
                if (
                    fields[0].sval == "excluded"
                    and name not in columns
                    and name not in found
                    and table.column(name) is not None
                ):
                    found.append(name)

        refs = Refs()
        if clause.targetList:
            refs(clause.targetList)
        if clause.whereClause is not None:
            refs(clause.whereClause)
        return found

    @staticmethod
    def _column_types(table: CowTable, columns: list[str]) -> list[str]:
        types = []
        for name in columns:
            column = table.column(name)
            if column is None:
                raise RewriteError(f'column "{name}" of relation "{table.name}" does not exist', "42703")
            types.append(column.type)
        return types

    @staticmethod
    def _arbiters(clause: Any, table: CowTable, columns: list[str]) -> list[UniqueKey]:
        infer = clause.infer
        if infer is None and clause.action == OnConflictAction.ONCONFLICT_UPDATE:
            raise RewriteError(
                "ON CONFLICT DO UPDATE requires inference specification or constraint name", "42601"
            )
        if infer is None:  # DO NOTHING without a target: every unique index arbitrates
            keys = [k for k in table.unique if k.inferable and all(c in columns for c in k.columns)]
            if any(not k.inferable for k in table.unique):
                raise _unsupported(
                    "ON CONFLICT DO NOTHING without a target on a table with partial or expression "
                    "unique indexes"
                )
            return keys
        if infer.conname:
            found = [k for k in table.unique if k.is_constraint and k.name == infer.conname]
            if not found:
                raise RewriteError(
                    f'constraint "{infer.conname}" for table "{table.name}" does not exist', "42704"
                )
            keys = found
        else:
            if infer.whereClause is not None:
                raise _unsupported("ON CONFLICT with a partial-index predicate")
            names = []
            for elem in infer.indexElems or ():
                if elem.expr is not None or elem.collation or elem.opclass or elem.name is None:
                    raise _unsupported("ON CONFLICT on an expression, collation or operator class")
                names.append(elem.name)
            keys = [k for k in table.unique if k.inferable and set(k.columns) == set(names)][:1]
            if not keys:
                raise RewriteError(
                    "there is no unique or exclusion constraint matching the ON CONFLICT specification",
                    "42P10",
                )
        for key in keys:
            if not key.inferable:
                raise _unsupported("ON CONFLICT on a partial or expression unique index")
            missing = [c for c in key.columns if c not in columns]
            if missing:
                raise _unsupported(
                    f"ON CONFLICT whose conflict column {missing[0]} is not given by the INSERT"
                )
        return keys
