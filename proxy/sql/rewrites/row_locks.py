"""``SELECT … FOR UPDATE / NO KEY UPDATE / SHARE / KEY SHARE [OF …] [NOWAIT | SKIP LOCKED]`` of CoW tables in
a session: every row it returns goes through the layer's ``cow.lock_rows``, which locks it for the session
(docs/rewrites.md, "Row locks"; the locks themselves: migrations/sql/functions/90_row_locks.sql).

PostgreSQL locks no row through an overlay view (its rows come from a ``UNION ALL``). The locking clause is
replaced by a call of the set-returning ``cow.lock_rows(<one output column>, <one lock per locked table>)``
in place of one output column: PostgreSQL evaluates it after ORDER BY and before LIMIT, as its own LockRows
node, so only the rows the LIMIT passes are locked and a row SKIP LOCKED skips is replaced by the next one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeGuard

from pglast import ast
from pglast.enums import JoinType, LimitOption, LockClauseStrength, SetOperation
from pglast.visitors import Ancestor, Skip

from proxy.errors import RewriteError
from proxy.sql.catalog import Catalog, CowTable
from proxy.sql.jsontree import JsonNode
from proxy.sql.rewrites.base import Context, Rule, Scan, Step
from proxy.sql.rewrites.nodes import QUALIFIED_NAME_KINDS, Visit, copy_tree
from proxy.sql.rewrites.tables import cow_range, unsupported
from proxy.sql.visitor import Visitor

_STRENGTH_SQL = {
    LockClauseStrength.LCS_FORKEYSHARE: "FOR KEY SHARE",
    LockClauseStrength.LCS_FORSHARE: "FOR SHARE",
    LockClauseStrength.LCS_FORNOKEYUPDATE: "FOR NO KEY UPDATE",
    LockClauseStrength.LCS_FORUPDATE: "FOR UPDATE",
}
# Built-in aggregates: PostgreSQL refuses FOR UPDATE with them (0A000), so a statement that calls one keeps
# its clause and gets that error. (A user-defined aggregate is not recognised: docs/rewrites.md.)
_AGGREGATES = frozenset(
    {
        "count", "sum", "avg", "min", "max", "array_agg", "string_agg", "bool_and", "bool_or", "every",
        "json_agg", "jsonb_agg", "json_object_agg", "jsonb_object_agg", "bit_and", "bit_or", "bit_xor",
        "stddev", "variance", "xmlagg", "percentile_cont", "percentile_disc", "mode", "range_agg",
    }
)  # fmt: skip


@dataclass
class _Item:
    """A FROM item: its names (alias or relation name), its CoW table (None: anything else), whether it is on
    the nullable side of an outer join, and whether a locking clause without OF passes over it."""

    names: tuple[str, ...]
    qualifier: tuple[str, ...]
    table: CowTable | None
    nullable: bool
    ignored: bool  # functions, CTE references: PostgreSQL locks nothing for them without OF
    renamed: bool = False  # ``t AS x(a, b)``
    strength: int = 0
    policy: int = 0


class _RowLocks(Visitor):
    def __init__(self, catalog: Catalog, ctes: frozenset[str]) -> None:
        self.catalog = catalog
        self.ctes = ctes
        self.changed = False
        self.merged = False  # the FROM has a JOIN USING or NATURAL JOIN: a bare * merges columns

    def visit_SelectStmt(self, _: Ancestor, node: ast.SelectStmt) -> None:
        clauses = tuple(node.lockingClause or ())
        if not clauses or _refused_by_postgres(node):
            return  # PostgreSQL's own error follows (the clause stays)
        items = self._items(node.fromClause or ())
        locked = _locked_items(clauses, items)
        if locked is None:
            return  # an OF name PostgreSQL does not find, or qualified: its error follows
        cow = [item for item in locked if item.table is not None]
        if not cow:
            return
        others = [item for item in locked if item.table is None]
        if others:
            names = ", ".join(o.names[0] if o.names else "a subquery" for o in others)
            raise unsupported(
                f"{_STRENGTH_SQL[clauses[0].strength]} of a CoW table together with a relation that is not "
                f"one ({names}); name the CoW tables with OF"
            )
        for item in cow:
            _check_lockable(item)
        node.lockingClause = None
        self.changed = True
        from_clause = tuple(node.fromClause or ())
        if len(from_clause) == 1 and isinstance(from_clause[0], ast.RangeVar) and len(cow[0].qualifier) == 1:
            _lock_in_subquery(node, cow[0])
            return
        args = [_lock_arg(item) for item in cow]
        _wrap_output_column(node, items, args, self.merged)

    def _items(self, from_clause: Sequence[ast.Node]) -> list[_Item]:
        items: list[_Item] = []
        self.merged = False
        stack: list[tuple[ast.Node | None, bool]] = [(f, False) for f in reversed(from_clause)]
        while stack:
            item, nullable = stack.pop()
            if isinstance(item, ast.JoinExpr) and item.alias is None:
                jointype = item.jointype
                self.merged = self.merged or bool(item.usingClause or item.isNatural)
                stack.append((item.rarg, nullable or jointype in (JoinType.JOIN_LEFT, JoinType.JOIN_FULL)))
                stack.append((item.larg, nullable or jointype in (JoinType.JOIN_RIGHT, JoinType.JOIN_FULL)))
            elif isinstance(item, ast.RangeVar):
                items.append(self._range_var(item, nullable))
            else:
                alias = getattr(item, "alias", None)
                names = (str(alias.aliasname),) if alias is not None else ()
                ignored = isinstance(item, ast.RangeFunction | ast.RangeTableFunc)
                items.append(_Item(names, (), None, nullable, ignored))
        return items

    def _range_var(self, node: ast.RangeVar, nullable: bool) -> _Item:
        relname = str(node.relname)
        is_cte = not node.schemaname and relname in self.ctes
        table = cow_range(self.catalog, self.ctes, node)
        if node.alias is not None:
            alias = str(node.alias.aliasname)
            return _Item((alias,), (alias,), table, nullable, is_cte, renamed=bool(node.alias.colnames))
        qualifier = (str(node.schemaname), relname) if node.schemaname else (relname,)
        return _Item((relname,), qualifier, table, nullable, is_cte)

    def visit_CreateFunctionStmt(self, _: Ancestor, node: ast.CreateFunctionStmt) -> Visit:
        return Skip


def _refused_by_postgres(node: ast.SelectStmt) -> bool:
    """Shapes PostgreSQL refuses to lock (DISTINCT, GROUP BY, HAVING, windows, aggregates, set operations)."""
    if node.op != SetOperation.SETOP_NONE or node.distinctClause or node.groupClause:
        return True
    if node.havingClause or node.windowClause:
        return True
    finder = _AggregateFinder()
    finder(ast.SelectStmt(targetList=node.targetList))
    return finder.found


class _AggregateFinder(Visitor):
    def __init__(self) -> None:
        self.found = False

    def visit_FuncCall(self, _: Ancestor, node: ast.FuncCall) -> None:
        name = node.funcname[-1].sval if node.funcname else ""
        if node.over is not None or node.agg_star or node.agg_distinct or name in _AGGREGATES:
            self.found = True

    def visit_SubLink(self, _: Ancestor, node: ast.SubLink) -> Visit:
        return Skip  # a subquery's aggregates are its own


def _locked_items(clauses: Sequence[ast.LockingClause], items: list[_Item]) -> list[_Item] | None:
    """The FROM items the clauses lock, each with its strongest strength and wait policy (as PostgreSQL
    combines clauses naming one relation twice)."""
    locked: dict[int, _Item] = {}
    for clause in clauses:
        if clause.lockedRels:
            targets = []
            for rel in clause.lockedRels:
                found = [i for i, item in enumerate(items) if str(rel.relname) in item.names]
                if rel.schemaname or len(found) != 1:
                    return None
                targets.append(found[0])
        else:
            targets = [i for i, item in enumerate(items) if not item.ignored]
        for index in targets:
            item = items[index]
            item.strength = max(item.strength, int(clause.strength or 0))
            item.policy = max(item.policy, int(clause.waitPolicy or 0))
            locked[index] = item
    return list(locked.values())


def _check_lockable(item: _Item) -> None:
    table = item.table
    assert table is not None
    strength = _STRENGTH_SQL[LockClauseStrength(item.strength)]
    if item.nullable:
        raise RewriteError(f"{strength} cannot be applied to the nullable side of an outer join", "0A000")
    if not table.key or table.changes_table is None:
        raise unsupported(f"{strength} of {table.qualified}, a table without a key")
    if item.renamed:
        raise unsupported(f"{strength} of {table.qualified} with column aliases")


def _call(name: str, *args: ast.Node) -> ast.FuncCall:
    return ast.FuncCall(funcname=(ast.String(sval="pg_catalog"), ast.String(sval=name)), args=args)


def _ref(*fields: str) -> ast.ColumnRef:
    return ast.ColumnRef(fields=tuple(ast.String(sval=f) for f in fields))


def _lock_arg(item: _Item) -> ast.FuncCall:
    """``jsonb_build_array('t<id>', strength, policy, jsonb_build_array(<key>), to_jsonb(<item>.*))``."""
    table = item.table
    assert table is not None and table.changes_table is not None
    key = _call("jsonb_build_array", *(_ref(*item.qualifier, column) for column in table.key))
    row = _call(
        "to_jsonb", ast.ColumnRef(fields=(*(ast.String(sval=f) for f in item.qualifier), ast.A_Star()))
    )
    return _call(
        "jsonb_build_array",
        ast.A_Const(val=ast.String(sval=table.changes_table)),
        ast.A_Const(val=ast.Integer(ival=item.strength)),
        ast.A_Const(val=ast.Integer(ival=item.policy)),
        key,
        row,
    )


_LOCKED = "_cow_locked"


def _lock_in_subquery(node: ast.SelectStmt, item: _Item) -> None:
    """One CoW table in the FROM: the rows come from a subquery that locks them and, after a wait, gives
    their new version (as PostgreSQL's EvalPlanQual), under the table's name; the WHERE is checked again
    on them outside, so a row the lock holder changed so that it no longer matches is left out::

        SELECT <select list> FROM (SELECT (_cow_locked).* FROM (SELECT cow.lock_row(t.*, …) AS _cow_locked
          FROM t WHERE <where> ORDER BY … LIMIT …) AS _cow_locked) AS t WHERE <where>
    """
    table = item.table
    assert table is not None and table.changes_table is not None
    key = _call("jsonb_build_array", *(_ref(*item.qualifier, column) for column in table.key))
    whole = ast.ColumnRef(fields=(*(ast.String(sval=f) for f in item.qualifier), ast.A_Star()))
    call = ast.FuncCall(
        funcname=(ast.String(sval="cow"), ast.String(sval="lock_row")),
        args=(
            whole,
            ast.A_Const(val=ast.String(sval=table.changes_table)),
            ast.A_Const(val=ast.Integer(ival=item.strength)),
            ast.A_Const(val=ast.Integer(ival=item.policy)),
            key,
        ),
    )
    inner = ast.SelectStmt(
        targetList=(ast.ResTarget(name=_LOCKED, val=call),),
        fromClause=node.fromClause,
        whereClause=node.whereClause,
        sortClause=node.sortClause,
        limitCount=node.limitCount,
        limitOffset=node.limitOffset,
        limitOption=node.limitOption,
        op=SetOperation.SETOP_NONE,
    )
    fields = ast.A_Indirection(arg=_ref(_LOCKED, _LOCKED), indirection=(ast.A_Star(),))
    rows = ast.SelectStmt(
        targetList=(ast.ResTarget(val=fields),),
        fromClause=(ast.RangeSubselect(subquery=inner, alias=ast.Alias(aliasname=_LOCKED)),),
        op=SetOperation.SETOP_NONE,
    )
    node.fromClause = (ast.RangeSubselect(subquery=rows, alias=ast.Alias(aliasname=item.names[0])),)
    node.whereClause = copy_tree(node.whereClause)
    node.sortClause = None
    node.limitCount = None
    node.limitOffset = None
    node.limitOption = LimitOption.LIMIT_OPTION_DEFAULT


def _is_star(node: ast.Node | None) -> TypeGuard[ast.ColumnRef]:
    return isinstance(node, ast.ColumnRef) and any(isinstance(f, ast.A_Star) for f in node.fields or ())


def _wrap_output_column(
    node: ast.SelectStmt, items: list[_Item], args: list[ast.FuncCall], merged: bool
) -> None:
    """Replace one output column ``e`` by ``cow.lock_rows(e, <args>)`` under e's own name."""
    targets = list(node.targetList or ())
    index = next(
        (i for i, t in enumerate(targets) if isinstance(t.val, ast.ColumnRef) and not _is_star(t.val)), None
    )
    if index is None:
        index = next((i for i, t in enumerate(targets) if _is_star(t.val)), None)
        if index is not None:
            targets[index : index + 1] = _expand_star(targets[index].val, items, merged)
    if index is None:
        index = 0 if targets else None
    if index is None:
        raise unsupported("a locking SELECT without output columns of a CoW table")
    target = targets[index]
    name = target.name or _column_name(target.val)
    original = target.val
    call = ast.FuncCall(
        funcname=(ast.String(sval="cow"), ast.String(sval="lock_rows")), args=(original, *args)
    )
    targets[index] = ast.ResTarget(name=name, val=call)
    node.targetList = tuple(targets)
    # ORDER BY that output column (by name or position) sorts by its expression, qualified (a bare name in
    # ORDER BY means the output column first): the lock runs after the sort
    for sort in node.sortClause or ():
        by = sort.node
        position = by.val.ival if isinstance(by, ast.A_Const) and isinstance(by.val, ast.Integer) else None
        fields = tuple(by.fields or ()) if isinstance(by, ast.ColumnRef) else ()
        named = len(fields) == 1 and _field(fields[0]) == name
        if position == index + 1 or named:
            sort.node = _qualified(original, items)


def _qualified(value: ast.Node, items: list[_Item]) -> ast.Node:
    """A copy of ``value``; a bare column name qualified by the one FROM item that has the column."""
    fields = tuple(value.fields or ()) if isinstance(value, ast.ColumnRef) else ()
    if len(fields) != 1:
        return copy_tree(value)
    column = _field(fields[0])
    found = [i for i in items if column and i.table is not None and i.table.column(column)]
    if len(found) != 1 or any(i.table is None for i in items):
        raise unsupported("a locking SELECT ordered by an output column of uncertain origin")
    return _ref(*found[0].qualifier, column or "")


def _field(field: object) -> str | None:
    return field.sval if isinstance(field, ast.String) else None


def _column_name(value: ast.Node | None) -> str:
    """The name PostgreSQL gives an output column without an alias (the common cases of FigureColname)."""
    if isinstance(value, ast.ColumnRef) and value.fields:
        return _field(value.fields[-1]) or "?column?"
    if isinstance(value, ast.FuncCall) and value.funcname:
        return _field(value.funcname[-1]) or "?column?"
    if isinstance(value, ast.TypeCast):
        inner = _column_name(value.arg)
        names = value.typeName.names if value.typeName is not None else None
        return inner if inner != "?column?" or not names else _field(names[-1]) or inner
    return "?column?"


def _expand_star(star: ast.ColumnRef, items: list[_Item], merged: bool) -> list[ast.ResTarget]:
    """``t.*`` (or ``*``) as the columns of CoW tables, when every relation it covers is one."""
    qualifier = tuple(_field(f) for f in (star.fields or ())[:-1])
    covered = [item for item in items if qualifier in (item.qualifier, item.names)] if qualifier else items
    if (not qualifier and merged) or not covered or any(i.table is None or i.renamed for i in covered):
        raise unsupported("a locking SELECT * of relations that are not CoW tables")
    return [
        ast.ResTarget(val=_ref(*item.qualifier, column.name))
        for item in covered
        if item.table is not None  # (all are: checked above)
        for column in item.table.columns
    ]


def detect(scan: Scan, node: JsonNode) -> bool:
    """A locking SELECT (its FROM may name a CoW table; apply decides)."""
    return bool(node.get("lockingClause"))


def apply(ctx: Context, node: ast.Node) -> Step | None:
    if not isinstance(node, QUALIFIED_NAME_KINDS):
        return None
    locks = _RowLocks(ctx.catalog, ctx.ctes(node))
    locks(node)
    return Step(node) if locks.changed else None


# before lateral (it knows the FROM items as written) and qualify (it points public.t at the overlay)
RULE = Rule("row_locks", frozenset({"SelectStmt"}), detect, apply, literal_template=True)
