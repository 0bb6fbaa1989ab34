"""The demo's summary: per-agent table (the paper's Table 5), lowest-scoring sessions (Table 6), HTML."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import mean
from typing import Any

from demo.charts import Series, grouped_bars
from scoring.render import svg_reads, svg_utilities


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
    fixed: bool = False  # run with the fixed tool surface ("issue" also finds work-item operations)
    discover_calls: int = 0
    read_calls: int = 0  # execute calls of operations that only read
    write_calls: int = 0


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


@dataclass(frozen=True)
class FixRow:
    """One line of the before/after table (the paper's Table 1)."""

    agent: str
    model: str
    before: float
    after: float
    completed_before: str
    completed_after: str
    rerun: bool


def before_after(before: Sequence[SessionScore], after: Sequence[SessionScore]) -> list[FixRow]:
    """Mean overall per agent before and after the fix; an agent not re-run keeps its score."""
    rows: list[FixRow] = []
    fixed = {s.agent: s for s in summarize(after)}
    for b in summarize(before):
        a = fixed.get(b.agent)
        done = f"{b.completed}/{b.sessions}"
        rows.append(
            FixRow(
                agent=b.agent,
                model=b.model,
                before=b.overall,
                after=a.overall if a else b.overall,
                completed_before=done,
                completed_after=f"{a.completed}/{a.sessions}" if a else done,
                rerun=a is not None,
            )
        )
    return rows


def fix_table(rows: Sequence[FixRow]) -> str:
    return _table(
        ["agent", "model", "before", "after", "change", "completed before", "completed after"],
        [
            [
                r.agent,
                r.model,
                f"{r.before:.2f}",
                f"{r.after:.2f}",
                f"{r.after - r.before:+.2f}" if r.rerun else "(not re-run)",
                r.completed_before,
                r.completed_after,
            ]
            for r in rows
        ],
    )


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


def charts(scores: Sequence[SessionScore], results: Mapping[str, Any] | None = None) -> str:
    """The report's inline SVG charts: per-agent scores, before/after the fix, per-operation utilities
    and reads per operation of the lowest sessions (``results``: session -> ScoringResult), tool calls
    and SQL reads per session."""
    before = [s for s in scores if not s.fixed]
    after = [s for s in scores if s.fixed]
    summaries = summarize(before)
    names = [s.agent for s in summaries]
    parts = [
        grouped_bars(
            "Per agent: overall, precision, recall (mean over workflows)",
            names,
            [
                Series("overall", "#1d4ed8", tuple(s.overall for s in summaries)),
                Series("precision", "#059669", tuple(s.precision for s in summaries)),
                Series("recall", "#d97706", tuple(s.recall for s in summaries)),
            ],
        )
    ]
    if after:
        rows = before_after(before, after)
        parts.append(
            grouped_bars(
                "Before and after fixing the tool surface (overall)",
                [r.agent for r in rows],
                [
                    Series("before", "#9ca3af", tuple(r.before for r in rows)),
                    Series("after", "#16a34a", tuple(r.after for r in rows)),
                ],
            )
        )
    for s in lowest(before, per_agent=1):
        result = (results or {}).get(s.session)
        if result is not None:
            parts.append(
                f"<h3>Per-operation utilities: {html.escape(s.agent)} on {html.escape(s.workflow)}"
                f" (overall {s.overall:.2f})</h3>"
                '<p class="legend">bars: u_struct (green gains, red losses); dots: u_content</p>'
                + svg_utilities(result)
            )
            reads = getattr(result, "reads", None)
            if reads is not None and reads.trace:
                parts.append(
                    f"<h3>Reads per operation: {html.escape(s.agent)} on {html.escape(s.workflow)}"
                    f" (read_efficiency {_fmt_optional(reads.read_efficiency)})</h3>"
                    '<p class="legend">bars: read statements the proxy recorded (red: repeated ones, same '
                    "text and parameters); a routed session has no operation ids: its reads are one "
                    "bar, (none)</p>" + svg_reads(reads)
                )
    calls = [[s for s in before if s.agent == name] for name in names]
    parts.append(
        grouped_bars(
            "Tool calls per session (mean): discover, reads, writes",
            names,
            [
                Series("discover", "#7c3aed", tuple(mean(x.discover_calls for x in c) for c in calls)),
                Series("read calls", "#0891b2", tuple(mean(x.read_calls for x in c) for c in calls)),
                Series("write calls", "#dc2626", tuple(mean(x.write_calls for x in c) for c in calls)),
            ],
            top=1.0,
            stacked=True,
            value_format="{:.1f}",
        )
    )
    parts.extend(_reads_chart(names, before, results or {}))
    return "\n".join(f'<div class="chart-box">{p}</div>' for p in parts)


def _fmt_optional(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _reads_chart(
    names: Sequence[str], before: Sequence[SessionScore], results: Mapping[str, Any]
) -> list[str]:
    """SQL reads per session (mean per agent) from the read traces; nothing when no session has one."""
    traces = {s.session: r.reads for s in before if (r := results.get(s.session)) is not None and r.reads}
    if not any(t.trace for t in traces.values()):
        return []
    per_agent = [[traces[s.session] for s in before if s.agent == n and s.session in traces] for n in names]

    def avg(values: list[float]) -> float:
        return mean(values) if values else 0.0

    return [
        grouped_bars(
            "SQL reads per session (mean, from the proxy's read traces): statements, repeated",
            names,
            [
                Series(
                    "read statements", "#0891b2", tuple(avg([t.statements for t in a]) for a in per_agent)
                ),
                Series("repeated", "#dc2626", tuple(avg([t.repeated for t in a]) for a in per_agent)),
            ],
            top=1.0,
            value_format="{:.1f}",
        )
    ]


_FMT = "{:.2f}".format

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #111; }
table { border-collapse: collapse; margin: 1rem 0; }
th, td { border: 1px solid #ccc; padding: .25rem .5rem; text-align: left; }
td { font-variant-numeric: tabular-nums; }
th { background: #f3f4f6; }
details { margin: .5rem 0; }
.chart-box { margin: 1rem 0; }
.legend { font-size: 85%; color: #555; }
"""


def _scores(s: SessionScore | AgentSummary) -> list[str]:
    """overall, struct, content, precision, recall, F1 as the tables print them."""
    return [_FMT(v) for v in (s.overall, s.struct, s.content, s.precision, s.recall, s.f1)]


def _agents_table(scores: Sequence[SessionScore]) -> str:
    """Per agent, the mean over workflows (the paper's Table 5)."""
    return _html_table(
        ["agent", "model", "completed", "overall", "struct", "content", "precision", "recall", "F1"],
        [[s.agent, s.model, f"{s.completed}/{s.sessions}", *_scores(s)] for s in summarize(scores)],
    )


def _sessions_table(scores: Sequence[SessionScore]) -> str:
    """Every session, the re-run with the fixed tool surface too."""
    header = ["agent", "workflow", "session", "ground truth", "tools", "completed", "tool calls"]
    header += ["overall", "struct", "content", "precision", "recall", "F1", "matched", "missing", "extra"]
    return _html_table(
        header,
        [
            [
                s.agent,
                s.workflow,
                s.session,
                s.gt_session,
                "fixed" if s.fixed else "original",
                "yes" if s.completed else "no",
                str(s.tool_calls),
                *_scores(s),
                str(s.matched),
                str(s.missing),
                str(s.extra),
            ]
            for s in scores
        ],
    )


def _fix_table(scores: Sequence[SessionScore]) -> str:
    """Before and after fixing the tool surface (the paper's Table 1)."""
    rows = before_after([s for s in scores if not s.fixed], [s for s in scores if s.fixed])
    return _html_table(
        ["agent", "model", "before", "after", "change", "completed before", "completed after"],
        [
            [
                r.agent,
                r.model,
                _FMT(r.before),
                _FMT(r.after),
                f"{r.after - r.before:+.2f}" if r.rerun else "(not re-run)",
                r.completed_before,
                r.completed_after,
            ]
            for r in rows
        ],
    )


def _worst_table(scores: Sequence[SessionScore]) -> str:
    """The lowest-scoring sessions (the paper's Table 6)."""
    return _html_table(
        ["agent", "workflow", "overall", "precision", "recall", "note"],
        [
            [s.agent, s.workflow, _FMT(s.overall), _FMT(s.precision), _FMT(s.recall), s.message]
            for s in lowest(scores)
        ],
    )


def html_report(
    scores: Sequence[SessionScore],
    notes: Sequence[str],
    session_details: Sequence[tuple[str, str]] = (),
    results: Mapping[str, Any] | None = None,
) -> str:
    """A self-contained HTML page; ``session_details`` are (title, HTML fragment) pairs from the scorer;
    ``scores`` may hold the re-run with the fixed tool surface (``fixed``)."""
    original = [s for s in scores if not s.fixed]
    details = "".join(
        f"<details><summary>{html.escape(title)}</summary>{fragment}</details>"
        for title, fragment in session_details
    )
    note_items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>cowproxy demo report</title>
<style>{_STYLE}</style></head><body>
<h1>cowproxy demo report</h1>
<ul>{note_items}</ul>
<h2>Agents (like the paper's Table 5)</h2>{_agents_table(original)}
<h2>Lowest-scoring sessions (like the paper's Table 6)</h2>{_worst_table(original)}
<h2>Before and after fixing the tool surface (like the paper's Table 1)</h2>{_fix_table(scores)}
<h2>Charts</h2>{charts(scores, results)}
<h2>Every session</h2>{_sessions_table(scores)}
{"<h2>Row-level detail</h2>" + details if details else ""}
</body></html>
"""
