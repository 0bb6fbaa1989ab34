"""Reduce each session to its last write per (table, pk) and pair ground-truth rows with agent rows.

Pairing, per table, parents before children (foreign-key order):
1. by key: an agent row whose key, with foreign-key parts translated through the id mapping, is a key the
   ground truth wrote (rows both sessions updated, and children whose parents are already aligned);
2. by similarity: the remaining rows that did not exist before the session (their keys were generated
   independently) are paired by an optimal assignment maximising total similarity
   (``scipy.optimize.linear_sum_assignment``), never below ``min_similarity``.
Every pair extends the id mapping (agent key -> ground-truth key), which changes how children compare; the
whole pass repeats until the mapping stops changing (a fixed point).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import networkx as nx
import numpy as np

from .compare import (
    UNMAPPED,
    Comparator,
    FieldContext,
    RowContext,
    RowFunction,
    Unmapped,
    exact,
    text_ratio,
)
from .config import ScoringConfig
from .errors import ScoringError
from .model import OTHER, ColumnMeta, Key, Metadata, TableMeta, Write, freeze, key_of

MAX_PASSES = 20


@dataclass(frozen=True, slots=True)
class Version:
    seq: int
    operation_id: str
    row: Mapping[str, Any] | None
    deleted: bool


@dataclass(frozen=True)
class Row:
    """A session's last write of one (table, pk)."""

    table: str
    key: Key
    pk: Mapping[str, Any]
    row: Mapping[str, Any] | None  # None when the last write deleted the row
    image: Mapping[str, Any] | None  # the last live version (what a deleted row looked like)
    deleted: bool
    operation_id: str
    seq: int
    created: bool | None
    versions: tuple[Version, ...]


Side = dict[str, dict[Key, Row]]


def reduce_writes(writes: Iterable[Write], metadata: Metadata, config: ScoringConfig) -> Side:
    """Last write per (table, pk); ignored tables dropped; with ``collapse``, rows created and deleted
    within the session dropped."""
    grouped: dict[tuple[str, Key], list[Write]] = {}
    ignoring = bool(config.ignore_tables)  # asked once, not once per write
    tables = metadata.tables
    for w in sorted(writes, key=_seq):
        if ignoring and config.table_ignored(w.table):
            continue
        grouped.setdefault((w.table, key_of(tables[w.table], w.pk)), []).append(w)
    side: Side = {}
    for (table, key), ws in grouped.items():
        last = ws[-1]
        if len(ws) == 1:  # most rows: one write, nothing to fold
            created = last.created
            image = None if last.deleted else last.row
        else:
            flags = {w.created for w in ws if w.created is not None}
            created = (True in flags) if flags else None
            image = next((w.row for w in reversed(ws) if not w.deleted and w.row is not None), None)
        if config.collapse and created and last.deleted:
            continue
        side.setdefault(table, {})[key] = Row(
            table=table,
            key=key,
            pk=dict(last.pk),
            row=None if last.deleted else last.row,
            image=image,
            deleted=last.deleted,
            operation_id=last.operation_id,
            seq=last.seq,
            created=created,
            versions=tuple(
                Version(w.seq, w.operation_id, None if w.deleted else w.row, w.deleted) for w in ws
            ),
        )
    return side


def _seq(w: Write) -> int:
    return w.seq


class IdMapping:
    """Agent key -> ground-truth key, per table, for every pair made so far."""

    def __init__(self, metadata: Metadata, agent: Side) -> None:
        self.metadata = metadata
        self.pairs: dict[str, dict[Key, Key]] = defaultdict(dict)
        self._agent = agent

    def map_key(self, table: str, key: Key) -> Key | Unmapped:
        mapped = self.pairs.get(table, {}).get(key)
        if mapped is not None:
            return mapped
        row = self._agent.get(table, {}).get(key)
        # A key the agent generated and the matching did not pair can equal nothing on the other side;
        # any other key (a row that existed before) means the same row on both sides.
        if row is not None and row.created:
            return UNMAPPED
        return key

    def translate(
        self, meta: TableMeta, values: Mapping[str, Any], only: Sequence[str] | None = None
    ) -> Mapping[str, Any]:
        """``values`` with foreign-key columns rewritten into the ground truth's key space (``values``
        itself, not a copy, when the table has no foreign key)."""
        if not meta.fks:
            return values
        out = dict(values)
        for fk in meta.fks:
            if only is not None and not set(fk.columns) <= set(only):
                continue
            ref = self.metadata.get(fk.ref_table)
            if ref is None or set(fk.ref_columns) != set(ref.pk):
                continue
            try:
                raw = [values[c] for c in fk.columns]
            except KeyError:
                continue
            if any(v is None for v in raw):
                continue
            by_ref = dict(zip(fk.ref_columns, raw, strict=True))
            mapped = self.map_key(fk.ref_table, tuple(freeze(by_ref[c]) for c in ref.pk))
            if isinstance(mapped, Unmapped):
                for c in fk.columns:
                    out[c] = UNMAPPED
                continue
            gt_by_ref = dict(zip(ref.pk, mapped, strict=True))
            for c, rc in zip(fk.columns, fk.ref_columns, strict=True):
                out[c] = gt_by_ref[rc] if gt_by_ref[rc] != freeze(values[c]) else values[c]
        return out


@dataclass(frozen=True)
class Pair:
    gt: Row
    agent: Row
    similarity: float
    fields: tuple[tuple[str, float], ...]
    how: str  # "key" or "similarity"


@dataclass(frozen=True)
class Unpaired:
    row: Row
    reason: str


@dataclass(frozen=True)
class TableMatch:
    table: str
    pairs: tuple[Pair, ...]
    missing: tuple[Unpaired, ...]
    extra: tuple[Unpaired, ...]


@dataclass(frozen=True)
class Matching:
    tables: Mapping[str, TableMatch]
    mapping: IdMapping
    # Agent key -> the ground-truth key it translates to (for per-operation scoring).
    mapped_keys: Mapping[str, Mapping[Key, Key]]


class _TableScorer:
    """Field comparison for one table: which columns count and with which comparator."""

    def __init__(self, meta: TableMeta, config: ScoringConfig, mapping: IdMapping, names: Iterable[str]):
        self.meta = meta
        self.mapping = mapping
        fk_cols = {c for fk in meta.fks for c in fk.columns}
        declared = [c.name for c in meta.columns]
        seen = set(declared)
        columns = declared + sorted(n for n in names if n not in seen)
        self.fields: list[tuple[str, Comparator, FieldContext]] = []
        for name in columns:
            # Generated surrogate keys say nothing about content; key parts that are foreign keys do.
            # (A keyless table's "key" is the whole row: all content.)
            if name in meta.pk and name not in fk_cols and not meta.keyless:
                continue
            if config.column_ignored(meta.name, name):
                continue
            col = meta.column(name)
            col = col or ColumnMeta(name, "unknown", OTHER)
            comp = config.column_comparator(meta.name, name)
            if comp is None:
                _, comp = config.category_comparator(col.category)
                if name in fk_cols and comp is not None:
                    comp = exact
            if comp is None:
                continue
            self.fields.append((name, comp, FieldContext(meta, col, mapping)))
        self.row_fn: RowFunction | None = config.row_function(meta.name)
        self.row_ctx = RowContext(meta, mapping)

    def compare(
        self, gt: Mapping[str, Any] | None, agent: Mapping[str, Any] | None
    ) -> tuple[float, tuple[tuple[str, float], ...]]:
        if gt is None or agent is None:
            return (1.0, ()) if gt is agent else (0.0, ())
        if self.row_fn is not None:
            got = self.row_fn(gt, agent, self.row_ctx)
            if isinstance(got, Mapping):
                items = tuple((k, _unit(v, self.meta.name)) for k, v in got.items())
                return (sum(v for _, v in items) / len(items) if items else 1.0), items
            return _unit(got, self.meta.name), ()
        items = tuple(
            (name, float(comp(gt.get(name), agent.get(name), ctx))) for name, comp, ctx in self.fields
        )
        if not items:
            return 1.0, ()
        return sum(v for _, v in items) / len(items), items

    def bounds(
        self, gt_rows: Sequence[Mapping[str, Any] | None], agent_rows: Sequence[Mapping[str, Any] | None]
    ) -> np.ndarray:
        """Upper bounds of ``compare``'s similarity for every (gt, agent) pair, computed column-wise:
        ``exact`` fields by value codes, text fields by their lengths (``_text_bound``),
        other comparators 1. A None row (a deletion, compared by its image) or a row function bounds 1."""
        shape = (len(gt_rows), len(agent_rows))
        if self.row_fn is not None or not self.fields:
            return np.ones(shape)
        total = np.zeros(shape)
        for name, comp, _ctx in self.fields:
            g_vals = [r.get(name) if r is not None else None for r in gt_rows]
            a_vals = [r.get(name) if r is not None else None for r in agent_rows]
            if comp is exact:
                total += _exact_bound(g_vals, a_vals)
            elif comp is text_ratio:
                total += _text_bound(g_vals, a_vals)
            else:
                total += 1.0
        out: np.ndarray = total / len(self.fields)
        g_none = np.array([r is None for r in gt_rows])
        a_none = np.array([r is None for r in agent_rows])
        out[g_none, :] = 1.0
        out[:, a_none] = 1.0
        return out

    def similarity(self, gt: Row, agent_row: Mapping[str, Any] | None, agent_deleted: bool) -> float:
        return self.compare_rows(gt, agent_row, agent_deleted)[0]

    def compare_rows(
        self,
        gt: Row,
        agent_row: Mapping[str, Any] | None,
        agent_deleted: bool,
        agent_image: Mapping[str, Any] | None = None,
    ) -> tuple[float, tuple[tuple[str, float], ...]]:
        if gt.deleted != agent_deleted:
            return 0.0, ()
        if gt.deleted:
            # Both deleted: the same deletion; compare what the rows looked like when both are known.
            if gt.image is not None and agent_image is not None:
                return self.compare(gt.image, agent_image)
            return 1.0, ()
        return self.compare(gt.row, agent_row)


def _code_key(value: Any) -> Any:
    """A key equal for any two values ``exact`` calls equal (1 and 1.0; never True and 1)."""
    if isinstance(value, Unmapped):
        return ("unmapped", id(value))  # ``exact`` never equals an unmapped agent value
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float, Decimal)):
        try:
            return ("number", float(value))
        except (OverflowError, ValueError):
            return ("number", str(value))
    return (type(value).__name__, freeze(value))


def _exact_bound(g_vals: Sequence[Any], a_vals: Sequence[Any]) -> np.ndarray | float:
    codes: dict[Any, int] = {}
    try:
        g = np.array([codes.setdefault(_code_key(v), len(codes)) for v in g_vals])
        a = np.array([codes.setdefault(_code_key(v), len(codes)) for v in a_vals])
    except TypeError:  # an unhashable value: no bound from this column
        return 1.0
    equal: np.ndarray = (g[:, None] == a[None, :]).astype(float)
    return equal


def _text_bound(g_vals: Sequence[Any], a_vals: Sequence[Any]) -> np.ndarray:
    """difflib's ratio is 2·M/T (M matched characters, T both lengths): M ≤ the shorter length, and two
    different texts of one length miss at least one character."""
    g_txt = [None if v is None else str(v) for v in g_vals]
    a_txt = [None if v is None else str(v) for v in a_vals]
    codes: dict[str | None, int] = {}
    g_code = np.array([codes.setdefault(t, len(codes)) for t in g_txt])
    a_code = np.array([codes.setdefault(t, len(codes)) for t in a_txt])
    lg = np.array([-1 if t is None else len(t) for t in g_txt], dtype=float)[:, None]
    la = np.array([-1 if t is None else len(t) for t in a_txt], dtype=float)[None, :]
    matched = np.minimum(lg, la) - (lg == la)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(lg + la > 0, 2.0 * matched / (lg + la), 0.0)
    equal = g_code[:, None] == a_code[None, :]  # the same text (or both None): 1
    one_none = (lg < 0) ^ (la < 0)
    out: np.ndarray = np.where(equal, 1.0, np.where(one_none, 0.0, np.clip(ratio, 0.0, 1.0)))
    return out


def _unit(value: Any, table: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ScoringError(f"row function for {table} returned {value!r}, not a number") from None
    if not 0.0 <= v <= 1.0:
        raise ScoringError(f"row function for {table} returned {v}, outside [0, 1]")
    return v


def table_order(metadata: Metadata, tables: Iterable[str]) -> list[str]:
    """Parents before children along foreign keys; cycles (and self references) stay together."""
    names = sorted(set(tables))
    graph = nx.DiGraph()
    graph.add_nodes_from(names)
    for t in names:
        meta = metadata.tables[t]
        for fk in meta.fks:
            if fk.ref_table in graph and fk.ref_table != t:
                graph.add_edge(fk.ref_table, t)
    cond = nx.condensation(graph)
    order: list[str] = []
    for comp in nx.lexicographical_topological_sort(cond, key=lambda n: min(cond.nodes[n]["members"])):
        order.extend(sorted(cond.nodes[comp]["members"]))
    return order


def match_sessions(
    gt: Side,
    agent: Side,
    metadata: Metadata,
    config: ScoringConfig,
    *,
    prune: bool = False,
    gt_children: Mapping[str, Mapping[Key, int]] | None = None,
) -> Matching:
    """Pair the two sessions' rows. ``prune``: skip comparing rows whose similarity bound is below
    ``min_similarity`` (the same pairs; only the "best candidate" reasons of unpaired rows may differ).
    ``gt_children``: ``children_of(gt, metadata)`` when already known (a prepared ground truth)."""
    mapping = IdMapping(metadata, agent)
    tables = table_order(metadata, set(gt) | set(agent))
    parents: dict[str, set[str]] = {
        t: {fk.ref_table for fk in metadata.tables[t].fks if fk.ref_table in metadata.tables} for t in tables
    }
    kids = (children_of(gt, metadata) if gt_children is None else gt_children, children_of(agent, metadata))
    results: dict[str, TableMatch] = {}
    mapped_keys: dict[str, dict[Key, Key]] = {}
    version = dict.fromkeys(tables, 0)
    seen_versions: dict[str, dict[str, int]] = {}
    for _ in range(MAX_PASSES):
        changed = False
        for t in tables:
            deps = {p: version.get(p, 0) for p in parents[t]}
            if t in results and seen_versions.get(t) == deps:
                continue  # nothing it depends on moved since it was last paired
            seen_versions[t] = deps
            result, keys = _match_table(
                t,
                gt_rows=gt.get(t, {}),
                ag_rows=agent.get(t, {}),
                metadata=metadata,
                config=config,
                mapping=mapping,
                kids=(kids[0].get(t, {}), kids[1].get(t, {})),
                prune=prune,
            )
            new_pairs = {p.agent.key: p.gt.key for p in result.pairs}
            if new_pairs != mapping.pairs.get(t, {}):
                mapping.pairs[t] = new_pairs
                version[t] += 1
                changed = True
            results[t] = result
            mapped_keys[t] = keys
        if not changed:
            break
    return Matching(results, mapping, mapped_keys)


@dataclass
class _Found:
    """What the pairing of one table has found so far: the pairs, the rows they took, why the rows a key
    named were not paired, and each agent key's mapped key."""

    pairs: list[Pair] = field(default_factory=list)
    paired_gt: set[Key] = field(default_factory=set)
    paired_ag: set[Key] = field(default_factory=set)
    reasons: dict[tuple[str, Key], str] = field(default_factory=dict)
    mapped_keys: dict[Key, Key] = field(default_factory=dict)

    def add(self, pair: Pair) -> None:
        self.pairs.append(pair)
        self.paired_gt.add(pair.gt.key)
        self.paired_ag.add(pair.agent.key)


def _match_table(
    table: str,
    *,
    gt_rows: Mapping[Key, Row],
    ag_rows: Mapping[Key, Row],
    metadata: Metadata,
    config: ScoringConfig,
    mapping: IdMapping,
    kids: tuple[Mapping[Key, int], Mapping[Key, int]] = ({}, {}),
    prune: bool = False,
) -> tuple[TableMatch, dict[Key, Key]]:
    meta = metadata.tables[table]
    names: set[str] = set()
    for r in (*gt_rows.values(), *ag_rows.values()):
        names.update((r.row or r.image or {}).keys())
    scorer = _TableScorer(meta, config, mapping, names)
    translated, images = _translate_agent_rows(meta, mapping, ag_rows)
    found = _pair_by_key(
        meta, mapping, gt_rows=gt_rows, ag_rows=ag_rows, scorer=scorer, translated=translated, images=images
    )
    # Rows that existed before the session are identified by their key only: editing another
    # existing row is never a match for this one.
    g_rem = [g for k, g in gt_rows.items() if k not in found.paired_gt and g.created is not False]
    a_rem = [a for k, a in ag_rows.items() if k not in found.paired_ag and a.created is not False]
    if g_rem and a_rem:
        for gi, ai, sim, fields in _assign(
            g_rem,
            a_rem,
            scorer=scorer,
            translated=translated,
            images=images,
            config=config,
            reasons=found.reasons,
            kids=kids,
            prune=prune,
        ):
            found.add(Pair(g_rem[gi], a_rem[ai], sim, fields, "similarity"))
    missing = tuple(
        Unpaired(g, found.reasons.get(("gt", k), _missing_reason(g, bool(a_rem))))
        for k, g in gt_rows.items()
        if k not in found.paired_gt
    )
    extra = tuple(
        Unpaired(a, found.reasons.get(("agent", k), _extra_reason(a, bool(g_rem))))
        for k, a in ag_rows.items()
        if k not in found.paired_ag
    )
    found.pairs.sort(key=lambda p: p.gt.seq)
    return TableMatch(table, tuple(found.pairs), missing, extra), found.mapped_keys


def _translate_agent_rows(
    meta: TableMeta, mapping: IdMapping, ag_rows: Mapping[Key, Row]
) -> tuple[dict[Key, Mapping[str, Any] | None], dict[Key, Mapping[str, Any] | None]]:
    """The agent's rows and their images with the ground truth's ids (a live row's image is its row:
    translated once)."""
    translated = {
        k: (mapping.translate(meta, a.row) if a.row is not None else None) for k, a in ag_rows.items()
    }
    images = {
        k: translated[k]
        if a.image is a.row
        else mapping.translate(meta, a.image)
        if a.image is not None
        else None
        for k, a in ag_rows.items()
    }
    return translated, images


def _pair_by_key(
    meta: TableMeta,
    mapping: IdMapping,
    *,
    gt_rows: Mapping[Key, Row],
    ag_rows: Mapping[Key, Row],
    scorer: _TableScorer,
    translated: Mapping[Key, Mapping[str, Any] | None],
    images: Mapping[Key, Mapping[str, Any] | None],
) -> _Found:
    """The rows an agent key names on the ground truth's side (through the id mapping when a foreign key is
    part of the primary key), unless both sides inserted a row whose key the database generated (those pair
    by similarity) or one side deleted the row and the other kept it (the reason is noted)."""
    found = _Found()
    fk_cols = {c for fk in meta.fks for c in fk.columns}
    generated_key = any(
        (col := meta.column(c)) is not None and col.generated and c not in fk_cols for c in meta.pk
    )
    # Without a foreign key inside the primary key, an agent key means the same row on both sides.
    key_fks = any(set(fk.columns) <= set(meta.pk) for fk in meta.fks)
    for k, a in ag_rows.items():
        mk = k
        if key_fks:
            mk_values = mapping.translate(meta, a.pk, only=meta.pk)
            if any(isinstance(v, Unmapped) for v in mk_values.values()):
                continue
            mk = key_of(meta, mk_values)
        g = gt_rows.get(mk)
        if g is not None and generated_key and a.created and g.created:
            continue  # both sides inserted and the database generated the key: pair by similarity
        found.mapped_keys[k] = mk
        if g is None or mk in found.paired_gt:
            continue
        if g.deleted != a.deleted:
            what = "deleted" if a.deleted else "kept"
            found.reasons[("gt", mk)] = f"the agent {what} this row, the ground truth did not"
            found.reasons[("agent", k)] = f"the ground truth {'deleted' if g.deleted else 'kept'} this row"
            continue
        sim, fields = scorer.compare_rows(g, translated[k], a.deleted, images[k])
        found.pairs.append(Pair(g, a, sim, fields, "key"))
        found.paired_gt.add(mk)
        found.paired_ag.add(k)
    return found


def children_of(side: Side, metadata: Metadata) -> dict[str, dict[Key, int]]:
    """Per table and key: how many live rows of the session reference that row (its own key space)."""
    out: dict[str, dict[Key, int]] = defaultdict(lambda: defaultdict(int))
    for table, rows in side.items():
        meta = metadata.tables.get(table)
        if meta is None:
            continue
        for fk in meta.fks:
            ref = metadata.tables.get(fk.ref_table)
            if ref is None or set(fk.ref_columns) != set(ref.pk):
                continue
            for r in rows.values():
                if r.row is None:
                    continue
                by_ref = {rc: r.row.get(c) for c, rc in zip(fk.columns, fk.ref_columns, strict=True)}
                if any(v is None for v in by_ref.values()):
                    continue
                out[fk.ref_table][tuple(freeze(by_ref[c]) for c in ref.pk)] += 1
    return {table: dict(counts) for table, counts in out.items()}


def _missing_reason(g: Row, had_candidates: bool) -> str:
    if g.created is False:
        return "the agent did not write this existing row"
    return (
        "no agent row of this table was similar enough" if had_candidates else "the agent wrote no such row"
    )


def _extra_reason(a: Row, had_candidates: bool) -> str:
    if a.created is False:
        return "the ground truth did not change this existing row"
    return (
        "no ground-truth row of this table was similar enough"
        if had_candidates
        else "the ground truth wrote no such row"
    )


def _fingerprint(scorer: _TableScorer, row: Mapping[str, Any] | None, deleted: bool) -> Any:
    if row is None:
        return (deleted,)
    return (
        deleted,
        tuple(
            freeze(row.get(name)) if not isinstance(row.get(name), Unmapped) else object()
            for name, _, _ in scorer.fields
        ),
    )


# (ground-truth row, agent row, similarity, per-field similarities)
Pairing = tuple[int, int, float, tuple[tuple[str, float], ...]]
# (ground-truth rows, agent rows, the candidate cells to compare, or None: all)
Block = tuple[list[int], list[int], set[tuple[int, int]] | None]


def _assign(
    g_rem: list[Row],
    a_rem: list[Row],
    *,
    scorer: _TableScorer,
    translated: Mapping[Key, Mapping[str, Any] | None],
    images: Mapping[Key, Mapping[str, Any] | None],
    config: ScoringConfig,
    reasons: dict[tuple[str, Key], str],
    kids: tuple[Mapping[Key, int], Mapping[Key, int]] = ({}, {}),
    prune: bool = False,
) -> list[Pairing]:
    """Optimal assignment of the remaining rows; identical rows first when the matrix would be huge."""
    out: list[Pairing] = []
    gi_left = list(range(len(g_rem)))
    ai_left = list(range(len(a_rem)))
    if len(g_rem) * len(a_rem) > config.max_dense_cells and scorer.row_fn is None:
        out, gi_left, ai_left = _pair_identical(
            g_rem, a_rem, scorer=scorer, translated=translated, images=images
        )
    if not gi_left or not ai_left:
        return out
    blocks: list[Block] = [(gi_left, ai_left, None)]
    if len(gi_left) * len(ai_left) > config.max_dense_cells:
        blocks = _blocks(gi_left, ai_left, g_rem=g_rem, a_rem=a_rem, scorer=scorer, translated=translated)
    block = _BlockAssignment(g_rem, a_rem, scorer, translated, images, config, kids)
    for gis, ais, candidates in blocks:
        out.extend(block.assign(gis, ais, candidates, prune=prune, reasons=reasons))
    return out


def _pair_identical(
    g_rem: list[Row],
    a_rem: list[Row],
    *,
    scorer: _TableScorer,
    translated: Mapping[Key, Mapping[str, Any] | None],
    images: Mapping[Key, Mapping[str, Any] | None],
) -> tuple[list[Pairing], list[int], list[int]]:
    """Fast path for large tables: a row identical to a row on the other side scores 1.0, the maximum, so
    pairing identical rows first loses little and shrinks the matrix to the rows that differ. Returns the
    pairs and the rows left on each side."""
    out: list[Pairing] = []
    by_print: dict[Any, list[int]] = defaultdict(list)
    for i, g in enumerate(g_rem):
        by_print[_fingerprint(scorer, g.row if not g.deleted else g.image, g.deleted)].append(i)
    rest_a: list[int] = []
    for j, a in enumerate(a_rem):
        fp = _fingerprint(scorer, translated[a.key] if not a.deleted else images[a.key], a.deleted)
        bucket = by_print.get(fp)
        if bucket:
            i = bucket.pop(0)
            sim, fields = scorer.compare_rows(g_rem[i], translated[a.key], a.deleted, images[a.key])
            out.append((i, j, sim, fields))
        else:
            rest_a.append(j)
    used = {i for i, _, _, _ in out}
    return out, [i for i in range(len(g_rem)) if i not in used], rest_a


@dataclass(frozen=True)
class _BlockAssignment:
    """One optimal assignment (LAPJV) over a block of rows, with the reasons the unpaired rows stayed so."""

    g_rem: list[Row]
    a_rem: list[Row]
    scorer: _TableScorer
    translated: Mapping[Key, Mapping[str, Any] | None]
    images: Mapping[Key, Mapping[str, Any] | None]
    config: ScoringConfig
    kids: tuple[Mapping[Key, int], Mapping[Key, int]]

    def assign(
        self,
        gis: list[int],
        ais: list[int],
        candidates: set[tuple[int, int]] | None,
        *,
        prune: bool,
        reasons: dict[tuple[str, Key], str],
    ) -> list[Pairing]:
        cells = self._cells(gis, ais, candidates, prune=prune)
        weights, cache = self._weights(gis, ais, cells)
        # Imported here: scipy.optimize takes ~0.7 s to import, which every `cowproxy` command would pay.
        from scipy.optimize import linear_sum_assignment  # noqa: PLC0415

        rows_idx, cols_idx = linear_sum_assignment(weights, maximize=True)
        out: list[Pairing] = []
        chosen_g: set[int] = set()
        chosen_a: set[int] = set()
        for x, y in zip(rows_idx.tolist(), cols_idx.tolist(), strict=True):
            if weights[x, y] > 0:
                sim, fields = cache[(x, y)]
                out.append((gis[x], ais[y], sim, fields))
                chosen_g.add(x)
                chosen_a.add(y)
        self._explain_unpaired(gis, ais, cache, chosen_g=chosen_g, chosen_a=chosen_a, reasons=reasons)
        return out

    def _cells(
        self, gis: list[int], ais: list[int], candidates: set[tuple[int, int]] | None, *, prune: bool
    ) -> Iterable[tuple[int, int]]:
        """The cells worth comparing: a block's candidates, or all, or with ``prune`` only the pairs that can
        reach min_similarity (the others' weight would be 0 anyway)."""
        if candidates is not None:
            return candidates
        if not prune:
            return ((x, y) for x in range(len(gis)) for y in range(len(ais)))
        bounds = self.scorer.bounds(
            [None if self.g_rem[i].deleted else self.g_rem[i].row for i in gis],
            [None if self.a_rem[j].deleted else self.translated[self.a_rem[j].key] for j in ais],
        )
        return [(int(x), int(y)) for x, y in np.argwhere(bounds >= self.config.min_similarity - 1e-9)]

    def _weights(
        self, gis: list[int], ais: list[int], cells: Iterable[tuple[int, int]]
    ) -> tuple[Any, dict[tuple[int, int], tuple[float, tuple[tuple[str, float], ...]]]]:
        weights = np.zeros((len(gis), len(ais)))
        cache: dict[tuple[int, int], tuple[float, tuple[tuple[str, float], ...]]] = {}
        for x, y in cells:
            g, a = self.g_rem[gis[x]], self.a_rem[ais[y]]
            if g.deleted != a.deleted:
                continue
            sim, fields = self.scorer.compare_rows(g, self.translated[a.key], a.deleted, self.images[a.key])
            cache[(x, y)] = (sim, fields)
            if sim >= self.config.min_similarity:
                # The epsilon keeps a pair at similarity 0 (min_similarity 0) distinct from "no pair". Among
                # equally similar rows, prefer pairs whose rows have as many children on both sides (their
                # children can then pair through the id mapping): otherwise the tie is broken by row order,
                # and which side is the ground truth would change the score.
                shared = min(self.kids[0].get(g.key, 0), self.kids[1].get(a.key, 0), 1000)
                weights[x, y] = sim + 1e-9 + 1e-9 * shared
        return weights, cache

    def _explain_unpaired(
        self,
        gis: list[int],
        ais: list[int],
        cache: Mapping[tuple[int, int], tuple[float, Any]],
        *,
        chosen_g: set[int],
        chosen_a: set[int],
        reasons: dict[tuple[str, Key], str],
    ) -> None:
        threshold = self.config.min_similarity
        for x, i in enumerate(gis):
            if x not in chosen_g:
                best = max((cache[(x, y)][0] for y in range(len(ais)) if (x, y) in cache), default=None)
                if best is not None:
                    reasons[("gt", self.g_rem[i].key)] = _below(best, threshold, "agent")
        for y, j in enumerate(ais):
            if y not in chosen_a:
                best = max((cache[(x, y)][0] for x in range(len(gis)) if (x, y) in cache), default=None)
                if best is not None:
                    reasons[("agent", self.a_rem[j].key)] = _below(best, threshold, "ground-truth")


def _below(best: float, threshold: float, side: str) -> str:
    if best >= threshold:
        return f"every similar {side} row was paired with a better match (best similarity {best:.2f})"
    return f"best {side} candidate similarity {best:.2f} < min_similarity {threshold:.2f}"


# Largest block (rows per side) given to one assignment in the large-table path: the assignment itself is
# fast (LAPJV); only candidate cells are compared, so the cost is the number of candidates.
MAX_BLOCK = 2_000
# A value shared by more rows than this on one side (a status, a project id) does not discriminate.
MAX_TOKEN_ROWS = 50


def _blocks(
    gis: list[int],
    ais: list[int],
    *,
    g_rem: list[Row],
    a_rem: list[Row],
    scorer: _TableScorer,
    translated: Mapping[Key, Mapping[str, Any] | None],
) -> list[Block]:
    """Split a too-large assignment into independent blocks with their candidate pairs: two rows are
    candidates when they share an exact value in some compared column, and connected candidates form a
    block. Rows sharing no value with any row on the other side are not compared (an approximation for
    large tables only); blocks beyond MAX_BLOCK rows per side are cut in order."""
    index = _value_index(gis, ais, g_rem=g_rem, a_rem=a_rem, scorer=scorer, translated=translated)
    # Edges in index order (not the set's): the order of the components, so of the pairs, stays fixed.
    edges = [
        (i, j)
        for gs, as_ in index.values()
        if gs and as_ and len(gs) <= MAX_TOKEN_ROWS and len(as_) <= MAX_TOKEN_ROWS
        for i in gs
        for j in as_
    ]
    pairs = set(edges)
    graph = nx.Graph()
    graph.add_edges_from((("g", i), ("a", j)) for i, j in edges)
    blocks, where = _cut_blocks(graph)
    for i, j in pairs:
        gb, ab = where.get(("g", i)), where.get(("a", j))
        if gb is not None and ab is not None and gb[0] == ab[0]:
            cand = blocks[gb[0]][2]
            assert cand is not None
            cand.add((gb[1], ab[1]))
    return blocks


def _value_index(
    gis: list[int],
    ais: list[int],
    *,
    g_rem: list[Row],
    a_rem: list[Row],
    scorer: _TableScorer,
    translated: Mapping[Key, Mapping[str, Any] | None],
) -> dict[Any, tuple[list[int], list[int]]]:
    """(column, value) -> (ground-truth rows, agent rows) holding it."""
    index: dict[Any, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
    for i in gis:
        g = g_rem[i]
        for name, _, _ in scorer.fields:
            value = (g.row or g.image or {}).get(name)
            if value is not None:
                index[(name, freeze(value))][0].append(i)
    for j in ais:
        a = translated[a_rem[j].key] or {}
        for name, _, _ in scorer.fields:
            value = a.get(name)
            if value is not None and not isinstance(value, Unmapped):
                index[(name, freeze(value))][1].append(j)
    return index


def _cut_blocks(graph: nx.Graph) -> tuple[list[Block], dict[tuple[str, int], tuple[int, int]]]:
    """A block per connected component, cut into MAX_BLOCK rows per side, each with an empty candidate set,
    and where each row landed: (block, position in it)."""
    blocks: list[Block] = []
    where: dict[tuple[str, int], tuple[int, int]] = {}
    for comp in nx.connected_components(graph):
        bg = sorted(i for s, i in comp if s == "g")
        ba = sorted(j for s, j in comp if s == "a")
        for start in range(0, max(len(bg), len(ba)), MAX_BLOCK):
            cg, ca = bg[start : start + MAX_BLOCK], ba[start : start + MAX_BLOCK]
            if cg and ca:
                where.update((("g", i), (len(blocks), x)) for x, i in enumerate(cg))
                where.update((("a", j), (len(blocks), y)) for y, j in enumerate(ca))
                blocks.append((cg, ca, set()))
    return blocks, where
