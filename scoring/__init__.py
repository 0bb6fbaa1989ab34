"""Scoring of agent sessions against ground-truth sessions (the paper's §2.2 and appendix B).

``score_writes`` compares in-memory write lists (no database needed); ``score_sessions`` reads two sessions
recorded by the CoW layer and compares them.
"""

from __future__ import annotations

from .api import score_pairs_async, score_sessions, score_sessions_async
from .compare import Comparator, FieldContext, RowContext, register_comparator
from .config import ScoringConfig, load_config
from .core import operation_order, score_writes
from .errors import ScoringError
from .model import ColumnMeta, ForeignKey, Metadata, TableMeta, Write
from .result import (
    Alternative,
    Counts,
    OperationUtility,
    RowExplanation,
    ScoringResult,
    TableScore,
    register_score,
)
from .rewards import Reward, RewardScorer, SyncRewardScorer, rollout

__all__ = [
    "Alternative",
    "ColumnMeta",
    "Comparator",
    "Counts",
    "FieldContext",
    "ForeignKey",
    "Metadata",
    "OperationUtility",
    "Reward",
    "RewardScorer",
    "RowContext",
    "RowExplanation",
    "ScoringConfig",
    "ScoringError",
    "ScoringResult",
    "SyncRewardScorer",
    "TableMeta",
    "TableScore",
    "Write",
    "load_config",
    "operation_order",
    "register_comparator",
    "register_score",
    "rollout",
    "score_pairs_async",
    "score_sessions",
    "score_sessions_async",
    "score_writes",
]
