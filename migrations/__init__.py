"""The copy-on-write layer: overlay views, changes tables and session functions inside PostgreSQL."""

from migrations.layer import InstallResult, install_layer, installed_version, migrations, uninstall_layer

__all__ = ["InstallResult", "install_layer", "installed_version", "migrations", "uninstall_layer"]
