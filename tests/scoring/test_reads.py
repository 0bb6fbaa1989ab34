"""Reads next to writes in ``cowproxy score``: the ``reads`` object, ``read_efficiency`` (docs/scoring.md),
the table, CSV/JSONL and HTML; sessions recorded through a real proxy with ``--reads-dsn``, and one recorded
without it (no trace, and the scores say so)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cowproxy.main import main
from scoring.reads import NO_GT_TRACE, NO_TRACE, TraceRead, compare_reads, read_efficiency
from tests.fix_db import PgServer
from tests.fix_proxy import RunningProxy, run_proxy
from tests.proxy.test_reads import flush, tagged

pytestmark = pytest.mark.timeout(120)


def read(op: str, identity: str, rows: int, *tables: str) -> TraceRead:
    return TraceRead(op, "fp-" + identity.split(":", maxsplit=1)[0], identity, tables, rows)


def test_compare_reads_counts_repeats_unneeded_tables_and_efficiency() -> None:
    gt = [read("g1", "a:1", 1, "public.customers")]
    agent = [
        read("o1", "all", 3, "public.customers"),
        read("o1", "all", 3, "public.customers"),  # the same read again
        read("o2", "a:1", 1, "public.customers", "public.orders"),
    ]
    report = compare_reads(gt, agent)
    assert (report.trace, report.gt_trace, report.note) == (True, True, None)
    assert (report.statements, report.rows, report.repeated, report.distinct_statements) == (3, 7, 1, 2)
    assert report.unneeded_relations == ("public.orders",)
    assert report.read_efficiency == pytest.approx(1 / 7)
    assert [(o.operation_id, o.statements, o.rows, o.repeated) for o in report.operations] == [
        ("o1", 2, 6, 1),
        ("o2", 1, 1, 0),
    ]
    assert read_efficiency(5, 2) == 1.0 and read_efficiency(3, 0) == 1.0  # capped; nothing read: 1
    assert compare_reads(gt, gt).read_efficiency == 1.0


def test_without_a_trace_the_report_says_so() -> None:
    gt = [read("g1", "a:1", 1, "public.customers")]
    none = compare_reads(gt, [])
    assert (none.trace, none.read_efficiency, none.note) == (False, None, NO_TRACE)
    no_gt = compare_reads([], gt)
    assert (no_gt.trace, no_gt.gt_trace, no_gt.read_efficiency, no_gt.note) == (
        True,
        False,
        None,
        NO_GT_TRACE,
    )
    assert no_gt.unneeded_relations == ()  # nothing to compare with


@pytest.fixture
def recorded(pg_server: PgServer, layer_db: str) -> Iterator[tuple[RunningProxy, str]]:
    """Three sessions: a ground truth and an agent recorded through a proxy with --reads-dsn (the agent
    reads more, twice, and a table the ground truth never read), and an agent written without the proxy."""
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute("SELECT cow.create_session('gt-r', 'ground_truth')")
        conn.execute("SELECT cow.create_session('ag-r', 'agent', gt_session => 'gt-r')")
        conn.execute("SELECT cow.create_session('ag-plain', 'agent', gt_session => 'gt-r')")
    with run_proxy(pg_server, reads_dsn=pg_server.dsn) as proxy:
        with psycopg.connect(tagged(proxy, layer_db, "gt-r", "find"), autocommit=True) as conn:
            conn.execute("SELECT id FROM customers WHERE email = %s", ("bob@example.com",)).fetchall()
            conn.execute("/*cow_operation='edit'*/ UPDATE customers SET tier = 'pro' WHERE id = 2")
        with psycopg.connect(tagged(proxy, layer_db, "ag-r", "look"), autocommit=True) as conn:
            conn.execute("SELECT * FROM customers").fetchall()
            conn.execute("SELECT * FROM customers").fetchall()
            conn.execute("SELECT * FROM orders").fetchall()
            conn.execute("/*cow_operation='edit'*/ UPDATE customers SET tier = 'pro' WHERE id = 2")
        flush(proxy)
        with psycopg.connect(layer_db, autocommit=True) as conn:  # no proxy: no trace
            conn.execute("SELECT cow.use_session('ag-plain', 'edit')")
            conn.execute("SELECT * FROM customers").fetchall()
            conn.execute("UPDATE customers SET tier = 'pro' WHERE id = 2")
        yield proxy, layer_db


def score(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(["score", *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_score_reports_reads_next_to_writes(
    recorded: tuple[RunningProxy, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _, db = recorded
    data = json.loads(score(capsys, "--dsn", db, "--gt", "gt-r", "--agent", "ag-r", "--format", "json"))
    assert data["overall"] == pytest.approx(1.0)  # the writes are the same
    reads = data["reads"]
    assert (reads["trace"], reads["gt_trace"], reads["note"]) == (True, True, None)
    assert (reads["statements"], reads["rows"], reads["repeated"]) == (3, 3 + 3 + 4, 1)
    assert (reads["gt_statements"], reads["gt_rows"]) == (1, 1)
    assert reads["relations"] == ["public.customers", "public.orders"]
    assert reads["gt_relations"] == ["public.customers"]
    assert reads["unneeded_relations"] == ["public.orders"]
    assert reads["read_efficiency"] == pytest.approx(1 / 10)
    assert reads["operations"] == [
        {
            "operation_id": "look",
            "statements": 3,
            "rows": 10,
            "repeated": 1,
            "relations": ["public.customers", "public.orders"],
        }
    ]

    plain = json.loads(score(capsys, "--dsn", db, "--gt", "gt-r", "--agent", "ag-plain", "--format", "json"))
    assert plain["overall"] == pytest.approx(1.0)
    assert (plain["reads"]["trace"], plain["reads"]["read_efficiency"]) == (False, None)
    assert plain["reads"]["note"] == NO_TRACE

    table = score(capsys, "--dsn", db, "--gt", "gt-r", "--agent", "ag-r")
    assert "reads: 3 statements (2 distinct, 1 repeated), 10 rows" in table
    assert "read_efficiency 0.100; not read by the ground truth: public.orders" in table
    assert f"reads: {NO_TRACE}" in score(capsys, "--dsn", db, "--gt", "gt-r", "--agent", "ag-plain")

    rows = {
        r["agent"]: r
        for r in csv.DictReader(io.StringIO(score(capsys, "--dsn", db, "--all", "--format", "csv")))
    }
    assert rows["ag-r"]["read_efficiency"] == "0.1" and rows["ag-r"]["reads_repeated"] == "1"
    assert rows["ag-r"]["reads_unneeded_tables"] == "public.orders"
    assert (rows["ag-plain"]["reads_trace"], rows["ag-plain"]["read_efficiency"]) == ("False", "")
    lines = [json.loads(x) for x in score(capsys, "--dsn", db, "--all", "--format", "jsonl").splitlines()]
    assert {x["agent"]: x["reads_statements"] for x in lines} == {"ag-r": 3, "ag-plain": None}

    report = tmp_path / "r.html"
    score(capsys, "--dsn", db, "--all", "--format", "html", "-o", str(report))
    text = report.read_text()
    assert 'aria-label="reads per operation"' in text and "look: 3 reads, 1 repeated, 10 rows" in text
    assert NO_TRACE in text
