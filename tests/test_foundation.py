"""The test fixture and CLI skeleton work on the real server."""

from __future__ import annotations

import subprocess
import sys

import psycopg

from tests.fix_db import PgServer
from tests.fix_layer import layer_db, layer_template

__all__ = ["layer_db", "layer_template"]  # fixtures


def test_fresh_database_is_empty_and_writable(empty_db: str) -> None:
    with psycopg.connect(empty_db, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog','information_schema')"
        ).fetchone()
        assert tables == (0,)
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("INSERT INTO t VALUES (1), (2)")
        assert conn.execute("SELECT sum(id) FROM t").fetchone() == (3,)


def test_server_version_is_supported(pg_server: PgServer) -> None:
    assert pg_server.version >= 15


def test_cli_without_command_is_a_usage_error() -> None:
    result = subprocess.run([sys.executable, "-m", "cowproxy"], capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert "usage: cowproxy" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_output_into_a_closed_pipe_is_not_a_traceback(layer_db: str) -> None:
    # `cowproxy session diff S --format json | head -c 10`: the reader leaves while the command prints.
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session('pipe')")
        conn.execute(
            "INSERT INTO customers (email, name) SELECT 'c' || i || '@x', 'n' FROM generate_series(1, 3000) i"
        )
    reader = subprocess.Popen(["head", "-c", "10"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    assert reader.stdin is not None
    writer = subprocess.run(
        [sys.executable, "-m", "cowproxy", "session", "diff", "pipe", "--format", "json", "--dsn", layer_db],
        stdout=reader.stdin,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
        timeout=60,
    )
    reader.stdin.close()
    reader.wait(timeout=10)
    assert writer.returncode == 141
    assert writer.stderr == ""
