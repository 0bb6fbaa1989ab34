"""Reading sessions from a database with the CoW layer installed (docs/interfaces.md), through asyncpg.

- writes: ``cow.session_changes(session)``; whether a row existed before the session is looked up in the
  app's own table (the base rows);
- metadata: column types, primary keys and foreign keys of the tables in ``cow.tables``, from pg_catalog;
- reads: ``cow.reads`` (the proxy's read traces, migration 50), empty for a session without a trace.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from cowproxy.read_identity import params_column, row_identity

from .errors import ScoringError
from .model import (
    ARRAY,
    BOOL,
    ENUM,
    JSON,
    NUMERIC,
    OTHER,
    TEXT,
    TIMESTAMP,
    UUID,
    ColumnMeta,
    ForeignKey,
    Metadata,
    TableMeta,
    Write,
    loads,
)
from .reads import TraceRead


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    kind: str | None
    label: str | None
    model: str | None
    gt_session: str | None
    status: str | None
    completed: bool | None = None  # cow.sessions.metadata.completed, when the harness records it

    def as_info(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "label": self.label,
            "model": self.model,
            "status": self.status,
            "completed": self.completed,
        }


def quote_ident(name: str) -> str:
    """An SQL identifier from the catalog, quoted (never a value from the user)."""
    return '"' + name.replace('"', '""') + '"'


def qualified(schema: str, table: str) -> str:
    return f"{schema}.{table}"


async def check_layer(conn: asyncpg.Connection) -> None:
    found = await conn.fetchval(
        "SELECT to_regclass('cow.sessions') IS NOT NULL AND to_regclass('cow.tables') IS NOT NULL"
    )
    if not found:
        raise ScoringError("the CoW layer is not installed in this database (run `cowproxy install`)")


_INFO = (
    "SELECT session_id, kind, label, model, gt_session, status, "
    "CASE jsonb_typeof(metadata->'completed') WHEN 'boolean' THEN (metadata->>'completed')::boolean END "
    "AS completed FROM cow.sessions WHERE session_id = ANY($1::text[])"
)


async def session_info(conn: asyncpg.Connection, session: str) -> SessionInfo:
    return (await session_infos(conn, [session]))[0]


async def session_infos(conn: asyncpg.Connection, sessions: Sequence[str]) -> list[SessionInfo]:
    """The registry entries of ``sessions``, in order, in one query (the first unknown one is an error)."""
    found = {r["session_id"]: r for r in await conn.fetch(_INFO, list(sessions))}
    out = []
    for session in sessions:
        row = found.get(session)
        if row is None:
            raise ScoringError(f"unknown session {session!r}")
        out.append(
            SessionInfo(
                row["session_id"],
                row["kind"],
                row["label"],
                row["model"],
                row["gt_session"],
                row["status"],
                row["completed"],
            )
        )
    return out


_READS = (
    "SELECT operation, fingerprint, identity, statement, {params}, relations, rows"
    " FROM cow.reads WHERE session = $1 ORDER BY seq"
)


async def fetch_reads(conn: asyncpg.Connection, session: str) -> tuple[TraceRead, ...]:
    """A session's read trace in order; empty when it has none (or the layer predates read traces)."""
    params = await params_column(conn)
    if params is None:
        return ()
    query = _READS.format(params=params)
    return tuple(
        TraceRead(
            r["operation"],
            r["fingerprint"],
            row_identity(r["identity"], r["statement"], r["params"]),
            tuple(r["relations"]),
            r["rows"],
        )
        for r in await conn.fetch(query, session)
    )


async def agent_sessions(conn: asyncpg.Connection) -> list[tuple[tuple[str, ...], str]]:
    """(ground truths, agent) for every agent session that names the ground truth it answers. The ground
    truths are that session first, then the other open ground-truth sessions with the same label (the
    alternative valid end states of one task)."""
    rows = await conn.fetch(
        """
        SELECT a.session_id, a.gt_session,
               ARRAY(SELECT o.session_id FROM cow.sessions o
                     WHERE o.kind = 'ground_truth' AND o.status = 'open' AND g.label IS NOT NULL
                       AND o.label = g.label AND o.session_id <> a.gt_session
                     ORDER BY o.created_at, o.session_id) AS others
        FROM cow.sessions a LEFT JOIN cow.sessions g ON g.session_id = a.gt_session
        WHERE a.kind = 'agent' AND a.gt_session IS NOT NULL
        ORDER BY a.gt_session, a.created_at, a.session_id
        """
    )
    return [((r["gt_session"], *r["others"]), r["session_id"]) for r in rows]


_CATEGORY_BY_NAME = {
    "json": JSON,
    "jsonb": JSON,
    "uuid": UUID,
    "timestamp": TIMESTAMP,
    "timestamptz": TIMESTAMP,
    "bool": BOOL,
}
_CATEGORY_BY_TYPCATEGORY = {"S": TEXT, "N": NUMERIC, "A": ARRAY, "E": ENUM, "B": BOOL}


def _category(typname: str, typcategory: str) -> str:
    return _CATEGORY_BY_NAME.get(typname) or _CATEGORY_BY_TYPCATEGORY.get(typcategory, OTHER)


async def fetch_metadata(conn: asyncpg.Connection) -> Metadata:
    tables = await conn.fetch(
        "SELECT table_schema, table_name, pk_columns, "
        "format('%I.%I', table_schema, table_name)::regclass::oid AS oid FROM cow.tables"
    )
    oids = [t["oid"] for t in tables]
    columns = await conn.fetch(
        """
        SELECT a.attrelid AS oid, a.attname, format_type(a.atttypid, a.atttypmod) AS type_name,
               bt.typname, bt.typcategory::text AS typcategory,
               (a.attidentity <> '' OR a.atthasdef) AS generated
        FROM pg_attribute a
        JOIN pg_type ty ON ty.oid = a.atttypid
        -- a domain compares like its base type
        JOIN pg_type bt ON bt.oid = CASE WHEN ty.typtype = 'd' THEN ty.typbasetype ELSE ty.oid END
        WHERE a.attrelid = ANY($1::oid[]) AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY a.attrelid, a.attnum
        """,
        oids,
    )
    fks = await conn.fetch(
        """
        SELECT con.conrelid AS oid, rn.nspname AS ref_schema, rc.relname AS ref_table,
               ARRAY(SELECT att.attname FROM unnest(con.conkey) WITH ORDINALITY k(num, ord)
                     JOIN pg_attribute att ON att.attrelid = con.conrelid AND att.attnum = k.num
                     ORDER BY k.ord) AS cols,
               ARRAY(SELECT att.attname FROM unnest(con.confkey) WITH ORDINALITY k(num, ord)
                     JOIN pg_attribute att ON att.attrelid = con.confrelid AND att.attnum = k.num
                     ORDER BY k.ord) AS ref_cols
        FROM pg_constraint con
        JOIN pg_class rc ON rc.oid = con.confrelid
        JOIN pg_namespace rn ON rn.oid = rc.relnamespace
        WHERE con.contype = 'f' AND con.conrelid = ANY($1::oid[])
        ORDER BY con.conrelid, con.conname
        """,
        oids,
    )
    cols_by: dict[int, list[ColumnMeta]] = defaultdict(list)
    for c in columns:
        category = _category(c["typname"], c["typcategory"])
        cols_by[c["oid"]].append(ColumnMeta(c["attname"], c["type_name"], category, bool(c["generated"])))
    fks_by: dict[int, list[ForeignKey]] = defaultdict(list)
    for f in fks:
        fks_by[f["oid"]].append(
            ForeignKey(tuple(f["cols"]), qualified(f["ref_schema"], f["ref_table"]), tuple(f["ref_cols"]))
        )
    out: dict[str, TableMeta] = {}
    for t in tables:
        name = qualified(t["table_schema"], t["table_name"])
        cols = tuple(cols_by[t["oid"]])
        # A keyless table (no primary key): a row is identified by its whole value, which is also the key
        # cow.session_changes reports for it.
        keyless = not t["pk_columns"]
        pk = tuple(c.name for c in cols) if keyless else tuple(t["pk_columns"])
        out[name] = TableMeta(name, cols, pk, tuple(fks_by[t["oid"]]), keyless=keyless)
    return Metadata(out)


_CHANGES = (
    "SELECT s.ord, c.seq, c.operation_id, c.table_schema, c.table_name, c.pk::text AS pk, "
    "c.row_data::text AS row_data, c.deleted "
    "FROM unnest($1::text[]) WITH ORDINALITY AS s(id, ord) CROSS JOIN LATERAL cow.session_changes(s.id) AS c "
    "ORDER BY s.ord, c.seq"
)

_Raw = tuple[str, Any, Any, str, int, bool, str]  # table, pk, row, operation, seq, deleted, canonical pk


async def fetch_writes(conn: asyncpg.Connection, session: str, metadata: Metadata) -> list[Write]:
    return (await fetch_writes_many(conn, [session], metadata))[0]


async def fetch_writes_many(
    conn: asyncpg.Connection, sessions: Sequence[str], metadata: Metadata
) -> list[list[Write]]:
    """The writes of several sessions in one query, and one key lookup per table for all of them (a
    batch of rewards reads its sessions in a few round trips, not a few per session)."""
    rows = await conn.fetch(_CHANGES, list(sessions))
    raw: list[list[_Raw]] = [[] for _ in sessions]
    for r in rows:
        pk = loads(r["pk"])
        table = qualified(r["table_schema"], r["table_name"])
        raw[r["ord"] - 1].append(
            (
                table,
                pk,
                loads(r["row_data"]),
                r["operation_id"] or "",
                int(r["seq"]),
                bool(r["deleted"]),
                _canon(pk),
            )
        )
    existing = await _existing_keys(conn, metadata, [(w[0], w[6], w[1]) for ws in raw for w in ws])
    return [
        [
            Write(
                table,
                pk,
                row,
                op,
                seq,
                deleted,
                None if table not in metadata.tables else canon not in existing.get(table, set()),
            )
            for table, pk, row, op, seq, deleted, canon in ws
        ]
        for ws in raw
    ]


_CANON = json.JSONEncoder(sort_keys=True, default=str)


def _canon(pk: Mapping[str, Any]) -> str:
    return _CANON.encode(pk)


async def _existing_keys(
    conn: asyncpg.Connection, metadata: Metadata, keys: Sequence[tuple[str, str, Mapping[str, Any]]]
) -> dict[str, set[str]]:
    """Which of the written keys (table, canonical pk, pk) exist in the app's own table (so existed
    before the session)."""
    by_table: dict[str, dict[str, Mapping[str, Any]]] = defaultdict(dict)
    for table, canon, pk in keys:
        by_table[table][canon] = pk
    found: dict[str, set[str]] = {}
    for table, pks in by_table.items():
        meta = metadata.get(table)
        if meta is None:
            continue
        schema, _, name = table.partition(".")
        rel = f"{quote_ident(schema)}.{quote_ident(name)}"
        # (A keyless table's key is its whole row, NULLs included.)
        eq = "IS NOT DISTINCT FROM" if meta.keyless else "="
        cond = " AND ".join(f"b.{quote_ident(c)} {eq} p.{quote_ident(c)}" for c in meta.pk)
        listed = list(pks.values())
        ords = await conn.fetch(
            f"SELECT e.ord FROM jsonb_array_elements($1::jsonb) WITH ORDINALITY AS e(pk, ord) "
            f"CROSS JOIN LATERAL jsonb_populate_record(NULL::{rel}, e.pk) AS p "
            f"WHERE EXISTS (SELECT 1 FROM {rel} AS b WHERE {cond})",
            json.dumps(listed, default=str),
        )
        canons = list(pks)
        found[table] = {canons[r["ord"] - 1] for r in ords}
    return found
