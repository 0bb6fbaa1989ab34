"""Scoring speed: pairs of sessions with 100 … 100k changed rows, one operation per 10 rows.

Each ground-truth session updates existing issues, inserts labels, issue-label links (composite key of two
foreign keys) and comments (foreign key to an issue); the agent session does the same with keys generated
independently, 5 % of rows with other values, 3 % missing and 2 % extra. Reported per size: time of the
session-level scoring (reduce, matching, scores, explanations), time added by per-operation utilities,
rows per second, the growth factor against the previous size, and — up to 1k rows — the naive per-operation
method (re-scoring every prefix from scratch) for comparison.

    .venv/bin/python bench/scoring.py [--sizes 100,1000,10000,100000] [--naive-max 1000]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from typing import Any

# This file is named like the package it measures: keep its own folder off the import path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

from scoring import ColumnMeta, ForeignKey, Metadata, TableMeta, Write, score_writes  # noqa: E402

ISSUES, LABELS, LINKS, COMMENTS = "app.issues", "app.labels", "app.issue_labels", "app.comments"
META = Metadata(
    {
        ISSUES: TableMeta(
            ISSUES,
            (
                ColumnMeta("id", "bigint", "numeric"),
                ColumnMeta("title", "text", "text"),
                ColumnMeta("state", "text", "text"),
                ColumnMeta("priority", "text", "text"),
                ColumnMeta("assignee", "text", "text"),
                ColumnMeta("updated_at", "timestamptz", "timestamp"),
            ),
            ("id",),
        ),
        LABELS: TableMeta(
            LABELS,
            (
                ColumnMeta("id", "bigint", "numeric"),
                ColumnMeta("name", "text", "text"),
                ColumnMeta("color", "text", "text"),
            ),
            ("id",),
        ),
        LINKS: TableMeta(
            LINKS,
            (ColumnMeta("issue_id", "bigint", "numeric"), ColumnMeta("label_id", "bigint", "numeric")),
            ("issue_id", "label_id"),
            (ForeignKey(("issue_id",), ISSUES, ("id",)), ForeignKey(("label_id",), LABELS, ("id",))),
        ),
        COMMENTS: TableMeta(
            COMMENTS,
            (
                ColumnMeta("id", "bigint", "numeric"),
                ColumnMeta("issue_id", "bigint", "numeric"),
                ColumnMeta("body", "text", "text"),
            ),
            ("id",),
            (ForeignKey(("issue_id",), ISSUES, ("id",)),),
        ),
    }
)
STATES = ["Backlog", "Todo", "In Progress", "Done", "Cancelled"]
PRIORITIES = ["none", "low", "medium", "high", "urgent"]
PEOPLE = ["alice", "bob", "carol", "dave", "eve", "frank"]
WORDS = [
    "refund",
    "login",
    "export",
    "crash",
    "billing",
    "sprint",
    "label",
    "stale",
    "urgent",
    "api",
    "docs",
    "cache",
    "timeout",
    "retry",
]


def logical_rows(n: int, rnd: random.Random) -> list[tuple[str, dict[str, Any]]]:
    """n rows as (kind, content); keys are assigned per session later."""
    rows: list[tuple[str, dict[str, Any]]] = []
    n_labels = max(1, n // 10)
    for i in range(n):
        r = rnd.random()
        if r < 0.5:
            rows.append(
                (
                    "issue",
                    {
                        "id": i + 1,
                        "title": " ".join(rnd.choices(WORDS, k=6)),
                        "state": rnd.choice(STATES),
                        "priority": rnd.choice(PRIORITIES),
                        "assignee": rnd.choice(PEOPLE),
                    },
                )
            )
        elif r < 0.6 and sum(1 for k, _ in rows if k == "label") < n_labels:
            rows.append(
                ("label", {"name": f"label-{i}-{rnd.choice(WORDS)}", "color": f"#{rnd.randrange(16**6):06x}"})
            )
        elif r < 0.8:
            rows.append(("link", {"issue_id": rnd.randrange(1, n + 1), "label": None}))
        else:
            rows.append(
                ("comment", {"issue_id": rnd.randrange(1, n + 1), "body": " ".join(rnd.choices(WORDS, k=12))})
            )
    return rows


def session(
    rows: list[tuple[str, dict[str, Any]]], base_key: int, rnd: random.Random, *, agent: bool
) -> list[Write]:
    writes: list[Write] = []
    label_keys: list[int] = []
    next_key = base_key
    seen_links: set[tuple[int, int]] = set()
    kept = []
    for kind, content in rows:
        if agent and rnd.random() < 0.03:
            continue  # missing
        kept.append((kind, dict(content)))
        if agent and rnd.random() < 0.02:
            kept.append(
                ("comment", {"issue_id": 1, "body": "an extra comment nobody asked for " + str(rnd.random())})
            )
    for n, (kind, content) in enumerate(kept):
        op = f"op{n // 10:06d}"
        seq = n + 1
        if agent and rnd.random() < 0.05:
            for col in ("title", "body", "name"):
                if col in content:
                    content[col] = content[col] + " (edited)"
            if "state" in content:
                content["state"] = rnd.choice(STATES)
        if kind == "issue":
            row = {**content, "updated_at": f"2026-01-01T00:00:{seq % 60:02d}Z"}
            writes.append(Write(ISSUES, {"id": content["id"]}, row, op, seq, created=False))
        elif kind == "label":
            key = next_key
            next_key += 1
            label_keys.append(key)
            writes.append(Write(LABELS, {"id": key}, {"id": key, **content}, op, seq, created=True))
        elif kind == "link" and label_keys:
            link = (content["issue_id"], label_keys[content["issue_id"] % len(label_keys)])
            if link in seen_links:
                continue
            seen_links.add(link)
            pk = {"issue_id": link[0], "label_id": link[1]}
            writes.append(Write(LINKS, pk, dict(pk), op, seq, created=True))
        elif kind == "comment":
            key = next_key
            next_key += 1
            writes.append(Write(COMMENTS, {"id": key}, {"id": key, **content}, op, seq, created=True))
    return writes


def per_operation_time(gt: list[Write], agent: list[Write]) -> tuple[float, Any]:
    """Time of the per-operation utilities alone (the stages before them run untimed)."""
    from scoring import core, match
    from scoring.config import make_config
    from scoring.model import complete_metadata

    cfg = make_config()
    meta = complete_metadata(META, [*gt, *agent])
    gt_side, ag_side = match.reduce_writes(gt, meta, cfg), match.reduce_writes(agent, meta, cfg)
    matching = match.match_sessions(gt_side, ag_side, meta, cfg)
    order = core.operation_order(agent, meta)
    n_gt = sum(len(rows) for rows in gt_side.values())
    start = time.perf_counter()
    ops = core._utilities(
        order, gt=gt_side, agent=ag_side, matching=matching, metadata=meta, config=cfg, n_gt=n_gt
    )
    elapsed = time.perf_counter() - start
    return elapsed, ops


def naive_per_operation(gt: list[Write], agent: list[Write]) -> float:
    """Re-score every prefix of operations from scratch (what the scorer avoids)."""
    ops: list[str] = []
    for w in agent:
        if not ops or ops[-1] != w.operation_id:
            ops.append(w.operation_id)
    start = time.perf_counter()
    for i in range(1, len(ops) + 1):
        keep = set(ops[:i])
        score_writes(
            gt, [w for w in agent if w.operation_id in keep], META, explain=False, per_operation=False
        )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100,1000,10000,100000")
    parser.add_argument("--naive-max", type=int, default=1000)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(
        f"{'rows':>7} {'ops':>6} {'matched':>8} {'session s':>10} {'per-op s':>9} {'total s':>8} "
        f"{'rows/s':>9} {'growth':>7} {'naive per-op s':>15}"
    )
    previous = None
    score_writes(
        *[session(logical_rows(50, random.Random(0)), k, random.Random(k), agent=bool(k)) for k in (0, 1)],
        META,
    )  # warm-up (lazy imports, caches)
    for n in sizes:
        rnd = random.Random(n)
        rows = logical_rows(n, rnd)
        gt = session(rows, 1_000_000, random.Random(1), agent=False)
        agent = session(rows, 5_000_000, random.Random(2), agent=True)
        t0 = time.perf_counter()
        level = score_writes(gt, agent, META, per_operation=False)
        session_s = time.perf_counter() - t0
        per_op, full = per_operation_time(gt, agent)
        total_s = session_s + per_op
        growth = f"{total_s / previous:.1f}x" if previous else "-"
        naive = f"{naive_per_operation(gt, agent):.2f}" if n <= args.naive_max else "(skipped)"
        assert abs(sum(o.struct_utility for o in full) - level.struct_score) < 1e-9
        print(
            f"{n:>7} {len(full):>6} {level.counts.matched:>8} {session_s:>10.3f} {per_op:>9.3f} "
            f"{total_s:>8.3f} {(len(gt) + len(agent)) / total_s:>9.0f} {growth:>7} {naive:>15}"
        )
        previous = total_s


if __name__ == "__main__":
    main()
