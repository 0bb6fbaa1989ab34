"""Errors of the proxy. Errors that reach a client carry a SQLSTATE."""

from __future__ import annotations

from cowproxy.errors import CowError


class ProxyError(CowError):
    """Root of the proxy's errors; the CLI prints its message as one line and exits non-zero."""

    sqlstate = "XX000"


class ConfigError(ProxyError):
    """Bad flags or config file."""

    sqlstate = "22023"


class TagError(ProxyError):
    """A session or operation id in a comment, startup parameter or admin request is malformed."""

    sqlstate = "22023"


class PolicyError(ProxyError):
    """A tagged connection asked for what it may not do (docs/threat-model.md)."""

    sqlstate = "42501"


class RewriteError(ProxyError):
    """A statement on a CoW table that the proxy can neither pass through nor rewrite."""

    sqlstate = "0A000"

    def __init__(self, message: str, sqlstate: str = "0A000") -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class ProtocolError(ProxyError):
    """A client or server broke the wire protocol (malformed or oversized message)."""

    sqlstate = "08P01"


class AdminError(ProxyError):
    """The admin API refused a request or could not be reached."""

    sqlstate = "XX000"
