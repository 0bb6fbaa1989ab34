"""Session tags: what a connection or statement says about its CoW session, and where it says it.

Sources (DESIGN.md §2), highest precedence first: a sqlcommenter comment on the statement, the startup
packet (``options=-c cow.session_id=S -c cow.operation_id=O`` or ``application_name=cow:S``), an admin
route of the database.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from proxy.errors import TagError
from proxy.protocol import StartupMessage

ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
SESSION_GUC = "cow.session_id"
OPERATION_GUC = "cow.operation_id"
APP_NAME_PREFIX = "cow:"


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
                name = name.strip().lower().replace("-", "_") if name.lower().startswith("cow") else name
                if name == SESSION_GUC:
                    session = value or None
                    i += consumed
                    continue
                if name == OPERATION_GUC:
                    operation = value or None
                    i += consumed
                    continue
            kept.extend(words[i : i + consumed])
            i += consumed
        startup = startup.replace("options", join_options(kept) if kept else None)
    app = startup.get("application_name")
    if session is None and app is not None and app.startswith(APP_NAME_PREFIX):
        session = app[len(APP_NAME_PREFIX) :] or None
    if session is not None:
        check_id(session, "session id")
    if operation is not None:
        check_id(operation, "operation id")
        if session is None:
            raise TagError("cow.operation_id given without cow.session_id")
    return StartupTags(Tags(session, operation), startup)
