"""The binding secret (docs/threat-model.md): what the proxy proves to ``cow.bind_session`` to bind a backend
to its session. The database keeps only its SHA-256 (``cow.bind_secret``, readable by the layer's owner only),
so a secret is shown once, when it is made; a lost one is replaced with ``cowproxy secret --rotate``."""

from __future__ import annotations

import hashlib
import os
import secrets
from datetime import datetime
from pathlib import Path

import asyncpg

from migrations.errors import LayerError, NotInstalledError, PermissionDeniedError

SECRET_BYTES = 32  # token_urlsafe: 43 characters


def new_secret() -> str:
    return secrets.token_urlsafe(SECRET_BYTES)


def secret_hash(secret: str) -> str:
    """What the database keeps of ``secret`` (the same as the layer's SQL computes)."""
    return hashlib.sha256(secret.encode()).hexdigest()


async def _owner_call(conn: asyncpg.Connection, what: str, sql: str, *args: object) -> object:
    if not await conn.fetchval("SELECT to_regclass('cow.bind_secret') IS NOT NULL"):
        if await conn.fetchval("SELECT to_regclass('cow.migrations') IS NULL"):
            raise NotInstalledError("the cowproxy layer is not installed in this database")
        raise LayerError("the cowproxy layer predates the binding secret: run cowproxy install to upgrade it")
    try:
        return await conn.fetchval(sql, *args)
    except asyncpg.InsufficientPrivilegeError as exc:
        raise PermissionDeniedError(f"{what} needs the layer's owner or a superuser: {exc}") from exc


async def set_secret(conn: asyncpg.Connection, secret: str) -> None:
    await _owner_call(conn, "setting the binding secret", "SELECT cow.set_bind_secret($1)", secret)


async def rotate_secret(conn: asyncpg.Connection) -> str:
    """A new secret, stored (as its hash) in place of the old one, which stops binding at once."""
    secret = new_secret()
    await set_secret(conn, secret)
    return secret


async def secret_set_at(conn: asyncpg.Connection) -> datetime | None:
    """When the current secret was set (None: none is)."""
    found = await _owner_call(conn, "reading the binding secret", "SELECT max(set_at) FROM cow.bind_secret")
    assert found is None or isinstance(found, datetime)
    return found


async def check_secret(conn: asyncpg.Connection, secret: str) -> bool:
    """Whether ``secret`` is the current one."""
    stored = await _owner_call(conn, "reading the binding secret", "SELECT hash FROM cow.bind_secret")
    return stored is not None and secrets.compare_digest(str(stored), secret_hash(secret))


def write_secret_file(path: Path, secret: str) -> None:
    """``secret`` and a newline in ``path``, readable by its owner only (replaced atomically)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secret + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise LayerError(f"cannot write the binding secret to {path}: {exc.strerror or exc}") from exc


def read_secret_file(path: Path) -> str:
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise LayerError(f"cannot read the binding secret from {path}: {exc}") from exc
    if not secret:
        raise LayerError(f"{path} is empty: no binding secret in it")
    return secret
