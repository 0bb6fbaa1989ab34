"""The CoW catalog shared by the connections of one proxy process.

Each tagged connection needs the catalog of its database (``proxy.sql.CATALOG_QUERY``: every enabled table's
columns, keys and references). Read per connection, a database of 830 tables cost every new connection the
query and its decoding, and every connection its own analysis cache entries (the analyzer's cache is keyed
by the catalog object). Here one catalog is kept per (database, user) with the version it was read at
(``CATALOG_VERSION_QUERY``): a connection that reads the same version takes the catalog already read, so a
connection's start costs one small version query, and after app DDL only the first connection that sees
the new version reads the catalog again, and only the documents of the tables whose registry stamps
changed (``CATALOG_DELTA_QUERY``; the rest come from the latest catalog read). The user is part of the key
because what the catalog query sees may depend on privileges.

The decisions made against the latest catalog (``proxy.decisions``: texts the C relay may forward as they
are) are kept with it: a decision is a property of the text and the catalog alone, so a new connection
hands the C relay every text another connection decided, instead of handing each new text back to Python
once per connection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass
class SharedCatalogs:
    """The latest catalog read per (database, user), with its version (older versions are dropped: a
    connection still holding one keeps its object)."""

    _latest: dict[tuple[str, str], tuple[str, Any]] = field(default_factory=dict)
    # The decisions made against each key's latest catalog: (that catalog, its table).
    _decisions: dict[tuple[str, str], tuple[Any, Any]] = field(default_factory=dict)
    loads: int = 0  # catalogs read (put) so far
    hits: int = 0  # connections that took one already read

    def store(self, database: str, user: str) -> CatalogStore:
        return CatalogStore(self, (database, user))

    def get(self, key: tuple[str, str], version: str) -> Any | None:
        found = self._latest.get(key)
        if found is None or found[0] != version:
            return None
        self.hits += 1
        return found[1]

    def put(self, key: tuple[str, str], version: str, catalog: Any) -> None:
        self.loads += 1
        self._latest[key] = (version, catalog)

    def latest(self, key: tuple[str, str]) -> Any | None:
        """The latest catalog read, whatever its version: a reload reads only what changed since."""
        found = self._latest.get(key)
        return None if found is None else found[1]

    def decisions(self, key: tuple[str, str], catalog: Any, make: Callable[[], T]) -> T:
        """The decisions table of ``catalog`` (``make`` makes an empty one): shared when it is the key's
        latest catalog (one table per catalog object: a new catalog starts an empty one), else a table of
        the caller's own (a connection still on an older catalog, or one made without a store)."""
        found = self._decisions.get(key)
        if found is not None and found[0] is catalog:
            table: T = found[1]
            return table
        latest = self._latest.get(key)
        table = make()
        if latest is not None and latest[1] is catalog:
            self._decisions[key] = (catalog, table)
        return table


@dataclass(frozen=True)
class CatalogStore:
    """One connection's view of ``SharedCatalogs``: its (database, user)."""

    shared: SharedCatalogs
    key: tuple[str, str]

    def get(self, version: str | None) -> Any | None:
        return None if version is None else self.shared.get(self.key, version)

    def put(self, version: str | None, catalog: Any) -> None:
        if version is not None:
            self.shared.put(self.key, version, catalog)

    def latest(self) -> Any | None:
        return self.shared.latest(self.key)

    def decisions(self, catalog: Any, make: Callable[[], T]) -> T:
        return self.shared.decisions(self.key, catalog, make)


def private_store() -> CatalogStore:
    """A store shared with nobody (a relay made without one: unit tests)."""
    return SharedCatalogs().store("", "")
