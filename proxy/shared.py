"""State every proxy process and replica must agree on, kept in the database: the admin routes.

With ``state_dsn`` (``cowproxy serve --state-dsn``) a proxy keeps its routes in ``cow.proxy_routes`` of that
database (migration 0040) instead of in memory: a route or unroute is a row written in one transaction with
a notification on ``cow_proxy_routes``, and every proxy listening there (the workers of ``--workers N``,
replicas behind a load balancer) reloads the table and applies the difference, recalling the connections
of the databases whose route changed, as a local route does. A proxy that loses its state connection keeps
the routes it knew, logs it and reconnects (with backoff), reloading the table when it is back.

The rest of what the processes share already lives in PostgreSQL: sessions (``cow.sessions``, registered by
the layer on their first write) and catalog versions (``cow.registry``, read by each connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import asyncpg

from proxy.errors import ProxyError

log = logging.getLogger("cowproxy")

CHANNEL = "cow_proxy_routes"
_LOAD = "SELECT database, session FROM cow.proxy_routes"
_PUT = (
    "INSERT INTO cow.proxy_routes (database, session) VALUES ($1, $2) "
    "ON CONFLICT (database) DO UPDATE SET session = EXCLUDED.session, made_at = now()"
)
_REMOVE = "DELETE FROM cow.proxy_routes WHERE database = $1 RETURNING 1"
_NOTIFY = "SELECT pg_notify($1, $2)"


class SharedRoutes:
    """The routes table of the state database, and the connection that hears its changes."""

    def __init__(self, dsn: str, apply: Callable[[dict[str, str]], None], timeout: float = 10.0) -> None:
        self.dsn = dsn
        self.apply = apply  # called with every route (database -> session) after each (re)load
        self.timeout = timeout
        self._conn: Any = None
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.reloads = 0

    async def start(self) -> None:
        """Connect and load; a state database that cannot be used is an error at startup."""
        try:
            await self._connect()
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
            raise ProxyError(f"state database: {exc}") from None

    async def _connect(self) -> None:
        conn = await asyncpg.connect(self.dsn, timeout=self.timeout)
        try:
            await conn.add_listener(CHANNEL, self._notified)
            conn.add_termination_listener(self._lost)
            self._conn = conn
            await self._reload()
        except BaseException:
            self._conn = None
            await conn.close()
            raise

    async def _reload(self) -> None:
        async with self._lock:
            rows = await self._conn.fetch(_LOAD)
        self.reloads += 1
        self.apply({str(r["database"]): str(r["session"]) for r in rows})

    def _notified(self, _conn: Any, _pid: int, _channel: str, _payload: object) -> None:
        if self._conn is not None and not self._closed:
            asyncio.get_running_loop().create_task(self._reload_logged())

    async def _reload_logged(self) -> None:
        try:
            await self._reload()
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("event=state_reload_failed error=%s", exc)

    def _lost(self, _conn: Any) -> None:
        self._conn = None
        if not self._closed and self._task is None:
            log.warning("event=state_connection_lost (keeping the routes known; reconnecting)")
            self._task = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        delay = 0.5
        while not self._closed:
            await asyncio.sleep(delay)
            try:
                await self._connect()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
                log.warning("event=state_reconnect_failed error=%s", exc)
                delay = min(delay * 2, 10.0)
                continue
            log.info("event=state_connection_back")
            break
        self._task = None

    async def put(self, database: str, session: str) -> None:
        await self._write(_PUT, database, session)

    async def remove(self, database: str) -> bool:
        return await self._write(_REMOVE, database)

    async def _write(self, sql: str, *args: str) -> bool:
        conn = self._conn
        if conn is None:
            raise ProxyError("state database unavailable: the route was not changed (try again)")
        try:
            async with self._lock, conn.transaction():
                found = await conn.fetchval(sql, *args)
                await conn.execute(_NOTIFY, CHANNEL, args[0])
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise ProxyError(f"state database: {exc}") from None
        await self._reload()  # (the notification reaches this connection too; not waited for)
        return found is not None

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with contextlib.suppress(Exception):
                await conn.close()
