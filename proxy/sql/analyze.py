"""Classify statements, spot tampering with the session state, and rewrite what the overlay views cannot do.

The order of work keeps the common case cheap: the LRU cache (keyed by the comment-stripped text), then a
sieve over the text that proves no rewrite or tamper check can apply (a SELECT mentioning none of the
trigger words), and only then pglast's full parse (~60-220 µs) and visitors.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

import pglast
from pglast import ast
from pglast.parser import ParseError
from pglast.visitors import Skip, Visitor

from proxy.errors import RewriteError
from proxy.sql.catalog import Catalog
from proxy.sql.rewrite import Rewriter
from proxy.sql.tags import strip_edge_comments

KINDS = ("select", "insert", "update", "delete", "merge", "copy", "ddl", "utility", "transaction", "other")


@dataclass(frozen=True)
class Analysis:
    """What the proxy needs to know about one (possibly multi-statement) query string.

    ``kind``: the first statement's kind (one of ``KINDS``) or ``"multi"``. ``writes``: (table, kind)
    pairs, table as ``schema.name`` for CoW tables and as written otherwise, kind one of insert, update,
    delete, merge, truncate, copy. ``tampers``: the statement changes or clears the cow session state
    (cow.* settings, role, search_path, RESET ALL, DISCARD ALL, cow.use_session). ``rewritten``: SQL to
    send upstream instead of the client's, or None. ``tag_map``: ``(old, new)``: the
    CommandComplete tag of the (last) rewritten statement starts with command ``old``; the client must
    see ``new`` in its place (see ``apply_tag_map``). ``error``: ``(sqlstate, message)`` to answer instead of
    running the statement.
    """

    kind: str
    writes: tuple[tuple[str, str], ...] = ()
    tampers: bool = False
    rewritten: str | None = None
    tag_map: tuple[str, str] | None = None
    error: tuple[str, str] | None = None
    cache_hit: bool = False


# Commands whose CommandComplete tag ends with a row count.
_COUNTED = ("INSERT", "DELETE", "UPDATE", "SELECT", "MERGE", "MOVE", "FETCH", "COPY")


def apply_tag_map(tag: str, tag_map: tuple[str, str] | None) -> str:
    """The CommandComplete tag the client should see, given the server's tag and ``Analysis.tag_map``.

    ``tag_map = (old, new)``: a tag starting with the command ``old`` gets ``new`` in its place; the row
    count stays when ``new`` is a command that reports one (``("SELECT", "INSERT 0")``: ``SELECT 3`` ->
    ``INSERT 0 3``) and goes otherwise (``("DELETE", "TRUNCATE TABLE")``: ``DELETE 5`` ->
    ``TRUNCATE TABLE``). Plain prefix replacement gives the same result except for the dropped count.
    """
    if tag_map is None:
        return tag
    old, new = tag_map
    if tag != old and not tag.startswith(old + " "):
        return tag
    if new.split(" ", 1)[0] in _COUNTED:
        return new + tag[len(old) :]
    return new


# Statements that start with one of these words and contain none of the sieve words below can be
# neither rewritten nor tampering: they skip the parser.
_FAST_KINDS = {
    "select": "select",
    "values": "select",
    "table": "select",
    "show": "utility",
    "fetch": "utility",
    "move": "utility",
    "close": "utility",
    "listen": "utility",
    "unlisten": "utility",
    "notify": "utility",
    "begin": "transaction",
    "start": "transaction",
    "commit": "transaction",
    "end": "transaction",
    "rollback": "transaction",
    "abort": "transaction",
    "savepoint": "transaction",
    "release": "transaction",
}
_FIRST_WORD = re.compile(r"[\s(]*([A-Za-z]+)")
# Any of these words (or U& identifiers, which could spell them, or a second statement) sends the
# statement to the parser; false positives only cost time.
_SIEVE = re.compile(
    r"(?<![\w$])(?:set|reset|discard|do|set_config|use_session|conflict|truncate|copy|merge|insert|update"
    r"|delete|into)(?![\w$])|u&|;",
    re.I,
)


def _fast_path(text: str, catalog: Catalog, in_session: bool) -> Analysis | None:
    first = _FIRST_WORD.match(text)
    if first is None:
        return None
    kind = _FAST_KINDS.get(first.group(1).lower())
    if kind is None:
        return None
    body = text[:-1] if text.endswith(";") else text
    if _SIEVE.search(body) is not None:
        return None
    if in_session:
        pattern = catalog.schema_pattern
        if pattern is not None and pattern.search(body) is not None:
            return None
    return Analysis(kind=kind)


_DDL_NAMES = {
    "IndexStmt",
    "ViewStmt",
    "RuleStmt",
    "RenameStmt",
    "CommentStmt",
    "GrantStmt",
    "GrantRoleStmt",
    "DefineStmt",
    "CompositeTypeStmt",
    "SecLabelStmt",
    "ImportForeignSchemaStmt",
    "RefreshMatViewStmt",
    "ReassignOwnedStmt",
}
_TRANSACTION = "transaction"


def statement_kind(node: Any) -> str:
    """The kind of one parsed statement."""
    name = type(node).__name__
    if isinstance(node, ast.SelectStmt):
        return "ddl" if node.intoClause is not None else "select"
    if isinstance(node, ast.InsertStmt):
        return "insert"
    if isinstance(node, ast.UpdateStmt):
        return "update"
    if isinstance(node, ast.DeleteStmt | ast.TruncateStmt):
        return "delete"
    if isinstance(node, ast.MergeStmt):
        return "merge"
    if isinstance(node, ast.CopyStmt):
        return "copy"
    if isinstance(node, ast.TransactionStmt):
        return _TRANSACTION
    if name.startswith(("Create", "Alter", "Drop")) or name in _DDL_NAMES:
        return "ddl"
    return "utility"


def _names(nodes: Any) -> list[str]:
    return [str(n.sval) for n in nodes or () if isinstance(n, ast.String)]


# GUCs whose change takes a connection out of its session or around the overlay.
_GUARDED = {"role", "session_authorization", "search_path"}
_DO_BODY = re.compile(
    r"(?<![\w$])(?:cow\s*\.|set_config|search_path|role|session\s+authorization|reset|discard|use_session)",
    re.I,
)


def _guarded_setting(name: str) -> bool:
    name = name.lower()
    return name.startswith("cow.") or name in _GUARDED


class _Inspector(Visitor):
    """Collects writes and tamper signs over a whole statement, subqueries and CTEs included."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.writes: list[tuple[str, str]] = []
        self.tampers = False

    def _write(self, relation: Any, kind: str) -> None:
        if relation is None:
            return
        table = self.catalog.lookup(relation.schemaname, relation.relname)
        if table is not None:
            name = table.qualified
        elif relation.schemaname:
            name = f"{relation.schemaname}.{relation.relname}"
        else:
            name = relation.relname
        if (name, kind) not in self.writes:
            self.writes.append((name, kind))

    def visit_InsertStmt(self, _: Any, node: Any) -> None:
        self._write(node.relation, "insert")

    def visit_UpdateStmt(self, _: Any, node: Any) -> None:
        self._write(node.relation, "update")

    def visit_DeleteStmt(self, _: Any, node: Any) -> None:
        self._write(node.relation, "delete")

    def visit_MergeStmt(self, _: Any, node: Any) -> None:
        self._write(node.relation, "merge")

    def visit_TruncateStmt(self, _: Any, node: Any) -> None:
        for relation in node.relations or ():
            self._write(relation, "truncate")

    def visit_CopyStmt(self, _: Any, node: Any) -> None:
        if node.is_from:
            self._write(node.relation, "copy")

    def visit_VariableSetStmt(self, _: Any, node: Any) -> None:
        from pglast.enums import VariableSetKind

        if node.kind == VariableSetKind.VAR_RESET_ALL or (node.name and _guarded_setting(node.name)):
            self.tampers = True

    def visit_DiscardStmt(self, _: Any, node: Any) -> None:
        from pglast.enums import DiscardMode

        if node.target == DiscardMode.DISCARD_ALL:
            self.tampers = True

    def visit_FuncCall(self, _: Any, node: Any) -> None:
        names = [n.lower() for n in _names(node.funcname)]
        if not names:
            return
        if names[-1] == "use_session" and names[:-1] in ([], ["cow"]):
            self.tampers = True
        elif names[-1] == "set_config" and names[:-1] in ([], ["pg_catalog"]):
            first = node.args[0] if node.args else None
            if isinstance(first, ast.TypeCast):  # 'cow.x'::text
                first = first.arg
            if (
                isinstance(first, ast.A_Const)
                and isinstance(first.val, ast.String)
                and not _guarded_setting(str(first.val.sval))
            ):
                return
            # a guarded name, or one computed at run time that might be
            self.tampers = True

    def visit_DoStmt(self, _: Any, node: Any) -> None:
        # The body is PL/pgSQL text; the client's own code there could do anything, so any mention of
        # the session machinery counts.
        for arg in node.args or ():
            if (
                isinstance(arg, ast.DefElem)
                and arg.defname == "as"
                and isinstance(arg.arg, ast.String)
                and _DO_BODY.search(str(arg.arg.sval))
            ):
                self.tampers = True

    def visit_CreateFunctionStmt(self, _: Any, node: Any) -> Any:
        return Skip  # a definition runs nothing now


class Analyzer:
    """Analyses statements for one upstream server; results cached (LRU) by comment-stripped text.

    ``server_version_num`` is the upstream's (from its ``server_version`` ParameterStatus); 0 means
    unknown, and MERGE into a CoW table is then left for the server to accept or refuse.
    """

    def __init__(self, cache_size: int = 4096, server_version_num: int = 0) -> None:
        self.cache_size = cache_size
        self.server_version_num = server_version_num
        self.hits = 0
        self.misses = 0
        self._cache: OrderedDict[tuple[str, bool, int, int], tuple[Analysis, Analysis]] = OrderedDict()

    def analyze(
        self, sql: str, catalog: Catalog, in_session: bool, server_version_num: int | None = None
    ) -> Analysis:
        version = self.server_version_num if server_version_num is None else server_version_num
        text = strip_edge_comments(sql)
        key = (text, in_session, catalog.ident, version)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            self.hits += 1
            return cached[1]
        self.misses += 1
        result = _fast_path(text, catalog, in_session) or _analyze_parsed(text, catalog, in_session, version)
        self._cache[key] = (result, replace(result, cache_hit=True))
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return result


def _analyze_parsed(text: str, catalog: Catalog, in_session: bool, version: int) -> Analysis:
    try:
        stmts = pglast.parse_sql(text)
    except ParseError:
        # Let the server report its own syntax error (42601) to the client.
        first = _FIRST_WORD.match(text)
        return Analysis(kind=_FAST_KINDS.get(first.group(1).lower(), "other") if first else "other")
    if not stmts:
        return Analysis(kind="other")
    kinds = [statement_kind(raw.stmt) for raw in stmts]
    inspector = _Inspector(catalog)
    inspector(stmts)
    kind = kinds[0] if len(kinds) == 1 else "multi"
    writes = tuple(inspector.writes)
    if not (in_session and catalog.has_cow_tables):
        return Analysis(kind=kind, writes=writes, tampers=inspector.tampers)
    try:
        outcome = Rewriter(catalog, version).rewrite(stmts)
    except RewriteError as exc:
        return Analysis(kind=kind, writes=writes, tampers=inspector.tampers, error=(exc.sqlstate, str(exc)))
    return Analysis(
        kind=kind,
        writes=writes,
        tampers=inspector.tampers,
        rewritten=outcome.sql,
        tag_map=outcome.tag_map,
    )
