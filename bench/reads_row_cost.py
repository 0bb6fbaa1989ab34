"""The server's CPU per recorded read: what a row of ``cow.reads`` costs PostgreSQL, and what other forms of
the row would (issue 18, "Cost ≤ 5 %": the server runs beside the sessions' backends on the same cores).

    .venv/bin/python bench/reads_row_cost.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--rows 50000] [--trials 4] [--baseline DIR] [--only CASE ...] [--database NAME]

Without --dsn an embedded PostgreSQL is started; the layer is installed in a scratch database (--database).
The writer's COPY (``proxy.reads``: the binary rows the C relay writes, in ~256 KB pieces through asyncpg)
of --rows records of a `pgbench -S`-like session (one text, a CoW table, 4-byte parameters, an operation id
per 1,024 reads), into:

- ``cow.reads``: this checkout's table as the proxy writes it (from layer 57 the rows name their statement,
  sent once into cow.read_statements before the runs; the statement trigger checks the ids and registers
  the session); ``own parts``: the same table with rows that carry their statements (an older proxy's);
- ``base``: with --baseline DIR (a checkout of main with its venv), that checkout's layer in a second
  database, its cow.reads as its proxy writes it (the rows with their statements), measured in the same
  trials;
- layer 55's table rebuilt (``55 copy``: its CHECKs, one index and registration trigger) and variants of it,
  each with one part changed: ``heap`` (no index, CHECK or trigger), ``heap+key``, ``no trigger``, ``no
  checks``, ``trim checks`` (the ids checked by ltrim, no regular expression), ``unlogged`` (no WAL),
  ``+sess idx`` (a non-unique index on session alone, deduplicated, instead of the key), ``slim`` (its
  statement's parts empty); and a table of rows naming their statements by a key (``dict``: with layer 55's
  CHECKs and trigger; ``dict heap+key``; ``dict+trigger``; ``dict unlogged``).

The server's CPU is its backend's (``/proc/PID/stat``: the server must be on this machine; 10 ms ticks), per
row, the least of --trials (interleaved); the proxy's is the writer's thread (``thread_time``) per row.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import _common as common  # first: it takes bench/ off the import path (its proxy.py is not the package)
import asyncpg
import psycopg

from proxy.reads import (
    _COPY_HEADER,
    _COPY_TRAILER,
    COPY_COLUMNS,
    COPY_COLUMNS_STATEMENTS,
    Needed,
    ReadRecord,
    ReadRecorder,
    _Pieces,
    _Shapes,
    encode_rows,
    statement_key,
    with_statements,
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


@dataclass(frozen=True)
class Rows:
    """One set of records as each form of the row: naming their statement (this layer's), carrying it (an
    older proxy's), and that with the statement's parts empty (``slim``)."""

    named: bytes
    own: bytes
    slim: bytes
    statements: Needed
    named_each: bytes  # each read with an operation of its own (no id in force: each its transaction's)
    own_each: bytes


def rows_of(n: int, catalog: Catalog | None) -> Rows:
    """n records as the writer sends them (pgbench -S reads of one session, 1,024 transactions an id)."""
    now = time.time()

    def records(every: int) -> list[ReadRecord]:
        return [
            ReadRecord(
                "db",
                "bench_1",
                f"op{i // every}",
                TEXT,
                (i % 100_000).to_bytes(4, "big"),
                1,
                now,
                40,
                catalog,
            )
            for i in range(n)
        ]

    needed: Needed = {}
    named, named_each = encode_rows(records(1024), _Shapes(), needed), encode_rows(records(1), _Shapes())
    statements = {statement_key(shape): shape for shape in needed.values()}
    own, own_each = with_statements(named, statements), with_statements(named_each, statements)
    assert b"public.pgbench_accounts" in own  # (a CoW table: the layer is installed)
    shape = next(iter(needed.values()))
    full = (
        struct.pack("!h", len(COPY_COLUMNS_STATEMENTS))
        + own[2 : own.index(shape.text.encode()) + len(shape.text.encode())]
    )
    # (the field count; an empty fingerprint; an empty text[]: 12 bytes, no dimension, text's OID; no text)
    empty = struct.pack("!hiiiiii", len(COPY_COLUMNS_STATEMENTS), 0, 12, 0, 0, 25, 0)
    return Rows(named, own, own.replace(full, empty), needed, named_each, own_each)


async def one(
    conn: asyncpg.Connection, pid: int, table: tuple[str, str], data: bytes, columns: tuple[str, ...]
) -> tuple[float, float]:
    """(server CPU seconds, writer CPU seconds) of one COPY."""
    await conn.execute(f"TRUNCATE {table[0]}.{table[1]}")
    await conn.execute("CHECKPOINT")
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
    return backend_cpu(pid) - server0, proxy1 - proxy0


# Layer 55's cow.reads and its trigger's registration, rebuilt (the candidates change one part of it).
TABLE_55 = (
    "CREATE {unlogged}TABLE {t} (seq bigint GENERATED BY DEFAULT AS IDENTITY, session text NOT NULL,"
    " operation text, at timestamptz NOT NULL, fingerprint text NOT NULL, statement text NOT NULL,"
    " identity text, relations text[] NOT NULL DEFAULT '{{}}', rows bigint, duration_us bigint NOT NULL,"
    " params bytea)"
)
REGISTER_55 = """
CREATE OR REPLACE FUNCTION public.bench_register_reads() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    WITH added AS (SELECT DISTINCT session FROM added_reads),
    registered AS (
        INSERT INTO cow.sessions (session_id) SELECT session FROM added ON CONFLICT (session_id) DO NOTHING
    )
    DELETE FROM cow.reads r USING cow.sessions s, added
    WHERE s.session_id = added.session AND s.status <> 'open' AND r.session = s.session_id;
    RETURN NULL;
END $$
"""
TRIGGER = (
    "CREATE TRIGGER reg AFTER INSERT ON {t} REFERENCING NEW TABLE AS added_reads"
    " FOR EACH STATEMENT EXECUTE FUNCTION public.bench_register_reads()"
)
KEY = "ALTER TABLE {t} ADD PRIMARY KEY (session, seq)"
SESSION_INDEX = "CREATE INDEX ON {t} (session)"  # (not unique: its equal keys deduplicated, PostgreSQL 13+)
# The ids' CHECKs as layer 51 has them (a regular expression per value), and a form that accepts the same ids
# without one: ltrim of the allowed characters leaves nothing exactly when every character is one of them.
REGEX_CHECKS = (
    "ALTER TABLE {t} ADD CHECK (session ~ '^[A-Za-z0-9._:-]+$' AND length(session) <= 128)"
    ", ADD CHECK (operation ~ '^[A-Za-z0-9._:-]+$' AND length(operation) <= 128)"
)
_ID_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-"
TRIM_CHECKS = (
    f"ALTER TABLE {{t}} ADD CHECK (length(session) BETWEEN 1 AND 128 AND ltrim(session, '{_ID_CHARS}') = '')"
    f", ADD CHECK (length(operation) BETWEEN 1 AND 128 AND ltrim(operation, '{_ID_CHARS}') = '')"
)
# Rows that name their statement by a key (COPY_COLUMNS), the statement stored once elsewhere.
DICT_TABLE = (
    "CREATE {unlogged}TABLE {t} (seq bigint GENERATED BY DEFAULT AS IDENTITY, session text NOT NULL,"
    " operation text, at timestamptz NOT NULL, statement_key bigint NOT NULL, statement text, params bytea,"
    " rows bigint, duration_us bigint NOT NULL)"
)


@dataclass(frozen=True)
class Case:
    """A table to COPY the rows into: made by ``ddl`` (``{t}`` its name), else cow.reads itself."""

    name: str
    ddl: tuple[str, ...]
    rows: str  # "named", "own", "slim", "named_each" (Rows' fields)


def cases() -> list[Case]:
    logged, unlogged = TABLE_55.replace("{unlogged}", ""), TABLE_55.replace("{unlogged}", "UNLOGGED ")
    dict_logged, dict_unlogged = (
        DICT_TABLE.replace("{unlogged}", ""),
        DICT_TABLE.replace("{unlogged}", "UNLOGGED "),
    )
    return [
        Case("cow.reads", (), "named"),
        Case("own parts", (), "own"),
        Case("op per row", (), "named_each"),
        Case("55 copy", (logged, KEY, REGEX_CHECKS, TRIGGER), "own"),
        Case("slim", (logged, KEY, REGEX_CHECKS, TRIGGER), "slim"),
        Case("heap", (logged,), "own"),
        Case("heap+key", (logged, KEY), "own"),
        Case("no trigger", (logged, KEY, REGEX_CHECKS), "own"),
        Case("no checks", (logged, KEY, TRIGGER), "own"),
        Case("trim checks", (logged, KEY, TRIM_CHECKS, TRIGGER), "own"),
        Case("unlogged", (unlogged, KEY, REGEX_CHECKS, TRIGGER), "own"),
        Case("+sess idx", (logged, SESSION_INDEX, REGEX_CHECKS, TRIGGER), "own"),
        Case("dict", (dict_logged, KEY, REGEX_CHECKS, TRIGGER), "named"),
        Case("dict heap+key", (dict_logged, KEY), "named"),
        Case("dict+trigger", (dict_logged, KEY, TRIGGER), "named"),
        Case("dict unlogged", (dict_unlogged, KEY, REGEX_CHECKS, TRIGGER), "named"),
    ]


async def measure(db_dsn: str, base_dsn: str | None, rows: int, trials: int, only: set[str]) -> None:
    conn = await asyncpg.connect(db_dsn)
    base = await asyncpg.connect(base_dsn) if base_dsn else None
    tables: list[str] = []
    try:
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        # The CoW tables a text names, as the proxy's catalog says.
        catalog = Catalog.from_rows([tuple(row) for row in await conn.fetch(CATALOG_QUERY)])
        data = rows_of(rows, catalog)
        layer_57 = await conn.fetchval("SELECT to_regclass('cow.read_statements') IS NOT NULL")
        if layer_57:
            await ReadRecorder._send_statements(conn, data.statements)  # (once, as the writer does)
        await conn.execute(REGISTER_55)
        runs: dict[str, tuple[asyncpg.Connection, int, tuple[str, str], bytes, tuple[str, ...]]] = {}
        for i, case in enumerate(c for c in cases() if not only or c.name in only):
            if case.rows in ("named", "named_each") and not case.ddl and not layer_57:
                continue
            table = ("cow", "reads")
            if case.ddl:
                table = ("public", f"reads_bench_{i}")
                tables.append(f"public.reads_bench_{i}")
                await conn.execute(f"DROP TABLE IF EXISTS {tables[-1]}")
                for ddl in case.ddl:
                    await conn.execute(ddl.format(t=tables[-1]))
            columns = COPY_COLUMNS if case.rows.startswith("named") else COPY_COLUMNS_STATEMENTS
            runs[case.name] = (conn, pid, table, getattr(data, case.rows), columns)
        if base is not None:
            base_pid = await base.fetchval("SELECT pg_backend_pid()")
            runs["base"] = (base, base_pid, ("cow", "reads"), data.own, COPY_COLUMNS_STATEMENTS)
            runs["base op per row"] = (
                base,
                base_pid,
                ("cow", "reads"),
                data.own_each,
                COPY_COLUMNS_STATEMENTS,
            )
        best: dict[str, tuple[float, float]] = {name: (float("inf"), float("inf")) for name in runs}
        for _ in range(trials):
            for name, (on, backend, table, rows_data, columns) in runs.items():
                server, proxy = await one(on, backend, table, rows_data, columns)
                best[name] = (min(best[name][0], server), min(best[name][1], proxy))
        for name, (_, _, _, rows_data, _) in runs.items():
            server, proxy = best[name]
            print(
                f"{name:15} {len(rows_data) / rows:6.0f} bytes/row  server {server / rows * 1e6:5.2f} µs/row"
                f"  writer {proxy / rows * 1e6:5.2f} µs/row"
            )
        await conn.execute("TRUNCATE cow.reads")
    finally:
        for table in tables:
            await conn.execute(f"DROP TABLE IF EXISTS {table}")
        await conn.execute("DROP FUNCTION IF EXISTS public.bench_register_reads()")
        await conn.close()
        if base is not None:
            await base.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", help="PostgreSQL (superuser, on this machine); default: embedded")
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--database", default=DATABASE, help="the scratch database's name")
    parser.add_argument("--only", action="append", default=[], help="a case's name (repeatable); default all")
    parser.add_argument("--baseline", type=Path, help="a checkout (with .venv) whose layer to measure too")
    args = parser.parse_args()
    with bp.server(args.dsn, None) as (dsn, host, port, bindir, _sockets):
        tool = os.path.join(bindir, "pgbench") if bindir else (shutil.which("pgbench") or "pgbench")
        user = urlsplit(dsn).username or "postgres"
        database = args.database
        db_dsn = bp.layer_database(dsn, tool, host=host, port=port, user=user, database=database, scale=1)
        base_dsn = None
        if args.baseline is not None:
            bp.create_database(
                dsn, tool, host=host, port=port, user=user, database=database + "_base", scale=1
            )
            base_dsn = urlsplit(dsn)._replace(path=f"/{database}_base").geturl()
            python = str(args.baseline.resolve() / ".venv" / "bin" / "python")
            install = [python, "-m", "cowproxy", "install", "--dsn", base_dsn]
            subprocess.run(install, check=True, capture_output=True, cwd=args.baseline)
        try:
            asyncio.run(measure(db_dsn, base_dsn, args.rows, args.trials, set(args.only)))
            print(f"load average {os.getloadavg()[0]:.1f}")
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                for name in (database, database + "_base"):
                    conn.execute(f"DROP DATABASE IF EXISTS {name}")


if __name__ == "__main__":
    main()
