"""``cowproxy score``: compare agent sessions with their ground truth."""

from __future__ import annotations

import argparse
import asyncio
import csv
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cowproxy.cli import add_dsn, add_format, require_dsn

from .errors import ScoringError

FORMATS = ("table", "json", "csv", "jsonl", "html")


def register(sub: Any, session_sub: Any) -> None:
    """Add this package's sub-commands to the ``cowproxy`` parser."""
    del session_sub
    p: argparse.ArgumentParser = sub.add_parser(
        "score",
        help="score agent sessions against their ground-truth sessions",
        description="Compare an agent session's writes with a ground-truth session's (the paper's scoring).",
    )
    add_dsn(p)
    which = p.add_argument_group("what to score (one of)")
    which.add_argument(
        "--gt",
        action="append",
        help="ground-truth session id; repeat it for alternative ground truths (the best by overall counts)",
    )
    which.add_argument("--agent", help="agent session id")
    which.add_argument(
        "--all",
        action="store_true",
        help="every agent session against its gt_session (and the ground truths sharing its label)",
    )
    which.add_argument("--pairs", metavar="FILE", help="CSV of pairs: columns gt,agent (header optional)")
    add_format(p, FORMATS)
    p.add_argument(
        "--output", "-o", metavar="FILE", help="write to FILE instead of stdout (required for html)"
    )
    p.add_argument("--config", metavar="FILE", help="scoring config (TOML)")
    p.add_argument("--min-similarity", type=float, help="no pair below this similarity (default 0.5)")
    p.add_argument("--collapse", action="store_true", help="drop rows created and deleted within a session")
    p.add_argument("--rows", action="store_true", help="include row-level explanations in json output")
    p.add_argument("--brief", action="store_true", help="table format: leave out row diffs")
    p.add_argument("--jobs", "-j", type=int, help="worker processes for many pairs (default: CPU count)")
    p.set_defaults(func=run_score)


def run_score(args: argparse.Namespace) -> int:
    # Only `cowproxy score` needs the scorer (numpy, scipy, networkx): other commands start without it.
    from .api import score_pairs_async  # noqa: PLC0415
    from .config import make_config  # noqa: PLC0415
    from .render import render_csv, render_html, render_json, render_jsonl, render_table  # noqa: PLC0415

    require_dsn(args)
    if args.format == "html" and not args.output:
        raise ScoringError("--format html writes one file: give --output FILE")
    if args.jobs is not None and args.jobs < 1:
        raise ScoringError("--jobs must be at least 1")
    options: dict[str, Any] = {}
    if args.min_similarity is not None:
        options["min_similarity"] = args.min_similarity
    if args.collapse:
        options["collapse"] = True
    cfg = make_config(args.config, **options)
    pairs = asyncio.run(_pairs(args))
    if not pairs:
        raise ScoringError(
            "no agent session names a ground truth (cow.sessions.gt_session): nothing to score"
        )
    results = asyncio.run(
        score_pairs_async(args.dsn, pairs, config=cfg, jobs=args.jobs, progress=_progress())
    )
    renderers: dict[str, Callable[[], str]] = {
        "table": lambda: render_table(results, rows=not args.brief),
        "json": lambda: render_json(results, include_rows=args.rows),
        "csv": lambda: render_csv(results),
        "jsonl": lambda: render_jsonl(results),
        "html": lambda: render_html(results),
    }
    text = renderers[args.format]()
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise ScoringError(f"cannot write {args.output}: {exc.strerror}") from None
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


async def _pairs(args: argparse.Namespace) -> list[tuple[str | tuple[str, ...], str]]:
    chosen = sum(bool(x) for x in (args.all, args.pairs, args.gt or args.agent))
    if chosen != 1:
        raise ScoringError("say what to score: --gt GT --agent A, or --all, or --pairs FILE")
    if args.pairs:
        return list(read_pairs(args.pairs))
    if not args.all:
        if not args.gt or not args.agent:
            raise ScoringError("give both --gt and --agent")
        return [(tuple(args.gt), args.agent)]
    from .api import connect  # noqa: PLC0415
    from .extract import agent_sessions, check_layer  # noqa: PLC0415

    conn = await connect(args.dsn)
    try:
        await check_layer(conn)
        return list(await agent_sessions(conn))
    finally:
        await conn.close()


def read_pairs(path: str) -> list[tuple[str, str]]:
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = [r for r in csv.reader(fh) if r and any(c.strip() for c in r)]
    except OSError as exc:
        raise ScoringError(f"cannot read pairs file {path}: {exc.strerror}") from None
    if rows and [c.strip().lower() for c in rows[0][:2]] in (
        ["gt", "agent"],
        ["gt_session", "agent_session"],
    ):
        rows = rows[1:]
    pairs = []
    for n, r in enumerate(rows, 1):
        if len(r) < 2 or not r[0].strip() or not r[1].strip():
            raise ScoringError(f"{path}: line {n} is not 'gt,agent'")
        pairs.append((r[0].strip(), r[1].strip()))
    if not pairs:
        raise ScoringError(f"{path}: no pairs")
    return pairs


def _progress() -> Callable[[int, int], None] | None:
    """A one-line progress bar on stderr, only when it is a terminal (never in pipes or logs)."""
    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int) -> None:
        if total < 2:
            return
        width = 30
        filled = width * done // total
        sys.stderr.write(f"\rscoring [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show
