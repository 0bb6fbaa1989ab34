"""The tagged connections' allow-list (proxy/sql/policy.py): what ORMs and drivers send passes, everything
else is refused with 42501 naming its rule; untagged connections are not judged; rules can be lifted."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import build_config
from proxy.errors import ConfigError
from proxy.sql import Analysis, Analyzer, Catalog
from proxy.sql.policy import ALLOWABLE, RULES, Policy

from .catalogs import sample_catalog

CATALOG = sample_catalog()


def analyze(sql: str, in_session: bool = True, policy: Policy | None = None) -> Analysis:
    analyzer = Analyzer() if policy is None else Analyzer(policy=policy)
    return analyzer.analyze(sql, CATALOG, in_session)


# What applications, ORMs, drivers and psql send on a tagged connection.
ALLOWED = [
    "SELECT 1",
    "SELECT * FROM issues WHERE id = $1",
    "WITH d AS (DELETE FROM comments RETURNING issue_id) SELECT count(*) FROM d",
    "INSERT INTO issues (title) VALUES ('x') RETURNING id",
    "UPDATE issues SET title = 'y' WHERE id = 1",
    "DELETE FROM comments WHERE id = 2",
    "MERGE INTO issues t USING (SELECT 1 AS id) s ON t.id = s.id WHEN MATCHED THEN DELETE",
    "TRUNCATE comments",
    "COPY issues FROM STDIN",
    "COPY (SELECT * FROM issues) TO STDOUT WITH (FORMAT csv)",
    "BEGIN ISOLATION LEVEL SERIALIZABLE",
    "SAVEPOINT s1",
    "RELEASE SAVEPOINT s1",
    "ROLLBACK TO SAVEPOINT s1",
    "COMMIT",
    "PREPARE TRANSACTION 'x'",
    "SET TIME ZONE 'UTC'",
    "SET statement_timeout = 1000",
    "SET LOCAL lock_timeout = '1s'",
    "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED",
    "SET datestyle TO ISO",
    "SET CONSTRAINTS ALL IMMEDIATE",
    "SET cow.operation_id = 'step-2'",
    "SET ROLE authenticated",
    "RESET statement_timeout",
    "SHOW search_path",
    "SHOW cow.session_id",
    "SELECT current_setting('cow.session_id', true)",
    "SELECT set_config('application_name', 'x', false)",
    "SELECT set_config('statement_timeout', '5s', true)",
    "PREPARE p (int) AS SELECT * FROM issues WHERE id = $1",
    "EXECUTE p(1)",
    "DEALLOCATE p",
    "DEALLOCATE ALL",
    "DECLARE c CURSOR WITH HOLD FOR SELECT * FROM issues",
    "FETCH 10 FROM c",
    "MOVE NEXT IN c",
    "CLOSE c",
    "LISTEN jobs",
    "NOTIFY jobs, 'x'",
    "SELECT pg_notify('jobs', 'x')",
    "UNLISTEN *",
    "EXPLAIN (ANALYZE, BUFFERS) SELECT * FROM issues",
    "EXPLAIN UPDATE issues SET title = 'z'",
    "DISCARD PLANS",
    "DISCARD SEQUENCES",
    "DISCARD TEMP",
    "LOCK TABLE issues IN SHARE MODE",
    "VACUUM ANALYZE issues",
    "ANALYZE issues",
    "CALL app_procedure(1)",
    "SELECT app.some_function(1)",
    "CREATE TEMP TABLE scratch (id int) ON COMMIT DROP",
    "CREATE TEMPORARY TABLE scratch AS SELECT 1 AS id",
    "SELECT 1 INTO TEMP scratch",
    "SELECT setval(pg_get_serial_sequence('issues', 'id'), 1, false)",
    "SELECT nextval('issues_id_seq')",
    "SELECT pg_advisory_lock(1)",
    "SELECT cow.use_operation('step-3')",  # the layer's functions for its own operation and session
    "SELECT cow.current_session()",
    # catalog reads (psql's \d, Django's and SQLAlchemy's introspection)
    "SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace",
    "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()",
    "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg_%'",
    "SELECT 'cow.sessions'",  # a string is not a reference
    "SELECT * FROM cows",  # nor a name that starts like the layer's
]


@pytest.mark.parametrize("sql", ALLOWED)
def test_allowed(sql: str) -> None:
    result = analyze(sql)
    assert result.error is None, result.error
    assert not result.tampers


# (statement, rule)
REFUSED = [
    ("SELECT * FROM cow.sessions", "layer"),
    ("UPDATE cow.sessions SET status = 'open'", "layer"),
    ('SELECT * FROM "cow_changes".t1', "layer"),
    ("SELECT * FROM cow_overlay_public.issues", "layer"),
    ("DELETE FROM cow_changes.t1", "layer"),
    ("TRUNCATE cow_changes.t1", "layer"),
    ("COPY cow_changes.t1 TO STDOUT", "layer"),
    ("LOCK TABLE cow.sessions", "layer"),
    ("SELECT cow.commit_session('s', NULL, 'overwrite')", "layer"),
    ("SELECT * FROM cow.session_changes('other')", "layer"),
    ("CALL cow.discard_session('other')", "layer"),
    ("SELECT 1 FROM issues WHERE EXISTS (SELECT cow.session_diff('other'))", "layer"),
    ("SELECT setval('cow_changes.t1_seq', 1)", "layer"),
    ("SET search_path = cow_changes, public", "layer"),
    ("PREPARE q AS SELECT * FROM cow.sessions", "layer"),
    ("EXPLAIN ANALYZE DELETE FROM cow.sessions", "layer"),
    ("DECLARE c CURSOR FOR SELECT * FROM cow_changes.t1", "layer"),
    ("SELECT 1; SELECT * FROM cow.sessions", "layer"),
    ("/*cow_operation='x'*/ SELECT * FROM cow.sessions", "layer"),
    ("DROP SCHEMA cow CASCADE", "ddl"),
    ("CREATE TABLE t2 (id int)", "ddl"),
    ("ALTER TABLE issues DISABLE TRIGGER ALL", "ddl"),
    ("CREATE RULE r AS ON INSERT TO issues DO INSTEAD NOTHING", "ddl"),
    ("CREATE VIEW v AS SELECT 1", "ddl"),
    ("CREATE MATERIALIZED VIEW m AS SELECT 1", "ddl"),
    ("SELECT * INTO copied FROM issues", "ddl"),
    ("GRANT ALL ON issues TO PUBLIC", "ddl"),
    ("CREATE EXTENSION dblink", "ddl"),
    ("CREATE ROLE r SUPERUSER", "ddl"),
    (
        "CREATE FUNCTION f() RETURNS text LANGUAGE sql AS $$ SELECT set_config('cow.session_id', '', x) $$",
        "function",
    ),
    ("CREATE PROCEDURE p() LANGUAGE sql AS $$ SELECT 1 $$", "function"),
    ("DO $$ BEGIN RAISE NOTICE 'x'; END $$", "do"),
    ("SELECT query_to_xml('SELECT * FROM cow.sessions', true, false, '')", "dynamic"),
    ("SELECT ts_stat('SELECT 1')", "dynamic"),
    ("COPY issues TO '/tmp/issues'", "file"),
    ("COPY issues FROM PROGRAM 'cat /etc/passwd'", "file"),
    ("SELECT pg_read_file('/etc/passwd')", "file"),
    ("SELECT pg_catalog.pg_ls_dir('.')", "file"),
    ("SELECT lo_import('/etc/passwd')", "file"),
    ("SELECT dblink_exec('dbname=app', 'DELETE FROM issues')", "remote"),
    ("UPDATE pg_catalog.pg_trigger SET tgenabled = 'D'", "catalog"),
    ("DELETE FROM pg_trigger", "catalog"),
    ("ALTER SYSTEM SET fsync = off", "system"),
    ("LOAD 'plpgsql'", "system"),
    ("CHECKPOINT", "system"),
    ("SELECT pg_terminate_backend(1)", "system"),
    ("SELECT pg_reload_conf()", "system"),
    ("REASSIGN OWNED BY a TO b", "ddl"),
    ("CREATE DATABASE x", "ddl"),
]


# DDL that names a layer schema by a string (not a relation): refused by the layer rule with everything
# else lifted (a superuser's CREATE OR REPLACE FUNCTION cow._bound() would end the binding).
LAYER_DDL = [
    "DROP SCHEMA cow CASCADE",
    "DROP SCHEMA IF EXISTS cow_changes",
    "DROP TABLE cow.sessions",
    "DROP VIEW cow_overlay_public.items",
    "ALTER SCHEMA cow RENAME TO x",
    "ALTER TABLE cow.sessions RENAME TO y",
    "ALTER TABLE issues SET SCHEMA cow_overlay_public",
    "ALTER FUNCTION cow.use_session(text, text) RENAME TO z",
    "CREATE OR REPLACE FUNCTION cow._bound() RETURNS text LANGUAGE sql AS 'SELECT NULL'",
    "CREATE SCHEMA cow_overlay_x",
    "GRANT ALL ON SCHEMA cow TO PUBLIC",
    "GRANT ALL ON ALL TABLES IN SCHEMA cow_changes TO PUBLIC",
    "ALTER DEFAULT PRIVILEGES IN SCHEMA cow GRANT ALL ON TABLES TO PUBLIC",
    "COMMENT ON SCHEMA cow IS 'x'",
    "ALTER EVENT TRIGGER cow_ddl_end DISABLE",
    "DROP EVENT TRIGGER cow_ddl_start",
    "DROP EVENT TRIGGER cow_ddl_drop",
    "DROP TRIGGER cow_guard ON issues",
]
# In a session an unqualified name would be created in the layer's overlay schema (the first of the
# physical search_path): refused by the layer rule, with everything lifted.
UNQUALIFIED_CREATES = [
    "CREATE TABLE extra (id int PRIMARY KEY)",
    "CREATE UNLOGGED TABLE extra (id int)",
    "CREATE TABLE extra AS SELECT 1 AS id",
    "CREATE MATERIALIZED VIEW mv AS SELECT 1 AS id",
    "SELECT 1 AS id INTO extra",
    "CREATE VIEW v AS SELECT 1 AS id",
    "CREATE SEQUENCE sq",
    "CREATE TYPE ty AS (a int)",
    "CREATE TYPE en AS ENUM ('a')",
    "CREATE DOMAIN dm AS int",
    "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "CREATE AGGREGATE ag (int) (sfunc = int4pl, stype = int)",
    "CREATE EXTENSION pg_trgm",
]


@pytest.mark.parametrize("sql", UNQUALIFIED_CREATES)
def test_lifted_ddl_may_not_create_by_an_unqualified_name(sql: str) -> None:
    result = analyze(sql, policy=Policy(ALLOWABLE))
    assert result.error is not None and 'rule "layer"' in result.error[1], result.error
    assert "without a schema" in result.error[1]
    qualified = sql.replace(" extra", " public.extra").replace("VIEW mv", "VIEW public.mv")
    qualified = qualified.replace("VIEW v ", "VIEW public.v ").replace("SEQUENCE sq", "SEQUENCE public.sq")
    qualified = qualified.replace("TYPE ty", "TYPE public.ty").replace("TYPE en", "TYPE public.en")
    qualified = qualified.replace("DOMAIN dm", "DOMAIN public.dm").replace(
        "FUNCTION f(", "FUNCTION public.f("
    )
    qualified = qualified.replace("AGGREGATE ag", "AGGREGATE public.ag").replace(
        "pg_trgm", "pg_trgm SCHEMA public"
    )
    assert analyze(qualified, policy=Policy(ALLOWABLE)).error is None, qualified


def test_ddl_on_pg_temp_qualified_names_is_the_applications() -> None:
    """pg_temp is this backend's temporary schema: ALTER, CREATE INDEX and DROP of pg_temp.x pass with the
    default policy; unqualified (maybe a permanent table) or mixed with another schema they do not."""
    for sql in (
        "ALTER TABLE pg_temp.scratch ADD COLUMN w int",
        "CREATE INDEX ON pg_temp.scratch (id)",
        "DROP TABLE pg_temp.scratch, PG_TEMP.other",
        "DROP INDEX IF EXISTS pg_temp.scratch_id_idx",
        "DROP VIEW pg_temp.tv",
    ):
        assert analyze(sql).error is None, sql
    for sql in (
        "DROP TABLE scratch",
        "DROP TABLE pg_temp.scratch, public.issues",
        "ALTER TABLE scratch ADD COLUMN w int",
        "DROP SCHEMA pg_temp",
        "DROP FUNCTION pg_temp.f()",
    ):
        result = analyze(sql)
        assert result.error is not None and 'rule "ddl"' in result.error[1], sql


def test_lifted_ddl_on_a_cow_tables_name_is_refused() -> None:
    """In a session a CoW table's name resolves to its overlay view: DROP VIEW and GRANT/REVOKE on it would
    act on the view every session reads (0A000, as the other DDL on a CoW table); other tables' pass."""
    for sql in (
        "DROP VIEW issues",
        "GRANT SELECT ON issues TO PUBLIC",
        "REVOKE ALL ON public.issues FROM PUBLIC",
    ):
        result = analyze(sql, policy=Policy(ALLOWABLE))
        assert result.error is not None and result.error[0] == "0A000", sql
    for sql in ("DROP VIEW public.report", "GRANT SELECT ON public.extra TO PUBLIC"):
        assert analyze(sql, policy=Policy(ALLOWABLE)).error is None, sql


def test_temporary_objects_need_no_schema() -> None:
    for sql in (
        "CREATE TEMP TABLE scratch (id int)",
        "CREATE TEMP VIEW tv AS SELECT 1",
        "CREATE TEMP SEQUENCE ts",
    ):
        assert analyze(sql, policy=Policy(ALLOWABLE)).error is None, sql


# ... and DDL that only looks alike: allowed when ddl is lifted.
NOT_LAYER_DDL = [
    "CREATE TABLE public.extra (cow int, cow_changes text DEFAULT 'cow')",
    "COMMENT ON TABLE issues IS 'cow'",
    "ALTER TABLE extra ADD COLUMN cow_overlay_x int",
    "CREATE TRIGGER audit AFTER INSERT ON extra FOR EACH ROW EXECUTE FUNCTION audit_row()",
    "CREATE INDEX ON extra (cow_changes)",
    "DROP TABLE extra",
]


@pytest.mark.parametrize(("sql", "rule"), REFUSED)
def test_refused_naming_the_rule(sql: str, rule: str) -> None:
    result = analyze(sql)
    assert result.error is not None, sql
    sqlstate, message = result.error
    assert sqlstate == "42501"
    assert f'rule "{rule}"' in message
    assert analyze(sql, in_session=False).error is None  # untagged connections are not judged


@pytest.mark.parametrize(("sql", "rule"), [(s, r) for s, r in REFUSED if r != "layer" and s not in LAYER_DDL])
def test_rules_can_be_lifted(sql: str, rule: str) -> None:
    result = analyze(sql, policy=Policy(frozenset({rule})))
    # (Lifted, an unqualified CREATE still meets the layer rule: in a session it would land in the overlay.)
    unqualified = result.error is not None and "without a schema" in result.error[1]
    assert result.error is None or 'rule "' not in result.error[1] or unqualified, result.error


def test_the_layer_rule_cannot_be_lifted() -> None:
    with pytest.raises(ConfigError, match="layer"):
        Policy.from_names(["layer"])
    everything = Policy(ALLOWABLE)
    assert 'rule "layer"' in (analyze("SELECT * FROM cow.sessions", policy=everything).error or ("", ""))[1]


@pytest.mark.parametrize("sql", LAYER_DDL)
def test_lifted_ddl_still_may_not_name_the_layer(sql: str) -> None:
    result = analyze(sql, policy=Policy(ALLOWABLE))
    assert result.error is not None and 'rule "layer"' in result.error[1], result.error


@pytest.mark.parametrize("sql", NOT_LAYER_DDL)
def test_lifted_ddl_that_does_not_name_the_layer(sql: str) -> None:
    assert analyze(sql, policy=Policy(ALLOWABLE)).error is None


def test_lifted_do_still_judges_the_statements_inside() -> None:
    do = Policy(frozenset({"do"}))
    assert analyze("DO $$ BEGIN UPDATE issues SET title = 'x'; END $$", policy=do).error is None
    inner = analyze("DO $$ BEGIN DELETE FROM cow.sessions; END $$", policy=do).error
    assert inner is not None and 'rule "layer"' in inner[1]
    ddl = analyze("DO $$ BEGIN CREATE TABLE t3 (id int); END $$", policy=do).error
    assert ddl is not None and 'rule "ddl"' in ddl[1]
    built = analyze("DO $$ BEGIN EXECUTE 'DELETE FROM ' || 'cow.sessions'; END $$", policy=do).error
    assert built is not None and 'rule "dynamic"' in built[1]


def test_the_fast_path_does_not_skip_the_policy() -> None:
    """Plain SELECTs skip the parser; one that names the layer does not (with or without CoW tables)."""
    for catalog in (CATALOG, Catalog.empty()):
        result = Analyzer().analyze("SELECT status FROM cow.sessions", catalog, True)
        assert result.error is not None and result.error[0] == "42501"
        result = Analyzer().analyze("SELECT pg_read_file('x')", catalog, True)
        assert result.error is not None and result.error[0] == "42501"


def test_every_rule_is_documented() -> None:
    assert set(RULES) - ALLOWABLE == {"layer"}


@pytest.mark.parametrize(
    ("value", "allow"),
    [(["ddl", "do"], {"ddl", "do"}), ("ddl, function", {"ddl", "function"}), (["DDL"], {"ddl"}), ([], set())],
)
def test_session_allow_in_the_config(value: object, allow: set[str]) -> None:
    config = build_config({"upstream": "127.0.0.1:5432", "session_allow": value})
    assert config.session_allow.allow == frozenset(allow)


@pytest.mark.parametrize("value", [["layer"], ["nope"], "ddl,layer", 3, [1]])
def test_session_allow_refuses_unknown_rules(value: object) -> None:
    with pytest.raises(ConfigError, match="session_allow"):
        build_config({"upstream": "127.0.0.1:5432", "session_allow": value})


def test_the_binding_secret_comes_from_a_file_or_the_environment(tmp_path: Path) -> None:
    secret = "s" * 20
    path = tmp_path / "secret"
    path.write_text(secret + "\n")
    config = build_config({"upstream": "127.0.0.1:5432", "bind_secret_file": str(path)}, environ={})
    assert config.bind_secret == secret and secret not in repr(config)
    from_env = build_config({"upstream": "127.0.0.1:5432"}, environ={"COW_BIND_SECRET": secret})
    assert from_env.bind_secret == secret
    assert build_config({"upstream": "127.0.0.1:5432"}, environ={}).bind_secret is None


@pytest.mark.parametrize(
    ("content", "message"), [(None, "cannot read"), ("", "is empty"), ("short", "at least 16")]
)
def test_a_bad_binding_secret_file_is_one_line_at_startup(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "secret"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        build_config({"upstream": "127.0.0.1:5432", "bind_secret_file": str(path)}, environ={})


def test_the_secret_itself_is_no_setting() -> None:
    with pytest.raises(ConfigError, match="unknown setting"):
        build_config({"upstream": "127.0.0.1:5432", "bind_secret": "s" * 20}, environ={})
