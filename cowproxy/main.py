"""The ``cowproxy`` command line: one entry point, the sub-commands of each package."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cowproxy.cli import Command, run
from demo import cli as demo_cli
from migrations import cli as layer_cli
from proxy import commands as proxy_cli
from scoring import cli as scoring_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cowproxy",
        description="Copy-on-write sessions, a proxy that tags them, and scoring of agent sessions.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    session = sub.add_parser("session", help="create, inspect, commit, discard and route sessions")
    session_sub = session.add_subparsers(dest="session_command", metavar="ACTION", required=True)
    for module in (layer_cli, proxy_cli, scoring_cli, demo_cli):
        module.register(sub, session_sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Command = args.func
    return run(func, args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
