"""App columns named like the aliases of the layer's own SQL (b, c, t, y, ...).

In SQL, ``to_jsonb(c) FROM tbl c`` is the *column* ``c`` when the table has one, not the row: the layer
once read a changed row's snapshot, a session's changes and commit's conflict check that way, and got a
column's value (or a 42702) instead of the row for tables with such columns. Every statement here also
runs on a plain copy; the session's changes, its diff and its commit must describe whole rows.
"""

from __future__ import annotations

import psycopg

from tests.fix_layer import commit_conflicts
from tests.layer.test_semantics import session_pair

DDL = """
CREATE TABLE alias_cols (id int PRIMARY KEY, b int, c int, t int, y int, x int, s text, k int, r int);
INSERT INTO alias_cols SELECT g, g, g * 2, g * 3, g * 4, g * 5, 's' || g, g, g FROM generate_series(1, 4) g;
CREATE TABLE alias_loose (b int NOT NULL, c text, t int, y int);
"""
WRITES = [
    "UPDATE alias_cols SET b = 100, y = NULL WHERE id = 1",
    "UPDATE alias_cols SET c = c + 1 WHERE id = 1",
    "UPDATE alias_cols SET t = -t WHERE id = 2",
    "DELETE FROM alias_cols WHERE id = 3",
    "INSERT INTO alias_cols (id, b, c, s) VALUES (9, 9, 18, 'new')",
    "INSERT INTO alias_loose VALUES (1, 'one', 2, 3), (1, 'one', 2, 3)",
]


def test_columns_named_like_the_layers_aliases(plain_db: str, layer_db: str) -> None:
    with session_pair(plain_db, layer_db, DDL) as pair:
        for sql in WRITES:
            pair.both(sql)
        pair.same_table("alias_cols")
        pair.same_table("alias_loose", "b")
        rows = pair.cow.execute(
            "SELECT table_name, row_data FROM cow.session_changes('s1') WHERE NOT deleted ORDER BY seq"
        ).fetchall()
        assert {name for name, _ in rows} == {"alias_cols", "alias_loose"}
        for _, row in rows:
            assert isinstance(row, dict) and {"b", "c", "t", "y"} <= row.keys(), row
        assert rows[1][1] == {"id": 1, "b": 100, "c": 3, "t": 3, "y": None, "x": 5, "s": "s1", "k": 1, "r": 1}
        diff = pair.cow.execute(
            "SELECT action, old_row, new_row FROM cow.session_diff('s1') "
            "WHERE table_name = 'alias_cols' ORDER BY pk ->> 'id'"
        ).fetchall()
        assert [d[0] for d in diff] == ["update", "update", "delete", "insert"]
        assert diff[0][1]["b"] == 1 and diff[0][2]["b"] == 100
        pair.cow.execute("SELECT cow.use_session(NULL)")
        pair.cow.execute("SELECT cow.commit_session('s1')")
        pair.same_table("alias_cols")
        pair.same_table("alias_loose", "b")


def test_commit_still_sees_a_conflict_on_such_a_table(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(DDL)
        update = "UPDATE alias_cols SET {} WHERE id = 4"
        assert "alias_cols" in commit_conflicts(conn, "s2", update.format("b = 7"), update.format("c = 0"))
        conn.execute("SELECT cow.commit_session('s2', on_conflict => 'overwrite')")
        assert conn.execute("SELECT b, c FROM alias_cols WHERE id = 4").fetchone() == (7, 8)
