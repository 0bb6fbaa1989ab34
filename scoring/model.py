"""The scorer's inputs: writes of a session and the metadata of the tables they touch.

Everything here is plain, frozen data so that the scorer can run without a database (``score_writes``),
for example as a reward inside a training loop.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from .errors import ScoringError

# Value categories that pick the default comparator of a column.
TEXT = "text"
JSON = "json"
NUMERIC = "numeric"
ARRAY = "array"
ENUM = "enum"
UUID = "uuid"
TIMESTAMP = "timestamp"
BOOL = "bool"
OTHER = "other"
CATEGORIES = (TEXT, JSON, NUMERIC, ARRAY, ENUM, UUID, TIMESTAMP, BOOL, OTHER)

Key = tuple[Any, ...]


@dataclass(frozen=True)
class Write:
    """One row written by a session, as ``cow.session_changes`` reports it.

    ``pk`` holds the primary-key columns, ``row`` the whole row after the write (``None`` when ``deleted``).
    ``created`` says whether the row did not exist before the session (an insert): ``True``/``False`` when
    known, ``None`` when not. Rows that existed before (``created=False``) are only ever paired by key.
    """

    table: str
    pk: Mapping[str, Any]
    row: Mapping[str, Any] | None
    operation_id: str
    seq: int
    deleted: bool = False
    created: bool | None = None


@dataclass(frozen=True)
class ForeignKey:
    columns: tuple[str, ...]
    ref_table: str
    ref_columns: tuple[str, ...]


@dataclass(frozen=True)
class ColumnMeta:
    name: str
    type_name: str = "unknown"
    category: str = OTHER
    # The database fills it in (identity, serial, a default): in a primary key, such values are generated
    # independently by each session, so equal values on both sides of inserted rows mean nothing.
    generated: bool = False


@dataclass(frozen=True)
class TableMeta:
    name: str
    columns: tuple[ColumnMeta, ...]
    pk: tuple[str, ...]
    fks: tuple[ForeignKey, ...] = ()
    # No primary key in the database: ``pk`` lists every column (a row is identified by its whole value).
    keyless: bool = False

    def column(self, name: str) -> ColumnMeta | None:
        for col in self.columns:
            if col.name == name:
                return col
        return None


@dataclass(frozen=True)
class Metadata:
    """Tables by the name the writes use (``schema.table`` when read from a database)."""

    tables: Mapping[str, TableMeta] = field(default_factory=dict)

    def get(self, table: str) -> TableMeta | None:
        return self.tables.get(table)


def category_of_value(value: Any) -> str:
    """Guess a column's category from a JSON value (for tables the metadata does not describe)."""
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, (int, float, Decimal)):
        return NUMERIC
    if isinstance(value, str):
        return TEXT
    if isinstance(value, list):
        return ARRAY
    if isinstance(value, dict):
        return JSON
    return OTHER


def infer_table(table: str, writes: Iterable[Write]) -> TableMeta:
    """Metadata for a table known only from its writes: columns and categories from the values seen."""
    pk: tuple[str, ...] = ()
    categories: dict[str, str] = {}
    for w in writes:
        if not pk:
            pk = tuple(w.pk)
        for name, value in (w.row or {}).items():
            if value is not None and categories.get(name, OTHER) == OTHER:
                categories[name] = category_of_value(value)
            categories.setdefault(name, OTHER)
    for name in pk:
        categories.setdefault(name, OTHER)
    columns = tuple(ColumnMeta(name, "inferred", cat) for name, cat in categories.items())
    return TableMeta(table, columns, pk)


def complete_metadata(metadata: Metadata | None, writes: Sequence[Write]) -> Metadata:
    """The given metadata plus inferred entries for any table it lacks."""
    known = dict(metadata.tables) if metadata else {}
    missing: dict[str, list[Write]] = {}
    for w in writes:
        if w.table not in known:
            missing.setdefault(w.table, []).append(w)
    for table, ws in missing.items():
        known[table] = infer_table(table, ws)
    for meta in known.values():
        if not meta.pk:
            raise ScoringError(f"table {meta.name} has no primary key: rows cannot be identified")
    return Metadata(known)


def freeze(value: Any) -> Any:
    """A hashable stand-in for a JSON value (keys of rows, exact-content fingerprints)."""
    if isinstance(value, dict):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    return value


def key_of(meta: TableMeta, pk: Mapping[str, Any]) -> Key:
    try:
        return tuple(freeze(pk[c]) for c in meta.pk)
    except KeyError as exc:
        raise ScoringError(f"a write to {meta.name} lacks primary-key column {exc.args[0]}") from None


_DECODER = json.JSONDecoder(parse_float=Decimal)  # one decoder: json.loads would build one per call


def loads(text: str | None) -> Any:
    """Parse JSON from PostgreSQL keeping numerics exact."""
    if text is None:
        return None
    return _DECODER.decode(text)
