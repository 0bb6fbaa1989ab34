"""Typed helpers over pglast's AST nodes that several rules share: quoting, templates, conditions.

Templates are parsed SQL whose only variable parts are identifiers from the catalog (``quote``); the
client's expressions are spliced in as nodes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, TypeGuard, TypeVar, cast

import pglast
from pglast import ast
from pglast.enums import (
    BoolExprType,
    SetOperation,
)
from pglast.visitors import Ancestor, Skip

from proxy.sql.catalog import CowTable
from proxy.sql.visitor import Visitor


def quote(name: str) -> str:
    """A quoted identifier (names come from the catalog, never from client values)."""
    return '"' + name.replace('"', '""') + '"'


_T = TypeVar("_T")
_N = TypeVar("_N", bound=ast.Node)

# What a visitor method returns: Skip (do not walk below this node), a replacement node, or None (go on).
Visit = type[Skip] | ast.Node | None

# A node or a node list (pglast's list fields are tuples; rules build lists too).
NodeOrNodes = ast.Node | Sequence[ast.Node]


def copy_tree(node: _T) -> _T:
    """An independent copy of an AST subtree, equal to ``copy.deepcopy``'s but about ten times cheaper: each
    field is set without the pickle protocol and without ``Node.__setattr__``'s checks (the values are
    already checked), and the printer's ``ancestors`` back-links are left out (the printer sets them again;
    deepcopy would copy the whole tree above the node once they are set)."""
    return cast(_T, _copy(node))


def _copy(node: object) -> object:
    if isinstance(node, ast.Node):
        kind: Any = type(node)  # its __slots__ name every field (pglast's stubs do not declare them)
        new = object.__new__(kind)
        for name in kind.__slots__:
            value = getattr(node, name, _MISSING)
            if value is not _MISSING:
                object.__setattr__(new, name, _copy(value))
        return new
    if isinstance(node, tuple):
        return tuple(_copy(item) for item in node)
    if isinstance(node, list):
        return [_copy(item) for item in node]
    return node  # str, int, float, bool, None and enums: immutable


_MISSING = object()


def parse_as(kind: type[_N], sql: str) -> _N:
    """The one statement of a template, which is a ``kind`` (a template's own text fixes it): a copy of the
    text's parse, which is kept (``_parsed``), since the rules edit what they get."""
    node = _parsed(sql)
    if not isinstance(node, kind):
        raise TypeError(f"template parsed as {type(node).__name__}, not {kind.__name__}")
    return copy_tree(node)


@lru_cache(maxsize=1024)
def _parsed(sql: str) -> ast.Node | None:
    # A template's text depends on the catalog's names and the rule only, so a shape's texts and every
    # text of a table share it; a copy of the tree is a fifth of pglast's parse (Node.__setattr__'s checks).
    return pglast.parse_sql(sql)[0].stmt


def parse_select(sql: str) -> ast.SelectStmt:
    return parse_as(ast.SelectStmt, sql)


def expression(sql: str) -> ast.Node:
    """The expression of a one-column ``SELECT expr`` template."""
    value = target(parse_select(sql), 0).val
    assert value is not None  # a ResTarget of a SELECT list always has its expression
    return value


def target(node: ast.SelectStmt, index: int) -> ast.ResTarget:
    item = (node.targetList or ())[index]
    assert isinstance(item, ast.ResTarget)
    return item


# Statements a template may give, with a WITH the rules fill in.
WithStatement = ast.SelectStmt | ast.InsertStmt | ast.UpdateStmt | ast.DeleteStmt | ast.MergeStmt


def template_with(node: WithStatement) -> ast.WithClause:
    """A template's WITH (its text has one)."""
    if node.withClause is None:
        raise TypeError(f"template {type(node).__name__} without WITH")
    return node.withClause


def only_cte(node: WithStatement, index: int = 0) -> ast.CommonTableExpr:
    """The ``index``-th CTE of a template's WITH."""
    cte = (template_with(node).ctes or ())[index]
    assert isinstance(cte, ast.CommonTableExpr)
    return cte


def cte_query(node: WithStatement, index: int, kind: type[_N]) -> _N:
    """The query of a template's ``index``-th CTE, which is a ``kind``."""
    query = only_cte(node, index).ctequery
    if not isinstance(query, kind):
        raise TypeError(f"template CTE {index} is {type(query).__name__}, not {kind.__name__}")
    return query


@lru_cache(maxsize=256)
def type_name(type_name: str) -> ast.TypeName:
    # Shared between trees: nothing edits TypeName nodes after they are spliced in.
    cast_ = expression(f"SELECT CAST(NULL AS {type_name})")
    assert isinstance(cast_, ast.TypeCast) and cast_.typeName is not None
    return cast_.typeName


def and_(left: ast.Node, right: ast.Node) -> ast.BoolExpr:
    return ast.BoolExpr(boolop=BoolExprType.AND_EXPR, args=(left, right))


def all_of(*conditions: ast.Node | None) -> ast.BoolExpr:
    """The conditions' top-level AND terms under one AND (as the parser builds ``a AND b AND c``)."""
    terms = tuple(term for condition in conditions for term in conjuncts(condition))
    return ast.BoolExpr(boolop=BoolExprType.AND_EXPR, args=terms)


def command_of(node: ast.Node) -> str | None:
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


# Statements whose schema-qualified CoW names are pointed at the overlay (DDL keeps the base tables).
QUALIFIED_NAME_KINDS = (
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


# Built-in functions that are immutable or stable: a count split into three parts evaluates its WHERE on each
# part, so a volatile function (random(), nextval()) could answer differently for the same row.
STABLE_FUNCTIONS = frozenset(
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
PLAIN_EXPRESSION_NODES = (
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


class Shorten(Visitor):
    """``schema.table.column`` written ``table.column``, where the table became a subquery of that name."""

    def visit_ColumnRef(self, _: Ancestor, node: ast.ColumnRef) -> None:
        fields = node.fields or ()
        if len(fields) == 3:
            node.fields = fields[1:]


def unqualified(where: ast.Node) -> ast.Node:
    """A copy of ``where`` with ``schema.table.column`` written ``table.column`` (each part names the table
    by its name, as an alias)."""
    where = copy_tree(where)
    Shorten()(where)
    return where


def bare_select(node: ast.Node | None) -> TypeGuard[ast.SelectStmt]:
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


def function_name(call: ast.FuncCall) -> tuple[str | None, ...]:
    return tuple(getattr(n, "sval", None) for n in call.funcname or ())


def plain_condition(
    where: ast.Node | None, name: str = "", table: CowTable | None = None, *, qualified: bool = False
) -> bool:
    """Whether an expression reads only the FROM item's own columns (``c``, ``name.c``, and with
    ``qualified`` ``schema.name.c``; none without ``table``), constants, parameters and stable built-in
    functions: the same answer for a row wherever it is evaluated."""
    if where is None:
        return True
    check = _PlainCheck(name, table, qualified)
    check(where)
    return check.plain


def own_column(ref: ast.ColumnRef, name: str, table: CowTable | None, *, qualified: bool = False) -> bool:
    """Whether a column reference names a column of the FROM item ``name`` of ``table`` (plain_condition's
    answer for a lone column reference, without its walk)."""
    fields = [getattr(f, "sval", None) for f in ref.fields or ()]
    if table is None or fields[-1] is None or table.column(fields[-1]) is None:
        return False
    if len(fields) == 3:
        return qualified and fields[1] == name and fields[0] in (table.schema, table.overlay_schema)
    return len(fields) == 1 or (len(fields) == 2 and fields[0] == name)


class _PlainCheck(Visitor):
    """plain_condition's walk (one class for all calls: pglast visitors cost most in their set-up)."""

    def __init__(self, name: str, table: CowTable | None, qualified: bool) -> None:
        self.name, self.table, self.qualified = name, table, qualified
        self.plain = True

    def visit(self, _: Ancestor, node: ast.Node) -> Visit:
        if isinstance(node, ast.ColumnRef):
            self.plain = self.plain and own_column(node, self.name, self.table, qualified=self.qualified)
            return Skip
        if isinstance(node, ast.FuncCall):
            names = function_name(node)
            self.plain = self.plain and (
                names[-1] in STABLE_FUNCTIONS
                and names[:-1] in ((), ("pg_catalog",))
                and not (node.agg_star or node.agg_distinct or node.agg_order or node.agg_filter)
                and node.over is None
            )
            return Skip if not self.plain else None
        if not isinstance(node, PLAIN_EXPRESSION_NODES):
            self.plain = False
        return Skip if not self.plain else None


def first_range(node: ast.SelectStmt) -> ast.RangeVar | None:
    """The RangeVar a SELECT's FROM tree starts with (through unaliased joins), else None."""
    items = node.fromClause or ()
    first = items[0] if items else None
    while isinstance(first, ast.JoinExpr):
        if first.alias is not None:
            return None
        first = first.larg
    return first if isinstance(first, ast.RangeVar) else None


def conjuncts(expr: ast.Node | None) -> Sequence[ast.Node]:
    """The top-level AND terms of a condition (none for a missing one)."""
    if expr is None:
        return ()
    if isinstance(expr, ast.BoolExpr) and expr.boolop == BoolExprType.AND_EXPR:
        return expr.args or ()
    return (expr,)


def operator_of(expr: ast.A_Expr) -> str | None:
    """The operator of an A_Expr (``=`` also for ``IN`` and ``= ANY``), when it is an unqualified one."""
    names = [getattr(n, "sval", None) for n in expr.name or ()]
    return names[0] if len(names) == 1 else None


def range_name(node: ast.RangeVar) -> str:
    """The name a FROM item's columns are qualified with (its alias, else its table name)."""
    return str(node.alias.aliasname if node.alias is not None else node.relname)


def qualifier(node: ast.Node | None) -> str | None:
    """``t`` for a column reference ``t.c`` (``s.t.c`` too), else None."""
    if not isinstance(node, ast.ColumnRef):
        return None
    fields = [getattr(f, "sval", None) for f in node.fields or ()]
    return fields[-2] if len(fields) >= 2 and None not in fields else None


def reads_relations(node: NodeOrNodes, names: set[str]) -> bool:
    """Whether ``node`` may read a column of the FROM items ``names`` (unqualified columns and subqueries
    count: conservative)."""
    return subquery_or_column(node, lambda ref: qualifier(ref) in names or len(ref.fields or ()) < 2)


def subquery_or_column(node: NodeOrNodes, test: Callable[[ast.ColumnRef], bool]) -> bool:
    """Whether ``node`` (or a list of nodes) holds a subquery, or a column reference for which ``test``
    holds."""
    if not isinstance(node, ast.Node):
        return any(subquery_or_column(item, test) for item in node)
    refs = _Refs(test)
    refs(node)
    return refs.found


class _Refs(Visitor):
    """subquery_or_column's walk (one class for all calls)."""

    def __init__(self, test: Callable[[ast.ColumnRef], bool]) -> None:
        self.test = test
        self.found = False

    def visit_SubLink(self, _: Ancestor, sub: ast.SubLink) -> Visit:
        self.found = True
        return Skip

    def visit_ColumnRef(self, _: Ancestor, ref: ast.ColumnRef) -> None:
        self.found = self.found or self.test(ref)


def cte_names(node: ast.Node) -> frozenset[str]:
    names: set[str] = set()

    class Ctes(Visitor):
        def visit_CommonTableExpr(self, _: Ancestor, cte: ast.CommonTableExpr) -> None:
            names.add(str(cte.ctename))

    Ctes()(node)
    return frozenset(names)
