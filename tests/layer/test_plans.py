"""The overlay view's plans (DESIGN.md §3: plan costs, JIT, generic plans, other sessions present)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

ROWS = 20_000


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def explain(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> dict[str, Any]:
    row = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params).fetchone()
    assert row is not None
    data = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return data[0]  # type: ignore[no-any-return]


@pytest.fixture
def big(layer_db: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE big (id int PRIMARY KEY, v int, t text)")
        conn.execute(f"INSERT INTO big SELECT g, g % 100, 'row ' || g FROM generate_series(1, {ROWS}) g")
        # Other sessions' changes present, and some of this session's.
        conn.execute("SELECT cow.use_session('other')")
        conn.execute("UPDATE big SET v = -1 WHERE id <= 5000")
        conn.execute("SELECT cow.use_session('me')")
        conn.execute("UPDATE big SET v = -2 WHERE id % 100 = 0")
        conn.execute("SELECT cow.use_session(NULL)")
        conn.execute("ANALYZE big")
        conn.execute("ANALYZE cow_changes.t3")
        conn.execute("SET jit = on")
        yield conn


def test_no_session_runs_only_the_base_branch(big: psycopg.Connection[Any]) -> None:
    plan = explain(big, "SELECT * FROM cow_overlay_public.big WHERE id = 500")
    assert plan["Plan"]["Actual Rows"] == 1
    for node in nodes(plan["Plan"]):
        if node.get("Relation Name", "").startswith("t3"):
            assert node["Actual Loops"] == 0, node  # the changes table is never read without a session
    assert plan["Plan"]["Total Cost"] < 100  # far below jit_above_cost: no JIT for a point read
    assert "JIT" not in plan


def test_point_and_range_reads_in_a_session_use_indexes_generic_plan(big: psycopg.Connection[Any]) -> None:
    big.execute("SELECT cow.use_session('me')")
    big.execute("SET plan_cache_mode = force_generic_plan")
    big.execute("PREPARE p(int) AS SELECT v FROM big WHERE id = $1")
    for key, expected in ((100, -2), (101, 1), (5001, 1)):
        plan = explain(big, f"EXECUTE p({key})")
        assert plan["Plan"]["Actual Rows"] == 1
        kinds = {n["Node Type"] for n in nodes(plan["Plan"])}
        assert "Seq Scan" not in kinds, kinds
        assert big.execute(f"EXECUTE p({key})").fetchone() == (expected,)
    plan = explain(big, "SELECT * FROM big WHERE id BETWEEN 1000 AND 1099")
    assert plan["Plan"]["Actual Rows"] == 100
    assert "Seq Scan" not in {n["Node Type"] for n in nodes(plan["Plan"])}
    assert plan["Plan"]["Total Cost"] < 10_000 and "JIT" not in plan


def test_full_scan_in_a_session_sees_exactly_its_rows(big: psycopg.Connection[Any]) -> None:
    big.execute("SELECT cow.use_session('me')")
    assert big.execute("SELECT count(*), sum(v) FROM big").fetchone() == (
        ROWS,
        sum(i % 100 for i in range(1, ROWS + 1) if i % 100) - 2 * (ROWS // 100),
    )


def test_changes_tables_are_autovacuumed_after_one_percent_changed(layer_db: str) -> None:
    # Index-only probes of <t>_cur read the heap for pages not all-visible (migration 0003).
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE later (id int PRIMARY KEY, v text)")  # enabled by the DDL event trigger
        rows = conn.execute(
            "SELECT g.table_name, c.reloptions FROM cow.registry g"
            " JOIN pg_class c ON c.oid = to_regclass('cow_changes.' || quote_ident(g.changes_table))"
            " ORDER BY 1"
        ).fetchall()
    assert [name for name, _ in rows] == ["customers", "later", "orders"]
    for name, options in rows:
        assert set(options or ()) >= {
            "autovacuum_vacuum_scale_factor=0.01",
            "autovacuum_vacuum_insert_scale_factor=0.01",
        }, name
