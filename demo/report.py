"""The demo's summary: per-agent table (the paper's Table 5), lowest-scoring sessions (Table 6), HTML."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import mean


@dataclass(frozen=True)
class SessionScore:
    agent: str
    model: str
    workflow: str
    gt_session: str
    session: str
    completed: bool
    tool_calls: int
    overall: float
    struct: float
    content: float
    precision: float
    recall: float
    f1: float
    matched: int
    missing: int
    extra: int
    gt_rows: int
    message: str = ""


@dataclass(frozen=True)
class AgentSummary:
    agent: str
    model: str
    sessions: int
    completed: int
    overall: float
    struct: float
    content: float
    precision: float
    recall: float
    f1: float


def summarize(scores: Sequence[SessionScore]) -> list[AgentSummary]:
    out: list[AgentSummary] = []
    for agent in dict.fromkeys(s.agent for s in scores):
        mine = [s for s in scores if s.agent == agent]
        out.append(
            AgentSummary(
                agent=agent,
                model=mine[0].model,
                sessions=len(mine),
                completed=sum(s.completed for s in mine),
                overall=mean(s.overall for s in mine),
                struct=mean(s.struct for s in mine),
                content=mean(s.content for s in mine),
                precision=mean(s.precision for s in mine),
                recall=mean(s.recall for s in mine),
                f1=mean(s.f1 for s in mine),
            )
        )
    return out


def lowest(scores: Sequence[SessionScore], per_agent: int = 3) -> list[SessionScore]:
    """The lowest-scoring sessions of each agent (the paper's Table 6 lists five per model); perfect ones
    are left out."""
    out: list[SessionScore] = []
    for agent in dict.fromkeys(s.agent for s in scores):
        mine = sorted(
            (s for s in scores if s.agent == agent and s.overall < 1.0), key=lambda s: (s.overall, s.workflow)
        )
        out += mine[:per_agent]
    return out


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def agent_table(summaries: Sequence[AgentSummary]) -> str:
    return _table(
        ["agent", "model", "completed", "overall", "struct", "content", "precision", "recall", "F1"],
        [
            [
                s.agent,
                s.model,
                f"{s.completed}/{s.sessions}",
                *(f"{v:.2f}" for v in (s.overall, s.struct, s.content, s.precision, s.recall, s.f1)),
            ]
            for s in summaries
        ],
    )


def lowest_table(scores: Sequence[SessionScore]) -> str:
    return _table(
        ["agent", "workflow", "overall", "precision", "recall", "matched", "missing", "extra"],
        [
            [
                s.agent,
                s.workflow,
                f"{s.overall:.2f}",
                f"{s.precision:.2f}",
                f"{s.recall:.2f}",
                str(s.matched),
                str(s.missing),
                str(s.extra),
            ]
            for s in scores
        ],
    )


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def html_report(
    scores: Sequence[SessionScore], notes: Sequence[str], session_details: Sequence[tuple[str, str]] = ()
) -> str:
    """A self-contained HTML page; ``session_details`` are (title, HTML fragment) pairs from the scorer."""
    summaries = summarize(scores)
    fmt = "{:.2f}".format
    agents = _html_table(
        ["agent", "model", "completed", "overall", "struct", "content", "precision", "recall", "F1"],
        [
            [
                s.agent,
                s.model,
                f"{s.completed}/{s.sessions}",
                *(fmt(v) for v in (s.overall, s.struct, s.content, s.precision, s.recall, s.f1)),
            ]
            for s in summaries
        ],
    )
    sessions = _html_table(
        [
            "agent",
            "workflow",
            "session",
            "ground truth",
            "completed",
            "tool calls",
            "overall",
            "struct",
            "content",
            "precision",
            "recall",
            "F1",
            "matched",
            "missing",
            "extra",
        ],
        [
            [
                s.agent,
                s.workflow,
                s.session,
                s.gt_session,
                "yes" if s.completed else "no",
                str(s.tool_calls),
                *(fmt(v) for v in (s.overall, s.struct, s.content, s.precision, s.recall, s.f1)),
                str(s.matched),
                str(s.missing),
                str(s.extra),
            ]
            for s in scores
        ],
    )
    worst = _html_table(
        ["agent", "workflow", "overall", "precision", "recall", "note"],
        [
            [s.agent, s.workflow, fmt(s.overall), fmt(s.precision), fmt(s.recall), s.message]
            for s in lowest(scores)
        ],
    )
    details = "".join(
        f"<details><summary>{html.escape(title)}</summary>{fragment}</details>"
        for title, fragment in session_details
    )
    note_items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>cowproxy demo report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem; color: #111; }}
table {{ border-collapse: collapse; margin: 1rem 0; }}
th, td {{ border: 1px solid #ccc; padding: .25rem .5rem; text-align: left; }}
td {{ font-variant-numeric: tabular-nums; }}
th {{ background: #f3f4f6; }}
details {{ margin: .5rem 0; }}
</style></head><body>
<h1>cowproxy demo report</h1>
<ul>{note_items}</ul>
<h2>Agents (like the paper's Table 5)</h2>{agents}
<h2>Lowest-scoring sessions (like the paper's Table 6)</h2>{worst}
<h2>Every session</h2>{sessions}
{"<h2>Row-level detail</h2>" + details if details else ""}
</body></html>
"""
