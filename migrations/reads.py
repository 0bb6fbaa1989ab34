"""A session's read trace (``cow.reads``, migration 50; recorded by ``cowproxy serve --reads-dsn``), per
operation, for ``cowproxy session reads``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from cowproxy.read_identity import params_column, row_identity
from migrations.errors import LayerError, SessionError
from migrations.sessions import _check_id, _require_layer

_READS = """
SELECT seq, operation, at, fingerprint, statement, identity, {params}, relations, rows, duration_us
FROM cow.reads WHERE session = $1 ORDER BY seq
"""


@dataclass(frozen=True)
class Read:
    seq: int
    at: datetime
    fingerprint: str
    statement: str
    identity: str
    relations: tuple[str, ...]
    rows: int | None
    duration_us: int

    def as_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "at": self.at.isoformat(),
            "fingerprint": self.fingerprint,
            "statement": self.statement,
            "relations": list(self.relations),
            "rows": self.rows,
            "duration_us": self.duration_us,
            "identity": self.identity,
        }


@dataclass(frozen=True)
class OperationReads:
    """The reads of one operation (``operation_id`` None: read with no operation id in force)."""

    operation_id: str | None
    reads: tuple[Read, ...]

    @property
    def rows(self) -> int:
        return sum(r.rows or 0 for r in self.reads)

    @property
    def relations(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t for r in self.reads for t in r.relations))

    @property
    def repeated(self) -> int:
        """Reads identical (same text, same parameters) to an earlier read of this operation."""
        return len(self.reads) - len({r.identity for r in self.reads})

    def as_json(self) -> dict[str, Any]:
        return {
            "operation_id": self.operation_id,
            "statements": len(self.reads),
            "rows": self.rows,
            "repeated": self.repeated,
            "relations": list(self.relations),
            "reads": [r.as_json() for r in self.reads],
        }


@dataclass(frozen=True)
class SessionReads:
    session_id: str
    operations: tuple[OperationReads, ...]  # in the order of their first read

    def as_json(self) -> dict[str, Any]:
        return {
            "session": self.session_id,
            "statements": sum(len(o.reads) for o in self.operations),
            "rows": sum(o.rows for o in self.operations),
            "operations": [o.as_json() for o in self.operations],
        }


async def session_reads(conn: asyncpg.Connection, session_id: str) -> SessionReads:
    """The session's reads by operation; a session with neither reads nor a registry row is unknown."""
    _check_id(session_id)
    await _require_layer(conn)
    params = await params_column(conn)
    if params is None:
        raise LayerError("this layer has no read traces (cow.reads): run cowproxy install to upgrade it")
    rows = await conn.fetch(_READS.format(params=params), session_id)
    if not rows and not await conn.fetchval("SELECT 1 FROM cow.sessions WHERE session_id = $1", session_id):
        raise SessionError(f"unknown session {session_id} (no registry row and no reads recorded)")
    grouped: dict[str | None, list[Read]] = {}
    for r in rows:
        grouped.setdefault(r["operation"], []).append(
            Read(
                int(r["seq"]),
                r["at"],
                r["fingerprint"],
                r["statement"],
                row_identity(r["identity"], r["statement"], r["params"]),
                tuple(r["relations"]),
                None if r["rows"] is None else int(r["rows"]),
                int(r["duration_us"]),
            )
        )
    return SessionReads(session_id, tuple(OperationReads(op, tuple(reads)) for op, reads in grouped.items()))
