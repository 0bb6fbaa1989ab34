"""cow tags carried in a sqlcommenter comment at either edge of a statement.

Anchored scans of the first and last characters only: parsing the statement to find its comments would
cost 60-120 µs per call (DESIGN §5), and the comment is at an edge by definition.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

from proxy.errors import TagError

ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")

# key='value' pairs of a sqlcommenter comment; the value may carry \' (sqlcommenter's meta-escape).
_PAIR = re.compile(r"\s*([^=,'\s]+)\s*=\s*'((?:[^'\\]|\\.)*)'\s*(?:,|$)")
# W3C trace context: version-traceid-parentid-flags, lowercase hex.
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")


@dataclass(frozen=True)
class CommentTags:
    """Session and operation ids read from a statement's edge comment (either may be absent)."""

    session: str | None
    operation: str | None


def _leading_comment(sql: str) -> tuple[str | None, str]:
    """The body of the first block comment if the statement starts with one, and the rest."""
    text = sql.lstrip()
    if not text.startswith("/*"):
        return None, text
    end = text.find("*/", 2)
    # PostgreSQL nests block comments; a nested one is left for the real parser.
    if end < 0 or "/*" in text[2:end]:
        return None, text
    return text[2:end], text[end + 2 :]


def _trailing_comment(sql: str) -> tuple[str | None, str]:
    """The body of the last block comment if the statement ends with one (before an optional ';')."""
    text = sql.rstrip()
    core = text[:-1].rstrip() if text.endswith(";") else text
    if not core.endswith("*/"):
        return None, text
    start = core.rfind("/*", 0, len(core) - 2)
    if start < 0 or "*/" in core[start + 2 : -2]:  # nested comment: left for the real parser
        return None, text
    rest = core[:start]
    if text is not core:
        rest = rest.rstrip() + ";"
    return core[start + 2 : -2], rest


def _pairs(body: str) -> dict[str, str] | None:
    """The key/value pairs of a sqlcommenter body, or None when the comment is not one."""
    body = body.strip()
    if not body:
        return None
    pairs: dict[str, str] = {}
    pos = 0
    while pos < len(body):
        match = _PAIR.match(body, pos)
        if match is None:
            return None
        value = re.sub(r"\\(.)", r"\1", match.group(2))
        pairs[unquote(match.group(1))] = unquote(value)
        pos = match.end()
    return pairs


def _checked(kind: str, value: str) -> str:
    if ID_PATTERN.fullmatch(value) is None:
        raise TagError(
            f"invalid cow {kind} id in SQL comment: {value[:140]!r} (expected 1-128 of [A-Za-z0-9._:-])"
        )
    return value


def _tags_of(body: str | None) -> CommentTags | None:
    if body is None:
        return None
    pairs = _pairs(body)
    if pairs is None:
        return None
    session = pairs.get("cow_session")
    operation = pairs.get("cow_operation")
    if operation is None and "traceparent" in pairs:
        trace = _TRACEPARENT.fullmatch(pairs["traceparent"].strip().lower())
        if trace is not None and trace.group(1) != "0" * 32:  # the all-zero trace id is invalid in W3C
            operation = trace.group(1)
    if session is None and operation is None:
        return None
    return CommentTags(
        session=None if session is None else _checked("session", session),
        operation=None if operation is None else _checked("operation", operation),
    )


def read_comment_tags(sql: str) -> CommentTags | None:
    """cow tags from a leading or trailing sqlcommenter comment, or None when there are none.

    Keys may come in any order, values are URL-encoded, other keys are ignored. When both edges carry
    tags, the trailing comment (sqlcommenter's own position) wins key by key. A W3C ``traceparent``
    gives the operation id (its trace id) when ``cow_operation`` is absent. Raises ``TagError`` for an
    id outside ``^[A-Za-z0-9._:-]{1,128}$``.
    """
    lead_body, rest = _leading_comment(sql)
    trail_body, _ = _trailing_comment(rest)
    lead = _tags_of(lead_body)
    trail = _tags_of(trail_body)
    if lead is None:
        return trail
    if trail is None:
        return lead
    return CommentTags(
        session=trail.session if trail.session is not None else lead.session,
        operation=trail.operation if trail.operation is not None else lead.operation,
    )


def strip_edge_comments(sql: str) -> str:
    """The statement without its leading/trailing block comments and surrounding whitespace (a cache key)."""
    text = sql.strip()
    while True:
        body, rest = _leading_comment(text)
        if body is None:
            break
        text = rest.strip()
    while True:
        body, rest = _trailing_comment(text)
        if body is None:
            break
        text = rest.strip()
    return text
