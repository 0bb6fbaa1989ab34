"""An application's temporary tables on an installed database: the layer's DDL event triggers leave the
overlay alone (no refresh, no view dropped and rebuilt, no GRANT on the overlay schema), so concurrent
connections making temporary tables do not contend on the layer; app DDL on real tables still brings the
overlay in step, also when a temporary table shares a permanent table's name."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

pytestmark = pytest.mark.timeout(120)

OVERLAY_STATE = """
SELECT (SELECT xmin::text FROM pg_namespace WHERE nspname = 'cow_overlay_public'),
       (SELECT array_agg(c.oid ORDER BY c.oid) FROM pg_class c
        WHERE c.relnamespace = 'cow_overlay_public'::regnamespace AND c.relkind = 'v'),
       (SELECT array_agg(xmin::text ORDER BY id) FROM cow.registry)
"""

TEMP_DDL = (
    "CREATE TEMP TABLE tmp (id serial PRIMARY KEY, v text)",
    "CREATE INDEX ON tmp (v)",
    "ALTER TABLE tmp ADD COLUMN w int",
    "alter table if exists only pg_temp.tmp alter column w set default 3",
    "INSERT INTO tmp (v) SELECT email FROM customers",
    "CREATE TEMP TABLE tmp2 AS SELECT * FROM customers",
    "SELECT * INTO TEMP tmp3 FROM orders",
    "CREATE TEMP VIEW tmp_v AS SELECT * FROM tmp",
    "DROP TABLE tmp, pg_temp.tmp2 CASCADE",
    "DROP TABLE IF EXISTS tmp;",
    "DROP TABLE tmp3",
)


def overlay_state(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    row = conn.execute(OVERLAY_STATE).fetchone()
    assert row is not None
    return tuple(row)


def test_temporary_tables_leave_the_overlay_alone(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        before = overlay_state(conn)
        for statement in TEMP_DDL:
            conn.execute(statement)
            assert overlay_state(conn) == before, statement
        with conn.transaction():  # in a session, too (the no-proxy path)
            conn.execute("SELECT cow.use_session('t1')")
            conn.execute("CREATE TEMP TABLE keep ON COMMIT DROP AS SELECT id FROM customers")
            conn.execute("INSERT INTO customers (email, name) SELECT 'k' || id || '@x', 'K' FROM keep")
        conn.execute("SELECT cow.use_session(NULL)")
        assert overlay_state(conn) == before
        assert conn.execute("SELECT count(*) FROM cow.session_changes('t1')").fetchone() == (3,)
        # App DDL on a real table still brings the overlay in step.
        conn.execute("ALTER TABLE customers ADD COLUMN nickname text")
        assert overlay_state(conn) != before
        columns = conn.execute(
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_schema = 'cow_overlay_public' AND table_name = 'customers'"
            " AND column_name = 'nickname'"
        ).fetchone()
        assert columns == (1,)


def test_a_temporary_table_named_like_a_permanent_one_takes_the_general_path(layer_db: str) -> None:
    """A name that is also a permanent relation's may resolve to it (a search_path listing pg_temp late):
    the event triggers then do what they do for any DDL, and the permanent table stays in the layer."""
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE customers (id int)")
        conn.execute("DROP TABLE customers")  # the temporary one (pg_temp comes first)
        views = conn.execute(
            "SELECT count(*) FROM pg_class WHERE relnamespace = 'cow_overlay_public'::regnamespace"
            " AND relname = 'customers' AND relkind = 'v'"
        ).fetchone()
        assert views == (1,)
        conn.execute("SELECT cow.use_session('t2')")
        conn.execute("INSERT INTO customers (email, name) VALUES ('t2@x', 'T')")
        assert conn.execute("SELECT count(*) FROM public.customers").fetchone() == (3,)


def test_concurrent_temporary_tables_do_not_contend_on_the_layer(layer_db: str) -> None:
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            with psycopg.connect(layer_db, autocommit=True) as conn:
                for i in range(25):
                    with conn.transaction():
                        conn.execute(f"CREATE TEMP TABLE scratch_{n}_{i} (id int PRIMARY KEY, v text)")
                        conn.execute(f"INSERT INTO scratch_{n}_{i} SELECT id, email FROM customers")
                    conn.execute(f"DROP TABLE scratch_{n}_{i}")
        except BaseException as exc:  # (the test reports it)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(100)
    assert errors == []
