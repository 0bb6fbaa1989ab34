"""Layer 57: the proxy's writer stores a run of one session's reads as one row of cow.read_runs; cow.reads is
a view of one row per read over those runs and cow.read_rows (the table cow.reads was). An upgrade from layer
56 keeps the rows recorded before, in their order and before the runs recorded after; a session's reads of
both kinds go with it."""

from __future__ import annotations

import asyncio
import json
import time

import asyncpg
import psycopg
import pytest

from migrations import install_layer
from proxy.reads import (
    _COPY_HEADER,
    _COPY_TRAILER,
    _LAYER_FEATURES,
    COPY_COLUMNS,
    RUN_COLUMNS,
    ReadRecord,
    _run_parts,
    _Shapes,
    encode_rows,
)
from tests.fix_layer import reads_as_layer_56
from tests.layer.test_cli import cli
from tests.layer.test_install import run

OLD_ROW = (
    "INSERT INTO cow.reads (session, operation, at, fingerprint, statement, params, relations, rows,"
    " duration_us) VALUES (%s, 'old', now(), 'fp', %s, NULL, '{public.customers}', 1, 5)"
)


def _runs(dsn: str, records: list[ReadRecord]) -> None:
    """The records as the writer sends them to layer 57: runs, in one binary COPY."""
    data = _COPY_HEADER + b"".join(_run_parts(records, _Shapes())) + _COPY_TRAILER

    async def copy() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.copy_to_table(
                "read_runs", schema_name="cow", columns=RUN_COLUMNS, source=memoryview(data), format="binary"
            )
        finally:
            await conn.close()

    asyncio.run(copy())


def _records(session: str, texts: list[str]) -> list[ReadRecord]:
    now = time.time()
    return [ReadRecord("d", session, "new", t, None, 2, now + i, 3, None) for i, t in enumerate(texts)]


def test_the_upgrade_from_56_keeps_the_rows_before_the_runs_written_after(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        reads_as_layer_56(conn)
        for session, text in (("up1", "SELECT 1"), ("up2", "SELECT 2"), ("up1", "SELECT 3")):
            conn.execute(OLD_ROW, (session, text))
    assert run(layer_db, install_layer).applied == (57,)
    with psycopg.connect(layer_db, autocommit=True) as conn:
        kind = conn.execute("SELECT relkind FROM pg_class WHERE oid = 'cow.reads'::regclass").fetchone()
        assert kind == ("v",)
        assert conn.execute("SELECT count(*) FROM cow.read_rows").fetchone() == (3,)
    _runs(layer_db, _records("up1", ["SELECT 4", "SELECT 5"]))
    with psycopg.connect(layer_db, autocommit=True) as conn:
        conn.execute(OLD_ROW, ("up1", "SELECT 6"))  # (an INSERT into the view: a row, after the run)
        got = conn.execute(
            "SELECT seq, operation, statement, relations, rows FROM cow.reads"
            " WHERE session = 'up1' ORDER BY seq"
        ).fetchall()
    assert [(r[1], r[2]) for r in got] == [
        ("old", "SELECT 1"),
        ("old", "SELECT 3"),
        ("new", "SELECT 4"),
        ("new", "SELECT 5"),
        ("old", "SELECT 6"),
    ]
    assert got[0][3] == ["public.customers"] and got[2][3] == [] and got[2][4] == 2
    assert len({r[0] for r in got}) == 5
    out = cli("session", "reads", "up1", "--format", "json", dsn=layer_db)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["statements"] == 5
    # The session's reads of both kinds go with it; another session's stay.
    assert cli("session", "discard", "up1", dsn=layer_db).returncode == 0
    with psycopg.connect(layer_db, autocommit=True) as conn:
        assert conn.execute("SELECT session FROM cow.reads").fetchall() == [("up2",)]
        assert conn.execute("SELECT count(*) FROM cow.read_runs").fetchone() == (0,)


def test_a_run_registers_its_session_and_one_of_a_closed_session_goes(layer_db: str) -> None:
    _runs(layer_db, _records("rr1", ["SELECT 1"]))
    with psycopg.connect(layer_db, autocommit=True) as conn:
        assert conn.execute("SELECT status FROM cow.sessions WHERE session_id = 'rr1'").fetchone() == (
            "open",
        )
        conn.execute("UPDATE cow.sessions SET status = 'discarded' WHERE session_id = 'rr1'")
    _runs(layer_db, _records("rr1", ["SELECT 2"]))  # (reads that reach the writer after the close)
    with psycopg.connect(layer_db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM cow.read_runs").fetchone() == (0,)


def test_a_run_with_a_bad_session_or_count_is_refused(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        for session, reads in (("bad id", 1), ("ok", 0), ("ok", 65_536)):
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute(
                    "INSERT INTO cow.read_runs (session, reads, data) VALUES (%s, %s, '')", (session, reads)
                )
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
            conn.execute("DELETE FROM cow.reads")  # (a view of two tables: its readers only read)


def test_an_older_proxys_copy_into_the_view_lands_in_the_rows_and_registers(layer_db: str) -> None:
    """A proxy before layer 57 sends its rows alone into cow.reads when the layer has the trigger it looks
    for (cow_reads_register on cow.reads): through the view they land in cow.read_rows, and register."""
    records = _records("old1", ["SELECT 1", "SELECT 2"])
    data = _COPY_HEADER + encode_rows(records, _Shapes()) + _COPY_TRAILER

    async def copy() -> tuple[bool, bool, bool]:
        conn = await asyncpg.connect(layer_db)
        try:
            features = await conn.fetchrow(_LAYER_FEATURES)
            assert features is not None
            await conn.copy_to_table(
                "reads", schema_name="cow", columns=COPY_COLUMNS, source=memoryview(data), format="binary"
            )
            return bool(features[0]), bool(features[1]), bool(features[2])
        finally:
            await conn.close()

    assert asyncio.run(copy()) == (True, True, True)
    with psycopg.connect(layer_db, autocommit=True) as conn:
        got = conn.execute("SELECT statement FROM cow.reads WHERE session = 'old1' ORDER BY seq").fetchall()
        assert got == [("SELECT 1",), ("SELECT 2",)]
        assert conn.execute("SELECT count(*) FROM cow.read_rows").fetchone() == (2,)
        assert conn.execute("SELECT 1 FROM cow.sessions WHERE session_id = 'old1'").fetchone() == (1,)


def test_a_run_is_stored_compressed_by_lz4_or_out_of_line_as_it_is(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        lz4 = conn.execute(
            "SELECT 'lz4' = ANY (enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
        ).fetchone()
        column = conn.execute(
            "SELECT attstorage, attcompression FROM pg_attribute"
            " WHERE attrelid = 'cow.read_runs'::regclass AND attname = 'data'"
        ).fetchone()
    assert column == (("x", "l") if lz4 == (True,) else ("e", ""))
