"""Schema per tenant with real django-tenants through the proxy in a session (``django_tenants_app.py``).

Two tenants, each with its own schema and table ``shop_item``; requests switch the tenant. In the session
each tenant reads its own rows plus the session's writes to its own table, the writes land in the session
under that tenant's table, never in another tenant's table, and no base table changes.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import psycopg
import pytest

from migrations import install_layer
from migrations.binding import set_secret
from tests.fix_db import TEST_BIND_SECRET
from tests.fix_proxy import RunningProxy

pytest.importorskip("django_tenants", reason="django-tenants is a test dependency (pyproject: test)")

SCHEMA = """
CREATE SCHEMA tenant_a;
CREATE SCHEMA tenant_b;
CREATE TABLE public.tenants (id serial PRIMARY KEY, schema_name text NOT NULL UNIQUE);
INSERT INTO public.tenants (schema_name) VALUES ('tenant_a'), ('tenant_b');
CREATE TABLE tenant_a.shop_item (id serial PRIMARY KEY, name text NOT NULL, qty int NOT NULL DEFAULT 0);
CREATE TABLE tenant_b.shop_item (id serial PRIMARY KEY, name text NOT NULL, qty int NOT NULL DEFAULT 0);
INSERT INTO tenant_a.shop_item (name, qty) VALUES ('seed a', 10);
INSERT INTO tenant_b.shop_item (name, qty) VALUES ('seed b', 20);
"""
APP = Path(__file__).with_name("django_tenants_app.py")


@pytest.fixture
def tenants_db(create_database: Callable[..., str]) -> str:
    dsn = create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)

    async def install() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await install_layer(conn, ("public", "tenant_a", "tenant_b"))
            await set_secret(conn, TEST_BIND_SECRET)  # the test proxies bind with it
        finally:
            await conn.close()

    asyncio.run(install())
    return dsn


def test_django_tenants_requests_switch_tenants_in_a_session(proxy: RunningProxy, tenants_db: str) -> None:
    database = urlsplit(tenants_db).path.lstrip("/")
    done = subprocess.run(
        [sys.executable, str(APP), proxy.host, str(proxy.port), database, "dt1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    reads = json.loads(done.stdout)
    assert reads["tenant_a"] == [
        [["seed a", 10], ["apple", 6], ["avocado", 1]],
        [["seed a", 10], ["apple", 6], ["avocado", 1]],
    ]
    assert reads["tenant_b"] == [[["seed b", 20], ["banana", 6]], [["banana", 6]]]
    assert reads["public path"] == [[["public"]]]
    with psycopg.connect(tenants_db, autocommit=True) as conn:
        for schema, seed in (("tenant_a", ("seed a", 10)), ("tenant_b", ("seed b", 20))):
            assert conn.execute(f"SELECT name, qty FROM {schema}.shop_item").fetchall() == [seed]
        written = conn.execute(
            "SELECT table_schema, deleted, coalesce(row_data->>'name', '') FROM cow.session_changes('dt1')"
            " ORDER BY seq"
        ).fetchall()
    assert written == [
        ("tenant_a", False, "apple"),
        ("tenant_a", False, "avocado"),
        ("tenant_a", False, "apple"),
        ("tenant_b", False, "banana"),
        ("tenant_b", False, "banana"),
        ("tenant_b", True, ""),
    ]
