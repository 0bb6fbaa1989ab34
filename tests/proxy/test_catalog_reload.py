"""A tagged connection's CoW catalog follows app DDL done on another connection.

Each tagged connection reads the catalog when it first joins a session. Without a reload, a table the
layer enabled afterwards gets none of the rewrites (TRUNCATE, ON CONFLICT and COPY TO fail on the overlay
view), a new column is unknown to the upsert rewrite, a dropped table is still rewritten (the error names
its overlay view), and TRUNCATE of a table that became copy-on-write fails on its new view. Statements
whose rewrite depends on the catalog check its version first; ordinary statements do not.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from proxy.sql import CATALOG_QUERY, Catalog
from tests.fix_proxy import RunningProxy

pytestmark = pytest.mark.timeout(60)


def tagged(proxy: RunningProxy, layer_db: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(proxy.dsn(layer_db, options="-c%20cow.session_id%3Dreload"), autocommit=True)
    # Joins the session and reads the catalog, before the DDL below.
    assert conn.execute("SELECT count(*) FROM customers").fetchone() == (3,)
    return conn


def relay_counters(proxy: RunningProxy) -> list[tuple[int, int]]:
    return proxy.run(
        lambda: [
            (c.relay.gate.checks, c.relay.gate.loads)
            for c in proxy.server.connections.values()
            if c.relay is not None
        ]
    )


def copy_out(conn: psycopg.Connection[Any], sql: str) -> list[str]:
    out = bytearray()
    with conn.cursor().copy(sql) as copy:
        for block in copy:
            out += block
    return sorted(out.decode().splitlines())


def test_a_table_created_later_gets_its_rewrites(proxy: RunningProxy, layer_db: str) -> None:
    with tagged(proxy, layer_db) as conn, psycopg.connect(layer_db, autocommit=True) as direct:
        direct.execute("CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, n int DEFAULT 0)")
        direct.execute("INSERT INTO items VALUES (1, 'a', 1), (2, 'b', 2)")
        cur = conn.execute(
            "INSERT INTO items (id, name) VALUES (2, 'B'), (3, 'c') ON CONFLICT (id) "
            "DO UPDATE SET name = EXCLUDED.name RETURNING id, name"
        )
        assert (cur.fetchall(), cur.statusmessage) == ([(2, "B"), (3, "c")], "INSERT 0 2")
        assert copy_out(conn, "COPY items TO STDOUT") == ["1\ta\t1", "2\tB\t2", "3\tc\t0"]
        cur = conn.execute("TRUNCATE items")
        assert cur.statusmessage == "TRUNCATE TABLE"
        assert conn.execute("SELECT count(*) FROM items").fetchone() == (0,)
        # Only the session saw any of it.
        assert direct.execute("SELECT id, name FROM items ORDER BY id").fetchall() == [(1, "a"), (2, "b")]


def test_a_column_added_later_is_known(proxy: RunningProxy, layer_db: str) -> None:
    with tagged(proxy, layer_db) as conn, psycopg.connect(layer_db, autocommit=True) as direct:
        direct.execute("ALTER TABLE customers ADD COLUMN nickname text")
        cur = conn.execute(
            "INSERT INTO customers (id, email, name, nickname) VALUES (1, 'ada@example.com', 'Ada', 'A') "
            "ON CONFLICT (id) DO UPDATE SET nickname = EXCLUDED.nickname RETURNING *"
        )
        assert cur.fetchall() == [(1, "ada@example.com", "Ada", "pro", 0, "A")]
        assert copy_out(conn, "COPY customers TO STDOUT")[0] == "1\tada@example.com\tAda\tpro\t0\tA"
        assert direct.execute("SELECT nickname FROM customers WHERE id = 1").fetchone() == (None,)


def test_a_table_dropped_later_is_not_rewritten(proxy: RunningProxy, layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as direct:
        direct.execute("CREATE TABLE doomed (id int PRIMARY KEY)")
    with tagged(proxy, layer_db) as conn, psycopg.connect(layer_db, autocommit=True) as direct:
        direct.execute("DROP TABLE doomed")
        # As on a plain database: the table's name in the message, not its former overlay view's.
        with pytest.raises(psycopg.errors.UndefinedTable, match=r'^relation "doomed" does not exist'):
            conn.execute("TRUNCATE doomed")


def test_a_table_enabled_later_is_truncated_in_the_session(proxy: RunningProxy, layer_db: str) -> None:
    # docs is left plain by the layer (no primary key, and json has no equality: not even keyless) until it
    # gets a primary key.
    with psycopg.connect(layer_db, autocommit=True) as direct:
        direct.execute("CREATE TABLE docs (x int, body json); INSERT INTO docs VALUES (1, '{}')")
    with tagged(proxy, layer_db) as conn, psycopg.connect(layer_db, autocommit=True) as direct:
        direct.execute("ALTER TABLE docs ADD PRIMARY KEY (x)")
        assert conn.execute("TRUNCATE docs").statusmessage == "TRUNCATE TABLE"
        assert conn.execute("SELECT count(*) FROM docs").fetchone() == (0,)
        assert direct.execute("SELECT count(*) FROM docs").fetchone() == (1,)


def test_only_catalog_dependent_statements_check_the_version(proxy: RunningProxy, layer_db: str) -> None:
    with tagged(proxy, layer_db) as conn:
        assert relay_counters(proxy) == [(0, 1)]
        # Ordinary statements, simple and extended, qualified or not: no check, no extra round trip.
        conn.execute("INSERT INTO customers (email, name) VALUES (%s, %s)", ("dee@example.com", "Dee"))
        conn.execute("UPDATE customers SET score = score + 1 WHERE email = 'dee@example.com'")
        conn.execute("DELETE FROM orders WHERE id = %s", (4,))
        conn.execute("SELECT o.id FROM public.orders o JOIN customers c ON c.id = o.customer_id").fetchall()
        assert relay_counters(proxy) == [(0, 1)]
        # A statement whose rewrite depends on the catalog checks its version; unchanged: no reload.
        conn.execute("INSERT INTO customers (id, email, name) VALUES (9, 'e@x', 'E') ON CONFLICT DO NOTHING")
        conn.execute("TRUNCATE orders")
        assert relay_counters(proxy) == [(2, 1)]
        # A qualified name in an app schema that the catalog does not know: checked too.
        with psycopg.connect(layer_db, autocommit=True) as direct:
            direct.execute("CREATE TABLE later (id int PRIMARY KEY)")
            direct.execute("INSERT INTO later VALUES (1)")
        conn.execute("INSERT INTO public.later VALUES (2)")
        assert relay_counters(proxy) == [(3, 2)]
        assert conn.execute("SELECT id FROM public.later ORDER BY id").fetchall() == [(1,), (2,)]
        assert relay_counters(proxy) == [(3, 2)]  # known now


def test_extended_protocol_and_transaction_blocks(proxy: RunningProxy, layer_db: str) -> None:
    with tagged(proxy, layer_db) as conn, psycopg.connect(layer_db, autocommit=True) as direct:
        direct.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        with conn.transaction():
            conn.execute("SELECT 1")
            cur = conn.execute(
                "INSERT INTO items VALUES (%s, %s) ON CONFLICT (id) DO NOTHING RETURNING id", (1, "x")
            )
            assert cur.fetchall() == [(1,)]
            cur = conn.execute(
                "INSERT INTO items VALUES (%s, %s) ON CONFLICT (id) DO NOTHING RETURNING id", (1, "y")
            )
            assert cur.fetchall() == []
        direct.execute("ALTER TABLE items ADD COLUMN tag text DEFAULT 't'")
        with conn.pipeline():
            conn.execute("SELECT 1")  # the check then joins an unfinished batch (Flush, not Sync)
            conn.execute("INSERT INTO items VALUES (%s, 'p', 'q') ON CONFLICT (id) DO NOTHING", (2,))
            cur = conn.execute("SELECT count(*), min(tag) FROM items")
        assert cur.fetchone() == (2, "q")
        assert direct.execute("SELECT count(*) FROM items").fetchone() == (0,)


def test_connections_of_one_database_share_its_catalog(proxy: RunningProxy, layer_db: str) -> None:
    # The first connection reads the catalog; the next ones read only its version and take the same object
    # (so the analysis cache, keyed by the catalog, is shared too). After app DDL the first connection that
    # checks reads it again; the others find that reading at the new version.
    with tagged(proxy, layer_db) as one, tagged(proxy, layer_db) as two, tagged(proxy, layer_db) as three:
        assert sorted(relay_counters(proxy)) == [(0, 0), (0, 0), (0, 1)]
        assert len(proxy.run(lambda: {id(c.relay.catalog) for c in proxy.server.connections.values()})) == 1
        with psycopg.connect(layer_db, autocommit=True) as direct:
            direct.execute("CREATE TABLE later (id int PRIMARY KEY)")
            direct.execute("INSERT INTO later VALUES (1)")
        for conn in (one, two, three):
            conn.execute("INSERT INTO later VALUES (2) ON CONFLICT DO NOTHING")
            assert conn.execute("SELECT id FROM later ORDER BY id").fetchall() == [(1,), (2,)]
        assert sorted(relay_counters(proxy)) == [(1, 0), (1, 0), (1, 2)]  # the first read both
        assert proxy.run(lambda: (proxy.server.catalogs.loads, proxy.server.catalogs.hits)) == (2, 4)
        assert direct_count(layer_db) == 1


def direct_count(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as direct:
        row = direct.execute("SELECT count(*) FROM later").fetchone()
        assert row is not None
        return int(row[0])


def test_a_reload_reads_only_the_tables_that_changed(proxy: RunningProxy, layer_db: str) -> None:
    """After one table's DDL the reload takes the other tables as they were read (the same objects) and
    reads the changed table's document and a new table's; every reload equals a full read."""

    def catalog() -> Any:
        return proxy.run(lambda: next(c.relay.catalog for c in proxy.server.connections.values() if c.relay))

    with psycopg.connect(layer_db, autocommit=True) as direct:
        direct.execute("CREATE TABLE doomed (id int PRIMARY KEY); CREATE TABLE aside (id int PRIMARY KEY)")
    with tagged(proxy, layer_db) as conn, psycopg.connect(layer_db, autocommit=True) as direct:
        before = catalog().tables
        assert {("public", "customers"), ("public", "aside"), ("public", "doomed")} <= set(before)
        direct.execute("ALTER TABLE customers ADD COLUMN nickname text")
        direct.execute("CREATE TABLE later (id int PRIMARY KEY)")
        conn.execute("TRUNCATE orders")  # checks the version: changed, so it reloads
        after = catalog().tables
        assert relay_counters(proxy) == [(1, 2)]
        assert after[("public", "aside")] is before[("public", "aside")]
        assert after[("public", "customers")] is not before[("public", "customers")]
        assert after[("public", "customers")].column("nickname") is not None
        assert dict(after) == full_read(direct)
        direct.execute("DROP TABLE doomed")
        conn.execute("TRUNCATE orders")
        assert ("public", "doomed") not in catalog().tables
        assert dict(catalog().tables) == full_read(direct)


def full_read(conn: psycopg.Connection[Any]) -> dict[tuple[str, str], Any]:
    return dict(Catalog.from_rows(conn.execute(CATALOG_QUERY).fetchall()).tables)
