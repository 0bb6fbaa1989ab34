"""``SET CONSTRAINTS <name>`` through the proxy in a session behaves as on the plain table.

Without the proxy's rewrite the name resolves to the app's own constraint, which session writes never queue
checks for: ``SET CONSTRAINTS <name> DEFERRED`` changed nothing (the transient violation failed at once) and
``IMMEDIATE`` did not check what was pending. Compared side by side with a plain database, through psycopg's
extended protocol and the simple one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from tests.fix_db import outcome
from tests.fix_proxy import RunningProxy

pytestmark = pytest.mark.timeout(60)

SCHEMA = """
CREATE TABLE slots (
    id int PRIMARY KEY,
    pos int CONSTRAINT slots_pos_key UNIQUE DEFERRABLE INITIALLY IMMEDIATE
);
CREATE TABLE owners (id int PRIMARY KEY);
CREATE TABLE pets (
    id int PRIMARY KEY,
    owner_id int CONSTRAINT pets_owner_fk REFERENCES owners (id) DEFERRABLE INITIALLY IMMEDIATE
);
INSERT INTO slots VALUES (1, 1), (2, 2);
INSERT INTO owners VALUES (1);
"""


@pytest.fixture
def pair(
    proxy: RunningProxy, layer_db: str, create_database: Callable[..., str]
) -> Iterator[tuple[str, str]]:
    plain = create_database()
    for dsn in (plain, layer_db):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
    yield proxy.dsn(layer_db, options="-c%20cow.session_id%3Dsetc"), plain


def run(dsn: str, statements: list[str], simple: bool) -> list[tuple[Any, ...]]:
    """The statements in one transaction, then COMMIT (or the ROLLBACK after an error)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if simple:
            conn.cursor_factory = psycopg.ClientCursor
        results = [outcome(conn, "BEGIN", detail=True)]
        for sql in statements:
            results.append(outcome(conn, sql, detail=True))
            if results[-1][0] == "error":
                break
        results.append(outcome(conn, "COMMIT", detail=True))
        return results


CASES = [
    # deferred, violated for a moment, fixed before COMMIT: commits in both
    [
        "SET CONSTRAINTS slots_pos_key DEFERRED",
        "UPDATE slots SET pos = 2 WHERE id = 1",
        "UPDATE slots SET pos = 1 WHERE id = 2",
    ],
    [
        "SET CONSTRAINTS public.pets_owner_fk DEFERRED",
        "INSERT INTO pets VALUES (1, 7)",
        "INSERT INTO owners VALUES (7)",
    ],
    # IMMEDIATE with a pending violation: fails at once, same SQLSTATE and constraint
    [
        "SET CONSTRAINTS slots_pos_key DEFERRED",
        "UPDATE slots SET pos = 2 WHERE id = 1",
        "SET CONSTRAINTS slots_pos_key IMMEDIATE",
    ],
    [
        "SET CONSTRAINTS pets_owner_fk, slots_pos_key DEFERRED",
        "INSERT INTO pets VALUES (2, 8)",
        "SET CONSTRAINTS pets_owner_fk IMMEDIATE",
    ],
    # still deferred at COMMIT: fails there
    ["SET CONSTRAINTS pets_owner_fk DEFERRED", "INSERT INTO pets VALUES (3, 9)"],
    # not deferred: fails at the statement
    ["UPDATE slots SET pos = 2 WHERE id = 1"],
    # PostgreSQL's own errors stay
    ["SET CONSTRAINTS no_such_constraint DEFERRED"],
    ["SET CONSTRAINTS slots_pkey DEFERRED"],
    [
        "SET CONSTRAINTS ALL DEFERRED",
        "UPDATE slots SET pos = 2 WHERE id = 1",
        "SET CONSTRAINTS ALL IMMEDIATE",
    ],
]


@pytest.mark.parametrize("simple", [False, True], ids=["extended", "simple"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_set_constraints_by_name_as_on_the_plain_table(
    pair: tuple[str, str], case: int, simple: bool
) -> None:
    session, plain = pair
    statements = CASES[case]
    expected = run(plain, statements, simple)
    assert run(session, statements, simple) == expected
    if case < 2:
        assert expected[-1] == ("ok", "COMMIT", None)
    elif case < 4:
        assert expected[-2][:2] + expected[-2][-1:] in (
            ("error", "23505", "slots_pos_key"),
            ("error", "23503", "pets_owner_fk"),
        )
    with (
        psycopg.connect(session, autocommit=True) as conn,
        psycopg.connect(plain, autocommit=True) as ref,
    ):
        for table in ("slots", "owners", "pets"):
            query = f"SELECT * FROM {table} ORDER BY id"
            assert conn.execute(query).fetchall() == ref.execute(query).fetchall(), table


def test_constraint_added_while_connected(proxy: RunningProxy, layer_db: str, pair: tuple[str, str]) -> None:
    """A deferrable constraint created by DDL elsewhere after the session connected: the catalog reloads."""
    session, plain = pair
    ddl = (
        "ALTER TABLE pets ADD CONSTRAINT pets_owner_fk2 FOREIGN KEY (owner_id) REFERENCES owners (id) "
        "DEFERRABLE INITIALLY IMMEDIATE"
    )
    statements = [
        "BEGIN",
        "SET CONSTRAINTS pets_owner_fk, pets_owner_fk2 DEFERRED",
        "INSERT INTO pets VALUES (5, 50)",
        "INSERT INTO owners VALUES (50)",
        "COMMIT",
    ]
    with psycopg.connect(session, autocommit=True) as conn, psycopg.connect(plain, autocommit=True) as ref:
        assert outcome(conn, "SET CONSTRAINTS pets_owner_fk DEFERRED") == ("ok", "SET CONSTRAINTS", None)
        for dsn in (plain, layer_db):
            with psycopg.connect(dsn, autocommit=True) as direct:
                direct.execute(ddl)
        expected = [outcome(ref, sql, detail=True) for sql in statements]
        assert expected[-1] == ("ok", "COMMIT", None)
        assert [outcome(conn, sql, detail=True) for sql in statements] == expected
