"""Errors of the proxy. Errors that reach a client carry a SQLSTATE."""

from __future__ import annotations


class ProxyError(Exception):
    """Root of the proxy's errors; the CLI prints its message as one line and exits non-zero."""

    sqlstate = "XX000"


class ConfigError(ProxyError):
    """Bad flags or config file."""

    sqlstate = "22023"
