"""Sub-commands of this package (filled in by its issue)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any, session_sub: Any) -> None:
    """Add this package's sub-commands to the ``cowproxy`` parser."""
    del sub, session_sub


def _unused(_: argparse.Namespace) -> int:  # pragma: no cover
    return 0
