"""App DDL keeps working on CoW tables, and sessions survive it (the event triggers)."""

from __future__ import annotations

import psycopg
import pytest


def test_add_rename_drop_retype_columns_with_a_pending_session(layer_db: str) -> None:
    with (
        psycopg.connect(layer_db, autocommit=True) as app,
        psycopg.connect(layer_db, autocommit=True) as agent,
    ):
        agent.execute("SELECT cow.use_session('s', 'op')")
        agent.execute("UPDATE customers SET name = 'Ada L.' WHERE id = 1")
        agent.execute("INSERT INTO customers (email, name) VALUES ('n@x', 'N')")
        app.execute("ALTER TABLE customers ADD COLUMN phone text DEFAULT 'none'")
        assert agent.execute("SELECT name, phone FROM customers WHERE id = 1").fetchone() == ("Ada L.", None)
        assert agent.execute(
            "INSERT INTO customers (email, name) VALUES ('p@x', 'P') RETURNING phone"
        ).fetchone() == ("none",)
        app.execute("ALTER TABLE customers RENAME COLUMN name TO full_name")
        assert agent.execute("SELECT full_name FROM customers WHERE id = 1").fetchone() == ("Ada L.",)
        app.execute("ALTER TABLE customers DROP COLUMN score")
        app.execute("ALTER TABLE customers ALTER COLUMN tier TYPE varchar(10)")
        row = agent.execute("SELECT * FROM customers WHERE id = 1").fetchone()
        assert row == (1, "ada@example.com", "Ada L.", "pro", None)
        agent.execute("UPDATE customers SET phone = '555' WHERE id = 2")
        assert app.execute("SELECT count(*) FROM public.customers").fetchone() == (3,)
        assert agent.execute("SELECT count(*) FROM customers").fetchone() == (5,)
        log = agent.execute("SELECT row_data FROM cow.session_changes('s') ORDER BY seq").fetchall()
        assert log[0][0] == {
            "id": 1,
            "email": "ada@example.com",
            "full_name": "Ada L.",
            "tier": "pro",
            "phone": None,
        }


def test_create_and_drop_table_in_an_enabled_schema(layer_db: str) -> None:
    with (
        psycopg.connect(layer_db, autocommit=True) as app,
        psycopg.connect(layer_db, autocommit=True) as agent,
    ):
        app.execute(
            "CREATE TABLE tags (id serial PRIMARY KEY, order_id int REFERENCES orders ON DELETE SET NULL,"
            " t text)"
        )
        assert ("tags",) in app.execute("SELECT table_name FROM cow.tables").fetchall()
        agent.execute("SELECT cow.use_session('s')")
        agent.execute("INSERT INTO tags (order_id, t) VALUES (1, 'x')")
        agent.execute("DELETE FROM orders WHERE id = 1")  # ON DELETE SET NULL within the session
        assert agent.execute("SELECT order_id, t FROM tags").fetchall() == [(None, "x")]
        assert app.execute("SELECT count(*) FROM public.tags").fetchone() == (0,)
        # No primary key, and json has no equality (a keyless row cannot be compared): notice, guard only.
        app.execute("CREATE TABLE loose (v json)")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            agent.execute("INSERT INTO loose VALUES ('1')")
        app.execute("CREATE TABLE events (v int)")  # no primary key: enabled as a keyless table
        agent.execute("INSERT INTO events VALUES (1), (1)")
        assert agent.execute("SELECT v FROM events").fetchall() == [(1,), (1,)]
        assert app.execute("SELECT count(*) FROM public.events").fetchone() == (0,)
        app.execute("DROP TABLE events")  # the session's rows of it go with it
        app.execute("DROP TABLE tags")
        assert ("tags",) not in app.execute("SELECT table_name FROM cow.tables").fetchall()
        changes = app.execute(
            "SELECT count(*) FROM pg_class WHERE relnamespace = 'cow_changes'::regnamespace AND relkind = 'r'"
        ).fetchone()
        assert changes == app.execute("SELECT count(*) FROM cow.tables").fetchone() == (3,)  # and nopk
        assert app.execute("SELECT to_regclass('cow_overlay_public.tags')").fetchone() == (None,)
        assert agent.execute("SELECT count(*) FROM orders").fetchone() == (3,)


def test_rename_table_and_app_view_changes(layer_db: str) -> None:
    with (
        psycopg.connect(layer_db, autocommit=True) as app,
        psycopg.connect(layer_db, autocommit=True) as agent,
    ):
        agent.execute("SELECT cow.use_session('s')")
        agent.execute("UPDATE orders SET qty = 9 WHERE id = 1")
        app.execute("ALTER TABLE orders RENAME TO purchases")
        assert agent.execute("SELECT qty FROM purchases WHERE id = 1").fetchone() == (9,)
        app.execute("CREATE VIEW big AS SELECT id, qty FROM purchases WHERE qty > 5")
        assert agent.execute("SELECT * FROM big").fetchall() == [(1, 9)]
        assert app.execute("SELECT * FROM big").fetchall() == []
        assert agent.execute("SELECT orders FROM order_totals WHERE customer_id = 1").fetchone() == (2,)


def test_migration_inside_a_transaction_rolls_back_cleanly(layer_db: str) -> None:
    with psycopg.connect(layer_db) as app:
        app.execute("ALTER TABLE customers ADD COLUMN x int")
        app.rollback()
    with psycopg.connect(layer_db, autocommit=True) as agent:
        agent.execute("SELECT cow.use_session('s')")
        agent.execute("UPDATE customers SET name = 'z' WHERE id = 3 RETURNING *")
        assert len(agent.execute("SELECT * FROM customers WHERE id = 3").fetchone() or ()) == 5
