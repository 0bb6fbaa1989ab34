"""Reads of a key, a few keys or a bounded key range of a CoW table read the base and changes tables
directly (docs/rewrites.md, "Key reads")."""

from __future__ import annotations

from dataclasses import dataclass

from pglast import ast
from pglast.enums import (
    A_Expr_Kind,
)
from pglast.visitors import Ancestor

from proxy.sql.catalog import Catalog, CowTable
from proxy.sql.jsontree import JsonNode, child, children
from proxy.sql.rewrites.base import STATEMENT, Context, Rule, Scan, Step
from proxy.sql.rewrites.nodes import (
    Shorten,
    Visit,
    all_of,
    bare_select,
    conjuncts,
    copy_tree,
    cte_query,
    expression,
    operator_of,
    own_column,
    parse_select,
    plain_condition,
    quote,
    range_name,
    subquery_or_column,
)
from proxy.sql.rewrites.tables import (
    CHANGES_SCHEMA,
    CURRENT_SESSION,
    base_readable,
)
from proxy.sql.visitor import Visitor

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

    expr: ast.A_Expr  # a copy naming the column bare
    column: str
    bound: str  # both | lower | upper
    has_param: bool
    source: ast.A_Expr  # the client's conjunct
    ranged: bool  # a range (BETWEEN, < <= > >=) rather than a set of values


def _key_read(node: ast.Node, catalog: Catalog, ctes: frozenset[str], *, cached_plan: bool = False) -> bool:
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
    if not bare_select(node):
        return False
    found = _key_read_table(node, catalog, ctes)
    if found is None:
        return False
    table, name, qualified = found
    conditions = _key_conditions(node, name, table, qualified=qualified)
    if conditions is None:
        return False
    new = _key_read_source(table, name, conditions)
    if cached_plan:
        _opaque_ranges(node, new, conditions)
    node.withClause = new.withClause
    node.fromClause = new.fromClause
    Shorten()(node)  # schema.t.c names the subquery's columns as t.c
    return True


def _key_read_table(
    node: ast.SelectStmt, catalog: Catalog, ctes: frozenset[str]
) -> tuple[CowTable, str, bool] | None:
    """(the table, its name in the statement, whether the statement names it unaliased) of a key read's only
    FROM item: a keyed CoW table without row security whose key types hash, read by its own columns only."""
    item = (node.fromClause or ())[0]  # bare_select: one FROM item
    if node.whereClause is None or not isinstance(item, ast.RangeVar):
        return None
    if not item.inh or (item.alias is not None and item.alias.colnames):
        return None
    table = base_readable(catalog, ctes, item)
    if (
        table is None
        or not table.key
        or table.changes_table is None
        or table.row_security
        or any(getattr(table.column(k), "type", None) not in _HASHED_KEY_TYPES for k in table.key)
    ):
        return None
    name = range_name(item)
    qualified = item.alias is None
    if name.startswith("_cow_") or not _only_own_columns(node, name, table, qualified=qualified):
        return None  # (an alias among the rewrite's own names)
    return table, name, qualified


def _key_conditions(
    node: ast.SelectStmt, name: str, table: CowTable, *, qualified: bool
) -> list[_KeyCondition] | None:
    """The WHERE's restrictions of key columns, when they bound every key column (one set of values, or a
    lower and an upper bound) and one of them has a parameter; else None."""
    conditions = [
        c
        for c in (_key_condition(e, name, table, qualified=qualified) for e in conjuncts(node.whereClause))
        if c is not None
    ]
    bounds = {(c.column, c.bound) for c in conditions}
    bounded = any((k, "both") in bounds or {(k, "lower"), (k, "upper")} <= bounds for k in table.key)
    if not bounded or not any(c.has_param for c in conditions):
        return None
    return conditions


def _hidden_base_rows(table: CowTable) -> str:
    """The base branch's condition: its rows the session holds no version of."""
    key = ", ".join(quote(k) for k in table.key)
    if table.changes_rows <= KEY_READ_HASHED_ROWS:  # -1: never analyzed, the planner counts pages
        # NOT IN of a NULL would hide every row; the layer keeps keys NOT NULL, this holds if one slipped in
        not_null = " AND ".join(f"{quote(k)} IS NOT NULL" for k in table.key)
        key_row = key if len(table.key) == 1 else f"({key})"
        return f"{key_row} NOT IN (SELECT {key} FROM {_VERSIONS} WHERE {not_null})"
    # An estimate beyond the hash memory would make NOT IN compare every base row with every version
    return (
        f"NOT EXISTS (SELECT FROM {_VERSIONS} AS _cow_v WHERE "
        + " AND ".join(f"_cow_v.{quote(k)} = _cow_b.{quote(k)}" for k in table.key)
        + ")"
    )


def _key_read_source(table: CowTable, name: str, conditions: list[_KeyCondition]) -> ast.SelectStmt:
    """``WITH _cow_versions AS MATERIALIZED (…) SELECT FROM (base UNION ALL versions) AS name``: the
    statement whose WITH and FROM replace the client's, the versions restricted by the key conditions."""
    cols = ", ".join(quote(c.name) for c in table.columns)
    changes = f"{CHANGES_SCHEMA}.{quote(str(table.changes_table))}"
    # The base branch's columns are the table's own (*): if app DDL on another connection changed them
    # since the catalog was read, the statement fails (the branches differ) instead of silently reading
    # the old columns, and the relay checks the catalog before its next rewritten statement.
    new = parse_select(
        f"WITH {_VERSIONS} AS MATERIALIZED (SELECT {cols}, _cow_deleted FROM {changes}"
        f" WHERE _cow_session = {CURRENT_SESSION} AND _cow_current)"
        f" SELECT FROM (SELECT _cow_b.* FROM {quote(table.schema)}.{quote(table.name)} AS _cow_b"
        f" WHERE {_hidden_base_rows(table)}"
        f" UNION ALL SELECT {cols} FROM {_VERSIONS} WHERE NOT _cow_deleted) AS {quote(name)}"
    )
    versions = cte_query(new, 0, ast.SelectStmt)
    versions.whereClause = all_of(versions.whereClause, *(c.expr for c in conditions))
    return new


def _opaque_ranges(node: ast.SelectStmt, new: ast.SelectStmt, conditions: list[_KeyCondition]) -> None:
    """For a cached plan: the key ranges with a parameter move from the client's WHERE into the base
    branch, each ``$n`` written ``(SELECT $n)``."""
    opaque = [c for c in conditions if c.ranged and c.has_param]
    if not opaque:
        return
    base = (new.fromClause or ())[0].subquery.larg  # the template's base branch
    base.whereClause = all_of(*(_OpaqueParams()(copy_tree(c.expr)) for c in opaque), base.whereClause)
    rest = [e for e in conjuncts(node.whereClause) if not any(e is c.source for c in opaque)]
    node.whereClause = rest[0] if len(rest) == 1 else all_of(*rest) if rest else None


def _key_condition(expr: ast.Node, name: str, table: CowTable, *, qualified: bool) -> _KeyCondition | None:
    """``expr`` as a restriction of one key column by expressions of no column (a copy naming the column
    bare, for the versions CTE), else None."""
    if not isinstance(expr, ast.A_Expr) or operator_of(expr) is None:
        return None
    kind, op = expr.kind, operator_of(expr)
    rexpr: ast.Node | tuple[ast.Node, ...] | None = expr.rexpr  # a list for IN and BETWEEN
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
    if not all(plain_condition(v) for v in values):
        return None
    params: list[ast.ParamRef] = []

    class Params(Visitor):
        def visit_ParamRef(self, _: Ancestor, ref: ast.ParamRef) -> None:
            params.append(ref)

    Params()(values)
    bare = ast.ColumnRef(fields=(ast.String(sval=column),))
    new = copy_tree(expr)
    if flipped:
        new.rexpr = bare
    else:
        new.lexpr = bare
    ranged = kind in (A_Expr_Kind.AEXPR_BETWEEN, A_Expr_Kind.AEXPR_BETWEEN_SYM) or op != "="
    return _KeyCondition(new, column, bound, bool(params), expr, ranged)


def _key_column(node: object, name: str, table: CowTable, *, qualified: bool) -> str | None:
    """The key column ``node`` names (``c``, ``t.c``, ``s.t.c``), else None."""
    if not isinstance(node, ast.ColumnRef) or not plain_condition(node, name, table, qualified=qualified):
        return None
    column = getattr((node.fields or (None,))[-1], "sval", None)
    return column if column in table.key else None


def _only_own_columns(node: ast.SelectStmt, name: str, table: CowTable, *, qualified: bool) -> bool:
    """Whether every column reference of a one-table SELECT names one of ``table``'s columns (``*`` and
    ``t.*`` as targets too), with no subquery: no whole-row reference, system column or outer scope."""
    stars = {("*",), (name, "*")} | (
        {(s, name, "*") for s in (table.schema, table.overlay_schema)} if qualified else set()
    )

    def foreign(ref: ast.ColumnRef) -> bool:
        return not own_column(ref, name, table, qualified=qualified)

    for target in node.targetList or ():
        ref = target.val
        fields = tuple(
            "*" if isinstance(f, ast.A_Star) else getattr(f, "sval", None)
            for f in getattr(ref, "fields", None) or ()
        )
        if not (isinstance(ref, ast.ColumnRef) and fields in stars) and subquery_or_column(target, foreign):
            return False
    if any(part and subquery_or_column(part, foreign) for part in (node.whereClause, node.sortClause)):
        return False
    return plain_condition(node.limitCount) and plain_condition(node.limitOffset)


class _OpaqueParams(Visitor):
    """Each ``$n`` written ``(SELECT $n)``: the same value, which the planner does not see when it plans
    (an initplan's output), in custom plans as in the generic one."""

    def visit_ParamRef(self, _: Ancestor, ref: ast.ParamRef) -> Visit:
        return expression(f"SELECT (SELECT ${ref.number})")


def _has_param(node: object) -> bool:
    """Whether a JSON subtree holds a ``$n``."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if "ParamRef" in item:
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def detect(scan: Scan, stmt: JsonNode) -> bool:
    """A top-level ``SELECT … FROM t WHERE …`` of one CoW table with a ``$n`` in its WHERE (a key condition
    needs one): the rule decides whether it is a key read. (Texts with literals only, as Django writes them,
    need no parse for it.)"""
    select = child(child(stmt, "ExplainStmt", "query") or stmt, "SelectStmt")
    items = children(select, "fromClause")
    return (
        "whereClause" in select
        and len(items) == 1
        and bool(scan.cow(items[0].get("RangeVar")))
        and _has_param(select["whereClause"])
    )


def apply(ctx: Context, node: ast.Node) -> Step | None:
    select = node.query if isinstance(node, ast.ExplainStmt) else node  # EXPLAIN shows what runs
    if select is not None and _key_read(select, ctx.catalog, ctx.ctes(node), cached_plan=ctx.cached_plan):
        return Step(node)
    return None


# last (after qualify, for the reason counts comes after it); a count split before no longer has the table
# as its FROM item
# (literal-blind: a key condition needs a $n; constants count by their node type, not their value)
RULE = Rule("key_reads", frozenset({STATEMENT}), detect, apply, literal_blind=True, literal_template=True)
