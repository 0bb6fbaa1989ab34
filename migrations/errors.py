"""Errors of the copy-on-write layer. Every error a user can cause derives from LayerError."""

from __future__ import annotations

from cowproxy.errors import CowError


class LayerError(CowError):
    """Root of the layer's errors; the CLI prints its message as one line and exits non-zero."""


class NotInstalledError(LayerError):
    """The database has no cowproxy layer."""


class PermissionDeniedError(LayerError):
    """The role lacks a privilege the operation needs (install needs a superuser)."""


class SessionError(LayerError):
    """Unknown session, bad session id, session not open, commit conflict."""
