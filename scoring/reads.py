"""Reads next to writes: the agent's read trace (``cow.reads``, recorded by ``cowproxy serve --reads-dsn``)
against the ground truth's, and ``read_efficiency`` (docs/scoring.md, "Reads").

A session has a trace when the proxy recorded at least one read of it; a session recorded without the proxy
(or without ``--reads-dsn``) has none, and its ``reads`` say so (``trace: false``, ``read_efficiency``
null) instead of scoring it as a session that read nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

NO_TRACE = "no read trace: the session was not recorded through the proxy with --reads-dsn"
NO_GT_TRACE = "the ground truth has no read trace: nothing to compare the agent's reads with"


@dataclass(frozen=True)
class TraceRead:
    """One recorded read (a row of ``cow.reads``)."""

    operation_id: str | None
    fingerprint: str
    identity: str  # equal for the same text and bound parameters
    relations: tuple[str, ...]
    rows: int | None


@dataclass(frozen=True)
class OperationReads:
    operation_id: str | None
    statements: int
    rows: int
    repeated: int  # reads identical to an earlier read of the operation
    relations: tuple[str, ...]


@dataclass(frozen=True)
class ReadsReport:
    """The ``reads`` object of a result (docs/interfaces.md)."""

    trace: bool  # the agent session has a read trace
    gt_trace: bool
    statements: int = 0
    rows: int = 0
    repeated: int = 0  # reads identical (text and parameters) to an earlier read of the session
    distinct_statements: int = 0  # distinct fingerprints
    relations: tuple[str, ...] = ()
    gt_statements: int = 0
    gt_rows: int = 0
    gt_relations: tuple[str, ...] = ()
    unneeded_relations: tuple[str, ...] = ()  # read by the agent, never by the ground truth
    read_efficiency: float | None = None  # None: no trace on one side (``note`` says which)
    operations: tuple[OperationReads, ...] = ()

    @property
    def note(self) -> str | None:
        if not self.trace:
            return NO_TRACE
        if not self.gt_trace:
            return NO_GT_TRACE
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "trace": self.trace,
            "gt_trace": self.gt_trace,
            "note": self.note,
            "read_efficiency": self.read_efficiency,
            "statements": self.statements,
            "distinct_statements": self.distinct_statements,
            "rows": self.rows,
            "repeated": self.repeated,
            "relations": list(self.relations),
            "gt_statements": self.gt_statements,
            "gt_rows": self.gt_rows,
            "gt_relations": list(self.gt_relations),
            "unneeded_relations": list(self.unneeded_relations),
            "operations": [
                {
                    "operation_id": o.operation_id,
                    "statements": o.statements,
                    "rows": o.rows,
                    "repeated": o.repeated,
                    "relations": list(o.relations),
                }
                for o in self.operations
            ],
        }


def _rows(reads: Sequence[TraceRead]) -> int:
    return sum(r.rows or 0 for r in reads)


def _relations(reads: Sequence[TraceRead]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(t for r in reads for t in r.relations))


def _repeated(reads: Sequence[TraceRead]) -> int:
    return len(reads) - len({r.identity for r in reads})


def per_operation(reads: Sequence[TraceRead]) -> tuple[OperationReads, ...]:
    """The reads grouped by operation, in the order of each operation's first read."""
    grouped: dict[str | None, list[TraceRead]] = {}
    for r in reads:
        grouped.setdefault(r.operation_id, []).append(r)
    return tuple(
        OperationReads(op, len(rs), _rows(rs), _repeated(rs), _relations(rs)) for op, rs in grouped.items()
    )


def read_efficiency(gt_rows: int, agent_rows: int) -> float:
    """min(1, ground truth's rows read / agent's rows read); 1.0 when the agent read no rows."""
    if agent_rows <= 0:
        return 1.0
    return min(1.0, gt_rows / agent_rows)


def compare_reads(gt: Sequence[TraceRead], agent: Sequence[TraceRead]) -> ReadsReport:
    """The agent's reads next to the ground truth's (either may be empty: no trace)."""
    if not agent:
        return ReadsReport(trace=False, gt_trace=bool(gt), gt_statements=len(gt), gt_rows=_rows(gt))
    relations = _relations(agent)
    gt_relations = _relations(gt)
    rows, gt_rows = _rows(agent), _rows(gt)
    return ReadsReport(
        trace=True,
        gt_trace=bool(gt),
        statements=len(agent),
        rows=rows,
        repeated=_repeated(agent),
        distinct_statements=len({r.fingerprint for r in agent}),
        relations=relations,
        gt_statements=len(gt),
        gt_rows=gt_rows,
        gt_relations=gt_relations,
        unneeded_relations=tuple(t for t in relations if t not in gt_relations) if gt else (),
        read_efficiency=read_efficiency(gt_rows, rows) if gt else None,
        operations=per_operation(agent),
    )
