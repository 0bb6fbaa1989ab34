"""Ending the demo's sessions through the layer's SQL functions (``cow.discard_session``,
``cow.commit_session``), on a plain connection outside any session."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import asyncpg


async def _finish(dsn: str, discard: Sequence[str], commit: str | None) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        if commit is not None:
            await conn.execute("SELECT cow.commit_session($1)", commit)
        for session in discard:
            await conn.execute("SELECT cow.discard_session($1)", session)
    finally:
        await conn.close()


def finish(dsn: str, discard: Sequence[str], commit: str | None) -> None:
    asyncio.run(_finish(dsn, discard, commit))
