"""Scoring sessions recorded in a database: ``score_sessions`` (sync), ``score_sessions_async`` and
``score_pairs_async`` (many pairs: extraction over a small connection pool, matching in worker processes)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import replace
from functools import partial
from typing import Any

import asyncpg

from .config import ScoringConfig, make_config
from .core import best_alternative, score_writes
from .errors import ScoringError
from .extract import SessionInfo, check_layer, fetch_metadata, fetch_reads, fetch_writes, session_info
from .model import Metadata, Write
from .reads import TraceRead, compare_reads
from .result import ScoringResult

CONNECT_TIMEOUT = 10.0


async def connect(dsn: str) -> asyncpg.Connection:
    try:
        return await asyncpg.connect(dsn, timeout=CONNECT_TIMEOUT)
    except (
        TimeoutError,
        OSError,
        OverflowError,
        asyncpg.PostgresError,
        asyncpg.InterfaceError,
        ValueError,
    ) as exc:
        raise ScoringError(f"cannot connect to the database: {exc or type(exc).__name__}") from None


class _Source:
    """One connection's view of the sessions: metadata once, each session's writes once."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self._metadata: Metadata | None = None
        self._writes: dict[str, tuple[SessionInfo, list[Write]]] = {}
        self._reads: dict[str, tuple[TraceRead, ...]] = {}

    async def metadata(self) -> Metadata:
        if self._metadata is None:
            try:
                await check_layer(self.conn)
                self._metadata = await fetch_metadata(self.conn)
            except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
                raise ScoringError(f"cannot read the CoW layer's tables: {exc}") from None
        return self._metadata

    async def session(self, session: str) -> tuple[SessionInfo, list[Write]]:
        if session not in self._writes:
            meta = await self.metadata()
            try:
                info, writes = await self._read(session, meta)
            except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
                raise ScoringError(f"cannot read session {session!r}: {exc}") from None
            self._writes[session] = (info, writes)
        return self._writes[session]

    async def reads(self, session: str) -> tuple[TraceRead, ...]:
        if session not in self._reads:
            try:
                self._reads[session] = await fetch_reads(self.conn, session)
            except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
                raise ScoringError(f"cannot read the reads of session {session!r}: {exc}") from None
        return self._reads[session]

    async def with_reads(self, result: ScoringResult) -> ScoringResult:
        """``result`` with the agent's reads next to the chosen ground truth's (scoring/reads.py)."""
        report = compare_reads(await self.reads(result.gt), await self.reads(result.agent))
        return replace(result, reads=report)

    async def _read(self, session: str, meta: Metadata) -> tuple[SessionInfo, list[Write]]:
        info = await session_info(self.conn, session)
        if info.status in ("committed", "discarded"):
            # Committing or discarding removes a session's change log: nothing is left to compare.
            raise ScoringError(f"session {session!r} was {info.status}: its writes are no longer recorded")
        return info, await fetch_writes(self.conn, session, meta)


def check_pair(
    gt: str, agent: str, gt_info: SessionInfo | None = None, ag_info: SessionInfo | None = None
) -> None:
    if gt == agent:
        raise ScoringError(f"the ground truth and the agent are the same session ({gt!r}): check the ids")
    if gt_info and ag_info and gt_info.kind == "agent" and ag_info.kind == "ground_truth":
        raise ScoringError(f"--gt {gt!r} is an agent session and --agent {agent!r} a ground truth: swapped?")


GroundTruths = str | Sequence[str]


def ground_truths(gt: GroundTruths) -> tuple[str, ...]:
    """One ground-truth id or several alternatives, as a tuple without repetitions (order kept)."""
    gts = (gt,) if isinstance(gt, str) else tuple(dict.fromkeys(gt))
    if not gts:
        raise ScoringError("no ground-truth session given")
    return gts


async def score_sessions_async(
    connection_or_dsn: asyncpg.Connection | str,
    gt: GroundTruths,
    agent: str,
    *,
    config: ScoringConfig | str | None = None,
    **options: Any,
) -> ScoringResult:
    """Score session ``agent`` against ground-truth session ``gt`` — or against each of several alternative
    ground truths, keeping the best by ``overall`` —; options as for ``score_writes``."""
    cfg = make_config(config, **options)
    gts = ground_truths(gt)
    for g in gts:
        check_pair(g, agent)
    if isinstance(connection_or_dsn, str):
        conn = await connect(connection_or_dsn)
        try:
            return await _score_one(_Source(conn), gts, agent, cfg)
        finally:
            await conn.close()
    return await _score_one(_Source(connection_or_dsn), gts, agent, cfg)


async def _score_one(source: _Source, gts: Sequence[str], agent: str, cfg: ScoringConfig) -> ScoringResult:
    meta = await source.metadata()
    ag_info, ag_writes = await source.session(agent)
    loaded = []
    for gt in gts:
        gt_info, gt_writes = await source.session(gt)
        check_pair(gt, agent, gt_info, ag_info)
        loaded.append((gt, gt_writes))
    result = _score_job(loaded, ag_writes, meta=meta, cfg=cfg, agent=agent, info=ag_info.as_info())
    return await source.with_reads(result)


def score_sessions(dsn: str, gt: GroundTruths, agent: str, **options: Any) -> ScoringResult:
    """Blocking variant of ``score_sessions_async`` (takes a DSN; from async code use the async variant)."""
    if not isinstance(dsn, str):
        raise TypeError("score_sessions takes a DSN; pass an asyncpg connection to score_sessions_async")
    return asyncio.run(score_sessions_async(dsn, gt, agent, **options))


def _score_job(
    gts: Sequence[tuple[str, list[Write]]],
    ag_writes: list[Write],
    *,
    meta: Metadata,
    cfg: ScoringConfig,
    agent: str,
    info: dict[str, Any],
) -> ScoringResult:
    return best_alternative(
        [score_writes(w, ag_writes, meta, config=cfg, gt=gt, agent=agent, info=info) for gt, w in gts]
    )


async def score_pairs_async(
    dsn: str,
    pairs: Sequence[tuple[GroundTruths, str]],
    *,
    config: ScoringConfig | None = None,
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[ScoringResult]:
    """Score many (gt, agent) pairs — ``gt`` one id or several alternatives —: sessions are read once each
    over a few connections, and the matching runs in ``jobs`` worker processes. Results come back in the
    order of ``pairs``."""
    cfg = config or ScoringConfig()
    wanted = [(ground_truths(gt), agent) for gt, agent in pairs]
    for gts, agent in wanted:
        for gt in gts:
            check_pair(gt, agent)
    if not pairs:
        return []
    jobs = max(1, jobs or min(len(pairs), os.cpu_count() or 1))
    conn = await connect(dsn)
    try:
        source = _Source(conn)
        meta = await source.metadata()
        # One connection reads sequentially: reading is cheap next to matching, and it keeps the load
        # on the database small while the workers match.
        loaded = []
        for gts, agent in wanted:
            ag_info, ag_w = await source.session(agent)
            gt_list = []
            for gt in gts:
                gt_info, gt_w = await source.session(gt)
                check_pair(gt, agent, gt_info, ag_info)
                gt_list.append((gt, gt_w))
                await source.reads(gt)
            await source.reads(agent)
            loaded.append((gt_list, agent, ag_w, ag_info.as_info()))
    finally:
        await conn.close()
    loop = asyncio.get_running_loop()
    done = 0
    executor: Executor | None = ProcessPoolExecutor(max_workers=jobs) if jobs > 1 and len(pairs) > 1 else None
    try:
        futures = [
            loop.run_in_executor(
                executor, partial(_score_job, gt_list, ag_w, meta=meta, cfg=cfg, agent=agent, info=info)
            )
            for gt_list, agent, ag_w, info in loaded
        ]
        for fut in asyncio.as_completed(futures):
            await fut
            done += 1
            if progress:
                progress(done, len(futures))
        return [await source.with_reads(f.result()) for f in futures]  # (the reads are loaded: no queries)
    finally:
        if executor is not None:
            executor.shutdown(cancel_futures=True)
