"""The server's CPU per recorded read: what a row of ``cow.reads`` costs PostgreSQL, and what a smaller one
would (issue 18, "Cost ≤ 5 %": the server runs beside the sessions' backends on the same cores).

    .venv/bin/python bench/reads_row_cost.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--rows 50000] [--trials 4] [--database NAME] [--only CASE,CASE...]

Without --dsn an embedded PostgreSQL is started; the layer is installed in a scratch database. The writer's
COPY (``proxy.reads``: the binary rows the C relay writes, in ~256 KB pieces through asyncpg) of --rows
records of a `pgbench -S`-like session (one text, a CoW table, 4-byte parameters, an operation id), into:

- ``cow.reads``: the table as the proxy writes it (its CHECKs, two indexes, the registration trigger);
- ``slim``: the same rows with the parts every read of one statement repeats (fingerprint, text, tables:
  ~90 of the row's bytes here, more for longer texts) left empty: the most a per-statement table (rows
  naming their statement by a number) could save the server per row, before the join such a table needs;
- ``bare``: a copy of the table without the trigger, CHECKs and the session index (the heap and its
  primary key alone), and ``+index``, ``+checks``, ``+trigger``: the copy with each of them alone;
  ``+index C``: the session index under the "C" collation (byte order: no strcoll per comparison);
  ``heap``: no index at all; ``one index``: the primary key (session, seq) and no other index.

The server's CPU is its backend's (``/proc/PID/stat``: the server must be on this machine), per row, the
least of --trials (interleaved); the proxy's is the writer's thread (``thread_time``) per row. On a layer
from 57 on, the rows' table is ``cow.read_rows`` and the same reads are also written as runs into
``cow.read_runs`` (``runs 1024``: a C relay's take a row; ``runs 64``), and into copies of it storing a run
compressed (``runs pglz``, ``runs lz4``) or inline (``runs main``): µs per read, not per row, there. With
the C extension built, ``dict 1024``: the same reads as the C relay now writes its takes (dictionary runs:
each distinct statement once, a small entry per read; proxy/reads.py, DICT_RUN) into cow.read_runs. Besides
the CPU: the WAL the COPY wrote (``pg_current_wal_lsn``) and the table's size after it (TOAST and indexes
included), per read, of the same trial, and for the cases written into cow.read_runs the server's CPU to read
them back through the view cow.reads (``readers``: the unpacking). ``--only`` measures the named cases
alone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import struct
import time
from pathlib import Path
from urllib.parse import urlsplit

import _common as common  # first: it takes bench/ off the import path (its proxy.py is not the package)
import asyncpg
import psycopg

from proxy import fastrelay
from proxy.reads import (
    _COPY_HEADER,
    _COPY_TRAILER,
    COPY_COLUMNS,
    RUN_COLUMNS,
    ReadRecord,
    ReadRecorder,
    _Pieces,
    _Rows,
    _run_parts,
    _Shapes,
    encode_rows,
)
from proxy.sql import Catalog
from proxy.sql.catalog import CATALOG_QUERY

bp = common.sibling("proxy")
DATABASE = "cowproxy_bench_reads_row_cost"
TEXT = "SELECT abalance FROM pgbench_accounts WHERE aid = $1;"
_TICK = os.sysconf("SC_CLK_TCK")


def backend_cpu(pid: int) -> float:
    """A backend's user and system CPU seconds so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _times(now: float, i: int) -> tuple[float, int]:
    """The i-th read's end and duration in µs: ~25,000 reads a second of 20-56 µs each, as at -S."""
    return now + i * 4e-5, 20 + i % 37


def _bench_records(n: int, catalog: Catalog | None) -> list[ReadRecord]:
    """n pgbench -S reads of one session, 1,024 transactions an operation id."""
    now = time.time()
    return [
        ReadRecord(
            "db",
            "bench_1",
            f"op{i // 1024}",
            TEXT,
            (i % 100_000).to_bytes(4, "big"),
            1,
            *_times(now, i),
            catalog,
        )
        for i in range(n)
    ]


def rows_of(n: int, catalog: Catalog | None, *, slim: bool) -> bytes:
    """n COPY rows as the writer sends them (``_bench_records``)."""
    data = encode_rows(_bench_records(n, catalog), _Shapes())
    assert b"public.pgbench_accounts" in data  # (a CoW table: the layer is installed)
    if not slim:
        return data
    shapes = _Shapes()
    full = shapes.copy(TEXT, catalog).head
    # (the field count; an empty fingerprint; an empty text[]: 12 bytes, no dimension, text's OID; no text)
    empty = struct.pack("!hiiiiii", len(COPY_COLUMNS), 0, 12, 0, 0, 25, 0)
    return data.replace(full, empty)


def runs_of(n: int, catalog: Catalog | None, size: int) -> bytes:
    """The same n reads as rows of cow.read_runs (layer 57), runs of ``size`` (a C relay's take: ~1,024)."""
    shapes = _Shapes()
    records = _bench_records(n, catalog)
    takes = [records[i : i + size] for i in range(0, n, size)]
    items = [_Rows("db", "bench_1", encode_rows(take, shapes), len(take)) for take in takes]
    return b"".join(_run_parts(items, shapes))


def dict_runs_of(n: int, catalog: Catalog | None, size: int) -> bytes | None:
    """The same n reads as the C relay writes its takes of ``size`` (dictionary runs), None without the C
    extension."""
    if fastrelay._fastrelay is None:
        return None
    now = time.time()
    recorder, shapes = ReadRecorder("postgresql://unused@127.0.0.1:1/x"), _Shapes()
    items = []
    for start in range(0, n, size):
        take = [
            (0, 1, *_times(now, i), (i % 100_000).to_bytes(4, "big"), 0, 0, None)
            for i in range(start, min(n, start + size))
        ]
        encode = recorder.encoder("bench_1", f"op{start // 1024}", "readonly:0", [(0, TEXT, False)], catalog)
        items.append(_Rows("db", "bench_1", fastrelay._fastrelay.encode_run(encode, take), len(take)))
    return b"".join(_run_parts(items, shapes))


async def one(
    conn: asyncpg.Connection,
    pid: int,
    table: tuple[str, str],
    data: bytes,
    columns: tuple[str, ...] = COPY_COLUMNS,
) -> tuple[float, float, int, int, float]:
    """(server CPU seconds, writer CPU seconds, WAL bytes, the table's bytes after) of one COPY, and the
    server's CPU seconds to read the reads back through cow.reads (the readers' unpacking) when they went
    into cow.read_runs (else 0)."""
    await conn.execute(f"TRUNCATE {table[0]}.{table[1]}")
    await conn.execute("CHECKPOINT")
    wal0 = await conn.fetchval("SELECT pg_current_wal_insert_lsn()::text")
    server0, proxy0 = backend_cpu(pid), time.thread_time()
    parts = [data[i : i + 200 * 1024] for i in range(0, len(data), 200 * 1024)]
    await conn.copy_to_table(
        table[1],
        schema_name=table[0],
        columns=columns,
        source=_Pieces((_COPY_HEADER, *parts, _COPY_TRAILER)),
        format="binary",
    )
    proxy1 = time.thread_time()
    await conn.execute("SELECT 1")  # (the backend's accounting after the COPY's end)
    server = backend_cpu(pid) - server0
    wal = await conn.fetchval("SELECT pg_current_wal_insert_lsn() - $1::text::pg_lsn", wal0)
    size = await conn.fetchval("SELECT pg_total_relation_size($1::regclass)", f"{table[0]}.{table[1]}")
    readers = 0.0
    if table == ("cow", "read_runs"):
        readers0 = backend_cpu(pid)
        await conn.fetchval("SELECT count(*) FROM cow.reads WHERE session = 'bench_1'")
        await conn.execute("SELECT 1")
        readers = backend_cpu(pid) - readers0
    return server, proxy1 - proxy0, int(wal), int(size), readers


Case = tuple[tuple[str, str], bytes, tuple[str, ...]]


async def run_cases(conn: asyncpg.Connection, rows: int, catalog: Catalog) -> dict[str, Case]:
    """Layer 57's cow.read_runs (and copies of it with other storage), and the dictionary runs."""
    cases: dict[str, Case] = {}
    # Layer 57's runs of a C relay's take (1,024 reads) and of 64; and the run's bytes stored
    # compressed (pglz, lz4 where the server has it) or inline instead of out of line uncompressed.
    cases["runs 1024"] = (("cow", "read_runs"), runs_of(rows, catalog, 1024), RUN_COLUMNS)
    cases["runs 64"] = (("cow", "read_runs"), runs_of(rows, catalog, 64), RUN_COLUMNS)
    storages = {
        "pglz": "SET STORAGE EXTENDED, ALTER data SET COMPRESSION pglz",
        "lz4": "SET STORAGE EXTENDED, ALTER data SET COMPRESSION lz4",
        "main": "SET STORAGE MAIN",
    }
    for name, storage in storages.items():
        table = f"public.runs_bench_{name}"
        await conn.execute(f"DROP TABLE IF EXISTS {table}")
        await conn.execute(f"CREATE TABLE {table} (LIKE cow.read_runs INCLUDING ALL)")
        try:
            await conn.execute(f"ALTER TABLE {table} ALTER data {storage}")
        except asyncpg.PostgresError:  # (a server built without lz4)
            await conn.execute(f"DROP TABLE {table}")
            continue
        cases[f"runs {name}"] = (("public", table[7:]), cases["runs 1024"][1], RUN_COLUMNS)
    dict_runs = dict_runs_of(rows, catalog, 1024)
    if dict_runs is not None:
        cases["dict 1024"] = (("cow", "read_runs"), dict_runs, RUN_COLUMNS)
    return cases


async def measure(db_dsn: str, rows: int, trials: int, only: set[str]) -> None:
    conn = await asyncpg.connect(db_dsn)
    try:
        # Copies of cow.reads with each of its per-row costs alone: the heap and primary key, then each of
        # the session index, the CHECKs and the registration trigger on top.
        # (from layer 57 the rows' table is cow.read_rows; cow.reads a view over it and cow.read_runs)
        runs = bool(await conn.fetchval("SELECT to_regclass('cow.read_runs') IS NOT NULL"))
        rows_table = "read_rows" if runs else "reads"
        bare = f"(LIKE cow.{rows_table} INCLUDING DEFAULTS INCLUDING IDENTITY)"
        extras: dict[str, str] = {
            "bare": "",
            "+index": "CREATE INDEX ON {t} (session, seq)",
            "+index C": 'CREATE INDEX ON {t} (session COLLATE "C", seq)',
            "+checks": "ALTER TABLE {t} ADD CHECK (session ~ '^[A-Za-z0-9._:-]+$' AND length(session) <= 128)"
            ", ADD CHECK (operation ~ '^[A-Za-z0-9._:-]+$' AND length(operation) <= 128)",
            "+trigger": "CREATE TRIGGER reg AFTER INSERT ON {t} REFERENCING NEW TABLE AS added_reads"
            " FOR EACH STATEMENT EXECUTE FUNCTION cow._register_reads()",
        }
        # And the one index that could serve both (the readers ask by session, in seq order; seq is unique
        # by itself as an identity): the primary key (session, seq), no other index.
        keys = {name: "seq" for name in extras}
        extras["heap"] = ""
        keys["heap"] = ""
        extras["one index"] = ""
        keys["one index"] = "session, seq"
        for i, (name, extra) in enumerate(extras.items()):
            table = f"public.reads_bench_{i}"
            await conn.execute(f"DROP TABLE IF EXISTS {table}")
            await conn.execute(f"CREATE TABLE {table} {bare}")
            if keys[name]:
                await conn.execute(f"ALTER TABLE {table} ADD PRIMARY KEY ({keys[name]})")
            if extra:
                await conn.execute(extra.format(t=table))
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        # The CoW tables a text names, as the proxy's catalog says.
        catalog = Catalog.from_rows([tuple(row) for row in await conn.fetch(CATALOG_QUERY)])
        full, slim = rows_of(rows, catalog, slim=False), rows_of(rows, catalog, slim=True)
        cases = {
            f"cow.{rows_table}": (("cow", rows_table), full, COPY_COLUMNS),
            "slim": (("cow", rows_table), slim, COPY_COLUMNS),
            **{name: (("public", f"reads_bench_{i}"), full, COPY_COLUMNS) for i, name in enumerate(extras)},
        }
        if runs:
            cases.update(await run_cases(conn, rows, catalog))
        if only:
            cases = {name: case for name, case in cases.items() if name in only}
        inf = float("inf")
        best: dict[str, tuple[float, float, int, int, float]] = {
            name: (inf, inf, 0, 0, inf) for name in cases
        }
        for _ in range(trials):
            for name, (target, data, columns) in cases.items():
                server, proxy, wal, size, readers = await one(conn, pid, target, data, columns)
                old = best[name]
                best[name] = (min(old[0], server), min(old[1], proxy), wal, size, min(old[4], readers))
        for name, (_, data, _) in cases.items():
            server, proxy, wal, size, readers = best[name]
            print(
                f"{name:10} {len(data) / rows:6.0f} bytes/row  server {server / rows * 1e6:5.2f} µs/row"
                f"  writer {proxy / rows * 1e6:5.2f} µs/row  WAL {wal / rows:6.1f} B/row"
                f"  stored {size / rows:6.1f} B/row  readers {readers / rows * 1e6:5.2f} µs/row"
            )
        for i in range(len(extras)):
            await conn.execute(f"DROP TABLE public.reads_bench_{i}")
        await conn.execute(
            "DROP TABLE IF EXISTS public.runs_bench_pglz, public.runs_bench_lz4, public.runs_bench_main"
        )
        await conn.execute(f"TRUNCATE cow.{rows_table}")
    finally:
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", help="PostgreSQL (superuser, on this machine); default: embedded")
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--database", default=DATABASE, help="the scratch database's name")
    parser.add_argument("--only", default="", help="measure only these cases (comma-separated names)")
    args = parser.parse_args()
    with bp.server(args.dsn, None) as (dsn, host, port, bindir, _sockets):
        tool = os.path.join(bindir, "pgbench") if bindir else (shutil.which("pgbench") or "pgbench")
        user = urlsplit(dsn).username or "postgres"
        database = args.database
        db_dsn = bp.layer_database(dsn, tool, host=host, port=port, user=user, database=database, scale=1)
        only = {name.strip() for name in args.only.split(",") if name.strip()}
        asyncio.run(measure(db_dsn, args.rows, args.trials, only))
        print(f"load average {os.getloadavg()[0]:.1f}")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database}")


if __name__ == "__main__":
    main()
