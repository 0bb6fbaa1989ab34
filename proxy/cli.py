"""The ``cowproxy`` command line: one entry point, sub-commands contributed by each package.

Each package exposes ``register(subparsers, session_subparsers)``; a sub-command sets ``func`` (taking the
parsed ``argparse.Namespace`` and returning an exit code). User mistakes raise the package's root error,
which is printed here as a single line with a non-zero exit: never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from migrations.errors import LayerError
from proxy.errors import ProxyError
from scoring.errors import ScoringError

EXIT_USAGE = 2
EXIT_ERROR = 1

Command = Callable[[argparse.Namespace], int]


def default_dsn() -> str | None:
    """``--dsn`` default: ``$COW_DSN``, then ``$DATABASE_URL`` (read once, here at the edge)."""
    return os.environ.get("COW_DSN") or os.environ.get("DATABASE_URL") or None


def add_dsn(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dsn",
        default=default_dsn(),
        help="PostgreSQL connection string (default: $COW_DSN, then $DATABASE_URL)",
    )


def add_format(parser: argparse.ArgumentParser, choices: Sequence[str] = ("table", "json")) -> None:
    parser.add_argument("--format", choices=list(choices), default=choices[0], help="output format")


def require_dsn(args: argparse.Namespace) -> str:
    dsn: str | None = getattr(args, "dsn", None)
    if not dsn:
        raise LayerError("no database given: pass --dsn or set COW_DSN or DATABASE_URL")
    return dsn


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cowproxy",
        description="Copy-on-write sessions, a proxy that tags them, and scoring of agent sessions.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    session = sub.add_parser("session", help="create, inspect, commit, discard and route sessions")
    session_sub = session.add_subparsers(dest="session_command", metavar="ACTION", required=True)

    # Imported here so that `cowproxy --help` stays fast and each package owns its commands.
    from demo import cli as demo_cli
    from migrations import cli as layer_cli
    from proxy import commands as proxy_cli
    from scoring import cli as scoring_cli

    for module in (layer_cli, proxy_cli, scoring_cli, demo_cli):
        module.register(sub, session_sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Command = args.func
    try:
        return func(args)
    except (LayerError, ProxyError, ScoringError) as exc:
        print(f"cowproxy: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("cowproxy: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`cowproxy ... | head`): stop quietly, like other command-line tools.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
