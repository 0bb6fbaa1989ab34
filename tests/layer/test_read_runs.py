"""Layer 57: the proxy's writer stores a run of one session's reads as one row of cow.read_runs; cow.reads is
a view of one row per read over those runs and cow.read_rows (the table cow.reads was). An upgrade from layer
56 keeps the rows recorded before, in their order and before the runs recorded after; a session's reads of
both kinds go with it. The C relay's runs are dictionary runs (proxy/reads.py, DICT_RUN): the layer reads
them as it reads the COPY rows of the same reads (an older proxy's runs), and a layer whose reader predates
them gets COPY rows from the writer; ``cowproxy install`` upgrades it to read both."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import asyncpg
import psycopg
import pytest

from migrations import install_layer
from migrations.reads import session_reads
from proxy import fastrelay
from proxy.fastrelay import FastRead
from proxy.reads import (
    _COPY_HEADER,
    _COPY_TRAILER,
    _LAYER_FEATURES,
    COPY_COLUMNS,
    DICT_MARK,
    RUN_COLUMNS,
    ReadRecord,
    ReadRecorder,
    _Rows,
    _run_parts,
    _Shapes,
    encode_rows,
)
from proxy.sql import Catalog, shapes
from scoring.extract import fetch_reads
from tests.fix_layer import apply_old_functions, db_name, files_at, reads_as_layer_56
from tests.layer.test_cli import cli
from tests.layer.test_install import run
from tests.proxy_sql.catalogs import sample_catalog

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
            return bool(features[0]), bool(features[1]), bool(features[2]), bool(features[3])
        finally:
            await conn.close()

    assert asyncio.run(copy()) == (True, True, True, True)
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


# main before the dictionary runs (layer 58): its functions/62_reads.sql reads only runs of COPY rows.
BEFORE_DICT_RUNS = "d36dd5a"
READ_IDS = "readonly:0123456789ab"
_TEXTS = (
    "SELECT abalance FROM pgbench_accounts WHERE aid = $1",
    "SELECT * FROM projects p JOIN issues i ON i.project_id = p.id WHERE p.id = $1",
    "  SELECT 'tab\there', E'\\\\N', 'é' FROM projects  ",
)
_SHAPED = ("SELECT name FROM projects WHERE name = 'x é'", "SELECT name FROM projects WHERE name = ''")
needs_c = pytest.mark.skipif(not fastrelay.AVAILABLE, reason=f"{fastrelay.UNAVAILABLE}")


def _fast_records(now: float) -> list[FastRead]:
    """The C relay's records of a take: each text with and without parameters and rows, transactions that
    wrote (an id) and read-only ones, several reads in one transaction, Queries taken by their shape."""
    records: list[FastRead] = []
    for i in range(24):
        ref = i % len(_TEXTS) if i % 4 else -(i % 2 + 1)
        own = _SHAPED[i % 2].encode() if ref < 0 else None
        params = None if i % 3 == 0 else i.to_bytes(4, "big") * (i % 5)
        records.append(
            (
                ref,
                None if i % 7 == 0 else i * 3,
                now + i,
                10 + i,
                params,
                i // 3,
                2**63 + i if i % 6 == 1 else 0,
                own,
            )
        )
    return records


def _both_kinds(operation: str | None, catalog: Catalog, now: float) -> tuple[bytes, int, list[ReadRecord]]:
    """(the C relay's dictionary run of a take, its reads, the same reads as the Python relay's records): the
    two kinds of runs of the same reads."""
    records = _fast_records(now)
    texts = {ref: (ref, _TEXTS[ref], False) for ref, *_ in records if ref >= 0}
    for ref, *_, own in records:
        if own is not None:
            key = shapes.key(own)
            assert key is not None
            texts[ref] = (ref, shapes.example(key), True)
    encode = ReadRecorder("postgresql://unused@127.0.0.1:1/x").encoder(
        "s", operation, READ_IDS, texts.values(), catalog
    )
    assert fastrelay._fastrelay is not None
    run = fastrelay._fastrelay.encode_run(encode, records)
    assert run.startswith(DICT_MARK)
    python = []
    for ref, rows, ended, us, params, number, xid, own in records:
        op = operation or (f"xact:{xid}" if xid else f"{READ_IDS}.{number}")
        sql = _TEXTS[ref] if own is None else own.decode()
        python.append(ReadRecord("d", "s", op, sql, params, rows, ended, us, catalog))
    return run, len(records), python


def _as_session(records: list[ReadRecord], database: str, session: str) -> list[ReadRecord]:
    return [r._replace(database=database, session=session) for r in records]


def _what_readers_see(dsn: str, session: str) -> tuple[list[Any], Any, Any]:
    """cow.reads' rows (but seq and session), ``cowproxy session reads``' JSON (but seq) and the scorer's
    trace (identities derived) of a session."""

    async def read() -> tuple[list[Any], Any, Any]:
        conn = await asyncpg.connect(dsn)
        try:
            rows = await conn.fetch(
                "SELECT operation, at, fingerprint, statement, identity, relations, rows, duration_us, params"
                " FROM cow.reads WHERE session = $1 ORDER BY seq",
                session,
            )
            listed = (await session_reads(conn, session)).as_json()
            return [tuple(r) for r in rows], listed, await fetch_reads(conn, session)
        finally:
            await conn.close()

    rows, listed, trace = asyncio.run(read())
    listed.pop("session")
    for operation in listed["operations"]:
        for read in operation["reads"]:
            read.pop("seq")
    return rows, listed, trace


def _write(dsn: str, items: list[ReadRecord | _Rows]) -> ReadRecorder:
    """The writer's batch of these items into ``dsn``'s database (the recorder's own path: its layer check,
    its COPY), flushed."""

    async def write() -> ReadRecorder:
        recorder = ReadRecorder(dsn)
        recorder.start()
        for item in items:
            if isinstance(item, _Rows):
                recorder.offer_rows(item.database, item.session, item.data, item.size)
            else:
                recorder.offer(item)
        await recorder.close()
        return recorder

    return asyncio.run(write())


@needs_c
@pytest.mark.parametrize("operation", ["op-7", None])
def test_a_dictionary_run_reads_as_the_copy_rows_of_the_same_reads(
    layer_db: str, operation: str | None
) -> None:
    """The same reads as the C relay's dictionary run (session d1) and as an older run of COPY rows (r1, as
    the Python relay and proxies before the dictionary runs write them): cow.reads' rows, ``cowproxy session
    reads`` and the scorer's trace (its identities) are the same."""
    catalog = sample_catalog()
    run, count, records = _both_kinds(operation, catalog, time.time())
    database = db_name(layer_db)
    recorder = _write(layer_db, [_Rows(database, "d1", run, count), *_as_session(records, database, "r1")])
    assert recorder.recorded == 2 * count and not any(recorder.dropped.values())
    with psycopg.connect(layer_db, autocommit=True) as conn:
        held = conn.execute(
            "SELECT session, reads, substr(data, 1, 2) FROM cow.read_runs ORDER BY seq"
        ).fetchall()
    assert held == [("d1", count, DICT_MARK), ("r1", count, b"\x00\x09")]
    dict_side, rows_side = _what_readers_see(layer_db, "d1"), _what_readers_see(layer_db, "r1")
    assert dict_side == rows_side
    rows = dict_side[0]
    assert len(rows) == count and {r[6] for r in rows} >= {None, 3} and {r[8] for r in rows} >= {None, b""}
    assert rows[0][3] == "SELECT name FROM projects WHERE name = 'x é'"  # (a Query taken by its shape)
    assert any(r[5] == ["public.projects", "public.issues"] for r in rows)
    if operation is None:
        assert {r[0] for r in rows} >= {f"{READ_IDS}.0", f"xact:{2**63 + 1}"}


@needs_c
def test_a_layer_before_dictionary_runs_gets_copy_rows_and_the_upgrade_reads_both(layer_db: str) -> None:
    """A new proxy on a layer whose cow._run_reads predates the dictionary runs (main's functions/62_reads.sql
    at BEFORE_DICT_RUNS) writes what that layer reads: the C relay's run decoded into COPY rows. ``cowproxy
    install`` then upgrades the reader: the runs written before and the dictionary runs written after read
    as the same reads."""
    old = [
        sql for name, sql in files_at(BEFORE_DICT_RUNS, "migrations/sql/functions") if name == "62_reads.sql"
    ]
    with psycopg.connect(layer_db, autocommit=True) as conn:
        apply_old_functions(conn, old, "layer 58", "DROP FUNCTION cow._dict_run_reads(bytea)")
    dict_run, count, records = _both_kinds(None, sample_catalog(), time.time())
    database = db_name(layer_db)
    _write(layer_db, [_Rows(database, "o1", dict_run, count), *_as_session(records, database, "o2")])
    with psycopg.connect(layer_db, autocommit=True) as conn:
        kinds = conn.execute("SELECT substr(data, 1, 2) FROM cow.read_runs").fetchall()
    assert kinds == [(b"\x00\x09",), (b"\x00\x09",)]
    before = _what_readers_see(layer_db, "o1")
    assert before == _what_readers_see(layer_db, "o2") and len(before[0]) == count
    assert "62_reads.sql" in run(layer_db, install_layer).reapplied
    _write(layer_db, [_Rows(database, "o3", dict_run, count)])
    with psycopg.connect(layer_db, autocommit=True) as conn:
        kinds = conn.execute("SELECT substr(data, 1, 2) FROM cow.read_runs WHERE session = 'o3'").fetchall()
    assert kinds == [(DICT_MARK,)]
    assert _what_readers_see(layer_db, "o1") == before == _what_readers_see(layer_db, "o3")
