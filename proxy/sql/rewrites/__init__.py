"""Rewrites of statements on CoW tables inside a session, as ordered rules.

The overlay views take plain INSERT/UPDATE/DELETE/SELECT and COPY FROM through INSTEAD OF triggers; the
rest is rewritten here into statements on the views that give the client what the plain table would.
New statements are built from templates whose only variable parts are identifiers from the catalog;
the client's expressions, literals and ``$n`` parameters are spliced in as AST nodes, never as text.

Each rule is one module of this package: its cheap detection on the analyzer's JSON walk and its AST
rewrite (``base.Rule``). ``RULES`` fixes the order in which they run on each statement. To add a rule:
write ``rewrites/<name>.py`` ending in ``RULE = Rule("<name>", nodes, detect, apply)`` and put its
``RULE`` at its place in ``RULES``. Nothing else changes: the walk calls ``detect`` on the nodes the rule
names, and the rewriter runs the rules whose detection said yes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pglast import ast

from proxy.sql.catalog import Catalog
from proxy.sql.deparse import deparse
from proxy.sql.rewrites import (
    app_path,
    copy_to,
    counts,
    ddl,
    group_by,
    introspection,
    key_reads,
    lateral,
    merge,
    on_conflict,
    qualify,
    row_locks,
    set_constraints,
    truncate,
)
from proxy.sql.rewrites.base import RELATION, STATEMENT, Context, Rule, Scan, Step
from proxy.sql.rewrites.key_reads import KEY_READ_HASHED_ROWS
from proxy.sql.rewrites.nodes import command_of
from proxy.sql.rewrites.tables import unsupported

# The order in which the rules run on a statement. Refusals first; TRUNCATE and SET CONSTRAINTS finish
# their statement; group_by before lateral (it only knows the columns of plain FROM items) and both before
# qualify (the columns they add for public.t are pointed at the overlay with the rest); counts and
# key_reads after qualify (their parts name the base tables, which qualify would point at the overlay).
RULES: tuple[Rule, ...] = (
    app_path.RULE,  # finishes a SET of search_path (no other rule changes one)
    ddl.RULE,
    on_conflict.RULE,
    merge.RULE,
    set_constraints.RULE,
    truncate.RULE,
    copy_to.RULE,
    group_by.RULE,
    row_locks.RULE,  # before lateral and qualify, as group_by
    lateral.RULE,
    qualify.RULE,
    counts.RULE,
    key_reads.RULE,
    introspection.RULE,  # last: catalog calls in any statement the rules above left or made
)

# For the walk: the rules to ask about each JSON node name.
DETECTORS: Mapping[str, tuple[Rule, ...]] = {
    name: tuple(rule for rule in RULES if name in rule.nodes) for rule in RULES for name in rule.nodes
}

__all__ = [
    "DETECTORS",
    "KEY_READ_HASHED_ROWS",
    "RELATION",
    "RULES",
    "STATEMENT",
    "Outcome",
    "Rewriter",
    "Rule",
    "Scan",
    "Step",
]


@dataclass(frozen=True)
class Outcome:
    sql: str | None
    tag_map: tuple[str, str] | None


class Rewriter:
    """Applies ``RULES`` to the statements of one query string.

    ``found``: what the analyzer's walk found, per rule name (``Context.found``); None runs every rule.
    ``ctes``: the string's CTE names, when the walk collected them. ``cached_plan``: the text of a named
    prepared statement (key reads)."""

    def __init__(
        self,
        catalog: Catalog,
        server_version_num: int,
        found: Mapping[str, int] | None = None,
        *,
        ctes: frozenset[str] | None = None,
        cached_plan: bool = False,
    ) -> None:
        self.context = Context(catalog, server_version_num, found, ctes, cached_plan)
        self.rules = RULES if found is None else tuple(rule for rule in RULES if rule.name in found)

    def rewrite(self, stmts: Sequence[ast.RawStmt], text: str | None = None) -> Outcome:
        """Rewrite parsed statements; with the source ``text``, unchanged statements keep their own text."""
        changed = False
        changed_at: set[int] = set()
        tag_map: tuple[str, str] | None = None
        mapped: set[int] = set()
        finals: list[ast.Node] = []
        for index, raw in enumerate(stmts):
            assert raw.stmt is not None  # the parser sets every RawStmt's statement
            node, node_changed, node_map = self._statement(raw.stmt)
            if node_changed:
                raw.stmt = node
                changed = True
                changed_at.add(index)
            if node_map is not None:
                # one tag_map serves the whole string; statements may share it (TRUNCATE a; TRUNCATE b)
                if tag_map is not None and node_map != tag_map:
                    raise unsupported(
                        "two statements needing different command-tag fixes in one query string"
                    )
                tag_map = node_map
                mapped.add(index)
            finals.append(node)
        if tag_map is not None and len(finals) > 1:
            command = tag_map[0]
            if any(command_of(n) == command for i, n in enumerate(finals) if i not in mapped):
                raise unsupported(
                    f"a rewritten statement next to another {command} in one query string "
                    "(send it as a separate statement)"
                )
        if not changed:
            return Outcome(None, None)
        parts = []
        for index, raw in enumerate(stmts):
            if text is not None and index not in changed_at:
                # pglast gives the offsets in characters; stmt_len 0 means "to the end"
                start = raw.stmt_location or 0
                end = start + raw.stmt_len if raw.stmt_len else len(text)
                parts.append(text[start:end].strip().rstrip(";").strip())
            else:
                parts.append(deparse(raw))
        # the newline ends a line comment the client's text may finish with, before the semicolon
        return Outcome("\n; ".join(parts), tag_map)

    def _statement(self, node: ast.Node) -> tuple[ast.Node, bool, tuple[str, str] | None]:
        changed = False
        tag_map = None
        for rule in self.rules:
            step = rule.apply(self.context, node)
            if step is None:
                continue
            node, changed = step.node, True
            if step.tag_map is not None:
                tag_map = step.tag_map
            if step.final:
                break
        return node, changed, tag_map
