"""Typed access to pglast's JSON parse tree (``parse_sql_json``), which the fast walk reads.

Nodes are ``{"TypeName": {fields}}``, except where a field has a fixed node type (a RangeVar in
``relation``): then the field holds the fields directly. These helpers return an empty node or list where
the tree has nothing, so that the walk's tests read as paths, not as chains of ``.get(…, {})``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Any at this one boundary: parsed JSON is heterogenous; the helpers below check each step of a path
# (isinstance) instead of the type system.
JsonNode = dict[str, Any]


def child(node: object, *path: str) -> JsonNode:
    """The node at ``path`` below ``node`` (field names and node type names), ``{}`` when absent."""
    for key in path:
        if not isinstance(node, dict):
            return {}
        node = node.get(key)
    return node if isinstance(node, dict) else {}


def children(node: object, key: str) -> list[Any]:
    """The list in field ``key`` of ``node`` (``[]`` when absent; its items: JSON values of any kind)."""
    value = node.get(key) if isinstance(node, dict) else None
    return value if isinstance(value, list) else []


def string(node: object, *path: str) -> str | None:
    """The string at ``path`` below ``node``, None when absent or not a string."""
    *parents, last = path
    value = child(node, *parents).get(last)
    return value if isinstance(value, str) else None


def svals(items: object) -> list[str]:
    """The values of a list of String nodes (a qualified name), others skipped."""
    if not isinstance(items, list):
        return []
    return [str(i["String"]["sval"]) for i in items if isinstance(i, dict) and "String" in i]


def any_select(node: JsonNode, test: Callable[[JsonNode], bool]) -> bool:
    """Whether ``test`` holds for a JSON SelectStmt or one of its set-operation members (``larg``/``rarg``
    hold bare SelectStmt fields, so the walk does not visit them as nodes)."""
    stack: list[object] = [node]
    while stack:
        select = stack.pop()
        if isinstance(select, dict):
            if test(select):
                return True
            stack.extend((select.get("larg"), select.get("rarg")))
    return False


def from_relations(items: object) -> list[JsonNode]:
    """The RangeVars of a JSON FROM list, through joins (subqueries have their own SelectStmt)."""
    out: list[JsonNode] = []
    stack: list[object] = list(items) if isinstance(items, list) else []
    while stack:
        item = stack.pop()
        if not isinstance(item, dict):
            continue
        if "RangeVar" in item:
            out.append(item["RangeVar"])
        elif "JoinExpr" in item:
            stack.extend((item["JoinExpr"].get("larg"), item["JoinExpr"].get("rarg")))
    return out
