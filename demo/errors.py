"""Errors of the demo package."""

from __future__ import annotations

from migrations.errors import LayerError


class DemoError(LayerError):
    """A user-facing failure of ``cowproxy demo``: printed as one line by the CLI.

    It derives from the layer's root error because the CLI's ``main`` prints that family as one line.
    """
