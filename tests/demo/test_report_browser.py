"""The demo's HTML report in a real browser: headless Chromium parses it and renders its inline SVG charts."""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from demo import report
from demo.report import SessionScore
from scoring import score_writes
from tests.scoring import figure3 as f3

pytestmark = pytest.mark.timeout(120)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# As root and on a machine without a network: no sandbox, no background connections (docs/demo.md).
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def _score(
    agent: str, workflow: str, overall: float, *, fixed: bool = False, done: bool = True
) -> SessionScore:
    return SessionScore(
        agent=agent,
        model=f"scripted:{agent}",
        workflow=workflow,
        gt_session=f"gt-{workflow}",
        session=f"{agent}-{workflow}" + ("-fixed" if fixed else ""),
        completed=done,
        tool_calls=12,
        overall=overall,
        struct=overall,
        content=1.0,
        precision=overall,
        recall=1.0,
        f1=overall,
        matched=3,
        missing=0,
        extra=1,
        gt_rows=3,
        fixed=fixed,
        discover_calls=4,
        read_calls=4,
        write_calls=4,
    )


def _report(tmp_path: Path) -> Path:
    scores = [
        _score("correct", "sprint-kickoff", 1.0),
        _score("vocabulary", "sprint-kickoff", 0.2, done=False),
        _score("overreach", "sprint-kickoff", 0.75),
        _score("vocabulary", "sprint-kickoff", 1.0, fixed=True),
    ]
    fig3 = score_writes(f3.writes(f3.GT_ROWS), f3.writes(f3.AGENT_ROWS), f3.METADATA, gt="gt", agent="a")
    results = {s.session: fig3 for s in scores}
    page = tmp_path / "report.html"
    page.write_text(report.html_report(scores, ["tagging: test"], [], results))
    return page


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHROMIUM), *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def _png_rows(path: Path) -> tuple[list[bytes], int]:
    """The PNG's scanlines (filter bytes stripped; 8-bit RGB or RGBA, as Chromium writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, channels = 8, b"", 0, 0, 4
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    prev = bytearray(stride)
    for r in range(height):
        kind, line = raw[r * (stride + 1)], bytearray(raw[r * (stride + 1) + 1 : (r + 1) * (stride + 1)])
        for i in range(stride):  # undo the row's filter (PNG spec, section 9)
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line))
        prev = line
    return rows, channels


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium)")
def test_report_charts_render_in_headless_chromium(tmp_path: Path) -> None:
    page = _report(tmp_path)
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    # The browser parsed the inline SVG charts into its DOM: per agent, before/after, the utilities of each
    # agent's lowest imperfect session (vocabulary, overreach), tool calls.
    assert dom.stdout.count("<svg") == 2 + 2 + 1
    for title in (
        "Per agent: overall, precision, recall",
        "Before and after fixing the tool surface",
        "Per-operation utilities",
        "Tool calls per session",
    ):
        assert title in dom.stdout
    shot = tmp_path / "shot.png"
    run = _chromium(tmp_path, "--window-size=1200,2400", f"--screenshot={shot}", page.as_uri())
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    rows, channels = _png_rows(shot)
    assert len(rows) == 2400
    # The charts are drawn: the bars' blue (#1d4ed8) and green (#16a34a) pixels are on the page.
    colors = {row[i : i + 3] for row in rows for i in range(0, len(row), channels)}
    assert b"\x1d\x4e\xd8" in colors and b"\x16\xa3\x4a" in colors
