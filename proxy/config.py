"""The proxy's configuration: flags over a TOML file, parsed once into a frozen object."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from proxy.errors import ConfigError
from proxy.sql.policy import DEFAULT_POLICY, Policy

# Whether server connections are reused when neither the flag nor the config file says (docs/proxy.md,
# "Why it is off by default"): flipping this flips the CLI's and the file's default, which both leave unset.
SERVER_REUSE_DEFAULT = False


@dataclass(frozen=True)
class Address:
    """A TCP ``host:port``, or, when ``host`` is an absolute directory, a Unix socket in it.

    The socket convention is libpq's and PgBouncer's: directory ``/run/pg`` and port 5432 mean the socket
    ``/run/pg/.s.PGSQL.5432``, so ``psql -h /run/pg -p 5432`` reaches it.
    """

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def unix_path(self) -> str | None:
        return f"{self.host.rstrip('/') or ''}/.s.PGSQL.{self.port}" if self.host.startswith("/") else None


def parse_address(value: str, what: str, default_host: str = "127.0.0.1", *, unix: bool = False) -> Address:
    text = value.strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    host = host.strip("[]") or default_host
    expected = "HOST:PORT or SOCKET_DIRECTORY:PORT" if unix else "HOST:PORT"
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(f"{what}: expected {expected}, got {value!r}") from None
    if not 0 <= number <= 65535:
        raise ConfigError(f"{what}: port {number} out of range")
    if host.startswith("/"):
        if not unix:
            raise ConfigError(f"{what}: expected {expected}, got {value!r}")
        if number == 0:
            raise ConfigError(f"{what}: a Unix socket needs a port number (it names the socket file)")
    return Address(host, number)


@dataclass(frozen=True)
class ProxyConfig:
    upstream: Address
    listen: Address = Address("127.0.0.1", 6432)
    metrics: Address | None = None
    admin: Address | None = None
    admin_token: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    upstream_tls: str = "disable"  # disable | prefer | require | verify-ca | verify-full (libpq's sslmode)
    upstream_tls_ca: str | None = None  # CA file for verify-*; None: the system's trust store
    upstream_tls_cert: str | None = None  # client certificate the proxy shows PostgreSQL
    upstream_tls_key: str | None = None
    max_message_size: int = 1024 * 1024 * 1024 - 1
    drain_timeout: float = 30.0
    connect_timeout: float = 10.0
    parse_cache_size: int = 4096
    log_format: str = "logfmt"  # logfmt | json
    log_level: str = "info"
    fast_relay: bool = True  # untagged connections on the C relay thread, when proxy._fastrelay is built
    workers: int = 1  # processes sharing the listen port (SO_REUSEPORT); metrics on consecutive ports
    state_dsn: str | None = None  # where routes are shared by workers and replicas (cow.proxy_routes)
    session_allow: Policy = DEFAULT_POLICY  # rules lifted for tagged connections (proxy/sql/policy.py)
    bind_secret_file: str | None = None  # where the layer's binding secret is (else env COW_BIND_SECRET)
    # Read traces (proxy/reads.py): recorded into cow.reads of each client's database, through connections
    # made with this DSN's host and role (the database replaced); None: no recording.
    reads_dsn: str | None = None
    reads_queue: int = 50_000  # records waiting to be written; more are dropped (and counted)
    # Server connections reused across client connections (proxy/pool.py; docs/proxy.md, "Server connections
    # reused"): SERVER_REUSE_DEFAULT is the one place its default is decided.
    server_reuse: bool = SERVER_REUSE_DEFAULT
    server_idle_max: int = 100  # idle server connections kept in all
    server_idle_per_startup: int = 20  # idle ones kept per forwarded startup (user, database, parameters)
    server_idle_timeout: float = 60.0  # seconds an idle one is kept
    server_lifetime: float = 3600.0  # seconds after its start a server connection is no longer reused
    server_check_delay: float = 30.0  # seconds idle after which one is checked before reuse (0: always)
    server_round_robin: bool = False  # give out the longest idle one first (FIFO) instead of the newest
    # The secret itself, read once at startup (never from the TOML or a flag: it would show in ps and files).
    bind_secret: str | None = field(default=None, repr=False)


_ADDRESSES = {"upstream", "listen", "metrics", "admin"}
_UNIX_OK = {"upstream", "listen"}  # a directory instead of a host: a Unix socket
_UPSTREAM_TLS = ("disable", "prefer", "require", "verify-ca", "verify-full")
_VERIFY = ("verify-ca", "verify-full")


BIND_SECRET_ENV = "COW_BIND_SECRET"
MIN_SECRET = 16  # the layer refuses shorter ones


def build_config(
    flags: dict[str, Any], file: str | None = None, environ: Mapping[str, str] | None = None
) -> ProxyConfig:
    """Merge a TOML file (its top level or a ``[proxy]`` table) with flags; flags win (None = unset).
    ``environ`` (default ``os.environ``) gives ``COW_BIND_SECRET`` when no ``bind_secret_file`` is set."""
    values: dict[str, Any] = _read_file(file) if file else {}
    values.update({k: v for k, v in flags.items() if v is not None})
    known = {f.name for f in fields(ProxyConfig)} - {"bind_secret"}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
    if "upstream" not in values:
        raise ConfigError("no upstream: pass --upstream HOST:PORT or set upstream in the config file")
    for name in _ADDRESSES & set(values):
        if not isinstance(values[name], str):
            raise ConfigError(f"{name}: expected a 'HOST:PORT' string")
        values[name] = parse_address(values[name], name, unix=name in _UNIX_OK)
    _check_upstream_tls(values)
    _check_tls_files(values)
    if values.get("log_format", "logfmt") not in ("logfmt", "json"):
        raise ConfigError("log_format must be logfmt or json")
    _check_workers(values)
    _check_sessions(values, os.environ if environ is None else environ)
    _check_scalars(values)
    return ProxyConfig(**values)


def _read_file(file: str) -> dict[str, Any]:
    try:
        data = tomllib.loads(Path(file).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {file}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {file}: {exc}") from None
    table = data.get("proxy", data)
    if not isinstance(table, dict):
        raise ConfigError(f"config file {file}: [proxy] must be a table")
    return {k.replace("-", "_"): v for k, v in table.items()}


def _check_tls_files(values: dict[str, Any]) -> None:
    if bool(values.get("tls_cert")) != bool(values.get("tls_key")):
        raise ConfigError("--tls-cert and --tls-key go together")
    for name in ("tls_cert", "tls_key", "upstream_tls_ca", "upstream_tls_cert", "upstream_tls_key"):
        if values.get(name) is not None:
            _check_readable(name, values[name])


def _check_scalars(values: dict[str, Any]) -> None:
    """Connection strings, sizes, flags and timeouts: the types a TOML file may get wrong."""
    for name in ("state_dsn", "reads_dsn"):
        if values.get(name) is not None and not isinstance(values[name], str):
            raise ConfigError(f"{name}: expected a connection string")
    for name in ("max_message_size", "parse_cache_size", "reads_queue"):
        if name in values and (not isinstance(values[name], int) or values[name] < 1):
            raise ConfigError(f"{name} must be a positive integer")
    for name in ("server_idle_max", "server_idle_per_startup"):
        if name in values and (
            not isinstance(values[name], int) or isinstance(values[name], bool) or values[name] < 0
        ):
            raise ConfigError(f"{name} must be a non-negative integer")
    for name in ("fast_relay", "server_reuse", "server_round_robin"):
        if name in values and not isinstance(values[name], bool):
            raise ConfigError(f"{name} must be true or false")
    for name in ("drain_timeout", "connect_timeout", "server_check_delay"):
        if name in values and (not isinstance(values[name], int | float) or values[name] < 0):
            raise ConfigError(f"{name} must be a non-negative number of seconds")
    for name in ("server_idle_timeout", "server_lifetime"):
        if name in values and (not isinstance(values[name], int | float) or values[name] <= 0):
            raise ConfigError(f"{name} must be a positive number of seconds")


def _check_sessions(values: dict[str, Any], environ: Mapping[str, str]) -> None:
    """What tagged connections may send, and the secret that binds them."""
    if "session_allow" in values:
        values["session_allow"] = _session_allow(values["session_allow"])
    secret = _bind_secret(values.get("bind_secret_file"), environ)
    if secret is not None:
        values["bind_secret"] = secret


def _bind_secret(path: Any, environ: Mapping[str, str]) -> str | None:
    """The binding secret from ``bind_secret_file`` (first line, trimmed), else from ``COW_BIND_SECRET``."""
    if path is None:
        secret = environ.get(BIND_SECRET_ENV, "").strip() or None
        what = BIND_SECRET_ENV
    else:
        if not isinstance(path, str) or not path:
            raise ConfigError("bind_secret_file: expected a file name")
        try:
            with open(path, encoding="utf-8") as handle:
                secret = handle.readline().strip() or None
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise ConfigError(f"bind_secret_file: cannot read {path}: {reason}") from None
        what = f"bind_secret_file {path}"
        if secret is None:
            raise ConfigError(f"{what} is empty")
    if secret is not None and len(secret) < MIN_SECRET:
        raise ConfigError(f"{what}: a binding secret has at least {MIN_SECRET} characters")
    return secret


def _session_allow(value: Any) -> Policy:
    """A list of rule names (TOML), or the flag's comma-separated words, into the policy."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise ConfigError('session_allow: expected a list of rule names, e.g. ["ddl", "do"]')
    names: list[object] = []
    for item in value:
        if isinstance(item, str):
            names.extend(part.strip() for part in item.split(",") if part.strip())
        else:
            names.append(item)  # refused by name below
    return Policy.from_names(names)


def _check_workers(values: dict[str, Any]) -> None:
    workers = values.get("workers", 1)
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= 64:
        raise ConfigError("workers must be an integer from 1 to 64")
    if workers == 1:
        return
    listen = values.get("listen", Address("127.0.0.1", 6432))
    if listen.unix_path is not None or listen.port == 0:
        # The kernel spreads connections over the processes of one TCP port only (SO_REUSEPORT).
        raise ConfigError("workers > 1 needs a TCP listen address with a fixed port")
    metrics = values.get("metrics")
    if metrics is not None and metrics.port == 0:
        raise ConfigError("workers > 1 needs a fixed metrics port (worker i serves it on PORT + i)")
    admin = values.get("admin")
    if admin is not None and admin.port == 0:
        raise ConfigError("workers > 1 needs a fixed admin port (worker i serves it on PORT + i)")
    if metrics is not None and admin is not None and abs(metrics.port - admin.port) < workers:
        raise ConfigError(f"workers = {workers}: the metrics ports and the admin ports (PORT + i) overlap")
    if admin is not None and not values.get("state_dsn"):
        # A route made through one worker's admin API would be obeyed by that worker only.
        raise ConfigError("workers > 1 with an admin API needs state_dsn (routes shared in the database)")


def _check_upstream_tls(values: dict[str, Any]) -> None:
    mode = values.get("upstream_tls", "disable")
    if mode not in _UPSTREAM_TLS:
        raise ConfigError(f"upstream_tls must be one of {', '.join(_UPSTREAM_TLS)}")
    if values["upstream"].unix_path is not None and mode != "disable":
        # As libpq: no TLS over a Unix socket (PostgreSQL does not offer it there).
        raise ConfigError("upstream_tls needs a TCP upstream (HOST:PORT), not a Unix socket")
    if bool(values.get("upstream_tls_cert")) != bool(values.get("upstream_tls_key")):
        raise ConfigError("--upstream-tls-cert and --upstream-tls-key go together")
    # A CA without verification would look like protection that is not there (libpq's require + root.crt
    # quietly verifies; we would rather say so).
    if values.get("upstream_tls_ca") and mode not in _VERIFY:
        raise ConfigError(f"--upstream-tls-ca needs --upstream-tls verify-ca or verify-full (got {mode})")
    if values.get("upstream_tls_cert") and mode == "disable":
        raise ConfigError("--upstream-tls-cert/--upstream-tls-key need --upstream-tls other than disable")


def _check_readable(name: str, value: Any) -> None:
    """Fail at startup, not at the first connection, for a TLS file that is missing or unreadable."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{name}: expected a file name")
    try:
        with open(value, "rb"):
            pass
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read {value}: {exc.strerror}") from None
