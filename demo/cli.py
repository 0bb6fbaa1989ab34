"""``cowproxy demo``: the end-to-end demonstration on the sample application (see docs/demo.md)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from demo import workflows
from demo.errors import DemoError


def register(sub: Any, session_sub: Any) -> None:
    """Add ``cowproxy demo`` to the parser."""
    del session_sub
    parser = sub.add_parser(
        "demo",
        help="run the end-to-end demo on an embedded PostgreSQL",
        description="Start PostgreSQL, the sample project tracker, the CoW layer and the proxy; record"
        " ground-truth sessions of the paper's workflows, run scripted agents (and a real model with"
        " --model), score them and discard the sessions. Leaves nothing running.",
    )
    parser.add_argument("--quick", action="store_true", help=f"run {len(workflows.QUICK)} workflows only")
    parser.add_argument(
        "--workflow",
        action="append",
        choices=list(workflows.BY_SLUG),
        metavar="SLUG",
        help="run this workflow (repeatable); default: all " + str(len(workflows.WORKFLOWS)),
    )
    parser.add_argument(
        "--agent",
        action="append",
        metavar="NAME",
        help="scripted agent to run (repeatable): correct, vocabulary, overreach, wrong-state; default: all",
    )
    parser.add_argument("--model", help="also run a real model behind an OpenAI-compatible endpoint")
    parser.add_argument(
        "--base-url",
        default="https://api.openai.com/v1",
        help="OpenAI-compatible endpoint for --model (key from $OPENAI_API_KEY)",
    )
    parser.add_argument("--report", default="cowproxy-report.html", help="HTML report path")
    parser.add_argument("--json", dest="json_path", help="also write the results as JSON to this path")
    parser.add_argument(
        "--commit", action="store_true", help="commit the first ground-truth session instead of discarding it"
    )
    parser.add_argument("--keep", action="store_true", help="keep everything running until Ctrl-C")
    parser.add_argument(
        "--dsn",
        default=None,
        help="use this PostgreSQL server (a DSN whose user may create databases) instead of an embedded one",
    )
    parser.add_argument(
        "--no-proxy",
        action="store_true",
        help="tag the application's connections with startup options instead of routing through the proxy",
    )
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    # Only `cowproxy demo` needs the harness: its imports (the scorer, the sample app) cost every other
    # command about a second of start-up.
    from demo import agents, harness  # noqa: PLC0415

    if args.workflow:
        chosen = tuple(args.workflow)
    elif args.quick:
        chosen = workflows.QUICK
    else:
        chosen = tuple(w.slug for w in workflows.WORKFLOWS)
    agent_names = tuple(args.agent) if args.agent else tuple(cls.name for cls in agents.SCRIPTED)
    model = None
    if args.model:
        model = agents.ModelConfig(
            model=args.model, base_url=args.base_url, api_key=os.environ.get("OPENAI_API_KEY")
        )
    elif args.base_url != "https://api.openai.com/v1":
        raise DemoError("--base-url needs --model")
    config = harness.DemoConfig(
        workflows=chosen,
        agent_names=agent_names,
        model=model,
        report_path=Path(args.report),
        commit=args.commit,
        keep=args.keep,
        server_dsn=args.dsn,
        use_proxy=not args.no_proxy,
        json_path=Path(args.json_path) if args.json_path else None,
    )
    harness.run(config)
    return 0
