"""Install, upgrade and remove the copy-on-write layer.

The SQL lives in numbered files ``migrations/sql/NNNN_name.sql`` (schema changes, applied once each,
recorded in ``cow.migrations``) and in repeatable files ``migrations/sql/functions/NN_name.sql`` (the one
current definition of every layer function, re-applied whenever a file's checksum differs from the one
recorded in ``cow.repeatables``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources

import asyncpg

from migrations.errors import LayerError, NotInstalledError, PermissionDeniedError

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_REPEATABLE = re.compile(r"^\d{2}_[a-z0-9_]+\.sql$")
# One advisory lock key for install/uninstall, so two concurrent installs serialise.
_LOCK_KEY = 0x636F77  # "cow"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


@dataclass(frozen=True)
class Repeatable:
    name: str  # file name in migrations/sql/functions, e.g. "10_core.sql"; files are applied in name order
    sql: str
    checksum: str  # SHA-256 of the text, hex


@dataclass(frozen=True)
class InstallResult:
    applied: tuple[int, ...]  # migration versions applied by this call (empty: already up to date)
    notes: tuple[str, ...]  # tables skipped, views without overlay twins, ...
    reapplied: tuple[str, ...] = ()  # repeatable files applied by this call (new or changed)


def migrations() -> list[Migration]:
    """The versioned SQL files shipped with the package, in order."""
    found: list[Migration] = []
    for entry in resources.files("migrations").joinpath("sql").iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    return found


def repeatables() -> list[Repeatable]:
    """The repeatable SQL files shipped with the package (function definitions), in the order they apply."""
    found: list[Repeatable] = []
    for entry in resources.files("migrations").joinpath("sql", "functions").iterdir():
        if _REPEATABLE.match(entry.name):
            text = entry.read_text(encoding="utf-8")
            found.append(Repeatable(entry.name, text, hashlib.sha256(text.encode()).hexdigest()))
    found.sort(key=lambda r: r.name)
    return found


async def installed_version(conn: asyncpg.Connection) -> int | None:
    """Highest applied migration, or None when the layer is not installed."""
    present = await conn.fetchval("SELECT to_regclass('cow.migrations') IS NOT NULL")
    if not present:
        return None
    version: int | None = await conn.fetchval("SELECT max(version) FROM cow.migrations")
    return version


async def _resolve_excludes(
    conn: asyncpg.Connection, schemas: Sequence[str], exclude: Iterable[str]
) -> dict[str, list[str]]:
    """``T`` excludes T in every installed schema that has it, ``S.T`` one table; unknown names are errors."""
    per_schema: dict[str, list[str]] = {s: [] for s in schemas}
    for item in exclude:
        schema, dot, table = item.rpartition(".")
        candidates = [schema] if dot else list(schemas)
        if dot and schema not in per_schema:
            raise LayerError(f"--exclude {item}: schema {schema!r} is not among the installed schemas")
        found = False
        for candidate in candidates:
            if await conn.fetchval(
                "SELECT to_regclass(format('%I.%I', $1::text, $2::text)) IS NOT NULL", candidate, table
            ):
                per_schema[candidate].append(table)
                found = True
        if not found:
            raise LayerError(f"--exclude {item}: no such table in schema(s) {', '.join(candidates)}")
    return per_schema


async def install_layer(
    conn: asyncpg.Connection, schemas: Sequence[str] = ("public",), exclude: Iterable[str] = ()
) -> InstallResult:
    """Apply pending migrations and enable CoW on every table of ``schemas`` (idempotent)."""
    schemas = list(dict.fromkeys(schemas)) or ["public"]
    exclude = list(exclude)
    applied: list[int] = []
    reapplied: list[str] = []
    notes: list[str] = []
    try:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
            # The layer's own DDL must not trigger its event triggers.
            await conn.execute("SELECT set_config('cow.in_layer', 'on', true)")
            await conn.execute(
                "CREATE SCHEMA IF NOT EXISTS cow;"
                "CREATE TABLE IF NOT EXISTS cow.migrations (version int PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {r["version"] for r in await conn.fetch("SELECT version FROM cow.migrations")}
            for migration in migrations():
                if migration.version in done:
                    continue
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO cow.migrations (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )
                applied.append(migration.version)
            # Then the function definitions: a file whose text changed (or that is new) is applied again. A
            # numbered file therefore never calls a layer function: on a fresh install none exists yet.
            shipped = repeatables()
            recorded: dict[str, str] = {}
            if shipped:  # none: a layer from before the repeatable files (bench/layer_writes.py --baseline)
                rows = await conn.fetch("SELECT name, checksum FROM cow.repeatables")
                recorded = {r["name"]: r["checksum"] for r in rows}
            for repeatable in shipped:
                if recorded.get(repeatable.name) == repeatable.checksum:
                    continue
                await conn.execute(repeatable.sql)
                await conn.execute(
                    "INSERT INTO cow.repeatables (name, checksum) VALUES ($1, $2) ON CONFLICT (name)"
                    " DO UPDATE SET checksum = excluded.checksum, applied_at = now()",
                    repeatable.name,
                    repeatable.checksum,
                )
                reapplied.append(repeatable.name)
            for schema in schemas:
                if not await conn.fetchval("SELECT to_regnamespace(quote_ident($1)) IS NOT NULL", schema):
                    raise LayerError(f"schema {schema!r} does not exist")
            excludes = await _resolve_excludes(conn, schemas, exclude)
            for schema in schemas:
                rows = await conn.fetch(
                    "SELECT * FROM cow.enable_schema($1, $2::text[])", schema, excludes[schema]
                )
                notes.extend(r[0] for r in rows)
            if done and (applied or reapplied):
                # An upgrade: regenerate every per-table object with the new generator code.
                notes.extend(r[0] for r in await conn.fetch("SELECT * FROM cow.refresh(true)"))
    except asyncpg.InsufficientPrivilegeError as exc:
        raise PermissionDeniedError(
            f"install needs a superuser (event triggers, app table triggers): {exc}"
        ) from exc
    except asyncpg.PostgresError as exc:
        raise LayerError(f"install failed: {exc}") from exc
    return InstallResult(tuple(applied), tuple(dict.fromkeys(notes)), tuple(reapplied))


async def uninstall_layer(conn: asyncpg.Connection, discard_sessions: bool = False) -> None:
    """Remove every layer object: the app schemas are left as they were before install."""
    if await installed_version(conn) is None:
        raise NotInstalledError("the cowproxy layer is not installed in this database")
    try:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
            await conn.execute("SELECT cow._teardown($1)", discard_sessions)
            await conn.execute("DROP SCHEMA cow CASCADE")
    except asyncpg.ObjectNotInPrerequisiteStateError as exc:
        raise LayerError(f"uninstall refused: {exc}") from exc
    except asyncpg.InsufficientPrivilegeError as exc:
        raise PermissionDeniedError(f"uninstall needs a superuser: {exc}") from exc
    except asyncpg.PostgresError as exc:
        raise LayerError(f"uninstall failed: {exc}") from exc
