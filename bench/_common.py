"""What the layer benchmarks share (bench/layer.py, bench/layer_writes.py, bench/unique_checks.py): the server
(an embedded PostgreSQL, or ``--dsn``), scratch databases, the ``items`` table and other sessions' changes to
it, progress lines and the one-line error exit.

A script imports from this module before the project's packages: Python put the script's folder on the
import path, which is how this module is found, and this module takes the folder off again, since
bench/proxy.py and bench/scoring.py are named like the packages.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]

import asyncpg  # noqa: E402

import migrations.layer as layer_mod  # noqa: E402
from migrations.embedded import embedded_postgres  # noqa: E402
from migrations.errors import LayerError  # noqa: E402

ROOT = os.path.dirname(HERE)

# A benchmark stopped with SIGTERM (kill, pkill, a CI timeout) unwinds like Ctrl-C, so that its context
# managers stop the proxies and the embedded server it started instead of leaving them running.
signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def sibling(name: str) -> ModuleType:
    """bench/<name>.py as the module ``bench_<name>``: loaded by path (this folder is off the import path, and
    its proxy.py is named like the package), and registered, since its dataclasses look their module up."""
    alias = f"bench_{name}"
    if alias not in sys.modules:
        spec = importlib.util.spec_from_file_location(alias, os.path.join(HERE, f"{name}.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[alias] = module
        spec.loader.exec_module(module)
    return sys.modules[alias]


ITEMS_DDL = """
CREATE TABLE {schema}.items (
    id bigint PRIMARY KEY,
    grp int NOT NULL,
    name text NOT NULL,
    qty int NOT NULL DEFAULT 0,
    note text
)
"""
ITEMS_FILL = """
INSERT INTO {schema}.items (id, grp, name, qty, note)
SELECT g, g % 1000, 'item ' || g, g % 97, CASE WHEN g % 3 = 0 THEN 'n' || g END
FROM generate_series(1, $1::bigint) AS g
"""
UPDATE_RANGE = "UPDATE items SET qty = qty + 1, note = 'other' WHERE id BETWEEN $1 AND $2"
DELETE_RANGE = "DELETE FROM items WHERE id BETWEEN $1 AND $2"
INSERT_RANGE = "INSERT INTO items (id, grp, name) SELECT g, 7, 'other' FROM generate_series($1::bigint, $2) g"
UPDATE_ANY = "UPDATE items SET qty = qty + 1, note = 'bench' WHERE id = ANY ($1::bigint[])"
DELETE_ANY = "DELETE FROM items WHERE id = ANY ($1::bigint[])"
INSERT_ANY = "INSERT INTO items (id, grp, name) SELECT g, 8, 'bench' FROM unnest($1::bigint[]) g"


def argument_parser(doc: str | None, rows: int) -> argparse.ArgumentParser:
    """The options every layer benchmark starts with: ``--rows`` (its own default) and ``--dsn``."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0] if doc else None)
    p.add_argument("--rows", type=int, default=rows)
    p.add_argument("--dsn", default=None, help="server to use (default: start an embedded PostgreSQL)")
    return p


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def log_round(r: int, rounds: int, started: float) -> None:
    """Progress of a measuring loop whose round 0 warms up."""
    log(f"round {r}/{rounds} in {time.perf_counter() - started:.1f} s" + ("" if r else " (warm-up)"))


def run_main(script: str, main: Coroutine[Any, Any, None]) -> int:
    """Runs a benchmark's main; a server or layer error is one line on stderr and exit code 1."""
    try:
        asyncio.run(main)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, LayerError) as exc:
        print(f"{script}: {exc}", file=sys.stderr)
        return 1
    return 0


def cpu_ns(pid: int) -> int | None:
    """CPU time of a local backend so far (None: not on this machine or not readable): unlike wall time it
    does not count waiting for a core that another process holds, nor the client's share."""
    try:
        with open(f"/proc/{pid}/schedstat", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def with_database(dsn: str, database: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path="/" + database))


def install_layer_cli(
    dsn: str, checkout: str | os.PathLike[str] = ROOT, python: str = sys.executable
) -> None:
    """`cowproxy install --dsn DSN` as ``checkout``'s CLI runs it (its layer files; ``python``: its venv)."""
    subprocess.run(
        [python, "-m", "cowproxy", "install", "--dsn", dsn],
        check=True,
        capture_output=True,
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(checkout)},
    )


@contextlib.contextmanager
def server(dsn: str | None, shared_buffers: str) -> Iterator[str]:
    """DSN of the maintenance database of the server to use: ``dsn``, or an embedded PostgreSQL."""
    if dsn:
        yield dsn
        return
    with embedded_postgres(settings={"shared_buffers": shared_buffers}) as srv:
        yield srv.dsn()


async def fetchval(dsn: str, sql: str, *args: Any) -> Any:
    """One value, on a connection of its own."""
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


async def _admin(admin_dsn: str, statements: list[str]) -> None:
    conn = await asyncpg.connect(admin_dsn)
    try:
        for sql in statements:
            await conn.execute(sql)
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def scratch_databases(
    admin_dsn: str, names: Sequence[str], *, keep: bool = False
) -> AsyncIterator[list[str]]:
    """Databases ``names`` created afresh on the server (their DSNs), dropped at the end unless ``keep``."""
    await _admin(admin_dsn, [f'DROP DATABASE IF EXISTS "{n}"' for n in names])
    await _admin(admin_dsn, [f'CREATE DATABASE "{n}"' for n in names])
    try:
        yield [with_database(admin_dsn, n) for n in names]
    finally:
        if not keep:
            await _admin(admin_dsn, [f'DROP DATABASE IF EXISTS "{n}" WITH (FORCE)' for n in names])


@contextlib.asynccontextmanager
async def scratch_database(admin_dsn: str, name: str) -> AsyncIterator[str]:
    async with scratch_databases(admin_dsn, [name]) as (dsn,):
        yield dsn


async def create_items(
    conn: asyncpg.Connection, rows: int, schemas: Sequence[str] = ("public", "plain")
) -> None:
    """Table ``items`` of ``rows`` rows in each of ``schemas``, all alike."""
    for schema in schemas:
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        await conn.execute(ITEMS_DDL.format(schema=schema))
        await conn.execute(ITEMS_FILL.format(schema=schema), rows)


def split_changes(ids: Sequence[int], rows: int) -> tuple[list[int], list[int], list[int]]:
    """A session's mix of changes of ``items``: 80 % updates and 10 % deletes of ``ids`` (base rows), 10 %
    inserts of fresh ids above the table: (updates, deletes, inserts)."""
    k = len(ids)
    inserts = list(range(rows + 1, rows + 1 + k - k * 9 // 10))
    return list(ids[: k * 8 // 10]), list(ids[k * 8 // 10 : k * 9 // 10]), inserts


async def write_other_sessions(conn: asyncpg.Connection, rows: int, sessions: int, per: int) -> None:
    """Sessions ``other0``… with ``per`` changes of ``items`` each, the same mix in ranges of their own from
    the middle of the table (and inserts far above it)."""
    start = rows // 2
    for s in range(sessions):
        await conn.execute("SELECT cow.use_session($1)", f"other{s}")
        lo = start + s * per
        await conn.execute(UPDATE_RANGE, lo, lo + per * 8 // 10 - 1)
        await conn.execute(DELETE_RANGE, lo + per * 8 // 10, lo + per * 9 // 10 - 1)
        ins_lo = 3 * rows + s * per
        await conn.execute(INSERT_RANGE, ins_lo, ins_lo + per - per * 9 // 10 - 1)
    await conn.execute("SELECT cow.use_session(NULL)")


async def write_session(
    conn: asyncpg.Connection, session: str, changes: tuple[list[int], list[int], list[int]]
) -> None:
    """``changes`` (updates, deletes, inserts: see ``split_changes``) of ``items`` in ``session``."""
    updates, deletes, inserts = changes
    await conn.execute("SELECT cow.use_session($1)", session)
    await conn.execute(UPDATE_ANY, updates)
    await conn.execute(DELETE_ANY, deletes)
    await conn.execute(INSERT_ANY, inserts)
    await conn.execute("SELECT cow.use_session(NULL)")


Layer = tuple[list[layer_mod.Migration], list[layer_mod.Repeatable]]
_FILE = re.compile(r"^migrations/sql/(\d{4})_([a-z0-9_]+)\.sql$")
_REPEATABLE_FILE = re.compile(r"^migrations/sql/functions/(\d{2}_[a-z0-9_]+\.sql)$")


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", ROOT, *args], check=True, capture_output=True, text=True).stdout


def _stderr(exc: OSError | subprocess.CalledProcessError) -> str:
    err = getattr(exc, "stderr", None)
    text = err.decode(errors="replace") if isinstance(err, bytes) else err
    return (text or str(exc)).strip()


def baseline_layer(ref: str) -> Layer:
    """The numbered and repeatable SQL files as of git ref ``ref`` of this repository (a ref from before the
    repeatable files has none: its numbered files hold the functions)."""
    try:
        found = []
        repeatables = []
        for name in _git("ls-tree", "-r", "--name-only", ref, "migrations/sql/").split():
            m = _FILE.match(name)
            r = _REPEATABLE_FILE.match(name)
            if not (m or r):
                continue
            sql = _git("show", f"{ref}:{name}")
            if m:
                found.append(layer_mod.Migration(int(m.group(1)), m.group(2), sql))
            elif r:
                checksum = hashlib.sha256(sql.encode()).hexdigest()
                repeatables.append(layer_mod.Repeatable(r.group(1), sql, checksum))
    except (OSError, subprocess.CalledProcessError) as exc:
        raise LayerError(f"cannot read the migrations of {ref!r}: {_stderr(exc)}") from exc
    if not found:
        raise LayerError(f"no migrations at {ref!r}")
    return sorted(found, key=lambda m: m.version), sorted(repeatables, key=lambda r: r.name)


def this_layer() -> Layer:
    return layer_mod.migrations(), layer_mod.repeatables()


@contextlib.contextmanager
def installed_layer(files: Layer) -> Iterator[None]:
    """``install_layer`` installs ``files`` instead of this checkout's migrations while inside."""
    saved = layer_mod.migrations, layer_mod.repeatables
    layer_mod.migrations = lambda: files[0]
    layer_mod.repeatables = lambda: files[1]
    try:
        yield
    finally:
        layer_mod.migrations, layer_mod.repeatables = saved


@contextlib.contextmanager
def checkout(ref: str) -> Iterator[str]:
    """A temporary copy of this repository's tree at git ref ``ref`` (``git archive``: no worktree is
    registered, so an interrupted run leaves only a temporary folder); its path."""
    with tempfile.TemporaryDirectory(prefix="cowbench_ref_") as tmp:
        try:
            commit = _git("rev-parse", "--verify", f"{ref}^{{commit}}").strip()
            archive = subprocess.run(["git", "-C", ROOT, "archive", commit], check=True, capture_output=True)
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise LayerError(f"cannot check out {ref!r}: {_stderr(exc)}") from exc
        yield tmp
