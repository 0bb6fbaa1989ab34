"""Session tags: what a connection or statement says about its CoW session, and where it says it.

Sources, highest precedence first: a sqlcommenter comment on the statement
(``/*cow_session='S',cow_operation='O'*/``), the startup packet (``options=-c cow.session_id=S -c
cow.operation_id=O`` or ``application_name=cow:S``), an admin route of the database (docs/proxy.md,
"Tagging"). Ids are 1-128 characters of ``[A-Za-z0-9._:-]`` wherever they come from.

Comment tags are read by anchored scans of the statement's first and last characters only: parsing the
statement to find its comments would cost 60-120 µs per call, and the comment is at an edge by definition.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

from cowproxy.ids import ID_PATTERN
from proxy.errors import PolicyError, TagError
from proxy.protocol import StartupMessage

SESSION_GUC = "cow.session_id"
OPERATION_GUC = "cow.operation_id"
APP_NAME_PREFIX = "cow:"
# Startup settings a tagged connection may not bring: they would leave the session or make its writes vanish
# (the layer's other cow.* settings, the session's user, replica mode that skips the overlay's triggers).
_REFUSED_AT_STARTUP = frozenset({"session_authorization", "session_replication_role"})


def _setting_name(name: str) -> str:
    """A setting's name as PostgreSQL reads it (case-insensitive; ``-`` for ``_`` in ``--name=value``)."""
    return name.strip().lower().replace("-", "_")


def _leaves_session(name: str) -> bool:
    """A setting a connection tagged at startup may not bring along (rule ``session``)."""
    return name.startswith("cow.") or name in _REFUSED_AT_STARTUP


@dataclass(frozen=True)
class Tags:
    """The session (None: untagged) and operation (None: a fresh one per top-level transaction)."""

    session: str | None = None
    operation: str | None = None

    @property
    def tagged(self) -> bool:
        return self.session is not None


UNTAGGED = Tags()


def check_id(value: str, what: str) -> str:
    if not ID_PATTERN.fullmatch(value):
        raise TagError(f"invalid {what} {value[:140]!r}: ids are 1-128 characters of [A-Za-z0-9._:-]")
    return value


def split_options(options: str) -> list[str]:
    """Split a libpq ``options`` string the way PostgreSQL does: spaces separate, backslash escapes."""
    words: list[str] = []
    current: list[str] = []
    have = False
    escaped = False
    for ch in options:
        if escaped:
            current.append(ch)
            escaped = False
            have = True
        elif ch == "\\":
            escaped = True
        elif ch.isspace():
            if have:
                words.append("".join(current))
                current = []
                have = False
        else:
            current.append(ch)
            have = True
    if have:
        words.append("".join(current))
    return words


def join_options(words: list[str]) -> str:
    return " ".join(w.replace("\\", "\\\\").replace(" ", "\\ ") for w in words)


@dataclass(frozen=True)
class StartupTags:
    tags: Tags
    startup: StartupMessage  # the startup message to send upstream (cow settings removed)


def read_startup_tags(startup: StartupMessage) -> StartupTags:
    """Take the cow settings out of ``options`` and read ``application_name=cow:S``.

    The settings are removed from what goes upstream: the proxy joins the session itself with
    ``cow.use_session`` (which also puts the overlay first in ``search_path``), after authentication.
    """
    session: str | None = None
    operation: str | None = None
    refused: list[str] = []
    options = startup.get("options")
    if options is not None:
        words = split_options(options)
        kept: list[str] = []
        i = 0
        while i < len(words):
            word = words[i]
            setting: str | None = None
            consumed = 1
            if word == "-c" and i + 1 < len(words):
                setting, consumed = words[i + 1], 2
            elif (word.startswith("-c") and len(word) > 2) or (word.startswith("--") and "=" in word):
                setting = word[2:]
            if setting is not None and "=" in setting:
                name, _, value = setting.partition("=")
                name = _setting_name(name) if name.lower().startswith("cow") else name
                if name == SESSION_GUC:
                    session = value or None
                    i += consumed
                    continue
                if name == OPERATION_GUC:
                    operation = value or None
                    i += consumed
                    continue
                guc = _setting_name(name)
                if _leaves_session(guc):
                    refused.append(guc)
            kept.extend(words[i : i + consumed])
            i += consumed
        startup = startup.replace("options", join_options(kept) if kept else None)
    startup, session, operation = _parameter_tags(startup, session, operation, refused)
    app = startup.get("application_name")
    if session is None and app is not None and app.startswith(APP_NAME_PREFIX):
        session = app[len(APP_NAME_PREFIX) :] or None
    if session is not None:
        check_id(session, "session id")
        if refused:
            raise PolicyError(
                f"cowproxy: a connection tagged with a session may not set {', '.join(refused)} at startup "
                '(rule "session")'
            )
    if operation is not None:
        check_id(operation, "operation id")
        if session is None:
            raise TagError("cow.operation_id given without cow.session_id")
    return StartupTags(Tags(session, operation), startup)


# What PostgreSQL does not take as a setting when it is a startup parameter of its own.
_NOT_SETTINGS = frozenset({"user", "database", "options", "replication"})


def _parameter_tags(
    startup: StartupMessage, session: str | None, operation: str | None, refused: list[str]
) -> tuple[StartupMessage, str | None, str | None]:
    """The cow settings given as startup parameters of their own (asyncpg's ``server_settings``, libpq
    keywords in a connection string): PostgreSQL applies every such parameter as a setting, so
    ``cow.session_id`` there is a tag as in ``options`` (and is not sent upstream, where it would set the
    setting behind the proxy's back); other ``cow.*`` settings and ``_REFUSED_AT_STARTUP`` join ``refused``.
    Given both ways, the two must agree."""
    for key, value in startup.params:
        name = _setting_name(key)
        if name in _NOT_SETTINGS:
            continue
        if name in (SESSION_GUC, OPERATION_GUC):
            given = session if name == SESSION_GUC else operation
            if given is not None and value and value != given:
                raise TagError(f"cowproxy: {name} given twice at startup, as {given!r} and {value!r}")
            if name == SESSION_GUC:
                session = given or value or None
            else:
                operation = given or value or None
            startup = startup.replace(key, None)
        elif _leaves_session(name):
            refused.append(name)
    return startup, session, operation


# -- comment tags --------------------------------------------------------------------------------------

# key='value' pairs of a sqlcommenter comment; the value may carry \' (sqlcommenter's meta-escape).
_PAIR = re.compile(r"\s*([^=,'\s]+)\s*=\s*'((?:[^'\\]|\\.)*)'\s*(?:,|$)")
# W3C trace context: version-traceid-parentid-flags, lowercase hex.
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")


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


def _tags_of(body: str | None) -> Tags | None:
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
    return Tags(
        session=None if session is None else _checked("session", session),
        operation=None if operation is None else _checked("operation", operation),
    )


def read_comment_tags(sql: str) -> Tags | None:
    """cow tags from a leading or trailing sqlcommenter comment, or None when there are none.

    Keys may come in any order, values are URL-encoded, other keys are ignored. When both edges carry
    tags, the trailing comment (sqlcommenter's own position) wins key by key. A W3C ``traceparent``
    gives the operation id (its trace id) when ``cow_operation`` is absent. Raises ``TagError`` for an
    id outside ``^[A-Za-z0-9._:-]{1,128}$``.
    """
    if "/*" not in sql:  # (one C scan; the edge checks below copy a long text several times)
        return None
    lead_body, rest = _leading_comment(sql)
    trail_body, _ = _trailing_comment(rest)
    lead = _tags_of(lead_body)
    trail = _tags_of(trail_body)
    if lead is None:
        return trail
    if trail is None:
        return lead
    return Tags(
        session=trail.session if trail.session is not None else lead.session,
        operation=trail.operation if trail.operation is not None else lead.operation,
    )


def strip_edge_comments(sql: str) -> str:
    """The statement without its leading/trailing block comments and surrounding whitespace (a cache key)."""
    text = sql.strip()
    if "/*" not in text:
        return text
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
