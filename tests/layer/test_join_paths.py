"""The join's paths (cow._join, cow._path_entries): the same as the regex split and the per-entry functions
they replaced give (docs/benchmarks.md, "The join in a new backend"), for usual and unusual search_paths."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

# What cow._path_entries was before the join's cut: every path split by this regex.
ENTRIES_BY_REGEX = r"""
SELECT coalesce(array_agg(CASE WHEN m[1] IS NOT NULL THEN replace(m[1], '""', '"') ELSE btrim(m[2]) END
                          ORDER BY ord), '{}')
FROM regexp_matches(coalesce(%(p)s::text, ''), '\s*(?:"((?:[^"]|"")*)"|([^,]+))\s*(?:,|$)', 'g')
     WITH ORDINALITY AS t(m, ord)
WHERE coalesce(m[1], btrim(m[2])) <> ''
"""
# What cow._join set before: the entries without overlay schemas (cow._app_entries), the application's path
# as written unless it named one, and the overlay path of those entries (cow._overlay_path_of).
JOINED_BEFORE = f"""
WITH e AS ({ENTRIES_BY_REGEX}), a AS (SELECT cow._app_entries((SELECT * FROM e)) AS app_entries)
SELECT CASE WHEN cardinality(a.app_entries) <> cardinality((SELECT * FROM e))
            THEN cow._path_text(a.app_entries) ELSE %(p)s END,
       cow._overlay_path_of(a.app_entries)
FROM a
"""
PATHS = [
    '"$user", public',
    "public",
    "public, public",
    "  public ,t2,nosuch  ",
    '"$user", postgres, public',
    "postgres, public, postgres",
    "cow_overlay_public, public",
    '"cow_overlay_public", public',
    '"$user", cow_overlay_t2, t2, public',
    '"My Schema", public',
    '"a,b", public',
    '"x""y", public',
    '""',
    "café, public",
    "PUBLIC, Public",
    "public,\tt2",
    "public,\nt2",
    "pg_catalog, public",
    "pg_temp, public",
    "$user, public",
    "_x$1, public",
]


@pytest.fixture
def conn(layer_db: str) -> Any:
    """A connection to the layer's database with two more schemas in the layer's records: ``postgres`` (the
    test's role: "$user") and ``t2``. The join reads only the records, not the schemas."""
    with psycopg.connect(layer_db, autocommit=True) as c:
        c.execute(
            "INSERT INTO cow.schemas (schema_name, overlay_schema) "
            "VALUES ('postgres', 'cow_overlay_postgres'), ('t2', 'cow_overlay_t2')"
        )
        assert c.execute("SELECT current_user").fetchone() == ("postgres",)
        yield c


def _accepted(conn: psycopg.Connection[Any], path: str) -> bool:
    """Whether PostgreSQL takes ``path`` as search_path (it checks the list's syntax)."""
    try:
        conn.execute("SELECT set_config('search_path', %s, false)", (path,))
    except (psycopg.errors.DataError, psycopg.errors.InvalidParameterValue):
        return False
    return True


@pytest.mark.parametrize("path", [*PATHS, None])
def test_path_entries_are_the_regex_split(conn: psycopg.Connection[Any], path: str | None) -> None:
    ours = conn.execute("SELECT cow._path_entries(%s)", (path,)).fetchone()
    regex = conn.execute(ENTRIES_BY_REGEX, {"p": path}).fetchone()
    assert ours == regex


@pytest.mark.parametrize("path", PATHS)
def test_join_sets_the_paths_it_set_before(conn: psycopg.Connection[Any], path: str) -> None:
    if not _accepted(conn, path):
        pytest.skip(f"PostgreSQL refuses search_path {path!r}")
    app, overlay = conn.execute(JOINED_BEFORE, {"p": path}).fetchone() or (None, None)
    conn.execute("SELECT cow.use_session('s1', 'op')")
    joined = conn.execute(
        "SELECT current_setting('search_path'), current_setting('cow.app_search_path'), "
        "current_setting('cow.session_id'), current_setting('cow.operation_id')"
    ).fetchone()
    assert joined == (overlay, app, "s1", "op")
    conn.execute("SELECT cow.use_session(NULL)")
    left = conn.execute(
        "SELECT current_setting('search_path'), current_setting('cow.app_search_path'), "
        "current_setting('cow.session_id'), current_setting('cow.operation_id')"
    ).fetchone()
    # Leaving puts the application's path back (the overlay path's entries without overlays).
    expected = conn.execute(JOINED_BEFORE, {"p": overlay}).fetchone()
    assert expected is not None
    assert left == (expected[0], "", "", "")
