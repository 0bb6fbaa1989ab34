"""Prometheus metrics of the proxy, in a registry of its own (``cowproxy_*`` names)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from proxy.tags import Tags

LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    10,
)


class _ConnectionStates(Collector):
    """Client and upstream connections by state, counted at scrape time from the live connections."""

    def __init__(self, states: Callable[[], Iterable[tuple[str, str]]]) -> None:
        self.states = states

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "cowproxy_connections", "Open connections by side and state", labels=["side", "state"]
        )
        counts: dict[tuple[str, str], int] = {}
        for key in self.states():
            counts[key] = counts.get(key, 0) + 1
        for side in ("client", "upstream"):
            for state in ("startup", "idle", "active", "idle_in_transaction", "draining"):
                counts.setdefault((side, state), 0)
        for (side, state), count in sorted(counts.items()):
            family.add_metric([side, state], count)
        yield family


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.connections_total = Counter(
            "cowproxy_client_connections", "Client connections accepted", registry=r
        )
        self.statements = Counter(
            "cowproxy_statements", "Statements relayed, by kind and tagging", ["kind", "tagged"], registry=r
        )
        self.writes = Counter(
            "cowproxy_writes", "Writing statements by table and kind", ["table", "kind"], registry=r
        )
        self.rewrites = Counter("cowproxy_rewrites", "Statements rewritten for CoW tables", registry=r)
        self.errors = Counter(
            "cowproxy_errors",
            "ErrorResponses sent to clients, by SQLSTATE class",
            ["sqlstate_class"],
            registry=r,
        )
        self.bytes = Counter("cowproxy_bytes", "Bytes relayed", ["direction"], registry=r)
        self.latency = Histogram(
            "cowproxy_query_duration_seconds",
            "Time from a query (or Sync) to its ReadyForQuery",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.parse_cache = Counter(
            "cowproxy_parse_cache_lookups", "SQL analysis cache lookups", ["result"], registry=r
        )
        self.injections = Counter(
            "cowproxy_session_switches", "cow.use_session calls injected, by tagging", ["tagged"], registry=r
        )
        self.bytes_up = self.bytes.labels("client_to_server")
        self.bytes_down = self.bytes.labels("server_to_client")
        self.statement_children: dict[tuple[str, bool], Any] = {}
        self._cache = (self.parse_cache.labels("hit"), self.parse_cache.labels("miss"))

    def watch_connections(self, states: Callable[[], Iterable[tuple[str, str]]]) -> None:
        self.registry.register(_ConnectionStates(states))

    def hooks(self) -> ConnectionHooks:
        return ConnectionHooks(self)


class ConnectionHooks:
    """The relay's ``Hooks``, with label children cached per process."""

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics
        self._statement_children = metrics.statement_children

    def statement(self, kind: str, tagged: bool) -> None:
        key = (kind, tagged)
        child = self._statement_children.get(key)
        if child is None:
            child = self.m.statements.labels(kind, "true" if tagged else "false")
            self._statement_children[key] = child
        child.inc()

    def write(self, table: str, kind: str) -> None:
        self.m.writes.labels(table, kind).inc()

    def rewrite(self) -> None:
        self.m.rewrites.inc()

    def error(self, sqlstate: str) -> None:
        self.m.errors.labels(sqlstate[:2]).inc()

    def parse_cache(self, hit: bool) -> None:
        self.m._cache[0 if hit else 1].inc()

    def latency(self, seconds: float) -> None:
        self.m.latency.observe(seconds)

    def tags_applied(self, tags: Tags) -> None:
        self.m.injections.labels("true" if tags.tagged else "false").inc()
