"""Where a connection's relay reports what it sees (metrics, logs): ``Hooks``, implemented by
``metrics.ConnectionHooks``; ``NoHooks`` reports nothing (tests, benchmarks)."""

from __future__ import annotations

from typing import Protocol

from proxy import protocol as p
from proxy.tags import Tags


class Hooks(Protocol):
    """Where the relay reports what it sees (metrics, logs)."""

    def statement(self, kind: str, tagged: bool) -> None: ...
    def write(self, table: str, kind: str) -> None: ...
    def rewrite(self) -> None: ...
    def rerun(self) -> None: ...
    def error(self, sqlstate: str) -> None: ...
    def parse_cache(self, hit: bool) -> None: ...
    def latency(self, seconds: float) -> None: ...
    def tags_applied(self, tags: Tags) -> None: ...
    def tags_failed(self, tags: Tags, error: p.ErrorFields) -> None: ...


class NoHooks:
    def statement(self, kind: str, tagged: bool) -> None:
        pass

    def write(self, table: str, kind: str) -> None:
        pass

    def rewrite(self) -> None:
        pass

    def rerun(self) -> None:
        pass

    def error(self, sqlstate: str) -> None:
        pass

    def parse_cache(self, hit: bool) -> None:
        pass

    def latency(self, seconds: float) -> None:
        pass

    def tags_applied(self, tags: Tags) -> None:
        pass

    def tags_failed(self, tags: Tags, error: p.ErrorFields) -> None:
        pass
