"""``cowproxy score`` end to end on recorded sessions: formats, many pairs, bad input."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from cowproxy.main import main

pytestmark = pytest.mark.timeout(120)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["score", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json(fig3_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys, "--dsn", fig3_dsn, "--gt", "gt-fig3", "--agent", "agent-fig3", "--format", "json"
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["struct_score"] == pytest.approx(0.5)
    assert data["content_score"] == pytest.approx(1.0)
    assert data["overall"] == pytest.approx(0.75)
    assert data["efficiency"] == pytest.approx(0.8)
    assert (data["precision"], data["recall"]) == pytest.approx((0.6, 0.75))
    assert data["counts"] | {"wasted_ops": 0} == {
        "matched": 3,
        "missing": 1,
        "extra": 2,
        "gt_ops": 4,
        "agent_ops": 5,
        "wasted_ops": 0,
    }
    assert [o["struct_utility"] for o in data["operations"]] == pytest.approx(
        [0.25, 0.25, 0.25, -0.15, -0.10]
    )
    assert data["scores"]["agent_cow_weighted"] == pytest.approx(0.71)
    assert err == ""


def test_table_is_default(fig3_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--dsn", fig3_dsn, "--gt", "gt-fig3", "--agent", "agent-fig3")
    assert code == 0
    assert "overall 0.750" in out and "struct 0.500" in out
    assert "- missing public.tickets T-108" in out
    assert "+ extra   public.comments C-202 (op05)" in out
    assert "op04" in out and "-0.150" in out


def test_all_csv_and_jsonl(fig3_dsn: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "--dsn", fig3_dsn, "--all", "--format", "csv", "--jobs", "2")
    assert code == 0
    rows = {r["agent"]: r for r in csv.DictReader(io.StringIO(out))}
    assert set(rows) == {"agent-fig3", "agent-perfect", "agent-wrong-row", "agent-serial"}
    assert float(rows["agent-perfect"]["overall"]) == 1.0
    assert float(rows["agent-fig3"]["f1"]) == pytest.approx(2 / 3)
    assert rows["agent-wrong-row"]["model"] == "sloppy"
    assert (rows["agent-fig3"]["completed"], rows["agent-perfect"]["completed"]) == ("True", "")
    assert float(rows["agent-wrong-row"]["struct_score"]) == 0.0
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("gt,agent\ngt-fig3,agent-perfect\ngt-fig3,agent-fig3\n")
    code, out, _ = run(capsys, "--dsn", fig3_dsn, "--pairs", str(pairs), "--format", "jsonl")
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(x["agent"], x["overall"]) for x in lines] == [("agent-perfect", 1.0), ("agent-fig3", 0.75)]


def test_html(fig3_dsn: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    code, out, _ = run(capsys, "--dsn", fig3_dsn, "--all", "--format", "html", "--output", str(target))
    assert code == 0 and out == ""
    page = target.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page
    assert "T-108" in page and "agent-wrong-row" in page
    assert "src=" not in page and 'href="http' not in page  # self-contained


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gt", "gt-fig3", "--agent", "nope"], "unknown session 'nope'"),
        (["--gt", "gt-fig3", "--agent", "gt-fig3"], "same session"),
        (["--gt", "gt-fig3"], "give both --gt and --agent"),
        (["--all", "--gt", "gt-fig3", "--agent", "x"], "say what to score"),
        (["--gt", "g", "--agent", "a", "--format", "html"], "--output"),
    ],
)
def test_bad_input(fig3_dsn: str, capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code, out, err = run(capsys, "--dsn", fig3_dsn, *argv)
    assert code == 1 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_bad_config_and_dsn(fig3_dsn: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "score.toml"
    config.write_text('[tables.tickets.columns]\ntitle = "fuzzy"\n')
    code, _, err = run(
        capsys, "--dsn", fig3_dsn, "--gt", "gt-fig3", "--agent", "agent-fig3", "--config", str(config)
    )
    assert code == 1 and "unknown comparator 'fuzzy' for tickets.title" in err and len(err.splitlines()) == 1
    code, _, err = run(capsys, "--dsn", "postgresql://x@127.0.0.1:1/db", "--gt", "g", "--agent", "a")
    assert code == 1 and "cannot connect to the database" in err and len(err.splitlines()) == 1
    code, _, err = run(capsys, "--dsn", "postgresql://x@127.0.0.1:99999/db", "--gt", "g", "--agent", "a")
    assert code == 1 and "cannot connect to the database" in err and len(err.splitlines()) == 1
    code, _, err = run(capsys, "--dsn", "", "--gt", "g", "--agent", "a")
    assert code == 1 and "no database given" in err


def test_config_changes_scores(fig3_dsn: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "score.toml"
    # Comments ignored: the C-201 match and the C-202 extra disappear.
    config.write_text('ignore_tables = ["comments"]\nmin_similarity = 0.6\n')
    code, out, err = run(
        capsys,
        "--dsn",
        fig3_dsn,
        "--gt",
        "gt-fig3",
        "--agent",
        "agent-fig3",
        "--config",
        str(config),
        "--format",
        "json",
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["counts"]["matched"] == 2 and data["counts"]["extra"] == 1 and data["counts"]["missing"] == 1
    assert data["struct_score"] == pytest.approx(0.5)


def test_database_without_layer(empty_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--dsn", empty_db, "--all")
    assert code == 1 and out == ""
    assert "the CoW layer is not installed" in err and len(err.splitlines()) == 1


def test_progress_bar_only_on_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    from scoring.cli import _progress

    assert _progress() is None  # stderr is captured here, not a terminal


def test_pairs_file_errors(fig3_dsn: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "pairs.csv"
    bad.write_text("gt,agent\ngt-fig3\n")
    code, _, err = run(capsys, "--dsn", fig3_dsn, "--pairs", str(bad))
    assert code == 1 and "line 1 is not 'gt,agent'" in err
    code, _, err = run(capsys, "--dsn", fig3_dsn, "--pairs", str(tmp_path / "none.csv"))
    assert code == 1 and "cannot read pairs file" in err
