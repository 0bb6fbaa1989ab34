"""``score_writes``: the whole comparison of two sessions, in memory.

Per-operation utilities (docs/scoring.md): u_struct(o_i) is s_struct after o_i minus s_struct before, with the
agent's operations in topological order (FK and same-row dependencies, ties broken by first write). The
state after a prefix of operations keeps, for each row, the newest write of those operations. Rather than
re-running the matching for each prefix, each prefix is scored against the final id mapping and pairs:
a ground-truth row counts as matched after o_i when its key partner is present with the same deleted state,
or its similarity partner is present with a version still above ``min_similarity``. Only the rows an
operation touches are re-evaluated, so all prefixes cost O(writes); the sum of the utilities is the final
s_struct minus the empty prefix's (0 whenever the ground truth wrote anything).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import networkx as nx

from .config import ScoringConfig, make_config
from .match import Matching, Row, Side, Version, _TableScorer, children_of, match_sessions, reduce_writes
from .model import Key, Metadata, Write, complete_metadata, freeze
from .result import (
    Alternative,
    Counts,
    FieldDiff,
    OperationUtility,
    RowExplanation,
    ScoringResult,
    Stats,
    TableScore,
    score_functions,
)


@dataclass(frozen=True)
class PreparedTruth:
    """A ground truth reduced once (last write per row, its operations, the children of its rows), to be
    scored against many agent sessions (``score_prepared``); ``prepare_truth`` builds it."""

    gt: str
    writes: tuple[Write, ...]
    base: Metadata | None  # the metadata it was prepared with (before tables were inferred)
    metadata: Metadata
    config: ScoringConfig
    side: Side
    rows: int
    operations: int
    children: Mapping[str, Mapping[Key, int]]


def prepare_truth(
    gt_writes: Sequence[Write],
    metadata: Metadata | None = None,
    *,
    config: ScoringConfig | str | None = None,
    gt: str = "gt",
    **options: Any,
) -> PreparedTruth:
    """The ground truth's half of ``score_writes``, done once for every agent scored against it."""
    cfg = make_config(config, **options)
    return _prepare(tuple(gt_writes), metadata, cfg, gt, complete_metadata(metadata, gt_writes))


def _prepare(
    writes: tuple[Write, ...], base: Metadata | None, cfg: ScoringConfig, gt: str, meta: Metadata
) -> PreparedTruth:
    side = reduce_writes(writes, meta, cfg)
    return PreparedTruth(
        gt=gt,
        writes=writes,
        base=base,
        metadata=meta,
        config=cfg,
        side=side,
        rows=sum(len(rows) for rows in side.values()),
        operations=len({w.operation_id for w in writes if not cfg.table_ignored(w.table)}),
        children=children_of(side, meta),
    )


def score_writes(
    gt_writes: Sequence[Write],
    agent_writes: Sequence[Write],
    metadata: Metadata | None = None,
    *,
    config: ScoringConfig | str | None = None,
    gt: str = "gt",
    agent: str = "agent",
    explain: bool = True,
    per_operation: bool = True,
    info: Mapping[str, Any] | None = None,
    **options: Any,
) -> ScoringResult:
    """Score an agent session's writes against a ground-truth session's writes.

    ``options`` override the config (``min_similarity``, ``collapse``, ``ignore_tables``, ``ignore_columns``,
    ``compare_timestamps``, ``numeric_tolerance``, ``types``, ``column_comparators``, ``row_functions``).
    Tables missing from ``metadata`` are described from the writes (columns, value types, no FKs).
    """
    truth = prepare_truth(gt_writes, metadata, config=config, gt=gt, **options)
    return score_prepared(
        truth, agent_writes, agent=agent, explain=explain, per_operation=per_operation, info=info
    )


def score_prepared(
    truth: PreparedTruth,
    agent_writes: Sequence[Write],
    *,
    agent: str = "agent",
    explain: bool = True,
    per_operation: bool = True,
    info: Mapping[str, Any] | None = None,
) -> ScoringResult:
    """``score_writes`` against a prepared ground truth (the same result)."""
    if any(w.table not in truth.metadata.tables for w in agent_writes):
        # A table described from the writes: described from both sessions' writes, as score_writes does.
        meta = complete_metadata(truth.base, [*truth.writes, *agent_writes])
        truth = _prepare(truth.writes, truth.base, truth.config, truth.gt, meta)
    cfg, meta, gt_side, n_gt = truth.config, truth.metadata, truth.side, truth.rows
    ag_side = reduce_writes(agent_writes, meta, cfg)
    matching = match_sessions(gt_side, ag_side, meta, cfg, prune=not explain, gt_children=truth.children)

    pairs = [p for tm in matching.tables.values() for p in tm.pairs]
    n_ag = sum(len(rows) for rows in ag_side.values())
    m = len(pairs)
    both_empty = n_gt == 0 and n_ag == 0
    struct = _ratio(m, n_gt + n_ag - m, both_empty)
    content = sum(p.similarity for p in pairs) / m if m else (1.0 if both_empty else 0.0)
    precision = _ratio(m, n_ag, both_empty)
    recall = _ratio(m, n_gt, both_empty)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0

    kept = [w for w in agent_writes if not cfg.table_ignored(w.table)]
    order = operation_order(kept, meta)
    gt_ops = truth.operations
    agent_ops = len(order)
    wasted = _wasted_ops(order, ag_side)
    if agent_ops:
        efficiency = min(1.0, gt_ops / agent_ops) * (1 - wasted / agent_ops)
    else:
        efficiency = 1.0 if gt_ops == 0 else 0.0
    counts = Counts(m, n_gt - m, n_ag - m, gt_ops, agent_ops, wasted)

    operations: tuple[OperationUtility, ...] = ()
    if per_operation:
        operations = _utilities(
            order, gt=gt_side, agent=ag_side, matching=matching, metadata=meta, config=cfg, n_gt=n_gt
        )
    stats = Stats(struct, content, efficiency, precision, recall, f1, counts)
    scores = {name: float(fn(stats)) for name, fn in {**score_functions(), **cfg.score_functions}.items()}
    return ScoringResult(
        gt=truth.gt,
        agent=agent,
        struct_score=struct,
        content_score=content,
        overall=0.5 * struct + 0.5 * content,
        efficiency=efficiency,
        precision=precision,
        recall=recall,
        f1=f1,
        counts=counts,
        operations=operations,
        scores=scores,
        tables=_tables(matching, gt_side, ag_side),
        rows=_explain(matching) if explain else (),
        info=dict(info or {}),
    )


def best_alternative(results: Sequence[ScoringResult]) -> ScoringResult:
    """The result against the best ground truth by ``overall`` (the first one on ties), carrying every
    alternative's overall score."""
    if not results:
        raise ValueError("no ground truth to score against")
    best = max(results, key=lambda r: r.overall)  # max keeps the first of equal values
    alternatives = tuple(Alternative(r.gt, r.overall) for r in results)
    return replace(best, alternatives=alternatives) if len(results) > 1 else best


def score_alternatives(
    gt_writes: Mapping[str, Sequence[Write]],
    agent_writes: Sequence[Write],
    metadata: Metadata | None = None,
    **options: Any,
) -> ScoringResult:
    """Score the agent against each ground truth of ``gt_writes`` (session id -> writes, several valid end
    states of one task) and keep the best by ``overall``; options as for ``score_writes``."""
    return best_alternative(
        [score_writes(writes, agent_writes, metadata, gt=gt, **options) for gt, writes in gt_writes.items()]
    )


def _ratio(num: int, den: int, both_empty: bool) -> float:
    if den:
        return num / den
    return 1.0 if both_empty else 0.0


def operation_order(writes: Sequence[Write], metadata: Metadata) -> list[str]:
    """The agent's operations in topological order of a DAG of dependencies, oldest first on ties.

    o_j depends on o_i when o_j writes a row o_i wrote before (same-row) or a row referencing, through a
    foreign key, a row o_i wrote before (FK). Interleaved operations can form cycles; a cycle is scored as
    one block in order of first write.
    """
    ordered = sorted(writes, key=lambda w: w.seq)
    first: dict[str, int] = {}
    for w in ordered:
        first.setdefault(w.operation_id, w.seq)
    edges = _dependencies(ordered, metadata)
    if all(first[a] < first[b] for a, b in edges):
        # Every dependency points forward in time (the common case): the lexicographic topological order
        # below is then the order of first writes, without building the graph.
        return sorted(first, key=first.__getitem__)
    graph = nx.DiGraph()
    graph.add_nodes_from(first)
    graph.add_edges_from(edges)
    cond = nx.condensation(graph)
    order: list[str] = []
    for node in nx.lexicographical_topological_sort(
        cond, key=lambda n: min(first[o] for o in cond.nodes[n]["members"])
    ):
        order.extend(sorted(cond.nodes[node]["members"], key=lambda o: first[o]))
    return order


def _dependencies(ordered: Sequence[Write], metadata: Metadata) -> dict[tuple[str, str], None]:
    """Edges (o_i, o_j) of ``operation_order``'s DAG, from writes in ``seq`` order (first found first)."""
    edges: dict[tuple[str, str], None] = {}
    history: dict[tuple[str, Key], tuple[list[int], list[str]]] = {}
    for w in ordered:
        meta = metadata.tables[w.table]
        key = tuple(freeze(w.pk[c]) for c in meta.pk)
        seqs, ops = history.setdefault((w.table, key), ([], []))
        if ops and ops[-1] != w.operation_id:
            edges[(ops[-1], w.operation_id)] = None
        if w.row is not None:
            for fk in meta.fks:
                ref = metadata.get(fk.ref_table)
                if ref is None or set(fk.ref_columns) != set(ref.pk):
                    continue
                values = [w.row.get(c) for c in fk.columns]
                if any(v is None for v in values):
                    continue
                by_ref = dict(zip(fk.ref_columns, values, strict=True))
                parent = history.get((fk.ref_table, tuple(freeze(by_ref[c]) for c in ref.pk)))
                if parent:
                    p_seqs, p_ops = parent
                    idx = bisect_left(p_seqs, w.seq) - 1
                    if idx >= 0 and p_ops[idx] != w.operation_id:
                        edges[(p_ops[idx], w.operation_id)] = None
        seqs.append(w.seq)
        ops.append(w.operation_id)
    return edges


def _wasted_ops(order: Sequence[str], agent: Side) -> int:
    """Operations none of whose writes last: every row they wrote was overwritten by another operation, or
    was created and deleted within the session."""
    lasting: set[str] = set()
    for rows in agent.values():
        for r in rows.values():
            if not (r.created and r.deleted):
                lasting.add(r.operation_id)
    return sum(1 for o in order if o not in lasting)


def _utilities(
    order: Sequence[str],
    *,
    gt: Side,
    agent: Side,
    matching: Matching,
    metadata: Metadata,
    config: ScoringConfig,
    n_gt: int,
) -> tuple[OperationUtility, ...]:
    """u_struct and u_content of each operation, in ``order`` (module docstring)."""
    prefix = _Prefix(gt=gt, agent=agent, matching=matching, metadata=metadata, config=config)
    by_op = _versions_by_operation(agent)
    last_writer = _last_writers(agent)
    similarity_of = {(t, p.agent.key): p.similarity for t, tm in matching.tables.items() for p in tm.pairs}
    before = 0.0 if n_gt else 1.0
    out: list[OperationUtility] = []
    for op in order:
        prefix.apply(by_op.get(op, ()))
        after = _ratio(prefix.matched, n_gt + prefix.extra, n_gt == 0 and not prefix.present)
        sims = [
            similarity_of[(r.table, r.key)]
            for r in last_writer.get(op, ())
            if (r.table, r.key) in similarity_of
        ]
        out.append(
            OperationUtility(
                operation_id=op,
                struct_utility=after - before,
                content_utility=sum(sims) / len(sims) if sims else 0.0,
                rows=len(last_writer.get(op, ())),
                matched_rows=len(sims),
            )
        )
        before = after
    return tuple(out)


def _versions_by_operation(agent: Side) -> dict[str, list[tuple[str, Key, Version]]]:
    """Every version of every agent row, grouped by the operation that wrote it."""
    by_op: dict[str, list[tuple[str, Key, Version]]] = defaultdict(list)
    for table, rows in agent.items():
        for akey, r in rows.items():
            for v in r.versions:
                by_op[v.operation_id].append((table, akey, v))
    return by_op


def _last_writers(agent: Side) -> dict[str, list[Row]]:
    """The agent's final rows, grouped by the operation that wrote each last."""
    last_writer: dict[str, list[Row]] = defaultdict(list)
    for rows in agent.values():
        for r in rows.values():
            last_writer[r.operation_id].append(r)
    return last_writer


class _Prefix:
    """The state after a prefix of the agent's operations, scored against the final matching: which
    ground-truth rows are matched (by their key partner, or by their similarity partner in a version still
    above ``min_similarity``) and how many agent rows are present."""

    def __init__(
        self, *, gt: Side, agent: Side, matching: Matching, metadata: Metadata, config: ScoringConfig
    ) -> None:
        self.gt, self.agent, self.matching, self.metadata, self.config = gt, agent, matching, metadata, config
        # Final partners of each ground-truth row: by key (the agent key translating to it) and by similarity.
        self.key_partner: dict[tuple[str, Key], Key] = {}
        self.sim_partner: dict[tuple[str, Key], Key] = {}
        self.gt_of_key: dict[tuple[str, Key], Key] = {}
        self.gt_of_sim: dict[tuple[str, Key], Key] = {}
        for table, keys in matching.mapped_keys.items():
            for akey, mk in keys.items():
                if mk in gt.get(table, {}) and (table, mk) not in self.key_partner:
                    self.key_partner[(table, mk)] = akey
                    self.gt_of_key[(table, akey)] = mk
        for table, tm in matching.tables.items():
            for p in tm.pairs:
                if p.how == "similarity":
                    self.sim_partner[(table, p.gt.key)] = p.agent.key
                    self.gt_of_sim[(table, p.agent.key)] = p.gt.key
        self.present: dict[tuple[str, Key], Version] = {}
        self.matched_by: dict[tuple[str, Key], Key | None] = {}
        self.matched = 0
        self._scorers: dict[str, _TableScorer] = {}
        self._sim_cache: dict[tuple[str, Key, int], bool] = {}

    @property
    def extra(self) -> int:
        return len(self.present) - self.matched

    def apply(self, versions: Sequence[tuple[str, Key, Version]]) -> None:
        """Add one operation's writes, then re-evaluate the ground-truth rows they can affect."""
        touched: set[tuple[str, Key]] = set()
        for table, akey, v in versions:
            cur = self.present.get((table, akey))
            if cur is None or v.seq > cur.seq:
                self.present[(table, akey)] = v
            for partner in (self.gt_of_key.get((table, akey)), self.gt_of_sim.get((table, akey))):
                if partner is not None:
                    touched.add((table, partner))
        for table, gkey in touched:
            old = self.matched_by.get((table, gkey))
            new = self._evaluate(table, gkey)
            self.matched_by[(table, gkey)] = new
            self.matched += (new is not None) - (old is not None)

    def _scorer(self, table: str) -> _TableScorer:
        if table not in self._scorers:
            names: set[str] = set()
            for r in (*self.gt.get(table, {}).values(), *self.agent.get(table, {}).values()):
                names.update((r.row or r.image or {}).keys())
            meta = self.metadata.tables[table]
            self._scorers[table] = _TableScorer(meta, self.config, self.matching.mapping, names)
        return self._scorers[table]

    def _key_valid(self, table: str, akey: Key) -> bool:
        gkey = self.gt_of_key.get((table, akey))
        v = self.present.get((table, akey))
        return gkey is not None and v is not None and v.deleted == self.gt[table][gkey].deleted

    def _sim_valid(self, table: str, gkey: Key, akey: Key, v: Version) -> bool:
        final = self.agent[table][akey]
        if v.seq == final.seq:
            return True  # the final version is the one the matching paired
        cached = self._sim_cache.get((table, akey, v.seq))
        if cached is None:
            g = self.gt[table][gkey]
            meta, mapping = self.metadata.tables[table], self.matching.mapping
            row = mapping.translate(meta, v.row) if v.row is not None else None
            image = mapping.translate(meta, final.image) if final.image else None
            sim = self._scorer(table).compare_rows(g, row, v.deleted, image)[0]
            cached = v.deleted == g.deleted and sim >= self.config.min_similarity
            self._sim_cache[(table, akey, v.seq)] = cached
        return cached

    def _evaluate(self, table: str, gkey: Key) -> Key | None:
        """The agent row matching ground-truth row ``gkey`` in this prefix, if any."""
        ka = self.key_partner.get((table, gkey))
        if ka is not None and self._key_valid(table, ka):
            return ka
        sa = self.sim_partner.get((table, gkey))
        if sa is not None:
            v = self.present.get((table, sa))
            if v is not None and not self._key_valid(table, sa) and self._sim_valid(table, gkey, sa, v):
                return sa
        return None


def _tables(matching: Matching, gt: Side, agent: Side) -> tuple[TableScore, ...]:
    out = []
    for table, tm in matching.tables.items():
        m, n_gt, n_ag = len(tm.pairs), len(gt.get(table, {})), len(agent.get(table, {}))
        empty = n_gt == 0 and n_ag == 0
        out.append(
            TableScore(
                table=table,
                gt_rows=n_gt,
                agent_rows=n_ag,
                matched=m,
                missing=len(tm.missing),
                extra=len(tm.extra),
                struct_score=_ratio(m, n_gt + n_ag - m, empty),
                content_score=sum(p.similarity for p in tm.pairs) / m if m else (1.0 if empty else 0.0),
            )
        )
    return tuple(out)


def _explain(matching: Matching) -> tuple[RowExplanation, ...]:
    out: list[RowExplanation] = []
    for table, tm in matching.tables.items():
        for p in tm.pairs:
            g_row = p.gt.row if p.gt.row is not None else (p.gt.image or {})
            a_row = p.agent.row if p.agent.row is not None else (p.agent.image or {})
            diffs = tuple(FieldDiff(c, s, g_row.get(c), a_row.get(c)) for c, s in p.fields if s < 1.0)
            reason = "identical" if not diffs else f"{len(diffs)} of {len(p.fields)} fields differ"
            if p.gt.deleted:
                reason = "both deleted the row"
            out.append(
                RowExplanation(
                    table,
                    "matched",
                    p.gt.pk,
                    p.agent.pk,
                    p.similarity,
                    p.how,
                    reason,
                    p.agent.operation_id,
                    diffs,
                )
            )
        for u in tm.missing:
            out.append(RowExplanation(table, "missing", u.row.pk, None, None, "", u.reason, None))
        for u in tm.extra:
            out.append(RowExplanation(table, "extra", None, u.row.pk, None, "", u.reason, u.row.operation_id))
    return tuple(out)
