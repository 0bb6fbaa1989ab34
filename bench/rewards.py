"""Reward latency for training loops: one agent session scored against a cached ground truth.

A small issue tracker (issues, comments with a foreign key to an issue); the ground truth updates
``--rows``/2 existing issues and inserts as many comments on them; each of ``--batch`` agent sessions makes
the same writes with 10 % other values, 5 % missing and 5 % extra (independently generated comment keys).
Reported: the median and 90th percentile of one reward (``RewardScorer.reward``: reading the agent session —
``cow.session_changes`` and one key lookup per table — plus the in-memory comparison), with and without the
dense per-operation rewards, the comparison alone (``reward_from_truths`` against the prepared ground
truth), and a batch of ``--batch`` sessions (``RewardScorer.rewards``: the sessions read in one query, the
ground truth prepared once), from the async and the sync scorer.

    .venv/bin/python bench/rewards.py [--rows 100] [--batch 64] [--repeat 5] [--dsn DSN]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import asyncpg
from _common import fetchval, log, run_main, scratch_database, server

import migrations
from scoring.rewards import RewardScorer, SyncRewardScorer, reward_from_truths

SCHEMA = """
CREATE TABLE issues (id bigint PRIMARY KEY, title text NOT NULL, state text NOT NULL, priority text NOT NULL);
CREATE TABLE comments (
    id bigserial PRIMARY KEY, issue_id bigint NOT NULL REFERENCES issues (id), body text NOT NULL
);
INSERT INTO issues SELECT g, 'issue ' || g, 'Backlog', 'low' FROM generate_series(1, 1000) g;
"""
STATES = ("Todo", "In Progress", "Done")


async def record(conn: asyncpg.Connection, session: str, n_issues: int, rng: random.Random | None) -> None:
    """One session's writes: an operation per issue (its update and a comment on it)."""
    for i in range(1, n_issues + 1):
        if rng is not None and rng.random() < 0.05:
            continue  # missing
        state = STATES[i % 3]
        if rng is not None and rng.random() < 0.10:
            state = STATES[(i + 1) % 3]  # another value
        await conn.execute("SELECT cow.use_session($1, $2)", session, f"op{i}")
        await conn.execute("UPDATE issues SET state = $1, priority = 'high' WHERE id = $2", state, i)
        body = f"issue {i} moved to {state}"
        await conn.execute("INSERT INTO comments (issue_id, body) VALUES ($1, $2)", i, body)
        if rng is not None and rng.random() < 0.05:  # extra
            await conn.execute("UPDATE issues SET priority = 'urgent' WHERE id = $1", 500 + i)
    await conn.execute("SELECT cow.use_session(NULL)")


def _ms(values: list[tuple[float, float]]) -> str:
    """Median and 90th percentile of the wall time, median of this process's CPU time (ms)."""
    walls = sorted(w for w, _ in values)
    p90 = walls[min(len(walls) - 1, int(0.9 * len(walls)))]
    cpu = statistics.median(c for _, c in values)
    return f"{statistics.median(walls) * 1000:8.2f} {p90 * 1000:8.2f} {cpu * 1000:8.2f}"


class _Clock:
    """Wall and CPU time of a block, appended to ``into``."""

    def __init__(self, into: list[tuple[float, float]]) -> None:
        self.into = into

    def __enter__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def __exit__(self, *exc: object) -> None:
        self.into.append((time.perf_counter() - self.wall, time.process_time() - self.cpu))


async def main(args: argparse.Namespace) -> None:
    with server(args.dsn, "128MB") as admin_dsn:
        async with scratch_database(admin_dsn, f"bench_rewards_{os.getpid()}") as dsn:
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute(SCHEMA)
                await migrations.install_layer(conn, schemas=("public",))
                n_issues = args.rows // 2
                await conn.execute("SELECT cow.create_session('gt', 'ground_truth')")
                await record(conn, "gt", n_issues, None)
                agents = [f"agent-{k}" for k in range(args.batch)]
                for k, agent in enumerate(agents):
                    await conn.execute("SELECT cow.create_session($1, 'agent', gt_session => 'gt')", agent)
                    await record(conn, agent, n_issues, random.Random(k))
                log(f"recorded the ground truth ({args.rows} rows) and {len(agents)} agent sessions")
            finally:
                await conn.close()
            version = await fetchval(dsn, "SHOW server_version")
            print(f"PostgreSQL {version}; ground truth {args.rows} written rows ({n_issues} operations);")
            print(f"{args.batch} agent sessions; median of {args.repeat} passes per figure; load {_load()}")
            print(f"{'what':<46} {'median':>8} {'p90':>8} {'cpu':>8}  (ms; cpu: this process's, median)")
            async with await RewardScorer.open(dsn) as scorer:
                await scorer.rewards(agents[:4], dense=True)  # warm-up: metadata, gt cache, imports
                for dense in (False, True):
                    single: list[tuple[float, float]] = []
                    for _ in range(args.repeat):
                        for agent in agents:
                            with _Clock(single):
                                await scorer.reward(agent, dense=dense)
                    label = "one reward (read + score)" + (", dense" if dense else "")
                    print(f"{label:<46} {_ms(single)}")
                truths = [await scorer.prepared("gt")]
                agent_writes = [writes for _, writes in await scorer._writes_many(agents)]
                alone: list[tuple[float, float]] = []
                for _ in range(args.repeat):
                    for writes in agent_writes:
                        with _Clock(alone):
                            reward_from_truths(truths, writes, dense=True)
                print(f"{'the comparison alone (in memory, dense)':<46} {_ms(alone)}")
                batches: list[tuple[float, float]] = []
                for _ in range(args.repeat):
                    with _Clock(batches):
                        await scorer.rewards(agents, dense=True)
                print(f"{f'batch of {args.batch} (async, dense)':<46} {_ms(batches)}")
            sync = SyncRewardScorer(dsn)
            try:
                sync.rewards(agents[:4])
                sync_batches: list[tuple[float, float]] = []
                for _ in range(args.repeat):
                    with _Clock(sync_batches):
                        sync.rewards(agents, dense=True)
                print(f"{f'batch of {args.batch} (sync, dense)':<46} {_ms(sync_batches)}")
            finally:
                sync.close()


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=100, help="rows the ground truth writes (default 100)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dsn", default=None, help="server to use (default: an embedded PostgreSQL)")
    raise SystemExit(run_main("bench/rewards.py", main(parser.parse_args())))
