"""Errors of the scorer. Every error a user can cause derives from ScoringError."""

from __future__ import annotations

from cowproxy.errors import CowError


class ScoringError(CowError):
    """Root of the scorer's errors; the CLI prints its message as one line and exits non-zero."""
