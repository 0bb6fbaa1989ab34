"""A row-level function for the config tests (imported by path from a TOML file)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scoring import RowContext
from scoring.result import Stats


def same_title_words(gt: Mapping[str, Any], agent: Mapping[str, Any], ctx: RowContext) -> Mapping[str, float]:
    a, b = set(str(gt["title"]).lower().split()), set(str(agent["title"]).lower().split())
    return {"title": len(a & b) / len(a | b) if a | b else 1.0}


def strict_score(stats: Stats) -> float:
    """1 only for a perfect run."""
    return 1.0 if stats.struct_score == 1.0 and stats.content_score == 1.0 else 0.0
