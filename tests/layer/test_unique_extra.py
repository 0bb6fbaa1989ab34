"""Partial and expression UNIQUE indexes and exclusion constraints inside a session (migration 0002).

Each statement runs on a plain copy of the tables and in a session, side by side (``Pair`` of
test_semantics): the same rows, the same RETURNING values, the same SQLSTATE — and for a violation the same
constraint name, message and detail. Conflicts are judged against the session's view of the table: base rows
the session has not touched plus its current versions.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from migrations.layer import migrations
from tests.fix_db import install_layer_at
from tests.fix_layer import old_migration_files, reads_as_layer_56
from tests.layer.test_semantics import Pair, base_rows, session_pair

SCHEMA = """
-- Soft delete, Django/Plane style: a name is unique per workspace among the rows not deleted.
CREATE TABLE projects (
    id serial PRIMARY KEY,
    workspace_id int NOT NULL,
    name text NOT NULL,
    deleted_at timestamptz
);
CREATE UNIQUE INDEX projects_ws_name_live ON projects (workspace_id, name) WHERE deleted_at IS NULL;
-- Expression uniqueness, and a multi-column one mixing a column and an expression (org may be NULL).
CREATE TABLE users (
    id int PRIMARY KEY,
    email varchar(80) NOT NULL,
    org int,
    handle text
);
CREATE UNIQUE INDEX users_email_lower ON users (lower(email));
CREATE UNIQUE INDEX users_org_handle ON users (org, lower(handle));
-- Exclusion constraints without an extension: a gist range overlap with a predicate, and one over an
-- expression (lo = hi, the default, is an empty range: it overlaps nothing).
CREATE TABLE bookings (
    id int PRIMARY KEY,
    during int4range,
    cancelled boolean NOT NULL DEFAULT false,
    lo int NOT NULL DEFAULT 0,
    hi int NOT NULL DEFAULT 0,
    CONSTRAINT bookings_no_overlap EXCLUDE USING gist (during WITH &&) WHERE (NOT cancelled),
    CONSTRAINT bookings_span EXCLUDE USING gist (int4range(lo, hi) WITH &&)
);
INSERT INTO projects (workspace_id, name, deleted_at) VALUES
    (1, 'alpha', NULL), (1, 'beta', NULL), (1, 'gamma', '2026-01-01'), (2, 'alpha', NULL);
INSERT INTO users VALUES (1, 'Ada@Example.com', 1, 'ada'), (2, 'bob@example.com', NULL, 'bob'),
    (3, 'cy@example.com', 2, NULL);
INSERT INTO bookings (id, during, cancelled, lo, hi) VALUES
    (1, '[10,20)', false, 1, 3), (2, '[30,40)', false, 3, 5), (3, '[50,60)', true, 5, 6);
"""

TABLES = ("projects", "users", "bookings")


def error_of(conn: psycopg.Connection[Any], sql: str) -> tuple[str | None, ...]:
    """The error a statement raises, as what a client sees of it; () when it succeeds (then rolled back)."""
    try:
        with conn.transaction():
            conn.execute(sql)
            raise _Rollback
    except _Rollback:
        return ()
    except psycopg.Error as exc:
        d = exc.diag
        return (
            exc.sqlstate,
            d.constraint_name,
            d.message_primary,
            d.message_detail,
            d.schema_name,
            d.table_name,
        )


class _Rollback(Exception):
    pass


def same_error(pair: Pair, sql: str) -> tuple[str | None, ...]:
    a, b = error_of(pair.plain, sql), error_of(pair.cow, sql)
    assert b == a, f"{sql}: plain {a} != session {b}"
    return a


def app_ddl(pair: Pair, sql: str) -> None:
    """App DDL on both sides; the session's connection leaves the session for it and joins again."""
    pair.plain.execute(sql)
    pair.cow.execute("SELECT cow.use_session(NULL)")
    pair.cow.execute(sql)
    pair.cow.execute("SELECT cow.use_session('s1', 'op1')")


def logged(conn: psycopg.Connection[Any], session: str = "s1") -> int:
    row = conn.execute("SELECT count(*) FROM cow.session_changes(%s)", (session,)).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def pair(plain_db: str, layer_db: str) -> Iterator[Pair]:
    with session_pair(plain_db, layer_db, SCHEMA) as p:
        yield p


@pytest.fixture
def untouched(layer_db: str) -> Iterator[None]:
    yield
    # Nothing a session did reached the base tables (the seed rows of SCHEMA are all there is).
    assert [len(base_rows(layer_db, t)) for t in TABLES] == [4, 3, 3]


def same_tables(pair: Pair) -> None:
    for table in TABLES:
        pair.same_table(table)


def test_partial_unique_soft_delete(pair: Pair, untouched: None) -> None:
    err = same_error(pair, "INSERT INTO projects (workspace_id, name) VALUES (1, 'alpha')")
    assert err[:4] == (
        "23505",
        "projects_ws_name_live",
        'duplicate key value violates unique constraint "projects_ws_name_live"',
        "Key (workspace_id, name)=(1, alpha) already exists.",
    )
    # Outside the predicate: a deleted row never conflicts, nor does a row of another workspace.
    pair.both(
        "INSERT INTO projects (workspace_id, name, deleted_at) VALUES (1, 'alpha', '2026-03-03') RETURNING id"
    )
    pair.both(
        "INSERT INTO projects (workspace_id, name) VALUES (3, 'alpha'), (1, 'gamma') RETURNING id, name"
    )
    # Soft delete, then the name is free again.
    pair.both("UPDATE projects SET deleted_at = '2026-02-02' WHERE workspace_id = 1 AND name = 'alpha'")
    pair.both(
        "INSERT INTO projects (workspace_id, name) VALUES (1, 'alpha') RETURNING id, workspace_id, name"
    )
    # Un-deleting a row into a conflict: 23505, and the failed statement leaves nothing.
    before = logged(pair.cow)
    err = same_error(pair, "UPDATE projects SET deleted_at = NULL WHERE id = 1")
    assert err[:2] == ("23505", "projects_ws_name_live")
    assert logged(pair.cow) == before
    # A multi-row statement that fails on its last row leaves nothing either.
    assert pair.both("INSERT INTO projects (workspace_id, name) VALUES (5, 'x'), (5, 'y'), (5, 'x')") == (
        "error",
        "23505",
    )
    assert logged(pair.cow) == before
    # Renaming into a conflict, and a rename of the row to its own name (no conflict with itself).
    same_error(pair, "UPDATE projects SET name = 'beta' WHERE id = 1")
    pair.both("UPDATE projects SET name = 'beta' WHERE id = 2 RETURNING *")
    pair.both("UPDATE projects SET id = 20 WHERE id = 2 RETURNING *")  # a key move keeps its unique values
    same_tables(pair)


def test_delete_then_insert_and_moves_out_of_and_into_the_predicate(pair: Pair, untouched: None) -> None:
    # The session deletes the conflicting base row first: its name is free in the session's view.
    pair.both("DELETE FROM projects WHERE id = 2")
    pair.both("INSERT INTO projects (workspace_id, name) VALUES (1, 'beta') RETURNING *")
    # Moving a row out of the predicate frees its key; moving another row in takes it.
    pair.both("UPDATE projects SET deleted_at = '2026-03-03' WHERE id = 1")
    pair.both(
        "UPDATE projects SET deleted_at = NULL, name = 'alpha' WHERE id = 3 RETURNING id, name, deleted_at"
    )
    assert same_error(pair, "UPDATE projects SET deleted_at = NULL WHERE id = 1")[:2] == (
        "23505",
        "projects_ws_name_live",
    )
    # The session's own new row conflicts with what the session wrote before.
    same_error(pair, "INSERT INTO projects (workspace_id, name) VALUES (1, 'beta')")
    # An update of a column the index does not read never checks (nor fails).
    pair.both("UPDATE projects SET workspace_id = workspace_id WHERE id = 4 RETURNING *")
    same_tables(pair)


def test_expression_unique_lower_email(pair: Pair, untouched: None) -> None:
    err = same_error(pair, "INSERT INTO users (id, email) VALUES (9, 'ADA@example.COM')")
    assert err[:4] == (
        "23505",
        "users_email_lower",
        'duplicate key value violates unique constraint "users_email_lower"',
        "Key (lower(email::text))=(ada@example.com) already exists.",
    )
    # A row may change the case of its own value; another row may not take it.
    pair.both("UPDATE users SET email = 'ADA@EXAMPLE.COM' WHERE id = 1 RETURNING *")
    same_error(pair, "UPDATE users SET email = 'ada@example.com' WHERE id = 2")
    # Freed by an update in the session, then taken.
    pair.both("UPDATE users SET email = 'ada@elsewhere.org' WHERE id = 1")
    pair.both("INSERT INTO users (id, email) VALUES (9, 'ADA@example.COM') RETURNING *")
    same_error(pair, "INSERT INTO users (id, email) VALUES (10, 'ada@example.com')")
    same_tables(pair)


def test_multi_column_expression_unique_and_nulls(pair: Pair, untouched: None) -> None:
    # (org, lower(handle)): a NULL in either never conflicts.
    pair.both("INSERT INTO users (id, email, org, handle) VALUES (10, 'a@x', NULL, 'BOB') RETURNING *")
    pair.both("INSERT INTO users (id, email, org, handle) VALUES (11, 'b@x', 2, NULL), (12, 'c@x', 2, NULL)")
    pair.both("INSERT INTO users (id, email, org, handle) VALUES (13, 'd@x', 2, 'Ada') RETURNING *")
    err = same_error(pair, "INSERT INTO users (id, email, org, handle) VALUES (14, 'e@x', 1, 'ADA')")
    assert err[:4] == (
        "23505",
        "users_org_handle",
        'duplicate key value violates unique constraint "users_org_handle"',
        "Key (org, lower(handle))=(1, ada) already exists.",
    )
    same_error(pair, "UPDATE users SET org = 1 WHERE id = 13")
    # Both UNIQUE indexes violated: PostgreSQL reports the one created first.
    assert (
        same_error(
            pair, "INSERT INTO users (id, email, org, handle) VALUES (15, 'bob@EXAMPLE.com', 1, 'ada')"
        )[1]
        == "users_email_lower"
    )
    same_tables(pair)


def test_nulls_not_distinct(pair: Pair, untouched: None) -> None:
    if pair.cow.info.server_version < 150000:
        pytest.skip("NULLS NOT DISTINCT needs PostgreSQL 15")
    ddl = (
        "CREATE TABLE tags (id int PRIMARY KEY, label text, scope int,"
        " archived boolean NOT NULL DEFAULT false);"
        "CREATE UNIQUE INDEX tags_label ON tags (lower(label), scope) NULLS NOT DISTINCT WHERE NOT archived;"
        "INSERT INTO tags VALUES (1, 'Red', NULL, false), (2, NULL, NULL, false), (3, 'Red', 1, true)"
    )
    app_ddl(pair, ddl)
    err = same_error(pair, "INSERT INTO tags VALUES (4, 'RED', NULL)")
    assert err[:4] == (
        "23505",
        "tags_label",
        'duplicate key value violates unique constraint "tags_label"',
        "Key (lower(label), scope)=(red, null) already exists.",
    )
    assert same_error(pair, "INSERT INTO tags VALUES (4, NULL, NULL)")[:2] == ("23505", "tags_label")
    pair.both("INSERT INTO tags VALUES (4, NULL, NULL, true), (5, 'red', 1) RETURNING *")
    same_error(pair, "UPDATE tags SET archived = false WHERE id = 3")
    pair.both("DELETE FROM tags WHERE id = 1")
    pair.both("INSERT INTO tags VALUES (6, 'red', NULL) RETURNING *")
    same_error(pair, "UPDATE tags SET label = NULL WHERE id = 6")
    pair.same_table("tags")


def test_exclusion_constraints(pair: Pair, untouched: None) -> None:
    err = same_error(pair, "INSERT INTO bookings (id, during) VALUES (4, '[15,35)')")
    assert err[:4] == (
        "23P01",
        "bookings_no_overlap",
        'conflicting key value violates exclusion constraint "bookings_no_overlap"',
        "Key (during)=([15,35)) conflicts with existing key (during)=([10,20)).",
    )
    # Adjacent ranges, a cancelled booking's range, NULL: no conflict.
    pair.both(
        "INSERT INTO bookings (id, during) VALUES (4, '[20,30)'), (5, '[50,55)'), (6, NULL) RETURNING *"
    )
    # Un-cancelling into a conflict; cancelling frees the range.
    same_error(pair, "UPDATE bookings SET cancelled = false WHERE id = 3")
    pair.both("UPDATE bookings SET cancelled = true WHERE id = 1")
    pair.both("INSERT INTO bookings (id, during) VALUES (7, '[12,18)') RETURNING *")
    # A row may grow its own range; it may not grow into another's.
    pair.both("UPDATE bookings SET during = '[30,45)' WHERE id = 2 RETURNING *")
    err = same_error(pair, "UPDATE bookings SET during = '[40,52)' WHERE id = 2")
    assert err[3] == "Key (during)=([40,52)) conflicts with existing key (during)=([50,55))."
    # An expression key: int4range(lo, hi).
    err = same_error(pair, "INSERT INTO bookings (id, lo, hi) VALUES (8, 2, 4)")
    assert err[:4] == (
        "23P01",
        "bookings_span",
        'conflicting key value violates exclusion constraint "bookings_span"',
        "Key (int4range(lo, hi))=([2,4)) conflicts with existing key (int4range(lo, hi))=([1,3)).",
    )
    pair.both("DELETE FROM bookings WHERE id = 1")
    pair.both("INSERT INTO bookings (id, lo, hi) VALUES (8, 2, 4) RETURNING *")
    same_tables(pair)


def test_exclusion_with_btree_gist(pair: Pair, untouched: None) -> None:
    available = pair.cow.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'btree_gist'").fetchone()
    if available is None:
        pytest.skip("the btree_gist extension is not available on this server")
    ddl = (
        "CREATE EXTENSION IF NOT EXISTS btree_gist;"
        "CREATE TABLE rooms (id int PRIMARY KEY, room int, during tsrange,"
        " EXCLUDE USING gist (room WITH =, during WITH &&));"
        "INSERT INTO rooms VALUES (1, 1, '[2026-01-01 10:00, 2026-01-01 11:00)')"
    )
    app_ddl(pair, ddl)
    # The changes table's lookup index leads with the session (btree_gist has a gist opclass for text).
    lookup = pair.cow.execute(
        "SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN cow.registry g"
        " ON i.indrelid = format('cow_changes.%I', g.changes_table)::regclass"
        " WHERE g.table_name = 'rooms' AND i.indexrelid::regclass::text LIKE '%xq%'"
    ).fetchall()
    assert len(lookup) == 1 and "USING gist (_cow_session, room" in lookup[0][0], lookup
    err = same_error(pair, "INSERT INTO rooms VALUES (2, 1, '[2026-01-01 10:30, 2026-01-01 12:00)')")
    assert err[:2] == ("23P01", "rooms_room_during_excl")
    pair.both("INSERT INTO rooms VALUES (2, 2, '[2026-01-01 10:30, 2026-01-01 12:00)') RETURNING *")
    same_error(pair, "UPDATE rooms SET room = 1 WHERE id = 2")
    pair.same_table("rooms")


def test_temporal_primary_key_without_overlaps(pair: Pair, untouched: None) -> None:
    """PostgreSQL 18's PRIMARY KEY ... WITHOUT OVERLAPS is an exclusion index: 23P01, like EXCLUDE."""
    if pair.cow.info.server_version < 180000:
        pytest.skip("WITHOUT OVERLAPS needs PostgreSQL 18")
    if pair.cow.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'btree_gist'").fetchone() is None:
        pytest.skip("the btree_gist extension is not available on this server")
    app_ddl(
        pair,
        "CREATE EXTENSION IF NOT EXISTS btree_gist;"
        "CREATE TABLE prices (item int, valid int4range, price int,"
        " PRIMARY KEY (item, valid WITHOUT OVERLAPS));"
        "INSERT INTO prices VALUES (1, '[1,10)', 5)",
    )
    err = same_error(pair, "INSERT INTO prices VALUES (1, '[5,20)', 6)")
    assert err[:4] == (
        "23P01",
        "prices_pkey",
        'conflicting key value violates exclusion constraint "prices_pkey"',
        "Key (item, valid)=(1, [5,20)) conflicts with existing key (item, valid)=(1, [1,10)).",
    )
    pair.both("INSERT INTO prices VALUES (1, '[10,20)', 6), (2, '[5,20)', 7) RETURNING *")
    same_error(pair, "UPDATE prices SET valid = '[8,12)' WHERE item = 2")
    pair.both("UPDATE prices SET price = 8 WHERE item = 1 RETURNING *")
    pair.same_table("prices", "item, valid")


def test_deferrable_constraints_are_checked_at_commit_in_a_session(pair: Pair, untouched: None) -> None:
    """DEFERRABLE INITIALLY DEFERRED UNIQUE and exclusion constraints: the statement passes and COMMIT fails,
    in a session as on the plain table (more in test_deferrable.py)."""
    app_ddl(
        pair,
        "CREATE TABLE slots (id int PRIMARY KEY, code int,"
        " CONSTRAINT slots_code UNIQUE (code) DEFERRABLE INITIALLY DEFERRED, during int4range,"
        " CONSTRAINT slots_during EXCLUDE USING gist (during WITH &&) DEFERRABLE INITIALLY DEFERRED);"
        "INSERT INTO slots VALUES (1, 1, '[1,5)')",
    )
    before = logged(pair.cow)
    for sql, state, name in (
        ("INSERT INTO slots VALUES (2, 1, NULL)", "23505", "slots_code"),
        ("INSERT INTO slots VALUES (2, NULL, '[2,3)')", "23P01", "slots_during"),
    ):
        errors = []
        for conn in (pair.plain, pair.cow):
            conn.execute("BEGIN")
            conn.execute(sql)  # accepted: checked at COMMIT
            with pytest.raises(psycopg.Error) as late:
                conn.execute("COMMIT")
            errors.append(late.value)
        assert errors[0].sqlstate == errors[1].sqlstate == state
        assert errors[0].diag.constraint_name == errors[1].diag.constraint_name == name
        assert errors[0].diag.message_detail == errors[1].diag.message_detail
    assert logged(pair.cow) == before
    pair.same_table("slots")


def test_other_sessions_rows_never_conflict(layer_db: str) -> None:
    with (
        psycopg.connect(layer_db, autocommit=True) as a,
        psycopg.connect(layer_db, autocommit=True) as b,
    ):
        a.execute(SCHEMA)
        a.execute("SELECT cow.use_session('A')")
        a.execute("INSERT INTO projects (workspace_id, name) VALUES (7, 'seven')")
        a.execute("INSERT INTO users (id, email) VALUES (20, 'New@x')")
        a.execute("INSERT INTO bookings (id, during) VALUES (20, '[100,110)')")
        a.execute("UPDATE projects SET deleted_at = '2026-03-03' WHERE id = 1")  # frees (1, alpha) in A only
        b.execute("SELECT cow.use_session('B')")
        b.execute("INSERT INTO projects (workspace_id, name) VALUES (7, 'seven')")
        b.execute("INSERT INTO users (id, email) VALUES (21, 'new@X')")
        b.execute("INSERT INTO bookings (id, during) VALUES (21, '[105,115)')")
        with pytest.raises(psycopg.errors.UniqueViolation):
            b.execute("INSERT INTO projects (workspace_id, name) VALUES (1, 'alpha')")
        a.execute("INSERT INTO projects (workspace_id, name) VALUES (1, 'alpha')")
        # Without a session (the base table) none of the sessions' rows exist.
        b.execute("SELECT cow.use_session(NULL)")
        b.execute("BEGIN")
        b.execute("INSERT INTO users (id, email) VALUES (22, 'NEW@x')")
        b.execute("ROLLBACK")


def test_copy_from_into_the_view_is_checked(pair: Pair, untouched: None) -> None:
    def copy(conn: psycopg.Connection[Any], rows: list[tuple[int, str]]) -> str | None:
        try:
            with (
                conn.transaction(),
                conn.cursor() as cur,
                cur.copy("COPY users (id, email) FROM STDIN") as cp,
            ):
                for row in rows:
                    cp.write_row(row)
        except psycopg.Error as exc:
            return exc.diag.constraint_name
        return None

    for conn in (pair.plain, pair.cow):
        assert copy(conn, [(30, "x@y"), (31, "BOB@example.com")]) == "users_email_lower"
        assert copy(conn, [(30, "x@y"), (31, "z@y")]) is None
    same_tables(pair)


def test_app_ddl_adds_and_drops_checks_and_lookup_indexes(pair: Pair, untouched: None) -> None:
    def lookups() -> list[str]:
        rows = pair.cow.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " JOIN cow.registry g ON c.relname LIKE g.changes_table || '\\_xq%'"
            " WHERE n.nspname = 'cow_changes' AND g.table_name = 'projects' ORDER BY 1"
        )
        return [r[0] for r in rows]

    assert len(lookups()) == 1
    pair.both("INSERT INTO projects (workspace_id, name) VALUES (1, 'Delta')")
    # An index added by app DDL while the session is open is checked from the next statement on.
    app_ddl(pair, "CREATE UNIQUE INDEX projects_lname ON projects (lower(name)) WHERE workspace_id = 1")
    assert len(lookups()) == 2
    assert same_error(pair, "INSERT INTO projects (workspace_id, name) VALUES (1, 'DELTA')")[:2] == (
        "23505",
        "projects_lname",
    )
    # Renamed: the error names the new name. Dropped: no longer checked, its lookup index is gone.
    app_ddl(pair, "ALTER INDEX projects_lname RENAME TO projects_lower_name")
    assert same_error(pair, "INSERT INTO projects (workspace_id, name) VALUES (1, 'DELTA')")[1] == (
        "projects_lower_name"
    )
    app_ddl(pair, "DROP INDEX projects_lower_name")
    assert len(lookups()) == 1
    pair.both("INSERT INTO projects (workspace_id, name) VALUES (1, 'DELTA') RETURNING name")
    # A column the predicate reads, renamed by app DDL: the check and its lookup index follow.
    app_ddl(pair, "ALTER TABLE projects RENAME COLUMN deleted_at TO removed_at")
    same_error(pair, "INSERT INTO projects (workspace_id, name) VALUES (1, 'beta')")
    pair.both(
        "INSERT INTO projects (workspace_id, name, removed_at) VALUES (1, 'beta', '2026-03-03') RETURNING id"
    )
    assert len(lookups()) == 1
    same_tables(pair)


def test_lookups_use_indexes_on_the_changes_table(layer_db: str) -> None:
    """No sequential scan of the changes table per write: the checks probe the lookup indexes."""
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute(
            "INSERT INTO projects (workspace_id, name, deleted_at)"
            " SELECT g % 50, 'p' || g, CASE WHEN g % 4 = 0 THEN timestamptz '2026-03-03' END"
            " FROM generate_series(10, 5000) g;"
            "INSERT INTO users (id, email, org, handle)"
            " SELECT g, 'u' || g || '@x', g % 10, 'h' || g FROM generate_series(10, 5000) g;"
            "INSERT INTO bookings (id, during, lo, hi)"
            " SELECT g, int4range(g * 10, g * 10 + 5), g * 10, g * 10 + 5 FROM generate_series(10, 5000) g"
        )
        # Other sessions' changes and some of this one's, so that the changes tables are not tiny.
        for session in ("other", "me"):
            conn.execute("SELECT cow.use_session(%s)", (session,))
            conn.execute("UPDATE projects SET name = name || %s WHERE id %% 3 = 0", (session,))
            conn.execute("UPDATE users SET handle = handle || %s WHERE id %% 3 = 0", (session,))
            conn.execute("UPDATE bookings SET cancelled = true WHERE id % 3 = 0")
        conn.execute("SELECT cow.use_session(NULL)")
        changes = [
            r[0]
            for r in conn.execute(
                "SELECT format('cow_changes.%%I', changes_table) FROM cow.registry"
                " WHERE table_name = ANY (%s) ORDER BY table_name",
                (list(TABLES),),
            )
        ]
        for rel in [*TABLES, *changes]:
            conn.execute(f"ANALYZE {rel}")
        conn.execute("SELECT cow.use_session('me')")

        def scans() -> dict[str, tuple[int, int]]:
            # This backend's counts, flushed or not (pending counts of earlier transactions included).
            rows = conn.execute(
                "SELECT relname, seq_scan, idx_scan FROM pg_stat_xact_user_tables"
                " WHERE schemaname = 'cow_changes' AND relid = ANY (%s::regclass[])",
                (changes,),
            )
            return {r[0]: (r[1], r[2]) for r in rows}

        # Keys the base holds and the session has changed away: the base probe finds them and must look up the
        # session's version of each (where a hash anti join would read all of the session's keys).
        shadowed = {
            table: conn.execute(
                f"SELECT {cols} FROM public.{table} WHERE {where} ORDER BY id LIMIT 8"
            ).fetchall()
            for table, cols, where in (
                ("projects", "workspace_id, name", "id % 3 = 0 AND deleted_at IS NULL"),
                ("users", "org, handle", "id % 3 = 0"),
                ("bookings", "lower(during), upper(during)", "id % 3 = 0"),
            )
        }
        with conn.transaction():
            before = scans()
            for i in range(8):  # past plpgsql's five custom plans: the generic plans too
                conn.execute(
                    "INSERT INTO projects (workspace_id, name) VALUES (%s, %s)", shadowed["projects"][i]
                )
                conn.execute("UPDATE projects SET deleted_at = NULL WHERE id = %s", (100 + 4 * i,))
                conn.execute(
                    "INSERT INTO users (id, email, org, handle) VALUES (%s, %s, %s, %s)",
                    (9000 + i, f"n{i}@x", *shadowed["users"][i]),
                )
                conn.execute("UPDATE users SET email = upper(email) WHERE id = %s", (200 + i,))
                lo, hi = shadowed["bookings"][i]
                conn.execute(
                    "INSERT INTO bookings (id, during) VALUES (%s, int4range(%s, %s))",
                    (9000 + i, lo + 1, hi - 1),
                )
                conn.execute("DELETE FROM bookings WHERE id = 9000 + %s", (i,))
            after = scans()
        assert len(after) == 3
        for name, (seq_scan, idx_scan) in after.items():
            seq0, idx0 = before.get(name, (0, 0))
            assert seq_scan == seq0 and idx_scan > idx0, (name, before, after)


def test_upgrade_from_the_first_migration_adds_the_checks(layer_db: str) -> None:
    """An install of migration 0001 only (recreated here: 0001's generator as it was before the repeatable
    files, the later rows deleted from cow.migrations and the repeatables' bookkeeping dropped, the lookup
    indexes dropped) gets the checks from `install`."""
    [(version, _, first)] = old_migration_files(1)
    assert version == 1
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute("DROP TABLE nopk")  # 0001's generators know no keyless tables
        with conn.transaction():
            conn.execute("SELECT set_config('cow.in_layer', 'on', true)")
            # A signature 0001 did not have (0001's generator would find its call ambiguous).
            conn.execute(
                "DROP FUNCTION cow._rec_code(text, text, text[], text[], text, boolean,"
                " text, text, text, text, text, text)"
            )
            conn.execute(first.encode())  # CREATE OR REPLACE: 0001's generators again
            # (migrations 50-55 run again on cow.reads as the table they made, not layer 57's view)
            reads_as_layer_56(conn)
            conn.execute("DELETE FROM cow.migrations WHERE version > 1")
            conn.execute("DROP TABLE cow.repeatables")
            conn.execute("SELECT cow.refresh(true)")
            for (index,) in conn.execute(
                "SELECT format('cow_changes.%I', relname) FROM pg_class WHERE relname ~ '^t[0-9]+_xq'"
            ).fetchall():
                conn.execute(f"DROP INDEX {index}")
        conn.execute("SELECT cow.use_session('old')")
        conn.execute("INSERT INTO users (id, email) VALUES (9, 'ADA@example.com')")  # 0001: unchecked
        conn.execute("SELECT cow.use_session(NULL)")
    install_layer_at(layer_db)
    with psycopg.connect(layer_db, autocommit=True) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM cow.migrations ORDER BY 1")]
        assert versions == [m.version for m in migrations()]
        conn.execute("SELECT cow.use_session('new')")
        with pytest.raises(psycopg.errors.UniqueViolation) as exc:
            conn.execute("INSERT INTO users (id, email) VALUES (9, 'ADA@example.com')")
        assert exc.value.diag.constraint_name == "users_email_lower"
        with pytest.raises(psycopg.errors.ExclusionViolation):
            conn.execute("INSERT INTO bookings (id, during) VALUES (9, '[15,16)')")
        assert conn.execute(
            "SELECT count(*) FROM pg_class WHERE relname ~ '^t[0-9]+_xq' AND relkind = 'i'"
        ).fetchone() == (5,)
