"""A row-level function for the config tests (imported by path from a TOML file)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scoring import RowContext


def same_title_words(gt: Mapping[str, Any], agent: Mapping[str, Any], ctx: RowContext) -> Mapping[str, float]:
    a, b = set(str(gt["title"]).lower().split()), set(str(agent["title"]).lower().split())
    return {"title": len(a & b) / len(a | b) if a | b else 1.0}
