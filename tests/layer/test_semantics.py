"""The layer's contract (docs/layer.md, "What a session guarantees"): each statement runs on a plain copy and
in a session, side by side.

Same rows, same RETURNING values, same row counts, same SQLSTATEs; the base tables stay untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from tests.fix_db import outcome
from tests.fix_layer import SAMPLE_DATA

Outcome = tuple[str, Any]


def brief(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> Outcome:
    """The statement's outcome (``tests.fix_db.outcome``, in a savepoint) as (row count, rows) or
    ('error', SQLSTATE): the layer's contract is about rows and SQLSTATEs, not message texts."""
    seen = outcome(conn, sql, params, savepoint=True)
    if seen[0] == "error":
        return ("error", seen[1])
    count = seen[1].rsplit(" ", 1)[-1]
    return (count if count.isdigit() else "-1", seen[2])


@dataclass
class Pair:
    plain: psycopg.Connection[Any]
    cow: psycopg.Connection[Any]

    def both(self, sql: str, params: Any = None, *, any_order: bool = False) -> Outcome:
        """any_order: the rows may come in another order (RETURNING of a multi-row UPDATE or DELETE follows
        the plan's scan order, which SQL leaves open, as it does a SELECT's without ORDER BY)."""
        a = brief(self.plain, sql, params)
        b = brief(self.cow, sql, params)
        if any_order:
            a, b = (x if x[1] is None else (x[0], sorted(x[1], key=repr)) for x in (a, b))
        assert b == a, f"{sql}: plain {a} != session {b}"
        return a

    def same_table(self, table: str, order: str = "id") -> list[tuple[Any, ...]]:
        q = f"SELECT * FROM {table} ORDER BY {order}"
        a = self.plain.execute(q).fetchall()
        b = self.cow.execute(q).fetchall()
        assert b == a, f"{table}: plain {a} != session {b}"
        return a


def base_rows(dsn: str, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(f"SELECT * FROM public.{table} ORDER BY 1").fetchall()


@contextlib.contextmanager
def session_pair(plain_db: str, layer_db: str, app_ddl: str | None = None) -> Iterator[Pair]:
    """A connection to the plain copy and one in session s1 (operation op1) on the layer's database, after
    running ``app_ddl`` on both (on the layer's side it is app DDL: the event trigger enables new tables)."""
    with (
        psycopg.connect(plain_db, autocommit=True) as plain,
        psycopg.connect(layer_db, autocommit=True) as cow,
    ):
        if app_ddl is not None:
            plain.execute(app_ddl)
            cow.execute(app_ddl)
        cow.execute("SELECT cow.use_session('s1', 'op1')")
        yield Pair(plain, cow)


@pytest.fixture
def pair(plain_db: str, layer_db: str) -> Iterator[Pair]:
    with session_pair(plain_db, layer_db) as p:
        yield p


@pytest.fixture
def untouched(layer_db: str) -> Iterator[None]:
    """The base tables are byte-for-byte what they were before the test."""
    before = {t: base_rows(layer_db, t) for t in ("customers", "orders", "nopk")}
    yield
    assert {t: base_rows(layer_db, t) for t in before} == before


def test_sample_data_is_the_same_on_both_sides(pair: Pair) -> None:
    assert len(pair.same_table("customers")) == 3
    assert len(pair.same_table("orders")) == 4
    assert "INSERT" in SAMPLE_DATA


def test_defaults_serial_identity_generated_returning(pair: Pair, untouched: None) -> None:
    rows = pair.both("INSERT INTO customers (email, name) VALUES ('d@x', 'Dee') RETURNING *")
    assert rows == ("1", [(4, "d@x", "Dee", "basic", 0)])
    rows = pair.both(
        "INSERT INTO orders (customer_id, qty) VALUES (4, 3), (1, 2) RETURNING id, total, unit_price"
    )
    assert str(rows[1][0][1]) == "29.97"
    pair.both("INSERT INTO orders (id, customer_id) VALUES (100, 2) RETURNING *")
    # ORDER BY: the ids follow the SELECT's row order, which SQL leaves open (a hash join may reorder it)
    pair.both(
        "INSERT INTO orders (customer_id, qty, unit_price) SELECT id, id + 1, 2.00 FROM customers ORDER BY id"
        " RETURNING *"
    )
    pair.same_table("orders")
    pair.same_table("customers")


def test_update_sets_exactly_the_named_columns_null_included(pair: Pair, untouched: None) -> None:
    pair.both("UPDATE orders SET note = NULL WHERE id = 1 RETURNING *")
    pair.both(
        "UPDATE orders SET qty = qty + 1, ref = NULL WHERE customer_id = 1 RETURNING id, qty, total, ref"
    )
    pair.both("UPDATE customers SET score = NULL WHERE tier = 'basic' RETURNING *")
    pair.both("UPDATE customers SET score = DEFAULT WHERE id = 2 RETURNING *")
    assert pair.both("UPDATE orders SET note = 'none' WHERE id = 999") == ("0", None)
    pair.same_table("orders")
    pair.same_table("customers")


def test_primary_key_update_moves_the_row(pair: Pair, untouched: None) -> None:
    pair.both("UPDATE orders SET id = 50 WHERE id = 2 RETURNING *")
    pair.both("UPDATE orders SET id = 51 WHERE id = 50 RETURNING id")
    pair.both("UPDATE orders SET id = 1 WHERE id = 3")  # 23505
    assert pair.same_table("orders")[-1][0] == 51
    # ON UPDATE CASCADE carries the children along.
    pair.both("UPDATE customers SET id = 10 WHERE id = 1 RETURNING *")
    pair.same_table("customers")
    pair.same_table("orders")
    assert pair.both("SELECT count(*) FROM orders WHERE customer_id = 10") == ("1", [(2,)])


def test_constraint_violations_have_postgresql_sqlstates(pair: Pair, untouched: None) -> None:
    assert pair.both("INSERT INTO customers (email, name) VALUES ('ada@example.com', 'x')") == (
        "error",
        "23505",
    )
    assert pair.both("INSERT INTO customers (id, email, name) VALUES (1, 'new@x', 'x')") == ("error", "23505")
    assert pair.both("INSERT INTO orders (customer_id) VALUES (99)") == ("error", "23503")
    assert pair.both("INSERT INTO customers (email) VALUES ('z@x')") == ("error", "23502")
    assert pair.both("UPDATE customers SET name = NULL WHERE id = 2") == ("error", "23502")
    assert pair.both("INSERT INTO customers (email, name, tier) VALUES ('t@x', 't', 'gold')") == (
        "error",
        "23514",
    )
    assert pair.both("UPDATE orders SET qty = 0 WHERE id = 1") == ("error", "23514")
    assert pair.both("UPDATE orders SET ref = 'R-2' WHERE id = 1") == ("error", "23505")
    assert pair.both("UPDATE orders SET customer_id = 42 WHERE id = 1") == ("error", "23503")
    # Unique across base and session: a value freed in the session can be reused; NULLs are distinct.
    pair.both("UPDATE orders SET ref = NULL WHERE id = 2")
    pair.both("UPDATE orders SET ref = 'R-2' WHERE id = 1 RETURNING id, ref")
    pair.both("INSERT INTO orders (customer_id, ref) VALUES (1, NULL), (2, NULL) RETURNING id")
    # A failed multi-row statement leaves nothing.
    assert pair.both(
        "INSERT INTO customers (email, name) VALUES ('ok@x', 'ok'), ('ada@example.com', 'dup')"
    ) == (
        "error",
        "23505",
    )
    pair.same_table("customers")
    pair.same_table("orders")


def test_fk_checks_use_the_sessions_view_of_the_parent(pair: Pair, untouched: None) -> None:
    pair.both("INSERT INTO customers (email, name) VALUES ('n@x', 'New') RETURNING id")
    pair.both("INSERT INTO orders (customer_id, qty) VALUES (4, 1) RETURNING id, customer_id")
    pair.both("DELETE FROM customers WHERE id = 2 RETURNING *")  # cascades to order 3
    assert pair.both("INSERT INTO orders (customer_id) VALUES (2)") == ("error", "23503")
    pair.same_table("orders")


def test_on_delete_cascade_within_the_session(pair: Pair, untouched: None) -> None:
    assert pair.both("DELETE FROM customers WHERE id = 1") == ("1", None)
    assert pair.both("SELECT count(*) FROM orders") == ("1", [(2,)])
    pair.both("DELETE FROM orders RETURNING id", any_order=True)
    pair.same_table("orders")
    pair.same_table("customers")


def test_deletes_and_reinserts(pair: Pair, untouched: None) -> None:
    pair.both("DELETE FROM orders WHERE id = 4 RETURNING *")
    pair.both("INSERT INTO orders (id, customer_id, ref) VALUES (4, 3, 'R-4') RETURNING *")
    pair.both("DELETE FROM orders WHERE id = 4")
    pair.both("DELETE FROM orders WHERE id = 4")
    pair.same_table("orders")


def test_view_twins_show_the_session(pair: Pair, untouched: None) -> None:
    pair.both("INSERT INTO orders (customer_id, qty, unit_price) VALUES (3, 10, 1.00)")
    pair.both("UPDATE customers SET name = 'Bobby' WHERE id = 2")
    pair.same_table("order_totals", "customer_id")


def test_other_sessions_are_invisible_and_no_session_is_the_base(layer_db: str, untouched: None) -> None:
    with psycopg.connect(layer_db, autocommit=True) as a, psycopg.connect(layer_db, autocommit=True) as b:
        a.execute("SELECT cow.use_session('A')")
        a.execute("INSERT INTO customers (email, name) VALUES ('a@x', 'A')")
        a.execute("UPDATE orders SET note = 'a' WHERE id = 1")
        b.execute("SELECT cow.use_session('B')")
        assert b.execute("SELECT count(*) FROM customers").fetchone() == (3,)
        assert b.execute("SELECT note FROM orders WHERE id = 1").fetchone() == ("first",)
        b.execute("INSERT INTO customers (email, name) VALUES ('a@x', 'B')")  # no conflict with session A
        b.execute("SELECT cow.use_session('')")
        assert b.execute("SELECT count(*) FROM customers").fetchone() == (3,)
        assert b.execute("SHOW search_path").fetchone() == ('"$user", public',)
        assert a.execute("SELECT count(*) FROM customers").fetchone() == (4,)


def test_guard_refuses_base_writes_in_a_session(layer_db: str, untouched: None) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session('s1')")
        for sql in (
            "INSERT INTO public.customers (email, name) VALUES ('g@x', 'g')",
            "UPDATE public.orders SET qty = 5",
            "DELETE FROM public.orders",
            "TRUNCATE public.orders CASCADE",
            "INSERT INTO public.nopk VALUES (2, 'two')",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="session s1"):
                conn.execute(sql)
        # SET LOCAL under autocommit, search_path changed by hand: still refused.
        conn.execute("SELECT cow.use_session(NULL)")
        conn.execute("SET cow.session_id = 's2'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE customers SET score = 1")


def test_bad_ids_are_refused(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        for bad in ("a b", "x" * 129, "s;drop", "é"):
            with pytest.raises(psycopg.errors.InvalidParameterValue):
                conn.execute("SELECT cow.use_session(%s)", (bad,))
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute("SELECT cow.use_session('ok', 'bad op')")
        assert conn.execute("SELECT current_setting('cow.session_id', true)").fetchone() in ((None,), ("",))
        # Ids that bypass cow.use_session (SET, startup options) are checked at the first write.
        conn.execute("SET cow.session_id = 'bad id'")
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute("UPDATE cow_overlay_public.customers SET score = 1 WHERE id = 1")
        conn.execute("SET cow.session_id = 'ok'")
        conn.execute("SET cow.operation_id = 'bad op!'")
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute("UPDATE cow_overlay_public.customers SET score = 1 WHERE id = 1")


def test_operation_per_transaction_without_operation_id(layer_db: str) -> None:
    with psycopg.connect(layer_db) as conn:
        conn.execute("SELECT cow.use_session('s1')")
        conn.execute("UPDATE customers SET score = 1 WHERE id = 1")
        conn.execute("UPDATE customers SET score = 2 WHERE id = 2")
        conn.commit()
        conn.execute("UPDATE customers SET score = 3 WHERE id = 3")
        conn.commit()
        ops = [r[0] for r in conn.execute("SELECT operation_id FROM cow.session_changes('s1')")]
    assert len(ops) == 3
    assert ops[0] == ops[1] != ops[2]
    assert all(op.startswith("xact:") for op in ops)


def test_writes_are_ordered_by_sequence_within_a_transaction(layer_db: str) -> None:
    with psycopg.connect(layer_db) as conn:
        conn.execute("SELECT cow.use_session('s1', 'op')")
        for i in range(5):
            conn.execute("UPDATE customers SET score = %s WHERE id = 1", (i,))
        conn.commit()
        rows = conn.execute("SELECT seq, row_data->>'score' FROM cow.session_changes('s1')").fetchall()
    assert [r[1] for r in rows] == ["0", "1", "2", "3", "4"]
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)


def test_copy_from_into_a_cow_table(pair: Pair, untouched: None) -> None:
    data = "e1@x\tE1\tpro\ne2@x\tE2\tbasic\n"
    for conn in (pair.plain, pair.cow):
        with conn.cursor() as cur, cur.copy("COPY customers (email, name, tier) FROM STDIN") as copy:
            copy.write(data)
    pair.same_table("customers")
    for conn in (pair.plain, pair.cow):
        with (
            pytest.raises(psycopg.errors.UniqueViolation),
            conn.cursor() as cur,
            cur.copy("COPY customers (email, name) FROM STDIN") as copy,
        ):
            copy.write("e1@x\tdup\n")
    pair.same_table("customers")


def test_explicit_values_for_generated_and_always_identity_columns(pair: Pair, untouched: None) -> None:
    for conn in (pair.plain, pair.cow):
        conn.execute(
            "CREATE TABLE tickets (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, n int,"
            " twice int GENERATED ALWAYS AS (n * 2) STORED)"
        )
    assert pair.both("INSERT INTO tickets (id, n) VALUES (7, 1)") == ("error", "428C9")
    assert pair.both("INSERT INTO tickets (n, twice) VALUES (1, 2)") == ("error", "428C9")
    pair.both("INSERT INTO tickets (n) VALUES (1), (2) RETURNING *")
    pair.both("INSERT INTO tickets (id, n, twice) VALUES (DEFAULT, 3, DEFAULT) RETURNING *")
    assert pair.both("UPDATE tickets SET twice = 5 WHERE id = 1") == ("error", "428C9")
    assert pair.both("UPDATE tickets SET id = 9 WHERE id = 1") == ("error", "428C9")
    pair.both("UPDATE tickets SET n = 10, twice = DEFAULT WHERE id = 1 RETURNING *")
    pair.same_table("tickets")


def test_row_locks_work_through_the_view(pair: Pair, untouched: None) -> None:
    pair.both("UPDATE customers SET score = 3 WHERE id = 2")
    pair.both("SELECT id, score FROM customers WHERE id IN (1, 2) ORDER BY id FOR UPDATE")
    pair.both("SELECT c.id FROM customers c JOIN orders o ON o.customer_id = c.id ORDER BY 1 FOR SHARE OF c")


def test_for_update_without_the_proxy_locks_nothing(layer_db: str) -> None:
    """Known limit (docs/layer.md, "Row locks in a session"): the view's rows come from a UNION ALL, for which
    PostgreSQL takes no row lock; the session's locks are the proxy's rewrite (cow.lock_rows), so a client
    that joins a session without the proxy locks nothing. Untagged traffic is never blocked by a session."""
    with (
        psycopg.connect(layer_db) as me,
        psycopg.connect(layer_db) as again,
        psycopg.connect(layer_db) as plain,
    ):
        for conn in (me, again):
            conn.execute("SELECT cow.use_session('s1', 'op1')")
        me.execute("UPDATE customers SET score = 3 WHERE id = 2")
        me.commit()
        assert len(me.execute("SELECT id FROM customers WHERE id IN (1, 2) FOR UPDATE").fetchall()) == 2
        assert again.execute("SELECT id FROM customers WHERE id = 2 FOR UPDATE NOWAIT").fetchall() == [(2,)]
        assert plain.execute("SELECT id FROM public.customers WHERE id = 1 FOR UPDATE NOWAIT").fetchall() == [
            (1,)
        ]


_MATCH_FULL = """
CREATE TABLE mf_parent (a int, b int, PRIMARY KEY (a, b));
INSERT INTO mf_parent VALUES (1, 1);
CREATE TABLE mf_child (id int PRIMARY KEY, a int, b int, pa int, pb int,
    FOREIGN KEY (a, b) REFERENCES mf_parent MATCH FULL,
    FOREIGN KEY (pa, pb) REFERENCES mf_parent MATCH FULL DEFERRABLE INITIALLY DEFERRED);
CREATE TABLE mf_tree (id int PRIMARY KEY, up int, up2 int, UNIQUE (id, up2),
    FOREIGN KEY (up, up2) REFERENCES mf_tree (id, up2) MATCH FULL);
"""


def test_match_full_foreign_keys_refuse_mixed_null_keys(plain_db: str, layer_db: str) -> None:
    """MATCH FULL: a key of NULLs only references nothing, one that mixes NULL and non-NULL values is 23503
    (at COMMIT when deferred), with PostgreSQL's DETAIL; a self-reference is no exception."""
    with session_pair(plain_db, layer_db, _MATCH_FULL) as pair:
        assert pair.both("INSERT INTO mf_child (id, a, b) VALUES (1, 1, 1), (2, NULL, NULL)")[0] == "2"
        assert pair.both("INSERT INTO mf_child (id, a, b) VALUES (3, 1, NULL)") == ("error", "23503")
        assert pair.both("UPDATE mf_child SET b = NULL WHERE id = 1") == ("error", "23503")
        assert pair.both("INSERT INTO mf_child (id, a, b) VALUES (4, 2, 2)") == ("error", "23503")
        assert pair.both("INSERT INTO mf_tree VALUES (1, 1, 1), (2, NULL, NULL)")[0] == "2"
        assert pair.both("INSERT INTO mf_tree VALUES (3, NULL, 1)") == ("error", "23503")
        for side in (pair.plain, pair.cow):
            with pytest.raises(psycopg.errors.ForeignKeyViolation) as mixed:
                side.execute("INSERT INTO mf_child (id, a, b) VALUES (5, NULL, 1)")
            assert mixed.value.diag.message_detail == (
                "MATCH FULL does not allow mixing of null and nonnull key values."
            )
            side.execute("BEGIN")
            side.execute("INSERT INTO mf_child (id, pa, pb) VALUES (6, 1, NULL)")
            with pytest.raises(psycopg.errors.ForeignKeyViolation):
                side.execute("COMMIT")
        pair.same_table("mf_child")
        pair.same_table("mf_tree")
    assert base_rows(layer_db, "mf_child") == []


_SET_DEFAULT = """
CREATE TABLE sd_parent (a int, b int, PRIMARY KEY (a, b));
INSERT INTO sd_parent VALUES (1, 1), (2, 2), (3, 3);
CREATE TABLE sd_child (id int PRIMARY KEY, a int DEFAULT 2, b int DEFAULT 2,
    FOREIGN KEY (a, b) REFERENCES sd_parent ON DELETE SET DEFAULT ON UPDATE SET DEFAULT);
INSERT INTO sd_child VALUES (1, 1, 1), (2, 3, 3);
"""


def test_set_default_to_the_key_just_removed_is_refused(plain_db: str, layer_db: str) -> None:
    """ON DELETE / ON UPDATE SET DEFAULT whose defaults are the key being deleted or changed leaves the child
    referencing a key that is gone: PostgreSQL refuses it (23503), although the child's key did not change."""
    with session_pair(plain_db, layer_db, _SET_DEFAULT) as pair:
        assert pair.both("DELETE FROM sd_parent WHERE a = 1") == ("1", None)
        assert pair.both("UPDATE sd_parent SET a = 4 WHERE a = 3") == ("1", None)
        pair.same_table("sd_child")
        assert pair.both("DELETE FROM sd_parent WHERE a = 2") == ("error", "23503")
        assert pair.both("UPDATE sd_parent SET b = 5 WHERE a = 2") == ("error", "23503")
        assert pair.both("DELETE FROM sd_child")[0] == "2"
        assert pair.both("DELETE FROM sd_parent WHERE a = 2") == ("1", None)
        pair.same_table("sd_parent", order="a")
    assert base_rows(layer_db, "sd_child") == [(1, 1, 1), (2, 3, 3)]
