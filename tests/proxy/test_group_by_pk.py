"""Django's ``.annotate(Count(…))`` shape, ``GROUP BY`` the primary key only, works in a session.

PostgreSQL accepts selecting the other columns of a table grouped by its primary key (functional
dependency); the overlay view has no primary key, so in a session the statement failed with 42803. The proxy
adds the table's other columns to the GROUP BY. Compared side by side with a plain database holding the same
tables and the same writes, through psycopg's simple and extended protocol.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.fix_proxy import RunningProxy, outcome

pytestmark = pytest.mark.timeout(60)

SCHEMA = """
CREATE TABLE app_t (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE app_c (id int PRIMARY KEY, t_id int NOT NULL REFERENCES app_t (id));
CREATE TABLE app_pair (a int, b int, label text, PRIMARY KEY (a, b));
-- Keyed by the layer by its NOT NULL UNIQUE (no primary key): PostgreSQL's functional dependency needs a
-- primary key, so GROUP BY the unique key alone is 42803 on the plain table, and must stay so in a session.
CREATE TABLE app_link (a int NOT NULL, b int NOT NULL, label text, UNIQUE (a, b));
INSERT INTO app_link VALUES (1, 1, 'x');
INSERT INTO app_t VALUES (1, 'one'), (2, 'two'), (3, 'three');
INSERT INTO app_c VALUES (10, 1), (11, 1), (12, 2);
INSERT INTO app_pair VALUES (1, 1, 'x'), (1, 2, 'y');
"""
WRITES = [
    "INSERT INTO app_t VALUES (4, 'four')",
    "UPDATE app_t SET name = 'TWO' WHERE id = 2",
    "INSERT INTO app_c VALUES (13, 4), (14, 4), (15, 3)",
    "DELETE FROM app_c WHERE id = 10",
    "UPDATE app_pair SET label = 'z' WHERE a = 1 AND b = 2",
]
# Django's SQL for App_t.objects.annotate(n=Count("app_c")) (ORDER BY added: rows compared in order).
DJANGO = (
    'SELECT "app_t"."id", "app_t"."name", COUNT("app_c"."id") AS "n" FROM "app_t" LEFT OUTER JOIN "app_c" '
    'ON ("app_t"."id" = "app_c"."t_id") GROUP BY "app_t"."id"'
)
QUERIES: list[tuple[str, tuple[Any, ...] | None]] = [
    (DJANGO + ' ORDER BY "app_t"."id"', None),
    (DJANGO + ' HAVING COUNT("app_c"."id") >= %s ORDER BY "app_t"."id"', (1,)),  # extended protocol
    (
        'SELECT "app_t"."id", "app_t"."name", COUNT("app_c"."id") AS "n" FROM "app_t" '
        'LEFT OUTER JOIN "app_c" ON ("app_t"."id" = "app_c"."t_id") WHERE "app_t"."id" > %s '
        'GROUP BY "app_t"."id" ORDER BY 1',
        (0,),
    ),
    (
        "SELECT t.*, count(c.id) FROM app_t t LEFT JOIN app_c c ON c.t_id = t.id GROUP BY t.id ORDER BY t.id",
        None,
    ),
    ("SELECT a, b, label, count(*) FROM app_pair GROUP BY a, b ORDER BY a, b", None),
    ("SELECT a, b, label, count(*) FROM app_link GROUP BY a, b ORDER BY a, b", None),  # no primary key: 42803
    ("SELECT a, label, count(*) FROM app_pair GROUP BY a ORDER BY a", None),  # not the whole key: 42803
]


def test_group_by_primary_key_in_a_session_as_on_the_plain_table(
    proxy: RunningProxy, databases: tuple[str, str]
) -> None:
    layer_db, plain = databases
    session_dsn = proxy.dsn(layer_db, options="-c%20cow.session_id%3Dgrp")
    with (
        psycopg.connect(session_dsn, autocommit=True) as conn,
        psycopg.connect(plain, autocommit=True) as ref,
    ):
        for sql in WRITES:
            conn.execute(sql)
            ref.execute(sql)
        for sql, params in QUERIES:
            expected = outcome(ref, sql, params)
            assert outcome(conn, sql, params) == expected, sql
        assert outcome(ref, *QUERIES[0])[2] == [(1, "one", 1), (2, "TWO", 1), (3, "three", 1), (4, "four", 2)]
        assert outcome(ref, *QUERIES[-1])[:2] == outcome(ref, *QUERIES[-2])[:2] == ("error", "42803")
    with psycopg.connect(layer_db) as direct:  # the session's writes stayed in the session
        assert direct.execute("SELECT count(*) FROM app_t").fetchone() == (3,)


def test_direct_clients_without_the_proxy_still_get_42803(databases: tuple[str, str]) -> None:
    """Known limit (docs/layer.md): the fix is a proxy rewrite; a direct session on the view fails."""
    layer_db, plain = databases
    with psycopg.connect(layer_db, autocommit=True) as direct, psycopg.connect(plain, autocommit=True) as ref:
        direct.execute("SELECT cow.use_session('grp', 'op')")
        assert outcome(ref, DJANGO, None)[0] == "ok"
        assert outcome(direct, DJANGO, None)[:2] == ("error", "42803")
