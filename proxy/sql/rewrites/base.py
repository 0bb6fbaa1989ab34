"""What a rewrite rule is: a cheap detection on the fast JSON walk, and an AST rewrite.

The analyzer walks pglast's JSON parse tree once per statement text (``proxy/sql/analyze.py``) and hands
each rule the JSON nodes it names in ``Rule.nodes``; a rule whose ``detect`` never says yes is not run, and
when none says yes the full parse into pglast nodes is skipped. The rewriter then applies the rules in the
order of ``proxy.sql.rewrites.RULES`` to each parsed statement.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from pglast import ast

from proxy.sql.catalog import Catalog, CowTable
from proxy.sql.jsontree import JsonNode
from proxy.sql.rewrites.nodes import cte_names

# Pseudo node names for ``Rule.nodes``: every JSON relation (a RangeVar's fields: the walk cannot tell its
# type, which the parent field fixes), and each top-level statement once the walk is done.
RELATION = ":relation"
STATEMENT = ":statement"


class Scan(Protocol):
    """What a detection may ask of the walk."""

    @property
    def catalog(self) -> Catalog: ...

    def cow(self, relation: object) -> bool:
        """Whether a JSON relation names a CoW table."""
        ...


@dataclass(frozen=True)
class Step:
    """A rule's change to one statement: the statement that replaces it (``node``, possibly the same object
    edited in place), the CommandComplete fix it needs (see ``Analysis.tag_map``), and whether the statement
    is finished (no later rule runs on it)."""

    node: ast.Node
    tag_map: tuple[str, str] | None = None
    final: bool = False


@dataclass
class Context:
    """What the rules know while rewriting one query string.

    ``found``: how often each rule's detection said yes on the walk (None when the rewriter runs without a
    walk: then every rule runs and counts nothing). ``ctes``: the string's CTE names (any level), when the
    walk collected them. ``cached_plan``: the text of a named prepared statement (key reads)."""

    catalog: Catalog
    version: int
    found: Mapping[str, int] | None = None
    cte_names: frozenset[str] | None = None
    cached_plan: bool = False

    def ctes(self, node: ast.Node) -> frozenset[str]:
        """The CTE names that may shadow a CoW table's name in ``node``."""
        if self.cte_names is not None:
            return self.cte_names
        return cte_names(node)

    def cow(self, relation: ast.RangeVar | None) -> CowTable | None:
        if relation is None:
            return None
        return self.catalog.lookup(relation.schemaname, relation.relname)

    def count(self, rule: str) -> int | None:
        """How many nodes the walk found for ``rule`` (None: no walk)."""
        return None if self.found is None else self.found.get(rule, 0)


@dataclass(frozen=True)
class Rule:
    """One rewrite: ``name`` (what ``Context.found`` counts), ``nodes`` (the JSON node names, or RELATION /
    STATEMENT, the walk shows ``detect``), ``detect`` (cheap: may this rule change the statement?) and
    ``apply`` (the AST rewrite, or a refusal by ``RewriteError``; None: unchanged). ``count_all``: detection
    goes on after a first yes (the rule needs the count). ``literal_blind``: ``apply`` decides on the
    statement's structure and the catalog, never on a constant's value, so a statement it leaves unchanged
    may be cached by its shape (proxy/sql/shapes.py); say so only of a rule read for that.
    ``literal_template``: ``apply`` reads no constant's value where ``shapes.literals_irrelevant`` lets a
    literal be (it reads ordinals and the arguments of functions that take names, which that proof refuses)
    and carries the statement's constants into its output as they are (the same nodes or copies), adding
    only constants of its own that do not depend on them: its output for one text of a shape is its output
    for another with the constants swapped, so the analysis rewrites a shape once (proxy/sql/templates.py);
    say so only of a rule read for that."""

    name: str
    nodes: frozenset[str]
    detect: Callable[[Scan, JsonNode], bool]
    apply: Callable[[Context, ast.Node], Step | None]
    count_all: bool = False
    literal_blind: bool = False
    literal_template: bool = False
