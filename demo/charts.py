"""Inline SVG charts for the demo's HTML report (no script, no network, no dependency)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Series:
    name: str
    color: str
    values: tuple[float, ...]  # one per category


def _legend(series: Sequence[Series], x: float, y: float) -> list[str]:
    parts = []
    for i, s in enumerate(series):
        lx = x + i * 120
        parts.append(f'<rect x="{lx}" y="{y - 9}" width="10" height="10" fill="{s.color}"/>')
        parts.append(f'<text x="{lx + 14}" y="{y}" font-size="11">{html.escape(s.name)}</text>')
    return parts


def grouped_bars(
    title: str,
    categories: Sequence[str],
    series: Sequence[Series],
    *,
    top: float = 1.0,
    stacked: bool = False,
    value_format: str = "{:.2f}",
) -> str:
    """Bars per category, side by side (or stacked), on a 0..``top`` axis; each bar has a tooltip."""
    if not categories or not series:
        return f"<p>{html.escape(title)}: no data.</p>"
    if stacked:
        top = max(top, *(sum(s.values[i] for s in series) for i in range(len(categories))))
    height, pad_left, pad_top, label_room = 180, 40, 44, 70
    bar = 18 if not stacked else 30
    group = (bar * (1 if stacked else len(series))) + 22
    width = max(pad_left + len(categories) * group + 20, 140 + 120 * len(series), 8 * len(title))
    scale = height / top if top > 0 else 0.0
    base = pad_top + height
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" '
        f'height="{base + label_room}" role="img" aria-label="{html.escape(title)}">',
        f'<text x="{pad_left}" y="14" font-size="13" font-weight="bold">{html.escape(title)}</text>',
        *_legend(series, pad_left, 32),
        f'<line x1="{pad_left}" y1="{base}" x2="{width - 10}" y2="{base}" stroke="#888"/>',
    ]
    for tick in (0.0, 0.5, 1.0):
        ty = base - tick * top * scale
        label = value_format.format(tick * top)
        parts.append(
            f'<line x1="{pad_left - 4}" y1="{ty:.1f}" x2="{width - 10}" y2="{ty:.1f}" stroke="#eee"/>'
        )
        parts.append(
            f'<text x="{pad_left - 6}" y="{ty + 4:.1f}" font-size="10" text-anchor="end">{label}</text>'
        )
    for i, category in enumerate(categories):
        gx = pad_left + 10 + i * group
        stack = 0.0
        for j, s in enumerate(series):
            value = s.values[i]
            h = max(value * scale, 0.0)
            x = gx if stacked else gx + j * bar
            y = base - stack * scale - h
            tip = f"{category} · {s.name}: {value_format.format(value)}"
            parts.append(
                f'<rect x="{x}" y="{y:.1f}" width="{bar - 2}" height="{max(h, 0.5):.1f}" fill="{s.color}">'
                f"<title>{html.escape(tip)}</title></rect>"
            )
            if stacked:
                stack += value
        cx = gx + (bar if stacked else bar * len(series)) / 2
        parts.append(
            f'<text x="{cx:.1f}" y="{base + 12}" font-size="10" text-anchor="end" '
            f'transform="rotate(-35 {cx:.1f} {base + 12})">{html.escape(category)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
