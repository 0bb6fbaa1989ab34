"""Reads without a full ORDER BY return a session's rows in the plain table's order (docs/layer.md, "Row
order").

SQL leaves that order open, but an application's tests often rely on what PostgreSQL does with a small table:
a scan in the order of the heap, and a sort that keeps ties in that order (Django's own suite: ``DISTINCT
ON`` keeps the first row of each group, ``values_list()`` without ``order_by()``). The overlay view returns
the base rows in the base table's order, then the session's rows. On PostgreSQL 16+ the view's anti join
once became a Hash Right Anti Join, which returns the rows in hash order; each read here also checks that no
plan of it has one. Every statement runs on a plain copy and in a session, side by side, on tables as an
application creates them (no statistics yet) and after ANALYZE.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.layer.test_semantics import Pair, session_pair

DDL = """
CREATE TABLE staff (id serial PRIMARY KEY, name text NOT NULL, org text NOT NULL);
CREATE TABLE tag (id serial PRIMARY KEY, name text NOT NULL);
INSERT INTO tag (name) VALUES ('b1'), ('a1'), ('c1'), ('a2'), ('b2');
"""

# Rows the session writes (in the plain copy: to the table): a base row updated and one deleted, then
# inserts in key order, as an application's serial ids come. (The session's own rows come in key order,
# the plain table's in the heap's, about write order: docs/layer.md says where they differ.)
WRITES = [
    "UPDATE tag SET name = 'b0' WHERE id = 2",
    "DELETE FROM tag WHERE id = 4",
    "INSERT INTO staff (name, org) VALUES ('p1', 'o1'), ('p2', 'o1'), ('p3', 'o1'), ('p1', 'o2'),"
    " ('p2', 'o3')",
    "INSERT INTO tag (name) VALUES ('a0'), ('c0')",
]

READS = [
    "SELECT id, name, org FROM staff",
    "SELECT id, name FROM tag",
    "SELECT id FROM tag WHERE name > 'a'",
    "SELECT DISTINCT ON (name) id, name, org FROM staff ORDER BY name",
    "SELECT DISTINCT ON (org) id, name FROM staff ORDER BY org",
    "SELECT DISTINCT ON (lower(substr(name, 1, 1))) id, name FROM tag",
    "SELECT id, name FROM staff ORDER BY org",
    "SELECT s.id, t.id FROM staff s, tag t WHERE t.name LIKE 'b%'",
]


@pytest.fixture(params=["no statistics", "analyzed"])
def pair(request: pytest.FixtureRequest, plain_db: str, layer_db: str) -> Iterator[Pair]:
    with session_pair(plain_db, layer_db, DDL) as p:
        for sql in WRITES:
            p.both(sql)
        if request.param == "analyzed":
            for conn in (p.plain, p.cow):
                conn.execute("ANALYZE staff")
                conn.execute("ANALYZE tag")
            for (stmt,) in p.cow.execute(
                "SELECT format('ANALYZE cow_changes.%I', changes_table) FROM cow.registry"
            ).fetchall():
                p.cow.execute(stmt)
        yield p


def join_types(conn: psycopg.Connection[Any], sql: str) -> list[str]:
    row = conn.execute(f"EXPLAIN (FORMAT JSON) {sql}").fetchone()
    assert row is not None
    plan = (row[0] if not isinstance(row[0], str) else json.loads(row[0]))[0]["Plan"]
    found: list[str] = []
    stack = [plan]
    while stack:
        node = stack.pop()
        if "Join Type" in node:
            found.append(f"{node['Node Type']} {node['Join Type']}")
        stack.extend(node.get("Plans", []))
    return found


@pytest.mark.parametrize("sql", READS)
def test_reads_return_the_rows_in_the_plain_tables_order(pair: Pair, sql: str) -> None:
    plain = pair.plain.execute(sql).fetchall()
    session = pair.cow.execute(sql).fetchall()
    assert session == plain
    assert not [j for j in join_types(pair.cow, sql) if "Right Anti" in j]
