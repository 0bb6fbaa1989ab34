"""Real clients through the proxy get the same results as direct (plain PostgreSQL, no layer)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.fix_db import PgServer
from tests.fix_proxy import RunningProxy

BOTH_RELAYS = True  # untagged traffic: run on the C relay and on the Python relay
pytestmark = pytest.mark.timeout(60)
COPY_OUT = "\\copy (SELECT g FROM generate_series(1,3) g) TO STDOUT"


def test_psycopg_simple_and_extended(proxy: RunningProxy, empty_db: str) -> None:
    with psycopg.connect(proxy.dsn(empty_db), autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t VALUES (%s, %s)", (1, "a"))
        conn.execute("INSERT INTO t VALUES (2, 'b'); INSERT INTO t VALUES (3, 'c')", prepare=False)
        assert conn.execute("SELECT id, v FROM t ORDER BY id").fetchall() == [(1, "a"), (2, "b"), (3, "c")]
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM t", prepare=True)
            cur.execute("SELECT count(*) FROM t", prepare=True)
            assert cur.fetchone() == (3,)
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO t VALUES (1, 'dup')")
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_psycopg_pipeline_copy_cursor_notify(proxy: RunningProxy, empty_db: str) -> None:
    dsn = proxy.dsn(empty_db)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        with conn.pipeline():
            for i in range(50):
                conn.execute("INSERT INTO t VALUES (%s, %s)", (i, f"v{i}"))
            cur = conn.execute("SELECT count(*) FROM t")
        assert cur.fetchone() == (50,)
        # A failing statement in a pipeline: the rest of the batch is skipped, the connection recovers.
        with pytest.raises(psycopg.errors.UniqueViolation), conn.pipeline():
            conn.execute("INSERT INTO t VALUES (%s, 'x')", (1,))
            conn.execute("INSERT INTO t VALUES (%s, 'y')", (1000,))
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (50,)

        with conn.cursor().copy("COPY t (id, v) FROM STDIN") as copy:
            for i in range(100, 1100):
                copy.write_row((i, "copied" * 10))
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (1050,)
        out = bytearray()
        with conn.cursor().copy("COPY (SELECT id, v FROM t ORDER BY id) TO STDOUT") as copy:
            for block in copy:
                out += block
        assert out.count(b"\n") == 1050

    with psycopg.connect(dsn) as conn, conn.cursor(name="server_side") as cur:
        cur.itersize = 100
        cur.execute("SELECT id FROM t ORDER BY id")
        ids = [row[0] for row in cur]
        assert len(ids) == 1050 and ids[:3] == [0, 1, 2]

    with psycopg.connect(dsn, autocommit=True) as listener, psycopg.connect(dsn, autocommit=True) as sender:
        listener.execute("LISTEN chan")
        sender.execute("SELECT pg_notify('chan', 'hello')")
        notices: list[str] = []
        listener.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        listener.execute("DO $$BEGIN RAISE NOTICE 'note'; END$$")
        got = next(listener.notifies(timeout=5))
        assert (got.channel, got.payload) == ("chan", "hello")
        assert notices == ["note"]


def test_psycopg_cancel(proxy: RunningProxy, empty_db: str) -> None:
    import threading

    with psycopg.connect(proxy.dsn(empty_db), autocommit=True) as conn:
        # cancel_safe: the blocking cancel() holds the GIL, which would stall the in-process proxy.
        timer = threading.Timer(0.5, conn.cancel_safe)
        timer.start()
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(20)")
        timer.join()
        assert conn.execute("SELECT 42").fetchone() == (42,)


def test_asyncpg(proxy: RunningProxy, empty_db: str) -> None:
    import asyncio

    import asyncpg

    async def main() -> None:
        conn = await asyncpg.connect(proxy.dsn(empty_db))
        try:
            await conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text, n numeric)")
            stmt = await conn.prepare("INSERT INTO t VALUES ($1, $2, $3)")
            await stmt.fetch(1, "a", 1.5)
            await conn.executemany(
                "INSERT INTO t VALUES ($1, $2, $3)", [(i, f"v{i}", i) for i in range(2, 200)]
            )
            await conn.copy_records_to_table("t", records=[(i, "c", None) for i in range(200, 1200)])
            assert await conn.fetchval("SELECT count(*) FROM t") == 1199
            rows = await conn.fetch("SELECT id, v FROM t WHERE id < $1 ORDER BY id", 3)
            assert [tuple(r) for r in rows] == [(1, "a"), (2, "v2")]
            async with conn.transaction():
                await conn.execute("DELETE FROM t WHERE id >= 200")
            assert await conn.fetchval("SELECT count(*) FROM t") == 199
            with pytest.raises(asyncio.TimeoutError):
                await conn.execute("SELECT pg_sleep(20)", timeout=0.5)
            assert await conn.fetchval("SELECT 7") == 7
        finally:
            await conn.close()

    asyncio.run(asyncio.wait_for(main(), 45))


def test_sqlalchemy_orm(proxy: RunningProxy, empty_db: str) -> None:
    from sqlalchemy import Column, Integer, String, create_engine, select
    from sqlalchemy.orm import DeclarativeBase, Session

    class Base(DeclarativeBase):
        pass

    class Item(Base):
        __tablename__ = "items"
        id = Column(Integer, primary_key=True)
        name = Column(String(50), nullable=False)

    url = proxy.dsn(empty_db).replace("postgresql://", "postgresql+psycopg://")
    engine = create_engine(url)
    try:
        Base.metadata.create_all(engine)
        with Session(engine) as session:
            session.add_all([Item(name="a"), Item(name="b")])
            session.commit()
            names = session.scalars(select(Item.name).order_by(Item.id)).all()
            assert names == ["a", "b"]
            item = session.scalars(select(Item).where(Item.name == "b")).one()
            item.name = "bb"
            session.commit()
        with Session(engine) as session:
            assert session.scalars(select(Item.name).order_by(Item.id)).all() == ["a", "bb"]
    finally:
        engine.dispose()


def test_psql_and_pgbench(proxy: RunningProxy, empty_db: str, pg_server: PgServer, tmp_path: Path) -> None:
    import subprocess

    dsn = proxy.dsn(empty_db)
    psql = pg_server.tool("psql")
    result = subprocess.run(
        [
            psql,
            dsn,
            "-X",
            "-A",
            "-t",
            "-c",
            "SELECT 1+1",
            "-c",
            "\\copy (SELECT g FROM generate_series(1,3) g) TO STDOUT",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["2", "1", "2", "3"]
    # Large objects go through the FunctionCall message (libpq's lo_* functions).
    blob = tmp_path / "blob.bin"
    blob.write_bytes(bytes(range(256)) * 100)
    lo = subprocess.run(
        [
            psql,
            dsn,
            "-X",
            "-A",
            "-t",
            "-c",
            f"\\lo_import {blob}",
            "-c",
            "SELECT sum(length(data)) FROM pg_largeobject",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert lo.returncode == 0, lo.stderr
    assert lo.stdout.split()[-1] == "25600"
    pgbench = pg_server.tool("pgbench")
    init = subprocess.run(
        [pgbench, "-i", "-s", "1", "-q", dsn], capture_output=True, text=True, timeout=60, check=False
    )
    assert init.returncode == 0, init.stderr
    for args in (
        ["-S"],
        [],
        ["-S", "-M", "extended"],
        ["-M", "prepared"],
        ["-S", "-M", "prepared", "-c", "4"],
    ):
        run = subprocess.run(
            [pgbench, "-n", "-t", "50", *args, dsn], capture_output=True, text=True, timeout=60, check=False
        )
        assert run.returncode == 0, (args, run.stderr)
        assert "number of failed transactions: 0" in run.stdout, run.stdout
