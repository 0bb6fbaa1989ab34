"""Referential actions inside a session, side by side with the plain tables."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.layer.test_semantics import Pair

SCHEMA = """
CREATE TABLE dept (id int PRIMARY KEY, code text UNIQUE NOT NULL);
INSERT INTO dept VALUES (0, 'none'), (1, 'eng'), (2, 'ops'), (3, 'hr');
CREATE TABLE emp (
    id int PRIMARY KEY,
    dept_null int DEFAULT 0 REFERENCES dept ON DELETE SET NULL ON UPDATE SET NULL,
    dept_default int DEFAULT 0 REFERENCES dept ON DELETE SET DEFAULT ON UPDATE SET DEFAULT,
    dept_code text REFERENCES dept (code) ON DELETE RESTRICT ON UPDATE CASCADE,
    boss int REFERENCES emp ON DELETE CASCADE
);
INSERT INTO emp VALUES
    (1, 1, 1, 'eng', NULL), (2, 2, 2, 'ops', 1), (3, 1, 2, NULL, 2), (4, NULL, NULL, 'hr', 4);
CREATE TABLE badge (id int PRIMARY KEY, emp_id int REFERENCES emp ON DELETE NO ACTION);
INSERT INTO badge VALUES (1, 3);
CREATE TABLE audit (emp_id int REFERENCES emp ON DELETE CASCADE, what text);
INSERT INTO audit VALUES (2, 'no primary key: stays plain');
"""


@pytest.fixture
def fk(plain_db: str, layer_db: str) -> Iterator[Pair]:
    with (
        psycopg.connect(plain_db, autocommit=True) as plain,
        psycopg.connect(layer_db, autocommit=True) as cow,
    ):
        plain.execute(SCHEMA)
        cow.execute(SCHEMA)
        cow.execute("SELECT cow.use_session('fk', 'op')")
        yield Pair(plain, cow)


def test_set_null_and_set_default_on_delete(fk: Pair) -> None:
    assert (
        fk.both("DELETE FROM dept WHERE id = 1")[0] == "error"
    )  # RESTRICT (23001 from PG 18 on, else 23503)
    fk.both("UPDATE emp SET dept_code = NULL WHERE id = 1")
    fk.both("DELETE FROM dept WHERE id = 1 RETURNING *")
    fk.same_table("emp")
    fk.both("DELETE FROM dept WHERE id = 2")  # RESTRICT on 'ops'
    fk.same_table("emp")


def test_on_update_actions(fk: Pair) -> None:
    fk.both("UPDATE dept SET code = 'engineering' WHERE id = 1")  # ON UPDATE CASCADE to dept_code
    fk.same_table("emp")
    fk.both("UPDATE dept SET id = 7 WHERE id = 2")  # SET NULL / SET DEFAULT on emp
    fk.same_table("emp")
    fk.same_table("dept")


def test_self_reference_cascade_and_no_action(fk: Pair) -> None:
    # badge 1 references emp 3 (boss chain); the chain cascades into keyless audit too.
    assert fk.both("DELETE FROM emp WHERE id = 1") == ("error", "23503")
    fk.same_table("audit", order="emp_id")
    fk.both("DELETE FROM badge")
    fk.both("INSERT INTO emp VALUES (5, NULL, NULL, NULL, 5) RETURNING *")  # references itself
    fk.both("DELETE FROM emp WHERE id = 5")
    fk.same_table("emp")


def test_cascade_into_a_keyless_child(fk: Pair) -> None:
    # audit has no primary key: a keyless table (a multiset of row values); the session cascades into it.
    assert fk.cow.execute("SELECT pk_columns FROM cow.tables WHERE table_name = 'audit'").fetchone() == ([],)
    fk.both("INSERT INTO audit VALUES (2, 'no primary key: stays plain'), (3, 'other') RETURNING *")
    assert fk.both("DELETE FROM emp WHERE id = 2") == ("error", "23503")  # badge references emp 3 (boss 2)
    fk.both("DELETE FROM badge")
    fk.both("DELETE FROM emp WHERE id = 2 RETURNING *")  # cascades to emp 3 and both's audit rows
    fk.same_table("emp")
    fk.same_table("audit", order="emp_id, what")


def test_no_action_is_checked_at_the_end_of_the_statement(fk: Pair) -> None:
    for conn in (fk.plain, fk.cow):
        conn.execute("CREATE TABLE node (id int PRIMARY KEY, up int REFERENCES node)")  # NO ACTION
        conn.execute("INSERT INTO node VALUES (1, NULL), (2, 1), (3, 2), (4, 1)")
    assert fk.both("DELETE FROM node WHERE id = 2") == ("error", "23503")
    assert fk.both("UPDATE node SET id = 20 WHERE id = 2") == ("error", "23503")
    fk.both("DELETE FROM node WHERE id IN (2, 3) RETURNING id")  # the whole subtree in one statement
    fk.both("UPDATE node SET id = 10 WHERE id = 4 RETURNING *")  # nothing references 4
    fk.both("DELETE FROM node RETURNING id")
    fk.same_table("node")
