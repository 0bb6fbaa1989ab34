"""What the side-by-side tests of the proxy's read rewrites share (test_split_counts.py, test_key_reads.py):
tables ``k_items`` (5,000 rows, keyed by a bigint), ``k_coded`` (keyed by a unique index on text) and
``k_bag`` (no key), writes that move rows in and out of conditions (key moves, deletes, re-inserts, NULLs),
a hypothesis strategy of such writes, and a session connection next to the plain database's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
from hypothesis import strategies as st

from tests.fix_db import outcome
from tests.fix_proxy import RunningProxy

TABLES = """
CREATE TABLE k_items (id bigint PRIMARY KEY, grp int, name text NOT NULL, qty int);
CREATE TABLE k_coded (code text NOT NULL, n int);
CREATE UNIQUE INDEX k_coded_code ON k_coded (code);
CREATE TABLE k_bag (v int, w text);
INSERT INTO k_items SELECT g, g % 10, 'item ' || g, CASE WHEN g % 7 = 0 THEN NULL ELSE g % 100 END
  FROM generate_series(1, 5000) g;
INSERT INTO k_coded SELECT 'c' || g, g FROM generate_series(1, 300) g;
INSERT INTO k_bag SELECT g % 5, 'w' || (g % 3) FROM generate_series(1, 60) g;
"""
WRITES = [
    "UPDATE k_items SET grp = 3 WHERE id % 50 = 0",  # rows move into grp 3 and out of their own
    "UPDATE k_items SET qty = NULL, name = 'renamed ' || id WHERE id BETWEEN 100 AND 140",
    "DELETE FROM k_items WHERE id % 91 = 0",
    "UPDATE k_items SET id = id + 10000 WHERE id BETWEEN 4000 AND 4010",  # primary-key updates
    "INSERT INTO k_items SELECT g, 3, 'new ' || g, 1 FROM generate_series(6000, 6020) g",
    "DELETE FROM k_items WHERE id = 6005",  # inserted, then deleted in the session
    "DELETE FROM k_items WHERE id = 77",
    "INSERT INTO k_items VALUES (77, 3, 'back again', 5)",  # deleted, then inserted again
    "UPDATE k_coded SET n = n + 1000 WHERE n % 4 = 0",
    "UPDATE k_coded SET code = code || 'x' WHERE n < 20",  # key updates of a table keyed by unique index
    "DELETE FROM k_coded WHERE n BETWEEN 200 AND 209",
    "INSERT INTO k_bag VALUES (1, 'w1'), (9, 'w9')",
    "DELETE FROM k_bag WHERE v = 2",
]

IDS = st.integers(1, 5050)
GROUPS = st.integers(0, 12)


def k_items_writes(ids: st.SearchStrategy[int]) -> st.SearchStrategy[tuple[str, tuple[Any, ...]]]:
    """One write of k_items rows with keys from ``ids`` (or new keys), in a session and on the plain table:
    (SQL with %s, parameters)."""
    return st.one_of(
        st.builds(lambda i, g: ("UPDATE k_items SET grp = %s WHERE id = %s", (g, i)), ids, GROUPS),
        st.builds(lambda i: ("UPDATE k_items SET qty = NULL WHERE id %% 97 = %s", (i % 97,)), ids),
        st.builds(lambda i: ("DELETE FROM k_items WHERE id BETWEEN %s AND %s + 20", (i, i)), ids),
        st.builds(lambda i: ("UPDATE k_items SET id = id + 20000 WHERE id = %s", (i,)), ids),
        st.builds(
            lambda i, g: (
                "INSERT INTO k_items VALUES (%s, %s, 'new ' || %s, 1) ON CONFLICT DO NOTHING",
                (i, g, i),
            ),
            st.one_of(ids, st.integers(4990, 6100)),
            GROUPS,
        ),
    )


Write = str | tuple[str, tuple[Any, ...]]


@contextlib.contextmanager
def side_by_side(
    proxy: RunningProxy,
    databases: tuple[str, str],
    session: str,
    writes: Sequence[Write],
    *,
    prepare: bool = False,
    rollback: bool = False,
) -> Iterator[tuple[psycopg.Connection[Any], psycopg.Connection[Any]]]:
    """(a connection in ``session`` through the proxy, one to the plain database) after the same ``writes``
    on both, with the same row counts. ``prepare``: psycopg prepares every statement on the session side.
    ``rollback``: the plain side's writes are rolled back at the end, so that each hypothesis example starts
    from the same rows (its session is new); else both connections autocommit."""
    layer_db, plain = databases
    with (
        psycopg.connect(
            proxy.dsn(layer_db, options=f"-c%20cow.session_id%3D{session}"),
            autocommit=not rollback,
            prepare_threshold=0 if prepare else None,
        ) as conn,
        psycopg.connect(plain, autocommit=not rollback) as ref,
    ):
        if rollback:  # (open now: a savepoint outside a transaction would be a transaction committed)
            conn.execute("SELECT 1")
            ref.execute("SELECT 1")
        for write in writes:
            sql, params = (write, None) if isinstance(write, str) else write
            # (Outcomes, not row counts: a drawn write may fail on both sides alike, a key moved twice onto
            # the same new key; in a transaction each runs in a savepoint so that the next ones still run.)
            side = outcome(conn, sql, params, savepoint=rollback)
            assert side == outcome(ref, sql, params, savepoint=rollback), (sql, params)
        yield conn, ref
        if rollback:
            ref.rollback()
