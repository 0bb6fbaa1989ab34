"""The root of every error a user of cowproxy can cause.

Each package's errors derive from ``CowError`` (``migrations.errors.LayerError``, ``proxy.errors.ProxyError``,
``scoring.errors.ScoringError``, ``demo.errors.DemoError``), so that one ``except CowError`` catches them
all, as psycopg's ``psycopg.Error`` does for its errors. The command line prints one as a single line and
exits 1; an error that reaches a PostgreSQL client carries a SQLSTATE (``ProxyError.sqlstate``).
"""

from __future__ import annotations


class CowError(Exception):
    """Root of cowproxy's errors."""


class UsageError(CowError):
    """The command line is missing something it needs (a database to connect to)."""
