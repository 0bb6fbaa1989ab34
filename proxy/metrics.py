"""Prometheus metrics of the proxy, in a registry of its own (``cowproxy_*`` names).

The relay counts into plain integers (a prometheus-client ``inc`` takes a lock and costs about a
microsecond; a round trip through the proxy makes several), and a collector turns them into metric
families when ``/metrics`` is scraped.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.protocol import ErrorFields
from proxy.sql import deparse
from proxy.tags import Tags

if TYPE_CHECKING:
    from proxy.fastrelay import FastCounts
    from proxy.reads import ReadRecorder

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
CONNECTION_STATES = ("startup", "idle", "active", "idle_in_transaction", "draining")
_K = TypeVar("_K")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.connections_total = 0
        self.statements: dict[tuple[str, bool], int] = {}
        self.writes: dict[tuple[str, str], int] = {}
        self.errors: dict[str, int] = {}
        self.rewrites = 0
        self.reruns = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self.switches: dict[bool, int] = {True: 0, False: 0}
        # The C relay's stays: connections given to it, and given back by (reason, type of the client message
        # it did not take or ""); with the statements of each relay, where a session's time goes.
        self.fast_adoptions = 0
        self.fast_handbacks: dict[tuple[str, str], int] = {}
        self.fast_requests: dict[str, int] = {}  # by answer: decision, hand back, void
        # Server connections (proxy/pool.py): opened, reused for another client, resets that failed (the
        # connection was closed), idle ones closed by reason; the idle ones right now come from watch_pool.
        self.servers_opened = 0
        self.servers_reused = 0
        self.server_reset_failures = 0
        self.servers_closed_idle: dict[str, int] = {}
        self._idle_servers: Callable[[], Mapping[str, int]] = dict
        self.fast_request_reasons: dict[str, int] = {}  # those answered hand back, by why (decide_for_fast)
        self.latency_counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.latency_sum = 0.0
        self._states: Callable[[], Iterable[tuple[str, str]]] = lambda: ()
        self._fast: Callable[[], FastCounts | None] = lambda: None
        self.reads: ReadRecorder | None = None  # set when read traces are recorded (--reads-dsn)
        self.registry.register(_Collector(self))

    def watch_connections(self, states: Callable[[], Iterable[tuple[str, str]]]) -> None:
        self._states = states

    def watch_pool(self, idle: Callable[[], Mapping[str, int]]) -> None:
        """Where the idle server connections per database come from."""
        self._idle_servers = idle

    def watch_fast(self, counts: Callable[[], FastCounts | None]) -> None:
        """Where the fast relay's counters come from (merged in at scrape time)."""
        self._fast = counts

    def count_handback(self, reason: str, untaken: int) -> None:
        key = (reason, chr(untaken) if untaken >= 0 else "")
        self.fast_handbacks[key] = self.fast_handbacks.get(key, 0) + 1

    def count_request(self, answer: str, reason: str = "") -> None:
        self.fast_requests[answer] = self.fast_requests.get(answer, 0) + 1
        if reason:
            self.fast_request_reasons[reason] = self.fast_request_reasons.get(reason, 0) + 1

    def count_error(self, sqlstate: str) -> None:
        key = sqlstate[:2]
        self.errors[key] = self.errors.get(key, 0) + 1

    def hooks(self) -> ConnectionHooks:
        return ConnectionHooks(self)


@dataclass(frozen=True)
class _Totals:
    """The counters of both relays at one scrape (the Python relay's plus the C relay's)."""

    fast_connections: int
    statements: dict[tuple[str, bool], int]
    writes: dict[tuple[str, str], int]
    errors: dict[str, int]
    latency_counts: list[int]
    latency_sum: float
    bytes_up: int
    bytes_down: int
    cache_hits: int
    rewrites: int
    fast_statements: Mapping[tuple[str, bool], int]  # (those of the C relay alone)


def _add(into: dict[_K, int], more: Mapping[_K, int]) -> dict[_K, int]:
    out = dict(into)
    for key, n in more.items():
        out[key] = out.get(key, 0) + n
    return out


def _totals(m: Metrics) -> _Totals:
    fast = m._fast()
    if fast is None:
        return _Totals(
            0,
            dict(m.statements),
            dict(m.writes),
            dict(m.errors),
            list(m.latency_counts),
            m.latency_sum,
            m.bytes_up,
            m.bytes_down,
            m.cache_hits,
            m.rewrites,
            {},
        )
    return _Totals(
        fast.connections,
        _add(m.statements, fast.statements),
        _add(m.writes, fast.writes),
        _add(m.errors, fast.errors),
        [a + b for a, b in zip(m.latency_counts, fast.latency_counts, strict=True)],
        m.latency_sum + fast.latency_sum,
        m.bytes_up + fast.bytes_up,
        m.bytes_down + fast.bytes_down,
        m.cache_hits + fast.decision_hits,
        m.rewrites + fast.rewrites,
        fast.statements,
    )


class _Collector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        totals = _totals(self.m)
        yield from _connection_metrics(self.m, totals)
        yield from _server_metrics(self.m)
        yield from _statement_metrics(self.m, totals)
        yield from _traffic_metrics(self.m, totals)
        yield _latency_metric(totals)
        yield from _read_metrics(self.m.reads)


def _connection_metrics(m: Metrics, totals: _Totals) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "cowproxy_fast_relay_connections",
        "Client connections relayed by the C relay thread right now",
        value=totals.fast_connections,
    )
    conns = GaugeMetricFamily(
        "cowproxy_connections", "Open connections by side and state", labels=["side", "state"]
    )
    counts: dict[tuple[str, str], int] = {
        (side, s): 0 for side in ("client", "upstream") for s in CONNECTION_STATES
    }
    for key in m._states():
        counts[key] = counts.get(key, 0) + 1
    for (side, state), count in sorted(counts.items()):
        conns.add_metric([side, state], count)
    yield conns
    yield CounterMetricFamily(
        "cowproxy_client_connections", "Client connections accepted", value=m.connections_total
    )
    yield CounterMetricFamily(
        "cowproxy_fast_adoptions", "Client connections given to the C relay", value=m.fast_adoptions
    )
    handbacks = CounterMetricFamily(
        "cowproxy_fast_handbacks",
        "Client connections the C relay gave back, by reason and the client message it did not take",
        labels=["reason", "message"],
    )
    for (reason, message), n in sorted(m.fast_handbacks.items()):
        handbacks.add_metric([reason, message], n)
    yield handbacks
    yield _by_label(
        "cowproxy_fast_requests",
        "Query texts of sessions the C relay asked Python to decide, by answer (decision: C took the Query; "
        "hand back: C gave the connection back at it; void: the connection had left C)",
        "answer",
        m.fast_requests,
    )
    yield _by_label(
        "cowproxy_fast_request_handbacks",
        "Requests of the C relay answered hand back, by why Python takes the Query itself (a join, a catalog "
        "read or check, a refusal, a path change or question, a tag map, a comment, reads recorded, ...)",
        "reason",
        m.fast_request_reasons,
    )


def _by_label(name: str, documentation: str, label: str, counts: dict[str, int]) -> Metric:
    """A counter with one label, a sample per value counted."""
    family = CounterMetricFamily(name, documentation, labels=[label])
    for value, n in sorted(counts.items()):
        family.add_metric([value], n)
    return family


def _server_metrics(m: Metrics) -> Iterator[Metric]:
    yield CounterMetricFamily(
        "cowproxy_server_connections_opened", "Server connections opened", value=m.servers_opened
    )
    yield CounterMetricFamily(
        "cowproxy_server_connections_reused",
        "Client connections given a reset idle server connection",
        value=m.servers_reused,
    )
    yield CounterMetricFamily(
        "cowproxy_server_reset_failures",
        "Resets of a used server connection that failed (it was closed)",
        value=m.server_reset_failures,
    )
    yield _by_label(
        "cowproxy_server_connections_closed_idle",
        "Pooled server connections closed, by reason (idle timeout, lifetime, pool full, shutdown, ...)",
        "reason",
        m.servers_closed_idle,
    )
    idle = GaugeMetricFamily(
        "cowproxy_server_connections_idle", "Reset server connections kept for reuse", labels=["database"]
    )
    for database, n in sorted(m._idle_servers().items()):
        idle.add_metric([database], n)
    yield idle


def _statement_metrics(m: Metrics, totals: _Totals) -> Iterator[Metric]:
    statements = CounterMetricFamily(
        "cowproxy_statements", "Statements relayed, by kind and tagging", labels=["kind", "tagged"]
    )
    for (kind, tagged), n in sorted(totals.statements.items()):
        statements.add_metric([kind, "true" if tagged else "false"], n)
    yield statements
    relayed = CounterMetricFamily(
        "cowproxy_relay_statements",
        "Statements relayed, by the relay that took them (python or c) and tagging",
        labels=["relay", "tagged"],
    )
    for relay, counts in (("python", m.statements), ("c", totals.fast_statements)):
        for tagged in (False, True):
            n = sum(n for (_, t), n in counts.items() if t is tagged)
            relayed.add_metric([relay, str(tagged).lower()], n)
    yield relayed
    writes = CounterMetricFamily(
        "cowproxy_writes",
        "Writing statements of tagged connections, by table and kind",
        labels=["table", "kind"],
    )
    for (table, kind), n in sorted(totals.writes.items()):
        writes.add_metric([table, kind], n)
    yield writes
    yield CounterMetricFamily(
        "cowproxy_rewrites", "Statements rewritten for copy-on-write tables", value=totals.rewrites
    )
    yield CounterMetricFamily(
        "cowproxy_reruns",
        "Statements run again after the layer's row-changed 40001 (proxy/rerun.py)",
        value=m.reruns,
    )
    errors = CounterMetricFamily(
        "cowproxy_errors", "ErrorResponses sent to clients, by SQLSTATE class", labels=["sqlstate_class"]
    )
    for cls, n in sorted(totals.errors.items()):
        errors.add_metric([cls], n)
    yield errors


def _traffic_metrics(m: Metrics, totals: _Totals) -> Iterator[Metric]:
    relayed = CounterMetricFamily("cowproxy_bytes", "Bytes relayed", labels=["direction"])
    relayed.add_metric(["client_to_server"], totals.bytes_up)
    relayed.add_metric(["server_to_client"], totals.bytes_down)
    yield relayed
    cache = CounterMetricFamily(
        "cowproxy_parse_cache_lookups",
        "SQL analysis cache lookups (tagged statements)",
        labels=["result"],
    )
    cache.add_metric(["hit"], totals.cache_hits)
    cache.add_metric(["miss"], m.cache_misses)
    yield cache
    switches = CounterMetricFamily(
        "cowproxy_session_switches", "cow.use_session calls injected, by tagging", labels=["tagged"]
    )
    switches.add_metric(["true"], m.switches[True])
    switches.add_metric(["false"], m.switches[False])
    yield switches
    yield _by_label(
        "cowproxy_deparse_fallbacks",
        "Rewritten statements written by pglast's printer because libpg_query's deparser could not take them "
        "(proxy/sql/deparse.py), by reason (expression: no statement; encode: a node the protobuf encoder "
        "lacks; deparse: the C deparser refused it); counted per process",
        "reason",
        deparse.FALLBACKS.by_reason,
    )


def _latency_metric(totals: _Totals) -> Metric:
    latency = HistogramMetricFamily(
        "cowproxy_query_duration_seconds", "Time from a query (or Sync) to its ReadyForQuery"
    )
    buckets: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip((*LATENCY_BUCKETS, float("inf")), totals.latency_counts, strict=True):
        running += count
        buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
    latency.add_metric([], buckets, totals.latency_sum)
    return latency


def _read_metrics(reads: ReadRecorder | None) -> Iterator[Metric]:
    """The read traces' counters (zero when nothing is recorded: the series exist for dashboards)."""
    yield CounterMetricFamily(
        "cowproxy_reads_recorded",
        "Read records written to cow.reads",
        value=reads.recorded if reads is not None else 0,
    )
    dropped = CounterMetricFamily(
        "cowproxy_reads_dropped",
        "Read records dropped: queue full (the relay never waits), write failed, or left at shutdown",
        labels=["reason"],
    )
    for reason in ("queue_full", "write_failed", "shutdown", "relay_full"):
        dropped.add_metric([reason], reads.dropped.get(reason, 0) if reads is not None else 0)
    yield dropped
    yield GaugeMetricFamily(
        "cowproxy_reads_queued",
        "Read records queued or being written",
        value=reads.pending if reads is not None else 0,
    )


class ConnectionHooks:
    """The relay's ``Hooks``: plain counters, exported by the collector."""

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def statement(self, kind: str, tagged: bool) -> None:
        counts = self.m.statements
        key = (kind, tagged)
        counts[key] = counts.get(key, 0) + 1

    def write(self, table: str, kind: str) -> None:
        counts = self.m.writes
        key = (table, kind)
        counts[key] = counts.get(key, 0) + 1

    def rewrite(self) -> None:
        self.m.rewrites += 1

    def rerun(self) -> None:
        self.m.reruns += 1

    def error(self, sqlstate: str) -> None:
        self.m.count_error(sqlstate)

    def parse_cache(self, hit: bool) -> None:
        if hit:
            self.m.cache_hits += 1
        else:
            self.m.cache_misses += 1

    def latency(self, seconds: float) -> None:
        m = self.m
        m.latency_counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        m.latency_sum += seconds

    def tags_applied(self, tags: Tags) -> None:
        self.m.switches[tags.tagged] += 1

    def tags_failed(self, tags: Tags, error: ErrorFields) -> None:
        pass
