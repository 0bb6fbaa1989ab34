"""Rule: catalog questions answered as outside a session (docs/rewrites.md, "Introspection").

In a session the physical ``search_path`` puts each enabled schema's overlay schema before it, so PostgreSQL's
name resolution finds the overlay views: ``current_schema()`` is the overlay schema, ``'books'::regclass`` the
view (no index, no constraint), ``pg_table_is_visible()`` hides the tables, ``pg_get_serial_sequence()`` is
NULL. Inside a session the proxy points these calls at the layer's functions of the same name in schema
``cow`` (migrations/sql/functions/80_introspection.sql), which answer with the application's own path; the
rest of the statement still reads the session's rows through the overlay views. Only calls are swapped, so
result columns keep their names (a cast of a constant becomes ``(SELECT cow.regclass('books'))``, whose
column PostgreSQL also names ``regclass``) and the statement its shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeGuard

from pglast import ast
from pglast.enums import BoolExprType, CoercionForm, SQLValueFunctionOp, SubLinkType
from pglast.visitors import Ancestor, Skip

from proxy.sql.jsontree import JsonNode, svals
from proxy.sql.rewrites.base import Context, Rule, Scan, Step
from proxy.sql.rewrites.nodes import Visit
from proxy.sql.visitor import Visitor

LAYER_SCHEMA = "cow"

# function name -> the argument counts the layer's function of the same name in schema cow takes
FUNCTIONS: dict[str, frozenset[int]] = {
    "current_schema": frozenset({0}),
    "current_schemas": frozenset({1}),
    "pg_table_is_visible": frozenset({1}),
    "pg_type_is_visible": frozenset({1}),
    "to_regclass": frozenset({1}),
    "to_regtype": frozenset({1}),
    "pg_get_serial_sequence": frozenset({2}),
    "pg_get_constraintdef": frozenset({1, 2}),
    "pg_get_triggerdef": frozenset({1, 2}),
    "pg_get_viewdef": frozenset({1, 2}),
    "setval": frozenset({2, 3}),
}
# casts of a name to these types resolve it on the search_path
CASTS = frozenset({"regclass", "regtype"})
# words whose absence proves that a statement asks none of the above (the analyzer's fast path)
WORDS = ("current_schema", "_visible", "to_reg", "regclass", "regtype", "serial_sequence", "constraintdef",
         "triggerdef", "viewdef", "setval", "search_path")  # fmt: skip


def function_name(names: list[str]) -> str | None:
    """The introspection function a call's (lower-cased) name denotes, else None."""
    if len(names) == 1 or (len(names) == 2 and names[0] == "pg_catalog"):
        return names[-1] if names[-1] in FUNCTIONS else None
    return None


def cast_type(names: list[str]) -> str | None:
    if len(names) == 1 or (len(names) == 2 and names[0] == "pg_catalog"):
        return names[-1] if names[-1] in CASTS else None
    return None


def shows_search_path(name: object) -> bool:
    return isinstance(name, str) and name.lower() == "search_path"


def _names(node: Sequence[ast.Node] | None) -> list[str]:
    return [str(n.sval).lower() for n in node or () if isinstance(n, ast.String)]


def _call(name: str, args: tuple[ast.Node, ...] = ()) -> ast.FuncCall:
    return ast.FuncCall(
        funcname=(ast.String(sval=LAYER_SCHEMA), ast.String(sval=name)),
        args=args or None,
        funcformat=CoercionForm.COERCE_EXPLICIT_CALL,
    )


def _scalar(expr: ast.Node) -> ast.SubLink:
    """``(SELECT expr)``: computed once per execution (an initplan), and named as ``expr`` is."""
    select = ast.SelectStmt(targetList=(ast.ResTarget(val=expr),))
    return ast.SubLink(subLinkType=SubLinkType.EXPR_SUBLINK, subselect=select)


def _constant(node: ast.Node | None) -> TypeGuard[ast.A_Const | ast.ParamRef]:
    return (isinstance(node, ast.A_Const) and isinstance(node.val, ast.String)) or isinstance(
        node, ast.ParamRef
    )


# ``pg_table_is_visible(x)`` as a conjunct of a WHERE or JOIN ... ON: written ``x IN (SELECT
# cow.visible_relations())``, one set per statement (a hashed subplan or a semi-join) instead of a change of
# path per row (~3.4 us a row on 15; Django's table list, at every flush, reaches ~2,400 rows at 800 tables).
# Only as a conjunct: there NULL (pg_table_is_visible of an oid without a relation) and false both drop the
# row; under NOT, OR, CASE or in a select list they differ, and the per-row call stays.
VISIBLE_SET = "visible_relations"
# Columns whose comparison with a constant pins a few relations (Django's per-table lookups ``c.relname =
# %s``, psql's ``\d books``): there the per-row call on those few rows is cheaper than the whole set (~2.5 ms
# at 800 tables, docs/benchmarks.md, "i16vis").
_PINNING = frozenset({"relname", "oid"})


def _fixed(node: ast.Node | None) -> bool:
    """A constant or parameter, possibly cast or given a collation (psql's patterns)."""
    while isinstance(node, ast.TypeCast | ast.CollateClause):
        node = node.arg
    return _constant(node) or (isinstance(node, ast.A_Const) and node.val is not None)


def _pins(expr: ast.Node) -> bool:
    """``x.relname <op> constant`` (or ``x.oid``), either way round."""
    if not isinstance(expr, ast.A_Expr):
        return False
    for column, other in ((expr.lexpr, expr.rexpr), (expr.rexpr, expr.lexpr)):
        fields = tuple(column.fields or ()) if isinstance(column, ast.ColumnRef) else ()
        pinned = fields and isinstance(fields[-1], ast.String) and fields[-1].sval in _PINNING
        if pinned and isinstance(other, ast.Node) and _fixed(other):
            return True
    return False


def _table_visibility(expr: ast.Node) -> ast.Node | None:
    """The argument of ``[pg_catalog.]pg_table_is_visible(x)``, else None; also None for a constant argument
    (``'books'::regclass``), which the per-row call answers once already."""
    if not isinstance(expr, ast.FuncCall) or function_name(_names(expr.funcname)) != "pg_table_is_visible":
        return None
    args = tuple(expr.args or ())
    arg = args[0] if len(args) == 1 and isinstance(args[0], ast.Node) else None
    if arg is None or _fixed(arg) or expr.agg_star or expr.over is not None or expr.agg_order:
        return None
    if expr.agg_filter or expr.func_variadic or expr.agg_distinct:
        return None
    return arg


def _membership(arg: ast.Node) -> ast.SubLink:
    """``arg IN (SELECT cow.visible_relations())``."""
    select = ast.SelectStmt(targetList=(ast.ResTarget(val=_call(VISIBLE_SET)),))
    return ast.SubLink(subLinkType=SubLinkType.ANY_SUBLINK, testexpr=arg, subselect=select)


def _visibility_as_set(clause: ast.Node | None) -> ast.Node | None:
    """The clause with its conjuncts ``pg_table_is_visible(x)`` written as membership tests, or None when it
    has none (or a conjunct pins a few relations)."""
    if clause is None:
        return None
    is_and = isinstance(clause, ast.BoolExpr) and clause.boolop == BoolExprType.AND_EXPR
    conjuncts: list[ast.Node] = []
    stack = [clause]
    while stack:  # AND trees flattened (the parser nests a AND b AND c only when parenthesised)
        node = stack.pop()
        if isinstance(node, ast.BoolExpr) and node.boolop == BoolExprType.AND_EXPR:
            stack.extend(reversed(tuple(node.args or ())))
        else:
            conjuncts.append(node)
    args = [_table_visibility(c) for c in conjuncts]
    if all(a is None for a in args) or any(_pins(c) for c in conjuncts):
        return None
    written = tuple(c if a is None else _membership(a) for c, a in zip(conjuncts, args, strict=True))
    if not is_and:
        return written[0]
    return ast.BoolExpr(boolop=BoolExprType.AND_EXPR, args=written)


class _Introspection(Visitor):
    def __init__(self) -> None:
        self.changed = False

    def _where(self, _: Ancestor, node: ast.SelectStmt | ast.UpdateStmt | ast.DeleteStmt) -> Visit:
        written = _visibility_as_set(node.whereClause)
        if written is not None:
            node.whereClause = written
            self.changed = True
        return None

    visit_SelectStmt = _where
    visit_UpdateStmt = _where
    visit_DeleteStmt = _where

    def visit_JoinExpr(self, _: Ancestor, node: ast.JoinExpr) -> Visit:
        written = _visibility_as_set(node.quals)
        if written is not None:
            node.quals = written
            self.changed = True
        return None

    def visit_FuncCall(self, _: Ancestor, node: ast.FuncCall) -> Visit:
        name = function_name(_names(node.funcname))
        args = tuple(node.args or ())
        if name is None or len(args) not in FUNCTIONS[name] or node.agg_star or node.over is not None:
            if self._current_setting(node):
                self.changed = True
                select = ast.SelectStmt(
                    targetList=(ast.ResTarget(name="current_setting", val=_call("app_search_path")),)
                )
                return ast.SubLink(subLinkType=SubLinkType.EXPR_SUBLINK, subselect=select)
            return None
        if node.agg_order or node.agg_filter or node.func_variadic:
            return None
        self.changed = True
        if all(_constant(a) for a in args):
            return _scalar(_call(name, args))
        # edited in place, so that the visitor goes on into the arguments (a replacement is not visited)
        node.funcname = _call(name).funcname
        node.funcformat = CoercionForm.COERCE_EXPLICIT_CALL
        return None

    @staticmethod
    def _current_setting(node: ast.FuncCall) -> bool:
        """``current_setting('search_path'[, missing_ok])``."""
        names = _names(node.funcname)
        args = tuple(node.args or ())
        return (
            names in (["current_setting"], ["pg_catalog", "current_setting"])
            and len(args) in (1, 2)
            and isinstance(args[0], ast.A_Const)
            and isinstance(args[0].val, ast.String)
            and shows_search_path(args[0].val.sval)
        )

    def visit_SQLValueFunction(self, _: Ancestor, node: ast.SQLValueFunction) -> Visit:
        if node.op == SQLValueFunctionOp.SVFOP_CURRENT_SCHEMA:
            self.changed = True
            return _scalar(_call("current_schema"))
        return None

    def visit_TypeCast(self, _: Ancestor, node: ast.TypeCast) -> Visit:
        type_name = node.typeName
        if type_name is None:
            return None
        target = cast_type(_names(type_name.names))
        if target is None or type_name.arrayBounds or not _constant(node.arg):
            return None
        self.changed = True
        return _scalar(_call(target, (node.arg,)))

    def visit_CreateFunctionStmt(self, _: Ancestor, node: ast.CreateFunctionStmt) -> Visit:
        return Skip


# The statements whose expressions are rewritten (DDL keeps PostgreSQL's own functions: a view or default
# made in a session would keep the layer's calls).
_STATEMENTS = (
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


def _json_names(items: object) -> list[str]:
    return [name.lower() for name in svals(items)]


def detect(scan: Scan, node: JsonNode) -> bool:
    """On the JSON walk: a call, cast, ``current_schema`` or ``SHOW`` this rule answers (a FuncCall, TypeCast,
    SQLValueFunction or VariableShowStmt node)."""
    if "funcname" in node:
        names = _json_names(node.get("funcname"))
        return function_name(names) is not None or names[-1:] == ["current_setting"]
    if "typeName" in node:
        return cast_type(_json_names(node.get("typeName", {}).get("names"))) is not None
    if "op" in node:
        return node.get("op") == "SVFOP_CURRENT_SCHEMA"
    return shows_search_path(node.get("name"))


def apply(ctx: Context, node: ast.Node) -> Step | None:
    """The statement with its introspection calls pointed at the layer. ``SHOW search_path`` becomes ``SELECT
    cow.app_search_path() AS search_path`` (tag ``SHOW``)."""
    if isinstance(node, ast.VariableShowStmt):
        if not shows_search_path(node.name):
            return None
        select = ast.SelectStmt(targetList=(ast.ResTarget(name="search_path", val=_call("app_search_path")),))
        return Step(select, tag_map=("SELECT", "SHOW"), final=True)
    if not isinstance(node, _STATEMENTS):
        return None
    outputs = _regclass_outputs(node)
    visitor = _Introspection()
    visitor(node)
    return Step(node) if visitor.changed or outputs else None


RULE = Rule(
    "introspection",
    frozenset({"FuncCall", "TypeCast", "SQLValueFunction", "VariableShowStmt"}),
    detect,
    apply,
    literal_template=True,  # reads a string only as a function's argument or cast to regclass (refused)
)


def _regclass_outputs(node: ast.Node) -> bool:
    """The statement's own result columns ``expr::regclass`` (an oid shown as a name: psql's "Referenced by")
    become ``cow.regclass_name(expr)``, the name as outside the session (as text), under the column name
    PostgreSQL gives the cast. Only result columns: elsewhere the value is compared as a regclass."""
    select = node.query if isinstance(node, ast.ExplainStmt | ast.DeclareCursorStmt) else node
    if not isinstance(select, ast.SelectStmt):
        return False
    changed = False
    stack = [select]
    while stack:
        current = stack.pop()
        stack.extend(s for s in (current.larg, current.rarg) if s is not None)
        for target in current.targetList or ():
            cast = target.val
            if not isinstance(cast, ast.TypeCast) or cast.typeName is None or cast.typeName.arrayBounds:
                continue
            if cast.arg is None:  # (the parser always sets it)
                continue
            if cast_type(_names(cast.typeName.names)) != "regclass":
                continue
            if target.name is None:
                target.name = "regclass" if _constant(cast.arg) else _column_name(cast.arg)
            oid = _scalar(_call("regclass", (cast.arg,))) if _constant(cast.arg) else cast.arg
            target.val = _call("regclass_name", (oid,))
            changed = True
    return changed


def _column_name(expr: ast.Node) -> str:
    """The name PostgreSQL gives ``expr::regclass`` (FigureColname: the column's or the function's, else the
    type's)."""
    fields = tuple(expr.fields or ()) if isinstance(expr, ast.ColumnRef) else ()
    if fields and isinstance(fields[-1], ast.String):
        return str(fields[-1].sval)
    if isinstance(expr, ast.FuncCall) and expr.funcname:
        return str(expr.funcname[-1].sval)
    return "regclass"
