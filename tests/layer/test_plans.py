"""The overlay view's plans (docs/layer.md: plan costs, JIT, generic plans, other sessions present)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

ROWS = 20_000


def gate(plan: dict[str, Any]) -> bool:
    """Whether ``plan`` is the binding gate's InitPlan (a probe of cow.bindings, docs/threat-model.md)."""
    return plan.get("Parent Relationship") == "InitPlan" and any(
        n.get("Relation Name") == "bindings" for n in all_nodes(plan)
    )


def all_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from all_nodes(child)


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The plan's nodes, without the binding gate's (a few nodes on a tiny table, once per statement)."""
    yield plan
    for child in plan.get("Plans", []):
        if not gate(child):
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
            # The changes leaf is cut by a one-time filter; the anti join's probe has a NULL session key,
            # which a btree scan knows matches nothing before reading the index.
            assert node["Actual Rows"] == 0, node
            assert node["Alias"] == "x" or node["Actual Loops"] == 0, node
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
    assert [name for name, _ in rows] == ["customers", "later", "nopk", "orders"]
    for name, options in rows:
        assert set(options or ()) >= {
            "autovacuum_vacuum_scale_factor=0.01",
            "autovacuum_vacuum_insert_scale_factor=0.01",
        }, name


# Joins and ordered reads through the overlay view (docs/layer.md, "Overlay view shape"): a view whose
# UNION ALL leaves keep quals stays a subquery, so neither parameterized index paths (nested-loop joins) nor
# ordered paths (Merge Append under ORDER BY ... LIMIT) reach the base table: every join and every
# paginated list read the whole base table in a session.
SHOP_ROWS = 20_000
SHOP_DDL = """
CREATE TABLE prod (id int PRIMARY KEY, rank int NOT NULL, v int, t text);
CREATE INDEX prod_rank ON prod (rank);
CREATE TABLE line (
    id int PRIMARY KEY, prod_id int NOT NULL REFERENCES prod (id) ON DELETE CASCADE ON UPDATE CASCADE, qty int
);
CREATE INDEX line_prod ON line (prod_id);
CREATE TABLE pick (id int PRIMARY KEY, prod_id int NOT NULL);
"""
# rank: a permutation of 0..SHOP_ROWS-1 (7 is coprime with it), so ORDER BY rank has no ties.
SHOP_FILL = f"""
INSERT INTO prod SELECT g, (g * 7) % {SHOP_ROWS}, g % 100, 'row ' || g FROM generate_series(1, {SHOP_ROWS}) g;
INSERT INTO line SELECT g, (g * 13) % {SHOP_ROWS} + 1, g % 5 FROM generate_series(1, {2 * SHOP_ROWS}) g;
INSERT INTO pick SELECT g, (g * 37) % {SHOP_ROWS} + 1 FROM generate_series(1, 100) g;
"""
# This session's changes around the page boundaries the tests read (keyset pages from id 1000, the top of
# rank): deletes, updates, inserts, primary-key moves out of, into and within the page.
SHOP_SESSION = f"""
UPDATE prod SET v = -2 WHERE id % 100 = 0;
DELETE FROM prod WHERE id IN (1000, 1003, 1099, 1100) OR rank IN ({SHOP_ROWS - 1}, {SHOP_ROWS - 3});
INSERT INTO prod VALUES (1003, {SHOP_ROWS + 5}, 3, 'new 1003'), (1100, 5, 4, 'new 1100'), (-1, 1, 1, 'neg');
UPDATE prod SET id = 1099 WHERE id = 5000;
UPDATE prod SET id = {SHOP_ROWS + 100} WHERE id = 1050;
UPDATE prod SET id = 1000, rank = {SHOP_ROWS + 1} WHERE id = 1001;
UPDATE prod SET rank = {SHOP_ROWS + 2} WHERE id = 3;
UPDATE line SET prod_id = 1099 WHERE id IN (1, 2, 3);
DELETE FROM line WHERE id IN (4, 5);
INSERT INTO line VALUES ({3 * SHOP_ROWS}, 1099, 9), ({3 * SHOP_ROWS + 1}, 1003, 8);
UPDATE pick SET prod_id = 1099 WHERE id = 1;
"""


@pytest.fixture
def shop(layer_db: str, plain_db: str) -> Iterator[tuple[psycopg.Connection[Any], psycopg.Connection[Any]]]:
    """(plain, cow): the same tables and rows; cow in session 'me' with other sessions' changes present,
    the plain copy with only 'me''s changes applied."""
    with (
        psycopg.connect(plain_db, autocommit=True) as plain,
        psycopg.connect(layer_db, autocommit=True) as cow,
    ):
        for conn in (plain, cow):
            conn.execute(SHOP_DDL)
            conn.execute(SHOP_FILL)
        cow.execute("SELECT cow.use_session('other')")
        # Other sessions' rows outnumber this session's, as on a shared database (bench/layer.py: 100k to 1k).
        cow.execute("UPDATE prod SET v = -1 WHERE id > 5000")
        cow.execute("DELETE FROM line WHERE id % 10 = 0")
        cow.execute("UPDATE pick SET prod_id = 2 WHERE id < 50")
        cow.execute("SELECT cow.use_session('me')")
        for conn in (plain, cow):
            conn.execute(SHOP_SESSION)
        cow.execute("SELECT cow.use_session(NULL)")
        for conn in (plain, cow):
            conn.execute("VACUUM ANALYZE")
            conn.execute("SET jit = on")
        cow.execute("SELECT cow.use_session('me')")
        yield plain, cow


SHOP_READS = (
    # (sql, params, base table that must not be read whole)
    ("SELECT p.id, x.* FROM pick p JOIN prod x ON x.id = p.prod_id WHERE p.id < 10 ORDER BY 1", (), "prod"),
    (
        "SELECT x.id, l.* FROM prod x JOIN line l ON l.prod_id = x.id"
        " WHERE x.id BETWEEN 1095 AND 1105 ORDER BY 2",
        (),
        "line",
    ),
    ("SELECT * FROM prod WHERE id >= %s ORDER BY id LIMIT 100", (1000,), "prod"),
    ("SELECT * FROM prod WHERE id >= %s ORDER BY id LIMIT 100", (1060,), "prod"),
    ("SELECT * FROM prod ORDER BY id DESC LIMIT 20", (), "prod"),
    ("SELECT * FROM prod ORDER BY rank DESC LIMIT 20", (), "prod"),
    ("SELECT * FROM prod WHERE rank < %s ORDER BY rank DESC LIMIT 20", (SHOP_ROWS - 10,), "prod"),
)


def base_scans(plan: dict[str, Any], table: str) -> list[dict[str, Any]]:
    return [n for n in nodes(plan) if n.get("Relation Name") == table]


def assert_indexed(plan: dict[str, Any], table: str, sql: str) -> None:
    """The base table is read through an index, a few rows (not whole, nor sorted whole), and no JIT."""
    top = plan["Plan"]
    scans = base_scans(top, table)
    assert scans, sql
    assert all(n["Node Type"] != "Seq Scan" for n in scans), (sql, [n["Node Type"] for n in scans])
    read = sum((n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"] for n in scans)
    assert read < SHOP_ROWS // 20, (sql, read)
    assert "JIT" not in plan and top["Total Cost"] < 100_000, (sql, top["Total Cost"])  # jit_above_cost


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_joins_and_ordered_limits_in_a_session_use_the_base_indexes(
    shop: tuple[psycopg.Connection[Any], psycopg.Connection[Any]], generic: bool
) -> None:
    plain, cow = shop
    if generic:
        cow.execute("SET plan_cache_mode = force_generic_plan")
    for i, (sql, params, table) in enumerate(SHOP_READS):
        q = sql.replace("%s", "$1")
        for conn in (plain, cow):
            conn.execute(f"PREPARE q{i}{'(int)' if params else ''} AS {q}")
        execute = f"EXECUTE q{i}" + (f"({params[0]})" if params else "")
        assert_indexed(explain(cow, execute), table, sql)
        expected = plain.execute(execute).fetchall()
        assert expected and cow.execute(execute).fetchall() == expected, sql


def test_joins_and_ordered_limits_see_the_session_rows_like_the_plain_table(
    shop: tuple[psycopg.Connection[Any], psycopg.Connection[Any]],
) -> None:
    plain, cow = shop
    pages = [
        "SELECT * FROM prod WHERE id >= %s ORDER BY id LIMIT 100",
        "SELECT * FROM prod WHERE id < %s ORDER BY id DESC LIMIT 20",
        "SELECT * FROM prod WHERE rank < %s ORDER BY rank DESC LIMIT 20",
    ]
    for sql in pages:
        for start in (-5, 990, 1000, 1001, 1040, 1090, 1099, 1100, 4990, SHOP_ROWS - 50, SHOP_ROWS + 200):
            assert cow.execute(sql, (start,)).fetchall() == plain.execute(sql, (start,)).fetchall(), (
                sql,
                start,
            )
    for sql in (
        "SELECT p.id, x.* FROM pick p JOIN prod x ON x.id = p.prod_id ORDER BY 1",
        "SELECT x.id, l.* FROM prod x JOIN line l ON l.prod_id = x.id"
        " WHERE x.id IN (1003, 1099, 5000) ORDER BY 2",
        "SELECT x.*, count(l.id) FROM prod x LEFT JOIN line l ON l.prod_id = x.id WHERE x.id < 1200"
        " GROUP BY x.id, x.rank, x.v, x.t ORDER BY x.id",
    ):
        expected = plain.execute(sql).fetchall()
        assert expected and cow.execute(sql).fetchall() == expected, sql


def test_the_view_is_one_flat_append_of_the_base_and_changes_tables(
    shop: tuple[psycopg.Connection[Any], psycopg.Connection[Any]],
) -> None:
    # A leaf that PostgreSQL does not pull up shows as a Subquery Scan: it hides the base table's paths.
    _, cow = shop
    for sql in ("SELECT * FROM prod WHERE id = 7", "SELECT count(*) FROM prod", "SELECT * FROM line"):
        kinds = {n["Node Type"] for n in nodes(explain(cow, sql)["Plan"])}
        assert "Subquery Scan" not in kinds, (sql, kinds)


def changes_table(conn: psycopg.Connection[Any], table: str) -> str:
    row = conn.execute("SELECT changes_table FROM cow.registry WHERE table_name = %s", (table,)).fetchone()
    assert row is not None
    return str(row[0])


def mirrors(conn: psycopg.Connection[Any], table: str) -> list[str]:
    """Definitions of the changes table's mirrors of base indexes (`<t>_xq<hash>`), names left out."""
    rows = conn.execute(
        "SELECT regexp_replace(pg_get_indexdef(i.indexrelid), '^CREATE INDEX \\S+ ON ', '')"
        " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " WHERE i.indrelid = to_regclass('cow_changes.' || %s) AND c.relname LIKE '%%\\_xq%%' ORDER BY 1",
        (changes_table(conn, table),),
    ).fetchall()
    return [r[0] for r in rows]


def test_reads_by_an_indexed_column_find_the_session_rows_by_index(
    shop: tuple[psycopg.Connection[Any], psycopg.Connection[Any]],
) -> None:
    # The session rewrote many lines: a join of a few products to their lines on line.prod_id reads those
    # lines' versions by index, not all of the session's versions of line (once, or per product).
    plain, cow = shop
    for conn in (plain, cow):
        conn.execute("UPDATE line SET qty = qty + 10 WHERE id <= 4000")
    cow.execute("ANALYZE cow_changes." + changes_table(cow, "line"))
    sql = (
        "SELECT x.id, l.* FROM pick p JOIN prod x ON x.id = p.prod_id JOIN line l ON l.prod_id = x.id"
        " WHERE p.id < 4 ORDER BY 2"
    )
    expected = plain.execute(sql).fetchall()
    assert expected and cow.execute(sql).fetchall() == expected
    ch = changes_table(cow, "line")
    for generic in (False, True):
        cow.execute(f"SET plan_cache_mode = {'force_generic_plan' if generic else 'auto'}")
        cow.execute(f"PREPARE j{int(generic)} AS {sql}")
        plan = explain(cow, f"EXECUTE j{int(generic)}")["Plan"]
        leaf = [n for n in nodes(plan) if n.get("Relation Name") == ch and n.get("Alias", "").startswith("c")]
        assert leaf, plan
        read = sum((n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"] for n in leaf)
        assert read < 100, (generic, read, [n["Node Type"] for n in leaf])
        assert all(n["Node Type"] != "Seq Scan" for n in leaf), leaf


def test_every_base_index_but_the_key_and_plain_unique_ones_has_a_mirror(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE doc (id int PRIMARY KEY, owner int, slug text UNIQUE, body jsonb, title text)"
        )
        assert mirrors(conn, "doc") == []
        ch = changes_table(conn, "doc")
        generated = "SELECT xmin::text FROM pg_proc WHERE proname = %s"
        before = conn.execute(generated, (ch + "_upd",)).fetchone()
        # DDL on the base table (the layer's event trigger) keeps the mirrors in step: keys, access method,
        # opclass and predicate as on the base index, restricted to current, not deleted versions.
        conn.execute("CREATE INDEX doc_owner ON doc (owner)")
        conn.execute("CREATE INDEX doc_title ON doc (lower(title) text_pattern_ops) WHERE owner IS NOT NULL")
        conn.execute("CREATE INDEX doc_body ON doc USING gin (body jsonb_path_ops)")
        assert mirrors(conn, "doc") == sorted(
            [
                f"cow_changes.{ch} USING btree (_cow_session, owner)"
                " WHERE (_cow_current AND (NOT _cow_deleted))",
                f"cow_changes.{ch} USING btree (_cow_session, lower(title) text_pattern_ops)"
                " WHERE (_cow_current AND (NOT _cow_deleted) AND (owner IS NOT NULL))",
                f"cow_changes.{ch} USING gin (body jsonb_path_ops)"
                " WHERE (_cow_current AND (NOT _cow_deleted))",
            ]
        )
        conn.execute("DROP INDEX doc_owner, doc_body")
        assert len(mirrors(conn, "doc")) == 1
        # Without regenerating the triggers (of every table): a non-unique index does not change them.
        assert conn.execute(generated, (ch + "_upd",)).fetchone() == before
        # The mirrors serve a session's reads: its rows found by the same keys as the base rows.
        conn.execute(
            "INSERT INTO doc SELECT g, g % 50, 's' || g, '{}', 't' || g FROM generate_series(1, 5000) g"
        )
        conn.execute("SELECT cow.use_session('me')")
        conn.execute("UPDATE doc SET title = 'x' || title WHERE id <= 3000")
        conn.execute("ANALYZE doc")
        conn.execute(f"ANALYZE cow_changes.{ch}")
        sql = "SELECT id FROM doc WHERE lower(title) LIKE 'xt12%' AND owner IS NOT NULL ORDER BY id"
        assert [r[0] for r in conn.execute(sql)] == sorted(
            i for i in range(1, 3001) if str(i).startswith("12")
        )
        leaf = [n for n in nodes(explain(conn, sql)["Plan"]) if n.get("Relation Name") == ch]
        assert leaf and all(n["Node Type"] != "Seq Scan" for n in leaf), leaf
