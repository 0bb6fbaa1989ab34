"""Install, upgrade and remove the copy-on-write layer.

The SQL lives in numbered files ``migrations/sql/NNNN_name.sql`` (schema changes, applied once each,
recorded in ``cow.migrations``) and in repeatable files ``migrations/sql/functions/NN_name.sql`` (the one
current definition of every layer function, re-applied whenever a file's checksum differs from the one
recorded in ``cow.repeatables``).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
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
    workers: Workers | None = None,
) -> InstallResult:
    """Apply pending migrations and enable CoW on every table of ``schemas`` (idempotent, resumable).

    The migrations, function files and schema records commit first; then the tables are enabled in batches of
    ``batch`` (default: ``batch_size``), one transaction each, so that a schema of thousands of tables fits
    PostgreSQL's lock table. Each table is enabled whole in its batch (never half), and an interrupted install
    goes on where it stopped when run again. ``progress(done, total)`` is called after each batch. With
    ``workers``, several batches run at once on connections of their own."""
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
        notes.extend(await _enable_tables(conn, force, batch or await batch_size(conn), progress, workers))
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
    except (asyncpg.InterfaceError, asyncpg.InternalClientError, OSError) as exc:
        # A connection lost, one of the workers' too (asyncpg's InternalClientError: its transaction's COMMIT
        # was sent while the protocol still waited for the killed backend's reply).
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


@dataclass(frozen=True)
class Workers:
    """Connections for install's batches beyond the caller's: ``connect`` opens one to the same database, and
    ``jobs`` batches run at once (1: one at a time, on the caller's connection)."""

    connect: Callable[[], Awaitable[asyncpg.Connection]]
    jobs: int = 2


@dataclass
class _Batches:
    """The batches of one install phase, shared by the connections that work them off: each takes the next
    batch until none is left or one of them failed (the others finish their batch, which commits whole)."""

    todo: deque[list[int]]
    total: int
    progress: ProgressCallback | None
    done: int = 0
    failed: bool = False
    notes: list[str] = field(default_factory=list)

    def finished(self, chunk: list[int], notes: Iterable[str]) -> None:
        self.done += len(chunk)
        self.notes.extend(notes)
        if self.progress is not None:
            self.progress(self.done, self.total)


async def _enable_tables(
    conn: asyncpg.Connection,
    force: bool,
    batch: int,
    progress: ProgressCallback | None,
    workers: Workers | None,
) -> list[str]:
    """Guard every table first (a trigger each, so ``GUARDS_PER_BATCH`` times ``batch`` per transaction), then
    enable (or, with ``force``, regenerate) the pending tables, ``batch`` per transaction: on ``workers.jobs``
    connections at once when given (and the layer has ``cow._refresh_batch``), then the tables whose
    neighbours another connection enabled meanwhile, one batch at a time."""
    await _guard_tables(conn, batch * GUARDS_PER_BATCH)
    pending = [r[0] for r in await conn.fetch("SELECT * FROM cow._pending_tables($1)", force)]
    links = [
        (a, b)
        for a, b in await conn.fetch(
            "SELECT conrelid, confrelid FROM pg_catalog.pg_constraint WHERE contype = 'f'"
            " AND conrelid <> confrelid AND (conrelid = ANY ($1::oid[]) OR confrelid = ANY ($1::oid[]))",
            pending,
        )
    ]
    order = linked_batches(pending, links, batch)
    batches = _Batches(deque(order), len(pending), progress)
    if progress is not None:
        progress(0, len(pending))
    if workers is None or workers.jobs < 2 or len(batches.todo) < 2 or not await _has_parallel_batches(conn):
        await _serial_batches(conn, batches, _REFRESH, force)
        return batches.notes
    await _parallel_batches(conn, batches, force, workers)
    # A table whose foreign-key neighbour another batch enabled may have read it as not enabled, and then its
    # signature says so (cow._refresh_batch): those of the links between batches are checked.
    linked = _across(order, links)
    again = _Batches(deque(_chunks(linked, batch)), len(linked), None, notes=batches.notes)
    await _serial_batches(conn, again, _RELINK)
    return again.notes


def _chunks(items: list[int], size: int) -> list[list[int]]:
    return [items[start : start + size] for start in range(0, len(items), size)]


def linked_batches(tables: Sequence[int], links: Iterable[tuple[int, int]], size: int) -> list[list[int]]:
    """``tables`` in batches of at most ``size``, the tables a foreign key links (``links``: pairs of tables)
    together where they fit: a set of linked tables that fits in a batch is never split, a larger one is cut
    in the order of a breadth-first walk. A foreign key between two batches costs a table's triggers twice
    (made before its neighbour was enabled, then again). The sets come in the order of ``tables``."""
    pending = set(tables)
    near: dict[int, list[int]] = {t: [] for t in tables}
    for a, b in links:
        if a != b and a in pending and b in pending:
            near[a].append(b)
            near[b].append(a)
    batches: list[list[int]] = []
    current: list[int] = []
    seen: set[int] = set()
    for start in tables:
        if start in seen:
            continue
        linked = _walk(start, near, seen)
        if len(current) + len(linked) > size and len(linked) <= size:
            batches.append(current)
            current = []
        for table in linked:
            current.append(table)
            if len(current) == size:
                batches.append(current)
                current = []
    batches.append(current)
    return [b for b in batches if b]


def _across(batches: list[list[int]], links: Iterable[tuple[int, int]]) -> list[int]:
    """The tables of ``links`` whose other table is in another batch, or in none (enabled before)."""
    batch_of = {table: n for n, tables in enumerate(batches) for table in tables}
    found: dict[int, None] = {}
    for a, b in links:
        if batch_of.get(a, -1) != batch_of.get(b, -1):
            found.update(dict.fromkeys((a, b)))
    return list(found)


def _walk(start: int, near: dict[int, list[int]], seen: set[int]) -> list[int]:
    """The tables linked to ``start`` (itself first), breadth first; marks them ``seen``."""
    order = [start]
    seen.add(start)
    for table in order:  # (grows while it is walked)
        for other in near[table]:
            if other not in seen:
                seen.add(other)
                order.append(other)
    return order


async def _guard_tables(conn: asyncpg.Connection, step: int) -> None:
    unguarded = [r[0] for r in await conn.fetch("SELECT * FROM cow._unguarded_tables()")]
    for start in range(0, len(unguarded), step):
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
            await conn.execute("SELECT cow._guard_tables($1::oid[])", unguarded[start : start + step])


async def _has_parallel_batches(conn: asyncpg.Connection) -> bool:
    """Whether the installed layer can run batches at once (a baseline layer of the benchmarks may not)."""
    return bool(
        await conn.fetchval(
            "SELECT to_regprocedure('cow._refresh_batch(oid[], boolean, boolean)') IS NOT NULL"
        )
    )


_REFRESH = "SELECT * FROM cow._refresh_tables($1::oid[], $2)"
_RELINK = "SELECT * FROM cow._relink_tables($1::oid[])"


async def _serial_batches(conn: asyncpg.Connection, batches: _Batches, sql: str, *args: object) -> None:
    """One batch at a time on ``conn``: ``sql`` with the batch's tables and ``args``."""
    while batches.todo:
        chunk = batches.todo.popleft()
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
            rows = await conn.fetch(sql, chunk, *args)
        batches.finished(chunk, (r[0] for r in rows))


async def _parallel_batches(
    conn: asyncpg.Connection, batches: _Batches, force: bool, workers: Workers
) -> None:
    """``workers.jobs`` connections (``conn`` and new ones) work the batches off at once. ``conn`` holds the
    install lock for all of them meanwhile (a session-level advisory lock: the other connections' transactions
    are this install's). The first error is raised once every connection has finished its batch."""
    extra: list[asyncpg.Connection] = []
    await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
    try:
        # (Made here, once: two batches making one schema at once collide on its name.)
        await conn.execute("SELECT cow._overlay_schemas()")
        for _ in range(workers.jobs - 1):
            extra.append(await workers.connect())
        results = await asyncio.gather(
            *(_batch_worker(c, batches, force) for c in (conn, *extra)), return_exceptions=True
        )
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)
        for c in extra:
            await c.close()
    for result in results:
        if isinstance(result, BaseException):
            raise result


async def _batch_worker(conn: asyncpg.Connection, batches: _Batches, force: bool) -> None:
    """Batches on one connection, each in one REPEATABLE READ transaction without the neighbours' triggers
    (cow._refresh_batch says why)."""
    try:
        while batches.todo and not batches.failed:
            chunk = batches.todo.popleft()
            async with conn.transaction(isolation="repeatable_read"):
                rows = await conn.fetch(
                    "SELECT * FROM cow._refresh_batch($1::oid[], $2, false)", chunk, force
                )
            batches.finished(chunk, (r[0] for r in rows))
    except BaseException:
        batches.failed = True
        raise


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
