"""Key joins of several CoW tables become LATERAL subqueries, so each view is probed by index instead of
read whole (docs/rewrites.md, "Key joins of CoW tables")."""

from __future__ import annotations

from collections.abc import Sequence

from pglast import ast
from pglast.enums import (
    A_Expr_Kind,
    JoinType,
)
from pglast.visitors import Ancestor, Skip

from proxy.sql.catalog import Catalog, CowTable
from proxy.sql.jsontree import JsonNode, any_select, from_relations
from proxy.sql.rewrites.base import Context, Rule, Scan, Step
from proxy.sql.rewrites.nodes import (
    QUALIFIED_NAME_KINDS,
    Visit,
    conjuncts,
    first_range,
    operator_of,
    parse_select,
    qualifier,
    range_name,
    reads_relations,
)
from proxy.sql.rewrites.tables import (
    cow_range,
    row_keys,
)
from proxy.sql.visitor import Visitor


def _join_tree_ranges(from_clause: Sequence[ast.Node]) -> tuple[list[ast.RangeVar], list[ast.JoinExpr]]:
    """The RangeVars and the JoinExprs of a FROM list, through unaliased joins."""
    ranges: list[ast.RangeVar] = []
    joins: list[ast.JoinExpr] = []
    stack: list[ast.Node | None] = list(from_clause)
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


_TRUE = (parse_select("SELECT 1 FROM a JOIN b ON true").fromClause or ())[0].quals


_RESTRICTING = frozenset(
    (A_Expr_Kind.AEXPR_OP, A_Expr_Kind.AEXPR_OP_ANY, A_Expr_Kind.AEXPR_IN, A_Expr_Kind.AEXPR_BETWEEN)
)


def _own_column(node: object, name: str, table: CowTable) -> str | None:
    """The column of ``table`` (FROM item ``name``) that ``node`` is, if it is ``name.column``."""
    if not isinstance(node, ast.ColumnRef):
        return None
    fields = tuple(node.fields or ())
    if len(fields) != 2 or not all(isinstance(f, ast.String) for f in fields) or fields[0].sval != name:
        return None
    return fields[1].sval if table.column(fields[1].sval) is not None else None


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

    def visit_SelectStmt(self, _: Ancestor, node: ast.SelectStmt) -> None:
        if node.lockingClause or not node.fromClause or len(node.fromClause) != 1:
            return
        ranges, joins = _join_tree_ranges(node.fromClause)
        tables = sum(cow_range(self.catalog, self.ctes, r) is not None for r in ranges)
        if tables < 2:
            return
        driver = self._driver(node, ranges)
        if driver == "pinned" or (
            driver == "restricted" and (tables >= LATERAL_MIN_TABLES or self._dwarfed(node, ranges))
        ):
            for join in joins:
                self._lateral(join)

    def _dwarfed(self, node: ast.SelectStmt, ranges: Sequence[ast.RangeVar]) -> bool:
        """Whether the first relation is a CoW table that every other CoW table of the join outsizes by
        LATERAL_SIZE_RATIO (row estimates from the catalog; an unanalyzed table does not count)."""
        first = first_range(node)
        driver = cow_range(self.catalog, self.ctes, first) if first is not None else None
        if driver is None or driver.rows < 0:
            return False
        others = [cow_range(self.catalog, self.ctes, r) for r in ranges if r is not first]
        return all(t is None or t.rows >= LATERAL_SIZE_RATIO * max(driver.rows, 1.0) for t in others)

    def _driver(self, node: ast.SelectStmt, ranges: Sequence[ast.RangeVar]) -> str:
        """How the first relation of the join tree is restricted: "pinned" (equality or IN on a whole key:
        a few rows), "restricted" (a WHERE condition compares one of its columns with values, or a LIMIT
        with no ORDER BY beyond it), else "open".

        Each joined row costs a probe per join, as on the plain tables; a filter on a later relation would
        make every row of the first one probe (a query counting rows by a condition on the last table of a
        chain went from 0.25 s to 2.5 s that way), so those are left as written.
        """
        driver = first_range(node)
        if driver is None:
            return "open"
        names = {range_name(r) for r in ranges}
        name = range_name(driver)
        restricted = node.limitCount is not None and all(
            qualifier(sort.node) == name for sort in node.sortClause or ()
        )
        pinned: set[str] = set()
        for conjunct in conjuncts(node.whereClause):
            if not isinstance(conjunct, ast.A_Expr) or conjunct.kind not in _RESTRICTING:
                continue
            sides = (conjunct.lexpr, conjunct.rexpr)  # rexpr: a list for IN and BETWEEN
            for column, values in (sides, sides[::-1]):
                if (
                    isinstance(column, ast.ColumnRef)
                    and qualifier(column) == name
                    and values is not None
                    and not reads_relations(values, names)
                ):
                    restricted = True
                    if conjunct.kind != A_Expr_Kind.AEXPR_BETWEEN and operator_of(conjunct) == "=":
                        pinned.add((column.fields or ())[-1].sval)
        table = cow_range(self.catalog, self.ctes, driver)
        if table is not None and any(set(key) <= pinned for key in row_keys(table)):
            return "pinned"
        return "restricted" if restricted else "open"

    def _lateral(self, join: ast.JoinExpr) -> None:
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
        table = cow_range(self.catalog, self.ctes, rarg)
        if table is None:
            return
        name = range_name(rarg)
        quals = join.quals
        keyed: set[str] = set()
        for conjunct in conjuncts(quals):
            if not (
                isinstance(conjunct, ast.A_Expr)
                and conjunct.kind == A_Expr_Kind.AEXPR_OP
                and operator_of(conjunct) == "="
            ):
                continue
            for mine, other in ((conjunct.lexpr, conjunct.rexpr), (conjunct.rexpr, conjunct.lexpr)):
                column = _own_column(mine, name, table)
                if column is not None and other is not None and not reads_relations(other, {name}):
                    keyed.add(column)
        if not keyed & table.indexed and not any(set(key) <= keyed for key in row_keys(table)):
            return
        sub = parse_select("SELECT * FROM x OFFSET 0")
        sub.fromClause = (rarg,)
        sub.whereClause = quals
        join.rarg = ast.RangeSubselect(lateral=True, subquery=sub, alias=ast.Alias(aliasname=name))
        join.quals = _TRUE
        self.changed = True

    def visit_CreateFunctionStmt(self, _: Ancestor, node: ast.CreateFunctionStmt) -> Visit:
        return Skip


_RESTRICTING_KINDS = frozenset(kind.name for kind in _RESTRICTING)


def _first_range(select: JsonNode) -> JsonNode | None:
    """``first_range`` of a JSON SelectStmt: the relation its FROM starts with, through unaliased joins."""
    items = select.get("fromClause") or []
    first = items[0] if items else None
    while isinstance(first, dict) and "JoinExpr" in first:
        if first["JoinExpr"].get("alias") is not None:
            return None
        first = first["JoinExpr"].get("larg")
    if not isinstance(first, dict) or "RangeVar" not in first:
        return None
    relation: JsonNode = first["RangeVar"]
    return relation


def _json_range_name(relation: JsonNode) -> str | None:
    """``range_name`` of a JSON relation."""
    alias = relation.get("alias")
    return str(alias["aliasname"]) if alias else relation.get("relname")


def _first_range_name(select: JsonNode) -> str | None:
    """``range_name(first_range(…))`` of a JSON SelectStmt."""
    first = _first_range(select)
    return _json_range_name(first) if first is not None else None


def _json_qualifier(node: object) -> str | None:
    """``qualifier`` of a JSON node."""
    if not isinstance(node, dict) or "ColumnRef" not in node:
        return None
    fields = [f.get("String", {}).get("sval") for f in node["ColumnRef"].get("fields") or ()]
    return fields[-2] if len(fields) >= 2 and None not in fields else None


def _terms(select: JsonNode) -> list[object]:
    """``conjuncts`` of a JSON SelectStmt's WHERE."""
    where = select.get("whereClause")
    boolean = where.get("BoolExpr") if isinstance(where, dict) else None
    return (boolean.get("args") or []) if boolean and boolean.get("boolop") == "AND_EXPR" else [where]


def _may_drive(select: JsonNode) -> bool:
    """Whether ``_LateralJoins._driver`` may find the first relation pinned or restricted (a superset: a
    LIMIT, or a top-level condition comparing one of its columns)."""
    if select.get("limitCount") is not None:
        return True
    name = _first_range_name(select)
    if name is None:
        return False
    for term in _terms(select):
        expr = term.get("A_Expr") if isinstance(term, dict) else None
        if (
            expr is not None
            and expr.get("kind") in _RESTRICTING_KINDS
            and name in (_json_qualifier(expr.get("lexpr")), _json_qualifier(expr.get("rexpr")))
        ):
            return True
    return False


# The A_Expr kinds of a condition that may pin the first relation (``_driver``: BETWEEN restricts only).
_PINNING_KINDS = frozenset(kind.name for kind in _RESTRICTING if kind != A_Expr_Kind.AEXPR_BETWEEN)


def _may_pin(catalog: Catalog, select: JsonNode, first: JsonNode) -> bool:
    """Whether ``_driver`` may find the first relation "pinned" (a superset: ``=``, ``= ANY`` or ``IN`` on
    columns of it that cover a key of its table, whatever the other side reads)."""
    table = catalog.lookup(first.get("schemaname"), first.get("relname"))
    if table is None:
        return False
    name = _json_range_name(first)
    pinned: set[str] = set()
    for term in _terms(select):
        expr = term.get("A_Expr") if isinstance(term, dict) else None
        if expr is None or expr.get("kind") not in _PINNING_KINDS:
            continue
        operator = [n.get("String", {}).get("sval") for n in expr.get("name") or () if isinstance(n, dict)]
        if operator != ["="]:
            continue
        for side in (expr.get("lexpr"), expr.get("rexpr")):
            if name is not None and _json_qualifier(side) == name:
                assert isinstance(side, dict)  # (_json_qualifier: a ColumnRef)
                pinned.add(side["ColumnRef"]["fields"][-1]["String"]["sval"])
    return any(set(key) <= pinned for key in row_keys(table))


def _may_be_dwarfed(catalog: Catalog, first: JsonNode, relations: list[JsonNode]) -> bool:
    """Whether ``_dwarfed`` may hold (a superset: another CoW relation outsizes the first one)."""
    table = catalog.lookup(first.get("schemaname"), first.get("relname"))
    if table is None or table.rows < 0:
        return False
    others = (catalog.lookup(r.get("schemaname"), r.get("relname")) for r in relations if r is not first)
    return any(t is not None and t.rows >= LATERAL_SIZE_RATIO * max(table.rows, 1.0) for t in others)


def _may_change(scan: Scan, select: JsonNode) -> bool:
    """Whether the rule may change this SELECT (or set-operation member): one FROM item joining CoW tables,
    not locking rows, whose first relation a LIMIT or a condition on its columns may restrict; of two CoW
    tables only, one that a key may pin or the other may dwarf (``visit_SelectStmt``)."""
    if select.get("lockingClause") or len(select.get("fromClause") or ()) != 1 or not _may_drive(select):
        return False
    relations = from_relations(select.get("fromClause"))
    tables = sum(scan.cow(r) for r in relations)
    if tables >= LATERAL_MIN_TABLES:
        return True
    first = _first_range(select)
    return (
        tables == 2
        and first is not None
        and (_may_pin(scan.catalog, select, first) or _may_be_dwarfed(scan.catalog, first, relations))
    )


def detect(scan: Scan, node: JsonNode) -> bool:
    """A SELECT the rule may change (``_may_change``): the rule decides. (Django's joins filtered on a later
    relation, and its joins of two tables restricted by a column that is no key, most of those that woke the
    rule, need no parse for it.)"""
    return any_select(node, lambda s: _may_change(scan, s))


def apply(ctx: Context, node: ast.Node) -> Step | None:
    if not isinstance(node, QUALIFIED_NAME_KINDS):
        return None
    joins = _LateralJoins(ctx.catalog, ctx.ctes(node))
    joins(node)
    return Step(node) if joins.changed else None


# after group_by, which only knows the columns of plain FROM items
# (literal-blind: which relation drives and which joins are keyed follows from columns, operators and the
# catalog; a constant only counts as "not a column")
RULE = Rule("lateral", frozenset({"SelectStmt"}), detect, apply, literal_blind=True, literal_template=True)
