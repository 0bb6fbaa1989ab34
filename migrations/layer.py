"""Install, upgrade and remove the copy-on-write layer.

The SQL lives in numbered files ``migrations/sql/NNNN_name.sql`` (schema changes, applied once each,
recorded in ``cow.migrations``) and in repeatable files ``migrations/sql/functions/NN_name.sql`` (the one
current definition of every layer function, re-applied whenever a file's checksum differs from the one
recorded in ``cow.repeatables``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources

import asyncpg

from migrations.binding import new_secret
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
    # The binding secret this call made because the database had none (docs/threat-model.md): shown once,
    # the database keeps only its hash.
    secret: str | None = field(default=None, repr=False)


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


# Tables enabled per transaction: each table's view, changes table, indexes and triggers hold locks until
# commit, and PostgreSQL's lock table has max_locks_per_transaction x (max_connections +
# max_prepared_transactions) slots for all backends (64 x 100 by default): one transaction for 830 tables ran
# out of shared memory. ~15 locks per table; a quarter of max_locks_per_transaction tables per batch.
LOCKS_PER_TABLE = 15
GUARDS_PER_BATCH = 10  # a guard is one trigger: one lock on its table
ProgressCallback = Callable[[int, int], None]


async def batch_size(conn: asyncpg.Connection) -> int:
    """Tables per install transaction for this server's lock table."""
    locks = int(await conn.fetchval("SELECT current_setting('max_locks_per_transaction')::int"))
    connections = int(await conn.fetchval("SELECT current_setting('max_connections')::int"))
    # a twentieth of the shared lock table, and never more than 100 tables (a batch is one commit's work)
    return max(1, min(100, locks * connections // 20 // LOCKS_PER_TABLE))


async def install_layer(
    conn: asyncpg.Connection,
    schemas: Sequence[str] = ("public",),
    exclude: Iterable[str] = (),
    *,
    progress: ProgressCallback | None = None,
    batch: int | None = None,
) -> InstallResult:
    """Apply pending migrations and enable CoW on every table of ``schemas`` (idempotent, resumable).

    The migrations, function files and schema records commit first; then the tables are enabled in batches of
    ``batch`` (default: ``batch_size``), one transaction each, so that a schema of thousands of tables fits
    PostgreSQL's lock table. Each table is enabled whole in its batch (never half), and an interrupted install
    goes on where it stopped when run again. ``progress(done, total)`` is called after each batch."""
    schemas = list(dict.fromkeys(schemas)) or ["public"]
    notes: list[str] = []
    try:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
            # The layer's own DDL must not trigger its event triggers.
            await conn.execute("SELECT set_config('cow.in_layer', 'on', true)")
            done, applied = await _apply_migrations(conn)
            reapplied = await _apply_repeatables(conn)
            secret = await _add_schemas(conn, schemas, list(exclude))
        # An upgrade regenerates every per-table object with the new generator code (cow.refresh(true) did it
        # in one transaction).
        force = bool(done and (applied or reapplied))
        notes.extend(await _enable_tables(conn, force, batch or await batch_size(conn), progress))
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
            # What the batches do not: tables dropped or re-keyed, index mirrors, overlay twins of app views.
            notes.extend(r[0] for r in await conn.fetch("SELECT * FROM cow.refresh()"))
    except asyncpg.InsufficientPrivilegeError as exc:
        raise PermissionDeniedError(
            f"install needs a superuser (event triggers, app table triggers): {exc}"
        ) from exc
    except asyncpg.PostgresError as exc:
        raise LayerError(f"install failed: {exc}") from exc
    return InstallResult(tuple(applied), tuple(dict.fromkeys(notes)), tuple(reapplied), secret)


async def _apply_migrations(conn: asyncpg.Connection) -> tuple[set[int], list[int]]:
    """The numbered files not applied yet, in order: (the versions applied before, those applied now)."""
    await conn.execute(
        "CREATE SCHEMA IF NOT EXISTS cow;"
        "CREATE TABLE IF NOT EXISTS cow.migrations (version int PRIMARY KEY, name text NOT NULL,"
        " applied_at timestamptz NOT NULL DEFAULT now())"
    )
    done = {r["version"] for r in await conn.fetch("SELECT version FROM cow.migrations")}
    applied: list[int] = []
    for migration in migrations():
        if migration.version in done:
            continue
        await conn.execute(migration.sql)
        await conn.execute(
            "INSERT INTO cow.migrations (version, name) VALUES ($1, $2)", migration.version, migration.name
        )
        applied.append(migration.version)
    return done, applied


async def _apply_repeatables(conn: asyncpg.Connection) -> list[str]:
    """The function definitions after the numbered files: a file whose text changed (or that is new) is
    applied again. A numbered file therefore never calls a layer function: on a fresh install none exists
    yet. Returns the names of the files applied."""
    shipped = repeatables()
    recorded: dict[str, str] = {}
    if shipped:  # none: a layer from before the repeatable files (bench/layer_writes.py --baseline)
        rows = await conn.fetch("SELECT name, checksum FROM cow.repeatables")
        recorded = {r["name"]: r["checksum"] for r in rows}
    reapplied: list[str] = []
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
    return reapplied


async def _add_schemas(conn: asyncpg.Connection, schemas: Sequence[str], exclude: list[str]) -> str | None:
    """Record the schemas (and the excluded tables) in the layer; the binding secret when the layer has
    none yet (returned, else None)."""
    for schema in schemas:
        if not await conn.fetchval("SELECT to_regnamespace(quote_ident($1)) IS NOT NULL", schema):
            raise LayerError(f"schema {schema!r} does not exist")
    excludes = await _resolve_excludes(conn, schemas, exclude)
    for schema in schemas:
        await conn.execute("SELECT cow._add_schema($1, $2::text[])", schema, excludes[schema])
    # (A layer from before the binding, as bench scripts install for a baseline, has neither.)
    if await conn.fetchval(
        "SELECT to_regprocedure('cow.set_bind_secret(text)') IS NOT NULL"
    ) and not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM cow.bind_secret)"):
        secret = new_secret()
        await conn.execute("SELECT cow.set_bind_secret($1)", secret)
        return secret
    return None


async def _enable_tables(
    conn: asyncpg.Connection, force: bool, batch: int, progress: ProgressCallback | None
) -> list[str]:
    """Guard every table first (a trigger each, so ``GUARDS_PER_BATCH`` times ``batch`` per transaction), then
    enable (or, with ``force``, regenerate) the pending tables, ``batch`` per transaction."""
    unguarded = [r[0] for r in await conn.fetch("SELECT * FROM cow._unguarded_tables()")]
    step = batch * GUARDS_PER_BATCH
    for start in range(0, len(unguarded), step):
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
            await conn.execute("SELECT cow._guard_tables($1::oid[])", unguarded[start : start + step])
    pending = [r[0] for r in await conn.fetch("SELECT * FROM cow._pending_tables($1)", force)]
    notes: list[str] = []
    if progress is not None:
        progress(0, len(pending))
    for start in range(0, len(pending), batch):
        chunk = pending[start : start + batch]
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
            rows = await conn.fetch("SELECT * FROM cow._refresh_tables($1::oid[], $2)", chunk, force)
            notes.extend(r[0] for r in rows)
        if progress is not None:
            progress(start + len(chunk), len(pending))
    return notes


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
