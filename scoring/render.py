"""Output formats of ``cowproxy score``: table (terminal), json, csv/jsonl (one line per pair), html."""

from __future__ import annotations

import csv
import html
import io
import json
from collections.abc import Sequence
from typing import Any

from .reads import ReadsReport
from .result import NO_READS, ScoringResult, jsonable

CSV_COLUMNS = (
    "gt",
    "agent",
    "label",
    "model",
    "status",
    "completed",
    "overall",
    "struct_score",
    "content_score",
    "precision",
    "recall",
    "f1",
    "efficiency",
    "matched",
    "missing",
    "extra",
    "gt_ops",
    "agent_ops",
    "alternatives",
    "read_efficiency",
    "reads_trace",
    "reads_statements",
    "reads_rows",
    "reads_repeated",
    "reads_unneeded_tables",
)


def render_json(results: Sequence[ScoringResult], include_rows: bool = False) -> str:
    if len(results) == 1:
        return json.dumps(results[0].to_json(include_rows), indent=2)
    return json.dumps([r.to_json(include_rows) for r in results], indent=2)


def flat(result: ScoringResult) -> dict[str, Any]:
    """The paper's per-run columns (Table 5) plus the counts and every named score."""
    c = result.counts
    out: dict[str, Any] = {
        "gt": result.gt,
        "agent": result.agent,
        "label": result.info.get("label"),
        "model": result.info.get("model"),
        "status": result.info.get("status"),
        "completed": result.info.get("completed"),
        "overall": result.overall,
        "struct_score": result.struct_score,
        "content_score": result.content_score,
        "precision": result.precision,
        "recall": result.recall,
        "f1": result.f1,
        "efficiency": result.efficiency,
        "matched": c.matched,
        "missing": c.missing,
        "extra": c.extra,
        "gt_ops": c.gt_ops,
        "agent_ops": c.agent_ops,
        "alternatives": alternatives_text(result),
        **_flat_reads(result.reads or NO_READS),
    }
    for name, value in result.scores.items():
        out[f"score_{name}"] = value
    return out


def _flat_reads(reads: ReadsReport) -> dict[str, Any]:
    """The reads' columns; without a trace only ``reads_trace`` (false), the others empty."""
    if not reads.trace:
        return dict.fromkeys(CSV_COLUMNS[CSV_COLUMNS.index("read_efficiency") :]) | {"reads_trace": False}
    return {
        "read_efficiency": reads.read_efficiency,
        "reads_trace": True,
        "reads_statements": reads.statements,
        "reads_rows": reads.rows,
        "reads_repeated": reads.repeated,
        "reads_unneeded_tables": ";".join(reads.unneeded_relations),
    }


def reads_text(reads: ReadsReport) -> str:
    """One line on the reads: the figures, the ground truth's, read_efficiency; or why there are none."""
    if not reads.trace:
        return f"reads: {reads.note}"
    text = (
        f"reads: {reads.statements} statements ({reads.distinct_statements} distinct, {reads.repeated} "
        f"repeated), {reads.rows} rows, tables {', '.join(reads.relations) or '-'}"
    )
    if not reads.gt_trace:
        return f"{text}; {reads.note}"
    assert reads.read_efficiency is not None
    text += (
        f"; ground truth {reads.gt_statements} statements, {reads.gt_rows} rows; "
        f"read_efficiency {reads.read_efficiency:.3f}"
    )
    if reads.unneeded_relations:
        text += f"; not read by the ground truth: {', '.join(reads.unneeded_relations)}"
    return text


def alternatives_text(result: ScoringResult) -> str:
    """``A=0.500;B=1.000``: every ground truth the agent was scored against, with its overall score."""
    return ";".join(f"{a.session}={a.overall:.3f}" for a in result.alternative_list())


def _alternatives_line(result: ScoringResult) -> str | None:
    if len(result.alternative_list()) < 2:
        return None
    others = ", ".join(f"{a.session} {a.overall:.3f}" for a in result.alternative_list())
    return f"  matched alternative {result.gt} (best of {len(result.alternative_list())}: {others})"


def render_jsonl(results: Sequence[ScoringResult]) -> str:
    return "".join(json.dumps(flat(r)) + "\n" for r in results)


def render_csv(results: Sequence[ScoringResult]) -> str:
    buf = io.StringIO()
    columns = list(CSV_COLUMNS)
    for r in results:
        columns.extend(k for k in flat(r) if k not in columns)
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in results:
        writer.writerow({k: ("" if v is None else v) for k, v in flat(r).items()})
    return buf.getvalue()


def _pk(pk: Any) -> str:
    if not pk:
        return "-"
    values = list(jsonable(pk).values())
    return ",".join(str(v) for v in values)


def _short(value: Any, width: int = 40) -> str:
    text = json.dumps(jsonable(value)) if not isinstance(value, str) else value
    return text if len(text) <= width else text[: width - 1] + "…"


def _reads_lines(reads: ReadsReport) -> list[str]:
    """The table format's reads: one line, then the reads per operation."""
    out = ["  " + reads_text(reads)]
    if reads.operations:
        width = max(len("operation"), *(len(o.operation_id or "(none)") for o in reads.operations))
        out.append("")
        out.append(f"  {'operation':<{width}}  reads  rows repeated tables")
        for o in reads.operations:
            out.append(
                f"  {o.operation_id or '(none)':<{width}}  {o.statements:>5} {o.rows:>5} "
                f"{o.repeated:>8} {', '.join(o.relations) or '-'}"
            )
    return out


def render_table(results: Sequence[ScoringResult], rows: bool = True) -> str:
    out: list[str] = []
    for r in results:
        out += _text_head(r)
        out += _reads_lines(r.reads or NO_READS)
        out += _text_tables(r)
        out += _text_operations(r)
        if rows and r.rows:
            out += _text_rows(r)
        out.append("")
    if len(results) > 1:
        out += _text_overview(results)
    return "\n".join(out).rstrip() + "\n"


def _text_head(r: ScoringResult) -> list[str]:
    """The pair, its alternatives, scores and counts."""
    c = r.counts
    extras = ", ".join(f"{k} {v}" for k, v in r.info.items() if v and k in ("label", "model"))
    out = [f"{r.agent} vs ground truth {r.gt}" + (f"  ({extras})" if extras else "")]
    alt = _alternatives_line(r)
    if alt:
        out.append(alt)
    out.append(
        f"  overall {r.overall:.3f}   struct {r.struct_score:.3f}   content {r.content_score:.3f}   "
        f"efficiency {r.efficiency:.3f}"
    )
    out.append(f"  precision {r.precision:.3f}   recall {r.recall:.3f}   f1 {r.f1:.3f}")
    out.append(
        f"  rows: {c.matched} matched, {c.missing} missing, {c.extra} extra   "
        f"operations: {c.agent_ops} agent, {c.gt_ops} ground truth, {c.wasted_ops} wasted"
    )
    out.append("  scores: " + "   ".join(f"{k} {v:.3f}" for k, v in r.scores.items()))
    return out


def _text_tables(r: ScoringResult) -> list[str]:
    if not r.tables:
        return []
    width = max(len("table"), *(len(t.table) for t in r.tables))
    out = [
        "",
        f"  {'table':<{width}}  {'gt':>5} {'agent':>5} {'match':>5} {'miss':>5} {'extra':>5} struct content",
    ]
    for t in r.tables:
        out.append(
            f"  {t.table:<{width}}  {t.gt_rows:>5} {t.agent_rows:>5} {t.matched:>5} {t.missing:>5} "
            f"{t.extra:>5} {t.struct_score:>6.3f} {t.content_score:>7.3f}"
        )
    return out


def _text_operations(r: ScoringResult) -> list[str]:
    if not r.operations:
        return []
    width = max(len("operation"), *(len(o.operation_id) for o in r.operations))
    out = ["", f"  {'operation':<{width}}  u_struct u_content rows matched"]
    for o in r.operations:
        out.append(
            f"  {o.operation_id:<{width}}  {o.struct_utility:>+8.3f} {o.content_utility:>9.3f} "
            f"{o.rows:>4} {o.matched_rows:>7}"
        )
    return out


def _text_rows(r: ScoringResult) -> list[str]:
    """The rows that differ: matched with differing columns, missing, extra."""
    out = [""]
    for e in r.rows:
        if e.status == "matched" and not e.diffs:
            continue
        if e.status == "matched":
            out.append(
                f"  ~ {e.table} {_pk(e.gt_pk)} <-> {_pk(e.agent_pk)}  similarity {e.similarity:.3f} "
                f"(by {e.how}, {e.operation_id})"
            )
            for d in e.diffs:
                out.append(f"      {d.column}: {_short(d.gt)} -> {_short(d.agent)} ({d.similarity:.2f})")
        elif e.status == "missing":
            out.append(f"  - missing {e.table} {_pk(e.gt_pk)}: {e.reason}")
        else:
            out.append(f"  + extra   {e.table} {_pk(e.agent_pk)} ({e.operation_id}): {e.reason}")
    return out


def _text_overview(results: Sequence[ScoringResult]) -> list[str]:
    """One line per pair and the mean overall score."""
    width = max(len("agent"), *(len(r.agent) for r in results))
    gwidth = max(len("gt"), *(len(r.gt) for r in results))
    out = [f"{'agent':<{width}}  {'gt':<{gwidth}}  overall struct content precision recall    f1"]
    for r in results:
        out.append(
            f"{r.agent:<{width}}  {r.gt:<{gwidth}}  {r.overall:>7.3f} {r.struct_score:>6.3f} "
            f"{r.content_score:>7.3f} {r.precision:>9.3f} {r.recall:>6.3f} {r.f1:>5.3f}"
        )
    mean = sum(r.overall for r in results) / len(results)
    out.append(f"mean overall {mean:.3f} over {len(results)} pairs")
    return out


def svg_utilities(result: ScoringResult) -> str:
    """Per-operation utilities as an inline SVG bar chart (u_struct bars, u_content dots)."""
    ops = result.operations
    if not ops:
        return "<p>No agent operations.</p>"
    bar, gap, height, pad = 22, 6, 200, 30
    width = pad * 2 + len(ops) * (bar + gap)
    peak = max(0.25, *(abs(o.struct_utility) for o in ops))
    mid = height / 2
    scale = (height / 2 - 10) / peak
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 60}" role="img" '
        f'aria-label="per-operation utilities">',
        f'<line x1="{pad}" y1="{mid}" x2="{width - pad}" y2="{mid}" stroke="#888"/>',
    ]
    for i, o in enumerate(ops):
        x = pad + i * (bar + gap)
        h = abs(o.struct_utility) * scale
        y = mid - h if o.struct_utility >= 0 else mid
        color = "#2e7d32" if o.struct_utility >= 0 else "#c62828"
        label = html.escape(o.operation_id)
        parts.append(
            f'<rect x="{x}" y="{y:.1f}" width="{bar}" height="{max(h, 1):.1f}" fill="{color}">'
            f"<title>{label}: u_struct {o.struct_utility:+.3f}, "
            f"u_content {o.content_utility:.3f}</title></rect>"
        )
        cy = height - 5 - o.content_utility * (height - 10)
        parts.append(f'<circle cx="{x + bar / 2}" cy="{cy:.1f}" r="3" fill="#1565c0"/>')
        parts.append(
            f'<text x="{x + bar / 2}" y="{height + 12}" font-size="9" text-anchor="end" '
            f'transform="rotate(-45 {x + bar / 2} {height + 12})">{label}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def svg_reads(reads: ReadsReport) -> str:
    """Reads per operation as an inline SVG bar chart (statements; the repeated part darker)."""
    ops = reads.operations
    if not ops:
        return f"<p>{html.escape(reads_text(reads))}</p>"
    bar, gap, height, pad = 22, 6, 120, 30
    width = pad * 2 + len(ops) * (bar + gap)
    peak = max(o.statements for o in ops)
    scale = (height - 10) / peak
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 60}" role="img" '
        f'aria-label="reads per operation">',
        f'<line x1="{pad}" y1="{height}" x2="{width - pad}" y2="{height}" stroke="#888"/>',
    ]
    for i, o in enumerate(ops):
        x = pad + i * (bar + gap)
        h, dup = o.statements * scale, o.repeated * scale
        label = html.escape(o.operation_id or "(none)")
        tables = html.escape(", ".join(o.relations) or "-")
        parts.append(
            f'<rect x="{x}" y="{height - h:.1f}" width="{bar}" height="{h:.1f}" fill="#1565c0">'
            f"<title>{label}: {o.statements} reads, {o.repeated} repeated, {o.rows} rows; {tables}</title>"
            "</rect>"
        )
        if dup:
            parts.append(
                f'<rect x="{x}" y="{height - dup:.1f}" width="{bar}" height="{dup:.1f}" fill="#c62828"/>'
            )
        parts.append(
            f'<text x="{x + bar / 2}" y="{height + 12}" font-size="9" text-anchor="end" '
            f'transform="rotate(-45 {x + bar / 2} {height + 12})">{label}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
td.l,th.l{text-align:left}.missing{background:#fdecea}.extra{background:#fff4e5}.matched{background:#eef7ee}
code{font-size:90%}h2{margin-top:2em;border-top:1px solid #ddd;padding-top:1em}
.legend{font-size:85%;color:#555}
"""


def render_html(results: Sequence[ScoringResult]) -> str:
    body: list[str] = ["<h1>cowproxy scores</h1>"]
    if len(results) > 1:
        body += _html_overview(results)
    for r in results:
        body += _html_result_head(r)
        body += _html_reads(r)
        body += _html_tables(r)
        body += _html_rows(r)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>cowproxy scores</title>'
        f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def _html_overview(results: Sequence[ScoringResult]) -> list[str]:
    """One row per result, linking to its section."""
    esc = html.escape
    body = [
        '<table><tr><th class="l">agent</th><th class="l">ground truth</th><th>overall</th>'
        "<th>struct</th><th>content</th><th>precision</th><th>recall</th><th>F1</th></tr>"
    ]
    for r in results:
        body.append(
            f'<tr><td class="l"><a href="#{esc(r.agent)}">{esc(r.agent)}</a></td>'
            f'<td class="l">{esc(r.gt)}</td>'
            f"<td>{r.overall:.3f}</td><td>{r.struct_score:.3f}</td><td>{r.content_score:.3f}</td>"
            f"<td>{r.precision:.3f}</td><td>{r.recall:.3f}</td><td>{r.f1:.3f}</td></tr>"
        )
    body.append("</table>")
    return body


def _html_result_head(r: ScoringResult) -> list[str]:
    """A result's heading, notes, scores, counts and per-operation utilities."""
    esc = html.escape
    c = r.counts
    body = [f'<h2 id="{esc(r.agent)}">{esc(r.agent)} vs {esc(r.gt)}</h2>']
    info = ", ".join(f"{esc(k)}: {esc(str(v))}" for k, v in r.info.items() if v)
    if info:
        body.append(f"<p>{info}</p>")
    alt = _alternatives_line(r)
    if alt:
        body.append(f'<p class="alternatives">{esc(alt.strip())}</p>')
    body.append(
        "<table><tr>" + "".join(f"<th>{k}</th>" for k in r.scores) + "<th>struct</th><th>content</th>"
        "<th>efficiency</th></tr><tr>"
        + "".join(f"<td>{v:.3f}</td>" for v in r.scores.values())
        + f"<td>{r.struct_score:.3f}</td><td>{r.content_score:.3f}</td>"
        + f"<td>{r.efficiency:.3f}</td></tr></table>"
    )
    body.append(
        f"<p>{c.matched} matched, {c.missing} missing, {c.extra} extra rows; "
        f"{c.agent_ops} agent operations "
        f"({c.wasted_ops} wasted) for {c.gt_ops} in the ground truth.</p>"
    )
    body.append("<h3>Per-operation utility</h3>")
    body.append(
        '<p class="legend">bars: u_struct (green gains, red losses); dots: u_content (0 bottom, 1 top)</p>'
    )
    body.append(svg_utilities(r))
    return body


def _html_reads(r: ScoringResult) -> list[str]:
    reads = r.reads or NO_READS
    body = ["<h3>Reads</h3>", f'<p class="reads">{html.escape(reads_text(reads))}</p>']
    if reads.operations:
        body.append(
            '<p class="legend">reads per operation: bars are statements, the repeated ones '
            "(same text and parameters as an earlier read) in red</p>"
        )
        body.append(svg_reads(reads))
    return body


def _html_tables(r: ScoringResult) -> list[str]:
    body = [
        '<h3>Tables</h3><table><tr><th class="l">table</th><th>gt rows</th><th>agent rows</th>'
        "<th>matched</th><th>missing</th><th>extra</th><th>struct</th><th>content</th></tr>"
    ]
    for t in r.tables:
        body.append(
            f'<tr><td class="l">{html.escape(t.table)}</td><td>{t.gt_rows}</td><td>{t.agent_rows}</td>'
            f"<td>{t.matched}</td><td>{t.missing}</td><td>{t.extra}</td>"
            f"<td>{t.struct_score:.3f}</td><td>{t.content_score:.3f}</td></tr>"
        )
    body.append("</table>")
    return body


def _html_rows(r: ScoringResult) -> list[str]:
    """Every row's status, with the differing columns of a matched row."""
    esc = html.escape
    body = [
        '<h3>Rows</h3><table><tr><th class="l">status</th><th class="l">table</th>'
        '<th class="l">ground truth</th>'
        '<th class="l">agent</th><th>similarity</th><th class="l">details</th></tr>'
    ]
    for e in r.rows:
        if e.status == "matched" and e.diffs:
            details = "<br>".join(
                f"<code>{esc(d.column)}</code>: {esc(_short(d.gt, 80))} → "
                f"{esc(_short(d.agent, 80))} ({d.similarity:.2f})"
                for d in e.diffs
            )
        else:
            details = esc(e.reason)
        sim = f"{e.similarity:.3f}" if e.similarity is not None else ""
        body.append(
            f'<tr class="{e.status}"><td class="l">{e.status}</td><td class="l">{esc(e.table)}</td>'
            f'<td class="l">{esc(_pk(e.gt_pk))}</td><td class="l">{esc(_pk(e.agent_pk))}</td>'
            f"<td>{sim}</td>"
            f'<td class="l">{details}</td></tr>'
        )
    body.append("</table>")
    return body
