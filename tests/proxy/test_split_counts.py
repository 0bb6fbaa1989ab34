"""``count(*)`` of a CoW table in a session: the proxy splits it into counts of the base and changes tables.

Through the view, every base row is probed against the session's keys; split, the base rows are counted as
the plain table counts them and only the session's rows are read by key (docs/rewrites.md). Compared side by
side with a plain database holding the same tables and the same writes, through psycopg's simple and
extended protocol, with rows moving in and out of each condition.
"""

from __future__ import annotations

import json
import re
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fix_db import outcome
from tests.fix_proxy import RunningProxy
from tests.proxy.k_items import GROUPS, IDS, TABLES, WRITES, k_items_writes, side_by_side

pytestmark = pytest.mark.timeout(120)

SCHEMA = (
    TABLES
    + """
CREATE INDEX ON k_items (grp);
ANALYZE k_items, k_coded, k_bag;
"""
)
PRISMA = (
    'SELECT COUNT(*) FROM (SELECT "public"."k_items"."id" FROM "public"."k_items" '
    'WHERE ("public"."k_items"."grp" = %s AND 1=1) OFFSET %s) AS "sub"'
)
# (statement, parameters, split by the proxy; None: not checked (a table without key, whose view has no anti
# join; an error))
QUERIES: list[tuple[str, tuple[Any, ...] | None, bool | None]] = [
    ("SELECT count(*) FROM k_items", None, True),
    ('SELECT COUNT(*) AS "__count" FROM k_items WHERE grp = %s', (3,), True),
    ("SELECT count(*) FROM k_items WHERE grp = %s", (0,), True),
    ("SELECT count(*) FROM k_items WHERE qty IS NULL", None, True),
    ("SELECT count(qty) FROM k_items WHERE grp = %s", (3,), True),  # the rows where qty is not null
    ("SELECT count(1) AS n FROM k_items", None, True),
    ("SELECT count(*) AS n FROM public.k_items i WHERE i.name LIKE %s OR i.qty > %s", ("renamed%", 90), True),
    ("SELECT count(*) FROM k_items WHERE id BETWEEN %s AND %s", (3990, 14100), True),
    ("SELECT count(*) FROM k_items WHERE lower(name) = %s", ("back again",), True),
    ("SELECT count(*) FROM k_items WHERE grp = ANY(%s)", ([1, 3, 5],), True),
    ("SELECT 1 + (SELECT count(*) FROM k_items WHERE qty < 10)", None, True),
    (  # SQLAlchemy's Query.count()
        "SELECT count(*) AS count_1 FROM (SELECT k_items.id AS k_items_id, k_items.name AS k_items_name "
        "FROM k_items WHERE k_items.qty >= %s) AS anon_1",
        (50,),
        True,
    ),
    ("SELECT count(*) FROM k_coded", None, True),
    # Prisma's count(): schema-qualified columns, OFFSET $n (0 unless skip is given)
    (PRISMA, (3, 0), True),
    (PRISMA, (3, 5), True),
    (PRISMA, (3, 100000), True),
    (PRISMA, (3, -1), None),  # 2201X from PostgreSQL itself, split or not
    ("SELECT count(*) FROM (SELECT id FROM k_items ORDER BY id LIMIT %s OFFSET %s) s", (10, 4990), True),
    ("SELECT count(*) FROM (SELECT * FROM k_items LIMIT %s) s", (7,), True),
    ("SELECT count(*) FROM k_coded WHERE code LIKE %s", ("%x",), True),
    ("SELECT count(*) FROM k_items WHERE random() < 2", None, False),  # volatile: the view answers
    ("SELECT count(*) FROM k_items WHERE id IN (SELECT n FROM k_coded)", None, False),
    ("SELECT grp, count(*) FROM k_items GROUP BY grp ORDER BY grp", None, False),
    ("SELECT count(*) FROM k_bag", None, None),  # no key: not split
    ("SELECT count(*) FROM k_bag WHERE v = 1", None, None),
]


def anti_join(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...] | None) -> bool:
    """Whether the statement's plan has an anti join: the overlay view's, which a split count has not."""
    row = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()
    assert row is not None
    return re.search(r'"Join Type": "(Right )?Anti"', json.dumps(row[0])) is not None


@pytest.mark.parametrize("prepare", [False, True], ids=["simple", "extended"])
def test_counts_in_a_session_as_on_the_plain_tables(
    proxy: RunningProxy, databases: tuple[str, str], prepare: bool
) -> None:
    layer_db, _ = databases
    with side_by_side(proxy, databases, "counts", WRITES, prepare=prepare) as (conn, ref):
        for sql, params, split in QUERIES:
            expected = outcome(ref, sql, params)
            assert expected[0] == "ok" or split is None, sql
            assert outcome(conn, sql, params) == expected, (sql, params)
            if split is not None:
                assert anti_join(conn, sql, params) is not split, sql
        cur = conn.execute('SELECT count(*) AS "__count" FROM k_items')
        assert cur.description is not None and [d.name for d in cur.description] == ["__count"]
        cur = conn.execute("SELECT count(*) FROM k_items")
        assert cur.description is not None and [d.name for d in cur.description] == ["count"]
    with psycopg.connect(layer_db) as direct:  # the session's writes stayed in the session
        assert direct.execute("SELECT count(*) FROM k_items").fetchone() == (5000,)


# -- property: any mix of writes, any condition of the supported kinds: the plain table's count ------------

COLUMNS = {"grp": GROUPS, "qty": st.integers(0, 99), "id": IDS}
# (SQL with %s, parameters) of one condition on k_items
Condition = tuple[str, tuple[Any, ...]]


@st.composite
def conditions(draw: st.DrawFn, depth: int = 0) -> Condition:
    kind = draw(
        st.sampled_from(
            ["cmp", "null", "like", "between", "in"] + (["and", "or", "not"] if depth < 2 else [])
        )
    )
    if kind == "cmp":
        column = draw(st.sampled_from(sorted(COLUMNS)))
        op = draw(st.sampled_from(["=", "<", ">=", "<>"]))
        return f"{column} {op} %s", (draw(COLUMNS[column]),)
    if kind == "null":
        return draw(st.sampled_from(["qty IS NULL", "grp IS NOT NULL", "qty IS DISTINCT FROM 5"])), ()
    if kind == "like":
        return "lower(name) LIKE %s", (draw(st.sampled_from(["item 1%", "%7", "new%", "renamed%", "%"])),)
    if kind == "between":
        low = draw(COLUMNS["id"])
        return "id BETWEEN %s AND %s", (low, low + draw(st.integers(0, 2000)))
    if kind == "in":
        return "grp = ANY(%s)", (draw(st.lists(COLUMNS["grp"], max_size=4)),)
    if kind == "not":
        sql, params = draw(conditions(depth + 1))
        return f"NOT ({sql})", params
    (left, lp), (right, rp) = draw(conditions(depth + 1)), draw(conditions(depth + 1))
    return f"({left}) {kind.upper()} ({right})", lp + rp


def test_split_counts_equal_the_plain_table_for_any_writes_and_condition(
    proxy: RunningProxy, databases: tuple[str, str]
) -> None:
    sessions = iter(range(10**6))

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        writes=st.lists(k_items_writes(IDS), max_size=8), where=st.lists(conditions(), min_size=1, max_size=4)
    )
    def check(writes: list[tuple[str, tuple[Any, ...]]], where: list[Condition]) -> None:
        with side_by_side(proxy, databases, f"prop{next(sessions)}", writes, rollback=True) as (conn, ref):
            for condition, params in where:
                for sql in (
                    f"SELECT count(*) FROM k_items WHERE {condition}",
                    f"SELECT count(qty) FROM k_items WHERE {condition}",
                    f"SELECT count(*) FROM (SELECT k_items.id FROM k_items WHERE {condition} OFFSET 3) AS s",
                ):
                    assert outcome(conn, sql, params) == outcome(ref, sql, params), (sql, params, writes)

    check()
