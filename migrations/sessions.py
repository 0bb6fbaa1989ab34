"""Python side of the session functions (asyncpg); each call is one SQL function of the layer."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from cowproxy.ids import valid_id
from migrations.errors import LayerError, NotInstalledError, SessionError
from migrations.layer import repeatables

KINDS = ("ground_truth", "agent", "other")


@dataclass(frozen=True)
class Session:
    session_id: str
    kind: str
    label: str | None
    prompt: str | None
    model: str | None
    gt_session: str | None
    metadata: dict[str, Any]
    created_at: datetime
    first_write_at: datetime | None
    last_write_at: datetime | None
    status: str
    changes: int = 0  # rows in the write log
    operations: int = 0

    def as_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        for key in ("created_at", "first_write_at", "last_write_at"):
            out[key] = out[key].isoformat() if out[key] is not None else None
        return out


@dataclass(frozen=True)
class RowChange:
    """Net effect of a session on one row: action insert/update/delete; ``changed`` maps col -> (old, new)."""

    table: str
    pk: dict[str, Any]
    action: str
    old_row: dict[str, Any] | None
    new_row: dict[str, Any] | None
    changed: dict[str, tuple[Any, Any]]
    seq: int
    operation_id: str


@dataclass(frozen=True)
class Diff:
    session_id: str
    rows: tuple[RowChange, ...]  # net, grouped by table
    operations: tuple[tuple[str, tuple[RowChange, ...]], ...]  # per operation, in write order

    def as_json(self) -> dict[str, Any]:
        def row(r: RowChange) -> dict[str, Any]:
            return {
                "table": r.table,
                "pk": r.pk,
                "action": r.action,
                "old": r.old_row,
                "new": r.new_row,
                "changed": {k: list(v) for k, v in r.changed.items()},
            }

        tables: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for r in self.rows:
            bucket = tables.setdefault(r.table, {"inserted": [], "updated": [], "deleted": []})
            bucket[{"insert": "inserted", "update": "updated", "delete": "deleted"}[r.action]].append(row(r))
        return {
            "session": self.session_id,
            "tables": tables,
            "operations": [
                {"operation_id": op, "rows": [row(r) for r in rows]} for op, rows in self.operations
            ],
        }


@dataclass(frozen=True)
class CommitResult:
    session_id: str
    status: str
    operations: tuple[str, ...] | None
    remaining_changes: int
    tables: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class TableStatus:
    table_schema: str
    table_name: str
    overlay_schema: str
    pk_columns: tuple[str, ...]
    pending_changes: int


@dataclass(frozen=True)
class RepeatableStatus:
    name: str  # file in migrations/sql/functions
    checksum: str | None  # SHA-256 recorded at its last apply (None: never applied)
    applied_at: datetime | None
    current: bool  # the recorded checksum is the shipped file's: `install` would not apply it again
    shipped: bool  # False: recorded by an earlier install, no such file now (its functions stay)


@dataclass(frozen=True)
class LayerStatus:
    version: int | None
    schemas: tuple[str, ...]
    tables: tuple[TableStatus, ...]
    sessions: dict[str, int]  # status -> count
    migrations: tuple[int, ...] = ()  # numbered migrations applied
    repeatables: tuple[RepeatableStatus, ...] = ()  # every shipped or recorded repeatable file, by name


def _load(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


async def _require_layer(conn: asyncpg.Connection) -> None:
    if not await conn.fetchval("SELECT to_regclass('cow.sessions') IS NOT NULL"):
        raise NotInstalledError("the cowproxy layer is not installed in this database (run cowproxy install)")


def _session_error(exc: asyncpg.PostgresError) -> SessionError:
    return SessionError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


async def create_session(
    conn: asyncpg.Connection,
    session_id: str,
    *,
    kind: str = "agent",
    label: str | None = None,
    prompt: str | None = None,
    model: str | None = None,
    gt_session: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> Session:
    await _require_layer(conn)
    try:
        await conn.execute(
            "SELECT cow.create_session($1, $2, $3, $4, $5, $6, $7::jsonb)",
            session_id,
            kind,
            label,
            prompt,
            model,
            gt_session,
            json.dumps(metadata or {}),
        )
    except asyncpg.PostgresError as exc:
        raise _session_error(exc) from exc
    return await get_session(conn, session_id)


_SESSION_QUERY = """
SELECT s.*, coalesce(c.changes, 0) AS changes, coalesce(c.operations, 0) AS operations
FROM cow.sessions s
LEFT JOIN LATERAL (SELECT count(*) AS changes, count(DISTINCT operation_id) AS operations
                   FROM cow.session_changes(s.session_id)) c ON true
"""


def _session(row: asyncpg.Record) -> Session:
    return Session(
        session_id=row["session_id"],
        kind=row["kind"],
        label=row["label"],
        prompt=row["prompt"],
        model=row["model"],
        gt_session=row["gt_session"],
        metadata=_load(row["metadata"]) or {},
        created_at=row["created_at"],
        first_write_at=row["first_write_at"],
        last_write_at=row["last_write_at"],
        status=row["status"],
        changes=int(row["changes"]),
        operations=int(row["operations"]),
    )


async def list_sessions(conn: asyncpg.Connection, status: str | None = None) -> list[Session]:
    await _require_layer(conn)
    rows = await conn.fetch(
        _SESSION_QUERY + " WHERE $1::text IS NULL OR s.status = $1 ORDER BY s.created_at, s.session_id",
        status,
    )
    return [_session(r) for r in rows]


def _check_id(session_id: str) -> None:
    if not valid_id(session_id):
        raise SessionError(
            f"invalid session id {session_id[:140]!r}: ids are 1-128 characters of [A-Za-z0-9._:-]"
        )


async def get_session(conn: asyncpg.Connection, session_id: str) -> Session:
    _check_id(session_id)
    await _require_layer(conn)
    row = await conn.fetchrow(_SESSION_QUERY + " WHERE s.session_id = $1", session_id)
    if row is None:
        raise SessionError(f"unknown session {session_id}")
    return _session(row)


def _change(row: asyncpg.Record) -> RowChange:
    changed = _load(row["changed"]) or {}
    return RowChange(
        table=f"{row['table_schema']}.{row['table_name']}",
        pk=_load(row["pk"]),
        action=row["action"],
        old_row=_load(row["old_row"]),
        new_row=_load(row["new_row"]),
        changed={k: (v[0], v[1]) for k, v in changed.items()},
        seq=int(row["seq"]),
        operation_id=row["operation_id"],
    )


async def session_diff(conn: asyncpg.Connection, session_id: str) -> Diff:
    """Net change per row, and per operation (in write order) what each operation did to the rows it wrote."""
    await get_session(conn, session_id)
    net = tuple(_change(r) for r in await conn.fetch("SELECT * FROM cow.session_diff($1)", session_id))
    # Replay the log: each write compared with the row as it was before it (the base row at first touch).
    state: dict[tuple[str, str], dict[str, Any] | None] = {
        (f"{r['table_schema']}.{r['table_name']}", _key(_load(r["pk"]))): _load(r["base_row"])
        for r in await conn.fetch("SELECT * FROM cow.session_keys($1)", session_id)
    }
    # A keyless table's write adds or removes one instance of a row value (its pk): no row to update.
    keyless = {
        f"{r['table_schema']}.{r['table_name']}"
        for r in await conn.fetch("SELECT table_schema, table_name FROM cow.tables WHERE pk_columns = '{}'")
    }
    per_op: dict[str, list[RowChange]] = {}
    for w in await conn.fetch("SELECT * FROM cow.session_changes($1)", session_id):
        table = f"{w['table_schema']}.{w['table_name']}"
        pk = _load(w["pk"])
        if table in keyless:
            old, new = (pk, None) if w["deleted"] else (None, _load(w["row_data"]))
            per_op.setdefault(w["operation_id"], []).append(
                RowChange(
                    table,
                    pk,
                    "delete" if w["deleted"] else "insert",
                    old,
                    new,
                    {},
                    int(w["seq"]),
                    w["operation_id"],
                )
            )
            continue
        key = (table, _key(pk))
        before = state.get(key)
        after = None if w["deleted"] else _load(w["row_data"])
        state[key] = after
        if before is None and after is None:
            continue
        action = "insert" if before is None else "delete" if after is None else "update"
        changed = (
            {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v}
            if before is not None and after is not None
            else {}
        )
        per_op.setdefault(w["operation_id"], []).append(
            RowChange(table, pk, action, before, after, changed, int(w["seq"]), w["operation_id"])
        )
    return Diff(session_id, net, tuple((op, tuple(rows)) for op, rows in per_op.items()))


def _key(pk: Any) -> str:
    return json.dumps(pk, sort_keys=True)


async def discard_session(conn: asyncpg.Connection, session_id: str) -> int:
    _check_id(session_id)
    await _require_layer(conn)
    try:
        count: int = await conn.fetchval("SELECT cow.discard_session($1)", session_id)
    except asyncpg.PostgresError as exc:
        raise _session_error(exc) from exc
    return count


async def commit_session(
    conn: asyncpg.Connection,
    session_id: str,
    operations: Sequence[str] | None = None,
    on_conflict: str = "fail",
) -> CommitResult:
    _check_id(session_id)
    await _require_layer(conn)
    try:
        async with conn.transaction():
            raw = await conn.fetchval(
                "SELECT cow.commit_session($1, $2::text[], $3)",
                session_id,
                list(operations) if operations is not None else None,
                on_conflict,
            )
    except asyncpg.PostgresError as exc:
        raise _session_error(exc) from exc
    result = _load(raw)
    return CommitResult(
        session_id=result["session"],
        status=result["status"],
        operations=tuple(result["operations"]) if result["operations"] is not None else None,
        remaining_changes=int(result["remaining_changes"]),
        tables={k: {kk: int(vv) for kk, vv in v.items()} for k, v in result["tables"].items()},
    )


async def layer_status(conn: asyncpg.Connection) -> LayerStatus:
    if not await conn.fetchval("SELECT to_regclass('cow.migrations') IS NOT NULL"):
        return LayerStatus(None, (), (), {})
    version = await conn.fetchval("SELECT max(version) FROM cow.migrations")
    if not await conn.fetchval("SELECT to_regclass('cow.registry') IS NOT NULL"):
        raise LayerError("the cowproxy layer is partly installed: run cowproxy install again")
    schemas = tuple(r[0] for r in await conn.fetch("SELECT schema_name FROM cow.schemas ORDER BY 1"))
    tables = []
    for r in await conn.fetch("SELECT * FROM cow.registry ORDER BY table_schema, table_name"):
        pending = await conn.fetchval(f'SELECT count(*) FROM cow_changes."{r["changes_table"]}"')
        tables.append(
            TableStatus(
                r["table_schema"], r["table_name"], r["overlay_schema"], tuple(r["pk_columns"]), pending
            )
        )
    sessions = {
        r[0]: int(r[1]) for r in await conn.fetch("SELECT status, count(*) FROM cow.sessions GROUP BY 1")
    }
    applied = tuple(r[0] for r in await conn.fetch("SELECT version FROM cow.migrations ORDER BY 1"))
    recorded = {}
    if await conn.fetchval("SELECT to_regclass('cow.repeatables') IS NOT NULL"):  # from migration 0005 on
        recorded = {r["name"]: r for r in await conn.fetch("SELECT * FROM cow.repeatables")}
    shipped = {r.name: r.checksum for r in repeatables()}
    files = tuple(
        RepeatableStatus(
            name,
            recorded[name]["checksum"] if name in recorded else None,
            recorded[name]["applied_at"] if name in recorded else None,
            name in recorded and recorded[name]["checksum"] == shipped.get(name),
            name in shipped,
        )
        for name in sorted(shipped.keys() | recorded.keys())
    )
    return LayerStatus(version, schemas, tuple(tables), sessions, applied, files)
