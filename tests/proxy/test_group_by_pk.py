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

from tests.fix_db import outcome
from tests.fix_proxy import RunningProxy

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
_T, _C = (
    '"app_t"."id" AS "id", "app_t"."name" AS "name"',
    '"app_t" LEFT OUTER JOIN "app_c" ON ("app_t"."id" = "app_c"."t_id")',
)
# Django 5.2 groups by output positions (``GROUP BY 1, 3``): the shapes its aggregation and expressions_case
# tests send, here on app_t/app_c. Each gives the plain table's rows in a session.
POSITIONS: list[tuple[str, tuple[Any, ...] | None]] = [
    (f'SELECT {_T}, COUNT("app_c"."id") AS "n" FROM {_C} GROUP BY 1 ORDER BY 1', None),
    # .values().annotate() with a CASE of a joined column: the key and the CASE grouped, counted outside
    (
        f'SELECT COUNT(*) FROM (SELECT {_T}, CASE WHEN "app_c"."id" > 11 THEN true ELSE false END AS "big" '
        f"FROM {_C} GROUP BY 1, 3) subquery",
        None,
    ),
    # the key is not the first output column; HAVING on the aggregate; extended protocol
    (
        'SELECT MIN("app_c"."id") AS "first", "app_t"."name" AS "name", "app_t"."id" AS "id" '
        f'FROM {_C} GROUP BY 3 HAVING NOT (MIN("app_c"."id") IS NULL) AND MIN("app_c"."id") > %s ORDER BY 1',
        (0,),
    ),
    # ORDER BY a column that is neither selected nor grouped
    (f'SELECT "app_t"."id" AS "pk" FROM {_C} GROUP BY 1 ORDER BY "app_t"."name" ASC', None),
    # aggregates inside CASE: in the SELECT list, in HAVING's condition, predicate and value
    (
        f'SELECT {_T}, SUM(CASE WHEN NOT ("app_c"."id" = 11 AND "app_c"."id" IS NOT NULL) THEN 1 ELSE 2 END) '
        f'AS "cnt" FROM {_C} GROUP BY 1 ORDER BY 2 ASC',
        None,
    ),
    (
        f'SELECT {_T}, MAX("app_c"."id") AS "max", CASE WHEN MAX("app_c"."id") = 11 THEN \'max = 11\' '
        f'ELSE \'\' END AS "test" FROM {_C} GROUP BY 1 ORDER BY "app_t"."id" ASC',
        None,
    ),
    (
        f'SELECT {_T}, MAX("app_c"."id") AS "max" FROM {_C} GROUP BY 1, 2 HAVING "app_t"."id" = '
        '(CASE WHEN MAX("app_c"."id") = 12 THEN 2 WHEN MAX("app_c"."id") = 15 THEN 3 ELSE NULL END) '
        'ORDER BY "app_t"."id" ASC',
        None,
    ),
    (
        f'SELECT {_T}, "app_t"."id" * 10 AS "tens", MIN("app_c"."id") AS "min" FROM {_C} GROUP BY 1, 2, 3 '
        'HAVING "app_t"."name" = '
        '(CASE WHEN "app_t"."id" = 2 THEN \'TWO\' WHEN MIN("app_c"."id") = 13 THEN \'four\' ELSE NULL END) '
        'ORDER BY "app_t"."id" ASC',
        None,
    ),
    # a qualified star counts as the table's columns: position 1 is app_t.id
    ("SELECT t.*, count(c.id) FROM app_t t LEFT JOIN app_c c ON c.t_id = t.id GROUP BY 1 ORDER BY 1", None),
    ("SELECT count(c.id), t.* FROM app_t t LEFT JOIN app_c c ON c.t_id = t.id GROUP BY 2 ORDER BY 2", None),
    # positions PostgreSQL refuses stay refused: out of range (42P10), not the key (42803)
    (f"SELECT {_T} FROM {_C} GROUP BY 3", None),
    (f"SELECT {_T} FROM {_C} GROUP BY 2", None),
    # a bare * makes positions uncertain: left alone (42803 in a session, a known limit: docs/rewrites.md)
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


def test_group_by_positions_in_a_session_as_on_the_plain_table(
    proxy: RunningProxy, databases: tuple[str, str]
) -> None:
    layer_db, plain = databases
    session_dsn = proxy.dsn(layer_db, options="-c%20cow.session_id%3Dgrp-pos")
    with (
        psycopg.connect(session_dsn, autocommit=True) as conn,
        psycopg.connect(plain, autocommit=True) as ref,
    ):
        for sql in WRITES:
            conn.execute(sql)
            ref.execute(sql)
        seen = [outcome(ref, sql, params) for sql, params in POSITIONS]
        for (sql, params), expected in zip(POSITIONS, seen, strict=True):
            assert outcome(conn, sql, params) == expected, sql
        assert seen[0][2] == [(1, "one", 1), (2, "TWO", 1), (3, "three", 1), (4, "four", 2)]
        assert [o[0] for o in seen[:-2]] == ["ok"] * (len(POSITIONS) - 2)
        assert [o[1] for o in seen[-2:]] == ["42P10", "42803"]


def test_direct_clients_without_the_proxy_still_get_42803(databases: tuple[str, str]) -> None:
    """Known limit (docs/layer.md): the fix is a proxy rewrite; a direct session on the view fails."""
    layer_db, plain = databases
    with psycopg.connect(layer_db, autocommit=True) as direct, psycopg.connect(plain, autocommit=True) as ref:
        direct.execute("SELECT cow.use_session('grp', 'op')")
        assert outcome(ref, DJANGO, None)[0] == "ok"
        assert outcome(direct, DJANGO, None)[:2] == ("error", "42803")
