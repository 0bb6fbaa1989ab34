"""Classify statements, spot tampering with the session state, and rewrite what the overlay views cannot do.

The order of work keeps the common case cheap: the LRU cache (keyed by the comment-stripped text), then a
sieve over the text that proves no rewrite or tamper check can apply (a SELECT mentioning none of the
trigger words), and only then pglast's full parse (~60-220 µs) and visitors.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pglast
from pglast import ast, enums
from pglast.parser import ParseError, parse_plpgsql_json, parse_sql_json

from proxy.errors import RewriteError
from proxy.sql.catalog import Catalog
from proxy.sql.jsontree import JsonNode, svals
from proxy.sql.policy import DEFAULT_POLICY, FAST_PATH_WORDS, Policy, PolicyCheck
from proxy.sql.policy import VISITED as POLICY_VISITED
from proxy.sql.rewrites import (
    DETECTORS,
    RELATION,
    RULES,
    STATEMENT,
    Outcome,
    Rewriter,
    app_path,
    introspection,
)
from proxy.sql.shapes import KeyFunction, Shape, lex, literals_irrelevant
from proxy.sql.shapes import key as shape_key
from proxy.sql.templates import Constants, Template, build, constants, probe
from proxy.tags import strip_edge_comments

RETURNING_MARK = "/*cow_returning*/ "  # (migrations/sql/functions/38_rls.sql reads it)
SQLSTATE_REFUSED = "42501"  # insufficient_privilege: what PostgreSQL answers for what a role may not do
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
    running the statement. ``catalog_dependent``: inside a session, the outcome depends on catalog details
    that app DDL on another connection may have changed since the catalog was loaded (an ON CONFLICT,
    TRUNCATE, COPY, MERGE or DDL target, or a schema-qualified name in an app schema that the catalog does
    not know): the caller should make sure its catalog is current before using the result.
    ``unqualified_writes``: in a session, the (relation name, kind) of each write target named without a
    schema, and ``executes``: an ``EXECUTE`` of a statement prepared in SQL (its writes unknown here): where
    those names resolve depends on the ``search_path`` and role in force when the statement runs, so the
    caller asks the server before running it (``cow._unlayered_write``) unless it knows that no schema on the
    path lacks the layer. ``path_change``: the statement may change the ``search_path`` or the role (what
    ``"$user"`` stands for), which ends that knowledge.
    """

    kind: str
    writes: tuple[tuple[str, str], ...] = ()
    tampers: bool = False
    rewritten: str | None = None
    tag_map: tuple[str, str] | None = None
    error: tuple[str, str] | None = None
    cache_hit: bool = False
    catalog_dependent: bool = False
    error_detail: str | None = None  # PostgreSQL's DETAIL for ``error``, when it gives one
    unqualified_writes: tuple[tuple[str, str], ...] = ()
    executes: bool = False
    path_change: bool = False

    @property
    def resolves_writes(self) -> bool:
        """Whether the server must say where its write targets resolve before it runs (in a session)."""
        return bool(self.unqualified_writes) or self.executes


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
# The fast path's answers, one per kind (frozen: shared by every text it answers).
_FAST_ANSWERS = {kind: Analysis(kind=kind) for kind in set(_FAST_KINDS.values())}
_FIRST_WORD = re.compile(r"[\s(]*([A-Za-z]+)")
# Any of these words (or U& identifiers, which could spell them, or a second statement) sends the
# statement to the parser; false positives only cost time. Plain substring tests come first: they run
# in C and clear most statements in ~1 µs, the word-boundary regex (~7 µs) only confirms a hit.
_SIEVE_WORDS = (
    "set", "do", "conflict", "truncate", "copy", "merge", "insert", "update", "delete", "into",
    "discard", "use_session", "u&", ";",
)  # fmt: skip
_SIEVE = re.compile(
    r"(?<![\w$])(?:set|reset|discard|do|set_config|use_session|conflict|truncate|copy|merge|insert|update"
    r"|delete|into)(?![\w$])|u&|;"
)

# In a session, words that may call for a rewrite of a SELECT of CoW tables (docs/rewrites.md): GROUP BY a
# primary key (its other columns added), joins (LATERAL), count(*) (split), WHERE with a $n (key reads),
# FOR SHARE / KEY SHARE (row locks; FOR UPDATE has the sieve's "update").
_SESSION_WORDS = tuple(
    (word, re.compile(rf"(?<![\w$]){word}(?![\w$])")) for word in ("group", "join", "count", "where", "share")
)


def _sieve_hit(lowered: str) -> bool:
    return any(word in lowered for word in _SIEVE_WORDS) and _SIEVE.search(lowered) is not None


def _fast_path(text: str, catalog: Catalog, in_session: bool) -> Analysis | None:
    first = _FIRST_WORD.match(text)
    if first is None:
        return None
    kind = _FAST_KINDS.get(first.group(1).lower())
    if kind is None:
        return None
    lowered = (text[:-1] if text.endswith(";") else text).lower()
    if _sieve_hit(lowered):
        return None
    if in_session and any(word in lowered for word in FAST_PATH_WORDS):
        return None  # perhaps something the policy refuses (proxy/sql/policy.py)
    if in_session and catalog.has_cow_tables:
        if any(word in lowered for word in introspection.WORDS):
            return None  # a catalog question, answered as outside the session (rewrites/introspection.py)
        for word, pattern in _SESSION_WORDS:
            if word in lowered and (word != "where" or "$" in lowered) and pattern.search(lowered):
                return None
        if (
            any(schema in lowered for schema in catalog.lowered_schemas)
            and catalog.schema_pattern is not None
            and catalog.schema_pattern.search(lowered) is not None
        ):
            return None  # a schema-qualified CoW name is pointed at the overlay
    return _FAST_ANSWERS[kind]


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
_SIMPLE_KINDS = {
    "InsertStmt": "insert",
    "UpdateStmt": "update",
    "DeleteStmt": "delete",
    "TruncateStmt": "delete",
    "MergeStmt": "merge",
    "CopyStmt": "copy",
    "TransactionStmt": "transaction",
}
# Statements whose outcome in a session depends on catalog details a stale catalog may get wrong (the rules
# that rewrite or refuse them read the table's columns, keys or references).
_CATALOG_DEPENDENT = {
    "TruncateStmt",
    "MergeStmt",
    "CopyStmt",
    "AlterTableStmt",
    "IndexStmt",
    "RenameStmt",
    "CreateTrigStmt",
    "RuleStmt",
    "AlterObjectSchemaStmt",
    "ClusterStmt",
    "CreatePolicyStmt",
    "AlterPolicyStmt",
    "DropStmt",
}


def _kind(name: str, has_into: bool) -> str:
    if name == "SelectStmt":
        return "ddl" if has_into else "select"
    simple = _SIMPLE_KINDS.get(name)
    if simple is not None:
        return simple
    if name.startswith(("Create", "Alter", "Drop")) or name in _DDL_NAMES:
        return "ddl"
    return "utility"


def statement_kind(node: Any) -> str:
    """The kind of one statement parsed by ``pglast.parse_sql``."""
    name = type(node).__name__
    return _kind(name, name == "SelectStmt" and node.intoClause is not None)


# The target of a PL/pgSQL assignment ("a := ", "r.f[1] = ").
_ASSIGNMENT_TARGET = re.compile(r"^\s*[^:=]*?(?::=|=)")
# GUCs whose change takes a connection out of its session or around the overlay, or makes its writes
# vanish (session_replication_role = replica skips the overlay's triggers: an INSERT reports success and
# writes nothing).
_GUARDED = {"role", "session_authorization", "search_path", "session_replication_role"}
# Of the cow.* settings, the operation may be set by the client: it only groups the session's own writes.
_OPERATION = "cow.operation_id"
# Of those, the role may change on a tagged connection when the proxy sees the change (a statement of the
# client's, not SQL inside a DO block or function): the layer's binding and the privileges of the changes
# tables hold for every role, and a role the login user may assume is what the application runs as outside
# a session too (PostgREST's SET LOCAL ROLE per request; docs/layer.md, "Tenancy in a session"). A change
# of search_path the proxy sees is rewritten (rewrites/app_path.py).
_ROLE = "role"
_DO_BODY = re.compile(
    r"(?<![\w$])(?:cow\s*\.|set_config|search_path|role|session\s+authorization|reset|discard|use_session)",
    re.I,
)


# Statements that carry SET clauses for other sessions, roles or functions, not for this connection.
_SETTINGS_ELSEWHERE = {
    "CreateFunctionStmt",
    "AlterFunctionStmt",
    "AlterRoleSetStmt",
    "AlterDatabaseSetStmt",
    "AlterSystemStmt",
}


def _guarded_setting(name: str) -> bool:
    name = name.lower()
    return (name.startswith("cow.") and name != _OPERATION) or name in _GUARDED


class _Inspection:
    """Writes, tamper signs and whether a rewrite may apply, from one walk over the JSON parse tree.

    pglast's ``parse_sql_json`` gives the same tree as ``parse_sql`` for ~1/20 of the cost; nodes are
    ``{"TypeName": {fields}}`` except where the field has a fixed node type (a RangeVar in
    ``relation``), so relations are recognised by their ``relname`` field.
    """

    def __init__(self, catalog: Catalog, in_session: bool, policy: Policy = DEFAULT_POLICY) -> None:
        self.catalog = catalog
        # What a tagged connection may send (proxy/sql/policy.py): checked on the same walk.
        self.policy = PolicyCheck(policy) if in_session else None
        self.watch = in_session and catalog.has_cow_tables
        self.writes: list[tuple[str, str]] = []
        self.tampers = False
        self.found: dict[str, int] = {}  # per rewrite rule, how many nodes its detection said yes to
        self.ctes: set[str] = set()  # CTE names (any level): they may shadow a CoW table's name
        # The result depends on catalog details a stale catalog may get wrong. Not for plain reads and
        # writes of known tables: those cost no catalog check.
        self.in_session = in_session
        self.catalog_dependent = False
        self.error: tuple[str, str, str] | None = None  # (sqlstate, message, detail)
        self.in_do = False  # inside the body of a DO block
        self.path_sets = 0  # SET/RESET search_path statements rewritten by rewrites/app_path.py
        self.unlayered: tuple[str, str, str] | None = None  # a write to a schema without the layer
        self.unqualified: list[tuple[str, str]] = []  # (name, kind) of write targets without a schema
        self.executes = False  # EXECUTE of a statement prepared in SQL
        self.returning_rls = False  # INSERT ... RETURNING into a CoW table with row-level security
        self.path_change = False  # may change search_path or the role

    def cow(self, relation: object) -> bool:
        return (
            isinstance(relation, dict)
            and self.catalog.lookup(relation.get("schemaname"), relation.get("relname")) is not None
        )

    def _write(self, relation: Any, kind: str) -> None:
        if not isinstance(relation, dict) or "relname" not in relation:
            return
        schema, rel = relation.get("schemaname"), str(relation["relname"])
        table = self.catalog.lookup(schema, rel)
        if self.watch and self.unlayered is None and app_path.unlayered(self.catalog, schema):
            self.unlayered = (str(schema), rel, kind)
        if self.watch and not schema and (rel, kind) not in self.unqualified:
            self.unqualified.append((rel, kind))
        name = table.qualified if table is not None else (f"{schema}.{rel}" if schema else rel)
        if (name, kind) not in self.writes:
            self.writes.append((name, kind))

    def walk(self, tree: Any) -> None:
        # Every node of every new text passes here (a fifth of the analysis' CPU in a Django run): the
        # attributes and methods it reads are locals, and each value's type is tested once.
        policy, watch, visit = self.policy, self.watch, self.visit
        stack = [tree]
        pop, push, extend = stack.pop, stack.append, stack.extend
        while stack:
            obj = pop()
            if isinstance(obj, list):
                extend(obj)
                continue
            if not isinstance(obj, dict):
                continue
            if isinstance(obj.get("relname"), str):
                self._relation(obj, policy, watch)
            for key, value in obj.items():
                if isinstance(value, dict):
                    visited = key in _VISITED or (key[:1].isupper() and key[-4:] == "Stmt")
                    if visited and not visit(key, value):
                        continue  # the handler asked not to descend
                    push(value)
                elif isinstance(value, list):
                    push(value)

    def _relation(self, obj: JsonNode, policy: PolicyCheck | None, watch: bool) -> None:
        """A relation reference (a node with a ``relname``)."""
        if policy is not None:
            policy.relation(obj)
        if watch and obj.get("schemaname"):
            if self.cow(obj):
                self.detect(RELATION, obj)
            elif obj["schemaname"] in self.catalog.schemas:
                self.catalog_dependent = True  # perhaps a table enabled since the catalog was read

    def detect(self, name: str, node: JsonNode) -> None:
        """Asks the rewrite rules that watch ``name`` whether they may change the statement."""
        for rule in DETECTORS.get(name, ()):
            if (rule.count_all or rule.name not in self.found) and rule.detect(self, node):
                self.found[rule.name] = self.found.get(rule.name, 0) + 1

    def visit(self, name: str, node: JsonNode) -> bool:
        """One node of the statement's tree; False: do not descend into it."""
        if self.policy is not None:
            self.policy.visit(name, node)
        if self.watch and name in DETECTORS:
            self.detect(name, node)
        if self.in_session and (
            name in _CATALOG_DEPENDENT or (name == "InsertStmt" and "onConflictClause" in node)
        ):
            self.catalog_dependent = True
        kind = _WRITE_KINDS.get(name)
        if kind is not None:
            self._write(node.get("relation"), kind)
        handler = _NODE_HANDLERS.get(name)
        if handler is not None:
            handler(self, node)
        return name not in _SETTINGS_ELSEWHERE  # a definition, or settings for later sessions

    def _on_insert(self, node: JsonNode) -> None:
        returning = node.get("returningClause") or node.get("returningList")  # (parser 18 / 17)
        if self.watch and returning and self._row_security(node.get("relation")):
            self.returning_rls = True

    def _on_update(self, node: JsonNode) -> None:
        if self.watch and self.error is None and not self.in_do:
            self._generated_update(node)

    def _on_cte(self, node: JsonNode) -> None:
        self.ctes.add(str(node.get("ctename")))

    def _on_truncate(self, node: JsonNode) -> None:
        for item in node.get("relations") or ():
            self._write(item.get("RangeVar"), "truncate")

    def _on_copy(self, node: JsonNode) -> None:
        if node.get("is_from"):
            self._write(node.get("relation"), "copy")

    def _on_execute(self, _node: JsonNode) -> None:
        self.executes = True

    def _on_set(self, node: JsonNode) -> None:
        """SET: of the app's path (rewritten), of the role (allowed), of a guarded setting (tampering)."""
        setting = str(node.get("name", "")).lower()
        reset_all = node.get("kind") == "VAR_RESET_ALL"
        if setting in (_ROLE, app_path.SETTING) or reset_all:
            self.path_change = True
        if self.watch and not self.in_do and app_path.sets_path(node):
            self.path_sets += 1
        elif not self.in_do and setting == _ROLE:
            pass
        elif reset_all or _guarded_setting(str(node.get("name", ""))):
            self.tampers = True

    def _on_discard(self, node: JsonNode) -> None:
        if node.get("target") == "DISCARD_ALL":
            self.tampers = True
            self.path_change = True

    def _on_constraints(self, node: JsonNode) -> None:
        # SET CONSTRAINTS <names>: the rewrite adds the layer's constraint triggers of those names
        if self.in_session and node.get("constraints"):
            self.catalog_dependent = True  # a constraint made deferrable since the catalog was read

    def _row_security(self, relation: Any) -> bool:
        """A CoW table with row-level security (an unqualified name several schemas share: perhaps)."""
        if not isinstance(relation, dict):
            return False
        schema, name = relation.get("schemaname"), relation.get("relname")
        if not isinstance(name, str):
            return False
        if schema is None and name in self.catalog.unqualified and self.catalog.unqualified[name] is None:
            return any(t.row_security for (_, n), t in self.catalog.tables.items() if n == name)
        table = self.catalog.lookup(schema, name)
        return table is not None and table.row_security

    def _generated_update(self, node: dict[str, Any]) -> None:
        """PostgreSQL's 428C9 for ``UPDATE t SET g = …`` of a generated or GENERATED ALWAYS identity column.

        PostgreSQL raises it while rewriting the statement, whether or not a row matches; in a session the
        layer's INSTEAD OF trigger only sees rows that match, so the refusal has to come from here.
        """
        relation = node.get("relation")
        if not isinstance(relation, dict):
            return
        table = self.catalog.lookup(relation.get("schemaname"), relation.get("relname"))
        if table is None:
            return
        offending = set()
        for item in node.get("targetList") or ():
            target = item.get("ResTarget", {}) if isinstance(item, dict) else {}
            name = target.get("name")
            column = table.column(name) if isinstance(name, str) else None
            if column is None or target.get("indirection"):
                return  # an unknown column is PostgreSQL's 42703 first; leave odd shapes to the server
            if (column.generated or column.identity_always) and not _is_default(target.get("val")):
                offending.add(column.name)
        for column in table.columns:  # PostgreSQL checks the columns in their table order
            if column.name in offending:
                what = (
                    "an identity column defined as GENERATED ALWAYS"
                    if column.identity_always
                    else "a generated column"
                )
                self.error = (
                    "428C9",
                    f'column "{column.name}" can only be updated to DEFAULT',
                    f'Column "{column.name}" is {what}.',
                )
                return

    def _do_block(self, node: dict[str, Any]) -> None:
        """Inspects the SQL inside a DO block's PL/pgSQL like any other statement.

        Falls back to a word search over the body (any mention of the session machinery counts) for other
        languages, bodies pglast cannot parse, and dynamic EXECUTEs whose SQL is not a literal.
        """
        body: str | None = None
        language = "plpgsql"
        for arg in node.get("args") or ():
            elem = arg.get("DefElem", {})
            value = elem.get("arg", {}).get("String", {}).get("sval")
            if elem.get("defname") == "as" and isinstance(value, str):
                body = value
            elif elem.get("defname") == "language" and isinstance(value, str):
                language = value.lower()
        if body is None:
            return
        # PL/pgSQL plans its statements when they run (a branch not taken raises nothing): no 428C9 here.
        outer, self.in_do = self.in_do, True
        try:
            if language != "plpgsql" or not self._plpgsql(body):
                if self.policy is not None:
                    self.policy.opaque("a DO block whose SQL is built at run time or not PL/pgSQL")
                if _DO_BODY.search(body):
                    self.tampers = True
        finally:
            self.in_do = outer

    def _plpgsql(self, body: str) -> bool:
        """Walks the SQL of a PL/pgSQL body; False when only the word search can judge it."""
        tag = "$cow$"
        while tag in body:
            tag = tag[:-1] + "x$"
        try:
            tree = json.loads(parse_plpgsql_json(f"DO {tag}{body}{tag}"))
        except (ParseError, UnicodeError, ValueError):
            return False
        stack: list[Any] = [tree]
        while stack:
            obj = stack.pop()
            if isinstance(obj, list):
                stack.extend(obj)
                continue
            if not isinstance(obj, dict):
                continue
            dynamic = obj.get("PLpgSQL_stmt_dynexecute")
            if isinstance(dynamic, dict):
                literal = self._literal_sql(dynamic.get("query", {}).get("PLpgSQL_expr", {}).get("query"))
                if literal is None:
                    return False  # EXECUTE of SQL built at run time
                if not self._inspect_sql(literal):
                    return False
            expr = obj.get("PLpgSQL_expr")
            if isinstance(expr, dict) and isinstance(expr.get("query"), str):
                query = expr["query"]
                mode = expr.get("parseMode", 0)
                if mode in (3, 4, 5):  # an assignment, "target := expression": the expression matters
                    query = _ASSIGNMENT_TARGET.sub("", query, count=1)
                # parseMode 0 is a whole statement; the others are expressions
                if not self._inspect_sql(query if mode == 0 else f"SELECT {query}"):
                    return False
            stack.extend(v for v in obj.values() if isinstance(v, dict | list))
        return True

    @staticmethod
    def _literal_sql(expression: Any) -> str | None:
        """The SQL text of an EXECUTE whose argument is a plain string literal, else None."""
        if not isinstance(expression, str):
            return None
        try:
            stmts = json.loads(parse_sql_json(f"SELECT {expression}")).get("stmts") or []
        except (ParseError, UnicodeError, ValueError):
            return None
        targets = stmts[0]["stmt"].get("SelectStmt", {}).get("targetList") or [] if len(stmts) == 1 else []
        value = targets[0].get("ResTarget", {}).get("val", {}) if len(targets) == 1 else {}
        sql = value.get("A_Const", {}).get("sval", {}).get("sval")
        return sql if isinstance(sql, str) else None

    def _inspect_sql(self, sql: str) -> bool:
        try:
            tree = json.loads(parse_sql_json(sql))
        except (ParseError, UnicodeError, ValueError):
            return False
        self.walk(tree.get("stmts") or [])
        return True

    def _func_call(self, node: dict[str, Any]) -> None:
        names = [n.lower() for n in svals(node.get("funcname"))]
        if not names:
            return
        if names[-1] == "use_session" and names[:-1] in ([], ["cow"]):
            self.tampers = True
        elif self.watch and not self.in_do and app_path.set_config_of_path(node):
            self.path_change = True  # rewritten (rewrites/app_path.py)
        elif names[-1] == "set_config" and names[:-1] in ([], ["pg_catalog"]):
            args = node.get("args") or [{}]
            first = args[0]
            if "TypeCast" in first:  # 'cow.x'::text
                first = first["TypeCast"].get("arg", {})
            value = first.get("A_Const", {}).get("sval", {}).get("sval")
            if not isinstance(value, str) or value.lower() in (_ROLE, app_path.SETTING):
                self.path_change = True
            # a guarded name, or one computed at run time that might be
            if not isinstance(value, str) or (
                _guarded_setting(value) and (value.lower() != _ROLE or self.in_do)
            ):
                self.tampers = True


def _is_default(value: Any) -> bool:
    """``DEFAULT``, also as the matching item of ``SET (a, g) = (1, DEFAULT)`` / ``ROW(1, DEFAULT)``."""
    if not isinstance(value, dict):
        return False
    if "SetToDefault" in value:
        return True
    ref = value.get("MultiAssignRef")
    if not isinstance(ref, dict):
        return False
    args = ref.get("source", {}).get("RowExpr", {}).get("args") or []
    colno = ref.get("colno", 0)
    return isinstance(colno, int) and 0 < colno <= len(args) and _is_default(args[colno - 1])


MAX_CACHED_CHARS = 16384


class Analyzer:
    """Analyses statements for one upstream server; results cached (LRU) by comment-stripped text.

    ``server_version_num`` is the upstream's (from its ``server_version`` ParameterStatus); when 0 the
    catalog's (``CATALOG_QUERY`` reports it) is used; when both are unknown MERGE into a CoW table is left
    for the server to accept or refuse and upserts take the version-independent form.
    """

    def __init__(
        self,
        cache_size: int = 4096,
        server_version_num: int = 0,
        policy: Policy = DEFAULT_POLICY,
        key: KeyFunction = shape_key,
        templates: bool = True,
    ) -> None:
        """``templates``: rewrite a shape once and fill its texts' constants in (proxy/sql/templates.py);
        off, every text is rewritten on its own (the tests' oracle)."""
        self.cache_size = cache_size
        self.templates = templates
        self._key = key  # of shapes (proxy/sql/shapes.py)
        self.policy = policy
        self.server_version_num = server_version_num
        self.hits = 0
        self.misses = 0
        # (the verdict; made its cache_hit copy at its first hit: most texts of a Django run never come back)
        self._cache: OrderedDict[tuple[str, bool, int, int, bool], Analysis] = OrderedDict()
        # (shape key, catalog ident) -> what every text of the shape is analysed as, None: not provably one
        self._shapes: OrderedDict[tuple[bytes, int], Analysis | None] = OrderedDict()
        self.shape_hits = 0  # cold texts answered by their shape's proven verdict, without a parse
        self._last: _Parsed | None = None  # the last text parsed in a session (``shape`` may prove it next)
        self._unproven: OrderedDict[tuple[bytes, int], None] = OrderedDict()  # seen once (_first_sight)
        # (shape key, catalog ident, version, prepared) -> the template of the shape's rewrite (None: the
        # rules leave its texts as written) and the verdict of the text that made it
        self._templates: OrderedDict[_TemplateKey, tuple[Template | None, Analysis]] = OrderedDict()
        self._made: tuple[_TemplateKey, Template | None] | None = None  # by the rewrite of the text at hand
        self.template_hits = 0  # cold texts answered by their shape's template, without a parse
        self._rewritten_once: OrderedDict[_TemplateKey, None] = OrderedDict()  # shapes rewritten once
        self._refused: OrderedDict[_TemplateKey, None] = OrderedDict()  # shapes whose probe was refused

    def analyze(
        self,
        sql: str,
        catalog: Catalog,
        in_session: bool,
        server_version_num: int | None = None,
        *,
        prepared: bool = False,
    ) -> Analysis:
        """``prepared``: ``sql`` is the text of a named prepared statement, whose plan PostgreSQL may cache
        (a key read then takes the form whose plan it does cache: ``rewrites.key_reads``)."""
        version = server_version_num or self.server_version_num or catalog.server_version_num
        text = strip_edge_comments(sql)
        key = (text, in_session, catalog.ident, version, prepared)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            self.hits += 1
            if not cached.cache_hit:
                cached = self._cache[key] = replace(cached, cache_hit=True)
            return cached
        self.misses += 1
        result = _fast_path(text, catalog, in_session) or self._by_shape(
            text, catalog, in_session, version, prepared
        )
        if result is None and in_session:
            result = self._by_template(text, catalog, version, prepared)
        if result is None:
            rewrite = self._rewrite if in_session and self.templates else _rewrite
            parsed = _parse(text, catalog, in_session, version, prepared, policy=self.policy, rewrite=rewrite)
            result = parsed.analysis
            self._remember_template(result)
            self._last = parsed if in_session and parsed.stmts else None
        if len(text) > MAX_CACHED_CHARS:
            return result  # bulk statements rarely repeat; 4096 of them could hold gigabytes
        self._cache[key] = result
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return result

    def _by_shape(
        self, text: str, catalog: Catalog, in_session: bool, version: int, prepared: bool
    ) -> Analysis | None:
        """The verdict ``shape`` proved for every text of ``text``'s shape, when it holds here: in a session,
        the same server version. It is what the parse would give (``_shape_verdict``), so a text of a known
        shape skips the parse. Also for a named prepared statement's text (``prepared``), whose verdict
        differs only where the key-read rule rewrites it (``cached_plan``), and a proven shape is never
        rewritten: psycopg sends each server-side cursor's DECLARE as an unnamed Parse, which the relay
        analyses both ways (half of Django's DECLAREs)."""
        if not in_session or version != (self.server_version_num or catalog.server_version_num):
            return None
        if not self._shapes:
            return None
        shape = self._key(text.encode())
        if shape is None:
            return None
        base = self._shapes.get((shape, catalog.ident))
        if base is None:
            return None
        self.shape_hits += 1
        return base

    def _by_template(self, text: str, catalog: Catalog, version: int, prepared: bool) -> Analysis | None:
        """The verdict of a text whose shape's rewrite is a template (``_rewrite``): the first text's, with
        this text's constants in the rewritten text. The C key finds the template; Python's lexer gives the
        literals' places."""
        if not self._templates:
            return None
        data = text.encode()
        found = self._key(data)
        if found is None:
            return None
        key = (found, catalog.ident, version, prepared)
        entry = self._templates.get(key)
        if entry is None:
            return None
        template, verdict = entry
        if template is not None:
            shape = lex(data)
            if shape is None or shape.key != found:
                return None
            verdict = replace(verdict, rewritten=template.fill(data, shape))
        self._templates.move_to_end(key)
        self.template_hits += 1
        return verdict

    def _rewrite(self, target: _ToRewrite) -> Outcome:
        """The rewrite of a parsed text, made as its shape's template when it may be (``_may_template``,
        ``_probe``) at the second text of the shape, or at the first when it may hold a long IN list (the
        probe's is one constant: ``_long_list``): the rewriter runs on the probe instead of the text, and
        the text's constants fill the template; the template waits in ``_made`` for the verdict
        (``_remember_template``). Otherwise the rewriter runs on the text itself: most rewritten shapes come
        once (the bulk ones among them), and the template costs the lexer's passes and walks on top of the
        rewrite; a shape whose probe was refused (its literals are not data, or the rules or the deparser do
        not carry them through) is not probed again."""
        found = self._key(target.text.encode()) if _may_template(target) else None
        if found is None:
            return _rewrite(target)  # (no literal: nothing to fill in)
        key = (found, target.catalog.ident, target.version, target.prepared)
        if key in self._refused or (
            _first_time(self._rewritten_once, key, self.cache_size) and not _long_list(target.text)
        ):
            return _rewrite(target)
        probed = _probe(target)
        if probed is None:
            return self._refuse(key, target)
        shape, grouped, probe_text = probed
        try:
            outcome = target.rewriter().rewrite(pglast.parse_sql(probe_text), probe_text)
        except Exception:  # (a refusal: the text's own, with its own message)
            return self._refuse(key, target)
        if outcome.sql is None:
            self._made = (key, None)
            return outcome
        template = build(outcome.sql, shape, grouped)
        if template is None:
            return self._refuse(key, target)
        self._made = (key, template)
        return Outcome(template.fill(target.text.encode(), shape), outcome.tag_map)

    def _refuse(self, key: _TemplateKey, target: _ToRewrite) -> Outcome:
        """The text rewritten alone, and its shape not probed again (what refused it is the shape's)."""
        self._refused[key] = None
        if len(self._refused) > self.cache_size:
            self._refused.popitem(last=False)
        return _rewrite(target)

    def _remember_template(self, verdict: Analysis) -> None:
        """Keeps the template the text's rewrite made, with its verdict (not a refusal)."""
        made, self._made = self._made, None
        if made is None or verdict.error is not None:
            return
        key, template = made
        # (without its text: the texts of the shape fill the template in)
        self._templates[key] = (template, verdict if template is None else replace(verdict, rewritten=None))
        if len(self._templates) > self.cache_size:
            self._templates.popitem(last=False)

    def shape(self, sql: str, catalog: Catalog, verdict: Analysis) -> bytes | None:
        """The literal-normalised key (proxy/sql/shapes.py) under which ``verdict``, a session's verdict for
        ``sql`` that forwards it as it is, holds for every text of that shape; None when ``sql`` has no
        literal or its literals may matter (then only the exact text can be cached)."""
        text = sql.encode()
        shape = self._key(text)
        if shape is None:
            return None
        key = (shape, catalog.ident)
        if key in self._shapes:
            self._shapes.move_to_end(key)
            base = self._shapes[key]
        else:
            version = self.server_version_num or catalog.server_version_num
            last = self._last
            known = last if last is not None and last.matches(sql, catalog, version) else None
            if known is None and self._first_sight(key):
                return None  # (its proof would parse it: wait for a second text of the shape)
            found = lex(text)  # the literals' places, for the proof (the key function gives none)
            base = self._shapes[key] = (
                _shape_verdict(sql, found, catalog, version, self.policy, known=known)
                if found is not None
                else None
            )
            if len(self._shapes) > self.cache_size:
                self._shapes.popitem(last=False)
        if base is None or _shape_fields(base) != _shape_fields(verdict):
            return None  # (the fast path's verdict and the parse's disagree: not a case to cache)
        return shape

    def _first_sight(self, key: tuple[bytes, int]) -> bool:
        """Whether a shape whose proof needs a parse of its own (the text was not parsed: the fast path or
        the cache answered) is seen for the first time; it is then remembered, and proven at its next
        text. Most such shapes come once (a Django run: 453 of 492 in six modules), and their proof costs
        the parse the fast path spared."""
        return _first_time(self._unproven, key, self.cache_size)


def _first_time(seen: OrderedDict[Any, None], key: object, limit: int) -> bool:
    """Whether ``key`` is not among the ``seen`` (the last ``limit`` keys seen once): then it is, else it
    leaves them (its second time is the one that counts)."""
    if key in seen:
        del seen[key]
        return False
    seen[key] = None
    if len(seen) > limit:
        seen.popitem(last=False)
    return True


def _shape_fields(verdict: Analysis) -> tuple[object, ...]:
    return (
        verdict.kind,
        verdict.writes,
        verdict.unqualified_writes,
        verdict.executes,
        verdict.rewritten,
        verdict.tampers,
        verdict.error,
        verdict.tag_map,
        verdict.catalog_dependent,
        verdict.path_change,
    )


# Rules whose detection may fire on a statement whose shape is still cached (when they leave it unchanged).
_LITERAL_BLIND = frozenset(rule.name for rule in RULES if rule.literal_blind)
# Rules whose rewrite of a shape is a template of it (proxy/sql/templates.py).
_TEMPLATED = frozenset(rule.name for rule in RULES if rule.literal_template)
_TemplateKey = tuple[bytes, int, int, bool]


# A text with at least this many commas may hold a long IN list: its probe writes the list as one constant
# (proxy/sql/templates.py), which pays at its first text already.
_LONG_LIST = 64


def _long_list(text: str) -> bool:
    return text.count(",") >= _LONG_LIST


def _may_template(target: _ToRewrite) -> bool:
    """Whether a parsed text's rewrite may be a template of its shape, as far as its walk tells: one
    statement, small enough to be cached, rewritten only by rules that carry constants as they are
    (``Rule.literal_template``), nothing that tampers or changes the path or marks a RETURNING."""
    inspection = target.inspection
    return not (
        len(target.stmts) != 1
        or len(target.text) > MAX_CACHED_CHARS
        or not inspection.found.keys() <= _TEMPLATED
        or inspection.tampers
        or inspection.path_sets
        or inspection.path_change
        or inspection.returning_rls
    )


def _probe(target: _ToRewrite) -> tuple[Shape, Constants, str] | None:
    """The shape of a text that ``_may_template``, its literals' groups and signs, and its probe
    (``templates.probe``), when its literals are data (``literals_irrelevant``) and written by the deparser
    as they are (``templates.constants``)."""
    text, stmts = target.text, target.stmts
    data = text.encode()
    shape = lex(data)
    if shape is None or not shape.literals or not literals_irrelevant(data, stmts, shape):
        return None
    found = constants(data, shape, stmts)
    probed = probe(data, shape, found) if found is not None else None
    if found is None or probed is None:
        return None
    probe_text, key = probed
    lexed = lex(probe_text.encode())
    if lexed is None or lexed.key != key:
        return None  # (a sentinel run into its neighbours)
    return shape, found, probe_text


def _shape_verdict(
    sql: str, shape: Shape, catalog: Catalog, version: int, policy: Policy, *, known: _Parsed | None = None
) -> Analysis | None:
    """What the analysis of ``sql`` decides in a session, when that cannot depend on its literals' values:
    nothing is refused, tampered with or rewritten, no rule that may read a constant's value looks at it
    (``Rule.literal_blind``), and every literal is data only (``literals_irrelevant``); else None. Parsed
    whole, not comment-stripped: the literals' locations are offsets into its bytes. ``known``: the
    analysis' own parse of this very text in a session (``_Parsed.matches``), whose tree, walk and verdict
    are those this would make again."""
    if known is not None:
        stmts, inspection = known.stmts, known.inspection
    else:
        try:
            stmts = json.loads(parse_sql_json(sql)).get("stmts") or []
        except (ParseError, UnicodeError, ValueError):
            return None
        inspection = None
    if not stmts or not literals_irrelevant(sql.encode(), stmts, shape):
        return None
    if inspection is None:
        inspection = _inspect(stmts, catalog, True, policy)
    if (
        not inspection.found.keys() <= _LITERAL_BLIND
        or inspection.tampers
        or inspection.error is not None
        or inspection.unlayered is not None
        or inspection.path_sets
        or inspection.path_change
        or inspection.returning_rls
        or inspection.catalog_dependent
        or (inspection.policy is not None and inspection.policy.refusal is not None)
    ):
        return None
    if inspection.found:  # the rules run, as on any text of the shape, and must leave it as it is
        if known is not None and not known.prepared:
            full = known.analysis
        else:
            full = _analyze_parsed(sql, catalog, True, version, False, policy=policy)
        return full if full.rewritten is None and full.error is None and full.tag_map is None else None
    kinds = [_kind(name, "intoClause" in fields) for raw in stmts for name, fields in raw["stmt"].items()]
    return Analysis(
        kind=kinds[0] if len(kinds) == 1 else "multi",
        writes=tuple(inspection.writes),
        unqualified_writes=tuple(inspection.unqualified),
        executes=inspection.executes and inspection.watch,
    )


@dataclass(frozen=True)
class _Parsed:
    """One text's parse and walk, and the verdict made of them."""

    text: str
    catalog_ident: int
    version: int
    prepared: bool
    stmts: list[Any]
    inspection: _Inspection | None
    analysis: Analysis

    def matches(self, sql: str, catalog: Catalog, version: int) -> bool:
        """Whether this is the parse in a session of ``sql`` itself (no edge comment stripped from it)."""
        return (
            self.inspection is not None
            and self.text == sql
            and self.catalog_ident == catalog.ident
            and self.version == version
        )


def _inspect(stmts: list[Any], catalog: Catalog, in_session: bool, policy: Policy) -> _Inspection:
    inspection = _Inspection(catalog, in_session, policy)
    inspection.walk(stmts)
    if inspection.watch:
        for raw in stmts:
            inspection.detect(STATEMENT, raw["stmt"])
    return inspection


def _analyze_parsed(
    text: str, catalog: Catalog, in_session: bool, version: int, prepared: bool, *, policy: Policy
) -> Analysis:
    return _parse(text, catalog, in_session, version, prepared, policy=policy).analysis


@dataclass(frozen=True)
class _ToRewrite:
    """A parsed text that a rule may change, as the rewriter needs it."""

    text: str
    stmts: list[Any]  # (the JSON tree's)
    inspection: _Inspection
    catalog: Catalog
    version: int
    prepared: bool

    def rewriter(self) -> Rewriter:
        found, ctes = self.inspection.found, frozenset(self.inspection.ctes)
        return Rewriter(self.catalog, self.version, found, ctes=ctes, cached_plan=self.prepared)


# How a parsed text is rewritten: ``_rewrite`` rewrites the text itself; an analyzer may answer from a
# template of the text's shape (``Analyzer._rewrite``).
RewriteFunction = Callable[[_ToRewrite], Outcome]


def _rewrite(target: _ToRewrite) -> Outcome:
    """The rewriter on the text: only now the full parse into pglast nodes, which it edits and deparses."""
    return target.rewriter().rewrite(pglast.parse_sql(target.text), target.text)


def _parse(
    text: str,
    catalog: Catalog,
    in_session: bool,
    version: int,
    prepared: bool,
    *,
    policy: Policy,
    rewrite: RewriteFunction = _rewrite,
) -> _Parsed:
    def done(stmts: list[Any], inspection: _Inspection | None, analysis: Analysis) -> _Parsed:
        return _Parsed(text, catalog.ident, version, prepared, stmts, inspection, analysis)

    try:
        tree = json.loads(parse_sql_json(text))
    except (ParseError, UnicodeError, ValueError):
        # Let the server report its own syntax error (42601) to the client.
        first = _FIRST_WORD.match(text)
        return done(
            [], None, Analysis(kind=_FAST_KINDS.get(first.group(1).lower(), "other") if first else "other")
        )
    stmts = tree.get("stmts") or []
    if not stmts:
        return done([], None, Analysis(kind="other"))
    inspection = _inspect(stmts, catalog, in_session, policy)
    verdict = _verdict(text, stmts, inspection, catalog, version, prepared=prepared, rewrite=rewrite)
    return done(stmts, inspection, verdict)


def _verdict(
    text: str,
    stmts: list[Any],
    inspection: _Inspection,
    catalog: Catalog,
    version: int,
    *,
    prepared: bool,
    rewrite: RewriteFunction = _rewrite,
) -> Analysis:
    """What the walk of a parsed text decides: a refusal, a rewrite by the rules it found, or neither."""
    kinds = []
    for raw in stmts:
        ((name, fields),) = raw["stmt"].items()
        kinds.append(_kind(name, "intoClause" in fields))
    kind = kinds[0] if len(kinds) == 1 else "multi"
    base = Analysis(
        kind=kind,
        writes=tuple(inspection.writes),
        # a SET of search_path is rewritten only as a statement of its own (its tag becomes SET)
        tampers=inspection.tampers or (inspection.path_sets > 0 and len(stmts) > 1),
        catalog_dependent=inspection.catalog_dependent,
        unqualified_writes=tuple(inspection.unqualified),
        executes=inspection.executes and inspection.watch,
        path_change=inspection.path_change,
    )
    if inspection.policy is not None and inspection.policy.refusal is not None:
        return replace(base, error=(SQLSTATE_REFUSED, inspection.policy.refusal))
    if inspection.error is not None:
        sqlstate, message, detail = inspection.error
        return replace(base, error=(sqlstate, message), error_detail=detail)
    if inspection.unlayered is not None:
        return replace(base, error=app_path.unlayered_refusal(*inspection.unlayered))
    if len(stmts) > 1 and base.path_change and base.resolves_writes:
        # The server is asked where the names resolve before the query string runs, not in its middle.
        return replace(base, error=(SQLSTATE_REFUSED, app_path.PATH_AND_WRITES_MESSAGE))
    # INSERT ... RETURNING under row-level security: marked for the layer's trigger (38_rls.sql), which then
    # checks the new row against the SELECT policies. Not in a string of several statements: the mark would
    # hold for all of them (docs/layer.md).
    mark = RETURNING_MARK if inspection.returning_rls and len(stmts) == 1 else ""
    if not inspection.found:
        return replace(base, rewritten=mark + text) if mark else base
    try:
        outcome = rewrite(_ToRewrite(text, stmts, inspection, catalog, version, prepared))
    except RewriteError as exc:
        return replace(base, error=(exc.sqlstate, str(exc)))
    except Exception as exc:  # a statement shape the rewriter does not know: refuse rather than guess
        message = f"cowproxy cannot rewrite this statement inside a session ({type(exc).__name__}: {exc})"
        return replace(base, error=("0A000", message))
    if mark:
        return replace(base, rewritten=mark + (outcome.sql or text), tag_map=outcome.tag_map)
    return replace(base, rewritten=outcome.sql, tag_map=outcome.tag_map)


def split_trailing_reset(sql: str) -> str | None:
    """The statements before a trailing ``RESET ALL`` / ``DISCARD ALL``, or None when there is none.

    Connection pools end a connection's use with such a reset (asyncpg sends ``…; RESET ALL``). It clears
    the session's GUCs and search_path, which is harmless when nothing runs after it in the same query
    string: the proxy re-applies the tags before the next statement. A reset followed by anything else
    stays a refusal, since that statement would run untagged.
    """
    try:
        stmts = pglast.parse_sql(sql)
    except (ParseError, UnicodeError, ValueError):
        return None
    resets = 0
    for raw in reversed(stmts):
        if not _is_reset(raw.stmt):
            break
        resets += 1
    if resets == 0:
        return None
    # pglast reports statement locations in characters (it converts the parser's byte offsets).
    kept = []
    for raw in stmts[: len(stmts) - resets]:
        start = raw.stmt_location or 0
        kept.append(sql[start : start + raw.stmt_len] if raw.stmt_len else sql[start:])
    return ";\n".join(kept)


def _is_reset(node: Any) -> bool:

    if isinstance(node, ast.VariableSetStmt):
        return bool(node.kind == enums.VariableSetKind.VAR_RESET_ALL)
    if isinstance(node, ast.DiscardStmt):
        return bool(node.target == enums.DiscardMode.DISCARD_ALL)
    return False


# The statements that write the relation they name, by node name (UPDATE, TRUNCATE and COPY have handlers).
_WRITE_KINDS = {"InsertStmt": "insert", "UpdateStmt": "update", "DeleteStmt": "delete", "MergeStmt": "merge"}
# What _Inspection.visit does for a node beyond the rules' detection, by node name.
_NODE_HANDLERS: dict[str, Callable[[_Inspection, JsonNode], None]] = {
    "InsertStmt": _Inspection._on_insert,
    "UpdateStmt": _Inspection._on_update,
    "CommonTableExpr": _Inspection._on_cte,
    "TruncateStmt": _Inspection._on_truncate,
    "CopyStmt": _Inspection._on_copy,
    "ExecuteStmt": _Inspection._on_execute,
    "VariableSetStmt": _Inspection._on_set,
    "DiscardStmt": _Inspection._on_discard,
    "FuncCall": _Inspection._func_call,
    "DoStmt": _Inspection._do_block,
    "ConstraintsSetStmt": _Inspection._on_constraints,
}
# The node names ``_Inspection.visit`` may act on besides statements (names ending in "Stmt", which it always
# visits): what the rules detect, what handlers, write kinds and the policy read. Of a Django SELECT's nodes
# (ColumnRef, String, A_Const, ResTarget, …) most are none of these, and the walk does not call it for them.
_VISITED = frozenset(
    name
    for name in (
        *DETECTORS,
        *_NODE_HANDLERS,
        *_WRITE_KINDS,
        *_CATALOG_DEPENDENT,
        *_SETTINGS_ELSEWHERE,
        *POLICY_VISITED,
    )
    if name[:1].isupper()  # (node names: not the rules' pseudo-nodes ":relation", ":statement")
)
