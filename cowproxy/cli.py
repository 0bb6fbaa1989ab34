"""What every sub-command of ``cowproxy`` shares: ``--dsn``, ``--format``, and errors as one line.

A package adds its sub-commands with ``register(sub, session_sub)`` (``cowproxy.main`` calls it); a
sub-command sets ``func`` (taking the parsed ``argparse.Namespace``, returning an exit code) and raises a
``CowError`` for anything the user can fix, which ``run`` prints as one line with exit status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from cowproxy.errors import CowError, UsageError

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

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
    parser.add_argument(
        "--format", choices=list(choices), default=choices[0], help=f"output format (default: {choices[0]})"
    )


def require_dsn(args: argparse.Namespace) -> str:
    dsn: str | None = getattr(args, "dsn", None)
    if not dsn:
        raise UsageError("no database given: pass --dsn or set COW_DSN or DATABASE_URL")
    return dsn


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def run(func: Command, args: argparse.Namespace) -> int:
    """Runs a sub-command: a ``CowError`` becomes one line on stderr and exit status 1, never a traceback."""
    try:
        return func(args)
    except CowError as exc:
        print(f"cowproxy: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("cowproxy: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`cowproxy ... | head`): stop quietly, like other command-line tools.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
