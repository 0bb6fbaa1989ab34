"""Rewards for training loops: cached ground truths, dense per-operation rewards, the rollout helper."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import psycopg
import pytest
from hypothesis import given

from scoring import ColumnMeta, ForeignKey, Metadata, ScoringError, TableMeta, Write, score_writes
from scoring.core import prepare_truth, score_prepared
from scoring.rewards import RewardScorer, SyncRewardScorer, dense_rewards, reward_from_writes, rollout
from tests.fix_db import PgServer
from tests.fix_proxy import RunningProxy, run_proxy
from tests.fix_scoring import record
from tests.scoring import figure3 as f3
from tests.scoring.test_properties import META, SETTINGS, session_level, sessions

pytestmark = pytest.mark.timeout(120)

# Figure 3's dense rewards: 0.5·u_struct + 0.5·u_content·matched_rows/M (M = 3 matched rows).
FIG3_DENSE = [0.5 * 0.25 + 0.5 / 3, 0.5 * 0.25 + 0.5 / 3, 0.5 * 0.25 + 0.5 / 3, -0.075, -0.05]


def test_dense_rewards_sum_to_overall_in_memory() -> None:
    gt = {"gt": f3.writes(f3.GT_ROWS)}
    r = reward_from_writes(gt, f3.writes(f3.AGENT_ROWS), f3.METADATA, dense=True)
    assert r.overall == pytest.approx(0.75) and float(r) == r.overall
    assert list(r.dense) == pytest.approx(FIG3_DENSE)
    assert sum(r.dense) == pytest.approx(r.overall)
    assert r.operations == ("op01", "op02", "op03", "op04", "op05")
    assert dense_rewards(r.result) == r.dense
    assert reward_from_writes(gt, f3.writes(f3.AGENT_ROWS), f3.METADATA).dense == ()


@SETTINGS
@given(sessions(), sessions(first_id=500))
def test_pruned_matching_scores_like_the_exhaustive_one(gt: list[Write], agent: list[Write]) -> None:
    """Rewards skip comparing rows whose similarity bound is below min_similarity: the same scores."""
    full = score_writes(gt, agent, META)
    pruned = score_writes(gt, agent, META, explain=False)
    assert session_level(pruned) == session_level(full)
    assert pruned.operations == full.operations


@SETTINGS
@given(sessions(), sessions(first_id=500), sessions(first_id=900))
def test_a_prepared_ground_truth_scores_like_score_writes(
    gt: list[Write], agent: list[Write], other: list[Write]
) -> None:
    """One ground truth prepared once and scored against several agents: each result equals scoring the
    agent from the writes alone (rows, explanations and per-operation utilities included)."""
    truth = prepare_truth(gt, META, gt="g")
    for name, writes in (("a", agent), ("b", other), ("a-again", agent)):
        assert score_prepared(truth, writes, agent=name) == score_writes(gt, writes, META, gt="g", agent=name)
    # Tables the metadata does not describe are described from both sessions' writes, as before.
    bare = prepare_truth(gt, None)
    assert score_prepared(bare, agent) == score_writes(gt, agent)


@pytest.mark.parametrize("min_similarity", [0.0, 0.3, 0.5, 0.9])
def test_pruned_matching_on_templated_texts(min_similarity: float) -> None:
    """Rows differing in a foreign key and in one character of a text are the pruning's edge."""
    meta = Metadata(
        {
            "app.items": TableMeta("app.items", (ColumnMeta("id", "bigint", "numeric"),), ("id",)),
            "app.notes": TableMeta(
                "app.notes",
                (
                    ColumnMeta("id", "bigint", "numeric", generated=True),
                    ColumnMeta("item_id", "bigint", "numeric"),
                    ColumnMeta("body", "text", "text"),
                ),
                ("id",),
                (ForeignKey(("item_id",), "app.items", ("id",)),),
            ),
        }
    )

    def notes(base: int, texts: list[str]) -> list[Write]:
        return [
            Write("app.notes", {"id": base + i}, {"id": base + i, "item_id": i % 4, "body": t}, f"o{i}", i,
                  created=True)
            for i, t in enumerate(texts)
        ]  # fmt: skip

    texts = [f"item {i % 4} moved to {s}" for i, s in enumerate(["Todo", "Done", "Todx", "", "Todo", "Done"])]
    other = [t.replace("o", "0", 1) if i % 2 else t for i, t in enumerate(texts)]
    full = score_writes(notes(0, texts), notes(100, other[::-1]), meta, min_similarity=min_similarity)
    pruned = score_writes(
        notes(0, texts), notes(100, other[::-1]), meta, min_similarity=min_similarity, explain=False
    )
    assert session_level(pruned) == session_level(full)


def test_async_scorer_caches_the_ground_truth(fig3_dsn: str) -> None:
    async def run() -> None:
        async with await RewardScorer.open(fig3_dsn) as scorer:
            r = await scorer.reward("agent-fig3", dense=True)  # its gt_session: gt-fig3
            assert (r.ground_truth, r.overall) == ("gt-fig3", pytest.approx(0.75))
            assert list(r.dense) == pytest.approx(FIG3_DENSE)
            batch = await scorer.rewards(["agent-fig3", "agent-perfect", "agent-wrong-row"])
            assert [x.overall for x in batch] == pytest.approx([0.75, 1.0, 0.0])
            # A write added to a ground truth after its first use is not seen until the cache is dropped.
            with psycopg.connect(fig3_dsn, autocommit=True) as conn:
                conn.execute("SELECT cow.create_session('gt-cache', kind => 'ground_truth')")
                record(conn, "gt-cache", f3.GT_ROWS)
            assert (await scorer.reward("agent-perfect", gt="gt-cache")).overall == 1.0
            with psycopg.connect(fig3_dsn, autocommit=True) as conn:
                record(conn, "gt-cache", [("gt-op5", f3.TICKETS, f3.T107, True)])
            assert (await scorer.reward("agent-perfect", gt="gt-cache")).overall == 1.0
            scorer.forget("gt-cache")
            assert (await scorer.reward("agent-perfect", gt="gt-cache")).overall == pytest.approx(0.9)
            with pytest.raises(ScoringError, match="names no ground truth"):
                await scorer.reward("gt-serial")
            with pytest.raises(ScoringError, match="unknown session"):
                await scorer.reward("nope", gt="gt-fig3")
            alt = await scorer.reward("agent-fig3", gt=["agent-wrong-row", "gt-fig3"])
            assert alt.ground_truth == "gt-fig3"

    asyncio.run(run())


def test_a_batch_scores_like_one_by_one(fig3_dsn: str) -> None:
    """Rewards read together and scored against one prepared ground truth equal rewards read and scored
    one session at a time by fresh scorers (no cache), alternatives included."""
    agents = ["agent-fig3", "agent-perfect", "agent-wrong-row", "agent-fig3"]

    async def run() -> None:
        async with await RewardScorer.open(fig3_dsn) as scorer:
            for gt in (None, ["agent-wrong-row", "gt-fig3"]):
                batch = await scorer.rewards(agents[:2] if gt else agents, gt=gt, dense=True)
                for r in batch:
                    async with await RewardScorer.open(fig3_dsn) as fresh:
                        assert r == await fresh.reward(r.session, gt=gt, dense=True)
            with pytest.raises(ScoringError, match="unknown session 'nope'"):
                await scorer.rewards(["agent-fig3", "nope"])

    asyncio.run(run())


def test_sync_scorer(fig3_dsn: str) -> None:
    with SyncRewardScorer(fig3_dsn) as scorer:
        assert scorer.reward("agent-fig3").overall == pytest.approx(0.75)
        assert [r.overall for r in scorer.rewards(["agent-perfect"] * 3, gt="gt-fig3")] == [1.0] * 3

        async def inside_a_running_loop() -> float:  # e.g. a sync reward function called from async code
            return scorer.reward("agent-perfect").overall

        assert asyncio.run(inside_a_running_loop()) == 1.0
    with pytest.raises(ScoringError, match="cannot connect"):
        SyncRewardScorer("postgresql://nobody@127.0.0.1:1/none?connect_timeout=2")


def _agent_writes(conn: psycopg.Connection[Any], rows: list[tuple[str, str, dict[str, Any], bool]]) -> None:
    """The agent's statements on a tagged connection (autocommit: one operation per statement)."""
    for _, table, row, created in rows:
        name = table.rsplit(".", 1)[-1]
        cols = [c for c in row if c != "updated_at"]
        if created:
            conn.execute(
                f"INSERT INTO {name} ({', '.join(cols)}) VALUES ({', '.join(['%s'] * len(cols))})",
                [row[c] for c in cols],
            )
        else:
            sets = [c for c in cols if c != "id"]
            conn.execute(
                f"UPDATE {name} SET {', '.join(f'{c} = %s' for c in sets)} WHERE id = %s",
                [*(row[c] for c in sets), row["id"]],
            )


def _status(dsn: str, session: str) -> str | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT status FROM cow.sessions WHERE session_id = %s", (session,)).fetchone()
    return None if row is None else str(row[0])


@pytest.fixture
def running_proxy(pg_server: PgServer) -> Any:
    with run_proxy(pg_server) as running:
        yield running


def test_rollout_through_the_proxy(fig3_dsn: str, running_proxy: RunningProxy) -> None:
    proxy_dsn = running_proxy.dsn(fig3_dsn)

    async def run() -> None:
        async with await RewardScorer.open(fig3_dsn) as scorer:
            async with rollout(scorer, "gt-fig3", proxy_dsn=proxy_dsn, label="figure 3") as ep:
                assert ep.dsn is not None and "cow.session_id" in ep.dsn
                conn = await asyncio.to_thread(psycopg.connect, ep.dsn, autocommit=True)
                with conn:
                    await asyncio.to_thread(_agent_writes, conn, f3.AGENT_ROWS)
            assert ep.reward.overall == pytest.approx(0.75)
            assert list(ep.reward.dense) == pytest.approx(FIG3_DENSE)
            assert _status(fig3_dsn, ep.session) == "discarded"

            # Kept on request, scored explicitly inside the block; asyncpg takes server_settings.
            async with rollout(scorer, "gt-fig3", keep=True, session="kept-1") as ep:
                conn2 = await asyncpg.connect(proxy_dsn, server_settings=ep.server_settings)
                try:
                    await conn2.execute("UPDATE tickets SET status = 'resolved' WHERE id = 'T-103'")
                finally:
                    await conn2.close()
                early = await ep.score()
            assert ep.reward is early and early.overall == pytest.approx(0.5 * 0.25 + 0.5)
            assert _status(fig3_dsn, "kept-1") == "open"

            with pytest.raises(ScoringError, match="unknown session 'nope'"):
                async with rollout(scorer, "nope"):
                    pass  # pragma: no cover

    asyncio.run(run())


def test_rollout_routed_and_cancelled(fig3_dsn: str, running_proxy: RunningProxy) -> None:
    proxy_dsn = running_proxy.dsn(fig3_dsn)
    database = urlsplit(fig3_dsn).path.lstrip("/")
    admin = ("127.0.0.1", running_proxy.admin_port)

    def routes() -> dict[str, str]:
        with urllib.request.urlopen(running_proxy.admin_url + "/routes", timeout=10) as response:
            return dict(json.loads(response.read())["routes"])

    async def run() -> None:
        async with await RewardScorer.open(fig3_dsn) as scorer:
            async with rollout(scorer, "gt-fig3", route=admin, database=database, session="routed-1"):
                assert routes() == {database: "routed-1"}
                conn = await asyncio.to_thread(psycopg.connect, proxy_dsn, autocommit=True)
                with conn:  # an untagged connection: the route tags it
                    await asyncio.to_thread(_agent_writes, conn, f3.GT_ROWS)
            assert routes() == {}
            assert _status(fig3_dsn, "routed-1") == "discarded"

            entered = asyncio.Event()

            async def episode() -> None:
                async with rollout(scorer, "gt-fig3", route=admin, database=database, session="cut-1"):
                    entered.set()
                    await asyncio.sleep(3600)

            task = asyncio.create_task(episode())
            await entered.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert routes() == {}
            assert _status(fig3_dsn, "cut-1") == "discarded"

    asyncio.run(run())
