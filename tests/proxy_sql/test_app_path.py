"""The analysis of the application's search_path changes on a tagged connection (rewrites/app_path.py)."""

from __future__ import annotations

import json

import pytest

from proxy.sql import Analyzer, Catalog
from proxy.sql.rewrites.app_path import text_array, visible_path

# One CoW table: the rule runs in a session of a database with the layer.
CATALOG = Catalog.from_rows(
    [
        (
            "public",
            "docs",
            "cow_overlay_public",
            json.dumps(
                {
                    "pk": ["id"],
                    "key": ["id"],
                    "columns": [{"name": "id", "type": "integer", "generated": False, "identity": False}],
                    "unique": [],
                    "referenced_by": [],
                }
            ),
            "180000",
        )
    ]
)

REWRITES = [
    (
        "SET search_path = tenant_1, public",
        "DO $$BEGIN SET search_path TO tenant_1, public; PERFORM cow._adopt_app_path(false); END$$",
        ("DO", "SET"),
    ),
    (
        'SET LOCAL search_path TO "Tenant 2"',
        'DO $$BEGIN SET LOCAL search_path TO "Tenant 2"; PERFORM cow._adopt_app_path(true); END$$',
        ("DO", "SET"),
    ),
    (
        "SET SCHEMA 'public'",
        "DO $$BEGIN SET search_path TO public; PERFORM cow._adopt_app_path(false); END$$",
        ("DO", "SET"),
    ),
    (
        "SET search_path TO DEFAULT",
        "DO $$BEGIN SET search_path TO DEFAULT; PERFORM cow._adopt_app_path(false); END$$",
        ("DO", "SET"),
    ),
    (
        "RESET search_path",
        "DO $$BEGIN RESET search_path; PERFORM cow._adopt_app_path(false); END$$",
        ("DO", "RESET"),
    ),
    (  # the dollar quote never meets the statement's own text
        "SET search_path = '$$'",
        'DO $outer$BEGIN SET search_path TO "$$"; PERFORM cow._adopt_app_path(false); END$outer$',
        ("DO", "SET"),
    ),
    (
        "SELECT set_config('search_path', 'a,b', false)",
        "SELECT cow.set_app_path('a,b', false) AS set_config",
        None,
    ),
    (
        "SELECT pg_catalog.set_config('SEARCH_PATH'::text, $1, true) AS p, 1",
        "SELECT cow.set_app_path($1, true) AS p, 1",
        None,
    ),
]


@pytest.mark.parametrize(("sql", "sent", "tag_map"), REWRITES)
def test_path_changes_are_rewritten_in_a_session(
    sql: str, sent: str, tag_map: tuple[str, str] | None
) -> None:
    result = Analyzer().analyze(sql, CATALOG, True)
    assert not result.tampers
    assert result.rewritten == sent
    assert result.tag_map == tag_map


@pytest.mark.parametrize(
    "sql",
    [
        "SET search_path = a; SELECT 1",
        "SELECT 1; RESET search_path",
        "SELECT set_config(lower('SEARCH_PATH'), 'a', false)",
        "SELECT set_config(setting_name => 'search_path', new_value => 'a', is_local => false)",
        "DO $$ BEGIN SET search_path = a; END $$",
        "DO $$ BEGIN PERFORM set_config('search_path', 'a', false); END $$",
        "DO $$ BEGIN SET ROLE app; END $$",
    ],
)
def test_path_changes_the_proxy_cannot_follow_are_tampering(sql: str) -> None:
    assert Analyzer().analyze(sql, CATALOG, True).tampers


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        (
            "INSERT INTO tenant_x.docs VALUES (1)",
            "INSERT on tenant_x.docs refused in a session: schema tenant_x",
        ),
        ("WITH a AS (DELETE FROM other.t RETURNING 1) SELECT * FROM a", "DELETE on other.t"),
        ("UPDATE other.t SET x = 1", "cowproxy install --schema other"),
        ("COPY other.t FROM STDIN", "COPY on other.t"),
        ("TRUNCATE other.t", "TRUNCATE on other.t"),
        ("INSERT INTO cow_changes.t1 (x) VALUES (1)", 'rule "layer"'),
    ],
)
def test_writes_to_schemas_without_the_layer_are_refused(sql: str, message: str) -> None:
    """In a session a write to a table of a schema without the layer would change it for real."""
    result = Analyzer().analyze(sql, CATALOG, True)
    assert result.error is not None and result.error[0] == "42501" and message in result.error[1]


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO docs VALUES (1)",  # resolved through the session's path
        "UPDATE public.docs SET id = 2",
        "DELETE FROM pg_temp.t",  # a temporary table
        "SELECT * FROM other.t",  # reads see the table as it is
    ],
)
def test_other_writes_are_not_refused(sql: str) -> None:
    assert Analyzer().analyze(sql, CATALOG, True).error is None


@pytest.mark.parametrize(
    ("sql", "unqualified", "executes", "path_change"),
    [
        ("INSERT INTO docs (id) VALUES (1)", (("docs", "insert"),), False, False),
        ("INSERT INTO public.docs (id) VALUES (1)", (), False, False),
        (
            "WITH x AS (DELETE FROM docs RETURNING id) UPDATE other SET n = 1",
            (("docs", "delete"), ("other", "update")),
            False,
            False,
        ),
        ("TRUNCATE docs, public.docs", (("docs", "truncate"),), False, False),
        ('COPY "Docs" FROM STDIN', (("Docs", "copy"),), False, False),
        ("EXECUTE ins (1)", (), True, False),
        ("SET ROLE someone", (), False, True),
        ("RESET ROLE", (), False, True),
        ("SELECT set_config('role', 'someone', true)", (), False, True),
        ("SELECT set_config('search_path', 'tenant_1', false)", (), False, True),
        ("SET search_path = tenant_1", (), False, True),
        ("SET work_mem = '8MB'", (), False, False),
        ("SELECT * FROM docs", (), False, False),
    ],
)
def test_what_the_relay_must_ask_the_server(
    sql: str, unqualified: tuple[tuple[str, str], ...], executes: bool, path_change: bool
) -> None:
    """Writes by unqualified names (and EXECUTE) resolve through the path in force when they run: the relay
    asks where (cow._unlayered_write); a change of path or role ends what it knew."""
    result = Analyzer().analyze(sql, CATALOG, in_session=True)
    assert result.error is None
    assert (sorted(result.unqualified_writes), result.executes, result.path_change) == (
        sorted(unqualified),
        executes,
        path_change,
    )
    assert result.resolves_writes == bool(unqualified or executes)
    outside = Analyzer().analyze(sql, CATALOG, in_session=False)
    assert (outside.unqualified_writes, outside.executes) == ((), False)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT set_config('search_path', 'tenant_1', false); INSERT INTO docs (id) VALUES (1)",
        "SET ROLE someone; DELETE FROM docs",
        "SELECT set_config('role', 'x', false); EXECUTE ins (1)",
    ],
)
def test_a_query_string_that_changes_the_path_and_writes_is_refused(sql: str) -> None:
    result = Analyzer().analyze(sql, CATALOG, in_session=True)
    assert result.error is not None and result.error[0] == "42501"
    assert "statement of its own" in result.error[1]


@pytest.mark.parametrize(
    ("physical", "shown"),
    [
        ('"$user", public', '"$user", public'),
        ('"$user", cow_overlay_public, public', '"$user", public'),
        ("cow_overlay_tenant_a, tenant_a, cow_overlay_public, public", "tenant_a, public"),
        ('"cow_overlay_Tenant C", "Tenant C", cow_overlay_public, public', '"Tenant C", public'),
        ('"a,cow_overlay_x", cow_overlay_b, b', '"a,cow_overlay_x", b'),
        ("COW_OVERLAY_PUBLIC, public", "public"),
        ("cow_overlay_public", ""),
    ],
)
def test_the_client_is_shown_the_path_without_overlay_schemas(physical: str, shown: str) -> None:
    assert visible_path(physical) == shown


def test_names_go_to_the_server_as_a_text_array_literal() -> None:
    assert text_array(["docs", 'We"ird\\', "a,b"]) == '{"docs","We\\"ird\\\\","a,b"}'
    assert text_array([]) == "{}"
