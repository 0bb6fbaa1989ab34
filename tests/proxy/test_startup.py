"""Startup: authentication methods pass through, protocol 3.2 (long cancel keys) and negotiation."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.fix_db import PgServer
from tests.fix_proxy import RunningProxy

pytestmark = pytest.mark.timeout(60)

METHODS = {"cow_scram": "scram-sha-256", "cow_md5": "md5", "cow_password": "password"}


@pytest.fixture
def password_users(pg_server: PgServer) -> Iterator[str]:
    """Roles that must authenticate with a password (hba lines put first, removed afterwards)."""
    if pg_server.bindir is None:
        pytest.skip("needs the embedded server: the test edits pg_hba.conf of the server it started")
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        row = conn.execute("SHOW hba_file").fetchone()
        assert row is not None
        hba = Path(str(row[0]))
        original = hba.read_text()
        for user, method in METHODS.items():
            conn.execute(f"DROP ROLE IF EXISTS {user}")
            conn.execute(
                "SELECT set_config('password_encryption', %s, false)",
                (method if method == "md5" else "scram-sha-256",),
            )
            conn.execute(f"CREATE ROLE {user} LOGIN PASSWORD 'pw-{user}'")
        lines = "".join(f"host all {user} 127.0.0.1/32 {method}\n" for user, method in METHODS.items())
        hba.write_text(lines + original)
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield pg_server.dsn
    finally:
        hba.write_text(original)
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
            for user in METHODS:
                conn.execute(f"DROP ROLE IF EXISTS {user}")


def test_password_authentication_passes_through(proxy: RunningProxy, password_users: str) -> None:
    for user in METHODS:
        dsn = f"postgresql://{user}:pw-{user}@{proxy.host}:{proxy.port}/postgres"
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (user,)
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(f"postgresql://{user}:wrong@{proxy.host}:{proxy.port}/postgres")
    assert proxy.run(lambda: len(proxy.server.cancel_keys)) == 0


def test_protocol_negotiation_and_long_cancel_keys(
    proxy: RunningProxy, pg_server: PgServer, empty_db: str
) -> None:
    # The client asks for 3.2: a server that only speaks 3.0 answers NegotiateProtocolVersion, relayed as is.
    with psycopg.connect(proxy.dsn(empty_db, max_protocol_version="3.2"), autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    if pg_server.version < 18:
        pytest.skip("protocol 3.2 (variable-length cancel keys) needs PostgreSQL 18")
    with psycopg.connect(proxy.dsn(empty_db, min_protocol_version="3.2"), autocommit=True) as conn:
        keys = proxy.run(lambda: [key for _, key in proxy.server.cancel_keys])
        assert keys and all(len(key) > 4 for key in keys)
        timer = threading.Timer(0.5, conn.cancel_safe)
        timer.start()
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(20)")
        timer.join()
        assert conn.execute("SELECT 2").fetchone() == (2,)
