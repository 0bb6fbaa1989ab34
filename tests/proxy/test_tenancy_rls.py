"""Row-level security in a session, side by side with the plain table, as non-superuser roles.

The same statements run on a plain database (directly) and on a database with the layer (through the proxy,
in a session), as a login role that switches between request roles (PostgREST's authenticator). Policies on
a setting (``app.tenant``), on ``current_user``, on a JWT claim (``request.jwt.claims``), permissive and
restrictive, per command and per role, with WITH CHECK on INSERT and UPDATE: every result, row count and
error is the plain table's, also for rows the session itself inserted or updated; the base tables never
change.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from tests.fix_db import outcome
from tests.fix_proxy import RunningProxy

SUFFIX = f"{os.getpid()}"
LOGIN = f"cowr_login_{SUFFIX}"
WRITER = f"cowr_writer_{SUFFIX}"
READER = f"cowr_reader_{SUFFIX}"
AUTHENTICATED = f"cowr_authenticated_{SUFFIX}"
ANON = f"cowr_anon_{SUFFIX}"

ROLES = f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{LOGIN}') THEN
        CREATE ROLE {LOGIN} LOGIN NOINHERIT;
        CREATE ROLE {WRITER} NOLOGIN;
        CREATE ROLE {READER} NOLOGIN;
        CREATE ROLE {AUTHENTICATED} NOLOGIN;
        CREATE ROLE {ANON} NOLOGIN;
        GRANT {WRITER}, {READER}, {AUTHENTICATED}, {ANON} TO {LOGIN};
    END IF;
END $$;
"""

SCHEMA = f"""
CREATE TABLE notes (
    id serial PRIMARY KEY,
    tenant text NOT NULL DEFAULT current_setting('app.tenant', true),
    owner name NOT NULL DEFAULT current_user,
    body text NOT NULL,
    secret boolean NOT NULL DEFAULT false
);
INSERT INTO notes (tenant, owner, body, secret) VALUES
    ('t1', '{WRITER}', 'one', false), ('t1', '{WRITER}', 'two', true), ('t2', '{WRITER}', 'three', false),
    ('t1', 'someone', 'four', false), ('t2', 'someone', 'five', true);
ALTER TABLE notes ENABLE ROW LEVEL SECURITY;
ALTER TABLE notes FORCE ROW LEVEL SECURITY;
-- a setting: every role sees its tenant's rows
CREATE POLICY tenant_rows ON notes USING (tenant = current_setting('app.tenant', true));
-- current_user: the writer updates only its own rows, and keeps them its own and in its tenant
CREATE POLICY own_updates ON notes AS RESTRICTIVE FOR UPDATE TO {WRITER}
    USING (owner = current_user)
    WITH CHECK (owner = current_user AND tenant = current_setting('app.tenant', true));
-- per role and command: the reader never sees secret rows
CREATE POLICY no_secrets ON notes AS RESTRICTIVE FOR SELECT TO {READER} USING (NOT secret);
-- restrictive WITH CHECK on INSERT for everyone
CREATE POLICY short_bodies ON notes AS RESTRICTIVE FOR INSERT WITH CHECK (length(body) < 20);
CREATE POLICY deletes_own ON notes AS RESTRICTIVE FOR DELETE USING (owner = current_user);
GRANT SELECT, INSERT, UPDATE, DELETE ON notes TO {WRITER};
GRANT SELECT ON notes TO {READER};
GRANT USAGE ON SEQUENCE notes_id_seq TO {WRITER};

CREATE TABLE todos (
    id serial PRIMARY KEY,
    user_id text NOT NULL DEFAULT (current_setting('request.jwt.claims', true)::jsonb ->> 'sub'),
    task text NOT NULL,
    done boolean NOT NULL DEFAULT false
);
INSERT INTO todos (user_id, task, done) VALUES ('u1', 'buy milk', false), ('u2', 'walk dog', true),
    ('u1', 'file taxes', true);
ALTER TABLE todos ENABLE ROW LEVEL SECURITY;
-- a JWT claim, PostgREST style
CREATE POLICY todos_own ON todos TO {AUTHENTICATED}
    USING (user_id = (current_setting('request.jwt.claims', true)::jsonb ->> 'sub'));
CREATE POLICY todos_public ON todos FOR SELECT TO {ANON} USING (done);
GRANT SELECT, INSERT, UPDATE, DELETE ON todos TO {AUTHENTICATED};
GRANT SELECT ON todos TO {ANON};
GRANT USAGE ON SEQUENCE todos_id_seq TO {AUTHENTICATED};
"""

Step = tuple[str, tuple[Any, ...] | None]


def tenant(role: str, name: str) -> list[Step]:
    return [(f"SET ROLE {role}", None), ("SELECT set_config('app.tenant', %s, false)", (name,))]


NOTES: list[Step] = [
    *tenant(WRITER, "t1"),
    ("SELECT id, tenant, owner::text, body, secret FROM notes ORDER BY id", None),
    ("INSERT INTO notes (body) VALUES ('t1 new') RETURNING id, tenant, owner::text, body", None),
    ("INSERT INTO notes (body, secret) VALUES ('t1 secret', true)", None),
    ("INSERT INTO notes (tenant, body) VALUES ('t2', 'smuggled')", None),  # WITH CHECK of tenant_rows: 42501
    ("INSERT INTO notes (body) VALUES ('a body much too long to pass')", None),  # restrictive: 42501, named
    ("UPDATE notes SET body = body || '!' RETURNING id, body", None),  # own rows only (own_updates)
    ("UPDATE notes SET tenant = 't2' WHERE body = 'one!'", None),  # WITH CHECK of own_updates: 42501
    ("UPDATE notes SET owner = 'someone' WHERE id = 1", None),
    ("UPDATE notes SET body = 'four?' WHERE body = 'four'", None),  # not its own: UPDATE 0
    ("DELETE FROM notes WHERE body = 'four'", None),  # deletes_own hides it: DELETE 0
    ("DELETE FROM notes WHERE body = 't1 secret' RETURNING id", None),
    ("SELECT id, tenant, owner::text, body, secret FROM notes ORDER BY id", None),
    ("SELECT count(*) FROM notes", None),
    ("SELECT count(*) FROM notes WHERE secret", None),
    *tenant(WRITER, "t2"),
    # the session's own t1 rows are invisible to t2, as on the plain table
    ("SELECT id, tenant, owner::text, body, secret FROM notes ORDER BY id", None),
    ("INSERT INTO notes (body, secret) VALUES ('t2 new', true) RETURNING id, tenant", None),
    ("SELECT id, body FROM notes WHERE id > 3 ORDER BY id", None),
    ("SELECT n.body, m.body FROM notes n JOIN notes m ON m.id = n.id + 1 ORDER BY n.id", None),
    *tenant(READER, "t1"),
    ("SELECT id, tenant, owner::text, body, secret FROM notes ORDER BY id", None),  # no secret rows
    ("SELECT body FROM notes WHERE id = 2", None),
    ("INSERT INTO notes (body) VALUES ('reader')", None),  # no privilege: 42501
    ("UPDATE notes SET body = 'x'", None),
    *tenant(READER, "t3"),
    ("SELECT count(*) FROM notes", None),
    ("RESET ROLE", None),
    ("SELECT set_config('app.tenant', 't1', false)", None),
]


def request(role: str, claims: dict[str, Any] | None, *statements: Step) -> list[Step]:
    """One PostgREST request: a transaction with its role and claims set locally."""
    steps: list[Step] = [("BEGIN", None), (f"SET LOCAL ROLE {role}", None)]
    if claims is not None:
        steps.append(("SELECT set_config('request.jwt.claims', %s, true)", (json.dumps(claims),)))
    return [*steps, *statements, ("COMMIT", None)]


TODOS: list[Step] = [
    *request(AUTHENTICATED, {"sub": "u1", "role": "authenticated"},
             ("SELECT id, user_id, task, done FROM todos ORDER BY id", None),
             ("INSERT INTO todos (task) VALUES (%s) RETURNING id, user_id, task, done", ("call mom",)),
             ("UPDATE todos SET done = true WHERE task = %s RETURNING id, done", ("buy milk",))),
    *request(AUTHENTICATED, {"sub": "u2", "role": "authenticated"},
             ("SELECT id, user_id, task, done FROM todos ORDER BY id", None),  # no u1 rows, not the session's
             ("UPDATE todos SET task = 'hijacked' WHERE user_id = 'u1'", None),  # UPDATE 0
             ("INSERT INTO todos (user_id, task) VALUES ('u1', 'forged')", None),  # WITH CHECK: 42501
             ("DELETE FROM todos WHERE id = 2 RETURNING id", None)),
    *request(AUTHENTICATED, {"sub": "u1", "role": "authenticated"},
             ("SELECT id, user_id, task, done FROM todos ORDER BY id", None),
             ("DELETE FROM todos WHERE task = 'file taxes'", None),
             ("SELECT count(*) FROM todos", None)),
    *request(ANON, None,
             ("SELECT id, user_id, task, done FROM todos ORDER BY id", None),  # done rows, also the session's
             ("INSERT INTO todos (user_id, task) VALUES ('anon', 'x')", None)),  # no privilege: 42501
    ("SELECT current_user = session_user", None),
]  # fmt: skip


@pytest.fixture
def rls_dbs(layer_db: str, create_database: Callable[..., str]) -> tuple[str, str]:
    """(a database with the layer, a plain one), both with the schema above."""
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


def run(dsn: str, steps: list[Step]) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [(sql, *_step(conn, sql, params)) for sql, params in steps]


def _step(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...] | None) -> tuple[Any, ...]:
    """A step's outcome; a failed one inside the steps' own transaction ends it, as a client would."""
    seen = outcome(conn, sql, params)
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
        conn.execute("ROLLBACK")
    return seen


def base_rows(dsn: str, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()


@pytest.mark.parametrize(("table", "steps"), [("notes", NOTES), ("todos", TODOS)], ids=["notes", "todos"])
def test_policies_apply_in_a_session_as_on_the_plain_table(
    proxy: RunningProxy, rls_dbs: tuple[str, str], table: str, steps: list[Step]
) -> None:
    layer, plain = rls_dbs
    before = base_rows(layer, table)
    expected = run(as_login(plain), steps)
    got = run(as_login(proxy.dsn(layer, application_name=f"cow:rls-{table}")), steps)
    for want, seen in zip(expected, got, strict=True):
        # one difference: a missing privilege names the overlay view (docs/layer.md, "Tenancy in a session")
        assert tuple(x.replace("for view", "for table") if isinstance(x, str) else x for x in seen) == want
    assert sum(1 for step in expected if step[1] == "error") >= 3  # the refusals are exercised
    assert base_rows(layer, table) == before
    with psycopg.connect(layer, autocommit=True) as conn:
        written = conn.execute("SELECT count(*) FROM cow.session_changes(%s)", (f"rls-{table}",)).fetchone()
    assert written is not None and written[0] > 0


def test_session_rows_of_other_tenants_are_invisible_without_the_proxy(rls_dbs: tuple[str, str]) -> None:
    """The layer alone (``cow.use_session`` by a trusted client): the session's rows follow the policies."""
    layer, _ = rls_dbs
    with psycopg.connect(as_login(layer), autocommit=True) as conn:
        conn.execute("SELECT cow.use_session('rls-direct')")
        conn.execute(f"SET ROLE {WRITER}")
        conn.execute("SET app.tenant = 't1'")
        conn.execute("INSERT INTO notes (body) VALUES ('only t1')")
        assert conn.execute("SELECT count(*) FROM notes WHERE body = 'only t1'").fetchone() == (1,)
        conn.execute("SET app.tenant = 't2'")
        assert conn.execute("SELECT count(*) FROM notes WHERE body = 'only t1'").fetchone() == (0,)
        assert conn.execute("SELECT body FROM notes ORDER BY id").fetchall() == [("three",), ("five",)]
        conn.execute("RESET ROLE")
        conn.execute("RESET app.tenant")
        # the login role (NOINHERIT) has no privilege of its own
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT count(*) FROM notes")


def test_insert_returning_a_row_the_role_cannot_see(proxy: RunningProxy, rls_dbs: tuple[str, str]) -> None:
    """PostgreSQL checks an INSERT's new row against the SELECT policies when it has RETURNING (42501, the
    restrictive policy named): so does the session; without RETURNING, or of a row it may see, it inserts."""
    layer, plain = rls_dbs
    for dsn in (plain, layer):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                f"GRANT INSERT ON notes TO {READER}; GRANT USAGE ON SEQUENCE notes_id_seq TO {READER}"
            )
    steps: list[Step] = [
        *tenant(READER, "t1"),
        ("INSERT INTO notes (body, secret) VALUES ('hidden', true) RETURNING id", None),
        ("INSERT INTO notes (body, secret) VALUES (%s, true) RETURNING id", ("hidden, bound",)),
        (
            "WITH n AS (INSERT INTO notes (body, secret) VALUES ('in a CTE', true) RETURNING id) SELECT 1",
            None,
        ),
        ("INSERT INTO notes (body, secret) VALUES ('not returned', true)", None),
        ("INSERT INTO notes (body) VALUES ('seen') RETURNING tenant, body, secret", None),
        (
            "INSERT INTO notes (body, secret) VALUES ('two rows', false), ('two rows', true) RETURNING body",
            None,
        ),
        ("SELECT body FROM notes WHERE id > 5 ORDER BY id", None),
        ("RESET ROLE", None),
    ]
    expected = run(as_login(plain), steps)
    got = run(as_login(proxy.dsn(layer, application_name="cow:rls-returning")), steps)
    assert got == expected
    assert [step[1] for step in expected].count("error") == 4  # the refusals are exercised
    with psycopg.connect(layer, autocommit=True) as conn:
        written = conn.execute(
            "SELECT row_data->>'body' FROM cow.session_changes('rls-returning') ORDER BY seq"
        ).fetchall()
    assert written == [("not returned",), ("seen",)]
