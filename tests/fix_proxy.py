"""A cowproxy in a background thread (its own event loop) in front of the test PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, replace
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from proxy.admin import AdminApi, MetricsEndpoint
from proxy.config import Address, ProxyConfig
from proxy.server import ProxyServer
from tests.fix_db import TEST_BIND_SECRET, PgServer, install_layer_at

T = TypeVar("T")


@dataclass
class RunningProxy:
    server: ProxyServer
    loop: asyncio.AbstractEventLoop
    host: str
    port: int
    admin_port: int
    metrics_port: int

    def dsn(self, direct_dsn: str, **params: str) -> str:
        """``direct_dsn`` pointed at the proxy (same user and database), with extra query parameters."""
        parts = urlsplit(direct_dsn)
        user = parts.username or "postgres"
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return urlunsplit(parts._replace(netloc=f"{user}@{self.host}:{self.port}", query=query))

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def run(self, fn: Callable[[], T]) -> T:
        async def wrapper() -> T:
            return fn()

        return self.call(wrapper())


@contextlib.contextmanager
def run_proxy(pg: PgServer, **overrides: Any) -> Iterator[RunningProxy]:
    config = ProxyConfig(
        upstream=Address(pg.host, pg.port),
        listen=Address("127.0.0.1", 0),
        drain_timeout=5,
        connect_timeout=5,
        bind_secret=TEST_BIND_SECRET,  # the secret of the layers install_layer_at installs
    )
    config = replace(config, **overrides)
    try:  # the loop `cowproxy serve` runs on
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover
        loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="cowproxy-test", daemon=True)
    thread.start()

    async def start() -> tuple[ProxyServer, AdminApi, MetricsEndpoint]:
        server = ProxyServer(config)
        await server.start()
        admin = AdminApi(server, config.admin_token)
        await admin.http.start(Address("127.0.0.1", 0))
        metrics = MetricsEndpoint(server)
        await metrics.http.start(Address("127.0.0.1", 0))
        return server, admin, metrics

    server, admin, metrics = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    host, port = server.listen_address
    handle = RunningProxy(server, loop, host, port, admin.http.port, metrics.http.port)
    try:
        yield handle
    finally:

        async def stop() -> None:
            await server.drain(2)
            await admin.http.close()
            await metrics.http.close()
            await asyncio.sleep(0.3)  # let TLS transports finish their shutdown before the loop closes

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        try:
            loop.close()
        except OSError:  # uvloop: a TLS transport still closing; let it finish, then close
            loop.run_until_complete(asyncio.sleep(1))
            loop.close()


RELAYS = {"fast-relay": True, "python-relay": False}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Modules with ``BOTH_RELAYS = True`` run their tests on the C relay and on the Python relay."""
    if not getattr(metafunc.module, "BOTH_RELAYS", False):
        return
    if "proxy" in metafunc.fixturenames:
        metafunc.parametrize("proxy", list(RELAYS.values()), ids=list(RELAYS), indirect=True)
    elif "fast_relay" in metafunc.fixturenames:
        metafunc.parametrize("fast_relay", list(RELAYS.values()), ids=list(RELAYS))


@pytest.fixture
def fast_relay() -> bool:
    """Whether ``run_proxy`` should start the C relay (the default; see ``BOTH_RELAYS``)."""
    return True


@pytest.fixture
def proxy(pg_server: PgServer, request: pytest.FixtureRequest) -> Iterator[RunningProxy]:
    with run_proxy(pg_server, fast_relay=getattr(request, "param", True)) as running:
        yield running


@pytest.fixture(scope="module")
def relay_pair(pg_server: PgServer, create_database: Any) -> Iterator[tuple[str, RunningProxy, RunningProxy]]:
    """A database with a table t of 20 rows and the layer, and a proxy on the C relay and one on the Python
    relay (the oracle) in front of it: (dsn, fast, slow)."""
    dsn = create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 20) g")
    install_layer_at(dsn)
    with run_proxy(pg_server, fast_relay=True) as fast, run_proxy(pg_server, fast_relay=False) as slow:
        yield dsn, fast, slow


def backends(pg: PgServer, database: str) -> int:
    """Client backends connected to ``database`` (to check for leaked upstream connections)."""
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend'"
            " AND pid <> pg_backend_pid()",
            (database,),
        ).fetchone()
        assert row is not None
        return int(row[0])


@pytest.fixture
def databases(
    layer_db: str,  # the layer's sample database (fix_layer): customers/orders with the layer on ``public``
    create_database: Callable[..., str],
    request: pytest.FixtureRequest,
) -> tuple[str, str]:
    """(the layer's database, a plain one), both with the requesting module's ``SCHEMA`` (app DDL on the
    layer's side: the event trigger enables the new tables), for side-by-side tests through the proxy."""
    plain = create_database()
    for dsn in (plain, layer_db):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(request.module.SCHEMA)
    return layer_db, plain
