"""Scoring sessions recorded through the CoW layer: extraction, the library API and the CLI."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from scoring import ScoringError
from scoring.api import score_sessions, score_sessions_async
from scoring.extract import fetch_metadata, fetch_writes
from tests.scoring.test_core import check_figure3

pytestmark = pytest.mark.timeout(60)


def test_figure3_from_recorded_sessions(fig3_dsn: str) -> None:
    result = score_sessions(fig3_dsn, "gt-fig3", "agent-fig3")
    check_figure3(result)
    assert result.info["model"] == "scripted"


def test_extraction(fig3_dsn: str) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(fig3_dsn)
        try:
            meta = await fetch_metadata(conn)
            tickets = meta.tables["public.tickets"]
            assert tickets.pk == ("id",)
            assert tickets.column("updated_at").category == "timestamp"  # type: ignore[union-attr]
            comments = meta.tables["public.comments"]
            assert [(fk.columns, fk.ref_table, fk.ref_columns) for fk in comments.fks] == [
                (("ticket_id",), "public.tickets", ("id",))
            ]
            writes = await fetch_writes(conn, "agent-fig3", meta)
            assert [(w.operation_id, w.pk["id"], w.created) for w in writes] == [
                ("op01", "T-106", True),
                ("op02", "C-201", True),
                ("op03", "T-103", False),
                ("op04", "T-107", True),
                ("op05", "C-202", True),
            ]
            result = await score_sessions_async(conn, "gt-fig3", "agent-fig3")
            assert result.struct_score == pytest.approx(0.5)
        finally:
            await conn.close()

    asyncio.run(run())


@pytest.mark.parametrize(
    ("gt", "agent", "message"),
    [
        ("gt-fig3", "nope", "unknown session 'nope'"),
        ("gt-fig3", "gt-fig3", "same session"),
        ("agent-fig3", "gt-fig3", "swapped"),
        ("gt-fig3", "agent-discarded", "was discarded"),
    ],
)
def test_bad_sessions(fig3_dsn: str, gt: str, agent: str, message: str) -> None:
    with pytest.raises(ScoringError, match=message):
        score_sessions(fig3_dsn, gt, agent)


def test_unreachable_dsn() -> None:
    with pytest.raises(ScoringError, match="cannot connect"):
        score_sessions("postgresql://nobody@127.0.0.1:1/none?connect_timeout=2", "a", "b")


def test_perfect_and_wrong_row_agents(fig3_dsn: str) -> None:
    perfect = score_sessions(fig3_dsn, "gt-fig3", "agent-perfect")
    assert (perfect.struct_score, perfect.content_score, perfect.f1, perfect.overall) == (1.0, 1.0, 1.0, 1.0)
    wrong = score_sessions(fig3_dsn, "gt-fig3", "agent-wrong-row")
    assert (wrong.counts.matched, wrong.counts.missing, wrong.counts.extra) == (0, 4, 1)
    extra = [r for r in wrong.rows if r.status == "extra"]
    assert [(r.agent_pk, r.reason) for r in extra] == [
        ({"id": "T-104"}, "the ground truth did not change this existing row")
    ]


def test_generated_keys_pair_by_content_not_value(fig3_dsn: str) -> None:
    r = score_sessions(fig3_dsn, "gt-serial", "agent-serial")
    assert (r.counts.matched, r.counts.missing, r.counts.extra) == (1, 1, 1)
    (matched,) = [x for x in r.rows if x.status == "matched"]
    assert (matched.gt_pk, matched.agent_pk, matched.how) == ({"id": 501}, {"id": 900}, "similarity")
