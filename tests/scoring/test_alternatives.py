"""Alternative ground truths: several valid end states of one task; the agent scores its best."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cowproxy.main import main
from scoring import ScoringError, Write, score_sessions, score_writes
from scoring.core import score_alternatives
from tests.fix_scoring import record
from tests.scoring import figure3 as f3
from tests.scoring.test_core import check_figure3
from tests.scoring.test_properties import META, SETTINGS, sessions

pytestmark = pytest.mark.timeout(120)


@SETTINGS
@given(st.lists(sessions(), min_size=1, max_size=4), st.data())
def test_agent_equal_to_one_alternative_scores_one(gts: list[list[Write]], data: Any) -> None:
    chosen = data.draw(st.integers(0, len(gts) - 1))
    alternatives = {f"gt{i}": w for i, w in enumerate(gts)}
    r = score_alternatives(alternatives, gts[chosen], META)
    assert (r.overall, r.struct_score, r.content_score, r.precision, r.recall) == (1.0,) * 5
    # The chosen one scores 1.0; the first alternative scoring 1.0 is reported (ties keep the first).
    assert r.ground_truth == r.gt == next(a.session for a in r.alternative_list() if a.overall == 1.0)
    assert [a.session for a in r.alternative_list()] == list(alternatives)[: len(r.alternative_list())]
    assert max(a.overall for a in r.alternative_list()) == 1.0


def test_best_by_overall_in_memory() -> None:
    gt = f3.writes(f3.GT_ROWS, True)
    agent = f3.writes(f3.AGENT_ROWS, True)
    r = score_alternatives({"gt-a": gt, "gt-b": agent}, agent, f3.METADATA)
    assert (r.gt, r.overall) == ("gt-b", 1.0)
    assert [(a.session, a.overall) for a in r.alternatives] == [("gt-a", 0.75), ("gt-b", 1.0)]
    single = score_writes(gt, agent, f3.METADATA, gt="gt-a")
    check_figure3(single)  # one ground truth: nothing changes
    assert single.to_json()["alternatives"] == [{"session": "gt-a", "overall": 0.75}]
    assert single.to_json()["ground_truth"] == "gt-a"


@pytest.fixture(scope="module")
def alt_dsn(fig3_dsn: str) -> str:
    """gt-fig3's task also accepts the agent's end state: a second ground truth with the same label."""
    with psycopg.connect(fig3_dsn, autocommit=True) as conn:
        conn.execute("SELECT cow.create_session('gt-fig3-alt', kind => 'ground_truth', label => 'figure 3')")
        record(conn, "gt-fig3-alt", f3.AGENT_ROWS)
    return fig3_dsn


def test_library_takes_alternatives(alt_dsn: str) -> None:
    r = score_sessions(alt_dsn, ["gt-fig3", "gt-fig3-alt"], "agent-fig3")
    assert (r.ground_truth, r.overall) == ("gt-fig3-alt", 1.0)
    assert [(a.session, a.overall) for a in r.alternatives] == [("gt-fig3", 0.75), ("gt-fig3-alt", 1.0)]
    r = score_sessions(alt_dsn, ["gt-fig3", "gt-fig3-alt"], "agent-perfect")
    assert r.ground_truth == "gt-fig3"
    check_figure3(score_sessions(alt_dsn, "gt-fig3", "agent-fig3"))
    with pytest.raises(ScoringError, match="unknown session 'nope'"):
        score_sessions(alt_dsn, ["gt-fig3", "nope"], "agent-fig3")
    with pytest.raises(ScoringError, match="no ground-truth session"):
        score_sessions(alt_dsn, [], "agent-fig3")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["score", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_repeated_gt(alt_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--dsn", alt_dsn, "--gt", "gt-fig3", "--gt", "gt-fig3-alt", "--agent", "agent-fig3")
    code, out, err = run(capsys, *args, "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["ground_truth"] == data["gt"] == "gt-fig3-alt"
    assert data["alternatives"] == [
        {"session": "gt-fig3", "overall": 0.75},
        {"session": "gt-fig3-alt", "overall": 1.0},
    ]
    code, out, _ = run(capsys, *args)
    assert "matched alternative gt-fig3-alt (best of 2: gt-fig3 0.750, gt-fig3-alt 1.000)" in out


def test_all_groups_ground_truths_by_label(
    alt_dsn: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run(capsys, "--dsn", alt_dsn, "--all", "--format", "csv", "--jobs", "1")
    assert code == 0, err
    rows = {r["agent"]: r for r in csv.DictReader(io.StringIO(out))}
    # agent-fig3 names gt-fig3; gt-fig3-alt shares its label, and matches the agent exactly.
    assert rows["agent-fig3"]["gt"] == "gt-fig3-alt"
    assert rows["agent-fig3"]["alternatives"] == "gt-fig3=0.750;gt-fig3-alt=1.000"
    assert float(rows["agent-fig3"]["overall"]) == 1.0
    # A ground truth without a label has no alternatives.
    assert rows["agent-serial"]["alternatives"].count("=") == 1
    page = tmp_path / "r.html"
    code, out, err = run(capsys, "--dsn", alt_dsn, "--all", "--format", "html", "--output", str(page))
    assert code == 0, err
    assert "matched alternative gt-fig3-alt (best of 2" in page.read_text()
