"""``cowproxy demo`` end to end, and its scores checked against values derived by hand from the scripts.

Derivation (quick workflows; seed in demo/seed.py, rules in demo/workflows.py, scoring in docs/scoring.md).
Ground-truth rows (last write per table and key):
- sprint-kickoff: Todo items PSP-1..7 → 7 work_items updates; PSP-1, PSP-4, PSP-7 are unassigned → 3
  assignee inserts (alice); PSP-2, PSP-5 are assigned to blub → 2 deletes + 2 inserts (bob). 14 rows.
- bug-escalation: bug items in Backlog GS-1, 2, 3, 5 → 4 updates; blocker missing on GS-1, 2, 3 → 3 label
  links; frank missing on GS-1, 2, 5 → 3 assignee links. 10 rows.
- campaign-push: new label (1); campaign items not Done/Cancelled GS-2, 6, 7, 8 → 4 label links; work_items
  updates: GS-2 (Backlog→Todo), GS-6 (Backlog→Todo, high→urgent), GS-8 (high→urgent) → 3; GS-6 unassigned →
  eve (1). 9 rows.
The content of a work_items row is the mean over its compared columns: project_id, sequence_id, name,
description, priority, state_id (6; the surrogate key id and the timestamps are not compared). A link row's
columns are both foreign keys in its key: identical when matched.

correct: the same rows → every score 1.
vocabulary: finds no "issue" operation. sprint-kickoff, bug-escalation: no writes → M = 0: struct, content,
  precision, recall, F1 and overall all 0. campaign-push: creates only the label, which pairs with the ground
  truth's (identical columns) → M = 1, missing 8, extra 0: struct 1/9, content 1, overall (1/9 + 1)/2 = 5/9,
  precision 1, recall 1/9, F1 = 2·(1/9)/(1 + 1/9) = 1/5.
overreach: the ground truth's rows plus a "triaged" label and one link per changed work item:
  sprint-kickoff E = 1 + 7 = 8 → struct = precision = 14/22 = 7/11, recall 1, content 1, overall 9/11,
  F1 = 2·(7/11)/(18/11) = 7/9; bug-escalation E = 1 + 4 = 5 → 10/15 = 2/3, overall 5/6, F1 4/5;
  campaign-push E = 1 + 4 = 5 → 9/14, overall 23/28, F1 18/23.
wrong-state: the right rows, but each state it sets is the next one: every work_items row whose state the
  ground truth changes has state_id wrong → similarity 5/6. struct = precision = recall = F1 = 1.
  sprint-kickoff: 7 such rows of 14 → content (7·5/6 + 7)/14 = 11/12, overall 23/24;
  bug-escalation: 4 of 10 → (4·5/6 + 6)/10 = 14/15, overall 29/30;
  campaign-push: GS-2 and GS-6 (GS-8 only changes priority) → (2·5/6 + 7)/9 = 26/27, overall 53/54.
model (the fake endpoint below): searches for "issue", then answers without writing → like vocabulary on
  sprint-kickoff: all 0, on every workflow (it does not create the label either).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from statistics import mean
from typing import Any

import pytest

from cowproxy.main import main
from tests.fix_db import PgServer
from tests.fix_demo import FakeModel, tool_call

# agent -> workflow -> (overall, struct, content, precision, recall, f1)
EXPECTED: dict[str, dict[str, tuple[float, ...]]] = {
    "correct": {w: (1, 1, 1, 1, 1, 1) for w in ("sprint-kickoff", "bug-escalation", "campaign-push")},
    "vocabulary": {
        "sprint-kickoff": (0, 0, 0, 0, 0, 0),
        "bug-escalation": (0, 0, 0, 0, 0, 0),
        "campaign-push": (5 / 9, 1 / 9, 1, 1, 1 / 9, 1 / 5),
    },
    "overreach": {
        "sprint-kickoff": (9 / 11, 7 / 11, 1, 7 / 11, 1, 7 / 9),
        "bug-escalation": (5 / 6, 2 / 3, 1, 2 / 3, 1, 4 / 5),
        "campaign-push": (23 / 28, 9 / 14, 1, 9 / 14, 1, 18 / 23),
    },
    "wrong-state": {
        "sprint-kickoff": (23 / 24, 1, 11 / 12, 1, 1, 1),
        "bug-escalation": (29 / 30, 1, 14 / 15, 1, 1, 1),
        "campaign-push": (53 / 54, 1, 26 / 27, 1, 1, 1),
    },
    "model:fake-model": {
        w: (0, 0, 0, 0, 0, 0) for w in ("sprint-kickoff", "bug-escalation", "campaign-push")
    },
}
GT_ROWS = {"sprint-kickoff": 14, "bug-escalation": 10, "campaign-push": 9}


def _issue_searcher(body: dict[str, Any]) -> dict[str, Any]:
    """A model that searches for "issue" once and then gives up."""
    if body["messages"][-1]["role"] == "tool":
        return {"role": "assistant", "content": "I could not find any operation for issues."}
    return tool_call("c1", "discover", {"query": "issue"})


def _run_demo(
    args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[dict[str, Any], str]:
    out = tmp_path / "demo.json"
    report = tmp_path / "report.html"
    code = main(["demo", "--quick", "--json", str(out), "--report", str(report), *args])
    output = capsys.readouterr().out
    assert code == 0, output
    result = json.loads(out.read_text())
    assert Path(result["report_path"]) == report.resolve()
    html = report.read_text()
    assert "Table 5" in html and "wrong-state" in html
    return result, output


def _check_scores(result: dict[str, Any]) -> None:
    assert result["gt_rows"] == GT_ROWS
    got = {(s["agent"], s["workflow"]): s for s in result["scores"]}
    assert set(got) == {(a, w) for a, ws in EXPECTED.items() for w in ws}
    for (agent, workflow), s in got.items():
        want = EXPECTED[agent][workflow]
        have = (s["overall"], s["struct"], s["content"], s["precision"], s["recall"], s["f1"])
        assert have == pytest.approx(want, abs=1e-9), (agent, workflow)


def _check_cleanup(result: dict[str, Any]) -> None:
    resources = result["resources"]
    assert not Path(resources["workdir"]).exists()
    if "datadir" in resources:
        assert not Path(resources["datadir"]).exists()
    if "proxy_pid" in resources:
        assert not Path(f"/proc/{resources['proxy_pid']}").exists() or _zombie(resources["proxy_pid"])


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.timeout(180)
def test_demo_through_the_proxy_scores_the_agents_as_derived(
    pg_server: PgServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fake_model: Callable[..., FakeModel],
) -> None:
    model = fake_model(_issue_searcher)
    result, output = _run_demo(
        ["--dsn", pg_server.dsn, "--model", "fake-model", "--base-url", model.url], tmp_path, capsys
    )
    _check_scores(result)
    assert result["fallback"] is None
    assert result["tagging"] == "proxy admin route"
    assert result["proxy_notes"] == []  # `cowproxy serve` ran as a subprocess (no in-process fallback)
    assert "proxy_pid" in result["resources"]
    assert "started cowproxy serve on" in output
    assert result["base_untouched"] is True
    assert "[12/12] discarded all 21 sessions" in output
    # The fix loop: the vocabulary agent's searches for "issue" are shown, it is re-run with the fixed tool
    # surface and does the ideal writes; the others completed everything and are not re-run.
    assert "vocabulary: 3 incomplete session(s)" in output and "discover('issues')" in output
    assert "Before and after fixing the tool surface (like the paper's Table 1)" in output
    assert {(s["agent"], s["overall"], s["completed"]) for s in result["fixed_scores"]} == {
        ("vocabulary", 1.0, True)
    }
    fix = {r["agent"]: r for r in result["before_after"]}
    assert fix["vocabulary"]["before"] == pytest.approx(
        mean(EXPECTED["vocabulary"][w][0] for w in EXPECTED["vocabulary"])
    )
    assert (fix["vocabulary"]["after"], fix["vocabulary"]["rerun"]) == (1.0, True)
    assert (fix["correct"]["after"], fix["correct"]["rerun"]) == (1.0, False)
    html = Path(result["report_path"]).read_text()
    assert html.count("<svg") >= 5 and "Before and after fixing the tool surface" in html
    # Every session was registered with its kind, workflow label, model and ground truth, then discarded.
    registry = {r["session_id"]: r for r in result["registry"]}
    assert len(registry) == 3 + 5 * 3 + 3
    assert {r["status"] for r in registry.values()} == {"discarded"}
    for s in result["scores"] + result["fixed_scores"]:
        row = registry[s["session"]]
        assert (row["kind"], row["label"], row["gt_session"]) == ("agent", s["workflow"], s["gt_session"])
        assert row["model"] == (s["model"] if s["agent"] != "model:fake-model" else "fake-model")
        assert registry[s["gt_session"]]["kind"] == "ground_truth"
    # The writes went through the proxy: its metrics saw them, per table.
    names = {line.split("{")[0].split(" ")[0] for line in result["metrics"]}
    assert "cowproxy_writes_total" in names
    assert any('table="public.work_items"' in line for line in result["metrics"])
    assert "a few of the proxy's Prometheus metrics" in output
    # The proxy recorded the sessions' reads (--reads-dsn): none dropped, and the report charts them.
    samples = {line.rpartition(" ")[0]: float(line.rpartition(" ")[2]) for line in result["metrics"]}
    assert samples["cowproxy_reads_recorded_total"] > 0
    assert sum(v for k, v in samples.items() if k.startswith("cowproxy_reads_dropped_total")) == 0
    assert "SQL reads per session" in html and 'aria-label="reads per operation"' in html
    _check_cleanup(result)
    assert len(model.requests) == 6  # two turns per workflow


@pytest.mark.timeout(180)
def test_demo_without_proxy_tags_with_startup_options(
    pg_server: PgServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result, output = _run_demo(
        ["--dsn", pg_server.dsn, "--no-proxy", "--agent", "correct", "--agent", "wrong-state"],
        tmp_path,
        capsys,
    )
    assert result["fallback"] == "--no-proxy"
    assert result["tagging"] == "startup options (no proxy)"
    assert result["gt_rows"] == GT_ROWS
    for s in result["scores"]:
        want = EXPECTED[s["agent"]][s["workflow"]]
        assert (s["overall"], s["content"]) == pytest.approx((want[0], want[2]), abs=1e-9)
    assert "NOTE: sessions were tagged with startup options, not through the proxy" in output
    _check_cleanup(result)


@pytest.mark.timeout(240)
def test_cli_demo_on_embedded_postgres_commits_and_leaves_nothing_running(tmp_path: Path) -> None:
    """As a new user runs it (no --dsn: the embedded PostgreSQL), one workflow, --commit."""
    out = tmp_path / "demo.json"
    env = {k: v for k, v in os.environ.items() if k not in ("COW_DSN", "DATABASE_URL", "OPENAI_API_KEY")}
    proc = subprocess.run(
        [sys.executable, "-m", "cowproxy", "demo", "--workflow", "campaign-push", "--agent", "correct",
         "--agent", "overreach", "--commit", "--json", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=200, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "starting an embedded PostgreSQL" in proc.stdout
    assert (tmp_path / "cowproxy-report.html").exists()  # the default report path, in the current directory
    result = json.loads(out.read_text())
    assert result["committed"].startswith("gt-campaign-push-")
    assert result["base_changed_by_commit"] is True
    statuses = {r["kind"]: r["status"] for r in result["registry"]}
    assert statuses == {"ground_truth": "committed", "agent": "discarded"}
    scores = {s["agent"]: s["overall"] for s in result["scores"]}
    assert scores == pytest.approx({"correct": 1.0, "overreach": 23 / 28})
    _check_cleanup(result)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--agent", "nobody"],
         "unknown agent 'nobody'; scripted agents: correct, vocabulary, overreach, wrong-state"),
        (["--report", "/nonexistent/x.html"],
         "cannot write /nonexistent/x.html: /nonexistent is not a directory"),
        (["--base-url", "http://127.0.0.1:9/v1"], "--base-url needs --model"),
        (["--dsn", "postgresql://x@127.0.0.1:1/x"],
         "the demo failed: [Errno 111] Connect call failed ('127.0.0.1', 1)"),
    ],
)  # fmt: skip
def test_cli_demo_rejects_bad_input_in_one_line(args: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cowproxy", "demo", "--quick", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"cowproxy: error: {message}"]


@pytest.mark.timeout(120)
def test_ctrl_c_stops_everything(tmp_path: Path) -> None:
    """Ctrl-C in the middle of the agents (SIGINT to the process group, as a terminal sends it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COW_DSN", "DATABASE_URL")}
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", "cowproxy", "demo", "--quick"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "[7/12]" in line:
                os.killpg(proc.pid, signal.SIGINT)
                break
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    output = "".join(lines) + rest
    assert "[7/12]" in output, output + err
    assert proc.returncode == 130, output + err
    assert err.strip().splitlines()[-1] == "cowproxy: interrupted"
    assert "Traceback" not in err
    # PostgreSQL and the proxy no longer listen; the application's port is closed.
    pg_port = int(re.search(r"PostgreSQL \S+ at postgresql://\S+@127\.0\.0\.1:(\d+)/", output).group(1))  # type: ignore[union-attr]
    app_port = int(re.search(r"application at http://127\.0\.0\.1:(\d+)", output).group(1))  # type: ignore[union-attr]
    proxy = re.search(r"on 127\.0\.0\.1:(\d+) \(upstream", output)
    ports = [pg_port, app_port] + ([int(proxy.group(1))] if proxy else [])
    for port in ports:
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, port
    assert not list(tmp_path.glob("*.html"))  # interrupted before the report


@pytest.mark.timeout(120)
def test_keep_leaves_the_application_running_until_ctrl_c(pg_server: PgServer, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COW_DSN", "DATABASE_URL")}
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", "cowproxy", "demo", "--workflow", "campaign-push", "--agent", "correct",
         "--keep", "--dsn", pg_server.dsn],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.strip().startswith("sessions: "):
                break
        text = "".join(lines)
        url = re.search(r"application: (http://\S+)", text).group(1)  # type: ignore[union-attr]
        with urllib.request.urlopen(url + "/api/projects", timeout=10) as response:
            assert [p["identifier"] for p in json.loads(response.read())] == ["PSP", "PE", "GS"]
        os.kill(proc.pid, signal.SIGINT)
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, text + rest + err
    assert "discarded all 2 sessions" in rest
    port = int(url.rsplit(":", 1)[1])
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
