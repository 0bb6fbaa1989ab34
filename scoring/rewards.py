"""Rewards for training loops: score agent sessions against cached ground truths, fast.

A ``RewardScorer`` (async) or ``SyncRewardScorer`` (blocking, for training loops without an event loop)
keeps one connection, the layer's metadata and each ground truth's writes after their first use, so that a
reward costs one read of the agent session (``cow.session_changes`` plus one key lookup per table) and an
in-memory comparison without row explanations. ``Reward.overall`` is the paper's Eq. 5;
``Reward.dense`` gives one value per agent operation, in scoring order, that sums to ``overall``:

    r_i = 0.5 · u_struct(o_i) + 0.5 · u_content(o_i) · matched_rows(o_i) / M

(M = matched rows; the content term is o_i's share of the content score). ``rollout`` wraps one episode:
a fresh session, its tag for the agent's connections, the reward at the end, then discard.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
import threading
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg

from .api import GroundTruths, connect, ground_truths
from .config import ScoringConfig, make_config
from .core import PreparedTruth, best_alternative, prepare_truth, score_prepared
from .errors import ScoringError
from .extract import SessionInfo, check_layer, fetch_metadata, fetch_writes_many, session_infos
from .model import Metadata, Write
from .result import ScoringResult

T = TypeVar("T")
_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_DB_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError)


@dataclass(frozen=True)
class Reward:
    """The reward of one agent session."""

    session: str
    ground_truth: str  # the ground truth chosen (the best alternative)
    overall: float
    dense: tuple[float, ...]  # one value per agent operation, scoring order; () unless asked for
    operations: tuple[str, ...]  # the operation ids of ``dense``
    result: ScoringResult

    def __float__(self) -> float:
        return self.overall


def dense_rewards(result: ScoringResult) -> tuple[float, ...]:
    """Per-operation rewards summing to ``overall`` (module docstring)."""
    matched = result.counts.matched
    return tuple(
        0.5 * o.struct_utility + (0.5 * o.content_utility * o.matched_rows / matched if matched else 0.0)
        for o in result.operations
    )


def reward_from_writes(
    gt_writes: Mapping[str, Sequence[Write]],
    agent_writes: Sequence[Write],
    metadata: Metadata | None = None,
    *,
    session: str = "agent",
    dense: bool = False,
    config: ScoringConfig | None = None,
) -> Reward:
    """The reward of in-memory writes against one or several ground truths (id -> writes)."""
    cfg = config or ScoringConfig()
    truths = [prepare_truth(w, metadata, config=cfg, gt=gt) for gt, w in gt_writes.items()]
    return reward_from_truths(truths, agent_writes, session=session, dense=dense)


def reward_from_truths(
    truths: Sequence[PreparedTruth],
    agent_writes: Sequence[Write],
    *,
    session: str = "agent",
    dense: bool = False,
) -> Reward:
    """``reward_from_writes`` against ground truths prepared once (``scoring.core.prepare_truth``), as a
    training loop scores many sessions against the same ones."""
    results = [
        score_prepared(t, agent_writes, agent=session, explain=False, per_operation=dense) for t in truths
    ]
    best = best_alternative(results)
    return Reward(
        session=session,
        ground_truth=best.gt,
        overall=best.overall,
        dense=dense_rewards(best) if dense else (),
        operations=tuple(o.operation_id for o in best.operations) if dense else (),
        result=best,
    )


class RewardScorer:
    """Async rewards over one connection; ground truths and metadata are read once and cached.

    ``await RewardScorer.open(dsn_or_conn)``, then ``await scorer.reward(session)`` (the ground truth named
    by the session's ``gt_session``, or ``gt=`` one id or alternatives), ``await scorer.rewards(sessions)``
    for a batch; ``await scorer.close()`` (or ``async with``).
    """

    def __init__(self, conn: asyncpg.Connection, *, owned: bool, config: ScoringConfig) -> None:
        self.conn = conn
        self._owned = owned
        self.config = config
        self._metadata: Metadata | None = None
        self._gt: dict[str, list[Write]] = {}
        self._prepared: dict[str, PreparedTruth] = {}  # reduced once, against the cached metadata
        self._lock = asyncio.Lock()  # one connection: one query at a time

    @classmethod
    async def open(
        cls,
        connection_or_dsn: asyncpg.Connection | str,
        *,
        config: ScoringConfig | str | None = None,
        **options: Any,
    ) -> RewardScorer:
        cfg = make_config(config, **options)
        if isinstance(connection_or_dsn, str):
            return cls(await connect(connection_or_dsn), owned=True, config=cfg)
        return cls(connection_or_dsn, owned=False, config=cfg)

    async def __aenter__(self) -> RewardScorer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owned and not self.conn.is_closed():
            await self.conn.close()

    async def metadata(self) -> Metadata:
        if self._metadata is None:
            try:
                await check_layer(self.conn)
                self._metadata = await fetch_metadata(self.conn)
            except _DB_ERRORS as exc:
                raise ScoringError(f"cannot read the CoW layer's tables: {exc}") from None
        return self._metadata

    async def _writes(self, session: str) -> tuple[SessionInfo, list[Write]]:
        return (await self._writes_many([session]))[0]

    async def _writes_many(self, sessions: Sequence[str]) -> list[tuple[SessionInfo, list[Write]]]:
        """Registry entries and writes of ``sessions`` in a few queries (not a few per session)."""
        meta = await self.metadata()
        try:
            infos = await session_infos(self.conn, sessions)
            for info in infos:
                if info.status in ("committed", "discarded"):
                    raise ScoringError(
                        f"session {info.session_id!r} was {info.status}: its writes are no longer recorded"
                    )
            return list(zip(infos, await fetch_writes_many(self.conn, sessions, meta), strict=True))
        except _DB_ERRORS as exc:
            names = ", ".join(repr(s) for s in sessions[:3]) + (", ..." if len(sessions) > 3 else "")
            raise ScoringError(f"cannot read session {names}: {exc}") from None

    async def ground_truth(self, gt: str) -> list[Write]:
        """The writes of ground truth ``gt``, read on first use and kept."""
        if gt not in self._gt:
            async with self._lock:
                if gt not in self._gt:
                    self._gt[gt] = (await self._writes(gt))[1]
        return self._gt[gt]

    async def prepared(self, gt: str) -> PreparedTruth:
        """Ground truth ``gt`` reduced for scoring, prepared on first use and kept."""
        if gt not in self._prepared:
            writes, meta = await self.ground_truth(gt), await self.metadata()
            self._prepared[gt] = prepare_truth(writes, meta, config=self.config, gt=gt)
        return self._prepared[gt]

    def forget(self, gt: str | None = None) -> None:
        """Drop a cached ground truth (all when ``gt`` is None), e.g. after re-recording it."""
        if gt is None:
            self._gt.clear()
            self._prepared.clear()
        else:
            self._gt.pop(gt, None)
            self._prepared.pop(gt, None)

    async def reward(self, session: str, *, gt: GroundTruths | None = None, dense: bool = False) -> Reward:
        """The reward of agent ``session`` (against ``gt``, default its registered ``gt_session``)."""
        return (await self.rewards([session], gt=gt, dense=dense))[0]

    async def rewards(
        self, sessions: Sequence[str], *, gt: GroundTruths | None = None, dense: bool = False
    ) -> list[Reward]:
        """Rewards of a batch of agent sessions, in order: the sessions read together (one query for their
        writes), each ground truth prepared once, each session then scored in memory."""
        async with self._lock:
            read = await self._writes_many(sessions)
        out = []
        for session, (info, agent_writes) in zip(sessions, read, strict=True):
            gts = ground_truths(self._ground_truth_of(session, info, gt))
            if session in gts:
                raise ScoringError(f"the ground truth and the agent are the same session ({session!r})")
            truths = [await self.prepared(g) for g in gts]
            out.append(reward_from_truths(truths, agent_writes, session=session, dense=dense))
        return out

    @staticmethod
    def _ground_truth_of(session: str, info: SessionInfo, gt: GroundTruths | None) -> GroundTruths:
        if gt is not None:
            return gt
        if not info.gt_session:
            raise ScoringError(f"session {session!r} names no ground truth: pass gt=")
        return info.gt_session


class SyncRewardScorer:
    """The blocking face of ``RewardScorer``: its own event loop in a daemon thread, so it can be called
    from plain training code and from threads (even one whose own event loop is running)."""

    def __init__(self, dsn: str, *, config: ScoringConfig | str | None = None, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cowproxy-rewards", daemon=True)
        self._thread.start()
        try:
            self._scorer = self._call(RewardScorer.open(dsn, config=config, **options))
        except BaseException:
            self._stop()
            raise

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def reward(self, session: str, *, gt: GroundTruths | None = None, dense: bool = False) -> Reward:
        return self._call(self._scorer.reward(session, gt=gt, dense=dense))

    def rewards(
        self, sessions: Sequence[str], *, gt: GroundTruths | None = None, dense: bool = False
    ) -> list[Reward]:
        return self._call(self._scorer.rewards(sessions, gt=gt, dense=dense))

    def ground_truth(self, gt: str) -> list[Write]:
        return self._call(self._scorer.ground_truth(gt))

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._call(self._scorer.close())
        finally:
            self._stop()

    def __enter__(self) -> SyncRewardScorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- one episode ---------------------------------------------------------------------------------------


@dataclass
class Rollout:
    """One episode's session. Hand ``options`` (a libpq startup option) or ``dsn`` to the agent's
    connections through the proxy; with ``route`` given to ``rollout``, the proxy tags every untagged
    connection to the database instead."""

    session: str
    gt: tuple[str, ...]
    scorer: RewardScorer
    dense: bool
    reward_value: Reward | None = None
    proxy_dsn: str | None = None

    @property
    def options(self) -> str:
        """``-c cow.session_id=S``: the startup tag (libpq ``options``; asyncpg ``server_settings``)."""
        return f"-c cow.session_id={self.session}"

    @property
    def server_settings(self) -> dict[str, str]:
        """The same tag for asyncpg's ``connect(server_settings=...)`` (sent as the ``options`` startup
        parameter, which the proxy reads)."""
        return {"options": self.options}

    @property
    def dsn(self) -> str | None:
        """The proxy DSN given to ``rollout`` with the tag in its ``options`` parameter."""
        if self.proxy_dsn is None:
            return None
        sep = "&" if "?" in self.proxy_dsn else "?"
        return f"{self.proxy_dsn}{sep}options={urllib.parse.quote(self.options)}"

    async def score(self) -> Reward:
        """Score the session now (also done on leaving the ``async with`` block if not done yet)."""
        self.reward_value = await self.scorer.reward(self.session, gt=self.gt, dense=self.dense)
        return self.reward_value

    @property
    def reward(self) -> Reward:
        if self.reward_value is None:
            raise ScoringError(f"rollout {self.session!r} has not been scored yet")
        return self.reward_value


def _admin(route: tuple[str, int], method: str, path: str, body: dict[str, str] | None = None) -> None:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        f"http://{route[0]}:{route[1]}{path}",
        data=data,
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10):
            pass
    except OSError as exc:  # urllib's errors are OSErrors
        raise ScoringError(f"proxy admin API {method} {path} failed: {exc}") from None


async def _blocking(fn: Any, *args: Any) -> None:
    await asyncio.get_running_loop().run_in_executor(None, fn, *args)


@contextlib.asynccontextmanager
async def rollout(
    scorer: RewardScorer,
    gt: GroundTruths,
    *,
    session: str | None = None,
    label: str | None = None,
    prompt: str | None = None,
    model: str | None = None,
    keep: bool = False,
    dense: bool = True,
    proxy_dsn: str | None = None,
    route: tuple[str, int] | None = None,
    database: str | None = None,
) -> AsyncIterator[Rollout]:
    """One episode: register an agent session answering ``gt``, yield it, score it when the block ends
    normally (``Rollout.reward``), then discard it (``keep=True`` leaves it open for inspection).

    ``route=(host, port)`` of the proxy's admin API and ``database`` route the database's untagged
    connections to the session for the episode (one episode per database at a time). The session is
    discarded and the route removed whatever ends the block: an error, or a cancellation (the cleanup is
    shielded and finishes before the cancellation goes on).
    """
    gts = ground_truths(gt)
    sid = session or f"rollout-{secrets.token_hex(8)}"
    if not _ID.match(sid):
        raise ScoringError(f"invalid session id {sid!r}: 1-128 characters of [A-Za-z0-9._:-]")
    if route is not None and not database:
        raise ScoringError("route= needs database=")
    for g in gts:  # fail before creating anything when a ground truth is unknown
        await scorer.ground_truth(g)
    async with scorer._lock:
        try:
            await scorer.conn.execute(
                "SELECT cow.create_session($1, 'agent', $2, $3, $4, $5)", sid, label, prompt, model, gts[0]
            )
        except _DB_ERRORS as exc:
            raise ScoringError(f"cannot create session {sid!r}: {exc}") from None
    episode = Rollout(sid, gts, scorer, dense, proxy_dsn=proxy_dsn)
    routed = False
    try:
        if route is not None:
            await _blocking(_admin, route, "POST", "/routes", {"database": database, "session": sid})
            routed = True
        yield episode
        if routed:  # no more tagging before scoring: the episode's writes are final
            await _blocking(_admin, route, "DELETE", "/routes/" + urllib.parse.quote(str(database), safe=""))
            routed = False
        if episode.reward_value is None:
            await episode.score()
    finally:
        cleanup = asyncio.ensure_future(_finish(scorer, sid, keep, route if routed else None, database))
        try:
            await asyncio.shield(cleanup)
        except asyncio.CancelledError:
            await cleanup
            raise


async def _finish(
    scorer: RewardScorer, session: str, keep: bool, route: tuple[str, int] | None, database: str | None
) -> None:
    if route is not None:
        with contextlib.suppress(ScoringError):
            await _blocking(_admin, route, "DELETE", "/routes/" + urllib.parse.quote(str(database), safe=""))
    if not keep:
        async with scorer._lock:
            with contextlib.suppress(*_DB_ERRORS):
                await scorer.conn.execute("SELECT cow.discard_session($1)", session)
