"""Rule: the application's own ``search_path`` on a tagged connection (docs/rewrites.md, "The application's
search_path").

In a session the physical ``search_path`` is the overlay path (each enabled schema's overlay schema right
before it) and the layer keeps the application's own path in ``cow.app_search_path``. So an application
that sets its path (schema-per-tenant frameworks switch it per request) is not refused; what it sends is
changed so that the layer translates the path:

- ``SET [SESSION | LOCAL] search_path …``, ``SET search_path TO DEFAULT``, ``RESET search_path`` (a statement
  of its own) run as written inside ``DO $$BEGIN <statement>; PERFORM cow._adopt_app_path(<local>); END$$``:
  PostgreSQL sets and normalises the path as it would outside a session, then the layer keeps it and puts the
  overlay path in force with the same scope. The client sees ``SET`` / ``RESET``.
- ``set_config('search_path', value, is_local)`` with that literal name becomes ``cow.set_app_path(value,
  is_local)``, which returns what ``set_config`` returns.

Any other change of the path (a computed setting name, one inside a DO block or function body) stays a
refusal: the proxy cannot see what it sets.
"""

from __future__ import annotations

from pglast import ast, enums
from pglast.visitors import Ancestor

from proxy.sql.catalog import Catalog
from proxy.sql.deparse import deparse
from proxy.sql.jsontree import JsonNode
from proxy.sql.rewrites.base import Context, Rule, Scan, Step
from proxy.sql.rewrites.nodes import Visit
from proxy.sql.visitor import Visitor

SETTING = "search_path"
# VariableSetStmt kinds (as parse_sql_json spells them): set the path to a value or to its default, reset it.
_JSON_KINDS = frozenset({"VAR_SET_VALUE", "VAR_SET_DEFAULT", "VAR_RESET"})
_KINDS = frozenset(
    {
        enums.VariableSetKind.VAR_SET_VALUE,
        enums.VariableSetKind.VAR_SET_DEFAULT,
        enums.VariableSetKind.VAR_RESET,
    }
)


def sets_path(node: JsonNode) -> bool:
    """A JSON ``VariableSetStmt`` that sets or resets ``search_path`` in a way the layer can follow."""
    return str(node.get("name", "")).lower() == SETTING and node.get("kind") in _JSON_KINDS


def set_config_of_path(node: JsonNode) -> bool:
    """A JSON ``FuncCall`` of ``[pg_catalog.]set_config('search_path', value, is_local)``: three positional
    arguments, the first a string literal (the cast ``'search_path'::text`` included)."""
    names = [str(n.get("String", {}).get("sval", "")).lower() for n in node.get("funcname") or ()]
    if not names or names[-1] != "set_config" or names[:-1] not in ([], ["pg_catalog"]):
        return False
    args = node.get("args") or []
    if len(args) != 3 or any("NamedArgExpr" in a for a in args if isinstance(a, dict)):
        return False
    first = args[0]
    if "TypeCast" in first:
        first = first["TypeCast"].get("arg", {})
    value = first.get("A_Const", {}).get("sval", {}).get("sval")
    return isinstance(value, str) and value.lower() == SETTING


def set_statement(stmt: ast.VariableSetStmt) -> tuple[ast.DoStmt, tuple[str, str]]:
    """The DO block to send for a SET or RESET of ``search_path``, and the CommandComplete tag map."""
    local = "true" if stmt.is_local else "false"
    body = f"BEGIN {deparse(stmt)}; PERFORM cow._adopt_app_path({local}); END"
    block = ast.DoStmt(
        args=(
            ast.DefElem(
                defname="as", arg=ast.String(sval=body), defaction=enums.DefElemAction.DEFELEM_UNSPEC
            ),
        )
    )
    command = "RESET" if stmt.kind == enums.VariableSetKind.VAR_RESET else "SET"
    return block, ("DO", command)


def _is_path_call(node: ast.Node | None) -> bool:
    if not isinstance(node, ast.FuncCall):
        return False
    names = [n.sval.lower() for n in node.funcname or ()]
    if not names or names[-1] != "set_config" or names[:-1] not in ([], ["pg_catalog"]):
        return False
    args = list(node.args or ())
    first = args[0] if args else None
    if isinstance(first, ast.TypeCast):
        first = first.arg
    return (
        len(args) == 3
        and isinstance(first, ast.A_Const)
        and isinstance(first.val, ast.String)
        and str(first.val.sval).lower() == SETTING
    )


class _SetConfigCalls(Visitor):
    """Points ``set_config('search_path', v, l)`` at ``cow.set_app_path(v, l)``; a result column keeps the
    name ``set_config``."""

    changed = False

    def visit_ResTarget(self, ancestors: Ancestor, node: ast.ResTarget) -> Visit:
        if node.name is None and _is_path_call(node.val) and ancestors.parent is not None:
            node.name = "set_config"
        return None

    def visit_FuncCall(self, ancestors: Ancestor, node: ast.FuncCall) -> Visit:
        if not _is_path_call(node):
            return None
        self.changed = True
        return ast.FuncCall(
            funcname=(ast.String(sval="cow"), ast.String(sval="set_app_path")),
            args=tuple((node.args or ())[1:]),
            funcformat=enums.CoercionForm.COERCE_EXPLICIT_CALL,
        )


def unlayered(catalog: Catalog, schema: object) -> bool:
    """A schema-qualified write target in a schema without the layer (not a temporary table): in a session
    its rows would change for real, so the analyzer refuses it (``unlayered_refusal``)."""
    return (
        isinstance(schema, str)
        and schema not in catalog.schemas
        and not schema.startswith("pg_temp")
        and catalog.has_cow_tables
    )


def unlayered_refusal(schema: str, table: str, kind: str) -> tuple[str, str]:
    """(SQLSTATE, message) for a write to ``schema.table`` in a session when the schema has no layer."""
    if schema in ("cow", "cow_changes") or schema.startswith("cow_overlay_"):
        return (
            "42501",
            f"cowproxy: {kind.upper()} on {schema}.{table} refused in a session: a schema of the "
            "copy-on-write layer",
        )
    return (
        "42501",
        f"cowproxy: {kind.upper()} on {schema}.{table} refused in a session: schema {schema} has no "
        f"copy-on-write layer (install it there with: cowproxy install --schema {schema})",
    )


PATH_AND_WRITES_MESSAGE = (
    "cowproxy: in a session, a query string that changes search_path or the role may not also write by "
    "unqualified names: send the change as a statement of its own"
)
# What the proxy asks before a write by unqualified names in a session (migrations/sql/functions/
# 12_app_path.sql): one row of (schema, name) of the first name that resolves outside the layer, and whether
# no schema on the path lacks the layer (then the answer holds until the path or the role changes).
UNLAYERED_WRITE_SQL = "SELECT r[1], r[2], r IS NULL FROM cow._unlayered_write($1::text[]) AS r"


def text_array(items: tuple[str, ...] | list[str]) -> str:
    """A PostgreSQL text[] literal of ``items`` (each double-quoted), for a bound parameter."""
    quoted = ('"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"' for item in items)
    return "{" + ",".join(quoted) + "}"


UNCHECKED_MESSAGE = (
    "cowproxy: refused in a session: the server did not say where this statement's unqualified write "
    "targets resolve (cow._unlayered_write; is the layer up to date? cowproxy install)"
)
# For an EXECUTE of a statement prepared in SQL (its writes unknown to the proxy) while the path names a
# schema without the layer.
EXECUTE_REFUSAL = (
    "42501",
    "cowproxy: EXECUTE of a statement prepared in SQL refused in a session while search_path names a schema "
    "without the copy-on-write layer (install it there with: cowproxy install --schema S, or prepare "
    "through the protocol)",
)


OVERLAY_PREFIX = "cow_overlay_"


def _path_segments(value: str) -> list[str]:
    """The comma-separated items of a search_path value as written (commas in double quotes kept)."""
    segments, start, quoted = [], 0, False
    for i, char in enumerate(value):
        if char == '"':
            quoted = not quoted  # (a doubled quote inside quotes toggles twice)
        elif char == "," and not quoted:
            segments.append(value[start:i])
            start = i + 1
    segments.append(value[start:])
    return segments


def _is_overlay(segment: str) -> bool:
    item = segment.strip()
    if len(item) > 1 and item.startswith('"') and item.endswith('"'):
        name = item[1:-1].replace('""', '"')
    else:
        name = item.lower()  # PostgreSQL folds an unquoted name
    return name.startswith(OVERLAY_PREFIX)


def visible_path(value: str) -> str:
    """The ``search_path`` a client is told (ParameterStatus, PostgreSQL 18 reports it) for the physical
    ``value``: its overlay schemas dropped, the rest as written (``cow_overlay_a, a, cow_overlay_public,
    public`` -> ``a, public``), which is the application's path as ``SHOW`` gives it."""
    if OVERLAY_PREFIX not in value.lower():
        return value
    kept = [segment for segment in _path_segments(value) if not _is_overlay(segment)]
    return ",".join(kept).lstrip()


def detect(scan: Scan, node: JsonNode) -> bool:
    return sets_path(node) or set_config_of_path(node)


def apply(ctx: Context, node: ast.Node) -> Step | None:
    if isinstance(node, ast.VariableSetStmt):
        if str(node.name or "").lower() != SETTING or node.kind not in _KINDS:
            return None
        block, tag_map = set_statement(node)
        return Step(block, tag_map=tag_map, final=True)
    calls = _SetConfigCalls()
    calls(node)
    return Step(node) if calls.changed else None


RULE = Rule("app_path", frozenset({"VariableSetStmt", "FuncCall"}), detect, apply)
