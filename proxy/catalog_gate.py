"""The catalog gate: one connection's CoW catalog, and the version checks and loads that keep it current.

A tagged connection's rewrites read the catalog of the CoW tables. It is read when the connection first
joins a session (the process's copy at that version when another connection has read it), and checked
again before a statement that depends on it, since app DDL on another connection may have changed the
tables since. Checks and loads are statements the proxy sends ahead of the client's, through the relay's
injected batches (``proxy.injected.InjectedBatches``); the gate knows nothing else of the relay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.analysis import ProxyAnalyzer
from proxy.catalogs import CatalogStore
from proxy.injected import Done, InjectedBatches, Rows
from proxy.replies import Kind
from proxy.sql import Catalog

CATALOG_STATEMENT = "__cowproxy_catalog"
CATALOG_VERSION_STATEMENT = "__cowproxy_catalog_version"


class CatalogGate:
    """One connection's catalog: what it is, at which version, and whether it is being read or checked."""

    def __init__(self, analysis: ProxyAnalyzer, catalogs: CatalogStore, injector: InjectedBatches) -> None:
        self.analysis = analysis
        self.catalogs = catalogs  # the catalog read by other connections (same database)
        self.injector = injector
        self.catalog: Any = None
        self.loading = False
        self.version: str | None = None  # CATALOG_VERSION_QUERY when the catalog was read
        self.checked = False  # the catalog was found current for the statement being prepared
        self.suspect = False  # a rewritten statement failed as a stale catalog would make it fail
        self.checks = 0  # version queries sent for catalog-dependent statements
        self.loads = 0

    def at_rest(self) -> bool:
        """Nothing of the gate's in flight: the catalog is not being read."""
        return not self.loading

    def wanted(self) -> bool:
        return self.analysis.catalog_query is not None and not self.loading

    def can_check(self, status: str) -> bool:
        # Not in a failed transaction block (``status`` E): the check would fail, and so will the statement.
        return (
            self.catalog is not None
            and self.wanted()
            and self.analysis.catalog_version_query is not None
            and status != "E"
        )

    def queue_first(self, forward: bool, standalone: bool, finished: Done) -> tuple[bytes, Done]:
        """Queue the connection's first read of the catalog (after its join); return the last Close and the
        callback of the batch's end, for the caller to send. The version first when there is a version
        query: when another connection has read the catalog at that version, it is taken as is (no
        catalog query); otherwise a second round trip reads it (``_versioned``)."""
        version_query = self.analysis.catalog_version_query
        if version_query is None:
            return self.queue_load(forward), finished
        self.loading = True
        version: Rows = []
        close_last = self.injector.queue_query(
            CATALOG_VERSION_STATEMENT, version_query, forward, capture=version
        )

        def on_done(ok: bool) -> None:
            self._versioned(ok, version, standalone, finished)

        return close_last, on_done

    def _versioned(self, ok: bool, version: Rows, standalone: bool, finished: Done) -> None:
        """The first catalog version of the connection is in: take the shared catalog, or read it."""
        current = version[0][0] if ok and version else None
        shared = self.catalogs.get(current) if ok else None
        if shared is not None or not ok:
            self.loading = False
            self.catalog = shared if shared is not None else self.analysis.empty_catalog()
            self.version = current
            self.checked = ok
            finished(ok)
            return
        self.injector.finish(self.queue_load(not standalone), standalone, finished)

    def queue_load(self, forward: bool) -> bytes:
        """Inject the catalog's version, then the catalog (in that order: a change committed in between
        only costs a reload at the next check). Returns the last Close, for the caller to send."""
        query, version_query = self.analysis.catalog_query, self.analysis.catalog_version_query
        assert query is not None
        self.loading = True
        self.loads += 1
        rows: Rows = []
        version: Rows = []
        held = self._held_catalog()
        params: tuple[str, ...] = ()
        if held is not None and self.analysis.catalog_delta_query is not None:
            # Its stamps as a text[] literal (digits and colons: nothing to quote).
            query, params = self.analysis.catalog_delta_query, ("{" + ",".join(held.by_stamp) + "}",)
        else:
            held = None

        def done(ok: bool) -> None:
            self.loading = False
            empty = self.analysis.empty_catalog()
            self.catalog = self.analysis.catalog_from_rows(rows, held) if ok else empty
            self.version = version[0][0] if ok and version else None
            self.checked = ok
            if ok:
                self.catalogs.put(self.version, self.catalog)

        injector = self.injector
        if version_query is not None:
            close = injector.queue_query(CATALOG_VERSION_STATEMENT, version_query, forward, capture=version)
            injector.send(close, Kind.CLOSE, forward)
        return injector.queue_query(
            CATALOG_STATEMENT, query, forward, params=params, on_done=done, capture=rows
        )

    def _held_catalog(self) -> Catalog | None:
        """The catalog a reload starts from: the process's latest for this database, else the connection's."""
        for held in (self.catalogs.latest(), self.catalog):
            if isinstance(held, Catalog) and held.by_stamp:
                return held
        return None

    def check(self, trigger: bytes, release: Callable[[], None]) -> None:
        """Queue the catalog's version query ahead of the trigger (and a reload if it changed); hold.

        Like a join: its own batch at a safe point, followed by Flush inside a batch. The caller holds the
        trigger, replayed (``release``) once the catalog is known to be current.
        """
        assert self.analysis.catalog_version_query is not None
        injector = self.injector
        standalone = injector.start(trigger)
        if standalone is None:
            return
        forward = not standalone
        self.checks += 1
        version: Rows = []

        def released(ok: bool) -> None:
            self.checked = True  # also after a failure: the statement then meets the server's error
            release()

        def checked(ok: bool) -> None:
            current = version[0][0] if ok and version else None
            if not ok or current == self.version:
                released(ok)
                return
            shared = self.catalogs.get(current)
            if shared is not None:  # another connection has read it at this version
                self.catalog, self.version = shared, current
                released(ok)
                return
            # Changed: a second round trip reads the catalog (still holding the client).
            injector.finish(self.queue_load(forward), standalone, released)

        close = injector.queue_query(
            CATALOG_VERSION_STATEMENT, self.analysis.catalog_version_query, forward, capture=version
        )
        injector.finish(close, standalone, checked)
