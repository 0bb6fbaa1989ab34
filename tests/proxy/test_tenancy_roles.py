"""Roles on a tagged connection: ``SET [LOCAL] ROLE`` / ``RESET ROLE`` as PostgREST sends them per request.

A non-superuser login role (PostgREST's authenticator: NOINHERIT, a member of the request roles) connects
through the proxy into a session and switches roles; every statement gets what it gets on the plain table
(privileges of the current role, PostgreSQL's SQLSTATEs), the connection stays in its session whatever the
role, and the writes land in the session, never in the base table.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from tests.fix_proxy import RunningProxy

BOTH_RELAYS = True

SUFFIX = f"{os.getpid()}"
LOGIN = f"cowt_login_{SUFFIX}"
WRITER = f"cowt_writer_{SUFFIX}"
READER = f"cowt_reader_{SUFFIX}"
OUTSIDER = f"cowt_outsider_{SUFFIX}"

ROLES = f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{LOGIN}') THEN
        CREATE ROLE {LOGIN} LOGIN NOINHERIT;
        CREATE ROLE {WRITER} NOLOGIN;
        CREATE ROLE {READER} NOLOGIN;
        CREATE ROLE {OUTSIDER} NOLOGIN;
        GRANT {WRITER}, {READER} TO {LOGIN};
    END IF;
END $$;
"""

SCHEMA = f"""
CREATE TABLE docs (id serial PRIMARY KEY, body text NOT NULL);
INSERT INTO docs (body) VALUES ('one'), ('two');
GRANT SELECT, INSERT, UPDATE, DELETE ON docs TO {WRITER};
GRANT USAGE ON SEQUENCE docs_id_seq TO {WRITER};
GRANT SELECT ON docs TO {READER};
"""

# (statement, parameters) in order, on one connection, as the login role.
STEPS: list[tuple[str, tuple[Any, ...] | None]] = [
    ("SELECT current_user = session_user", None),
    ("SELECT count(*) FROM docs", None),  # the login role itself has no privilege: 42501
    ("BEGIN", None),
    (f"SET LOCAL ROLE {WRITER}", None),
    ("INSERT INTO docs (body) VALUES (%s) RETURNING id, body", ("three",)),
    ("UPDATE docs SET body = body || '!' WHERE id = 1", None),
    ("SELECT current_user::text", None),
    ("COMMIT", None),
    ("SELECT current_user = session_user", None),  # SET LOCAL ended with the transaction
    (f"SET ROLE {READER}", None),
    ("SELECT id, body FROM docs ORDER BY id", None),
    ("INSERT INTO docs (body) VALUES ('four')", None),  # the reader may not insert: 42501
    ("DELETE FROM docs WHERE id = 2", None),
    (f"SET ROLE {OUTSIDER}", None),  # not a member: 42501 from PostgreSQL
    ("SET ROLE NONE", None),
    ("SELECT current_user = session_user", None),
    (f"SELECT set_config('role', '{WRITER}', false)", None),
    ("DELETE FROM docs WHERE id = 2", None),
    ("RESET ROLE", None),
    ("SELECT current_user = session_user", None),
]


@pytest.fixture
def role_dbs(layer_db: str, create_database: Callable[..., str]) -> tuple[str, str]:
    """(a database with the layer, a plain one), both with ``docs`` and the roles' grants."""
    plain = create_database()
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(ROLES)
    for dsn in (layer_db, plain):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
    return layer_db, plain


def as_login(dsn: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=f"{LOGIN}@{parts.hostname}:{parts.port}"))


def step(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...] | None) -> tuple[Any, ...]:
    """("ok", status, rows or None) or ("error", SQLSTATE, message) of one statement."""
    try:
        cur = conn.execute(sql, params)
    except psycopg.Error as exc:
        return ("error", exc.diag.sqlstate, exc.diag.message_primary)
    return ("ok", cur.statusmessage, cur.fetchall() if cur.description else None)


def run_steps(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return [step(conn, sql, params) for sql, params in STEPS]


def test_role_switches_in_a_session_behave_as_on_the_plain_table(
    proxy: RunningProxy, role_dbs: tuple[str, str]
) -> None:
    layer, plain = role_dbs
    with psycopg.connect(as_login(plain), autocommit=True) as conn:
        expected = run_steps(conn)
    dsn = as_login(proxy.dsn(layer, application_name="cow:roles"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        got = run_steps(conn)
        # whatever the role, the connection stayed in its session
        assert conn.execute("SELECT current_setting('cow.session_id')").fetchone() == ("roles",)
    # the one difference: PostgreSQL names the relation whose privilege is missing, in a session the overlay
    # view (docs/layer.md, "Tenancy in a session")
    assert [tuple(str(x).replace("for view docs", "for table docs") for x in g) for g in got] == [
        tuple(str(x) for x in e) for e in expected
    ]
    assert [step[1] for step in expected if step[0] == "error"] == ["42501"] * 4
    with psycopg.connect(layer, autocommit=True) as conn:
        assert conn.execute("SELECT id, body FROM docs ORDER BY id").fetchall() == [(1, "one"), (2, "two")]
        written = conn.execute(
            "SELECT pk->>'id', deleted, row_data->>'body' FROM cow.session_changes('roles') ORDER BY seq"
        ).fetchall()
    assert written == [("3", False, "three"), ("1", False, "one!"), ("2", True, None)]
