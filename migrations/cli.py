"""``cowproxy install|uninstall|status|secret``,
``cowproxy session create|list|show|diff|reads|discard|commit``."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO, TypeVar

import asyncpg

from cowproxy.cli import add_dsn, add_format, require_dsn
from migrations.binding import (
    check_secret,
    read_secret_file,
    rotate_secret,
    secret_set_at,
    set_secret,
    write_secret_file,
)
from migrations.errors import LayerError
from migrations.layer import Workers, install_layer, uninstall_layer
from migrations.reads import session_reads
from migrations.sessions import (
    KINDS,
    commit_session,
    create_session,
    discard_session,
    get_session,
    layer_status,
    list_sessions,
    session_diff,
)

T = TypeVar("T")
CONNECT_TIMEOUT = 10.0
# Install's batches at once: two keep both cores of a small server busy (a batch is CPU in the backend, and a
# quarter of it waits for the fsync of each index it builds, which the other batch's work fills).
DEFAULT_JOBS = 2
MAX_JOBS = 16


def register(sub: Any, session_sub: Any) -> None:
    """Add this package's sub-commands to the ``cowproxy`` parser."""
    _register_layer(sub)
    _register_session_reports(session_sub)
    _register_reads(session_sub)
    _register_closing(session_sub)


def _register_layer(sub: Any) -> None:
    """``install``, ``secret``, ``uninstall``, ``status``."""
    p = sub.add_parser("install", help="install or upgrade the CoW layer and enable CoW on schemas")
    add_dsn(p)
    p.add_argument("--schema", action="append", default=[], metavar="S", help="app schema (default: public)")
    p.add_argument(
        "--exclude", action="append", default=[], metavar="T", help="table to leave plain (T or S.T)"
    )
    p.add_argument(
        "--bind-secret-file",
        type=Path,
        metavar="PATH",
        help="when install makes the binding secret (none was set), write it here (mode 0600) for the proxy",
    )
    p.add_argument(
        "--jobs",
        type=_jobs,
        default=DEFAULT_JOBS,
        metavar="N",
        help=f"batches of tables enabled at once, each on a connection of its own (default {DEFAULT_JOBS})",
    )
    p.set_defaults(func=cmd_install)

    p = sub.add_parser(
        "secret",
        help="the binding secret the proxy binds connections to their session with (layer owner only)",
        description="Without options: whether a binding secret is set, and since when. The database keeps "
        "only its hash, so a secret is shown once, by --rotate (which ends the old one at once). One proxy "
        "in front of several databases binds with one secret: --set gives each database the one in --file.",
    )
    add_dsn(p)
    action = p.add_mutually_exclusive_group()
    action.add_argument("--rotate", action="store_true", help="new secret: print it or write it to --file")
    action.add_argument("--check", action="store_true", help="check that --file holds the current secret")
    action.add_argument("--set", action="store_true", help="make the secret in --file the current one")
    p.add_argument("--file", type=Path, metavar="PATH", help="written by --rotate, read by --check/--set")
    p.set_defaults(func=cmd_secret)

    p = sub.add_parser("uninstall", help="remove the CoW layer; the app tables stay as they were")
    add_dsn(p)
    p.add_argument("--discard-sessions", action="store_true", help="drop pending session changes")
    p.set_defaults(func=cmd_uninstall)

    p = sub.add_parser("status", help="layer version, enabled tables, sessions")
    add_dsn(p)
    add_format(p)
    p.set_defaults(func=cmd_status)


def _register_session_reports(session_sub: Any) -> None:
    """``session create|list|show|diff``."""
    p = session_sub.add_parser("create", help="register a session")
    add_dsn(p)
    add_format(p)
    p.add_argument("session")
    p.add_argument("--kind", choices=KINDS, default="agent")
    p.add_argument("--label")
    p.add_argument("--prompt")
    p.add_argument("--model")
    p.add_argument("--gt", metavar="GT", help="the ground-truth session this one is scored against")
    p.add_argument("--metadata", metavar="JSON", help="a JSON object")
    p.set_defaults(func=cmd_session_create)

    p = session_sub.add_parser("list", help="list sessions")
    add_dsn(p)
    add_format(p)
    p.add_argument("--status", choices=("open", "committed", "discarded"))
    p.set_defaults(func=cmd_session_list)

    p = session_sub.add_parser("show", help="one session's registry row and counts")
    add_dsn(p)
    add_format(p)
    p.add_argument("session")
    p.set_defaults(func=cmd_session_show)

    p = session_sub.add_parser("diff", help="rows inserted, updated and deleted, per table and per operation")
    add_dsn(p)
    add_format(p)
    p.add_argument("session")
    p.set_defaults(func=cmd_session_diff)


def _register_reads(session_sub: Any) -> None:
    p = session_sub.add_parser("reads", help="what each operation read (recorded by serve --reads-dsn)")
    add_dsn(p)
    add_format(p)
    p.add_argument("session")
    p.set_defaults(func=cmd_session_reads)


def _register_closing(session_sub: Any) -> None:
    """``session discard`` and ``commit``: what ends a session."""
    p = session_sub.add_parser("discard", help="drop a session's changes")
    add_dsn(p)
    p.add_argument("session")
    p.set_defaults(func=cmd_session_discard)

    p = session_sub.add_parser("commit", help="apply a session's changes to the base tables")
    add_dsn(p)
    add_format(p)
    p.add_argument("session")
    p.add_argument("--ops", metavar="O,...", help="only these operations (and those they depend on)")
    p.add_argument("--on-conflict", choices=("fail", "overwrite"), default="fail")
    p.set_defaults(func=cmd_session_commit)


def _jobs(text: str) -> int:
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if not 1 <= jobs <= MAX_JOBS:
        raise argparse.ArgumentTypeError(
            f"expected a number of connections from 1 to {MAX_JOBS}, got {text!r}"
        )
    return jobs


def _with_conn(args: argparse.Namespace, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    dsn = require_dsn(args)

    async def run() -> T:
        try:
            conn = await asyncpg.connect(dsn, timeout=CONNECT_TIMEOUT)
        except (OSError, TimeoutError) as exc:
            raise LayerError(f"cannot connect to the database: {exc or type(exc).__name__}") from exc
        except asyncpg.PostgresError as exc:
            raise LayerError(f"cannot connect to the database: {exc}") from exc
        except (ValueError, asyncpg.InterfaceError) as exc:
            raise LayerError(f"bad --dsn: {exc}") from exc
        try:
            return await work(conn)
        except asyncpg.PostgresError as exc:
            raise LayerError(str(exc)) from exc
        finally:
            await conn.close()

    return asyncio.run(run())


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=False, default=str))


class _Progress:
    """Install's progress: a bar redrawn on stderr when it is a terminal; else nothing until the summary."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.total = 0
        self.started = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        self.total = total
        if not self.tty or total == 0:
            return
        width = 30
        filled = width * done // total
        bar = "#" * filled + "." * (width - filled)
        self.stream.write(f"\renabling tables [{bar}] {done}/{total}")
        if done == total:
            self.stream.write("\n")
        self.stream.flush()

    def summary(self) -> str:
        return f"{self.total} tables enabled or regenerated in {time.monotonic() - self.started:.1f} s"


def cmd_install(args: argparse.Namespace) -> int:
    schemas = args.schema or ["public"]
    progress = _Progress(sys.stderr)
    dsn = require_dsn(args)
    workers = Workers(lambda: asyncpg.connect(dsn, timeout=CONNECT_TIMEOUT), args.jobs)
    result = _with_conn(
        args, lambda c: install_layer(c, schemas, args.exclude, progress=progress, workers=workers)
    )
    for note in result.notes:
        print(f"warning: {note}", file=sys.stderr)
    if result.applied:
        print(f"cowproxy layer installed (migrations {', '.join(str(v) for v in result.applied)} applied)")
    else:
        print("cowproxy layer up to date")
    print(f"CoW enabled on schema(s): {', '.join(schemas)} ({progress.summary()})")
    if result.secret is not None:
        _install_secret_note(result.secret, args.bind_secret_file)
    elif args.bind_secret_file is not None:
        print(
            f"warning: a binding secret was already set: {args.bind_secret_file} not written"
            " (replace it with: cowproxy secret --rotate --file PATH)",
            file=sys.stderr,
        )
    return 0


def _install_secret_note(secret: str, path: Path | None) -> None:
    if path is not None:
        write_secret_file(path, secret)
        print(f"binding secret written to {path} (the proxy: --bind-secret-file {path})")
    else:
        print(
            "binding secret made (the database keeps only its hash); "
            "for the proxy, make one you can read with: cowproxy secret --rotate --file PATH"
        )


def cmd_secret(args: argparse.Namespace) -> int:
    if args.check or args.set:
        if args.file is None:
            raise LayerError(f"--{'check' if args.check else 'set'} needs --file PATH")
        secret = read_secret_file(args.file)
        if args.set:
            _with_conn(args, lambda c: set_secret(c, secret))
            print(f"the binding secret in {args.file} is now the current one; the old one no longer binds")
        elif not _with_conn(args, lambda c: check_secret(c, secret)):
            raise LayerError(f"{args.file} does not hold the current binding secret")
        else:
            print(f"{args.file} holds the current binding secret")
        return 0
    if args.rotate:
        if args.file is not None and args.file.is_dir():
            raise LayerError(f"--file {args.file} is a directory")
        secret = _with_conn(args, rotate_secret)
        if args.file is None:
            print(secret)
        else:
            write_secret_file(args.file, secret)
            print(f"new binding secret written to {args.file}; the old one no longer binds")
        return 0
    if args.file is not None:
        raise LayerError("--file needs --rotate, --check or --set")
    since = _with_conn(args, secret_set_at)
    print(
        "no binding secret is set"
        if since is None
        else f"a binding secret is set (since {since.isoformat()})"
    )
    return 0


def cmd_uninstall(args: argparse.Namespace) -> int:
    _with_conn(args, lambda c: uninstall_layer(c, discard_sessions=args.discard_sessions))
    print("cowproxy layer removed")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    st = _with_conn(args, layer_status)
    if args.format == "json":
        _print_json(
            {
                "installed": st.version is not None,
                "version": st.version,
                "migrations": list(st.migrations),
                "repeatables": [
                    {
                        "name": r.name,
                        "checksum": r.checksum,
                        "applied_at": r.applied_at,
                        "current": r.current,
                        "shipped": r.shipped,
                    }
                    for r in st.repeatables
                ],
                "schemas": list(st.schemas),
                "tables": [
                    {
                        "table_schema": t.table_schema,
                        "table_name": t.table_name,
                        "overlay_schema": t.overlay_schema,
                        "pk_columns": list(t.pk_columns),
                        "pending_changes": t.pending_changes,
                    }
                    for t in st.tables
                ],
                "sessions": st.sessions,
            }
        )
        return 0
    if st.version is None:
        print("cowproxy layer: not installed")
        return 0
    print(f"cowproxy layer: version {st.version}, schemas {', '.join(st.schemas) or '(none)'}")
    print(f"migrations applied: {', '.join(str(v) for v in st.migrations)}")
    for r in st.repeatables:
        state = (
            "current"
            if r.current
            else "no longer shipped"
            if not r.shipped
            else "changed: install applies it"
            if r.checksum
            else "not applied"
        )
        print(f"  functions/{r.name}  sha256 {(r.checksum or '-')[:12]}  {state}")
    print(f"sessions: {', '.join(f'{k} {v}' for k, v in sorted(st.sessions.items())) or 'none'}")
    for t in st.tables:
        print(
            f"  {t.table_schema}.{t.table_name}  overlay {t.overlay_schema}  pk ({', '.join(t.pk_columns)})"
            f"  pending changes {t.pending_changes}"
        )
    return 0


def cmd_session_create(args: argparse.Namespace) -> int:
    metadata = None
    if args.metadata is not None:
        try:
            metadata = json.loads(args.metadata)
        except json.JSONDecodeError as exc:
            raise LayerError(f"--metadata is not JSON: {exc}") from exc
        if not isinstance(metadata, dict):
            raise LayerError("--metadata must be a JSON object")
    s = _with_conn(
        args,
        lambda c: create_session(
            c,
            args.session,
            kind=args.kind,
            label=args.label,
            prompt=args.prompt,
            model=args.model,
            gt_session=args.gt,
            metadata=metadata,
        ),
    )
    if args.format == "json":
        _print_json(s.as_json())
    else:
        print(f"session {s.session_id} created ({s.kind})")
    return 0


def cmd_session_list(args: argparse.Namespace) -> int:
    sessions = _with_conn(args, lambda c: list_sessions(c, args.status))
    if args.format == "json":
        _print_json([s.as_json() for s in sessions])
        return 0
    if not sessions:
        print("no sessions")
    for s in sessions:
        print(
            f"{s.session_id}  {s.kind}  {s.status}  changes {s.changes}  operations {s.operations}"
            + (f"  gt {s.gt_session}" if s.gt_session else "")
            + (f"  label {s.label!r}" if s.label else "")
        )
    return 0


def cmd_session_show(args: argparse.Namespace) -> int:
    s = _with_conn(args, lambda c: get_session(c, args.session))
    if args.format == "json":
        _print_json(s.as_json())
        return 0
    for key, value in s.as_json().items():
        print(f"{key}: {json.dumps(value) if isinstance(value, dict) else value}")
    return 0


def _fmt(value: Any) -> str:
    return json.dumps(value, default=str)


def cmd_session_diff(args: argparse.Namespace) -> int:
    diff = _with_conn(args, lambda c: session_diff(c, args.session))
    if args.format == "json":
        _print_json(diff.as_json())
        return 0
    if not diff.rows:
        print(f"session {diff.session_id}: no net changes")
    table = None
    for r in diff.rows:
        if r.table != table:
            table = r.table
            print(f"table {table}")
        key = ", ".join(f"{k}={_fmt(v)}" for k, v in r.pk.items())
        if r.action == "update":
            changes = ", ".join(f"{k}: {_fmt(o)} -> {_fmt(n)}" for k, (o, n) in r.changed.items())
            print(f"  updated  ({key})  {changes}")
        else:
            row = r.new_row if r.action == "insert" else r.old_row
            label = "inserted" if r.action == "insert" else "deleted "
            print(f"  {label} ({key})  {_fmt(row)}")
    if diff.operations:
        print("operations, in order")
    for op, rows in diff.operations:
        print(f"operation {op}")
        for r in rows:
            key = ", ".join(f"{k}={_fmt(v)}" for k, v in r.pk.items())
            detail = (
                ", ".join(f"{k}: {_fmt(o)} -> {_fmt(n)}" for k, (o, n) in r.changed.items())
                if r.action == "update"
                else ""
            )
            print(f"  {r.action:<6} {r.table} ({key}) {detail}".rstrip())
    return 0


def cmd_session_reads(args: argparse.Namespace) -> int:
    trace = _with_conn(args, lambda c: session_reads(c, args.session))
    if args.format == "json":
        _print_json(trace.as_json())
        return 0
    if not trace.operations:
        print(f"session {trace.session_id}: no reads recorded (the proxy records them with --reads-dsn)")
    for op in trace.operations:
        print(
            f"operation {op.operation_id or '(none)'}: {len(op.reads)} statements, {op.rows} rows, "
            f"{op.repeated} repeated; tables {', '.join(op.relations) or '-'}"
        )
        for r in op.reads:
            rows = "?" if r.rows is None else str(r.rows)
            text = " ".join(r.statement.split())
            print(f"  {rows:>6} rows {r.duration_us / 1000:8.2f} ms  {text[:100]}")
    return 0


def cmd_session_discard(args: argparse.Namespace) -> int:
    n = _with_conn(args, lambda c: discard_session(c, args.session))
    print(f"session {args.session} discarded ({n} change rows removed)")
    return 0


def cmd_session_commit(args: argparse.Namespace) -> int:
    ops = None
    if args.ops is not None:
        ops = [o.strip() for o in args.ops.split(",") if o.strip()]
        if not ops:
            raise LayerError("--ops needs at least one operation id")
    result = _with_conn(args, lambda c: commit_session(c, args.session, ops, args.on_conflict))
    if args.format == "json":
        _print_json(
            {
                "session": result.session_id,
                "status": result.status,
                "operations": list(result.operations) if result.operations is not None else None,
                "remaining_changes": result.remaining_changes,
                "tables": result.tables,
            }
        )
        return 0
    print(f"session {result.session_id} {result.status}")
    if result.operations is not None:
        pulled = sorted(set(result.operations) - set(ops or ()))
        print(f"operations committed: {', '.join(result.operations)}")
        if pulled:
            print(f"pulled in as dependencies: {', '.join(pulled)}")
    for table, counts in sorted(result.tables.items()):
        if any(counts.values()):
            done = ", ".join(f"{counts[k]} {k}" for k in ("inserted", "updated", "deleted"))
            print(f"  {table}: {done}")
    if result.remaining_changes:
        print(f"{result.remaining_changes} change rows of other operations remain")
    return 0
