"""The copy-on-write layer: overlay views, changes tables and session functions inside PostgreSQL."""

from migrations.layer import (
    InstallResult,
    Repeatable,
    install_layer,
    installed_version,
    migrations,
    repeatables,
    uninstall_layer,
)

__all__ = [
    "InstallResult",
    "Repeatable",
    "install_layer",
    "installed_version",
    "migrations",
    "repeatables",
    "uninstall_layer",
]
