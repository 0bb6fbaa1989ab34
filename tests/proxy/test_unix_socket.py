"""Unix sockets: the proxy listening on one and relaying to PostgreSQL's (libpq's DIR:PORT convention)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from proxy.config import Address, build_config
from proxy.errors import ConfigError, ProxyError
from proxy.server import ProxyServer
from tests.fix_db import PgServer
from tests.fix_proxy import run_proxy

BOTH_RELAYS = True  # untagged traffic: run on the C relay and on the Python relay
pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def pg_socket_dir(pg_server: PgServer) -> str:
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        row = conn.execute("SHOW unix_socket_directories").fetchone()
    assert row is not None
    for entry in str(row[0]).split(","):
        directory = entry.strip()
        if directory.startswith("/") and os.path.exists(f"{directory}/.s.PGSQL.{pg_server.port}"):
            return directory
    pytest.skip(f"the test server's Unix socket ({row[0]!r}) is not reachable from here")


@pytest.fixture
def short_dir() -> Iterator[str]:
    # A socket path must fit in sun_path (108 bytes): pytest's tmp_path can be longer.
    path = tempfile.mkdtemp(prefix="cowproxy-sock-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_unix_listener_and_unix_upstream(
    pg_server: PgServer,
    pg_socket_dir: str,
    short_dir: str,
    empty_db: str,
    fast_relay: bool,
    *,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="cowproxy")
    database = urlsplit(empty_db).path.lstrip("/")
    listen = Address(short_dir, 6543)
    upstream_address = Address(pg_socket_dir, pg_server.port)
    with run_proxy(pg_server, listen=listen, upstream=upstream_address, fast_relay=fast_relay) as proxy:
        assert (proxy.host, proxy.port) == (short_dir, 6543)
        assert Path(short_dir, ".s.PGSQL.6543").is_socket()
        params = {"host": short_dir, "port": 6543, "dbname": database, "user": pg_server.user}
        with psycopg.connect(**params, autocommit=True) as conn:  # type: ignore[arg-type]
            # The upstream is PostgreSQL's Unix socket: the backend sees no client address.
            assert conn.execute("SELECT inet_client_addr() IS NULL").fetchone() == (True,)
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
            conn.execute("INSERT INTO t VALUES (%s, %s)", (1, "é"))
            assert conn.execute("SELECT v FROM t WHERE id = 1").fetchone() == ("é",)
            # A cancel request travels over the Unix socket too.
            timer = threading.Timer(0.5, conn.cancel_safe)
            timer.start()
            with pytest.raises(psycopg.errors.QueryCanceled):
                conn.execute("SELECT pg_sleep(20)")
            timer.join()
            # Logged once PostgreSQL closed the cancel's connection, which may be after the error came.
            deadline = time.monotonic() + 10
            while not (sent := [r for r in caplog.records if r.getMessage() == "cancel_sent"]):
                assert time.monotonic() < deadline, "no cancel_sent logged"
                time.sleep(0.05)
            assert [r.fields["tls"] for r in sent] == [False]  # type: ignore[attr-defined]
            described = proxy.run(lambda: [c.describe() for c in proxy.server.connections.values()])
            assert described and {d["peer"] for d in described} == {"[local]"}
        # A second proxy on the same socket is refused while the first one listens.
        upstream = f"{pg_socket_dir}:{pg_server.port}"
        config = build_config({"upstream": upstream, "listen": f"{short_dir}:6543"})
        with pytest.raises(ProxyError, match="another process listens"):
            proxy.call(ProxyServer(config).start())
        psql = pg_server.tool("psql")
        args = ["-X", "-A", "-t", "-h", short_dir, "-p", "6543", "-U", pg_server.user, "-d", database]
        result = subprocess.run(
            [psql, *args, "-c", "SELECT 6*7"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "42"
    # Drained: the socket file is gone.
    assert not Path(short_dir, ".s.PGSQL.6543").exists()


def test_stale_socket_file_is_replaced(pg_server: PgServer, short_dir: str, empty_db: str) -> None:
    path = f"{short_dir}/.s.PGSQL.6544"
    with socket.socket(socket.AF_UNIX) as leftover:
        leftover.bind(path)  # bound, never listening: what a killed process leaves behind
    database = urlsplit(empty_db).path.lstrip("/")
    with (
        run_proxy(pg_server, listen=Address(short_dir, 6544)),
        psycopg.connect(host=short_dir, port=6544, dbname=database, user=pg_server.user) as conn,
    ):
        assert conn.execute("SELECT 1").fetchone() == (1,)
    Path(path).unlink(missing_ok=True)
    Path(path).write_text("not a socket")
    config = build_config({"upstream": "127.0.0.1:5432", "listen": f"{short_dir}:6544"})

    async def start() -> None:
        await ProxyServer(config).start()

    with pytest.raises(ProxyError, match="not a socket"):
        asyncio.run(start())


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"upstream": "/run/pg:0"}, "needs a port number"),
        ({"upstream": "127.0.0.1:5432", "admin": "/run/admin:9188"}, "admin: expected HOST:PORT"),
        ({"upstream": "127.0.0.1:5432", "metrics": "/run/m:1"}, "metrics: expected HOST:PORT"),
        ({"upstream": "/run/pg:x"}, "expected HOST:PORT or SOCKET_DIRECTORY:PORT"),
        ({"upstream": "/run/pg:5432", "upstream_tls": "require"}, "needs a TCP upstream"),
    ],
)
def test_unix_addresses_in_configuration(flags: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_config(flags)
    config = build_config({"upstream": "/var/run/postgresql:5432", "listen": "/tmp:6432"})
    assert config.upstream.unix_path == "/var/run/postgresql/.s.PGSQL.5432"
    assert config.listen.unix_path == "/tmp/.s.PGSQL.6432"
    assert build_config({"upstream": "127.0.0.1:5432"}).upstream.unix_path is None
