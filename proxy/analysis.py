"""The relay's view of the SQL analysis in ``proxy.sql`` (built separately; see docs/interfaces.md).

``proxy.sql`` is imported at run time and wrapped here, so that the relay depends on a small typed surface
and keeps working (tags from startup and routes, no comment tags, no rewrites) if that package is absent.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any

from proxy.errors import ProxyError
from proxy.tags import Tags, check_id


@dataclass(frozen=True)
class Verdict:
    """What the relay needs to know about one statement text."""

    kind: str
    writes: tuple[tuple[str, str], ...]
    tampers: bool
    rewritten: str | None
    tag_map: tuple[str, str] | None
    error: tuple[str, str] | None  # (sqlstate, message): answer this instead of running the statement
    cache_hit: bool
    catalog_dependent: bool = False  # check that the catalog is current first (docs/proxy.md)
    error_detail: str | None = None


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


def _load() -> Any:
    try:
        return importlib.import_module("proxy.sql")
    except ImportError:
        return None


class Analysis:
    """Holds the analyzer (with its cache) for a whole proxy process."""

    def __init__(self, cache_size: int = 4096) -> None:
        self.module = _load()
        self.available = self.module is not None and hasattr(self.module, "Analyzer")
        self._analyzer: Any = self.module.Analyzer(cache_size=cache_size) if self.available else None
        self._untagged: dict[str, Verdict] = {}
        self.catalog_query: str | None = (
            getattr(self.module, "CATALOG_QUERY", None) if self.available else None
        )
        self.catalog_version_query: str | None = (
            getattr(self.module, "CATALOG_VERSION_QUERY", None) if self.available else None
        )

    def empty_catalog(self) -> Any:
        if not self.available:
            return None
        return self.module.Catalog.empty()

    def catalog_from_rows(self, rows: list[tuple[str | None, ...]]) -> Any:
        if not self.available:
            return None
        try:
            return self.module.Catalog.from_rows(rows)
        except (ProxyError, ValueError, IndexError):
            return self.module.Catalog.empty()

    def map_tag(self, tag: str, tag_map: tuple[str, str]) -> str:
        """The CommandComplete tag the client sees for a rewritten statement."""
        apply = getattr(self.module, "apply_tag_map", None)
        if apply is not None:
            return str(apply(tag, tag_map))
        old, new = tag_map
        return new + tag[len(old) :] if tag.startswith(old) else tag

    def comment_tags(self, sql: str) -> Tags | None:
        """Tags from the statement's sqlcommenter comment; raises TagError for malformed ids."""
        if self.module is None or not hasattr(self.module, "read_comment_tags"):
            return None
        found = self.module.read_comment_tags(sql)
        if found is None or (found.session is None and found.operation is None):
            return None
        session = found.session
        operation = found.operation
        if session is not None:
            check_id(session, "session id")
        if operation is not None:
            check_id(operation, "operation id")
        return Tags(session, operation)

    def is_pool_reset(self, sql: str, catalog: Any) -> bool:
        """``sql`` ends with RESET ALL / DISCARD ALL and nothing before it tampers or needs a rewrite.

        Pools send this when they take a connection back (asyncpg: ``…; RESET ALL``). It may run: the
        relay re-applies the tags before the next statement, and nothing runs untagged in between.
        """
        split = getattr(self.module, "split_trailing_reset", None) if self.available else None
        prefix = split(sql) if split is not None else None
        if prefix is None:
            return False
        if not prefix.strip():
            return True
        verdict = self.analyze(prefix, catalog, True)
        return not verdict.tampers and verdict.error is None and verdict.rewritten is None

    def analyze(self, sql: str, catalog: Any, in_session: bool, *, prepared: bool = False) -> Verdict:
        """``prepared``: the text of a named prepared statement (its plan may be cached)."""
        if not in_session:
            kind = quick_kind(sql)
            verdict = self._untagged.get(kind)
            if verdict is None:
                verdict = self._untagged[kind] = Verdict(kind, (), False, None, None, None, True)
            return verdict
        if not self.available:
            return Verdict("other", (), False, None, None, None, False)
        if catalog is None:
            catalog = self.module.Catalog.empty()
        try:
            result = self._analyzer.analyze(sql, catalog, in_session, prepared=prepared)
        except ProxyError as exc:
            return Verdict("other", (), False, None, None, (exc.sqlstate, str(exc)), False)
        error = result.error
        return Verdict(
            kind=str(result.kind),
            writes=tuple((str(t), str(k)) for t, k in result.writes),
            tampers=bool(result.tampers),
            rewritten=result.rewritten if in_session else None,
            tag_map=tuple(result.tag_map) if result.tag_map else None,
            error=(str(error[0]), str(error[1])) if error else None,
            cache_hit=bool(result.cache_hit),
            catalog_dependent=bool(getattr(result, "catalog_dependent", False)),
            error_detail=getattr(result, "error_detail", None),
        )
