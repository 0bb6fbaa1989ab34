"""What the rewrites need to know about the CoW tables of a database, read once per connection."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.errors import ProxyError

# One row per CoW table: app schema, table, overlay schema, a JSON document with the rest (keys,
# columns, unique indexes, FKs pointing at the table), and the server's version number (so the rewrites
# know it even when the caller does not pass it). JSON keeps the row all-text and spares us from
# parsing PostgreSQL array literals. 'deferrable' pairs each deferrable UNIQUE/EXCLUDE/FOREIGN KEY constraint
# of (or referencing) the table with the layer's constraint trigger on its changes table: named like the
# constraint, or ``left(name, 50) || '_' || n`` when two constraints of one name but different modes meet
# there (cow._defer_trigger). Works on PostgreSQL 15+ (indnullsnotdistinct). Fails with 42P01 or
# 3F000 when the layer is not installed: the caller then uses ``Catalog.empty()``.
_CATALOG_TEMPLATE = """\
SELECT t.table_schema::text, t.table_name::text, t.overlay_schema::text,
  {document_start}json_build_object(
    -- The primary key only (what GROUP BY's functional dependency needs), not a unique index the layer keys
    -- a table without one by.
    'pk', to_json(CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_index pi WHERE pi.indrelid = c.oid
                                     AND pi.indisprimary) THEN t.pk_columns END),
    -- The columns the layer keys the table's versions by (primary key or NOT NULL unique index; empty for a
    -- table without one), its changes table and whether row security applies to it: what a rewrite that
    -- reads the base and changes tables itself needs (_SplitCounts).
    'key', to_json(t.pk_columns),
    'changes', r.changes_table,
    'row_security', c.relrowsecurity,
    -- The planner's row estimate (-1: never analyzed), to one significant digit: which of two joined tables
    -- is far the larger. Rounded so that an ANALYZE seldom changes the catalog (and its parse cache entries).
    'rows', CASE WHEN c.reltuples < 0 THEN -1
                 ELSE round(c.reltuples::numeric, 1 - length(c.reltuples::numeric::bigint::text)) END,
    -- The same of its changes table (all sessions' versions): whether a session's versions of a key range
    -- could outgrow a hash table in memory (_key_read).
    'changes_rows', (SELECT CASE WHEN cc.reltuples < 0 THEN -1 ELSE round(cc.reltuples::numeric,
                                   1 - length(cc.reltuples::numeric::bigint::text)) END
                     FROM pg_catalog.pg_class cc
                     WHERE cc.oid = to_regclass(format('cow_changes.%I', r.changes_table))),
    'columns', (
      SELECT coalesce(json_agg(json_build_object(
               'name', a.attname, 'type', format_type(a.atttypid, NULL),
               'generated', a.attgenerated <> '', 'identity', a.attidentity <> '',
               'identity_always', a.attidentity = 'a',
               'default', CASE
                 WHEN a.attidentity = 'd' THEN format('nextval(%L::regclass)',
                   pg_get_serial_sequence(format('%I.%I', n.nspname, c.relname), a.attname))
                 WHEN a.attgenerated = '' THEN pg_get_expr(d.adbin, d.adrelid) END)
             ORDER BY a.attnum), '[]')
      FROM pg_catalog.pg_attribute a
      LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
      WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
    'unique', (
      SELECT coalesce(json_agg(json_build_object(
               'name', coalesce(con.conname, ic.relname), 'constraint', con.conname IS NOT NULL,
               'columns', (SELECT coalesce(json_agg(ka.attname ORDER BY k.ord), '[]')
                           FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
                           JOIN pg_catalog.pg_attribute ka ON ka.attrelid = c.oid AND ka.attnum = k.attnum),
               'nulls_not_distinct', i.indnullsnotdistinct,
               'partial', i.indpred IS NOT NULL, 'expressions', i.indexprs IS NOT NULL)
             ORDER BY ic.relname), '[]')
      FROM pg_catalog.pg_index i
      JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid
      LEFT JOIN pg_catalog.pg_constraint con
        ON con.conindid = i.indexrelid AND con.conrelid = c.oid AND con.contype IN ('p', 'u')
      WHERE i.indrelid = c.oid AND i.indisunique),
    'indexed', (
      SELECT coalesce(json_agg(DISTINCT ia.attname), '[]')
      FROM pg_catalog.pg_index i
      JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid
      JOIN pg_catalog.pg_am am ON am.oid = ic.relam AND am.amname IN ('btree', 'hash')
      JOIN pg_catalog.pg_attribute ia ON ia.attrelid = c.oid AND ia.attnum = i.indkey[0]
      WHERE i.indrelid = c.oid AND i.indisvalid AND i.indpred IS NULL),
    'referenced_by', (
      SELECT coalesce(json_agg(json_build_object(
               'schema', rn.nspname, 'table', rc.relname, 'name', f.conname, 'on_delete', f.confdeltype)
             ORDER BY rn.nspname, rc.relname, f.conname), '[]')
      FROM pg_catalog.pg_constraint f
      JOIN pg_catalog.pg_class rc ON rc.oid = f.conrelid
      JOIN pg_catalog.pg_namespace rn ON rn.oid = rc.relnamespace
      WHERE f.contype = 'f' AND f.confrelid = c.oid),
    'deferrable', (
      SELECT coalesce(json_agg(json_build_object(
               'schema', an.nspname, 'name', ac.conname, 'trigger', tc.conname)
             ORDER BY an.nspname, ac.conname, tc.conname), '[]')
      FROM cow.registry g
      JOIN pg_catalog.pg_namespace cn ON cn.nspname = 'cow_changes'
      JOIN pg_catalog.pg_class cc ON cc.relnamespace = cn.oid AND cc.relname = g.changes_table
      JOIN pg_catalog.pg_constraint tc ON tc.conrelid = cc.oid AND tc.contype = 't'
      JOIN pg_catalog.pg_constraint ac
        ON ac.condeferrable AND ac.contype IN ('u', 'x', 'f')
       AND (ac.conrelid = c.oid OR (ac.contype = 'f' AND ac.confrelid = c.oid))
       AND (tc.conname = ac.conname
            OR (starts_with(tc.conname, left(ac.conname, 50) || '_')
                AND substr(tc.conname, length(left(ac.conname, 50)) + 2) ~ '^[0-9]+$'
                AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint o
                                WHERE o.conname = tc.conname AND o.condeferrable
                                  AND (o.conrelid = c.oid OR o.confrelid = c.oid))))
      JOIN pg_catalog.pg_namespace an ON an.oid = ac.connamespace
      WHERE g.relid = c.oid)
  )::text{document_end},
  current_setting('server_version_num'),
  r.id::text || ':' || r.xmin::text
FROM cow.tables t
JOIN pg_catalog.pg_namespace n ON n.nspname = t.table_schema
JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = t.table_name
LEFT JOIN cow.registry r ON r.relid = c.oid
ORDER BY t.table_schema = 'public' DESC, t.table_schema, t.table_name"""

# The stamp (last column) is the table's registry row version: cow.refresh rewrites that row whenever the
# table's signature changes, so a table whose stamp the reader already holds has the same document. The
# delta query takes the stamps held ($1, a text[]) and leaves their documents NULL: after one table's DDL a
# reload reads one document instead of every table's (Catalog.from_rows takes the rest from the catalog
# held). CASE evaluates the document's subqueries only in the branch taken.
CATALOG_QUERY = _CATALOG_TEMPLATE.replace("{document_start}", "").replace("{document_end}", "")
CATALOG_DELTA_QUERY = _CATALOG_TEMPLATE.replace(
    "{document_start}", "CASE WHEN r.id::text || ':' || r.xmin::text = ANY ($1::text[]) THEN NULL ELSE "
).replace("{document_end}", " END")


# A fingerprint of the registry the catalog is built from: it changes whenever the layer enables, drops or
# regenerates a table (cow.refresh writes the table's registry row whenever its signature — columns,
# defaults, constraints, foreign keys from other tables, unique indexes — changes), in the reader's
# snapshot (xmin, not a sequence: a sequence moves before the DDL commits). Cheap: one row per CoW table,
# no pg_catalog joins. NULL when no table is enabled.
CATALOG_VERSION_QUERY = """\
SELECT pg_catalog.md5(pg_catalog.string_agg(r.id::text || ':' || r.xmin::text, ',' ORDER BY r.id))
FROM cow.registry r"""


class CatalogError(ProxyError):
    """The rows given to ``Catalog.from_rows`` are not what ``CATALOG_QUERY`` returns."""


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # format_type without typmod, so a cast to it never truncates (the view applies the typmod)
    generated: bool
    identity: bool
    identity_always: bool = False
    default: str | None = None  # the default as SQL from pg_get_expr (nextval(...) for BY DEFAULT identity)


@dataclass(frozen=True)
class UniqueKey:
    """A unique index (with its constraint name when it backs a PRIMARY KEY / UNIQUE constraint)."""

    name: str
    columns: tuple[str, ...]
    is_constraint: bool
    nulls_not_distinct: bool
    partial: bool
    expressions: bool

    @property
    def inferable(self) -> bool:
        """Usable as an ON CONFLICT arbiter given by plain column names."""
        return not self.partial and not self.expressions and bool(self.columns)


@dataclass(frozen=True)
class ReferencingKey:
    """A foreign key of table ``schema.table`` that references this table."""

    schema: str
    table: str
    name: str
    on_delete: str  # pg_constraint.confdeltype: a no action, r restrict, c cascade, n set null, d set default


@dataclass(frozen=True)
class DeferrableKey:
    """A deferrable constraint (in schema ``schema``) checked in a session by constraint trigger
    ``cow_changes.<trigger>`` on this table's changes table."""

    schema: str
    name: str
    trigger: str


@dataclass(frozen=True)
class CowTable:
    schema: str
    name: str
    overlay_schema: str
    pk: tuple[str, ...]
    columns: tuple[Column, ...]
    unique: tuple[UniqueKey, ...]
    referenced_by: tuple[ReferencingKey, ...]
    deferrable: tuple[DeferrableKey, ...] = ()
    indexed: frozenset[str] = frozenset()  # leading columns of the base table's btree/hash indexes
    key: tuple[str, ...] = ()  # the layer's key of the table's versions; () for a table without one
    changes_table: str | None = None  # its changes table, in schema cow_changes
    row_security: bool = False
    rows: float = -1  # pg_class.reltuples of the base table when the catalog was read; -1: unknown
    changes_rows: float = -1  # the same of its changes table
    stamp: str | None = field(default=None, compare=False)  # its registry row version (CATALOG_QUERY)

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    def column(self, name: str) -> Column | None:
        for col in self.columns:
            if col.name == name:
                return col
        return None


_idents = itertools.count(1)
# Equal catalogs (every connection to one database loads its own) share an ident, hence cache entries.
_interned: dict[tuple[tuple[str | None, ...], ...], int] = {}


def _ident_for(rows: Sequence[Sequence[str | None]]) -> int:
    content = tuple(tuple(row) for row in rows)
    ident = _interned.get(content)
    if ident is None:
        if len(_interned) > 256:
            _interned.clear()
        ident = _interned[content] = next(_idents)
    return ident


@dataclass(frozen=True)
class Catalog:
    """The CoW tables of one database. ``ident`` distinguishes catalogs in the analyzer's cache."""

    tables: Mapping[tuple[str, str], CowTable]
    ident: int = field(default_factory=lambda: next(_idents), compare=False)
    server_version_num: int = 0  # from the catalog rows; 0 when unknown
    schemas: frozenset[str] = field(init=False, compare=False, repr=False)
    # Unqualified table name -> its CoW table, None when several enabled schemas have a table of that name.
    unqualified: Mapping[str, CowTable | None] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "schemas", frozenset(schema for schema, _ in self.tables))
        names: dict[str, CowTable | None] = {}
        for (_, table_name), table in self.tables.items():
            names[table_name] = None if table_name in names else table
        object.__setattr__(self, "unqualified", names)

    @classmethod
    def empty(cls) -> Catalog:
        return cls(tables={}, ident=0)

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[str | None]], held: Catalog | None = None) -> Catalog:
        """Build from the rows of ``CATALOG_QUERY`` (text columns, as the simple protocol returns them), or
        of ``CATALOG_DELTA_QUERY`` given ``held``, the catalog whose stamps it was sent."""
        tables: dict[tuple[str, str], CowTable] = {}
        version = 0
        reuse = held.by_stamp if held is not None else {}
        for row in rows:
            try:
                if len(row) > 4 and row[4]:
                    version = int(row[4])
                table = _held_table(row, reuse) or _table_from_row(row)
            except (ValueError, KeyError, TypeError) as exc:
                raise CatalogError(f"malformed CoW catalog row {row!r}: {exc}") from exc
            tables[(table.schema, table.name)] = table
        return cls(tables=tables, ident=_ident_for(rows), server_version_num=version)

    @property
    def by_stamp(self) -> Mapping[str, CowTable]:
        """Its tables by registry stamp (tables read without one are left out)."""
        return {t.stamp: t for t in self.tables.values() if t.stamp is not None}

    @property
    def has_cow_tables(self) -> bool:
        return bool(self.tables)

    def lookup(self, schema: str | None, name: str | None) -> CowTable | None:
        """The CoW table a (possibly unqualified) name denotes inside a session.

        Unqualified names resolve through the session's search_path, overlay schemas first. The catalog
        does not know that path (the application may switch it: a schema per tenant), so an unqualified
        name that several enabled schemas have is not resolved here (None): such a statement is sent as
        written and PostgreSQL resolves it to the right overlay view, never to another schema's table.
        """
        if name is None:
            return None
        if schema is not None:
            return self.tables.get((schema, name))
        return self.unqualified.get(name)

    def table(self, schema: str | None, name: str | None) -> CowTable | None:
        if schema is None or name is None:
            return None
        return self.tables.get((schema, name))

    def constraint_triggers(self, schema: str | None, name: str) -> tuple[str, ...]:
        """The layer's constraint triggers (in ``cow_changes``) for deferrable constraint ``name``.

        Unqualified, the name matches in every app schema: the session's ``search_path`` decides which one
        PostgreSQL resolves, and the catalog does not know it (docs/rewrites.md).
        """
        found: list[str] = []
        for table in self.tables.values():
            for key in table.deferrable:
                if key.name == name and schema in (None, key.schema) and key.trigger not in found:
                    found.append(key.trigger)
        return tuple(found)

    @property
    def lowered_schemas(self) -> tuple[str, ...]:
        return _lowered(self.schemas)

    @property
    def schema_pattern(self) -> re.Pattern[str] | None:
        """A sieve matching any app schema name as a word (the fast path's in-session check)."""
        return _schema_pattern(self.schemas)


def _held_table(row: Sequence[str | None], held: Mapping[str, CowTable]) -> CowTable | None:
    """The held table of a delta row whose document the server left out (its stamp was sent)."""
    if len(row) < 4 or row[3] is not None:
        return None
    stamp = row[5] if len(row) > 5 else None
    table = held.get(stamp) if stamp is not None else None
    if table is None or (table.schema, table.name, table.overlay_schema) != tuple(row[:3]):
        raise ValueError("no document and no held table of that stamp")
    return table


def _table_from_row(row: Sequence[str | None]) -> CowTable:
    schema, name, overlay, doc = row[:4]
    if schema is None or name is None or overlay is None or doc is None:
        raise ValueError("NULL in a catalog row")
    info: dict[str, Any] = json.loads(doc)
    return CowTable(
        schema=schema,
        name=name,
        overlay_schema=overlay,
        pk=tuple(info.get("pk") or ()),
        columns=tuple(
            Column(
                c["name"],
                c["type"],
                bool(c["generated"]),
                bool(c["identity"]),
                bool(c.get("identity_always")),
                c.get("default"),
            )
            for c in info["columns"]
        ),
        unique=tuple(
            UniqueKey(
                name=u["name"],
                columns=tuple(u["columns"]),
                is_constraint=bool(u["constraint"]),
                nulls_not_distinct=bool(u["nulls_not_distinct"]),
                partial=bool(u["partial"]),
                expressions=bool(u["expressions"]),
            )
            for u in info["unique"]
        ),
        referenced_by=tuple(
            ReferencingKey(r["schema"], r["table"], r["name"], r["on_delete"]) for r in info["referenced_by"]
        ),
        deferrable=tuple(
            DeferrableKey(d["schema"], d["name"], d["trigger"]) for d in info.get("deferrable") or ()
        ),
        indexed=frozenset(info.get("indexed") or ()),
        key=tuple(info.get("key") or ()),
        changes_table=info.get("changes"),
        row_security=bool(info.get("row_security")),
        rows=float(info.get("rows", -1)),
        changes_rows=float(-1 if info.get("changes_rows") is None else info["changes_rows"]),
        stamp=row[5] if len(row) > 5 else None,
    )


_pattern_cache: dict[frozenset[str], re.Pattern[str] | None] = {}
_lowered_cache: dict[frozenset[str], tuple[str, ...]] = {}


def _lowered(schemas: frozenset[str]) -> tuple[str, ...]:
    found = _lowered_cache.get(schemas)
    if found is None:
        if len(_lowered_cache) > 64:
            _lowered_cache.clear()
        found = _lowered_cache[schemas] = tuple(sorted(s.lower() for s in schemas))
    return found


def _schema_pattern(schemas: frozenset[str]) -> re.Pattern[str] | None:
    if schemas not in _pattern_cache:
        if len(_pattern_cache) > 64:
            _pattern_cache.clear()
        _pattern_cache[schemas] = (
            re.compile("|".join(rf"(?<![\w$]){re.escape(s)}(?![\w$])" for s in sorted(schemas)), re.I)
            if schemas
            else None
        )
    return _pattern_cache[schemas]
