"""The proxy's configuration: flags over a TOML file, parsed once into a frozen object."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from proxy.errors import ConfigError


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_address(value: str, what: str, default_host: str = "127.0.0.1") -> Address:
    text = value.strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    host = host.strip("[]") or default_host
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(f"{what}: expected HOST:PORT, got {value!r}") from None
    if not 0 <= number <= 65535:
        raise ConfigError(f"{what}: port {number} out of range")
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
    upstream_tls: str = "disable"  # disable | prefer | require
    max_message_size: int = 1024 * 1024 * 1024 - 1
    drain_timeout: float = 30.0
    connect_timeout: float = 10.0
    parse_cache_size: int = 4096
    log_format: str = "logfmt"  # logfmt | json
    log_level: str = "info"


_ADDRESSES = {"upstream", "listen", "metrics", "admin"}
_UPSTREAM_TLS = ("disable", "prefer", "require")


def build_config(flags: dict[str, Any], file: str | None = None) -> ProxyConfig:
    """Merge a TOML file (its top level or a ``[proxy]`` table) with flags; flags win (None = unset)."""
    values: dict[str, Any] = {}
    if file:
        try:
            data = tomllib.loads(Path(file).read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config file {file}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {file}: {exc}") from None
        table = data.get("proxy", data)
        if not isinstance(table, dict):
            raise ConfigError(f"config file {file}: [proxy] must be a table")
        values.update({k.replace("-", "_"): v for k, v in table.items()})
    values.update({k: v for k, v in flags.items() if v is not None})
    known = {f.name for f in fields(ProxyConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
    if "upstream" not in values:
        raise ConfigError("no upstream: pass --upstream HOST:PORT or set upstream in the config file")
    for name in _ADDRESSES & set(values):
        if not isinstance(values[name], str):
            raise ConfigError(f"{name}: expected a 'HOST:PORT' string")
        values[name] = parse_address(values[name], name)
    if values.get("upstream_tls", "disable") not in _UPSTREAM_TLS:
        raise ConfigError(f"upstream_tls must be one of {', '.join(_UPSTREAM_TLS)}")
    if values.get("log_format", "logfmt") not in ("logfmt", "json"):
        raise ConfigError("log_format must be logfmt or json")
    if bool(values.get("tls_cert")) != bool(values.get("tls_key")):
        raise ConfigError("--tls-cert and --tls-key go together")
    for name in ("max_message_size", "parse_cache_size"):
        if name in values and (not isinstance(values[name], int) or values[name] < 1):
            raise ConfigError(f"{name} must be a positive integer")
    for name in ("drain_timeout", "connect_timeout"):
        if name in values and (not isinstance(values[name], int | float) or values[name] < 0):
            raise ConfigError(f"{name} must be a non-negative number of seconds")
    return ProxyConfig(**values)
