"""Scoring configuration: parsed once (from keyword options or a TOML file) into a frozen object.

TOML layout::

    min_similarity = 0.5          # below this, two inserted rows are not a pair
    collapse = false              # drop rows created and deleted within a session
    compare_timestamps = false    # timestamps are ignored by default
    numeric_tolerance = 0.0
    ignore_tables = ["public.audit_log"]
    ignore_columns = ["updated_at", "public.issues.sort_order"]

    [scores]                      # extra named scores: a function of scoring.result.Stats
    strict = "mypkg.scoring:strict_score"

    [types]                       # default comparator per value category
    text = "text_casefold"

    [tables."public.issues"]
    row = "mypkg.scoring:issue_similarity"       # a row-level function (module:function)
    [tables."public.issues".columns]
    title = "exact"
    estimate = { comparator = "numeric", tolerance = 0.5 }

Table names may be written with or without their schema.
"""

from __future__ import annotations

import importlib
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .compare import DEFAULT_BY_CATEGORY, Comparator, RowFunction, make_comparator
from .errors import ScoringError
from .model import CATEGORIES, TIMESTAMP
from .result import ScoreFunction

_TOP_KEYS = {
    "min_similarity",
    "collapse",
    "compare_timestamps",
    "numeric_tolerance",
    "ignore_tables",
    "ignore_columns",
    "types",
    "tables",
    "scores",
}


@dataclass(frozen=True)
class ScoringConfig:
    min_similarity: float = 0.5
    collapse: bool = False
    compare_timestamps: bool = False
    numeric_tolerance: float = 0.0
    ignore_tables: frozenset[str] = frozenset()
    # Entries are "column" (any table), "table.column" or "schema.table.column".
    ignore_columns: frozenset[str] = frozenset()
    type_comparators: Mapping[str, str] = field(default_factory=dict)  # category -> comparator name
    column_comparators: Mapping[tuple[str, str], Comparator] = field(default_factory=dict)
    row_functions: Mapping[str, RowFunction] = field(default_factory=dict)
    # Extra named scores for this config, on top of the registry (``[scores] name = "module:function"``).
    score_functions: Mapping[str, ScoreFunction] = field(default_factory=dict)
    # Cells of a dense similarity matrix above which a table's pairing first pairs identical rows.
    max_dense_cells: int = 2_500

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_similarity <= 1.0:
            raise ScoringError(f"min_similarity must be within [0, 1], got {self.min_similarity}")
        if self.numeric_tolerance < 0:
            raise ScoringError(f"numeric_tolerance must be >= 0, got {self.numeric_tolerance}")

    def table_ignored(self, table: str) -> bool:
        if not self.ignore_tables:  # the common case, asked once per write
            return False
        return table in self.ignore_tables or _short(table) in self.ignore_tables

    def column_ignored(self, table: str, column: str) -> bool:
        cols = self.ignore_columns
        if not cols:
            return False
        return column in cols or f"{table}.{column}" in cols or f"{_short(table)}.{column}" in cols

    def column_comparator(self, table: str, column: str) -> Comparator | None:
        found = self.column_comparators.get((table, column))
        if found is None:
            found = self.column_comparators.get((_short(table), column))
        return found

    def row_function(self, table: str) -> RowFunction | None:
        return self.row_functions.get(table) or self.row_functions.get(_short(table))

    def category_comparator(self, category: str) -> tuple[str, Comparator | None]:
        """Name and comparator for a value category (``None`` when the column is ignored)."""
        name = self.type_comparators.get(category) or DEFAULT_BY_CATEGORY.get(category, "exact")
        if category == TIMESTAMP and self.compare_timestamps and category not in self.type_comparators:
            name = "exact"
        if name == "ignore":
            return name, None
        if name == "numeric":
            return name, make_comparator(name, {"tolerance": self.numeric_tolerance})
        return name, make_comparator(name, where=f"type {category}")


def _short(table: str) -> str:
    return table.rsplit(".", 1)[-1]


def load_config(path: str | Path) -> ScoringConfig:
    """Read a TOML config file; every mistake is a ``ScoringError`` naming the file."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ScoringError(f"cannot read config {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScoringError(f"config {path} is not valid TOML: {exc}") from None
    try:
        return config_from_mapping(data)
    except ScoringError as exc:
        raise ScoringError(f"config {path}: {exc}") from None


def config_from_mapping(data: Mapping[str, Any], base: ScoringConfig | None = None) -> ScoringConfig:
    """A config from a TOML document's mapping (over ``base``); every mistake is a ``ScoringError``."""
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise ScoringError(f"unknown setting(s) {', '.join(sorted(unknown))}")
    cfg = base or ScoringConfig()
    changes: dict[str, Any] = {**_scalars(data), **_name_sets(data)}
    types = _types(data.get("types", {}))
    if types:
        changes["type_comparators"] = {**cfg.type_comparators, **types}
    columns, rows = _tables(data.get("tables", {}), cfg)
    if columns != cfg.column_comparators:
        changes["column_comparators"] = columns
    if rows != cfg.row_functions:
        changes["row_functions"] = rows
    scores = _table(data.get("scores", {}), '[scores] must be a table of name = "module:function"')
    if scores:
        changes["score_functions"] = {
            **cfg.score_functions,
            **{name: import_function(path, where=f"score {name}") for name, path in scores.items()},
        }
    return replace(cfg, **changes)


def _scalars(data: Mapping[str, Any]) -> dict[str, Any]:
    """The number and flag settings that are given, type-checked (a TOML bool is not a number)."""
    out: dict[str, Any] = {}
    for name, is_flag in (
        ("min_similarity", False),
        ("numeric_tolerance", False),
        ("collapse", True),
        ("compare_timestamps", True),
    ):
        if name in data:
            value = data[name]
            is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (isinstance(value, bool) if is_flag else is_number):
                raise ScoringError(f"{name} has the wrong type ({type(value).__name__})")
            out[name] = value if is_flag else float(value)
    return out


def _name_sets(data: Mapping[str, Any]) -> dict[str, frozenset[str]]:
    out: dict[str, frozenset[str]] = {}
    for name in ("ignore_tables", "ignore_columns"):
        if name in data:
            value = data[name]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ScoringError(f"{name} must be a list of strings")
            out[name] = frozenset(value)
    return out


def _table(value: Any, message: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ScoringError(message)
    return value


def _types(value: Any) -> dict[str, str]:
    """[types]: value category -> comparator name, each comparator validated now, not at first use."""
    types = _table(value, "[types] must be a table")
    for category, name in types.items():
        if category not in CATEGORIES:
            raise ScoringError(f"unknown value type {category!r} in [types]; known: {', '.join(CATEGORIES)}")
        if not isinstance(name, str):
            raise ScoringError(f"[types] {category} must name a comparator")
        make_comparator(name, where=f"type {category}")
    return types


def _tables(
    value: Any, cfg: ScoringConfig
) -> tuple[dict[tuple[str, str], Comparator], dict[str, RowFunction]]:
    """[tables."T"]: per-column comparators and a row function, over the base config's."""
    columns: dict[tuple[str, str], Comparator] = dict(cfg.column_comparators)
    rows: dict[str, RowFunction] = dict(cfg.row_functions)
    for table, spec in _table(value, "[tables] must be a table").items():
        if not isinstance(spec, dict) or set(spec) - {"row", "columns"}:
            raise ScoringError(f'[tables."{table}"] may only hold "row" and "columns"')
        if "row" in spec:
            rows[table] = import_function(spec["row"], where=f"table {table}")
        for column, cspec in spec.get("columns", {}).items():
            columns[(table, column)] = _column_comparator(table, column, cspec)
    return columns, rows


def _column_comparator(table: str, column: str, spec: Any) -> Comparator:
    where = f"{table}.{column}"
    if isinstance(spec, str):
        return make_comparator(spec, where=where)
    if isinstance(spec, dict) and isinstance(spec.get("comparator"), str):
        params = {k: v for k, v in spec.items() if k != "comparator"}
        return make_comparator(spec["comparator"], params, where=where)
    raise ScoringError(f"{where}: give a comparator name or {{ comparator = NAME, ... }}")


def import_function(path: Any, where: str) -> Any:
    if not isinstance(path, str) or ":" not in path:
        raise ScoringError(f"{where}: a function is written module:function, got {path!r}")
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
        fn = getattr(module, attr)
    except (ImportError, AttributeError) as exc:
        raise ScoringError(f"{where}: cannot import {path}: {exc}") from None
    if not callable(fn):
        raise ScoringError(f"{where}: {path} is not callable")
    return fn


def make_config(config: ScoringConfig | str | Path | None = None, **options: Any) -> ScoringConfig:
    """The config for one scoring call: a config object or TOML path, then keyword overrides."""
    if isinstance(config, (str, Path)):
        config = load_config(config)
    cfg = config or ScoringConfig()
    if not options:
        return cfg
    direct = {
        k: options.pop(k) for k in ("column_comparators", "row_functions", "max_dense_cells") if k in options
    }
    for k in ("ignore_tables", "ignore_columns"):
        if k in options and not isinstance(options[k], list):
            options[k] = list(options[k])
    if "types" not in options and "type_comparators" in options:
        options["types"] = options.pop("type_comparators")
    cfg = config_from_mapping(options, base=cfg)
    if direct:
        merged = dict(direct)
        if "column_comparators" in merged:
            cols = {
                key: make_comparator(c, where=".".join(key)) if isinstance(c, str) else c
                for key, c in dict(merged["column_comparators"]).items()
            }
            merged["column_comparators"] = {**cfg.column_comparators, **cols}
        if "row_functions" in merged:
            merged["row_functions"] = {**cfg.row_functions, **dict(merged["row_functions"])}
        cfg = replace(cfg, **merged)
    return cfg
