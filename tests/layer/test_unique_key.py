"""Tables without a primary key, keyed by a NOT NULL unique index (cow._key_index), side by side with a
plain copy.

Like PostgreSQL's logical replication, the layer identifies a row of such a table by its REPLICA IDENTITY
index, else by the first (lowest oid) unique index that is valid, immediate, not partial, without
expressions and on NOT NULL columns. A Rails join table (``UNIQUE (a, b)`` on two NOT NULL columns) and a
legacy table with a ``UNIQUE NOT NULL`` code are enabled; a nullable, partial, deferrable or expression
unique index is no key and the table stays plain (guarded), with a notice naming the index and why.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from cowproxy.main import main
from tests.fix_layer import commit_conflicts
from tests.layer.test_semantics import Pair, base_rows, session_pair

SCHEMA = """
CREATE TABLE tags (code text NOT NULL, label text NOT NULL, uses int NOT NULL DEFAULT 0,
                   CONSTRAINT tags_code_key UNIQUE (code));
-- A Rails join table: no id, a composite NOT NULL unique key; the FK from `notes` references it.
CREATE TABLE taggings (item_id int NOT NULL, tag_code text NOT NULL REFERENCES tags (code) ON DELETE CASCADE,
                       weight int DEFAULT 1, UNIQUE (item_id, tag_code));
CREATE TABLE notes (id int PRIMARY KEY, item_id int, tag_code text, body text,
    FOREIGN KEY (item_id, tag_code) REFERENCES taggings (item_id, tag_code) ON DELETE CASCADE);
INSERT INTO tags VALUES ('red', 'Red', 2), ('blue', 'Blue', 1), ('green', 'Green', 0);
INSERT INTO taggings VALUES (1, 'red', 1), (2, 'red', 5), (1, 'blue', 2);
INSERT INTO notes VALUES (1, 1, 'red', 'n1'), (2, 2, 'red', 'n2'), (3, NULL, NULL, 'loose');
"""

TABLES = {"tags": "code", "taggings": "item_id, tag_code", "notes": "id"}


@pytest.fixture
def pair(plain_db: str, layer_db: str) -> Iterator[Pair]:
    with session_pair(plain_db, layer_db, SCHEMA) as p:
        yield p


def same(pair: Pair) -> None:
    for table, order in TABLES.items():
        pair.same_table(table, order)


def error(conn: psycopg.Connection[Any], sql: str) -> tuple[Any, ...]:
    """SQLSTATE, constraint, message and detail of the statement's error, as a client sees them."""
    with pytest.raises(psycopg.Error) as info, conn.transaction():
        conn.execute(sql)
    d = info.value.diag
    return (info.value.sqlstate, d.constraint_name, d.message_primary, d.message_detail, d.table_name)


def same_error(pair: Pair, sql: str) -> tuple[Any, ...]:
    a, b = error(pair.plain, sql), error(pair.cow, sql)
    assert b == a, f"{sql}: plain {a} != session {b}"
    return a


def test_the_key_is_the_unique_index(pair: Pair) -> None:
    keys = pair.cow.execute("SELECT table_name, pk_columns FROM cow.tables ORDER BY 1").fetchall()
    assert ("tags", ["code"]) in keys and ("taggings", ["item_id", "tag_code"]) in keys
    # The changes table's current-version index is on the key; no second index for the same UNIQUE.
    idx = pair.cow.execute(
        "SELECT c.relname, pg_get_indexdef(c.oid) FROM cow.registry g JOIN pg_class c"
        " ON c.relnamespace = 'cow_changes'::regnamespace AND c.relkind = 'i'"
        " AND c.relname LIKE g.changes_table || '\\_%'"
        " WHERE g.table_name = 'taggings' ORDER BY 1"
    ).fetchall()
    assert [i[0].split("_", 1)[1] for i in idx] == ["cur", "log"]
    assert "(_cow_session, item_id, tag_code) WHERE _cow_current" in idx[0][1]


def test_insert_update_delete_returning_like_the_plain_table(pair: Pair, layer_db: str) -> None:
    before = {t: base_rows(layer_db, t) for t in TABLES}
    assert pair.both("INSERT INTO tags (code, label) VALUES ('pink', 'Pink') RETURNING *") == (
        "1",
        [("pink", "Pink", 0)],
    )
    assert pair.both(
        "UPDATE tags SET uses = uses + 10 WHERE code IN ('red', 'pink') RETURNING code, uses", any_order=True
    ) == ("2", [("pink", 10), ("red", 12)])
    assert (
        pair.both("UPDATE taggings SET weight = NULL WHERE item_id = 1 RETURNING *", any_order=True)[0] == "2"
    )
    assert pair.both("DELETE FROM taggings WHERE item_id = 2 RETURNING *") == ("1", [(2, "red", 5)])
    pair.both("DELETE FROM taggings WHERE item_id = 2")  # gone: 0 rows
    pair.both("INSERT INTO taggings (item_id, tag_code) VALUES (2, 'red'), (3, 'pink') RETURNING *")
    pair.both("SELECT * FROM taggings WHERE item_id = 2 AND tag_code = 'red'")
    same(pair)
    # The key moves: the row is found at its new key only, once.
    assert pair.both("UPDATE tags SET code = 'crimson' WHERE code = 'green' RETURNING *") == (
        "1",
        [("crimson", "Green", 0)],
    )
    pair.both("UPDATE taggings SET item_id = 9 WHERE item_id = 1 AND tag_code = 'blue' RETURNING *")
    pair.both("SELECT count(*) FROM tags WHERE code IN ('green', 'crimson')")
    same(pair)
    assert {t: base_rows(layer_db, t) for t in TABLES} == before
    changes = pair.cow.execute("SELECT count(*) FROM cow.session_changes('s1')").fetchone()
    assert changes == (13,)  # with the cascaded delete of notes 2


def test_duplicate_key_is_23505_naming_the_unique_constraint(pair: Pair) -> None:
    assert same_error(pair, "INSERT INTO tags (code, label) VALUES ('red', 'again')") == (
        "23505",
        "tags_code_key",
        'duplicate key value violates unique constraint "tags_code_key"',
        "Key (code)=(red) already exists.",
        "tags",
    )
    # Across base and session: a key the session inserted, and a base key an update moves onto.
    pair.both("INSERT INTO tags (code, label) VALUES ('pink', 'Pink')")
    assert same_error(pair, "INSERT INTO tags (code, label) VALUES ('pink', 'again')")[1] == "tags_code_key"
    assert same_error(pair, "UPDATE tags SET code = 'blue' WHERE code = 'pink'")[3] == (
        "Key (code)=(blue) already exists."
    )
    assert same_error(pair, "INSERT INTO taggings VALUES (1, 'red', 3)")[1:3] == (
        "taggings_item_id_tag_code_key",
        'duplicate key value violates unique constraint "taggings_item_id_tag_code_key"',
    )
    # A key the session deleted is free again; NOT NULL holds on the key's columns.
    pair.both("DELETE FROM taggings WHERE item_id = 1 AND tag_code = 'red'")
    pair.both("INSERT INTO taggings VALUES (1, 'red', 3) RETURNING *")
    assert pair.both("INSERT INTO tags (code, label) VALUES (NULL, 'x')") == ("error", "23502")
    same(pair)


def test_foreign_keys_to_the_unique_key(pair: Pair) -> None:
    assert same_error(pair, "INSERT INTO taggings (item_id, tag_code) VALUES (5, 'nope')") == (
        "23503",
        "taggings_tag_code_fkey",
        'insert or update on table "taggings" violates foreign key constraint "taggings_tag_code_fkey"',
        'Key (tag_code)=(nope) is not present in table "tags".',
        "taggings",
    )
    assert (
        same_error(pair, "INSERT INTO notes VALUES (9, 1, 'green', 'x')")[1] == "notes_item_id_tag_code_fkey"
    )
    pair.both("INSERT INTO notes VALUES (9, 1, 'blue', 'x') RETURNING *")
    # ON DELETE CASCADE through two levels within the session: tags -> taggings -> notes.
    assert pair.both("DELETE FROM tags WHERE code = 'red' RETURNING code") == ("1", [("red",)])
    assert pair.both("SELECT id FROM notes ORDER BY id") == ("2", [(3,), (9,)])
    pair.both("SELECT * FROM taggings ORDER BY item_id, tag_code")
    same(pair)


def commit_sql(conn: psycopg.Connection[Any], session: str) -> Any:
    row = conn.execute("SELECT cow.commit_session(%s)", (session,)).fetchone()
    assert row is not None
    return row[0]


def test_diff_and_commit_apply_it(pair: Pair, layer_db: str) -> None:
    pair.both("INSERT INTO tags (code, label) VALUES ('pink', 'Pink')")
    pair.both("UPDATE tags SET code = 'crimson', uses = 7 WHERE code = 'green'")
    pair.both("UPDATE taggings SET weight = 42 WHERE item_id = 2 AND tag_code = 'red'")
    pair.both("DELETE FROM taggings WHERE item_id = 1 AND tag_code = 'blue'")
    pair.both("INSERT INTO taggings VALUES (7, 'pink', 1)")
    diff = pair.cow.execute(
        "SELECT table_name, pk, action, changed FROM cow.session_diff('s1') ORDER BY seq"
    ).fetchall()
    assert [(t, pk, a) for t, pk, a, _ in diff] == [
        ("tags", {"code": "pink"}, "insert"),
        ("tags", {"code": "green"}, "delete"),
        ("tags", {"code": "crimson"}, "insert"),
        ("taggings", {"item_id": 2, "tag_code": "red"}, "update"),
        ("taggings", {"item_id": 1, "tag_code": "blue"}, "delete"),
        ("taggings", {"item_id": 7, "tag_code": "pink"}, "insert"),
    ]
    assert diff[3][3] == {"weight": [5, 42]}
    with psycopg.connect(layer_db, autocommit=True) as admin:
        result = commit_sql(admin, "s1")
        assert result["tables"]["public.tags"] == {"inserted": 1, "updated": 1, "deleted": 0}
        assert result["tables"]["public.taggings"] == {"inserted": 1, "updated": 1, "deleted": 1}
    pair.cow.execute("SELECT cow.use_session(NULL)")
    same(pair)  # the base tables now hold what the plain copy holds


def test_commit_conflict_is_40001(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(SCHEMA)
        update = "UPDATE taggings SET weight = {} WHERE item_id = 2 AND tag_code = 'red'"
        assert "of table public.taggings" in commit_conflicts(conn, "c", update.format(10), update.format(11))
        assert conn.execute("SELECT weight FROM taggings WHERE item_id = 2").fetchone() == (11,)
        conn.execute("SELECT cow.commit_session('c', NULL, 'overwrite')")
        assert conn.execute("SELECT weight FROM taggings WHERE item_id = 2").fetchone() == (10,)


def test_score_works_on_it(layer_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute("SELECT cow.create_session('gt', 'ground_truth')")
        conn.execute("SELECT cow.create_session('ag', 'agent', NULL, NULL, NULL, 'gt')")
        for session, extra in (("gt", False), ("ag", True)):
            conn.execute("SELECT cow.use_session(%s, 'op1')", (session,))
            conn.execute("INSERT INTO taggings VALUES (3, 'blue', 4)")
            conn.execute("SELECT cow.use_operation('op2')")
            conn.execute("UPDATE tags SET label = 'Verdant' WHERE code = 'green'")
            if extra:
                conn.execute("SELECT cow.use_operation('op3')")
                conn.execute("DELETE FROM taggings WHERE item_id = 1 AND tag_code = 'blue'")
        conn.execute("SELECT cow.use_session(NULL)")
    code = main(["score", "--dsn", layer_db, "--gt", "gt", "--agent", "ag", "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads(out)
    assert data["counts"]["matched"] == 2 and data["counts"]["extra"] == 1 and data["counts"]["missing"] == 0
    assert data["content_score"] == pytest.approx(1.0)
    assert (data["precision"], data["recall"]) == pytest.approx((2 / 3, 1.0))


LEFT_PLAIN = """
CREATE TABLE n_nullable (a int UNIQUE, v text);
CREATE TABLE n_partial (a int NOT NULL, v text);
CREATE UNIQUE INDEX n_partial_a ON n_partial (a) WHERE v IS NOT NULL;
CREATE TABLE n_deferrable (a int NOT NULL CONSTRAINT n_deferrable_a UNIQUE DEFERRABLE, v text);
CREATE TABLE n_expr (a text NOT NULL, v text);
CREATE UNIQUE INDEX n_expr_a ON n_expr (lower(a));
CREATE TABLE n_none (a int NOT NULL, v text);
"""


def notes_of(conn: psycopg.Connection[Any], ddl: str) -> list[str]:
    seen: list[str] = []
    conn.add_notice_handler(lambda d: seen.append(d.message_primary or ""))
    conn.execute(ddl)
    return [n for n in seen if n.startswith("cowproxy:") and "public.nopk" not in n]


def test_unqualified_unique_indexes_leave_the_table_plain(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        notes = notes_of(conn, LEFT_PLAIN)
        why = {
            "n_nullable": "n_nullable_a_key (column a is nullable)",
            "n_partial": "n_partial_a (partial)",
            "n_deferrable": "n_deferrable_a (deferrable)",
            "n_expr": "n_expr_a (on expressions)",
        }
        for table, reason in why.items():
            # (Every DDL statement's refresh repeats the notes; the last one is after the table's indexes.)
            mine = [n for n in notes if f"table public.{table} has" in n]
            assert mine, (table, notes)
            assert mine[-1] == (
                f"cowproxy: table public.{table} has no primary key or NOT NULL unique index, and a UNIQUE"
                " index or exclusion constraint that cannot be its key (not supported without a key:"
                f" {reason}): not enabled (it stays plain; writes to it in a session are refused)"
            )
        # Without any unique index: a keyless table (docs/layer.md), not a keyed one.
        assert not [n for n in notes if "public.n_none" in n]
        keys = conn.execute("SELECT table_name, pk_columns FROM cow.tables WHERE table_name LIKE 'n\\_%'")
        assert keys.fetchall() == [("n_none", [])]
        conn.execute("INSERT INTO n_none VALUES (1, 'base')")
        conn.execute("SELECT cow.use_session('s')")
        for table in why:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"public\\.{table} refused"):
                conn.execute(f"INSERT INTO {table} VALUES (1, 'x')")
        conn.execute("SELECT cow.use_session(NULL)")
        # A qualifying unique index added later makes it a keyed table; its base rows show in a session.
        conn.execute("CREATE UNIQUE INDEX n_none_a ON n_none (a)")
        assert conn.execute("SELECT pk_columns FROM cow.tables WHERE table_name = 'n_none'").fetchone() == (
            ["a"],
        )
        conn.execute("SELECT cow.use_session('s')")
        conn.execute("UPDATE n_none SET v = 'session' WHERE a = 1")
        assert conn.execute("SELECT * FROM n_none").fetchall() == [(1, "session")]
        conn.execute("SELECT cow.use_session(NULL)")
        assert conn.execute("SELECT * FROM n_none").fetchall() == [(1, "base")]


KEYS = """
CREATE TABLE r (a int NOT NULL CONSTRAINT r_a UNIQUE, code int NOT NULL CONSTRAINT r_code UNIQUE, v text);
INSERT INTO r VALUES (1, 10, 'one'), (2, 20, 'two');
"""


def key_of(conn: psycopg.Connection[Any], table: str = "r") -> Any:
    row = conn.execute("SELECT pk_columns FROM cow.tables WHERE table_name = %s", (table,)).fetchone()
    return None if row is None else row[0]


def test_replica_identity_chooses_the_key(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(KEYS)
        assert key_of(conn) == ["a"]  # the lowest oid
        sig = conn.execute("SELECT signature FROM cow.registry WHERE table_name = 'r'").fetchone()
        conn.execute("ALTER TABLE r REPLICA IDENTITY USING INDEX r_code")
        assert key_of(conn) == ["code"]
        assert conn.execute("SELECT signature FROM cow.registry WHERE table_name = 'r'").fetchone() != sig
        conn.execute("SELECT cow.use_session('s')")
        conn.execute("UPDATE r SET a = 3 WHERE code = 10")  # a is an ordinary UNIQUE column now
        assert conn.execute("SELECT * FROM r ORDER BY code").fetchall() == [(3, 10, "one"), (2, 20, "two")]
        with pytest.raises(psycopg.errors.UniqueViolation) as info:
            conn.execute("INSERT INTO r VALUES (2, 30, 'x')")
        assert info.value.diag.constraint_name == "r_a"
        with pytest.raises(psycopg.errors.UniqueViolation) as info:
            conn.execute("INSERT INTO r VALUES (4, 20, 'x')")
        assert info.value.diag.constraint_name == "r_code"
        conn.execute("SELECT cow.use_session(NULL)")
        commit_sql(conn, "s")
        assert conn.execute("SELECT * FROM r ORDER BY code").fetchall() == [(3, 10, "one"), (2, 20, "two")]
        conn.execute("ALTER TABLE r REPLICA IDENTITY DEFAULT")
        assert key_of(conn) == ["a"]


def test_key_changed_or_lost_is_followed_or_refused_while_a_session_holds_changes(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(KEYS)
        conn.execute("SELECT cow.use_session('s')")
        conn.execute("UPDATE r SET v = 'session' WHERE a = 1")
        conn.execute("SELECT cow.use_session(NULL)")
        # Dropping NOT NULL from a's column moves the key to code: the session's versions are keyed by a.
        for ddl in (
            "ALTER TABLE r ALTER COLUMN a DROP NOT NULL",
            "ALTER TABLE r DROP CONSTRAINT r_a",
            "ALTER TABLE r ADD PRIMARY KEY (code)",
        ):
            with pytest.raises(psycopg.errors.FeatureNotSupported) as info:
                conn.execute(ddl)
            assert info.value.diag.message_primary == (
                "cowproxy: table public.r would change its row key from (a) to (code), but sessions hold"
                " changes to it: s"
            )
            assert info.value.diag.message_hint == (
                "commit or discard those sessions first (their changes were recorded for the table as it was)"
            )
        # Nothing changed: the DDL rolled back, the session reads and writes on.
        assert key_of(conn) == ["a"]
        assert conn.execute(
            "SELECT attnotnull FROM pg_attribute WHERE attrelid = 'r'::regclass AND attname = 'a'"
        ).fetchone() == (True,)
        conn.execute("SELECT cow.use_session('s')")
        conn.execute("UPDATE r SET v = 'again' WHERE a = 2")
        assert conn.execute("SELECT v FROM r ORDER BY a").fetchall() == [("session",), ("again",)]
        conn.execute("SELECT cow.use_session(NULL)")
        # Renaming the key's column is no change of key.
        conn.execute("ALTER TABLE r RENAME COLUMN a TO aa")
        assert key_of(conn) == ["aa"]
        conn.execute("SELECT cow.discard_session('s')")
        # Without changes: the key switches to code (the table is enabled anew); with code nullable too, the
        # table goes back to plain, its layer objects dropped.
        notes = notes_of(conn, "ALTER TABLE r ALTER COLUMN aa DROP NOT NULL")
        assert notes == [] and key_of(conn) == ["code"]
        row = conn.execute("SELECT changes_table FROM cow.registry WHERE table_name = 'r'").fetchone()
        assert row is not None
        changes = row[0]
        conn.execute("SELECT cow.use_session('s2')")
        conn.execute("UPDATE r SET v = 'by code' WHERE code = 20")
        assert conn.execute("SELECT v FROM r ORDER BY code").fetchall() == [("one",), ("by code",)]
        conn.execute("SELECT cow.use_session(NULL)")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="lost its key, but sessions hold"):
            conn.execute("ALTER TABLE r ALTER COLUMN code DROP NOT NULL")
        conn.execute("SELECT cow.discard_session('s2')")
        notes = notes_of(conn, "ALTER TABLE r ALTER COLUMN code DROP NOT NULL")
        assert key_of(conn) is None
        assert notes == [
            "cowproxy: table public.r has no primary key or NOT NULL unique index, and a UNIQUE index or"
            " exclusion constraint that cannot be its key (not supported without a key: r_a (column aa is"
            " nullable), r_code (column code is nullable)): not enabled (it stays plain; writes to it in a"
            " session are refused)"
        ]
        leftovers = conn.execute(
            "SELECT to_regclass('cow_overlay_public.r'), to_regclass('cow_changes.' || %s),"
            " (SELECT count(*) FROM pg_proc WHERE pronamespace = 'cow_changes'::regnamespace"
            "  AND proname LIKE %s || '\\_%%')",
            (changes, changes),
        ).fetchone()
        assert leftovers == (None, None, 0)
        conn.execute("SELECT cow.use_session('s3')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=r"public\.r refused"):
            conn.execute("UPDATE r SET v = 'x'")
        conn.execute("SELECT cow.use_session(NULL)")
        # ... and comes back with a key.
        conn.execute("ALTER TABLE r ALTER COLUMN code SET NOT NULL")
        assert key_of(conn) == ["code"]


def test_primary_key_added_later(layer_db: str, plain_db: str) -> None:
    with (
        psycopg.connect(layer_db, autocommit=True) as conn,
        psycopg.connect(plain_db, autocommit=True) as plain,
    ):
        for c in (conn, plain):
            c.execute(KEYS)
        conn.execute("SELECT cow.use_session('s')")
        conn.execute("UPDATE r SET v = 'session' WHERE a = 1")
        conn.execute("SELECT cow.use_session(NULL)")
        # On the key's columns: the key switches to the primary key and the session keeps its changes.
        for c in (conn, plain):
            c.execute("ALTER TABLE r ADD CONSTRAINT r_pk PRIMARY KEY (a)")
        assert key_of(conn) == ["a"]
        conn.execute("SELECT cow.use_session('s')")
        assert conn.execute("SELECT * FROM r ORDER BY a").fetchall() == [(1, 10, "session"), (2, 20, "two")]
        # The same index PostgreSQL reports first: the older UNIQUE (a), as on the plain table.
        errors = []
        for c in (conn, plain):
            with pytest.raises(psycopg.errors.UniqueViolation) as info:
                c.execute("INSERT INTO r VALUES (2, 30, 'x')")
            errors.append(info.value.diag.constraint_name)
        assert errors[0] == errors[1] == "r_a"
        conn.execute("SELECT cow.use_session(NULL)")
        assert commit_sql(conn, "s")["tables"]["public.r"] == {"inserted": 0, "updated": 1, "deleted": 0}
        # On other columns, without changes: the key switches.
        conn.execute("ALTER TABLE r DROP CONSTRAINT r_pk, ADD CONSTRAINT r_pk PRIMARY KEY (code)")
        assert key_of(conn) == ["code"]
        conn.execute("SELECT cow.use_session('s3')")
        conn.execute("UPDATE r SET code = 11 WHERE code = 10")
        assert conn.execute("SELECT * FROM r ORDER BY code").fetchall() == [
            (1, 11, "session"),
            (2, 20, "two"),
        ]
        conn.execute("SELECT cow.use_session(NULL)")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match=r"from \(code\) to \(a\), but sessions"):
            conn.execute("ALTER TABLE r DROP CONSTRAINT r_pk")
        assert commit_sql(conn, "s3")["tables"]["public.r"] == {"inserted": 0, "updated": 1, "deleted": 0}
        assert conn.execute("SELECT * FROM r ORDER BY code").fetchall() == [
            (1, 11, "session"),
            (2, 20, "two"),
        ]
