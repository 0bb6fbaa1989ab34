"""Real clients through the proxy get the same results as direct (plain PostgreSQL, no layer)."""

from __future__ import annotations

import psycopg
import pytest

from tests.proxy.conftest import RunningProxy

pytestmark = pytest.mark.timeout(60)


def test_psycopg_simple_and_extended(proxy: RunningProxy, empty_db: str) -> None:
    with psycopg.connect(proxy.dsn(empty_db), autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t VALUES (%s, %s)", (1, "a"))
        conn.execute("INSERT INTO t VALUES (2, 'b'); INSERT INTO t VALUES (3, 'c')", prepare=False)
        assert conn.execute("SELECT id, v FROM t ORDER BY id").fetchall() == [(1, "a"), (2, "b"), (3, "c")]
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM t", prepare=True)
            cur.execute("SELECT count(*) FROM t", prepare=True)
            assert cur.fetchone() == (3,)
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO t VALUES (1, 'dup')")
        assert conn.execute("SELECT 1").fetchone() == (1,)
