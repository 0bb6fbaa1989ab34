"""Classification, writes, tamper detection, the fast path and the cache."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pglast
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pglast.parser import parse_sql_json

from proxy.errors import ProxyError
from proxy.sql import Analysis, Analyzer, Catalog, CatalogError, apply_tag_map
from proxy.sql.analyze import RETURNING_MARK, _inspect
from proxy.sql.deparse import deparse
from proxy.sql.policy import DEFAULT_POLICY
from proxy.sql.rewrites import lateral
from proxy.sql.rewrites.base import Context

from . import catalogs
from .catalogs import SAMPLE, rows, sample_catalog

CATALOG = sample_catalog()


def _written(sql: str) -> str:
    """The expected statement as the deparser writes it (its tree: the test's text may be formatted
    otherwise)."""
    return "\n; ".join(deparse(raw) for raw in pglast.parse_sql(sql))


def analyze(
    sql: str, in_session: bool = True, catalog: Catalog = CATALOG, prepared: bool = False
) -> Analysis:
    return Analyzer().analyze(sql, catalog, in_session, prepared=prepared)


@pytest.mark.parametrize(
    ("sql", "kind"),
    [
        ("SELECT 1", "select"),
        ("(SELECT 1) UNION SELECT 2", "select"),
        ("VALUES (1)", "select"),
        ("WITH x AS (SELECT 1) SELECT * FROM x", "select"),
        ("WITH x AS (DELETE FROM t RETURNING *) SELECT * FROM x", "select"),
        ("INSERT INTO t VALUES (1)", "insert"),
        ("UPDATE t SET a = 1", "update"),
        ("DELETE FROM t", "delete"),
        ("TRUNCATE t", "delete"),
        ("MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN DELETE", "merge"),
        ("COPY t FROM STDIN", "copy"),
        ("COPY t TO STDOUT", "copy"),
        ("CREATE TABLE x (a int)", "ddl"),
        ("ALTER TABLE x ADD b int", "ddl"),
        ("DROP TABLE x", "ddl"),
        ("CREATE INDEX ON x (a)", "ddl"),
        ("SELECT 1 INTO x", "ddl"),
        ("BEGIN", "transaction"),
        ("start transaction isolation level serializable", "transaction"),
        ("COMMIT", "transaction"),
        ("ROLLBACK TO SAVEPOINT a", "transaction"),
        ("SET statement_timeout = 5", "utility"),
        ("SHOW search_path", "utility"),
        ("EXPLAIN SELECT 1", "utility"),
        ("LISTEN chan", "utility"),
        ("SELECT 1; SELECT 2", "multi"),
        ("SELEC 1", "other"),
        ("", "other"),
    ],
)
def test_kind(sql: str, kind: str) -> None:
    for in_session in (False, True):
        assert analyze(sql, in_session).kind == kind


@pytest.mark.parametrize(
    ("sql", "writes"),
    [
        ("SELECT * FROM projects", ()),
        ("INSERT INTO projects (id) VALUES (1)", (("public.projects", "insert"),)),
        ("UPDATE app.events SET payload = '{}'", (("app.events", "update"),)),
        ("DELETE FROM elsewhere.x", (("elsewhere.x", "delete"),)),
        (
            "WITH d AS (DELETE FROM comments RETURNING issue_id) UPDATE issues SET points = 0 "
            "WHERE id IN (SELECT issue_id FROM d)",
            (("public.issues", "update"), ("public.comments", "delete")),
        ),
        ("TRUNCATE comments, scratch", (("public.comments", "truncate"), ("scratch", "truncate"))),
        ("COPY comments FROM STDIN", (("public.comments", "copy"),)),
        ("COPY comments TO STDOUT", ()),
    ],
)
def test_writes(sql: str, writes: tuple[tuple[str, str], ...]) -> None:
    assert analyze(sql, in_session=False).writes == writes


TAMPERS = [
    "SET cow.session_id = 'other'",
    "SET session_replication_role = replica",
    "SELECT set_config('session_replication_role', 'replica', false)",
    "SET SESSION cow.session_id = DEFAULT",
    "SET \"cow.session_id\" = 'x'",
    "RESET cow.session_id",
    "RESET ALL",
    "DISCARD ALL",
    "SET SESSION AUTHORIZATION postgres",
    "SELECT set_config('cow.session_id', 'x', false)",
    "SELECT set_config($1, $2, false)",  # a name known only at run time
    "SELECT 1 WHERE set_config('cow.app_search_path', 'x', true) IS NOT NULL",
    "SELECT cow.use_session('S', 'O')",
    "SELECT cow.use_session(NULL)",
    "SELECT 1; SET cow.session_id = 'x'",
    "PREPARE p AS SELECT set_config('cow.session_id', $1, false)",
    "DO $$ BEGIN PERFORM set_config('cow.session_id', 'x', false); END $$",
    "DO $$ BEGIN EXECUTE 'SET search_path TO public'; END $$",
    "DO LANGUAGE plpgsql $$ BEGIN PERFORM cow.use_session(NULL); END $$",
    "DO $$ BEGIN IF true THEN RESET ALL; END IF; END $$",
    "DO $$ DECLARE x text; BEGIN x := set_config('search_path', 'public', false); END $$",
    "DO $$ BEGIN EXECUTE format('SET %I = %L', 'cow.session_id', 'x'); END $$",
    "DO $$ DECLARE q text := 'SET ROLE ' || 'admin'; BEGIN EXECUTE q; END $$",  # dynamic: the word search
    "DO $$ BEGIN EXECUTE 'DO $i$ BEGIN PERFORM set_config(''cow.session_id'', ''o'', true); END $i$'; END $$",
    "DO LANGUAGE plperl $$ spi_exec_query('SET search_path TO public') $$",
    "/*cow_session='S'*/ SET cow.session_id = 'x'",
]


@pytest.mark.parametrize("sql", TAMPERS)
def test_tampers(sql: str) -> None:
    assert analyze(sql, in_session=False).tampers
    assert analyze(sql, in_session=True).tampers


NOT_TAMPERS = [
    "SELECT 1",
    # the operation only groups the session's own writes
    "SET LOCAL cow.operation_id TO 'x'",
    "SELECT 1 WHERE set_config('cow.operation_id', 'x', true) IS NOT NULL",
    "SET statement_timeout = 1000",
    "SET LOCAL lock_timeout = '1s'",
    "RESET statement_timeout",
    "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
    "DISCARD PLANS",
    "DISCARD TEMP",
    "SELECT set_config('application_name', 'x', false)",
    # the role may change (the binding holds for any role); search_path changes are rewritten (test_app_path)
    "SET ROLE postgres",
    "SET LOCAL ROLE authenticated",
    "RESET ROLE",
    "SET ROLE NONE",
    "SELECT set_config('role', 'authenticated', true)",
    "SELECT current_setting('cow.session_id', true)",
    "SELECT 'SET cow.session_id = 1'",
    "SELECT * FROM offset_settings",
    "DO $$ BEGIN RAISE NOTICE 'hello'; END $$",
    "DO $$ BEGIN UPDATE users SET role = 'admin' WHERE id = 1; END $$",  # a column named role
    "DO $$ DECLARE role text := 'x'; BEGIN role := upper(role); role = role || '!'; END $$",
    "DO $$ BEGIN EXECUTE 'UPDATE users SET role = 1'; PERFORM 1; END $$",
    "DO $$ DECLARE r record; BEGIN FOR r IN SELECT * FROM t LOOP RAISE NOTICE '% reset', r; END LOOP; END $$",
    "CREATE FUNCTION f() RETURNS void LANGUAGE sql AS $$ SELECT set_config('cow.session_id', 'x', false) $$",
    "CREATE FUNCTION g() RETURNS int LANGUAGE sql SET search_path = public BEGIN ATOMIC SELECT 1; END",
    "ALTER FUNCTION g() SET search_path = public",
    "ALTER ROLE app SET search_path = public",
    "ALTER DATABASE app SET cow.session_id = 'x'",
    "ALTER SYSTEM SET search_path = 'public'",
]


@pytest.mark.parametrize("sql", NOT_TAMPERS)
def test_not_tampers(sql: str) -> None:
    assert not analyze(sql, in_session=True).tampers


def test_cache_hits_by_stripped_text() -> None:
    analyzer = Analyzer(cache_size=2)
    first = analyzer.analyze("/*cow_session='A'*/ SELECT * FROM public.projects", CATALOG, True)
    second = analyzer.analyze("SELECT * FROM public.projects /*cow_session='B'*/", CATALOG, True)
    assert (first.cache_hit, second.cache_hit) == (False, True)
    assert second.rewritten == first.rewritten == "SELECT * FROM cow_public.projects"
    assert (analyzer.hits, analyzer.misses) == (1, 1)
    # in_session and the catalog are part of the key
    assert analyzer.analyze("SELECT * FROM public.projects", CATALOG, False).rewritten is None
    # an equal catalog (another connection to the same database) shares the entries; another does not
    assert analyzer.analyze("SELECT * FROM public.projects", sample_catalog(), True).cache_hit is True
    other = Catalog.from_rows(rows({("public", "projects"): SAMPLE[("public", "projects")]}))
    assert analyzer.analyze("SELECT * FROM public.projects", other, True).cache_hit is False
    assert analyzer.misses == 3


def test_cache_is_bounded_lru() -> None:
    analyzer = Analyzer(cache_size=2)
    for sql in ("SELECT 1", "SELECT 2", "SELECT 1", "SELECT 3", "SELECT 1", "SELECT 2"):
        analyzer.analyze(sql, CATALOG, True)
    # SELECT 2 was evicted by SELECT 3 (SELECT 1 had been used more recently)
    assert (analyzer.hits, analyzer.misses) == (2, 4)


def test_empty_catalog_never_rewrites() -> None:
    result = analyze("TRUNCATE projects", catalog=Catalog.empty())
    assert result.rewritten is None and result.error is None
    assert not Catalog.empty().has_cow_tables and CATALOG.has_cow_tables


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM public.projects",
        'SELECT * FROM "public"."projects"',
        "SELECT * FROM PUBLIC.projects",
        'SELECT * FROM U&"\\0070ublic".projects',
    ],
)
def test_fast_path_never_hides_a_qualified_cow_name(sql: str) -> None:
    assert analyze(sql).rewritten == "SELECT * FROM cow_public.projects"


def test_merge_is_passed_to_the_server_when_the_version_is_unknown() -> None:
    result = Analyzer().analyze(
        "MERGE INTO projects p USING s ON p.id = s.id WHEN MATCHED THEN DELETE", CATALOG, True
    )
    assert result.error is None


@pytest.mark.parametrize(
    ("tag", "tag_map", "client"),
    [
        ("SELECT 3", ("SELECT", "INSERT 0"), "INSERT 0 3"),
        ("DELETE 5", ("DELETE", "TRUNCATE TABLE"), "TRUNCATE TABLE"),
        ("DELETE 0", ("DELETE", "TRUNCATE TABLE"), "TRUNCATE TABLE"),
        ("UPDATE 2", ("DELETE", "TRUNCATE TABLE"), "UPDATE 2"),
        ("SELECT 3", None, "SELECT 3"),
        ("SELECTX 3", ("SELECT", "INSERT 0"), "SELECTX 3"),
    ],
)
def test_apply_tag_map(tag: str, tag_map: tuple[str, str] | None, client: str) -> None:
    assert apply_tag_map(tag, tag_map) == client


def test_huge_statements_are_analysed_but_not_cached() -> None:
    analyzer = Analyzer()
    values = ", ".join(f"({i}, 'p{i}')" for i in range(2000))
    sql = f"INSERT INTO projects (id, name) VALUES {values} ON CONFLICT (id) DO NOTHING"
    first = analyzer.analyze(sql, CATALOG, True)
    second = analyzer.analyze(sql, CATALOG, True)
    assert first.rewritten is not None and first.rewritten == second.rewritten
    assert (analyzer.hits, analyzer.misses) == (0, 2)


@pytest.mark.parametrize(
    "row",
    [
        ("public", "t", "cow_public"),
        ("public", "t", "cow_public", "not json"),
        ("public", "t", "cow_public", '{"pk": []}'),
        ("public", None, "cow_public", "{}"),
    ],
)
def test_malformed_catalog_rows_raise_catalog_error(row: tuple[str | None, ...]) -> None:
    with pytest.raises(CatalogError) as info:
        Catalog.from_rows([row])
    assert isinstance(info.value, ProxyError)


@pytest.mark.parametrize(
    ("sql", "dependent"),
    [
        # Rewrites that read columns, keys or foreign keys from the catalog, or decide by it.
        ("TRUNCATE projects", True),
        ("TRUNCATE brand_new", True),
        ("INSERT INTO projects VALUES (1, 'a', 2) ON CONFLICT DO NOTHING", True),
        ("INSERT INTO brand_new VALUES (1) ON CONFLICT (id) DO NOTHING", True),
        ("COPY projects TO STDOUT", True),
        ("COPY brand_new FROM STDIN", True),
        ("MERGE INTO projects p USING s ON p.id = s.id WHEN MATCHED THEN DELETE", True),
        ("ALTER TABLE projects ADD COLUMN x int", True),
        ("SELECT * FROM public.brand_new", True),  # a table the layer may have enabled since
        # Ordinary statements, and qualified names the catalog knows or in schemas it has no table of.
        ("SELECT * FROM projects", False),
        ("INSERT INTO projects VALUES (1, 'a', 2)", False),
        ("UPDATE projects SET name = 'b' WHERE id = 1", False),
        ("DELETE FROM public.projects WHERE id = 1", False),
        ("SELECT * FROM public.projects p JOIN issues i ON i.project_id = p.id", False),
        ("SELECT * FROM pg_catalog.pg_class", False),
        ("SELECT * FROM other_schema.t", False),
    ],
)
def test_catalog_dependent(sql: str, dependent: bool) -> None:
    assert analyze(sql).catalog_dependent is dependent
    assert not analyze(sql, in_session=False).catalog_dependent


@pytest.mark.parametrize(
    ("sql", "in_session", "json_parse", "full_parse"),
    [
        ("SELECT p.name, count(*) FROM projects p GROUP BY p.id", False, False, False),  # untagged: fast path
        ("SELECT p.name, max(p.id) FROM projects p ORDER BY p.id", True, False, False),  # no GROUP BY
        ("SELECT count(*) FROM projects p, other o", True, True, False),  # no lone count of a CoW table
        ("SELECT x, count(*) FROM other GROUP BY x", True, True, False),  # no CoW table in its FROM
        ("SELECT p.name, count(*) FROM projects p GROUP BY p.name", True, True, True),  # parsed, unchanged
        ("SELECT p.name, count(*) FROM projects p GROUP BY p.id", True, True, True),
    ],
)
def test_group_by_classification_stays_cheap(
    monkeypatch: pytest.MonkeyPatch, sql: str, in_session: bool, json_parse: bool, full_parse: bool
) -> None:
    import pglast

    from proxy.sql import analyze as module

    calls = {"json": 0, "full": 0}

    def counting(name: str, real: Any) -> Any:
        def call(*args: Any) -> Any:
            calls[name] += 1
            return real(*args)

        return call

    monkeypatch.setattr(module, "parse_sql_json", counting("json", module.parse_sql_json))
    monkeypatch.setattr(module.pglast, "parse_sql", counting("full", pglast.parse_sql))
    result = Analyzer().analyze(sql, CATALOG, in_session)
    assert (calls["json"] > 0, calls["full"] > 0) == (json_parse, full_parse)
    assert (result.rewritten is not None) == (sql.endswith("GROUP BY p.id") and in_session)


CHAIN = "FROM comments c JOIN issues i ON i.id = c.issue_id JOIN projects p ON p.id = i.project_id"


@pytest.mark.parametrize(
    ("sql", "rewritten"),
    [
        (
            f"SELECT * {CHAIN} WHERE c.id = $1",
            "SELECT * FROM comments AS c INNER JOIN LATERAL (SELECT * FROM issues AS i WHERE i.id = "
            "c.issue_id "
            "OFFSET 0) AS i ON TRUE INNER JOIN LATERAL (SELECT * FROM projects AS p WHERE p.id = "
            "i.project_id "
            "OFFSET 0) AS p ON TRUE WHERE c.id = $1",
        ),
        (  # LEFT JOIN, the key on the right of '=', an extra condition, no alias, LIMIT
            "SELECT * FROM comments c LEFT JOIN issues i ON c.issue_id = i.id AND i.points > 2 "
            "JOIN projects ON projects.id = i.project_id LIMIT 5",
            "SELECT * FROM comments AS c LEFT JOIN LATERAL (SELECT * FROM issues AS i WHERE c.issue_id "
            "= i.id "
            "AND i.points > 2 OFFSET 0) AS i ON TRUE INNER JOIN LATERAL (SELECT * FROM projects WHERE "
            "projects.id = i.project_id OFFSET 0) AS projects ON TRUE LIMIT 5",
        ),
        (  # a composite key, whole; a join on a non-key column stays
            "SELECT * FROM comments c JOIN labels l ON l.project_id = c.id AND l.name = 'x' "
            "JOIN members m ON m.project_id = l.project_id WHERE c.id = 1",
            "SELECT * FROM comments AS c INNER JOIN LATERAL (SELECT * FROM labels AS l WHERE "
            "l.project_id = c.id "
            "AND l.name = 'x' OFFSET 0) AS l ON TRUE INNER JOIN members AS m ON m.project_id = l.project_id "
            "WHERE c.id = 1",
        ),
        (  # a unique key other than the primary key
            "SELECT * FROM comments c JOIN issues i ON i.id = c.issue_id "
            "JOIN projects p ON p.name = i.title WHERE c.id = 1",
            "SELECT * FROM comments AS c INNER JOIN LATERAL (SELECT * FROM issues AS i WHERE i.id = "
            "c.issue_id "
            "OFFSET 0) AS i ON TRUE INNER JOIN LATERAL (SELECT * FROM projects AS p WHERE p.name = i.title "
            "OFFSET 0) AS p ON TRUE WHERE c.id = 1",
        ),
        (f"SELECT * {CHAIN}", None),  # whole tables: a hash join beats a probe per row
        (f"SELECT count(*) {CHAIN} WHERE p.name = $1", None),  # a filter on the last table only
        (f"SELECT * {CHAIN} WHERE c.id = i.points", None),  # not a restriction by values
        (f"SELECT * {CHAIN} ORDER BY p.name LIMIT 3", None),  # the order needs every row
        # (a locking SELECT loses its clause to rewrites/row_locks.py first: fixtures row_lock_*)
        (  # two tables, the first pinned by its key (= or IN)
            "SELECT * FROM comments c JOIN issues i ON i.id = c.issue_id WHERE c.id = 1",
            "SELECT * FROM comments AS c INNER JOIN LATERAL (SELECT * FROM issues AS i "
            "WHERE i.id = c.issue_id OFFSET 0) AS i ON TRUE WHERE c.id = 1",
        ),
        (
            "SELECT * FROM comments c JOIN issues i ON i.id = c.issue_id WHERE c.id IN ($1, $2)",
            "SELECT * FROM comments AS c INNER JOIN LATERAL (SELECT * FROM issues AS i "
            "WHERE i.id = c.issue_id OFFSET 0) AS i ON TRUE WHERE c.id IN ($1, $2)",
        ),
        # two tables, the first only restricted: it may still hold many rows
        ("SELECT * FROM comments c JOIN issues i ON i.id = c.issue_id WHERE c.id > 1", None),
        ("SELECT * FROM comments c JOIN issues i ON i.id = c.issue_id WHERE c.body = $1 LIMIT 5", None),
        ("SELECT * FROM comments c JOIN issues i ON i.id = c.issue_id WHERE c.id BETWEEN 1 AND 1", None),
        (  # one-to-many joins on indexed columns
            "SELECT * FROM projects p JOIN issues i ON i.project_id = p.id "
            "JOIN comments c ON c.issue_id = i.id WHERE p.id = 1",
            "SELECT * FROM projects AS p INNER JOIN LATERAL (SELECT * FROM issues AS i "
            "WHERE i.project_id = p.id OFFSET 0) AS i ON TRUE INNER JOIN LATERAL (SELECT * FROM comments "
            "AS c WHERE c.issue_id = i.id OFFSET 0) AS c ON TRUE WHERE p.id = 1",
        ),
        (  # a column no index leads; USING; a key compared with itself or an unqualified name of the table
            "SELECT * FROM comments c JOIN labels l ON l.name = c.body "
            "JOIN issues i USING (id) JOIN projects p ON p.id = p.id + 0 "
            "JOIN members m ON m.id = email WHERE c.id = 1",
            None,
        ),
        (  # a subquery in the condition; a CTE that shadows a table name
            "WITH projects AS (SELECT 1 AS id) SELECT * FROM comments c "
            "JOIN issues i ON i.id = (SELECT max(id) FROM comments) JOIN projects p ON p.id = i.project_id "
            "WHERE c.id = 1",
            None,
        ),
    ],
)
def test_key_joins_of_cow_tables_become_lateral_subqueries(sql: str, rewritten: str | None) -> None:
    assert analyze(sql).rewritten == (rewritten and _written(rewritten))
    assert analyze(sql, in_session=False).rewritten is None


_HAS_VERSION = (
    "EXISTS (SELECT 1 FROM cow_changes.t{n} AS _cow_x WHERE _cow_x._cow_session = "
    "(SELECT cow._session()) AND _cow_x._cow_current AND {keys})"
)
_LIVE = "{a}._cow_session = (SELECT cow._session()) AND {a}._cow_current AND NOT {a}._cow_deleted"


def _split(
    table: str, alias: str, n: int, keys: str, *, name: str = "count", where: Sequence[str] = ()
) -> str:
    """The proxy's split count of public.<table> (changes table t<n>) under the AND of ``where``."""
    base = f"public.{table} AS {alias}"
    has_version = _HAS_VERSION.format(n=n, keys=keys)
    live = _LIVE.format(a=alias)
    if not where:
        return (
            f"SELECT (SELECT count(*) FROM {base}) - (SELECT count(*) FROM {base} WHERE {has_version}) "
            f"+ (SELECT count(*) FROM cow_changes.t{n} AS {alias} WHERE {live}) AS {name}"
        )
    terms = " AND ".join(f"({term})" for term in where)
    return (
        f"SELECT (SELECT count(*) FROM {base} WHERE {terms}) - (SELECT count(*) FROM {base} WHERE {terms} "
        f"AND {has_version}) + (SELECT count(*) FROM cow_changes.t{n} AS {alias} WHERE {live} "
        f"AND {terms}) AS {name}"
    )


@pytest.mark.parametrize(
    ("sql", "rewritten"),
    [
        ("SELECT count(*) FROM issues", _split("issues", "issues", 2, "_cow_x.id = issues.id")),
        (  # Django's paginator; a composite key; parameters, functions and LIKE
            'SELECT COUNT(*) AS "__count" FROM labels WHERE lower(color) LIKE $1 AND project_id = $2',
            _split(
                "labels",
                "labels",
                5,
                "_cow_x.project_id = labels.project_id AND _cow_x.name = labels.name",
                name='"__count"',
                where=["lower(color) LIKE $1", "project_id = $2"],
            ),
        ),
        (  # schema-qualified (the overlay rewrite runs first), aliased, with IN, IS NULL and a cast
            "select count(*) as n from public.issues i where i.points in (1, 2) or i.title::text is null",
            _split(
                "issues",
                "i",
                2,
                "_cow_x.id = i.id",
                name="n",
                where=["i.points IN (1, 2) OR i.title::text IS NULL"],
            ),
        ),
        (  # in a scalar subquery: that part only
            "SELECT 1 + (SELECT count(*) FROM comments WHERE issue_id = 3)",
            "SELECT 1 + ("
            + _split("comments", "comments", 3, "_cow_x.id = comments.id", where=["issue_id = 3"])
            + ")",
        ),
        # left as written: the view answers
        ("SELECT count(*) FROM issues WHERE random() < 0.5", None),  # volatile
        ("SELECT count(*) FROM issues WHERE id IN (SELECT issue_id FROM comments)", None),  # subquery
        ("SELECT count(*) FROM issues i WHERE i IS NOT NULL", None),  # whole row
        ("SELECT count(*) FROM issues WHERE slug = 'x' AND x.y = 1", None),  # not its column
        ("SELECT count(*) FROM issues GROUP BY points", None),
        ("SELECT count(*), max(points) FROM issues", None),
        (  # count(x): the rows where x is not null (SQLAlchemy's func.count(Model.id))
            "SELECT count(i.title) AS n FROM issues i WHERE i.points > 1",
            _split(
                "issues", "i", 2, "_cow_x.id = i.id", name="n", where=["i.points > 1", "i.title IS NOT NULL"]
            ),
        ),
        ("SELECT count(DISTINCT points) FROM issues", None),
        ("SELECT count(random()) FROM issues", None),
        ("SELECT count(i) FROM issues i", None),  # a whole row
        ("SELECT count(id) FROM (SELECT id FROM issues) s", None),
        ("SELECT count(*) FILTER (WHERE points > 1) FROM issues", None),
        ("SELECT count(*) FROM issues LIMIT 1", None),
        ("SELECT count(*) FROM issues, comments", None),
        ("SELECT count(*) FROM ONLY issues", None),
        ("SELECT count(*) FROM members", None),  # row security: the view's owner would bypass it
        ("WITH issues AS (SELECT 1 AS id) SELECT count(*) FROM issues", None),
        # SQLAlchemy's Query.count(): the count of a query of the table's columns
        (
            "SELECT count(*) AS count_1 FROM (SELECT issues.id AS issues_id, issues.title AS issues_title "
            "FROM issues WHERE issues.points = $1 ORDER BY issues.id) AS anon_1",
            _split(
                "issues", "issues", 2, "_cow_x.id = issues.id", name="count_1", where=["issues.points = $1"]
            ),
        ),
        (
            "SELECT count(*) FROM (SELECT * FROM issues) s",
            _split("issues", "issues", 2, "_cow_x.id = issues.id"),
        ),
        ("SELECT count(*) FROM (SELECT generate_series(1, points) FROM issues) s", None),  # rows per row
        ("SELECT count(*) FROM (SELECT id FROM issues FETCH FIRST 3 ROWS WITH TIES) s", None),
        ("SELECT count(*) FROM (SELECT id FROM issues LIMIT random()) s", None),
        ("SELECT count(*) FROM (SELECT id FROM issues OFFSET (SELECT 1)) s", None),
        ("SELECT count(*) FROM (SELECT DISTINCT points FROM issues) s", None),
        ("SELECT count(*) FROM (SELECT id FROM issues) s WHERE s.id > 3", None),
        ("SELECT count(*) FROM (SELECT nosuch FROM issues) s", None),  # the server's 42703, not a count
        ("SELECT count(*) FROM (SELECT id FROM issues WHERE random() < 0.5) s", None),
    ],
)
def test_count_of_a_cow_table_is_split(sql: str, rewritten: str | None) -> None:
    assert analyze(sql).rewritten == (rewritten and _written(rewritten))
    assert analyze(sql, in_session=False).rewritten is None


def test_an_unqualified_name_of_two_cow_tables_is_not_split() -> None:
    spec = {**catalogs.SAMPLE, ("app", "issues"): catalogs.SAMPLE[("public", "issues")]}
    catalog = Catalog.from_rows(catalogs.rows(spec))
    assert analyze("SELECT count(*) FROM issues", catalog=catalog).rewritten is None
    assert analyze("SELECT count(*) FROM app.issues", catalog=catalog).rewritten is not None


def test_a_keyless_table_is_not_split() -> None:
    (schema, name, overlay, doc), *rest = catalogs.rows()
    info = json.loads(doc)
    info["key"] = []
    catalog = Catalog.from_rows([(schema, name, overlay, json.dumps(info)), *rest])
    assert analyze(f"SELECT count(*) FROM {name}", catalog=catalog).rewritten is None


def _key_read(spec: tuple[str, int, str, str], versions: str, outer: str, base: str = "") -> str:
    """The proxy's key read of public.<table> (spec: table, number of its changes table, columns, key): the
    session's versions under ``versions``, the client's statement ``outer`` with ``{t}`` for the FROM item,
    ``base`` the conditions the base branch holds itself (those of a named statement's key range)."""
    table, n, columns, key = spec
    cte = (
        f"WITH _cow_versions AS MATERIALIZED (SELECT {columns}, _cow_deleted FROM cow_changes.t{n} "
        "WHERE _cow_session = (SELECT cow._session()) AND _cow_current "
        f"AND {versions}) "
    )
    key_row = key if "," not in key else f"({key})"
    not_null = " AND ".join(f"{k} IS NOT NULL" for k in key.split(", "))
    base = f"{base} AND " if base else ""
    merged = (
        f"(SELECT _cow_b.* FROM public.{table} AS _cow_b WHERE {base}{key_row} NOT IN "
        f"(SELECT {key} FROM _cow_versions WHERE {not_null}) "
        f"UNION ALL SELECT {columns} FROM _cow_versions WHERE NOT _cow_deleted)"
    )
    return cte + outer.format(t=merged)


_PROJECTS = ("projects", 1, "id, name, budget", "id")
_LABELS = ("labels", 5, "project_id, name, color, pos", "project_id, name")


@pytest.mark.parametrize(
    ("sql", "rewritten"),
    [
        (
            "SELECT * FROM projects WHERE id = $1",
            _key_read(_PROJECTS, "id = $1", "SELECT * FROM {t} AS projects WHERE id = $1"),
        ),
        (  # Prisma: schema-qualified names, LIMIT and OFFSET parameters
            'SELECT "public"."projects"."name" FROM "public"."projects" WHERE ("public"."projects"."id" = $1 '
            "AND 1=1) LIMIT $2 OFFSET $3",
            _key_read(
                _PROJECTS,
                "id = $1",
                "SELECT projects.name FROM {t} AS projects WHERE (projects.id = $1 AND 1 = 1) "
                "LIMIT $2 OFFSET $3",
            ),
        ),
        (  # bounds on either side, reversed operands, other conditions stay outside only
            "SELECT p.name FROM projects p WHERE $1 < p.id AND p.id <= $2 + 10 AND p.budget > 0 "
            "ORDER BY p.id",
            _key_read(
                _PROJECTS,
                "$1 < id AND id <= $2 + 10",
                "SELECT p.name FROM {t} AS p WHERE $1 < p.id AND p.id <= $2 + 10 AND p.budget > 0 "
                "ORDER BY p.id",
            ),
        ),
        (
            "SELECT id FROM projects WHERE id IN ($1, 7) OR false",  # an OR at the top: not a conjunct
            None,
        ),
        (
            "SELECT max(budget) FROM projects WHERE id = ANY($1) AND id BETWEEN 1 AND 100",
            _key_read(
                _PROJECTS,
                "id = ANY ($1) AND id BETWEEN 1 AND 100",
                "SELECT max(budget) FROM {t} AS projects WHERE id = ANY ($1) AND id BETWEEN 1 AND 100",
            ),
        ),
        (  # a composite key: conditions on its columns
            "SELECT color FROM labels WHERE project_id = $1",
            _key_read(_LABELS, "project_id = $1", "SELECT color FROM {t} AS labels WHERE project_id = $1"),
        ),
        (
            "EXPLAIN SELECT * FROM projects WHERE id = $1",
            "EXPLAIN " + _key_read(_PROJECTS, "id = $1", "SELECT * FROM {t} AS projects WHERE id = $1"),
        ),
        # left to the view
        ("SELECT * FROM projects WHERE id = 3", None),  # no parameter: a text per key
        ("SELECT * FROM projects WHERE id > $1", None),  # not bounded
        ("SELECT * FROM projects WHERE id > $1 AND budget < $2", None),
        ("SELECT * FROM projects WHERE name = $1", None),  # a unique column, not the layer's key
        # (a locking SELECT becomes rewrites/row_locks.py's subquery, whose key read is not at the top)
        ("SELECT projects FROM projects WHERE id = $1", None),  # a whole row
        ("SELECT row_to_json(p.*) FROM projects p WHERE p.id = $1", None),
        ("SELECT xmin, * FROM projects WHERE id = $1", None),  # a system column
        ("SELECT * FROM projects WHERE id = $1 AND budget > (SELECT 1)", None),  # a subquery
        ("SELECT * FROM projects WHERE id = (SELECT $1::int)", None),
        ("SELECT * FROM projects WHERE id = random() + $1", None),  # volatile
        ("SELECT * FROM projects WHERE id = budget + $1", None),  # a column on both sides
        ("SELECT budget, count(*) FROM projects WHERE id = $1 GROUP BY budget", None),
        ("SELECT DISTINCT budget FROM projects WHERE id = $1", None),
        ("SELECT * FROM ONLY projects WHERE id = $1", None),
        ("SELECT * FROM projects p (a, b) WHERE a = $1", None),  # column aliases
        ("SELECT * FROM projects, comments WHERE projects.id = $1", None),
        ("WITH x AS (SELECT 1) SELECT * FROM projects WHERE id = $1", None),
        ("SELECT * FROM projects WHERE id = $1 UNION ALL SELECT * FROM projects WHERE id = $2", None),
        ("SELECT * FROM members WHERE id = $1", None),  # row security
        ("SELECT 1 FROM (SELECT * FROM projects WHERE id = $1) s", None),  # not at the top
        ("SELECT * FROM projects _cow_versions WHERE _cow_versions.id = $1", None),  # the rewrite's names
    ],
)
def test_key_reads_read_the_base_and_changes_tables(sql: str, rewritten: str | None) -> None:
    assert analyze(sql).rewritten == (rewritten and _written(rewritten))
    assert analyze(sql, in_session=False).rewritten is None


@pytest.mark.parametrize(
    ("sql", "rewritten"),
    [
        (  # a range: its bounds' parameters hidden from the planner in the base branch, not outside
            "SELECT * FROM projects WHERE id BETWEEN $1 AND $1 + 99",
            _key_read(
                _PROJECTS,
                "id BETWEEN $1 AND $1 + 99",
                "SELECT * FROM {t} AS projects",
                "id BETWEEN (SELECT $1) AND (SELECT $1) + 99",
            ),
        ),
        (  # other conditions, constant bounds and key values stay outside
            "SELECT p.name FROM projects p WHERE $1 < p.id AND p.id <= $2 + 10 AND p.budget > $3 "
            "AND p.id < 500 AND p.id <> 7 ORDER BY p.id LIMIT $4",
            _key_read(
                _PROJECTS,
                "$1 < id AND id <= $2 + 10 AND id < 500",
                "SELECT p.name FROM {t} AS p WHERE p.budget > $3 AND p.id < 500 AND p.id <> 7 "
                "ORDER BY p.id LIMIT $4",
                "(SELECT $1) < id AND id <= (SELECT $2) + 10",
            ),
        ),
        (  # a set of keys: the planner's estimate does not depend on the values
            "SELECT * FROM projects WHERE id = $1",
            _key_read(_PROJECTS, "id = $1", "SELECT * FROM {t} AS projects WHERE id = $1"),
        ),
        (
            "SELECT color FROM labels WHERE project_id = $1 AND name >= $2 AND name < $3",
            _key_read(
                _LABELS,
                "project_id = $1 AND name >= $2 AND name < $3",
                "SELECT color FROM {t} AS labels WHERE project_id = $1",
                "name >= (SELECT $2) AND name < (SELECT $3)",
            ),
        ),
    ],
)
def test_a_named_statement_reads_a_key_range_with_a_cacheable_plan(sql: str, rewritten: str) -> None:
    """A named prepared statement's plan may be cached: PostgreSQL caches it once its custom plans cost no
    less than the generic plan, which holds when the planner cannot see the range's bounds in either."""
    assert analyze(sql, prepared=True).rewritten == _written(rewritten)
    assert analyze(sql, prepared=True, in_session=False).rewritten is None


def test_a_key_read_of_a_large_changes_table_hides_base_rows_with_an_anti_join() -> None:
    """Past KEY_READ_HASHED_ROWS versions the planner might estimate the session's versions beyond the hash
    memory, and NOT IN would then compare every base row with every version."""
    (schema, name, overlay, doc), *rest = catalogs.rows()
    info = json.loads(doc)
    assert name == "projects"
    info["changes_rows"] = 200000
    catalog = Catalog.from_rows([(schema, name, overlay, json.dumps(info)), *rest])
    sent = analyze("SELECT * FROM projects WHERE id BETWEEN $1 AND $2", catalog=catalog).rewritten
    assert sent is not None
    assert "NOT IN" not in sent
    assert "NOT EXISTS (SELECT FROM _cow_versions _cow_v WHERE _cow_v.id = _cow_b.id)" in sent


def test_a_key_read_of_an_unhashed_key_type_is_left_to_the_view() -> None:
    spec = dict(catalogs.SAMPLE)
    pk, columns, unique, refs = spec[("public", "projects")]
    spec[("public", "projects")] = (pk, [("id", "inet", False), *columns[1:]], unique, refs)
    catalog = Catalog.from_rows(catalogs.rows(spec))
    assert analyze("SELECT * FROM projects WHERE id = $1", catalog=catalog).rewritten is None


@pytest.mark.parametrize(
    ("sql", "where", "offset", "limit"),
    [
        (  # Prisma's count(): schema-qualified columns, OFFSET $n
            'SELECT COUNT(*) FROM (SELECT "public"."issues"."id" FROM "public"."issues" '
            'WHERE ("public"."issues"."points" = $1 AND 1=1) OFFSET $2) AS "sub"',
            "issues.points = $1 AND 1 = 1",
            "$2",
            "NULL",
        ),
        ("SELECT count(*) FROM (SELECT id FROM issues ORDER BY id LIMIT 5) s", None, "NULL", "5"),
        ("SELECT count(*) FROM (SELECT * FROM issues LIMIT $1 OFFSET $2) s", None, "$2", "$1"),
    ],
)
def test_count_of_a_limited_query_is_split(sql: str, where: str | None, offset: str, limit: str) -> None:
    rewritten = analyze(sql).rewritten
    assert rewritten is not None
    # the rows OFFSET skips and LIMIT cuts, from the split count; PostgreSQL still checks both
    assert rewritten.startswith(
        f"SELECT LEAST(GREATEST(_cow_n.n - COALESCE({offset}::bigint, 0), 0), "
        f"COALESCE({limit}::bigint, _cow_n.n)) AS count FROM (SELECT (SELECT count(*) FROM "
        f"public.issues issues{f' WHERE {where}' if where else ''}) - "
    )
    assert rewritten.endswith(
        f"AS n) _cow_n WHERE (SELECT count(*) FROM (SELECT 1 LIMIT {limit.replace('NULL', 'ALL')} "
        f"OFFSET {offset}) _cow_v) >= 0"
    )
    assert rewritten.count("cow_changes.t2") == 2


def _sized(rows: dict[str, float]) -> Catalog:
    """The sample catalog with row estimates for some tables."""
    out = []
    for schema, name, overlay, doc in catalogs.rows():
        info = json.loads(str(doc))
        if name in rows:
            info["rows"] = rows[name]
        out.append((schema, name, overlay, json.dumps(info)))
    return Catalog.from_rows(out)


JOIN_TWO = "SELECT c.body, i.title FROM comments c JOIN issues i ON i.id = c.issue_id WHERE c.body = $1"


@pytest.mark.parametrize(
    ("rows", "rewritten"),
    [
        ({"comments": 2_000, "issues": 1_000_000}, True),  # a few rows of the first probe a big table
        ({"comments": 0, "issues": 50}, True),
        ({"comments": 2_000, "issues": 90_000}, False),  # not large enough: a hash join may be cheaper
        ({"comments": 1_000_000, "issues": 2_000}, False),  # the first relation is the big one
        ({"comments": -1, "issues": 1_000_000}, False),  # never analyzed: unknown
        ({"issues": 1_000_000}, False),
    ],
)
def test_two_tables_join_laterally_when_the_joined_one_dwarfs_the_first(
    rows: dict[str, float], rewritten: bool
) -> None:
    result = analyze(JOIN_TWO, catalog=_sized(rows)).rewritten
    assert (
        result is not None and "JOIN LATERAL (SELECT * FROM issues i WHERE i.id = c.issue_id" in result
    ) is (rewritten)
    # an open first relation (no WHERE, no LIMIT) is never probed row by row
    assert analyze(JOIN_TWO.split(" WHERE ", maxsplit=1)[0], catalog=_sized(rows)).rewritten is None


@pytest.mark.parametrize(
    ("sql", "marked"),
    [
        ("INSERT INTO members (id) VALUES (1) RETURNING id", True),
        ("INSERT INTO public.members (id) VALUES (1) RETURNING *", True),
        ("WITH x AS (INSERT INTO members (id) VALUES (1) RETURNING id) SELECT 1", True),
        ("INSERT INTO members (id) VALUES (1) ON CONFLICT (id) DO NOTHING RETURNING id", True),
        ("INSERT INTO members (id) VALUES (1)", False),  # no RETURNING
        ("INSERT INTO projects (id, name) VALUES (1, 'p') RETURNING id", False),  # no row security
        ("INSERT INTO members (id) VALUES (1) RETURNING id; SELECT 1", False),  # several statements
    ],
)
def test_insert_returning_under_row_security_is_marked_for_the_layer(sql: str, marked: bool) -> None:
    """The layer's RLS trigger checks the SELECT policies when the statement carries the mark (38_rls.sql)."""
    result = Analyzer().analyze(sql, sample_catalog(), in_session=True)
    assert result.error is None
    assert (result.rewritten or "").startswith(RETURNING_MARK) is marked
    assert Analyzer().analyze(sql, sample_catalog(), in_session=False).rewritten is None


# Joins of the sample's CoW tables, filtered or limited anywhere (the lateral rule's detection is a cheap
# superset of what the rule changes: it must never miss one).
_JOINABLE = [("comments", "c"), ("issues", "i"), ("projects", "p")]
_JOIN_KEYS = {"i": "i.id = c.issue_id", "p": "p.id = i.project_id"}
_CONDITIONS = st.sampled_from(
    [
        "{q}.id = 5",
        "{q}.id IN (1, 2)",
        "{q}.id > 3",
        "{q}.id BETWEEN 1 AND 4",
        "{q}.id = ANY ('{{1,2}}')",
        "{q}.id = $1",
        "5 = {q}.id",
        "{q}.id = c.id",
        "{q}.id = {q}.project_id",
        "{q}.id IN (SELECT 1)",
        "{q}.body = 'x'",
        "{q}.id OPERATOR(pg_catalog.=) 5",
        "{q}.id IS NULL",
        "lower({q}.title) = 'x'",
        "id = 5",
    ]
)


_JOIN_CASES = st.fixed_dictionaries(
    {
        "tables": st.integers(min_value=2, max_value=3),
        # row estimates (none, or of which the joined tables may dwarf the first: _dwarfed)
        "rows": st.sampled_from(
            [
                {},
                {"comments": 2_000, "issues": 1_000_000, "projects": 1_000_000},
                {"comments": 0, "issues": 50},
                {"comments": 2_000, "issues": 90_000},
                {"comments": -1, "issues": 1_000_000},
            ]
        ),
        "left": st.booleans(),
        "aliased": st.booleans(),
        "conditions": st.lists(st.tuples(_CONDITIONS, st.sampled_from("cip")), max_size=3),
        "disjunction": st.booleans(),
        "limit": st.booleans(),
        "locked": st.booleans(),
    }
)


def _join_sql(case: dict[str, Any]) -> str:
    names = _JOINABLE[: case["tables"]]
    source = f"comments {'c' if case['aliased'] else 'AS c'}"
    for table, alias in names[1:]:
        source += f" {'LEFT JOIN' if case['left'] else 'JOIN'} {table} {alias} ON {_JOIN_KEYS[alias]}"
    aliases = {a for _, a in names}
    used = [cond.format(q=q) for cond, q in case["conditions"] if q in aliases]
    sql = f"SELECT c.id FROM {source}"
    if used:
        sql += " WHERE " + (" OR " if case["disjunction"] else " AND ").join(used)
    return sql + (" LIMIT 3" if case["limit"] else "") + (" FOR UPDATE OF c" if case["locked"] else "")


def _lateral_changes(sql: str, catalog: Catalog = CATALOG) -> tuple[bool, bool]:
    """(the lateral rule's detection flags ``sql``, the rule changes it)."""
    found = _inspect(json.loads(parse_sql_json(sql))["stmts"], catalog, True, DEFAULT_POLICY).found
    node = pglast.parse_sql(sql)[0].stmt
    return "lateral" in found, lateral.apply(Context(catalog, 170000), node) is not None


@settings(max_examples=500, deadline=None)
@given(case=_JOIN_CASES)
def test_the_lateral_rules_detection_flags_every_join_it_changes(case: dict[str, Any]) -> None:
    sql = _join_sql(case)
    detected, changed = _lateral_changes(sql, _sized(case["rows"]) if case["rows"] else CATALOG)
    assert detected or not changed, sql


@pytest.mark.parametrize(
    ("where", "rows", "flagged"),
    [
        ("c.id = 5", {}, True),  # pinned by its key: the rule changes it
        ("c.id IN (1, 2)", {}, True),
        ("c.body = 'x'", {}, False),  # restricted by a column that is no key, nothing dwarfs it: left
        ("c.id > 3", {}, False),
        ("c.body = 'x'", {"comments": 2_000, "issues": 1_000_000}, True),  # dwarfed
        ("c.body = 'x'", {"comments": 2_000, "issues": 90_000}, False),
    ],
)
def test_a_join_of_two_tables_wakes_the_lateral_rule_only_when_pinned_or_dwarfed(
    where: str, rows: dict[str, float], flagged: bool
) -> None:
    """Django's joins of two tables restricted by a column that is no key (most of those that woke the rule
    in its full list) need no parse for it."""
    sql = f"SELECT c.id FROM comments c JOIN issues i ON i.id = c.issue_id WHERE {where}"
    assert _lateral_changes(sql, _sized(rows) if rows else CATALOG) == (flagged, flagged)


def test_a_join_filtered_on_a_later_relation_wakes_no_lateral_rule() -> None:
    """Django's joins filtered on the joined table leave the first relation open: no parse for the rule."""
    assert _lateral_changes(f"SELECT * {CHAIN} WHERE p.name = 'x'") == (False, False)
    assert _lateral_changes(f"SELECT * {CHAIN} WHERE c.id = 5 FOR UPDATE") == (False, False)
    assert _lateral_changes(f"SELECT * {CHAIN} WHERE c.id = 5") == (True, True)


def test_a_key_read_with_literals_only_wakes_no_key_read_rule() -> None:
    """A key condition needs a ``$n``: a text with literals only (Django's) is no key read, and the rule's
    detection says so without pglast's second parse."""

    def found(sql: str) -> set[str]:
        stmts = json.loads(parse_sql_json(sql))["stmts"]
        return set(_inspect(stmts, CATALOG, True, DEFAULT_POLICY).found)

    assert "key_reads" not in found("SELECT name FROM projects WHERE id = 5")
    assert analyze("SELECT name FROM projects WHERE id IN (5, 6)").rewritten is None
    assert "key_reads" in found("SELECT name FROM projects WHERE id = $1")
    assert "key_reads" in found("EXPLAIN SELECT name FROM projects WHERE id BETWEEN 1 AND $2")
    assert analyze("SELECT name FROM projects WHERE id = $1").rewritten is not None


class _EveryNode(frozenset[str]):
    """A set that holds every node name (a capital first letter): the walk then visits every node."""

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name[:1].isupper()


_WALKED = [
    *TAMPERS,
    *NOT_TAMPERS,
    "INSERT INTO issues (id, title) VALUES (1, 'x') ON CONFLICT (id) DO UPDATE SET title = 'y' RETURNING id",
    "WITH c AS (DELETE FROM comments WHERE id = 1 RETURNING issue_id) UPDATE issues SET points = 2 "
    "WHERE id IN (SELECT issue_id FROM c)",
    "SELECT i.title, count(*) FROM issues i JOIN comments c ON c.issue_id = i.id GROUP BY i.id FOR SHARE",
    "TRUNCATE issues, comments",
    "COPY issues FROM STDIN",
    "CREATE TABLE t2 (id int)",
    "CREATE FUNCTION f() RETURNS int LANGUAGE sql SET search_path = x AS 'SELECT 1'",
    "ALTER TABLE issues ADD COLUMN x int",
    "SET CONSTRAINTS ALL DEFERRED",
    "SELECT * FROM cow_changes.public__issues",
    "DECLARE c1 CURSOR FOR SELECT id FROM public.issues WHERE id = 1",
    "MERGE INTO issues USING comments ON issues.id = comments.issue_id WHEN MATCHED THEN DELETE",
]


@pytest.mark.parametrize("sql", _WALKED)
def test_the_walk_skips_only_nodes_visit_would_not_read(sql: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk calls ``_Inspection.visit`` only for the node names it may act on (``_VISITED``, statements):
    what it finds is what a walk visiting every node finds."""
    import proxy.sql.analyze as analyze_module

    def inspected() -> tuple[object, ...]:
        stmts = json.loads(parse_sql_json(sql))["stmts"]
        found = _inspect(stmts, CATALOG, True, DEFAULT_POLICY)
        return (
            found.found, found.writes, found.tampers, found.catalog_dependent, found.error, found.unlayered,
            found.unqualified, found.executes, found.returning_rls, found.path_change, found.path_sets,
            found.ctes, found.policy.refusal if found.policy is not None else None,
        )  # fmt: skip

    skipping = inspected()
    monkeypatch.setattr(analyze_module, "_VISITED", _EveryNode())
    assert inspected() == skipping
