"""Field comparators: how similar a ground-truth value and an agent value are, in [0, 1].

A comparator is any callable ``(gt_value, agent_value, ctx) -> float``. ``ctx`` is a ``FieldContext``: the
table's and column's metadata and the id mapping of the current matching. Foreign-key values reach the
comparator already translated into the ground truth's key space (``ctx.mapping`` does it), so a comparator
never needs to know about generated keys unless it wants to.

Comparators are looked up by name (``register_comparator``); a name in a config file that is not registered
is an error.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from difflib import SequenceMatcher
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol

from .errors import ScoringError
from .model import (
    ARRAY,
    BOOL,
    ENUM,
    JSON,
    NUMERIC,
    OTHER,
    TEXT,
    TIMESTAMP,
    UUID,
    ColumnMeta,
    TableMeta,
    freeze,
)

if TYPE_CHECKING:
    from .match import IdMapping


class Unmapped:
    """Stands for an agent foreign key pointing at a generated row the matching did not pair: equal to
    nothing, so the field scores 0."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<unmapped>"

    def __eq__(self, other: object) -> bool:
        return False

    def __hash__(self) -> int:
        return 0


UNMAPPED = Unmapped()


@dataclass(frozen=True)
class FieldContext:
    table: TableMeta
    column: ColumnMeta
    mapping: IdMapping


class Comparator(Protocol):
    def __call__(self, gt: Any, agent: Any, ctx: FieldContext, /) -> float: ...


@dataclass(frozen=True)
class RowContext:
    table: TableMeta
    mapping: IdMapping


# A row-level function replaces the per-field comparison of a table: it returns the row's similarity, or a
# mapping of field name to similarity (averaged, and shown in explanations).
RowFunction = Callable[[Mapping[str, Any], Mapping[str, Any], RowContext], "float | Mapping[str, float]"]


def _none_pair(gt: Any, agent: Any) -> float | None:
    if gt is None and agent is None:
        return 1.0
    if gt is None or agent is None:
        return 0.0
    return None


def text_ratio(gt: Any, agent: Any, ctx: FieldContext | None = None, /) -> float:
    """difflib's SequenceMatcher ratio (the paper's text similarity)."""
    early = _none_pair(gt, agent)
    if early is not None:
        return early
    a, b = str(gt), str(agent)
    if a == b:
        return 1.0
    return _sequence_ratio(a, b)


@lru_cache(maxsize=65536)
def _sequence_ratio(a: str, b: str) -> float:
    # Cached: the same pair of values recurs across rows (states, labels, templated texts), and matching
    # compares every remaining row with every other. autojunk off: it would treat frequent characters of
    # long texts as noise and under-score them.
    return SequenceMatcher(None, a, b, autojunk=False).ratio()


def exact(gt: Any, agent: Any, ctx: FieldContext | None = None, /) -> float:
    tg, ta = type(gt), type(agent)
    if tg is ta:
        return 1.0 if gt == agent else 0.0
    if ta is Unmapped:
        return 0.0
    return 1.0 if _equal_scalars(gt, agent) else 0.0


def _equal_scalars(a: Any, b: Any) -> bool:
    # 1 and 1.0 are the same number; True and 1 are not the same value.
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float, Decimal)) and isinstance(b, (int, float, Decimal)):
        return bool(a == b)
    return False


def json_equal(gt: Any, agent: Any, ctx: FieldContext | None = None, /) -> float:
    """Deep equality of JSON values (key order never matters, list order does)."""
    return 1.0 if _deep_equal(gt, agent) else 0.0


def _deep_equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_deep_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_deep_equal(x, y) for x, y in zip(a, b, strict=True))
    return (a == b and type(a) is type(b)) or _equal_scalars(a, b)


@dataclass(frozen=True)
class Numeric:
    """Exact numbers, or within an absolute ``tolerance``."""

    tolerance: float = 0.0

    def __call__(self, gt: Any, agent: Any, ctx: FieldContext | None = None, /) -> float:
        early = _none_pair(gt, agent)
        if early is not None:
            return early
        try:
            diff = abs(Decimal(str(gt)) - Decimal(str(agent)))
        except (InvalidOperation, ValueError):
            return exact(gt, agent)
        return 1.0 if diff <= Decimal(str(self.tolerance)) else 0.0


def array_overlap(gt: Any, agent: Any, ctx: FieldContext | None = None, /) -> float:
    """Arrays as multisets: equal gives 1, else the Jaccard index of their elements (label lists, tags)."""
    early = _none_pair(gt, agent)
    if early is not None:
        return early
    if not isinstance(gt, list) or not isinstance(agent, list):
        return json_equal(gt, agent)
    if _deep_equal(gt, agent):
        return 1.0
    a, b = Counter(freeze(x) for x in gt), Counter(freeze(x) for x in agent)
    union = sum((a | b).values())
    return sum((a & b).values()) / union if union else 1.0


def text_casefold(gt: Any, agent: Any, ctx: FieldContext | None = None, /) -> float:
    """SequenceMatcher ratio ignoring case and surrounding white space."""
    early = _none_pair(gt, agent)
    if early is not None:
        return early
    return text_ratio(str(gt).strip().casefold(), str(agent).strip().casefold())


def ignore(gt: Any, agent: Any, ctx: FieldContext | None = None, /) -> float:  # pragma: no cover
    """Marker: the column is left out of the comparison (never actually called)."""
    return 1.0


ComparatorFactory = Callable[..., Comparator]

_REGISTRY: dict[str, ComparatorFactory] = {
    "text": lambda: text_ratio,
    "text_casefold": lambda: text_casefold,
    "exact": lambda: exact,
    "json": lambda: json_equal,
    "numeric": Numeric,
    "array": lambda: array_overlap,
    "ignore": lambda: ignore,
}

# Defaults per value category. Timestamps are ignored unless the config asks to compare them (then exact).
DEFAULT_BY_CATEGORY: Mapping[str, str] = {
    TEXT: "text",
    JSON: "json",
    NUMERIC: "numeric",
    ARRAY: "array",
    ENUM: "exact",
    UUID: "exact",
    TIMESTAMP: "ignore",
    BOOL: "exact",
    OTHER: "exact",
}


def register_comparator(name: str, factory: ComparatorFactory) -> None:
    """Make ``name`` usable in config files; ``factory(**params)`` returns the comparator."""
    _REGISTRY[name] = factory


def comparator_names() -> list[str]:
    return sorted(_REGISTRY)


def make_comparator(name: str, params: Mapping[str, Any] | None = None, where: str = "") -> Comparator:
    factory = _REGISTRY.get(name)
    if factory is None:
        at = f" for {where}" if where else ""
        raise ScoringError(f"unknown comparator {name!r}{at}; known: {', '.join(comparator_names())}")
    try:
        return factory(**dict(params or {}))
    except TypeError as exc:
        at = f" for {where}" if where else ""
        raise ScoringError(f"bad parameters for comparator {name!r}{at}: {exc}") from None
