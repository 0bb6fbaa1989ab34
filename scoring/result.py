"""The scorer's output: a frozen ``ScoringResult`` and the registry of named score functions."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from .errors import ScoringError
from .reads import ReadsReport


@dataclass(frozen=True)
class Counts:
    matched: int
    missing: int
    extra: int
    gt_ops: int
    agent_ops: int
    wasted_ops: int = 0


@dataclass(frozen=True)
class OperationUtility:
    operation_id: str
    struct_utility: float
    content_utility: float
    rows: int  # rows this operation wrote last
    matched_rows: int


@dataclass(frozen=True)
class Alternative:
    """One ground-truth session an agent was scored against, and the overall score it gave."""

    session: str
    overall: float


@dataclass(frozen=True)
class TableScore:
    table: str
    gt_rows: int
    agent_rows: int
    matched: int
    missing: int
    extra: int
    struct_score: float
    content_score: float


@dataclass(frozen=True)
class FieldDiff:
    column: str
    similarity: float
    gt: Any
    agent: Any


@dataclass(frozen=True)
class RowExplanation:
    """One line of the row-level report: a matched pair, a missing ground-truth row or an extra agent row."""

    table: str
    status: str  # "matched" | "missing" | "extra"
    gt_pk: Mapping[str, Any] | None
    agent_pk: Mapping[str, Any] | None
    similarity: float | None
    how: str  # "key" | "similarity" | ""
    reason: str
    operation_id: str | None  # the agent operation that wrote the row last
    diffs: tuple[FieldDiff, ...] = ()


@dataclass(frozen=True)
class Stats:
    """What a score function sees."""

    struct_score: float
    content_score: float
    efficiency: float
    precision: float
    recall: float
    f1: float
    counts: Counts


ScoreFunction = Callable[[Stats], float]

_SCORES: dict[str, ScoreFunction] = {
    "overall": lambda s: 0.5 * s.struct_score + 0.5 * s.content_score,
    "precision": lambda s: s.precision,
    "recall": lambda s: s.recall,
    "f1": lambda s: s.f1,
    # agent-cow 0.1.7's weighting, the "overall 0.71" of the paper's Figure 3.
    "agent_cow_weighted": lambda s: 0.5 * s.struct_score + 0.3 * s.content_score + 0.2 * s.efficiency,
}


def register_score(name: str, fn: ScoreFunction) -> None:
    """Add a named score; every result then carries it in ``scores``."""
    if not name or not callable(fn):
        raise ScoringError("a score function needs a name and a callable")
    _SCORES[name] = fn


def score_functions() -> Mapping[str, ScoreFunction]:
    return dict(_SCORES)


@dataclass(frozen=True)
class ScoringResult:
    gt: str
    agent: str
    struct_score: float
    content_score: float
    overall: float
    efficiency: float
    precision: float
    recall: float
    f1: float
    counts: Counts
    operations: tuple[OperationUtility, ...]
    scores: Mapping[str, float]
    tables: tuple[TableScore, ...] = ()
    rows: tuple[RowExplanation, ...] = ()
    info: Mapping[str, Any] = field(default_factory=dict)  # labels from cow.sessions (model, label, ...)
    # The ground truths the agent was scored against (one unless the task has alternatives); ``gt`` is the
    # one chosen, the best by ``overall``. Empty when scored against ``gt`` alone.
    alternatives: tuple[Alternative, ...] = ()
    # The agent's reads next to the ground truth's (``cow.reads``); None: not read (scored in memory).
    reads: ReadsReport | None = None

    @property
    def ground_truth(self) -> str:
        """The ground-truth session chosen (``gt``)."""
        return self.gt

    def alternative_list(self) -> tuple[Alternative, ...]:
        return self.alternatives or (Alternative(self.gt, self.overall),)

    def to_json(self, include_rows: bool = False) -> dict[str, Any]:
        """The object docs/interfaces.md fixes (plus ``gt``, ``agent``, ``tables``; ``rows`` on request)."""
        out: dict[str, Any] = {
            "gt": self.gt,
            "agent": self.agent,
            "ground_truth": self.gt,
            "alternatives": [{"session": a.session, "overall": a.overall} for a in self.alternative_list()],
            "struct_score": self.struct_score,
            "content_score": self.content_score,
            "overall": self.overall,
            "efficiency": self.efficiency,
            "precision": self.precision,
            "recall": self.recall,
            "f1": self.f1,
            "counts": {
                "matched": self.counts.matched,
                "missing": self.counts.missing,
                "extra": self.counts.extra,
                "gt_ops": self.counts.gt_ops,
                "agent_ops": self.counts.agent_ops,
                "wasted_ops": self.counts.wasted_ops,
            },
            "operations": [
                {
                    "operation_id": o.operation_id,
                    "struct_utility": o.struct_utility,
                    "content_utility": o.content_utility,
                    "rows": o.rows,
                    "matched_rows": o.matched_rows,
                }
                for o in self.operations
            ],
            "scores": dict(self.scores),
            "tables": [
                {
                    "table": t.table,
                    "gt_rows": t.gt_rows,
                    "agent_rows": t.agent_rows,
                    "matched": t.matched,
                    "missing": t.missing,
                    "extra": t.extra,
                    "struct_score": t.struct_score,
                    "content_score": t.content_score,
                }
                for t in self.tables
            ],
        }
        out["reads"] = (self.reads or NO_READS).to_json()
        if self.info:
            out["info"] = jsonable(dict(self.info))
        if include_rows:
            out["rows"] = [
                {
                    "table": r.table,
                    "status": r.status,
                    "gt_pk": jsonable(r.gt_pk),
                    "agent_pk": jsonable(r.agent_pk),
                    "similarity": r.similarity,
                    "how": r.how,
                    "reason": r.reason,
                    "operation_id": r.operation_id,
                    "diffs": [
                        {
                            "column": d.column,
                            "similarity": d.similarity,
                            "gt": jsonable(d.gt),
                            "agent": jsonable(d.agent),
                        }
                        for d in r.diffs
                    ],
                }
                for r in self.rows
            ]
        return out


NO_READS = ReadsReport(trace=False, gt_trace=False)  # a result scored without looking at reads


def jsonable(value: Any) -> Any:
    """Values as ``json.dumps`` takes them (exact numerics become numbers again)."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() and "E" not in str(value) else float(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)
