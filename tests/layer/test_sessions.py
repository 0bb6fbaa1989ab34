"""Session registry, write log, diff, discard and commit (full, subset, conflicts)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg
import psycopg
import pytest

from migrations import sessions
from migrations.errors import SessionError

T = TypeVar("T")


def run(dsn: str, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    async def go() -> T:
        conn = await asyncpg.connect(dsn)
        try:
            return await work(conn)
        finally:
            await conn.close()

    return asyncio.run(go())


def rows(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql).fetchall()


def write(dsn: str, session: str, *statements: str, op: str | None = None) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session(%s, %s)", (session, op))
        for sql in statements:
            conn.execute(sql)


def test_registry_create_and_auto_registration(layer_db: str) -> None:
    s = run(
        layer_db,
        lambda c: sessions.create_session(c, "gt-1", kind="ground_truth", label="L", metadata={"k": [1]}),
    )
    assert (s.kind, s.label, s.metadata, s.status, s.changes) == ("ground_truth", "L", {"k": [1]}, "open", 0)
    with pytest.raises(SessionError, match="already exists"):
        run(layer_db, lambda c: sessions.create_session(c, "gt-1"))
    with pytest.raises(SessionError, match="invalid session id"):
        run(layer_db, lambda c: sessions.create_session(c, "bad id"))
    with pytest.raises(SessionError, match="kind"):
        run(layer_db, lambda c: sessions.create_session(c, "x", kind="nope"))
    write(layer_db, "auto.1", "UPDATE customers SET score = 5 WHERE id = 1")
    auto = run(layer_db, lambda c: sessions.get_session(c, "auto.1"))
    assert (auto.kind, auto.status, auto.changes, auto.operations) == ("other", "open", 1, 1)
    assert auto.first_write_at is not None
    listed = run(layer_db, sessions.list_sessions)
    assert [s.session_id for s in listed] == ["gt-1", "auto.1"]


def test_session_changes_log_layout(layer_db: str) -> None:
    write(
        layer_db,
        "s",
        "INSERT INTO customers (email, name) VALUES ('n@x', 'N')",
        "UPDATE orders SET id = 40 WHERE id = 4",
        "DELETE FROM orders WHERE id = 3",
        op="op-a",
    )
    log = rows(
        layer_db, "SELECT operation_id, table_name, pk, row_data, deleted FROM cow.session_changes('s')"
    )
    assert log[0] == (
        "op-a",
        "customers",
        {"id": 4},
        {"id": 4, "email": "n@x", "name": "N", "tier": "basic", "score": 0},
        False,
    )
    # A primary-key update: a delete of the old key, then the new key, same operation.
    assert log[1][1:] == ("orders", {"id": 4}, None, True)
    assert log[2][1:3] == ("orders", {"id": 40}) and log[2][3]["ref"] == "R-4" and log[2][4] is False
    assert log[3][1:] == ("orders", {"id": 3}, None, True)
    assert len(log) == 4


def test_discard_removes_that_sessions_changes_only(layer_db: str) -> None:
    write(layer_db, "a", "UPDATE customers SET score = 1")
    write(layer_db, "b", "UPDATE customers SET score = 2 WHERE id = 1")
    assert run(layer_db, lambda c: sessions.discard_session(c, "a")) == 3
    assert rows(layer_db, "SELECT count(*) FROM cow.session_changes('a')") == [(0,)]
    assert rows(layer_db, "SELECT count(*) FROM cow.session_changes('b')") == [(1,)]
    assert run(layer_db, lambda c: sessions.get_session(c, "a")).status == "discarded"
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
        write(layer_db, "a", "UPDATE customers SET score = 1")
    with pytest.raises(SessionError, match="unknown session"):
        run(layer_db, lambda c: sessions.discard_session(c, "zzz"))


def test_diff_per_table_and_per_operation(layer_db: str) -> None:
    write(layer_db, "d", "INSERT INTO customers (email, name) VALUES ('n@x', 'N')", op="o1")
    write(layer_db, "d", "UPDATE customers SET name = 'Bea', score = NULL WHERE id = 2", op="o2")
    write(
        layer_db,
        "d",
        "DELETE FROM orders WHERE id = 4",
        "UPDATE customers SET tier = 'pro' WHERE id = 4",
        op="o3",
    )
    diff = run(layer_db, lambda c: sessions.session_diff(c, "d"))
    net = {(r.table, r.pk["id"]): r for r in diff.rows}
    assert net["public.customers", 2].action == "update"
    assert net["public.customers", 2].changed == {"name": ("Bob", "Bea"), "score": (0, None)}
    assert (
        net["public.customers", 4].action == "insert" and net["public.customers", 4].new_row["tier"] == "pro"
    )
    assert net["public.orders", 4].action == "delete" and net["public.orders", 4].old_row["ref"] == "R-4"
    assert [op for op, _ in diff.operations] == ["o1", "o2", "o3"]
    o3 = dict(diff.operations)["o3"]
    assert [(r.action, r.table) for r in o3] == [("delete", "public.orders"), ("update", "public.customers")]
    assert o3[1].changed == {"tier": ("basic", "pro")}
    js = diff.as_json()
    assert len(js["tables"]["public.customers"]["updated"]) == 1


def test_commit_applies_net_changes_atomically(layer_db: str, plain_db: str) -> None:
    statements = (
        "INSERT INTO customers (email, name) VALUES ('n@x', 'N')",
        "INSERT INTO orders (customer_id, qty, ref) VALUES (4, 2, 'R-9')",
        "UPDATE orders SET note = NULL, qty = 7 WHERE id = 1",
        "UPDATE orders SET id = 44 WHERE id = 2",
        "DELETE FROM customers WHERE id = 3",
        "UPDATE customers SET email = 'bob@new' WHERE id = 2",
    )
    write(layer_db, "c", *statements)
    with psycopg.connect(plain_db, autocommit=True) as conn:
        for sql in statements:
            conn.execute(sql)
    result = run(layer_db, lambda c: sessions.commit_session(c, "c"))
    assert result.status == "committed" and result.remaining_changes == 0
    # The primary-key move 2 -> 44 is applied as an UPDATE of the base row, not a delete and an insert.
    assert result.tables["public.orders"] == {"inserted": 1, "updated": 2, "deleted": 1}
    for table in ("customers", "orders"):
        q = f"SELECT * FROM public.{table} ORDER BY id"
        assert rows(layer_db, q) == rows(plain_db, q)
    assert rows(layer_db, "SELECT count(*) FROM cow.session_changes('c')") == [(0,)]
    with pytest.raises(SessionError, match="committed"):
        run(layer_db, lambda c: sessions.commit_session(c, "c"))


def test_commit_conflict_is_40001_and_overwrite_forces(layer_db: str) -> None:
    write(layer_db, "c", "UPDATE customers SET name = 'Session' WHERE id = 1")
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute("UPDATE customers SET name = 'Base' WHERE id = 1")
        with pytest.raises(
            psycopg.errors.SerializationFailure, match=r"\(id\)=\(1\) of table public.customers"
        ):
            conn.execute("SELECT cow.commit_session('c')")
    assert rows(layer_db, "SELECT name FROM public.customers WHERE id = 1") == [("Base",)]
    with pytest.raises(SessionError, match="changed in base"):
        run(layer_db, lambda c: sessions.commit_session(c, "c"))
    run(layer_db, lambda c: sessions.commit_session(c, "c", on_conflict="overwrite"))
    assert rows(layer_db, "SELECT name FROM public.customers WHERE id = 1") == [("Session",)]


def test_commit_conflict_on_a_key_inserted_in_base_meanwhile(layer_db: str) -> None:
    write(layer_db, "c", "INSERT INTO customers (id, email, name) VALUES (50, 's@x', 'S')")
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute("INSERT INTO customers (id, email, name) VALUES (50, 'b@x', 'B')")
        with pytest.raises(psycopg.errors.SerializationFailure):
            conn.execute("SELECT cow.commit_session('c')")


def test_commit_subset_pulls_in_dependencies(layer_db: str) -> None:
    write(layer_db, "p", "INSERT INTO customers (id, email, name) VALUES (60, 'p@x', 'P')", op="o1")
    write(layer_db, "p", "INSERT INTO orders (id, customer_id) VALUES (60, 60)", op="o2")
    write(layer_db, "p", "UPDATE customers SET score = 9 WHERE id = 1", op="o3")
    write(layer_db, "p", "UPDATE customers SET score = 10 WHERE id = 1", op="o4")
    assert rows(layer_db, "SELECT cow.operation_closure('p', '{o2}')") == [(["o1", "o2"],)]
    assert rows(layer_db, "SELECT cow.operation_closure('p', '{o4}')") == [(["o3", "o4"],)]
    write(layer_db, "q", "INSERT INTO customers (id, email, name) VALUES (70, 'q@x', 'Q')", op="a")
    write(layer_db, "q", "UPDATE customers SET name = 'Q2' WHERE id = 70", op="b")
    write(layer_db, "q", "UPDATE orders SET note = 'n' WHERE id = 1", op="c")
    write(layer_db, "q", "INSERT INTO orders (id, customer_id) VALUES (70, 70)", op="d")
    write(layer_db, "q", "UPDATE orders SET customer_id = 70 WHERE id = 1", op="e")
    assert rows(layer_db, "SELECT cow.operation_closure('q', '{d}')") == [(["a", "b", "d"],)]
    assert rows(layer_db, "SELECT cow.operation_closure('q', '{e}')") == [(["a", "b", "c", "e"],)]
    with pytest.raises(SessionError, match="no operation nope"):
        run(layer_db, lambda c: sessions.commit_session(c, "p", ["nope"]))
    result = run(layer_db, lambda c: sessions.commit_session(c, "p", ["o2"]))
    assert result.operations == ("o1", "o2") and result.status == "open"
    assert rows(layer_db, "SELECT id, customer_id FROM public.orders WHERE id = 60") == [(60, 60)]
    assert rows(layer_db, "SELECT score FROM public.customers WHERE id = 1") == [(0,)]
    # The remaining operations still apply on top, without a false conflict.
    result = run(layer_db, lambda c: sessions.commit_session(c, "p"))
    assert result.status == "committed"
    assert rows(layer_db, "SELECT score FROM public.customers WHERE id = 1") == [(10,)]


def test_commit_from_a_tagged_connection_clears_the_guard_only_inside(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session('t', 'op')")
        conn.execute("UPDATE customers SET score = 3 WHERE id = 3")
        conn.execute("SELECT cow.commit_session('t')")
        assert conn.execute("SELECT current_setting('cow.session_id')").fetchone() == ("t",)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE public.customers SET score = 4")
    assert rows(layer_db, "SELECT score FROM public.customers WHERE id = 3") == [(3,)]


def test_an_unprivileged_app_role_works_in_a_session(layer_db: str) -> None:
    role = "cow_app_role"
    with psycopg.connect(layer_db, autocommit=True) as admin:
        admin.execute(f"DROP ROLE IF EXISTS {role}")
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}")
        admin.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}")
    dsn = layer_db.replace("postgres@", f"{role}@", 1)
    try:
        with psycopg.connect(dsn, autocommit=True) as app:
            app.execute("SELECT cow.use_session('app', 'op')")
            app.execute("INSERT INTO customers (email, name) VALUES ('r@x', 'R')")
            app.execute("UPDATE orders SET qty = 4 WHERE id = 1")
            app.execute("DELETE FROM customers WHERE id = 3")
            assert app.execute("SELECT count(*) FROM customers").fetchone() == (3,)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute("UPDATE public.orders SET qty = 5")
            # Committing needs the admin: the role may not run the layer's bookkeeping as someone else.
            app.execute("SELECT cow.use_session(NULL)")
            assert app.execute("SELECT count(*) FROM customers").fetchone() == (3,)
        run(layer_db, lambda c: sessions.commit_session(c, "app"))
        assert rows(layer_db, "SELECT count(*), max(id) FROM public.customers") == [(3, 4)]
    finally:
        with psycopg.connect(layer_db, autocommit=True) as admin:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


def test_commit_applies_a_primary_key_move_as_an_update(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE shipments (id int PRIMARY KEY, order_id int REFERENCES orders ON DELETE RESTRICT)"
        )
        conn.execute("INSERT INTO shipments VALUES (1, 1)")
    write(layer_db, "mv", "UPDATE customers SET id = 10 WHERE id = 1")  # orders follow by ON UPDATE CASCADE
    result = run(layer_db, lambda c: sessions.commit_session(c, "mv"))
    assert result.tables["public.customers"] == {"inserted": 0, "updated": 1, "deleted": 0}
    # Deleting customer 1 in the base would have cascaded to its orders and hit the shipment's RESTRICT.
    assert rows(layer_db, "SELECT id, customer_id FROM public.orders WHERE id IN (1, 2) ORDER BY id") == [
        (1, 10),
        (2, 10),
    ]
    assert rows(layer_db, "SELECT * FROM public.shipments") == [(1, 1)]


def test_concurrent_transactions_of_one_session_do_not_wait_for_each_other(layer_db: str) -> None:
    # Created up front (an auto-registered session's very first transactions do queue on its insertion).
    run(layer_db, lambda c: sessions.create_session(c, "pool"))
    with psycopg.connect(layer_db) as a, psycopg.connect(layer_db) as b:
        for conn in (a, b):
            conn.execute("SELECT cow.use_session('pool', 'op')")
            conn.commit()
        a.execute("UPDATE customers SET score = 1 WHERE id = 1")  # A's transaction stays open
        b.execute("SET statement_timeout = '2s'")
        b.execute("UPDATE customers SET score = 2 WHERE id = 2")  # would time out if it queued behind A
        b.commit()
        a.commit()
    assert rows(layer_db, "SELECT pk, row_data->>'score' FROM cow.session_changes('pool') ORDER BY seq") == [
        ({"id": 1}, "1"),
        ({"id": 2}, "2"),
    ]
    s = run(layer_db, lambda c: sessions.get_session(c, "pool"))
    assert s.first_write_at is not None and s.last_write_at is not None and s.status == "open"


def test_commit_applies_a_chain_of_primary_key_moves_as_updates(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE shipments (id int PRIMARY KEY, order_id int REFERENCES orders ON DELETE RESTRICT)"
        )
        conn.execute("INSERT INTO shipments VALUES (1, 1), (3, 3)")
    write(
        layer_db,
        "chain",
        "UPDATE customers SET id = 50 WHERE id = 1",
        "UPDATE customers SET id = 1 WHERE id = 2",  # takes the key 1 just freed
    )
    result = run(layer_db, lambda c: sessions.commit_session(c, "chain"))
    assert result.tables["public.customers"] == {"inserted": 0, "updated": 2, "deleted": 0}
    assert rows(layer_db, "SELECT id, customer_id FROM public.orders ORDER BY id") == [
        (1, 50),
        (2, 50),
        (3, 1),
        (4, 3),
    ]
    assert rows(layer_db, "SELECT * FROM public.shipments ORDER BY id") == [(1, 1), (3, 3)]


def test_commit_moves_a_row_into_a_key_the_session_deleted(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE shipments (id int PRIMARY KEY, order_id int REFERENCES orders ON DELETE RESTRICT"
            " ON UPDATE CASCADE)"
        )
        conn.execute("INSERT INTO shipments VALUES (3, 3)")
    write(layer_db, "into", "DELETE FROM orders WHERE id = 1", "UPDATE orders SET id = 1 WHERE id = 3")
    result = run(layer_db, lambda c: sessions.commit_session(c, "into"))
    assert result.tables["public.orders"] == {"inserted": 0, "updated": 1, "deleted": 1}
    assert rows(layer_db, "SELECT id, customer_id FROM public.orders ORDER BY id") == [(1, 2), (2, 1), (4, 3)]
    assert rows(layer_db, "SELECT * FROM public.shipments") == [(3, 1)]  # carried along by ON UPDATE CASCADE


def _shipments(dsn: str, *ids: int) -> None:
    """Grandchildren of customers the sessions never touch: a base delete of a customer (or re-insert of its
    orders) would silently delete them by ON DELETE CASCADE."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE shipments (id int PRIMARY KEY, order_id int REFERENCES orders ON DELETE CASCADE"
            " ON UPDATE CASCADE)"
        )
        for i in ids:
            conn.execute("INSERT INTO shipments VALUES (%s, %s)", (i, i))


def test_commit_after_a_subset_commit_of_a_move_keeps_untouched_children(layer_db: str) -> None:
    _shipments(layer_db, 1, 2)
    write(layer_db, "sub", "UPDATE customers SET id = 40 WHERE id = 1", op="move")
    write(layer_db, "sub", "UPDATE customers SET name = 'Ada L' WHERE id = 40", op="rename")
    first = run(layer_db, lambda c: sessions.commit_session(c, "sub", ["move"]))
    assert first.operations == ("move",) and first.status == "open"
    assert first.tables["public.customers"] == {"inserted": 0, "updated": 1, "deleted": 0}
    # The later change descends from base key 40 now: applied as an UPDATE, nothing deleted or re-inserted.
    rest = run(layer_db, lambda c: sessions.commit_session(c, "sub"))
    assert rest.status == "committed"
    assert rest.tables["public.customers"] == {"inserted": 0, "updated": 1, "deleted": 0}
    assert rows(layer_db, "SELECT id, name FROM public.customers ORDER BY id") == [
        (2, "Bob"),
        (3, "Cy"),
        (40, "Ada L"),
    ]
    assert rows(layer_db, "SELECT id, customer_id FROM public.orders ORDER BY id") == [
        (1, 40),
        (2, 40),
        (3, 2),
        (4, 3),
    ]
    assert rows(layer_db, "SELECT * FROM public.shipments ORDER BY id") == [(1, 1), (2, 2)]


def test_commit_after_a_subset_commit_of_the_first_of_two_moves(layer_db: str) -> None:
    # 1 -> 40 committed alone, then 40 -> 50: the second move must move base row 40, not delete it.
    _shipments(layer_db, 1, 3)
    write(layer_db, "two", "UPDATE customers SET id = 40 WHERE id = 1", op="m1")
    write(layer_db, "two", "UPDATE customers SET id = 50 WHERE id = 40", op="m2")
    write(layer_db, "two", "UPDATE orders SET id = 30 WHERE id = 3", op="m3")
    run(layer_db, lambda c: sessions.commit_session(c, "two", ["m1"]))
    assert rows(layer_db, "SELECT id, customer_id FROM public.orders ORDER BY id") == [
        (1, 40),
        (2, 40),
        (3, 2),
        (4, 3),
    ]
    run(layer_db, lambda c: sessions.commit_session(c, "two", ["m3"]))
    rest = run(layer_db, lambda c: sessions.commit_session(c, "two"))
    assert rest.status == "committed"
    assert rest.tables["public.customers"] == {"inserted": 0, "updated": 1, "deleted": 0}
    assert rows(layer_db, "SELECT id FROM public.customers ORDER BY id") == [(2,), (3,), (50,)]
    assert rows(layer_db, "SELECT id, customer_id FROM public.orders ORDER BY id") == [
        (1, 50),
        (2, 50),
        (4, 3),
        (30, 2),
    ]
    assert rows(layer_db, "SELECT * FROM public.shipments ORDER BY id") == [(1, 1), (3, 30)]


def test_commit_after_a_subset_commit_of_a_move_then_a_move_back(layer_db: str) -> None:
    # 1 -> 40 committed alone, then 40 -> 1: a move of base row 40 back to 1 (its shipments follow).
    _shipments(layer_db, 1, 2)
    write(layer_db, "back", "UPDATE customers SET id = 40 WHERE id = 1", op="there")
    write(layer_db, "back", "UPDATE customers SET id = 1 WHERE id = 40", op="back")
    run(layer_db, lambda c: sessions.commit_session(c, "back", ["there"]))
    rest = run(layer_db, lambda c: sessions.commit_session(c, "back"))
    assert rest.status == "committed"
    assert rest.tables["public.customers"] == {"inserted": 0, "updated": 1, "deleted": 0}
    assert rows(layer_db, "SELECT id, name FROM public.customers ORDER BY id") == [
        (1, "Ada"),
        (2, "Bob"),
        (3, "Cy"),
    ]
    assert rows(layer_db, "SELECT id, customer_id FROM public.orders ORDER BY id") == [
        (1, 1),
        (2, 1),
        (3, 2),
        (4, 3),
    ]
    assert rows(layer_db, "SELECT * FROM public.shipments ORDER BY id") == [(1, 1), (2, 2)]


def test_commit_points_existing_and_moved_rows_at_rows_the_session_inserted(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE staff (id int PRIMARY KEY, boss_id int REFERENCES staff ON UPDATE CASCADE"
            " ON DELETE SET NULL, name text NOT NULL)"
        )
        conn.execute("INSERT INTO staff VALUES (1, NULL, 'a'), (2, 1, 'b'), (3, 2, 'c')")
    write(
        layer_db,
        "self",
        "INSERT INTO staff VALUES (10, NULL, 'new boss')",
        "UPDATE staff SET boss_id = 10 WHERE id = 1",  # an existing row points at the inserted one
        "UPDATE staff SET id = 20, boss_id = 10 WHERE id = 3",  # a moved row too
    )
    result = run(layer_db, lambda c: sessions.commit_session(c, "self"))
    assert result.status == "committed"
    assert result.tables["public.staff"] == {"inserted": 1, "updated": 2, "deleted": 0}
    assert rows(layer_db, "SELECT id, boss_id, name FROM public.staff ORDER BY id") == [
        (1, 10, "a"),
        (2, 1, "b"),
        (10, None, "new boss"),
        (20, 10, "c"),
    ]


def test_commit_of_a_key_swap_keeps_grandchildren(layer_db: str) -> None:
    # Keys moving in a cycle (1 -> 99 -> 2, 2 -> 1) cannot move one at a time: the rows at both keys are
    # updated in place, and the children the session re-pointed are applied as their own changes.
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE p (id int PRIMARY KEY, v text)")
        conn.execute(
            "CREATE TABLE k (id int PRIMARY KEY, p_id int REFERENCES p ON DELETE CASCADE ON UPDATE CASCADE)"
        )
        conn.execute("CREATE TABLE g (id int PRIMARY KEY, k_id int REFERENCES k ON DELETE CASCADE)")
        conn.execute("INSERT INTO p VALUES (1, 'one'), (2, 'two')")
        conn.execute("INSERT INTO k VALUES (1, 1), (2, 2)")
        conn.execute("INSERT INTO g VALUES (1, 1), (2, 2)")
    write(
        layer_db,
        "swap",
        "UPDATE p SET id = 99 WHERE id = 1",
        "UPDATE p SET id = 1 WHERE id = 2",
        "UPDATE p SET id = 2 WHERE id = 99",
    )
    result = run(layer_db, lambda c: sessions.commit_session(c, "swap"))
    assert result.tables["public.p"] == {"inserted": 0, "updated": 2, "deleted": 0}
    assert rows(layer_db, "SELECT * FROM p ORDER BY id") == [(1, "two"), (2, "one")]
    assert rows(layer_db, "SELECT * FROM k ORDER BY id") == [(1, 2), (2, 1)]
    assert rows(layer_db, "SELECT * FROM g ORDER BY id") == [(1, 1), (2, 2)]


def test_commit_reuses_unique_values_of_a_delete_held_back(layer_db: str) -> None:
    # The member moves to a team the session inserts, through a NOT NULL reference, so the commit can neither
    # re-point nor null it before the inserts: the delete of team 1 is held back until they ran. A new team
    # reuses team 1's UNIQUE code: it has to wait for that delete too.
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE team (id int PRIMARY KEY, code text NOT NULL UNIQUE)")
        conn.execute("CREATE TABLE member (id int PRIMARY KEY, team_id int NOT NULL REFERENCES team)")
        conn.execute("INSERT INTO team VALUES (1, 'a'), (5, 'e')")
        conn.execute("INSERT INTO member VALUES (1, 1), (2, 5)")
    write(
        layer_db,
        "reuse",
        "INSERT INTO team VALUES (2, 'b')",
        "UPDATE member SET team_id = 2 WHERE id = 1",
        "DELETE FROM team WHERE id = 1",
        "INSERT INTO team VALUES (3, 'a')",
        "UPDATE team SET code = 'x' WHERE id = 5",
        "INSERT INTO member VALUES (3, 3)",
    )
    result = run(layer_db, lambda c: sessions.commit_session(c, "reuse"))
    assert result.status == "committed"
    assert result.tables["public.team"] == {"inserted": 2, "updated": 1, "deleted": 1}
    assert result.tables["public.member"] == {"inserted": 1, "updated": 1, "deleted": 0}
    assert rows(layer_db, "SELECT * FROM team ORDER BY id") == [(2, "b"), (3, "a"), (5, "x")]
    assert rows(layer_db, "SELECT * FROM member ORDER BY id") == [(1, 2), (2, 5), (3, 3)]
