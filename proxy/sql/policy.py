"""What a tagged connection may send: an allow-list over the statement tree (docs/threat-model.md, "The
proxy").

A tagged connection belongs to an agent under evaluation, which is not trusted. Its statements may query
and change the application's relations, control transactions, set harmless settings, prepare and execute,
copy application tables to and from the client, use cursors, LISTEN/NOTIFY, EXPLAIN, SHOW and DISCARD.
Anything else is refused with 42501 and a message that names the rule it broke:

- ``layer``: a reference to the layer's schemas (``cow``, ``cow_changes``, ``cow_overlay_*``): its registry,
  changes tables, functions and overlay views by name. Never allowed.
- ``ddl``: CREATE, ALTER, DROP, GRANT, COMMENT, … (temporary tables excepted: made by CREATE TEMP, or
  named ``pg_temp.x`` in ALTER TABLE, CREATE INDEX and DROP).
- ``function``: CREATE or ALTER of a function or procedure (its body would run SQL the proxy never sees).
- ``do``: a DO block.
- ``dynamic``: SQL run from text the proxy cannot read first: a DO block whose body is not PL/pgSQL or
  builds its SQL at run time, and the built-in functions that run a query given as text (``query_to_xml``,
  ``ts_stat``, …).
- ``file``: the server's files and programs: ``COPY … TO/FROM 'file'``, ``COPY … PROGRAM``,
  ``pg_read_file`` and the other file functions, ``lo_import``/``lo_export``.
- ``remote``: ``dblink`` (a second connection, outside the session).
- ``catalog``: writes to the system catalogs (a superuser may UPDATE ``pg_trigger``).
- ``system``: ALTER SYSTEM, LOAD, CHECKPOINT and the server-administration functions (terminating other
  backends, reloading the configuration, replication slots).
- ``statement``: any other statement type.

All but ``layer`` can be allowed per deployment (``session_allow``; a migration agent needs ``ddl``). Changes
of the session state itself (``cow.session_id``, ``session_authorization``, ``session_replication_role``,
RESET ALL …) are the analysis' ``tampers`` (proxy.sql.analyze), refused always.

The visitor reads the JSON parse tree the analysis walks anyway (``_Inspection.walk``): one parse per
statement text, cached with the analysis. It is not a ``pglast.Visitor`` over ``pglast.parse_sql`` nodes,
which would cost that full parse (~20x the JSON one) on every tagged statement, the fast path's included.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from proxy.errors import ConfigError
from proxy.sql.jsontree import JsonNode, child, children, string, svals

RULES = ("layer", "ddl", "function", "do", "dynamic", "file", "remote", "catalog", "system", "statement")
# The rules a deployment may lift (``session_allow``): all but the layer's own objects.
ALLOWABLE = frozenset(RULES) - {"layer"}

LAYER_SCHEMAS = frozenset({"cow", "cow_changes"})
OVERLAY_PREFIX = "cow_overlay_"
CATALOG_SCHEMAS = frozenset({"pg_catalog", "information_schema"})

# Words of which a statement must contain one for this policy to refuse it (besides its statement type,
# which the analysis' fast path already restricts to SELECT, SHOW, FETCH, …): the fast path sends a text
# with one of them to the parser. ``cow`` covers every layer schema; false positives cost a parse.
FAST_PATH_WORDS = (
    "cow", "pg_read", "pg_ls_", "pg_stat_file", "pg_file", "lo_import", "lo_export", "dblink", "_to_xml",
    "ts_stat", "pg_terminate", "pg_cancel", "pg_reload", "pg_rotate", "pg_switch", "pg_promote",
    "pg_create_", "pg_drop_", "pg_replication", "pg_logical", "pg_wal_replay", "pg_import_system",
    "pg_log_backend", "setval", "nextval",
)  # fmt: skip

# Functions by (lower-cased) name, in pg_catalog (called unqualified or pg_catalog.-qualified), by rule.
_FUNCTIONS: dict[str, str] = {
    **dict.fromkeys(
        (
            "pg_read_file", "pg_read_binary_file", "pg_ls_dir", "pg_stat_file", "pg_ls_logdir",
            "pg_ls_waldir", "pg_ls_tmpdir", "pg_ls_archive_statusdir", "pg_ls_logicalsnapdir",
            "pg_ls_logicalmapdir", "pg_ls_replslotdir", "pg_ls_summariesdir", "lo_import", "lo_export",
            "pg_file_write", "pg_file_rename", "pg_file_unlink", "pg_file_sync",
        ),
        "file",
    ),
    **dict.fromkeys(
        (
            "query_to_xml", "query_to_xmlschema", "query_to_xml_and_xmlschema", "table_to_xml",
            "table_to_xmlschema", "table_to_xml_and_xmlschema", "schema_to_xml", "schema_to_xmlschema",
            "schema_to_xml_and_xmlschema", "database_to_xml", "database_to_xmlschema",
            "database_to_xml_and_xmlschema", "ts_stat",
        ),
        "dynamic",
    ),
    **dict.fromkeys(
        (
            "pg_terminate_backend", "pg_cancel_backend", "pg_reload_conf", "pg_rotate_logfile",
            "pg_switch_wal", "pg_promote", "pg_create_restore_point", "pg_create_physical_replication_slot",
            "pg_create_logical_replication_slot", "pg_drop_replication_slot",
            "pg_copy_physical_replication_slot", "pg_copy_logical_replication_slot",
            "pg_replication_slot_advance", "pg_replication_origin_create",
            "pg_replication_origin_drop", "pg_replication_origin_session_setup", "pg_logical_emit_message",
            "pg_wal_replay_pause", "pg_wal_replay_resume", "pg_import_system_collations",
            "pg_log_backend_memory_contexts", "pg_backup_start", "pg_backup_stop",
        ),
        "system",
    ),
}  # fmt: skip
# The layer's functions a tagged connection may call: they only name its own operation or read its session.
LAYER_FUNCTIONS_ALLOWED = frozenset({"use_operation", "current_session", "bound_session"})
# Functions whose first argument names a relation as text: a layer name there is a layer reference.
_RELATION_ARGUMENT = frozenset({"nextval", "setval", "currval"})

# Statements allowed as such (their parts are checked as the walk reaches them); those with a handler below
# are judged by it.
_ALLOWED = frozenset(
    {
        "SelectStmt", "InsertStmt", "UpdateStmt", "DeleteStmt", "MergeStmt", "TruncateStmt", "CopyStmt",
        "TransactionStmt", "VariableSetStmt", "VariableShowStmt", "PrepareStmt", "ExecuteStmt",
        "DeallocateStmt", "DeclareCursorStmt", "FetchStmt", "ClosePortalStmt", "ListenStmt", "NotifyStmt",
        "UnlistenStmt", "ExplainStmt", "DiscardStmt", "LockStmt", "ConstraintsSetStmt",
        "VacuumStmt",
    }
)  # fmt: skip
_FUNCTION_DDL = frozenset({"CreateFunctionStmt", "AlterFunctionStmt"})
_SYSTEM = frozenset({"AlterSystemStmt", "LoadStmt", "CheckPointStmt"})
_DDL_OTHER = frozenset(
    {
        "IndexStmt", "ViewStmt", "RuleStmt", "RenameStmt", "CommentStmt", "GrantStmt", "GrantRoleStmt",
        "DefineStmt", "CompositeTypeStmt", "SecLabelStmt", "ImportForeignSchemaStmt", "RefreshMatViewStmt",
        "ReassignOwnedStmt", "ClusterStmt", "ReindexStmt", "CreatedbStmt", "DropdbStmt", "DropRoleStmt",
        "DropOwnedStmt", "DropTableSpaceStmt", "DropUserMappingStmt", "DropSubscriptionStmt",
    }
)  # fmt: skip
# What a refused statement is called in the message, where its node name does not say it plainly.
_NAMES = {
    "CreateStmt": "CREATE TABLE",
    "CreateTableAsStmt": "CREATE TABLE AS",
    "IndexStmt": "CREATE INDEX",
    "ViewStmt": "CREATE VIEW",
    "RuleStmt": "CREATE RULE",
    "CreateTrigStmt": "CREATE TRIGGER",
    "CreatedbStmt": "CREATE DATABASE",
    "DropdbStmt": "DROP DATABASE",
    "DoStmt": "DO",
    "GrantStmt": "GRANT/REVOKE",
    "GrantRoleStmt": "GRANT/REVOKE role",
    "RenameStmt": "ALTER … RENAME",
    "DefineStmt": "CREATE (aggregate, operator, type …)",
    "CheckPointStmt": "CHECKPOINT",
    "CreateFunctionStmt": "CREATE FUNCTION",
    "AlterFunctionStmt": "ALTER FUNCTION",
    "CreateEventTrigStmt": "CREATE EVENT TRIGGER",
    "SelectStmt": "SELECT INTO",
}
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])")


def statement_name(node_name: str, node: JsonNode | None = None) -> str:
    """``DropStmt`` of a schema -> ``DROP SCHEMA``; ``AlterTableStmt`` -> ``ALTER TABLE``."""
    if node_name == "DropStmt" and node is not None:
        kind = str(node.get("removeType", "")).removeprefix("OBJECT_").replace("_", " ")
        return f"DROP {kind}".strip()
    if node_name == "CreateFunctionStmt" and node is not None and node.get("is_procedure"):
        return "CREATE PROCEDURE"
    name = _NAMES.get(node_name)
    if name is not None:
        return name
    return _CAMEL.sub(" ", node_name.removesuffix("Stmt")).upper()


def layer_schema(name: object) -> bool:
    """A schema of the layer: its functions and registry, the changes tables, an overlay schema."""
    if not isinstance(name, str):
        return False
    lowered = name.lower()  # (also a quoted "COW": refusing a look-alike costs nothing)
    return lowered in LAYER_SCHEMAS or lowered.startswith(OVERLAY_PREFIX)


def _layer_name(text: str) -> bool:
    """A relation or schema name given as text (``'cow.sessions'``, ``'"cow_changes".x'``)."""
    schema = text.strip().split(".", 1)[0].strip().strip('"') if "." in text else ""
    return layer_schema(schema)


@dataclass(frozen=True)
class Policy:
    """The rules lifted for tagged connections (``session_allow``); the rest refuse."""

    allow: frozenset[str] = frozenset()

    @classmethod
    def from_names(cls, names: Iterable[object]) -> Policy:
        allow = set()
        for name in names:
            if not isinstance(name, str) or name.lower() not in ALLOWABLE:
                raise ConfigError(
                    f"session_allow: unknown or fixed rule {name!r} (may be: {', '.join(sorted(ALLOWABLE))})"
                )
            allow.add(name.lower())
        return cls(frozenset(allow))

    def allows(self, rule: str) -> bool:
        return rule in self.allow


DEFAULT_POLICY = Policy()


def refusal_message(rule: str, what: str) -> str:
    hint = f'; session_allow = ["{rule}"] allows it' if rule in ALLOWABLE else ""
    return f'cowproxy: {what} is refused on a tagged connection (rule "{rule}"{hint})'


class PolicyCheck:
    """The policy's visitor for one statement text: ``visit`` for each node of the JSON tree, ``relation``
    for each relation reference, ``opaque`` for SQL the walk could not read. The first refusal sticks."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.refusal: str | None = None

    def refuse(self, rule: str, what: str) -> None:
        if self.refusal is None and not self.policy.allows(rule):
            self.refusal = refusal_message(rule, what)

    def visit(self, name: str, node: JsonNode) -> None:
        handler = _HANDLERS.get(name)
        if handler is not None:
            handler(self, node)
        elif name[-4:] == "Stmt" and name not in _ALLOWED:
            if not _temporary_target(name, node):
                self.refuse(_statement_rule(name), statement_name(name, node))
            self._ddl_names(node)
        if name in _NAMING_CREATES:
            self._ddl_names(node)
        if name in _CREATED_NAME:
            self._unqualified_create(name, node)

    def _unqualified_create(self, name: str, node: JsonNode) -> None:
        """In a session the physical search_path begins with the layer's overlay schema: an object created
        by an unqualified name (DDL a deployment lets through) would be made there, outside every session
        and the layer's reach, and the rows written to such a table would stay when the session goes."""
        field, kind = _CREATED_NAME[name]
        value = node.get(field)
        if kind == "relation":
            target = child(node, "into", "rel") if field == "into" else value
            unqualified = isinstance(target, dict) and target.get("schemaname") is None
            unqualified = unqualified and isinstance(target, dict) and target.get("relpersistence") != "t"
            shown = str(target.get("relname", "")) if isinstance(target, dict) else ""
        elif kind == "names":
            names = svals(value)
            unqualified, shown = len(names) == 1, ".".join(names)
        else:  # an extension: its objects go to the creation schema unless SCHEMA is given
            options = [child(item, "DefElem").get("defname") for item in children(node, "options")]
            unqualified, shown = "schema" not in options, str(value)
        if unqualified:
            self.refuse(
                "layer",
                f"{statement_name(name, node)} {shown} without a schema (in a session it would be "
                "made in the layer's overlay schema; name the schema, e.g. public.x)",
            )

    def _ddl_names(self, node: JsonNode) -> None:
        """DDL a deployment lets through (``ddl``, ``function`` lifted) still may not name the layer's
        schemas or its triggers. There a schema is often named by a string, not a relation (DROP SCHEMA cow,
        ALTER SCHEMA … RENAME, GRANT … ON SCHEMA, a function's qualified name, DROP TABLE's list of names),
        which the relation check does not see."""
        for value in _ddl_name_strings(node):
            if layer_schema(value):
                self.refuse("layer", f"DDL naming the layer's schema {value}")
                return
            if value.lower() in LAYER_TRIGGERS:
                self.refuse("layer", f"DDL naming the layer's trigger {value}")
                return

    def relation(self, node: JsonNode) -> None:
        """A RangeVar (a relation named anywhere in the statement)."""
        schema = node.get("schemaname")
        if schema is not None and layer_schema(schema):
            self.refuse("layer", f"a reference to the layer's schema {schema}")

    def opaque(self, what: str) -> None:
        self.refuse("dynamic", what)

    # -- handlers, by node type --------------------------------------------------------------------------

    def _func_call(self, node: JsonNode) -> None:
        names = svals(node.get("funcname"))
        if not names:
            return
        if len(names) > 1 and layer_schema(names[-2]):
            if names[-2].lower() == "cow" and names[-1].lower() in LAYER_FUNCTIONS_ALLOWED:
                return
            self.refuse("layer", f"a call of the layer's function {'.'.join(names[-2:])}")
            return
        if len(names) > 1 and names[-2].lower() != "pg_catalog":
            return  # an application's function of that name
        function = names[-1].lower()
        rule = _FUNCTIONS.get(function)
        if rule is not None:
            self.refuse(rule, f"{function}()")
        elif function.startswith("dblink"):
            self.refuse("remote", f"{function}()")
        elif function in _RELATION_ARGUMENT:
            first = _string_argument(node)
            if first is not None and _layer_name(first):
                self.refuse("layer", f"{function}() of the layer's sequence {first}")

    def _set(self, node: JsonNode) -> None:
        if str(node.get("name", "")).lower() != "search_path":
            return
        for item in children(node, "args"):
            value = string(item, "A_Const", "sval", "sval")
            for part in (value or "").split(","):
                if layer_schema(part.strip().strip('"')):
                    self.refuse("layer", f"a search_path with the layer's schema {part.strip()}")
                    return

    def _copy(self, node: JsonNode) -> None:
        if node.get("is_program"):
            self.refuse("file", "COPY … PROGRAM")
        elif node.get("filename") is not None:
            self.refuse("file", "COPY to or from a server file")
        if node.get("is_from"):
            self._catalog_write(child(node, "relation"))

    def _create(self, node: JsonNode) -> None:
        if child(node, "relation").get("relpersistence") != "t":
            self.refuse("ddl", "CREATE TABLE")

    def _create_as(self, node: JsonNode) -> None:
        if node.get("objtype") == "OBJECT_MATVIEW":
            self.refuse("ddl", "CREATE MATERIALIZED VIEW")
        elif child(node, "into", "rel").get("relpersistence") != "t":
            self.refuse("ddl", "CREATE TABLE AS")

    def _select(self, node: JsonNode) -> None:
        into = child(node, "intoClause")
        if into and child(into, "rel").get("relpersistence") != "t":
            self.refuse("ddl", "SELECT INTO")
            self._unqualified_create("CreateTableAsStmt", {"into": into})

    def _write(self, node: JsonNode) -> None:
        self._catalog_write(child(node, "relation"))

    def _truncate(self, node: JsonNode) -> None:
        for item in children(node, "relations"):
            self._catalog_write(child(item, "RangeVar"))

    def _catalog_write(self, relation: JsonNode) -> None:
        schema = relation.get("schemaname")
        name = str(relation.get("relname", ""))
        if (isinstance(schema, str) and schema.lower() in CATALOG_SCHEMAS) or (
            schema is None and name.lower().startswith("pg_")
        ):
            self.refuse("catalog", f"a write to the system catalog {name}")

    def _call(self, node: JsonNode) -> None:
        self._func_call(child(node, "funccall"))  # (a field of fixed type: not visited as a node)

    def _do(self, _node: JsonNode) -> None:
        self.refuse("do", "a DO block")

    def _create_function(self, node: JsonNode) -> None:
        self.refuse("function", statement_name("CreateFunctionStmt", node))


# Statements with a handler of their own that name objects to create (the rest: visit's DDL branch).
_NAMING_CREATES = frozenset({"CreateStmt", "CreateTableAsStmt", "CreateFunctionStmt"})
# Statements that create an object in the creation schema: the field naming it, and how it is named.
_CREATED_NAME: dict[str, tuple[str, str]] = {
    "CreateStmt": ("relation", "relation"),
    "CreateTableAsStmt": ("into", "relation"),
    "ViewStmt": ("view", "relation"),
    "CreateSeqStmt": ("sequence", "relation"),
    "CompositeTypeStmt": ("typevar", "relation"),
    "CreateFunctionStmt": ("funcname", "names"),
    "DefineStmt": ("defnames", "names"),
    "CreateEnumStmt": ("typeName", "names"),
    "CreateRangeStmt": ("typeName", "names"),
    "CreateDomainStmt": ("domainname", "names"),
    "CreateStatsStmt": ("defnames", "names"),
    "CreateConversionStmt": ("conversion_name", "names"),
    "CreateOpClassStmt": ("opclassname", "names"),
    "CreateOpFamilyStmt": ("opfamilyname", "names"),
    "CreateExtensionStmt": ("extname", "extension"),
}
# A DDL statement's fields that hold a schema's or trigger's name as a plain string (not a String node).
_NAME_FIELDS = ("subname", "newschema", "schemaname", "trigname")
# The layer's triggers outside its schemas: its DDL event triggers, the base tables' guard.
LAYER_TRIGGERS = frozenset({"cow_ddl_start", "cow_ddl_end", "cow_ddl_drop", "cow_guard"})


# Drops of these whose every name is pg_temp-qualified touch only the backend's own temporary objects.
_TEMPORARY_DROPS = frozenset({"OBJECT_TABLE", "OBJECT_INDEX", "OBJECT_VIEW", "OBJECT_SEQUENCE"})


def _temporary_target(name: str, node: JsonNode) -> bool:
    """DDL on the connection's own temporary tables, named ``pg_temp.x`` (the alias of this backend's
    temporary schema, nothing else: no permanent object depends on a temporary one), is the application's
    at any time, like CREATE TEMP TABLE. (An unqualified name may be a permanent table's: still refused.)"""
    if name in ("AlterTableStmt", "IndexStmt"):
        schema = child(node, "relation").get("schemaname")
        return isinstance(schema, str) and schema.lower() == "pg_temp"
    if name == "DropStmt" and node.get("removeType") in _TEMPORARY_DROPS:
        names = [
            [n.lower() for n in svals(child(item, "List").get("items"))] for item in children(node, "objects")
        ]
        return bool(names) and all(len(n) == 2 and n[0] == "pg_temp" for n in names)
    return False


def _ddl_name_strings(node: object) -> Iterable[str]:
    """The identifiers in a DDL statement's tree: String nodes and schema fields, not literals."""
    if isinstance(node, list):
        for item in node:
            yield from _ddl_name_strings(item)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key == "A_Const":
            continue  # a literal (a comment's text, a default), not a name
        if key == "String" and isinstance(value, dict):
            sval = value.get("sval")
            if isinstance(sval, str):
                yield sval
        elif key in _NAME_FIELDS and isinstance(value, str):
            yield value
        elif isinstance(value, (dict, list)):
            yield from _ddl_name_strings(value)


def _statement_rule(name: str) -> str:
    if name in _FUNCTION_DDL:
        return "function"
    if name in _SYSTEM:
        return "system"
    if name.startswith(("Create", "Alter", "Drop")) or name in _DDL_OTHER:
        return "ddl"
    return "statement"


def _string_argument(node: JsonNode) -> str | None:
    args = children(node, "args")
    if not args:
        return None
    first = args[0]
    if isinstance(first, dict) and "TypeCast" in first:
        first = child(first, "TypeCast", "arg")
    return string(first, "A_Const", "sval", "sval")


_HANDLERS: dict[str, Callable[[PolicyCheck, JsonNode], None]] = {
    "FuncCall": PolicyCheck._func_call,
    "VariableSetStmt": PolicyCheck._set,
    "CopyStmt": PolicyCheck._copy,
    "CreateStmt": PolicyCheck._create,
    "CreateTableAsStmt": PolicyCheck._create_as,
    "SelectStmt": PolicyCheck._select,
    "InsertStmt": PolicyCheck._write,
    "UpdateStmt": PolicyCheck._write,
    "DeleteStmt": PolicyCheck._write,
    "MergeStmt": PolicyCheck._write,
    "TruncateStmt": PolicyCheck._truncate,
    "DoStmt": PolicyCheck._do,
    "CallStmt": PolicyCheck._call,
    "CreateFunctionStmt": PolicyCheck._create_function,
}
# The nodes ``PolicyCheck.visit`` may act on besides any statement (a name ending in "Stmt"): the others pass
# by unread (the analysis' walk skips its call for them).
VISITED = frozenset(_HANDLERS) | _NAMING_CREATES | frozenset(_CREATED_NAME)
