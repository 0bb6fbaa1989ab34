"""The binding of a backend to its session (``cow.bind_session``, docs/threat-model.md): SQL on a bound
connection cannot leave, switch or widen its session, nor manage the layer; an unbound connection keeps the
no-proxy path (``cow.use_session``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from tests.fix_db import install_layer_at
from tests.layer.test_cli import cli, one_error_line

SECRET = "s3cret-binding-for-tests-0123456789"
NOBODY = f"cowt_nobody_{os.getpid()}"


def as_role(dsn: str, role: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}"))


def sql_state(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...] | None = None) -> str | None:
    """The SQLSTATE ``sql`` fails with (None: it succeeded)."""
    try:
        conn.execute(sql, params)
    except psycopg.Error as exc:
        return exc.diag.sqlstate
    return None


def base_rows(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT id, email, name, score FROM public.customers ORDER BY id").fetchall()


def session_keys(dsn: str, session: str) -> list[Any]:
    """The keys a session wrote, read by an unbound connection."""
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT pk FROM cow.session_keys(%s) ORDER BY 1", (session,))]


@pytest.fixture
def db(layer_db: str) -> str:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute("SELECT cow.set_bind_secret(%s)", (SECRET,))
    return layer_db


@pytest.fixture
def bound(db: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection bound to session ``s1``."""
    with psycopg.connect(db, autocommit=True) as conn:
        assert conn.execute("SELECT cow.bind_session('s1', NULL, %s)", (SECRET,)).fetchone() == ("s1",)
        yield conn


def test_bind_sets_the_session_like_use_session(db: str, bound: psycopg.Connection[Any]) -> None:
    assert bound.execute(
        "SELECT cow.bound_session(), cow.current_session(), current_setting('cow.session_id'),"
        " current_setting('search_path')"
    ).fetchone() == ("s1", "s1", "s1", '"$user", cow_overlay_public, public')
    bound.execute("UPDATE customers SET score = 7 WHERE id = 1")
    assert bound.execute("SELECT score FROM customers WHERE id = 1").fetchone() == (7,)
    assert session_keys(db, "s1") == [{"id": 1}]
    assert base_rows(db)[0][3] == 0


@pytest.mark.parametrize(
    "escape",
    [
        "SELECT set_config('cow.session_id', '', false)",
        "SELECT set_config('cow.session_id', 's2', false)",
        "SET cow.session_id = 's2'",
        "RESET cow.session_id",
        "RESET ALL",
        "DO $$ BEGIN PERFORM set_config('cow.' || 'session_id', 's2', false); END $$",
        "SELECT app_switch('s2')",
        "SELECT app_switch('')",
    ],
)
def test_no_sql_moves_a_bound_connection_out_of_its_session(
    db: str, bound: psycopg.Connection[Any], escape: str
) -> None:
    with psycopg.connect(db, autocommit=True) as owner:
        # An application function that sets a GUC by a computed name (what statement analysis cannot see).
        owner.execute(
            "CREATE FUNCTION app_switch(v text) RETURNS text LANGUAGE sql"
            " AS $$ SELECT set_config('cow.' || 'session_id', v, false) $$"
        )
    before = base_rows(db)
    bound.execute(escape)
    assert bound.execute("SELECT cow.bound_session(), cow.current_session()").fetchone() == ("s1", "s1")
    # Writes land in the bound session (unqualified names still resolve to the overlay, or RESET ALL put the
    # base tables first: the guard refuses those), reads in another session are refused.
    state = sql_state(bound, "INSERT INTO customers (email, name) VALUES ('e@x', 'E')")
    assert state in (None, "42501")
    assert sql_state(bound, "UPDATE public.customers SET score = 1 WHERE id = 2") == "42501"
    read = sql_state(bound, "SELECT count(*) FROM cow_overlay_public.customers")
    guc = bound.execute("SELECT current_setting('cow.session_id', true)").fetchone()
    assert read == (None if guc == ("s1",) else "42501")
    assert (
        sql_state(bound, "INSERT INTO cow_overlay_public.customers (email, name) VALUES ('f@x', 'F')") is None
    )
    assert base_rows(db) == before
    assert len(session_keys(db, "s1")) == (2 if state is None else 1)
    assert session_keys(db, "s2") == []
    # Setting the GUC back makes the reads work again.
    bound.execute("SELECT cow.use_session('s1')")
    assert bound.execute("SELECT count(*) FROM cow_overlay_public.customers").fetchone() == (
        3 + len(session_keys(db, "s1")),
    )


def test_discard_all_leaves_the_binding(db: str, bound: psycopg.Connection[Any]) -> None:
    bound.execute("DISCARD ALL")
    assert bound.execute("SELECT cow.bound_session()").fetchone() == ("s1",)
    # search_path is the default again: the base table, which refuses the bound connection's writes.
    assert sql_state(bound, "UPDATE customers SET score = 1 WHERE id = 2") == "42501"
    assert sql_state(bound, "TRUNCATE customers CASCADE") == "42501"
    assert sql_state(bound, "SELECT * FROM cow_overlay_public.customers") == "42501"
    assert base_rows(db)[1][3] == 0


def test_a_bound_backend_keeps_the_temporary_schema_the_guard_looks_for(
    bound: psycopg.Connection[Any],
) -> None:
    """The guard asks cow._bound() only of backends with a temporary schema: the bind made one, and nothing
    on the connection takes it away; catalog answers leave it out while it is empty."""
    for escape in ("DISCARD ALL", "DISCARD TEMP", "RESET ALL"):
        bound.execute(escape)
        assert bound.execute("SELECT pg_my_temp_schema() <> 0").fetchone() == (True,), escape
        assert sql_state(bound, "DELETE FROM public.customers") == "42501", escape
    schemas = bound.execute("SELECT cow.current_schemas(true)::text").fetchone()
    assert schemas is not None and "pg_temp" not in schemas[0]
    bound.execute("CREATE TEMP TABLE scratch (x int)")  # the application's own: shown, as on the plain tables
    schemas = bound.execute("SELECT cow.current_schemas(true)::text").fetchone()
    assert schemas is not None and "pg_temp" in schemas[0]


def test_use_session_and_operations_on_a_bound_connection(db: str, bound: psycopg.Connection[Any]) -> None:
    assert sql_state(bound, "SELECT cow.use_session('s2')") == "42501"
    assert sql_state(bound, "SELECT cow.use_session(NULL)") == "42501"
    # Its own session again, with another operation: allowed (a relabel within the session).
    assert sql_state(bound, "SELECT cow.use_session('s1', 'op-b')") is None
    bound.execute("UPDATE customers SET score = 2 WHERE id = 2")
    bound.execute("SELECT cow.use_operation('op-c')")
    bound.execute("UPDATE customers SET score = 3 WHERE id = 3")
    bound.execute("SET cow.operation_id = 'op-d'")
    bound.execute("UPDATE customers SET score = 4 WHERE id = 1")
    with psycopg.connect(db) as conn:
        ops = conn.execute("SELECT operation_id FROM cow.session_changes('s1') ORDER BY seq").fetchall()
    assert ops == [("op-b",), ("op-c",), ("op-d",)]


def test_wrong_or_missing_secret(db: str, layer_db: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        assert sql_state(conn, "SELECT cow.bind_session('s1', NULL, 'wrong-secret-0123456789')") == "28P01"
        assert sql_state(conn, "SELECT cow.bind_session('s1', NULL, NULL)") == "28P01"
        assert conn.execute("SELECT cow.bound_session(), cow.current_session()").fetchone() == (None, None)
        conn.execute("SELECT cow.bind_session('s1', NULL, %s)", (SECRET,))
        # Rebinding or unbinding needs the secret too.
        assert sql_state(conn, "SELECT cow.bind_session('s2', NULL, 'nope')") == "28P01"
        assert sql_state(conn, "SELECT cow.bind_session(NULL, NULL, 'nope')") == "28P01"
        assert conn.execute("SELECT cow.bound_session()").fetchone() == ("s1",)
        conn.execute("SELECT cow.bind_session('s2', 'op', %s)", (SECRET,))
        assert conn.execute("SELECT cow.bound_session(), current_setting('cow.operation_id')").fetchone() == (
            "s2",
            "op",
        )
        conn.execute("SELECT cow.bind_session(NULL, NULL, %s)", (SECRET,))
        assert conn.execute(
            "SELECT cow.bound_session(), cow.current_session(), current_setting('search_path')"
        ).fetchone() == (None, None, '"$user", public')
        # Unbound: the no-proxy path again.
        conn.execute("SELECT cow.use_session('s3')")
        conn.execute("UPDATE customers SET score = 9 WHERE id = 3")
    assert session_keys(db, "s3") == [{"id": 3}]
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("DELETE FROM cow.bind_secret")
        assert sql_state(conn, "SELECT cow.bind_session('s1', NULL, %s)", (SECRET,)) == "28P01"


def test_a_binding_is_not_inherited_by_a_later_backend_with_the_same_pid(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        # What a backend that ended while bound leaves behind, under this backend's pid (as if reused).
        conn.execute(
            "INSERT INTO cow.bindings (pid, backend_start, token, session)"
            " VALUES (pg_backend_pid(), now() - interval '1 hour', 'old-token', 'dead')"
        )
        assert conn.execute("SELECT cow.bound_session(), cow.current_session()").fetchone() == (None, None)
        # A backend that never bound has no temporary schema (the bind makes one): the row is not even read.
        conn.execute("SET cow._bind_token = 'old-token'")
        assert conn.execute("SELECT cow.bound_session()").fetchone() == (None,)
        # With one of its own, the token is only a shortcut for the bound one.
        conn.execute("CREATE TEMPORARY TABLE scratch (x int)")
        assert conn.execute("SELECT cow.bound_session()").fetchone() == ("dead",)
        conn.execute("RESET cow._bind_token")
        assert conn.execute("SELECT cow.bound_session(), cow.current_session()").fetchone() == (None, None)
        conn.execute("SELECT cow.use_session('s4')")
        conn.execute("UPDATE customers SET score = 1 WHERE id = 1")
        # Binding replaces the stale row; then the token may go, the start time still proves the binding.
        conn.execute("SELECT cow.bind_session('s5', NULL, %s)", (SECRET,))
        conn.execute("RESET cow._bind_token")
        assert conn.execute("SELECT cow.bound_session()").fetchone() == ("s5",)
    assert session_keys(db, "s4") == [{"id": 1}]


@pytest.mark.parametrize(
    "call",
    [
        "SELECT cow.commit_session('s1')",
        "SELECT cow.commit_session('other')",
        "SELECT cow.discard_session('s1')",
        "SELECT cow.discard_session('other')",
        "SELECT cow.create_session('new-one')",
        "SELECT * FROM cow.refresh()",
        "SELECT * FROM cow.enable_schema('public')",
        "SELECT cow._teardown(true)",
        "SELECT cow.set_bind_secret('another-secret-0123456789')",
        "SELECT * FROM cow.session_changes('other')",
        "SELECT * FROM cow.session_diff('other')",
        "SELECT * FROM cow.session_keys('other')",
    ],
)
def test_layer_management_is_refused_on_a_bound_connection(
    db: str, bound: psycopg.Connection[Any], call: str
) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session('other')")
        conn.execute("UPDATE customers SET score = 5 WHERE id = 2")
    bound.execute("UPDATE customers SET score = 6 WHERE id = 1")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="bound to session s1"):
        bound.execute(call)
    assert session_keys(db, "other") == [{"id": 2}]
    assert session_keys(db, "s1") == [{"id": 1}]
    assert base_rows(db)[0][3] == 0


def test_own_session_log_is_readable_when_bound(bound: psycopg.Connection[Any]) -> None:
    bound.execute("UPDATE customers SET score = 6 WHERE id = 1")
    assert bound.execute("SELECT count(*) FROM cow.session_changes('s1')").fetchone() == (1,)
    assert bound.execute("SELECT action FROM cow.session_diff('s1')").fetchall() == [("update",)]


def test_secret_cli(create_database: Callable[..., str], tmp_path: Path) -> None:
    dsn = create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    # Install makes a secret when none is set, and writes it where asked (mode 0600).
    first = tmp_path / "first"
    result = cli("install", "--bind-secret-file", str(first), dsn=dsn)
    assert result.returncode == 0, result
    assert f"binding secret written to {first}" in result.stdout
    assert first.stat().st_mode & 0o777 == 0o600
    assert cli("secret", "--check", "--file", str(first), dsn=dsn).returncode == 0
    # A second install keeps it (a running proxy keeps binding) and says it did not write the file.
    again = cli("install", "--bind-secret-file", str(tmp_path / "again"), dsn=dsn)
    assert again.returncode == 0 and "already set" in again.stderr
    assert not (tmp_path / "again").exists()
    assert "a binding secret is set (since " in cli("secret", dsn=dsn).stdout
    # --rotate prints a new one; the old one stops binding.
    rotated = cli("secret", "--rotate", dsn=dsn)
    new = rotated.stdout.strip()
    assert rotated.returncode == 0 and len(new) >= 40
    one_error_line(cli("secret", "--check", "--file", str(first), dsn=dsn), "does not hold the current")
    with psycopg.connect(dsn, autocommit=True) as conn:
        old = first.read_text().strip()
        assert sql_state(conn, "SELECT cow.bind_session('s', NULL, %s)", (old,)) == "28P01"
        assert conn.execute("SELECT cow.bind_session('s', NULL, %s)", (new,)).fetchone() == ("s",)
        # A bound connection cannot rotate the secret.
        assert sql_state(conn, "SELECT cow.set_bind_secret('x' || repeat('y', 20))") == "42501"
    second = tmp_path / "second"
    assert cli("secret", "--rotate", "--file", str(second), dsn=dsn).returncode == 0
    assert cli("secret", "--check", "--file", str(second), dsn=dsn).returncode == 0
    one_error_line(cli("secret", "--file", str(second), dsn=dsn), "--file needs --rotate, --check or --set")
    one_error_line(cli("secret", "--check", dsn=dsn), "--check needs --file")
    one_error_line(cli("secret", "--set", dsn=dsn), "--set needs --file")
    _secret_set_elsewhere(create_database(), dsn, second, new)
    one_error_line(cli("secret", "--check", "--file", str(tmp_path / "none"), dsn=dsn), "cannot read")
    _secret_needs_the_owner(dsn, first, second)


def _secret_set_elsewhere(other: str, dsn: str, second: Path, new: str) -> None:
    """--set gives another database the same secret (one proxy in front of both): only it binds there."""
    assert cli("install", dsn=other).returncode == 0
    one_error_line(cli("secret", "--check", "--file", str(second), dsn=other), "does not hold the current")
    assert cli("secret", "--set", "--file", str(second), dsn=other).returncode == 0
    assert cli("secret", "--check", "--file", str(second), dsn=other).returncode == 0
    assert cli("secret", "--check", "--file", str(second), dsn=dsn).returncode == 0
    with psycopg.connect(other, autocommit=True) as conn:
        assert sql_state(conn, "SELECT cow.bind_session('s', NULL, %s)", (new,)) == "28P01"
        assert conn.execute(
            "SELECT cow.bind_session('s', NULL, %s)", (second.read_text().strip(),)
        ).fetchone() == ("s",)


def _secret_needs_the_owner(dsn: str, first: Path, second: Path) -> None:
    """Not the owner: one line, nothing changed."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {NOBODY}")
        conn.execute(f"CREATE ROLE {NOBODY} LOGIN")
    try:
        nobody = as_role(dsn, NOBODY)
        one_error_line(cli("secret", "--rotate", dsn=nobody), "needs the layer's owner or a superuser")
        one_error_line(cli("secret", dsn=nobody), "needs the layer's owner or a superuser")
        one_error_line(
            cli("secret", "--set", "--file", str(first), dsn=nobody), "needs the layer's owner or a superuser"
        )
        assert cli("secret", "--check", "--file", str(second), dsn=dsn).returncode == 0
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {NOBODY}")
            conn.execute(f"DROP ROLE {NOBODY}")


# ---------------------------------------------------------------------------------------------------------
# Privileges: the usual production set-up (a non-superuser role owning the app's tables, the layer installed
# by a superuser) and a role with no privilege at all.

OWNER = f"cowt_owner_{os.getpid()}"
OWNER_SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, qty int NOT NULL DEFAULT 0);
INSERT INTO items SELECT g, 'item ' || g, g FROM generate_series(1, 5) g;
"""


@pytest.fixture
def owner_db(create_database: Callable[..., str]) -> Iterator[str]:
    """A database whose app table ``items`` belongs to the non-superuser role OWNER, with the layer."""
    dsn = create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {OWNER}")
        conn.execute(f"CREATE ROLE {OWNER} LOGIN")
        conn.execute(f"GRANT CREATE ON SCHEMA public TO {OWNER}")
    with psycopg.connect(as_role(dsn, OWNER), autocommit=True) as conn:
        conn.execute(OWNER_SCHEMA)
    install_layer_at(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT cow.set_bind_secret(%s)", (SECRET,))
    try:
        yield dsn
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {OWNER} CASCADE")
            conn.execute(f"DROP ROLE {OWNER}")


def items_keys(dsn: str, session: str) -> list[Any]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT pk FROM cow.session_keys(%s) ORDER BY 1", (session,))]


def base_items(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT * FROM public.items ORDER BY id").fetchall()


@pytest.mark.parametrize(
    ("attack", "expect"),
    [
        ("SELECT _cow_session FROM cow_changes.t1", None),
        ("UPDATE cow_changes.t1 SET qty = 99 WHERE _cow_session = 'other'", None),
        (
            "INSERT INTO cow_changes.t1 (_cow_session, _cow_op, _cow_deleted, id, name, qty)"
            " VALUES ('other', 'x', false, 9, 'forged', 9)",
            "42501",
        ),
        ("DELETE FROM cow_changes.t1", "42501"),
        ("TRUNCATE cow_changes.t1", "42501"),
        ("SELECT * FROM cow.sessions", "42501"),
        ("UPDATE cow.sessions SET status = 'discarded'", "42501"),
        ("SELECT * FROM cow.bindings", "42501"),
        ("DELETE FROM cow.bindings", "42501"),
        ("SELECT * FROM cow.bind_secret", "42501"),
        ("SET session_replication_role = replica", "42501"),
        ("SELECT cow._bind('other', 'guess-guess-guess-guess')", "28P01"),
        ("ALTER TABLE public.items DISABLE TRIGGER cow_guard", "42501"),
        ("ALTER TABLE public.items DISABLE TRIGGER ALL", "42501"),
        ("DROP TRIGGER cow_guard ON public.items", "42501"),
        ("SET cow.in_layer = 'on'; ALTER TABLE public.items DISABLE TRIGGER cow_guard", "42501"),
        ("UPDATE public.items SET qty = 0", "42501"),
        ("SELECT cow.commit_session('s1')", "42501"),
    ],
)
def test_a_bound_owner_role_cannot_reach_other_sessions_or_the_base_tables(
    owner_db: str, attack: str, expect: str | None
) -> None:
    with psycopg.connect(as_role(owner_db, OWNER), autocommit=True) as other:
        other.execute("SELECT cow.use_session('other')")
        other.execute("UPDATE items SET qty = 50 WHERE id = 1")
    before = base_items(owner_db)
    with psycopg.connect(as_role(owner_db, OWNER), autocommit=True) as conn:
        conn.execute("SELECT cow.bind_session('s1', NULL, %s)", (SECRET,))
        conn.execute("UPDATE items SET qty = 10 WHERE id = 2")
        conn.execute("SELECT set_config('cow.session_id', 'other', false)")  # as unseen SQL would
        assert sql_state(conn, attack) == expect
        # What it can read of the changes is its own session's, whatever the GUC says.
        assert conn.execute("SELECT DISTINCT _cow_session FROM cow_changes.t1").fetchall() == [("s1",)]
        conn.execute("SELECT cow.use_session('s1')")
        assert conn.execute("SELECT qty FROM items WHERE id IN (1, 2) ORDER BY id").fetchall() == [
            (1,),
            (10,),
        ]
        # A probe write still lands in its own session.
        conn.execute("UPDATE items SET qty = 11 WHERE id = 3")
    assert base_items(owner_db) == before
    assert items_keys(owner_db, "other") == [{"id": 1}]
    assert items_keys(owner_db, "s1") == [{"id": 2}, {"id": 3}]
    with psycopg.connect(owner_db) as admin:
        assert admin.execute("SELECT status FROM cow.sessions ORDER BY 1").fetchall() == [
            ("open",),
            ("open",),
        ]
        assert admin.execute(
            "SELECT qty FROM cow_changes.t1 WHERE _cow_session = 'other' AND _cow_current"
        ).fetchall() == [(50,)]


def test_the_policy_and_the_gate_prove_the_binding_without_the_token(owner_db: str) -> None:
    """The changes tables' policy (cow._session()) and the overlay views' gate (an expression on
    cow.my_binding_elsewhere) take the binding, proven by the token or else by the backend's start time."""
    with psycopg.connect(as_role(owner_db, OWNER), autocommit=True) as conn:
        conn.execute("SELECT cow.bind_session('s1', NULL, %s)", (SECRET,))
        conn.execute("UPDATE items SET qty = 10 WHERE id = 2")
        conn.execute("RESET cow._bind_token")
        conn.execute("SELECT set_config('cow.session_id', 'other', false)")
        assert conn.execute("SELECT DISTINCT _cow_session FROM cow_changes.t1").fetchall() == [("s1",)]
        assert conn.execute("SELECT count(*) FROM cow.my_binding_elsewhere").fetchone() == (1,)
        assert sql_state(conn, "SELECT * FROM items") == "42501"
        conn.execute("SELECT cow.use_session('s1')")
        assert conn.execute("SELECT count(*) FROM cow.my_binding_elsewhere").fetchone() == (0,)
        assert conn.execute("SELECT qty FROM items WHERE id = 2").fetchone() == (10,)
    with psycopg.connect(owner_db, autocommit=True) as conn:
        # A row an ended backend left under this pid does not bind this one: the GUC decides, for the policy
        # (its WITH CHECK would refuse the write into s4 if it took the dead row's session) and the gate.
        conn.execute(
            "INSERT INTO cow.bindings (pid, backend_start, token, session)"
            " VALUES (pg_backend_pid(), now() - interval '1 hour', 'old-token', 'dead')"
        )
        conn.execute(f"SET ROLE {OWNER}")
        conn.execute("SELECT cow.use_session('s4')")
        conn.execute("UPDATE items SET qty = 40 WHERE id = 4")
        assert conn.execute("SELECT qty FROM items WHERE id = 4").fetchone() == (40,)
        assert conn.execute("SELECT DISTINCT _cow_session FROM cow_changes.t1").fetchall() == [("s4",)]
    assert items_keys(owner_db, "s4") == [{"id": 4}]
    assert items_keys(owner_db, "s1") == [{"id": 2}]


def test_an_unprivileged_role_cannot_bind_or_read_the_layer(owner_db: str) -> None:
    with psycopg.connect(owner_db, autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {NOBODY}")
        conn.execute(f"CREATE ROLE {NOBODY} LOGIN")
    try:
        with psycopg.connect(as_role(owner_db, NOBODY), autocommit=True) as conn:
            assert sql_state(conn, "SELECT cow.bind_session('s1', NULL, 'not-the-secret-0000')") == "28P01"
            assert sql_state(conn, "SELECT * FROM cow.sessions") == "42501"
            assert sql_state(conn, "SELECT * FROM cow.bind_secret") == "42501"
            assert sql_state(conn, "SELECT cow.set_bind_secret('a-new-secret-000000000')") == "42501"
            # It binds with the secret; its reads and writes are PostgreSQL's privileges of the app table.
            conn.execute("SELECT cow.bind_session('s1', NULL, %s)", (SECRET,))
            assert sql_state(conn, "SELECT * FROM items") == "42501"
            assert sql_state(conn, "UPDATE items SET qty = 1") == "42501"
            assert conn.execute("SELECT count(*) FROM cow_changes.t1").fetchone() == (0,)
    finally:
        with psycopg.connect(owner_db, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {NOBODY}")
            conn.execute(f"DROP ROLE {NOBODY}")


def test_replication_role_does_not_make_a_session_write_vanish(
    db: str, bound: psycopg.Connection[Any]
) -> None:
    """A superuser may set session_replication_role = replica: the layer's triggers fire all the same."""
    bound.execute("SET session_replication_role = replica")
    bound.execute("INSERT INTO customers (email, name) VALUES ('r@x', 'R')")
    bound.execute("UPDATE customers SET score = 3 WHERE id = 1")
    bound.execute("DELETE FROM orders WHERE id = 3")
    assert sql_state(bound, "UPDATE public.customers SET score = 1") == "42501"
    assert session_keys(db, "s1") == [{"id": 1}, {"id": 3}, {"id": 4}]
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM public.orders").fetchone() == (4,)
        # Every trigger of the layer's views and changes tables fires always.
        assert conn.execute(
            "SELECT DISTINCT t.tgenabled FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname IN ('cow_overlay_public', 'cow_changes') AND NOT t.tgisinternal"
            "    OR t.tgname = 'cow_guard'"
        ).fetchall() == [("A",)]


def test_binding_in_a_read_only_transaction(db: str) -> None:
    """A bind records a row: 25006 with the layer's one-line message in a read-only transaction, unless
    the backend is bound to that session already (then nothing is written)."""
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("BEGIN READ ONLY")
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction, match="needs a read-write transaction"):
            conn.execute("SELECT cow.bind_session('s1', NULL, %s)", (SECRET,))
        conn.execute("ROLLBACK")
        assert conn.execute("SELECT cow.bound_session()").fetchone() == (None,)
        conn.execute("SELECT cow.bind_session('s1', NULL, %s)", (SECRET,))
        conn.execute("SET default_transaction_read_only = on")
        assert conn.execute("SELECT cow.bind_session('s1', 'op-2', %s)", (SECRET,)).fetchone() == ("s1",)
        for other in ("s2", None):
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction, match="needs a read-write transaction"):
                conn.execute("SELECT cow.bind_session(%s, NULL, %s)", (other, SECRET))
        assert conn.execute("SELECT cow.bound_session()").fetchone() == ("s1",)


def test_the_bind_makes_the_temporary_schema_unseen_by_event_triggers(db: str) -> None:
    """The bind's temporary schema comes from a domain made and dropped with session_replication_role
    = replica (a superuser owner): an application's event trigger does not see it, and the role in force
    before the bind is in force after it."""
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE ddl_seen (tag text, obj text)")
        conn.execute(
            "CREATE FUNCTION app_ddl_log() RETURNS event_trigger LANGUAGE plpgsql AS $$ BEGIN"
            " INSERT INTO public.ddl_seen SELECT command_tag, object_identity"
            " FROM pg_event_trigger_ddl_commands(); END $$"
        )
        conn.execute("CREATE EVENT TRIGGER app_ddl_log ON ddl_command_end EXECUTE FUNCTION app_ddl_log()")
    for role in ("origin", "replica"):
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(f"SET session_replication_role = {role}")
            conn.execute("SELECT cow.bind_session('s1', NULL, %s)", (SECRET,))
            assert conn.execute("SHOW session_replication_role").fetchone() == (role,)
            assert conn.execute("SELECT pg_my_temp_schema() <> 0, cow.bound_session()").fetchone() == (
                True,
                "s1",
            )
            assert sql_state(conn, "DELETE FROM public.customers") == "42501"
    with psycopg.connect(db, autocommit=True) as conn:
        assert conn.execute("SELECT * FROM ddl_seen").fetchall() == []
        conn.execute("CREATE TABLE pg_temp.mine (x int)")  # (the trigger itself works)
        assert conn.execute("SELECT tag FROM ddl_seen").fetchall() == [("CREATE TABLE",)]


def test_a_bind_whose_owner_may_not_set_the_replication_role(db: str) -> None:
    """An owner of cow._bind that is no superuser cannot set session_replication_role: the bind makes the
    temporary schema all the same (the layer's event triggers see it and leave it alone)."""
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {NOBODY}_binder")
        conn.execute(f"CREATE ROLE {NOBODY}_binder NOSUPERUSER")
        conn.execute(f"GRANT pg_read_all_stats TO {NOBODY}_binder")
        conn.execute(f"GRANT SELECT ON cow.bind_secret TO {NOBODY}_binder")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON cow.bindings TO {NOBODY}_binder")
        conn.execute(f"ALTER FUNCTION cow._bind(text, text) OWNER TO {NOBODY}_binder")
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("SELECT cow.bind_session('s1', NULL, %s)", (SECRET,))
            assert conn.execute("SELECT pg_my_temp_schema() <> 0, cow.bound_session()").fetchone() == (
                True,
                "s1",
            )
            assert conn.execute("SHOW session_replication_role").fetchone() == ("origin",)
            assert sql_state(conn, "DELETE FROM public.customers") == "42501"
    finally:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("ALTER FUNCTION cow._bind(text, text) OWNER TO CURRENT_USER")
            conn.execute(f"DROP OWNED BY {NOBODY}_binder CASCADE")
            conn.execute(f"DROP ROLE {NOBODY}_binder")
