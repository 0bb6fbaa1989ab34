"""The grammar of dangerous statements, and the attack sequences kept as regressions.

A statement template may name ``{other}`` (the victim's session), ``{own}`` (the attacker's) and ``{t}`` (the
changes table of ``items``, ``cow_changes.t…``). A *step* is a statement with a protocol: ``simple`` (a
Query; multi-statement strings too), ``extended`` (Parse/Bind/Execute, unnamed) or ``prepared`` (a named
prepared statement). Each class is one of the issue's classes of escape.
"""

from __future__ import annotations

from dataclasses import dataclass

SWITCH = "session switch"
LAYER_CALL = "layer call"
LAYER_TABLE = "layer tables"
DDL = "DDL"
DYNAMIC = "dynamic SQL"
SETTING = "role and replication settings"
MULTI = "multi-statement"
COMMENT = "comment"
PREPARED = "prepared statement"
STARTUP = "startup"


@dataclass(frozen=True)
class Step:
    sql: str
    params: tuple[str, ...] | None = None
    protocol: str = "simple"  # simple | extended | prepared

    @property
    def text(self) -> str:
        """The statement with its parameters (what ``open_escape`` judges)."""
        return " ".join((self.sql, *(self.params or ())))

    def render(self, other: str, own: str, table: str) -> Step:
        values = {"other": other, "own": own, "t": table}
        params = None if self.params is None else tuple(p.format(**values) for p in self.params)
        return Step(self.sql.format(**values), params, self.protocol)


# (class, statement) — single statements; the state machine combines them with protocols and wrappers.
STATEMENTS: list[tuple[str, str]] = [
    (SWITCH, "SET cow.session_id = '{other}'"),
    (SWITCH, "SET cow.session_id = ''"),
    (SWITCH, "SET SESSION \"cow.session_id\" TO '{other}'"),
    (SWITCH, "RESET cow.session_id"),
    (SWITCH, "RESET ALL"),
    (SWITCH, "DISCARD ALL"),
    (SWITCH, "SELECT set_config('cow.session_id', '{other}', false)"),
    (SWITCH, "SELECT set_config('cow.' || 'session_id', '{other}', false)"),
    (SWITCH, "SELECT pg_catalog.set_config('cow.session_id', '', false)"),
    (SWITCH, "SELECT cow.use_session('{other}')"),
    (SWITCH, "SELECT cow.use_session(NULL)"),
    (SWITCH, "SET search_path = public"),
    (SWITCH, "SET search_path = cow_changes, public"),
    (SWITCH, "SELECT set_config('search_path', 'public', false)"),
    (SWITCH, "SET cow.app_search_path = 'public'"),
    (COMMENT, "/*cow_session='{other}'*/ UPDATE items SET val = val + 1 WHERE id = 2"),
    (COMMENT, "UPDATE items SET val = val + 1 WHERE id = 2 /*cow_session='{other}'*/"),
    (COMMENT, "/*cow_session='{other}'*/ SELECT id, owner FROM items ORDER BY id"),
    (COMMENT, "/*cow_session='elsewhere'*/ INSERT INTO notes (body) VALUES ('elsewhere')"),
    (COMMENT, "/* a comment */ SET cow.session_id = '{other}'"),
    (COMMENT, "SET /* inside */ cow.session_id = '{other}'"),
    (COMMENT, "-- a line comment\nSET cow.session_id = ''"),
    (LAYER_CALL, "SELECT cow.commit_session('{own}', NULL, 'overwrite')"),
    (LAYER_CALL, "SELECT cow.discard_session('{other}')"),
    (LAYER_CALL, "SELECT * FROM cow.session_changes('{other}')"),
    (LAYER_CALL, "SELECT * FROM cow.session_diff('{other}')"),
    (LAYER_CALL, "SELECT cow.create_session('intruder', 'agent')"),
    (LAYER_CALL, "SELECT * FROM cow.refresh(true)"),
    (LAYER_CALL, "SELECT cow._teardown(true)"),
    (LAYER_TABLE, "SELECT * FROM {t}"),
    (LAYER_TABLE, "UPDATE {t} SET _cow_deleted = NOT _cow_deleted"),
    (LAYER_TABLE, "DELETE FROM {t} WHERE _cow_session = '{other}'"),
    (LAYER_TABLE, "TRUNCATE {t}"),
    (LAYER_TABLE, "UPDATE cow.sessions SET status = 'discarded' WHERE session_id = '{other}'"),
    (LAYER_TABLE, "DELETE FROM cow.sessions WHERE session_id = '{other}'"),
    (LAYER_TABLE, "INSERT INTO {t} SELECT * FROM {t}"),
    (LAYER_TABLE, "SELECT * FROM cow_overlay_public.items"),
    (LAYER_TABLE, "COPY (SELECT * FROM {t}) TO STDOUT"),
    (DDL, "DROP SCHEMA cow CASCADE"),
    (DDL, "ALTER TABLE public.items DISABLE TRIGGER ALL"),
    (DDL, "ALTER TABLE cow_overlay_public.items DISABLE TRIGGER ALL"),
    (DDL, "CREATE RULE quiet AS ON INSERT TO notes DO INSTEAD NOTHING"),
    (DDL, "CREATE FUNCTION leave() RETURNS text LANGUAGE sql AS $$ SELECT set_config('cow.session_id', '', false) $$"),
    (DDL, "SELECT leave()"),
    (DDL, "CREATE TABLE notes (id int, body text)"),
    (DDL, "DROP VIEW cow_overlay_public.notes"),
    (DYNAMIC, "DO $$ BEGIN PERFORM set_config('cow.session_id', '', false); END $$"),
    (DYNAMIC, "DO $$ BEGIN EXECUTE 'SET cow.session_id = ' || quote_literal('{other}'); END $$"),
    (DYNAMIC, "DO $$ DECLARE n text := 'cow.' || 'session_id'; BEGIN PERFORM set_config(n, '{other}', false); END $$"),
    (DYNAMIC, "SELECT app_set('cow.' || 'session_id', '')"),
    (DYNAMIC, "SELECT app_set('cow.session_id', '{other}')"),
    (DYNAMIC, "SELECT app_set('search_path', 'public')"),
    (DYNAMIC, "SELECT app_set('session_replication_role', 'replica')"),
    (DYNAMIC, "SELECT query_to_xml('SELECT * FROM cow.session_changes(''{other}'')', true, false, '')"),
    (SETTING, "SET session_replication_role = replica"),
    (SETTING, "SELECT set_config('session_replication_role', 'replica', false)"),
    (SETTING, "SET ROLE postgres"),
    (SETTING, "SET SESSION AUTHORIZATION postgres"),
    (SETTING, "SELECT set_config('role', 'postgres', false)"),
    (MULTI, "SELECT 1; SET cow.session_id = '{other}'; UPDATE items SET val = val + 1 WHERE id = 2"),
    (MULTI, "RESET ALL; INSERT INTO notes (body) VALUES ('after reset')"),
    (MULTI, "BEGIN; SET LOCAL cow.session_id = '{other}'; UPDATE items SET val = 9 WHERE id = 2; COMMIT"),
    (MULTI, "SELECT 1; DROP SCHEMA cow CASCADE"),
    (PREPARED, "PREPARE leave_p (text) AS SELECT set_config('cow.session_id', $1, false)"),
    (PREPARED, "EXECUTE leave_p('{other}')"),
    (PREPARED, "PREPARE read_p AS SELECT * FROM cow.session_changes('{other}')"),
    (PREPARED, "EXECUTE read_p"),
]  # fmt: skip

# Statements with parameters, sent with the extended protocol (the name of the setting as a parameter).
PARAMETERISED: list[tuple[str, Step]] = [
    (PREPARED, Step("SELECT set_config($1, $2, false)", ("cow.session_id", "{other}"), "extended")),
    (PREPARED, Step("SELECT set_config($1, $2, false)", ("cow.session_id", ""), "prepared")),
    (PREPARED, Step("SELECT * FROM cow.session_changes($1)", ("{other}",), "extended")),
    (PREPARED, Step("SELECT app_set($1, $2)", ("cow.session_id", "{other}"), "prepared")),
]

# Extra startup options of the attacker's connection (the session itself is fixed by the harness).
STARTUP_OPTIONS = [
    "",
    "-c search_path=public",
    "-c session_replication_role=replica",
    "-c cow.app_search_path=public",
    "-c role=postgres",
    "-c default_transaction_read_only=on",  # (the proxy's bind then runs in a read-write block of its own)
]


def open_escape(sql: str, superuser: bool, binding: bool, always_triggers: bool) -> str | None:
    """Why an attack still escapes in this set-up (None: it must be contained), docs/threat-model.md.

    What the proxy cannot see — an existing application function that sets a setting by a computed name —
    is the layer's binding's to contain; a superuser's ``session_replication_role = replica`` by such a
    function is contained by triggers that fire in every replication role.
    """
    if "app_set(" not in sql:
        return None
    if "session_replication_role" in sql:
        if superuser and not always_triggers:
            return "a function the proxy cannot see sets session_replication_role; no ENABLE ALWAYS triggers"
        return None
    if "cow." in sql and not binding:
        return "a function the proxy cannot see changes cow.session_id; the proxy does not bind the session"
    return None


def all_steps() -> list[tuple[str, Step]]:
    steps = [(cls, Step(sql)) for cls, sql in STATEMENTS]
    return steps + PARAMETERISED


# The regression list: each a sequence on its own connection (startup options, steps), every one an escape
# that was found by hand (the list) or by the state machine. Keep adding; never remove.
REGRESSIONS: list[tuple[str, str, tuple[Step, ...]]] = [
    (LAYER_CALL, "", (Step("SELECT cow.commit_session('{own}', NULL, 'overwrite')"),)),
    (LAYER_CALL, "", (Step("SELECT cow.discard_session('{other}')"),)),
    (LAYER_TABLE, "", (Step("UPDATE cow.sessions SET status = 'discarded' WHERE session_id = '{other}'"),)),
    (LAYER_CALL, "", (Step("SELECT * FROM cow.session_changes('{other}')"),)),
    (LAYER_CALL, "", (Step("SELECT * FROM cow.session_diff('{other}')"),)),
    (LAYER_TABLE, "", (Step("SELECT * FROM {t}"),)),
    (LAYER_TABLE, "", (Step("UPDATE {t} SET _cow_deleted = NOT _cow_deleted"),)),
    (LAYER_TABLE, "", (Step("DELETE FROM {t} WHERE _cow_session = '{other}'"),)),
    (LAYER_TABLE, "", (Step("TRUNCATE {t}"),)),
    (COMMENT, "", (Step("/*cow_session='{other}'*/ UPDATE items SET val = val + 1 WHERE id = 2"),)),
    (COMMENT, "", (Step("/*cow_session='{other}'*/ SELECT id, owner FROM items ORDER BY id"),)),
    (DYNAMIC, "", (Step("SELECT app_set('cow.' || 'session_id', '')"), Step("INSERT INTO notes (body) VALUES ('x')"))),
    (DYNAMIC, "", (Step("SELECT app_set('cow.session_id', '{other}')"), Step("UPDATE items SET val = 0 WHERE id = 2"))),
    (DDL, "", (Step("DROP SCHEMA cow CASCADE"), Step("INSERT INTO notes (body) VALUES ('x')"))),
    (DDL, "", (Step("CREATE FUNCTION leave() RETURNS text LANGUAGE sql AS $$ SELECT set_config('cow.session_id', '', false) $$"),
               Step("SELECT leave()"), Step("INSERT INTO notes (body) VALUES ('x')"))),
    (SETTING, "", (Step("SET session_replication_role = replica"), Step("INSERT INTO notes (body) VALUES ('lost')"))),
    (SWITCH, "", (Step("SET cow.session_id = '{other}'"), Step("UPDATE items SET val = 0 WHERE id = 2"))),
    (SWITCH, "", (Step("SELECT set_config('cow.session_id', '{other}', false)"),)),
    (SWITCH, "", (Step("RESET ALL; INSERT INTO notes (body) VALUES ('after reset')"),)),
    (SWITCH, "", (Step("DISCARD ALL"), Step("INSERT INTO notes (body) VALUES ('x')"))),
    (SWITCH, "", (Step("SELECT cow.use_session('{other}')"), Step("UPDATE items SET val = 0 WHERE id = 2"))),
    (SWITCH, "", (Step("SET search_path = public"), Step("INSERT INTO notes (body) VALUES ('x')"))),
    (DYNAMIC, "", (Step("DO $$ BEGIN EXECUTE 'SET cow.session_id = ' || quote_literal('{other}'); END $$"),
                   Step("UPDATE items SET val = 0 WHERE id = 2"))),
    (DYNAMIC, "", (Step("SELECT app_set('session_replication_role', 'replica')"), Step("INSERT INTO notes (body) VALUES ('lost')"))),
    (DYNAMIC, "", (Step("SELECT app_set('search_path', 'public')"), Step("INSERT INTO notes (body) VALUES ('x')"))),
    (DYNAMIC, "", (Step("SELECT query_to_xml('SELECT * FROM cow.session_changes(''{other}'')', true, false, '')"),)),
    (DDL, "", (Step("ALTER TABLE public.items DISABLE TRIGGER ALL"), Step("UPDATE public.items SET val = 0 WHERE id = 2"))),
    (DDL, "", (Step("CREATE RULE quiet AS ON INSERT TO cow_overlay_public.notes DO INSTEAD NOTHING"),
               Step("INSERT INTO notes (body) VALUES ('lost')"))),
    (DDL, "", (Step("DROP VIEW cow_overlay_public.notes CASCADE"), Step("INSERT INTO notes (body) VALUES ('x')"))),
    (SETTING, "", (Step("SET SESSION AUTHORIZATION postgres"),)),
    (MULTI, "", (Step("SELECT 1; SET cow.session_id = '{other}'; UPDATE items SET val = val + 1 WHERE id = 2"),)),
    (MULTI, "", (Step("BEGIN; SET LOCAL cow.session_id = '{other}'; UPDATE items SET val = 9 WHERE id = 2; COMMIT"),)),
    (PREPARED, "", (Step("PREPARE leave_p (text) AS SELECT set_config('cow.session_id', $1, false)"),
                    Step("EXECUTE leave_p('{other}')"), Step("UPDATE items SET val = 0 WHERE id = 2"))),
    (PREPARED, "", (Step("SELECT set_config($1, $2, false)", ("cow.session_id", "{other}"), "extended"),
                    Step("UPDATE items SET val = 0 WHERE id = 2"))),
    (PREPARED, "", (Step("SELECT * FROM cow.session_changes($1)", ("{other}",), "extended"),)),
    (STARTUP, "-c session_replication_role=replica", (Step("INSERT INTO notes (body) VALUES ('lost')"),)),
    (STARTUP, "-c search_path=public", (Step("INSERT INTO notes (body) VALUES ('x')"),)),
    (STARTUP, "-c cow.app_search_path=public", (Step("INSERT INTO notes (body) VALUES ('x')"),)),
    # A read-only client is bound too (its join runs in a read-write block of the proxy's own), so a
    # function the proxy cannot see does not take it elsewhere once it asks for a read-write transaction.
    (STARTUP, "-c default_transaction_read_only=on", (Step("SET default_transaction_read_only = off"),
               Step("SELECT app_set('cow.session_id', '{other}')"), Step("UPDATE items SET val = 0 WHERE id = 2"))),
    (STARTUP, "-c default_transaction_read_only=on", (Step("BEGIN READ WRITE"),
               Step("SELECT app_set('cow.' || 'session_id', '')"), Step("INSERT INTO notes (body) VALUES ('x')"),
               Step("COMMIT"))),
]  # fmt: skip
