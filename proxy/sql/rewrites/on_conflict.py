"""``INSERT … ON CONFLICT`` into a CoW table: rewritten into statements on the overlay view that insert
the rows that collide with nothing and update the others, with PostgreSQL's row counts, RETURNING order
and SQLSTATEs (docs/rewrites.md, "INSERT … ON CONFLICT"). Also under EXPLAIN and PREPARE and in a WITH
(the get-or-create idiom); elsewhere inside another statement it is refused."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pglast import ast
from pglast.enums import (
    OnConflictAction,
)
from pglast.visitors import Ancestor

from proxy.errors import RewriteError
from proxy.sql.catalog import CowTable, UniqueKey
from proxy.sql.jsontree import JsonNode
from proxy.sql.rewrites.base import Context, Rule, Scan, Step
from proxy.sql.rewrites.nodes import (
    and_,
    cte_query,
    expression,
    only_cte,
    parse_as,
    quote,
    template_with,
    type_name,
)
from proxy.sql.rewrites.tables import (
    MERGE_ON_VIEWS,
    overlay,
    unsupported,
)
from proxy.sql.visitor import Visitor


def _match(left: str, right: str, key: UniqueKey) -> str:
    """SQL for 'rows left and right collide on key' (NULLs collide only under NULLS NOT DISTINCT)."""
    op = "IS NOT DISTINCT FROM" if key.nulls_not_distinct else "="
    return " AND ".join(f"{left}.{quote(c)} {op} {right}.{quote(c)}" for c in key.columns)


def _expand_stars(
    targets: Sequence[ast.ResTarget], alias: str, columns: Sequence[str]
) -> tuple[ast.ResTarget, ...]:
    """A RETURNING list with ``*`` / ``alias.*`` spelled out as the table's columns."""
    out: list[ast.ResTarget] = []
    for target in targets:
        value = target.val
        fields = tuple(value.fields or ()) if isinstance(value, ast.ColumnRef) else ()
        star = bool(fields) and isinstance(fields[-1], ast.A_Star)
        if star and (len(fields) == 1 or (len(fields) == 2 and getattr(fields[0], "sval", None) == alias)):
            out.extend(
                ast.ResTarget(val=ast.ColumnRef(fields=(ast.String(sval=alias), ast.String(sval=c))))
                for c in columns
            )
        else:
            out.append(target)
    return tuple(out)


# What an ON CONFLICT insert becomes (a SELECT: DO UPDATE with RETURNING).
_Rewritten = ast.InsertStmt | ast.SelectStmt | ast.MergeStmt


@dataclass(frozen=True)
class _Upsert:
    """One ON CONFLICT rewrite's parts: the client's statement and clause, the arbiter keys, the input rows
    as a SELECT (``rows_select``), the overlay view and the alias the client's expressions use, the helper
    CTEs' names, and SQL fragments every form shares."""

    stmt: ast.InsertStmt
    clause: ast.OnConflictClause
    keys: list[UniqueKey]
    rows_select: ast.SelectStmt
    returning: ast.ReturningClause | None
    view: str
    alias: str
    qalias: str
    rows: str
    inp: str
    upd: str
    ins: str
    walk: str
    collisions: str  # no row of the session's view collides with the input row `excluded` on any key
    column_list: str
    picked: str  # the input row's columns, as inserted


class _Upserts:
    """The ON CONFLICT rewrites of one statement."""

    def __init__(self, ctx: Context) -> None:
        self.catalog = ctx.catalog
        self.version = ctx.version
        self._cow = ctx.cow

    def wrapped(self, node: ast.Node) -> int:
        """Rewrites an ON CONFLICT insert under EXPLAIN or PREPARE in place; returns how many (0 or 1).

        EXPLAIN reports no row count, so any form serves; a prepared statement's tag comes with EXECUTE,
        where no tag fix can follow it, so only DO NOTHING (whose own tag is right) is allowed there."""
        if not isinstance(node, ast.ExplainStmt | ast.PrepareStmt):
            return 0
        query = node.query
        if not isinstance(query, ast.InsertStmt):
            return 0
        table = self._cow(query.relation)
        if table is None or query.onConflictClause is None:
            return 0
        prepare = isinstance(node, ast.PrepareStmt)
        if prepare and query.onConflictClause.action == OnConflictAction.ONCONFLICT_UPDATE:
            raise unsupported("PREPARE of INSERT ... ON CONFLICT DO UPDATE (the protocol's Parse works)")
        new, _ = self._on_conflict(query, table, nested=prepare)
        node.query = new
        return 1

    def hoist_ctes(self, node: ast.Node) -> int:
        """Rewrites ON CONFLICT inserts in the statement's WITH (the get-or-create idiom); data-modifying
        CTEs must be top-level, so the helpers are hoisted next to the CTE. Returns how many."""
        with_clause: ast.WithClause | None = getattr(node, "withClause", None)  # (statements without one too)
        if with_clause is None:
            return 0
        count = 0
        ctes: list[ast.CommonTableExpr] = []
        for cte in with_clause.ctes or ():
            query = cte.ctequery
            table = self._cow(query.relation) if isinstance(query, ast.InsertStmt) else None
            if isinstance(query, ast.InsertStmt) and table is not None and query.onConflictClause is not None:
                count += 1
                final, _ = self._on_conflict(query, table, suffix=f"_{count}", nested=True)
                ctes.extend(template_with(final).ctes or ())
                if template_with(final).recursive:
                    with_clause.recursive = True
                final.withClause = None
                cte.ctequery = final
            ctes.append(cte)
        if count:
            with_clause.ctes = tuple(ctes)
        return count

    def refuse_nested(self, node: ast.Node) -> None:
        rewriter = self

        class Nested(Visitor):
            def visit_InsertStmt(self, ancestors: Ancestor, insert: ast.InsertStmt) -> None:
                if insert is node or insert.onConflictClause is None:
                    return
                table = rewriter._cow(insert.relation)
                if table is not None:
                    raise unsupported(f"INSERT ... ON CONFLICT on {table.qualified} inside another statement")

        Nested()(node)

    def _on_conflict(
        self, stmt: ast.InsertStmt, table: CowTable, suffix: str = "", nested: bool = False
    ) -> tuple[_Rewritten, tuple[str, str] | None]:
        """The statement replacing ``stmt``; its WITH holds the helper CTEs (named with ``suffix``)."""
        plan = self._plan(stmt, table, suffix)
        new: _Rewritten
        if plan.clause.action == OnConflictAction.ONCONFLICT_NOTHING:
            new, tag_map = self._do_nothing(plan), None
        elif plan.returning is None and self.version >= MERGE_ON_VIEWS and not nested:
            new, tag_map = self._merge(plan), ("MERGE", "INSERT 0")
        else:
            new, tag_map = self._update_then_insert(plan, table)
        self._prepend_ctes(new, stmt)
        return new, tag_map

    def _plan(self, stmt: ast.InsertStmt, table: CowTable, suffix: str) -> _Upsert:
        """What every form of the rewrite needs: the input rows, the arbiter keys, the names."""
        columns, rows_select = self._conflict_input(stmt, table)
        clause = stmt.onConflictClause
        if clause is None:
            raise TypeError("an ON CONFLICT rewrite of an INSERT without ON CONFLICT")
        keys = self._arbiters(clause, table, columns)
        view = overlay(table)
        relation = stmt.relation  # (an INSERT always has its target)
        named = relation.alias.aliasname if relation is not None and relation.alias is not None else None
        alias = named or table.name
        rows, inp, upd, ins = (
            f"{n}{suffix}" for n in ("cow_rows", "cow_input", "cow_updated", "cow_inserted")
        )
        return _Upsert(
            stmt=stmt,
            clause=clause,
            keys=keys,
            rows_select=rows_select,
            returning=stmt.returningClause,
            view=view,
            alias=alias,
            qalias=quote(alias),
            rows=rows,
            inp=inp,
            upd=upd,
            ins=ins,
            walk=f"cow_walk{suffix}",
            collisions=" AND ".join(
                f"NOT EXISTS (SELECT 1 FROM {view} AS cow_t WHERE {_match('cow_t', 'excluded', k)})"
                for k in keys
            ),
            column_list=", ".join(quote(c) for c in columns),
            picked=", ".join(f"excluded.{quote(c)}" for c in columns),
        )

    @staticmethod
    def _do_nothing(p: _Upsert) -> ast.InsertStmt:
        """``DO NOTHING``: an INSERT of the rows that collide with nothing."""
        if len(p.keys) <= 1:
            # A row colliding with an earlier input row is skipped, as PostgreSQL does (it sees the rows the
            # same command inserted); with one key, the first of equal rows is the one inserted.
            earlier = " AND ".join(
                f"NOT EXISTS (SELECT 1 FROM {p.rows} AS cow_e WHERE {_match('cow_e', 'excluded', k)} "
                "AND cow_e.cow_ord < excluded.cow_ord)"
                for k in p.keys
            )
            where = " AND ".join(w for w in (p.collisions, earlier) if w) or "true"
            sql = (
                f"WITH {p.rows} AS (SELECT 1) INSERT INTO {p.view} AS {p.qalias} ({p.column_list}) "
                f"SELECT {p.picked} FROM {p.rows} AS excluded WHERE {where} ORDER BY excluded.cow_ord"
            )
        else:
            # Several arbiters: a row skipped for one key must not block a later row on another, so walk the
            # rows in order, keeping the positions actually inserted (quadratic, only here).
            clash = " OR ".join(f"({_match('cow_e', 'excluded', k)})" for k in p.keys)
            sql = (
                f"WITH RECURSIVE {p.rows} AS (SELECT 1), "
                f"{p.walk} (cow_ord, cow_picked) AS (SELECT CAST(0 AS bigint), CAST(ARRAY[] AS bigint[]) "
                "UNION ALL SELECT CAST(excluded.cow_ord AS bigint), "
                f"CASE WHEN {p.collisions} AND NOT EXISTS (SELECT 1 "
                f"FROM {p.rows} AS cow_e WHERE cow_e.cow_ord = ANY (cow_w.cow_picked) AND ({clash})) "
                "THEN cow_w.cow_picked || CAST(excluded.cow_ord AS bigint) ELSE cow_w.cow_picked END "
                f"FROM {p.walk} AS cow_w JOIN {p.rows} AS excluded ON excluded.cow_ord = cow_w.cow_ord + 1) "
                f"INSERT INTO {p.view} AS {p.qalias} ({p.column_list}) SELECT {p.picked} "
                f"FROM {p.rows} AS excluded, "
                f"(SELECT cow_picked FROM {p.walk} ORDER BY cow_ord DESC LIMIT 1) AS cow_final "
                "WHERE excluded.cow_ord = ANY (cow_final.cow_picked) ORDER BY excluded.cow_ord"
            )
        new = parse_as(ast.InsertStmt, sql)
        only_cte(new).ctequery = p.rows_select
        new.returningClause = p.returning
        new.override = p.stmt.override
        return new

    @staticmethod
    def _twice(p: _Upsert) -> str:
        """A scalar subquery that fails with 21000 when two input rows share the key, as PostgreSQL raises
        21000 for a row the command would affect twice."""
        key = p.keys[0]
        return (
            f"(SELECT 1 FROM {p.rows} AS cow_a JOIN {p.rows} AS cow_b ON "
            f"{_match('cow_a', 'cow_b', key)} AND cow_a.cow_ord <> cow_b.cow_ord)"
        )

    def _merge(self, p: _Upsert) -> ast.MergeStmt:
        """``DO UPDATE`` without RETURNING on PostgreSQL 17+, which runs MERGE on the view: one statement
        whose count is inserted + updated rows."""
        # MATERIALIZED: inlined into MERGE, the scalar subquery trips a planner bug in PostgreSQL 18 ("wrong
        # varnullingrels", XX000).
        new = parse_as(
            ast.MergeStmt,
            f"WITH {p.rows} AS (SELECT 1), "
            f"{p.inp} AS MATERIALIZED (SELECT * FROM {p.rows} WHERE {self._twice(p)} IS NULL) "
            f"MERGE INTO {p.view} AS {p.qalias} USING {p.inp} AS excluded "
            f"ON {_match(p.qalias, 'excluded', p.keys[0])} "
            "WHEN MATCHED THEN UPDATE SET cow_placeholder = 1 "
            f"WHEN NOT MATCHED THEN INSERT ({p.column_list}) VALUES ({p.picked})",
        )
        only_cte(new).ctequery = p.rows_select
        matched, not_matched = new.mergeWhenClauses or ()
        matched.targetList = p.clause.targetList
        matched.condition = p.clause.whereClause
        not_matched.override = p.stmt.override
        return new

    def _update_then_insert(self, p: _Upsert, table: CowTable) -> tuple[_Rewritten, tuple[str, str] | None]:
        """``DO UPDATE``: a data-modifying CTE updates the colliding rows, then the others are inserted."""
        key = p.keys[0]
        update = (
            f"UPDATE {p.view} AS {p.qalias} SET cow_placeholder = 1 FROM {p.inp} AS excluded "
            f"WHERE {_match(p.qalias, 'excluded', key)}"
        )
        insert = (
            f"INSERT INTO {p.view} AS {p.qalias} ({p.column_list}) SELECT {p.picked} "
            f"FROM {p.inp} AS excluded WHERE {p.collisions} ORDER BY excluded.cow_ord"
        )
        head = (
            f"WITH {p.rows} AS (SELECT 1), "
            f"{p.inp} AS (SELECT * FROM {p.rows} WHERE {self._twice(p)} IS NULL), "
            f"{p.upd} AS ({update} RETURNING 1)"
        )
        tag_map: tuple[str, str] | None
        new: ast.InsertStmt | ast.SelectStmt
        if p.returning is None:
            # Without RETURNING the INSERT is the statement, so no rows reach the client; its tag counts the
            # inserted rows only (see docs/rewrites.md).
            new = insert_node = parse_as(ast.InsertStmt, f"{head} {insert}")
            update_node = cte_query(new, 2, ast.UpdateStmt)
            update_node.returningClause = None
            tag_map = None
        else:
            # Both parts return whole rows with the input position, so the client's RETURNING list is
            # evaluated once over them in input order, as PostgreSQL returns them (inserted rows find their
            # position through the conflict key they were inserted with).
            new = parse_as(
                ast.SelectStmt,
                f"{head}, {p.ins} AS ({insert} RETURNING {p.qalias}.*) "
                f"SELECT 1 FROM (SELECT * FROM {p.upd} UNION ALL SELECT cow_i.cow_ord, cow_r.* "
                f"FROM {p.ins} AS cow_r LEFT JOIN {p.inp} AS cow_i ON {_match('cow_r', 'cow_i', key)}) "
                f"AS {p.qalias} ORDER BY {p.qalias}.cow_ord",
            )
            insert_node = cte_query(new, 3, ast.InsertStmt)
            update_node = cte_query(new, 2, ast.UpdateStmt)
            update_node.returningClause = parse_as(
                ast.UpdateStmt, f"UPDATE x SET y = 1 RETURNING excluded.cow_ord, {p.qalias}.*"
            ).returningClause
            # pglast 8 wraps RETURNING in a ReturningClause (PostgreSQL 18)
            exprs: Sequence[ast.ResTarget] = p.returning.exprs or ()
            new.targetList = _expand_stars(exprs, p.alias, [c.name for c in table.columns])
            tag_map = ("SELECT", "INSERT 0")
        only_cte(new).ctequery = p.rows_select
        insert_node.override = p.stmt.override
        # SET and WHERE keep the client's names: with the input aliased EXCLUDED, a bare column name is
        # ambiguous exactly where PostgreSQL's ON CONFLICT finds it ambiguous (42702).
        update_node.targetList = p.clause.targetList
        if p.clause.whereClause is not None:
            assert update_node.whereClause is not None  # the template's key match
            update_node.whereClause = and_(update_node.whereClause, p.clause.whereClause)
        return new, tag_map

    @staticmethod
    def _prepend_ctes(new: _Rewritten, stmt: ast.InsertStmt) -> None:
        if stmt.withClause is not None:
            helpers = template_with(new)
            helpers.ctes = tuple(stmt.withClause.ctes or ()) + tuple(helpers.ctes or ())
            helpers.recursive = bool(stmt.withClause.recursive or helpers.recursive)

    def _conflict_input(self, stmt: ast.InsertStmt, table: CowTable) -> tuple[list[str], ast.SelectStmt]:
        """The INSERT's columns, and a SELECT of its rows as (cow_ord, columns...) typed like the table."""
        if stmt.cols:
            cols = stmt.cols
            if any(rt.indirection for rt in cols):
                raise unsupported("INSERT ... ON CONFLICT into subfields or array elements")
            columns = [rt.name for rt in cols]
        else:
            columns = [c.name for c in table.columns]
        source = stmt.selectStmt
        if source is None:
            raise unsupported("INSERT ... DEFAULT VALUES ON CONFLICT")
        assert isinstance(source, ast.SelectStmt)  # VALUES and set operations are SelectStmts too
        plain_values = (
            source.valuesLists is not None
            and source.sortClause is None
            and source.limitCount is None
            and source.limitOffset is None
            and source.withClause is None
        )
        if plain_values:
            return self._values_input(stmt, table, columns, [list(r) for r in source.valuesLists or ()])
        if self._excluded_extra(stmt.onConflictClause, table, columns):
            raise unsupported("EXCLUDED of a column an INSERT ... SELECT does not give")
        types = self._column_types(table, columns)
        casts = ", ".join(
            f"CAST(cow_s.{quote(c)} AS {t}) AS {quote(c)}" for c, t in zip(columns, types, strict=True)
        )
        select = parse_as(
            ast.SelectStmt,
            f"SELECT row_number() OVER () AS cow_ord, {casts} FROM (SELECT 1) AS cow_s "
            f"({', '.join(quote(c) for c in columns)})",
        )
        (select.fromClause or ())[0].subquery = source
        return columns, select

    def _values_input(
        self, stmt: ast.InsertStmt, table: CowTable, columns: list[str], rows: list[list[ast.Node]]
    ) -> tuple[list[str], ast.SelectStmt]:
        """A plain VALUES list as a typed SELECT, its DEFAULTs and the EXCLUDED-only columns spelled out."""
        width = len(rows[0])
        if width > len(columns):
            raise RewriteError("INSERT has more expressions than target columns", "42601")
        if not stmt.cols:
            columns = columns[:width]
        elif width < len(columns):
            raise RewriteError("INSERT has more target columns than expressions", "42601")
        keep = self._fill_defaults(table, columns, rows)
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
                *(ast.TypeCast(arg=r[j], typeName=type_name(t)) for j, t in zip(keep, types, strict=True)),
            )
            for i, r in enumerate(rows)
        )
        names = ", ".join(["cow_ord", *(quote(c) for c in columns)])
        select = parse_as(ast.SelectStmt, f"SELECT * FROM (VALUES (1)) AS cow_v ({names})")
        (select.fromClause or ())[0].subquery.valuesLists = lists
        return columns, select

    def _fill_defaults(self, table: CowTable, columns: list[str], rows: list[list[ast.Node]]) -> list[int]:
        """The positions to keep. A column that is DEFAULT in every row is left to the view's default;
        elsewhere DEFAULT becomes the column's default expression, evaluated per row as PostgreSQL does
        (conflicting rows included)."""
        width = len(rows[0])
        keep = [j for j in range(width) if not all(isinstance(r[j], ast.SetToDefault) for r in rows)]
        keep = keep or list(range(width))  # all DEFAULT: spell the defaults out rather than list no column
        for j in keep:
            if any(isinstance(r[j], ast.SetToDefault) for r in rows):
                default = self._default_expr(table, columns[j])
                for r in rows:
                    if isinstance(r[j], ast.SetToDefault):
                        r[j] = default
        return keep

    @staticmethod
    def _default_expr(table: CowTable, name: str) -> ast.Node:
        column = table.column(name)
        if column is None:
            raise RewriteError(f'column "{name}" of relation "{table.name}" does not exist', "42703")
        if column.identity_always or column.generated:
            raise unsupported(
                f"DEFAULT or EXCLUDED for {table.name}.{name} (generated) in INSERT ... ON CONFLICT"
            )
        # catalog SQL from pg_get_expr, not client text
        return expression(f"SELECT {column.default or 'NULL'}")

    @staticmethod
    def _excluded_extra(
        clause: ast.OnConflictClause | None, table: CowTable, columns: list[str]
    ) -> list[str]:
        """Columns of the table that the DO UPDATE reads from EXCLUDED but the INSERT does not give."""
        if clause is None or clause.action != OnConflictAction.ONCONFLICT_UPDATE:
            return []
        found: list[str] = []

        class Refs(Visitor):
            def visit_ColumnRef(self, _: Ancestor, node: ast.ColumnRef) -> None:
                fields = tuple(node.fields or ())
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
    def _arbiters(clause: ast.OnConflictClause, table: CowTable, columns: list[str]) -> list[UniqueKey]:
        infer = clause.infer
        if infer is None and clause.action == OnConflictAction.ONCONFLICT_UPDATE:
            raise RewriteError(
                "ON CONFLICT DO UPDATE requires inference specification or constraint name", "42601"
            )
        if infer is None:  # DO NOTHING without a target: every unique index arbitrates
            keys = [k for k in table.unique if k.inferable and all(c in columns for c in k.columns)]
            if any(not k.inferable for k in table.unique):
                raise unsupported(
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
                raise unsupported("ON CONFLICT with a partial-index predicate")
            names = []
            for elem in infer.indexElems or ():
                if elem.expr is not None or elem.collation or elem.opclass or elem.name is None:
                    raise unsupported("ON CONFLICT on an expression, collation or operator class")
                names.append(elem.name)
            keys = [k for k in table.unique if k.inferable and set(k.columns) == set(names)][:1]
            if not keys:
                raise RewriteError(
                    "there is no unique or exclusion constraint matching the ON CONFLICT specification",
                    "42P10",
                )
        for key in keys:
            if not key.inferable:
                raise unsupported("ON CONFLICT on a partial or expression unique index")
            missing = [c for c in key.columns if c not in columns]
            if missing:
                raise unsupported(
                    f"ON CONFLICT whose conflict column {missing[0]} is not given by the INSERT"
                )
        return keys


def detect(scan: Scan, node: JsonNode) -> bool:
    return "onConflictClause" in node and scan.cow(node.get("relation"))


def apply(ctx: Context, node: ast.Node) -> Step | None:
    upserts = _Upserts(ctx)
    hoisted = upserts.hoist_ctes(node) + upserts.wrapped(node)
    table = ctx.cow(node.relation) if isinstance(node, ast.InsertStmt) and node.onConflictClause else None
    found = ctx.count(RULE.name)
    if found is None or found > hoisted + (table is not None):
        upserts.refuse_nested(node)
    if table is not None and isinstance(node, ast.InsertStmt):  # (table: only for an INSERT)
        new, tag_map = upserts._on_conflict(node, table)
        return Step(new, tag_map)
    return Step(node) if hoisted else None


RULE = Rule("on_conflict", frozenset({"InsertStmt"}), detect, apply, count_all=True, literal_template=True)
