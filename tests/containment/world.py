"""The world the containment suite attacks: a database with the layer, a victim session with changes, an
attacker's session, a real ``cowproxy serve`` in front, and the invariants, checked directly on the server.

The invariants (docs/threat-model.md), after every step of an attack:

1. the base tables are unchanged;
2. the victim session's changes and registry row are unchanged, no other session appeared, and the layer's
   objects (functions, registry, triggers) are all there;
3. nothing the attacker got back (rows, notices, errors) contains the victim's data;
4. a probe write on the attacker's connection lands in the attacker's session (or fails with an error: fail
   closed), never in a base table or another session, never acknowledged and dropped.

Runs as the server's superuser, or as ``OWNER``: a login role that owns the application's tables and is not a
superuser (the recommended set-up).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from tests.containment.attacks import open_escape
from tests.fix_db import TEST_BIND_SECRET, install_layer_at
from tests.serve import cowproxy_process

ROOT = Path(__file__).resolve().parents[2]
VICTIM = "victim"
AGENT = "agent"
MARKER = "MARKER-of-the-victim"
OWNER = "cowc_owner"

SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, owner text NOT NULL, val int NOT NULL DEFAULT 0);
CREATE TABLE notes (id serial PRIMARY KEY, body text NOT NULL);
INSERT INTO items VALUES (1, 'base-one', 10), (2, 'base-two', 20), (3, 'base-three', 30);
-- An application function that sets a setting whose name it is given: the proxy sees only its call.
CREATE FUNCTION app_set(name text, value text) RETURNS text LANGUAGE plpgsql AS
$$ BEGIN RETURN set_config(name, value, false); END $$;
"""
ROLE = f"""
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{OWNER}') THEN
        CREATE ROLE {OWNER} LOGIN NOSUPERUSER;
    END IF;
END $$
"""
VICTIM_WRITES = f"""
UPDATE items SET owner = '{MARKER}-1' WHERE id = 1;
INSERT INTO items VALUES (100, '{MARKER}-100', 0);
DELETE FROM items WHERE id = 3;
INSERT INTO notes (body) VALUES ('{MARKER}-note');
"""


@dataclass(frozen=True)
class Outcome:
    """What one statement gave the attacker: ok or an error's SQLSTATE, and everything it could read."""

    sqlstate: str | None  # None: it succeeded
    text: str  # rows, status, notices, error message: searched for the victim's data


@dataclass
class Violation(AssertionError):
    what: str

    def __str__(self) -> str:
        return self.what


def with_user(dsn: str, user: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=f"{user}@{parts.hostname}:{parts.port}"))


def with_database(dsn: str, database: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path="/" + database))


def cowproxy_serve(
    upstream: str, checkout: Path = ROOT, extra: Sequence[str] = ()
) -> contextlib.AbstractContextManager[int]:
    """A real ``python -m cowproxy serve`` (of ``checkout``: another one measures a baseline), free port."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "COW_BIND_SECRET": TEST_BIND_SECRET}
    return cowproxy_process([sys.executable, "-m", "cowproxy"], upstream, extra, env=env, cwd=checkout)


def prepare_database(admin_dsn: str, database: str) -> None:
    """The application (owned by ``OWNER``), the layer, the two sessions and the victim's changes."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(ROLE)
        create = sql.SQL("CREATE DATABASE {} OWNER {}")
        conn.execute(create.format(sql.Identifier(database), sql.Identifier(OWNER)))
    dsn = with_database(admin_dsn, database)
    with psycopg.connect(with_user(dsn, OWNER), autocommit=True) as conn:
        conn.execute(SCHEMA)
    install_layer_at(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT cow.create_session(%s, 'agent')", (VICTIM,))
        conn.execute("SELECT cow.create_session(%s, 'agent')", (AGENT,))
    with psycopg.connect(with_user(dsn, OWNER), autocommit=True) as conn:
        conn.execute("SELECT cow.use_session(%s)", (VICTIM,))
        conn.execute(VICTIM_WRITES)


def drop_database(admin_dsn: str, database: str) -> None:
    with contextlib.suppress(psycopg.Error), psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))


@dataclass
class Snapshot:
    base: list[tuple[Any, ...]]
    victim: list[tuple[Any, ...]]
    registry: list[tuple[Any, ...]]
    layer: tuple[Any, ...]


SNAPSHOT_BASE = (
    "SELECT 'items', id::text, owner || '/' || val FROM public.items "
    "UNION ALL SELECT 'notes', id::text, body FROM public.notes ORDER BY 1, 2"
)
SNAPSHOT_VICTIM = (
    "SELECT seq, operation_id, table_name, pk::text, row_data::text, deleted "
    "FROM cow.session_changes(%s) ORDER BY seq"
)
SNAPSHOT_REGISTRY = (
    "SELECT session_id, kind, status, created_at, first_write_at, last_write_at FROM cow.sessions "
    "WHERE session_id <> %s ORDER BY 1"
)
SNAPSHOT_LAYER = """
SELECT (SELECT count(*) FROM pg_proc WHERE pronamespace = 'cow'::regnamespace),
       (SELECT count(*) FROM cow.registry),
       (SELECT string_agg(tgname || ':' || tgenabled::text, ',' ORDER BY tgname) FROM pg_trigger t
          JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname IN ('public', 'cow_overlay_public', 'cow_changes')),
       (SELECT count(*) FROM pg_rules WHERE schemaname IN ('public', 'cow_overlay_public', 'cow_changes')),
       (SELECT count(*) FROM pg_class WHERE relnamespace = 'cow_changes'::regnamespace)
"""


ALWAYS_TRIGGERS = """
SELECT bool_and(tgenabled = 'A') FROM pg_trigger
 WHERE tgrelid = 'cow_overlay_public.notes'::regclass AND NOT tgisinternal
"""


@dataclass
class World:
    """One prepared database behind one proxy; ``attacker()`` connects through it as ``user``."""

    admin_dsn: str  # the server's superuser, on the prepared database
    proxy_port: int
    user: str  # who the attacker connects as: the superuser or OWNER
    binding: bool = True  # the proxy binds its backends to their sessions (cowproxy_serve: the secret)
    initial: Snapshot = field(init=False)
    always_triggers: bool = field(init=False)  # the overlay's triggers fire in every replication role
    probes: int = 0

    def __post_init__(self) -> None:
        self.initial = self.snapshot()
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            row = conn.execute(ALWAYS_TRIGGERS).fetchone()
        self.always_triggers = bool(row and row[0])

    @property
    def superuser(self) -> bool:
        return self.user != OWNER

    def open_escape(self, statements: Sequence[str]) -> str | None:
        """Why one of ``statements`` still escapes here (``attacks.open_escape``), or None."""
        for statement in statements:
            reason = open_escape(statement, self.superuser, self.binding, self.always_triggers)
            if reason is not None:
                return reason
        return None

    @property
    def database(self) -> str:
        return urlsplit(self.admin_dsn).path.lstrip("/")

    def snapshot(self) -> Snapshot:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            return Snapshot(
                base=conn.execute(SNAPSHOT_BASE).fetchall(),
                victim=conn.execute(SNAPSHOT_VICTIM, (VICTIM,)).fetchall(),
                registry=conn.execute(SNAPSHOT_REGISTRY, (AGENT,)).fetchall(),
                layer=tuple(conn.execute(SNAPSHOT_LAYER).fetchone() or ()),
            )

    def attacker(self, startup: str = "") -> psycopg.Connection[Any]:
        """A connection tagged at startup with the attacker's session (plus ``startup``'s options)."""
        options = f"-c cow.session_id={AGENT} {startup}".strip()
        conn = psycopg.connect(
            host="127.0.0.1",
            port=self.proxy_port,
            dbname=self.database,
            user=self.user,
            options=options,
            autocommit=True,
            connect_timeout=10,
        )
        conn.add_notice_handler(lambda diag: _notices(conn).append(str(diag.message_primary)))
        return conn

    def check(self, conn: psycopg.Connection[Any] | None, outcomes: Sequence[Outcome]) -> None:
        """Raise ``Violation`` unless every invariant holds after the statements that gave ``outcomes``."""
        for outcome in outcomes:
            if MARKER in outcome.text:
                raise Violation(f"the attacker read the victim's data: {outcome.text[:300]}")
        try:
            now = self.snapshot()
        except psycopg.Error as exc:
            raise Violation(f"the layer cannot be read any more: {exc.diag.message_primary}") from None
        if now.layer != self.initial.layer:
            raise Violation(f"the layer changed: {self.initial.layer} -> {now.layer}")
        if now.base != self.initial.base:
            raise Violation(f"the base tables changed: {now.base}")
        if now.victim != self.initial.victim:
            raise Violation("the victim session's changes changed")
        if now.registry != self.initial.registry:
            raise Violation(f"the registry changed: {now.registry}")
        if conn is not None:
            self.probe(conn)

    def probe(self, conn: psycopg.Connection[Any]) -> None:
        """A write on the attacker's connection lands in its session or fails; a read shows no victim data."""
        self.probes += 1
        body = f"probe-{self.probes}"
        if conn.closed:
            return
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")  # out of a transaction the attack left open
        read = run(conn, "SELECT id, owner, val FROM items ORDER BY id")
        if MARKER in read.text:
            raise Violation(f"a read after the attack returned the victim's data: {read.text[:300]}")
        wrote = run(conn, "INSERT INTO notes (body) VALUES (%s) RETURNING id", (body,), "extended")
        with psycopg.connect(self.admin_dsn, autocommit=True) as direct:
            base = direct.execute("SELECT count(*) FROM public.notes WHERE body = %s", (body,)).fetchone()
            where = [
                row[0]
                for row in direct.execute(
                    "SELECT s.session_id FROM cow.sessions s, cow.session_changes(s.session_id) c "
                    "WHERE c.row_data ->> 'body' = %s",
                    (body,),
                )
            ]
        if base != (0,):
            raise Violation("the probe write reached the base table")
        if wrote.sqlstate is None and where != [AGENT]:
            raise Violation(f"the probe write was acknowledged but landed in {where}")
        if wrote.sqlstate is not None and where:
            raise Violation(f"the probe write failed ({wrote.sqlstate}) but landed in {where}")


def _notices(conn: psycopg.Connection[Any]) -> list[str]:
    found: list[str] | None = getattr(conn, "_containment_notices", None)
    if found is None:
        found = []
        conn._containment_notices = found  # type: ignore[attr-defined]
    return found


def run(
    conn: psycopg.Connection[Any],
    statement: str,
    params: tuple[Any, ...] | None = None,
    protocol: str = "simple",
) -> Outcome:
    """One statement, as a Query (``simple``: ``params`` None, the text as is), or with the extended protocol,
    unnamed (``extended``) or as a named prepared statement (``prepared``): ``%s`` placeholders."""
    notices = _notices(conn)
    del notices[:]
    try:
        if protocol == "simple":
            cur = conn.execute(statement, prepare=False)
        else:  # (binary results: psycopg then uses Parse/Bind/Execute even without parameters)
            cur = conn.execute(statement, params or (), prepare=protocol == "prepared", binary=True)
        parts = [str(cur.statusmessage)]
        while True:
            if cur.description is not None:
                parts.append(repr(cur.fetchall()))
            if not cur.nextset():
                break
        return Outcome(None, " ".join(parts + notices))
    except psycopg.Error as exc:
        diag = exc.diag
        text = " ".join(str(x) for x in (diag.message_primary, diag.message_detail, diag.message_hint) if x)
        return Outcome(diag.sqlstate or "?", " ".join([text, *notices]))
