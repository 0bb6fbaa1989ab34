"""Errors of the demo package."""

from __future__ import annotations

from cowproxy.errors import CowError


class DemoError(CowError):
    """A user-facing failure of ``cowproxy demo``: printed as one line by the CLI."""
