"""The relay's front to the SQL analysis of ``proxy.sql``: one analyzer (and its cache) per proxy process,
the untagged shortcut (a statement's kind from its first keyword), and the catalog and comment tags as the
relay needs them. The relay gets ``proxy.sql.Analysis`` results as they are.
"""

from __future__ import annotations

import re

from proxy.errors import ProxyError
from proxy.sql import (
    CATALOG_DELTA_QUERY,
    CATALOG_QUERY,
    CATALOG_VERSION_QUERY,
    Analysis,
    Analyzer,
    Catalog,
    apply_tag_map,
    read_comment_tags,
    split_trailing_reset,
)
from proxy.sql.policy import DEFAULT_POLICY, Policy
from proxy.sql.shapes import KeyFunction
from proxy.tags import Tags

# Untagged statements need no rewrite and no tamper check: only their kind, for the metrics. A full parse
# of every distinct statement text (pgbench's literals make each one distinct) would be the proxy's main cost,
# so their kind comes from the first keyword.
_FIRST_WORD = re.compile(r"\s*(?:(?:--[^\n]*\n|/\*.*?\*/)\s*)*\(*\s*([A-Za-z]+)", re.S)
QUICK_KINDS = {  # first keyword -> statement kind (also given to the C relay)
    "select": "select",
    "values": "select",
    "table": "select",
    "with": "other",
    "insert": "insert",
    "update": "update",
    "delete": "delete",
    "merge": "other",
    "copy": "copy",
    "begin": "transaction",
    "start": "transaction",
    "commit": "transaction",
    "end": "transaction",
    "rollback": "transaction",
    "abort": "transaction",
    "savepoint": "transaction",
    "release": "transaction",
    "prepare": "transaction",
    "create": "ddl",
    "alter": "ddl",
    "drop": "ddl",
    "truncate": "ddl",
    "comment": "ddl",
    "grant": "ddl",
    "revoke": "ddl",
}


# The usual text starts with its keyword: then this simpler pattern finds the same word, faster.
_LEADING_WORD = re.compile(r"[A-Za-z]+")


def quick_kind(sql: str) -> str:
    match = _LEADING_WORD.match(sql)
    if match is not None:
        return QUICK_KINDS.get(match.group().lower(), "utility")
    match = _FIRST_WORD.match(sql)
    if match is None:
        return "other"
    return QUICK_KINDS.get(match.group(1).lower(), "utility")


# quick_kind of a whole Query message, by its first bytes: pgbench-like traffic repeats a few keywords with
# ever-different literals, so a small table of prefixes answers without decoding or matching.
_PREFIX = 8
_LEADING_WORD_BYTES = re.compile(rb"[A-Za-z]+")
_kind_by_prefix: dict[bytes, str] = {}


def query_kind(message: bytes) -> str:
    """``quick_kind`` of the text of a Query message (type, length, text, NUL) that is valid UTF-8."""
    prefix = message[5 : 5 + _PREFIX]
    kind = _kind_by_prefix.get(prefix)
    if kind is None:
        kind = quick_kind(message[5:-1].decode())
        word = _LEADING_WORD_BYTES.match(prefix)
        # Only a prefix in which the first word ends decides the kind (and no comment can precede it).
        if word is not None and word.end() < len(prefix) and len(_kind_by_prefix) < 256:
            _kind_by_prefix[prefix] = kind
    return kind


class ProxyAnalyzer:
    """Holds the analyzer (with its cache) for a whole proxy process."""

    catalog_query: str | None = CATALOG_QUERY  # None: the relay loads no catalog (unit tests)
    catalog_version_query: str | None = CATALOG_VERSION_QUERY
    catalog_delta_query: str | None = CATALOG_DELTA_QUERY  # a reload given the stamps already held

    def __init__(
        self, cache_size: int = 4096, policy: Policy = DEFAULT_POLICY, shape_key: KeyFunction | None = None
    ) -> None:
        """``shape_key``: the C relay's, when it is built (Python's lexer otherwise)."""
        self._analyzer = (
            Analyzer(cache_size=cache_size, policy=policy, key=shape_key)
            if shape_key is not None
            else Analyzer(cache_size=cache_size, policy=policy)
        )
        self._untagged: dict[str, Analysis] = {}

    @property
    def analyzer(self) -> Analyzer:
        """The analyzer (its counters: ``misses``, ``shape_hits``)."""
        return self._analyzer

    @staticmethod
    def empty_catalog() -> Catalog:
        return Catalog.empty()

    @staticmethod
    def catalog_from_rows(rows: list[tuple[str | None, ...]], held: Catalog | None = None) -> Catalog:
        try:
            return Catalog.from_rows(rows, held)
        except (ProxyError, ValueError, IndexError):
            return Catalog.empty()

    @staticmethod
    def map_tag(tag: str, tag_map: tuple[str, str]) -> str:
        """The CommandComplete tag the client sees for a rewritten statement."""
        return apply_tag_map(tag, tag_map)

    @staticmethod
    def comment_tags(sql: str) -> Tags | None:
        """Tags from the statement's sqlcommenter comment; raises TagError for malformed ids."""
        return read_comment_tags(sql)

    def is_pool_reset(self, sql: str, catalog: Catalog | None) -> bool:
        """``sql`` ends with RESET ALL / DISCARD ALL and nothing before it tampers or needs a rewrite.

        Pools send this when they take a connection back (asyncpg: ``…; RESET ALL``). It may run: the
        relay re-applies the tags before the next statement, and nothing runs untagged in between.
        """
        prefix = split_trailing_reset(sql)
        if prefix is None:
            return False
        if not prefix.strip():
            return True
        verdict = self.analyze(prefix, catalog, True)
        return not verdict.tampers and verdict.error is None and verdict.rewritten is None

    def shape(self, sql: str, catalog: Catalog | None, verdict: Analysis) -> bytes | None:
        """The literal-normalised key under which a session's ``verdict`` for ``sql`` holds for every text
        of that shape (``proxy.sql.Analyzer.shape``), or None."""
        return self._analyzer.shape(sql, catalog or Catalog.empty(), verdict)

    def analyze(
        self, sql: str, catalog: Catalog | None, in_session: bool, *, prepared: bool = False
    ) -> Analysis:
        """``prepared``: the text of a named prepared statement (its plan may be cached)."""
        if not in_session:
            kind = quick_kind(sql)
            verdict = self._untagged.get(kind)
            if verdict is None:
                verdict = self._untagged[kind] = Analysis(kind, cache_hit=True)
            return verdict
        try:
            return self._analyzer.analyze(sql, catalog or Catalog.empty(), in_session, prepared=prepared)
        except ProxyError as exc:
            return Analysis("other", error=(exc.sqlstate, str(exc)))
