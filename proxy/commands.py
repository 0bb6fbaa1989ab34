"""Sub-commands of the proxy: ``serve``, ``session route`` and ``session unroute``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import Any
from urllib.parse import quote

from cowproxy.cli import add_format
from proxy.config import SERVER_REUSE_DEFAULT, ProxyConfig, build_config
from proxy.errors import AdminError, ProxyError
from proxy.tags import check_id

# The server, the admin API and uvloop are imported by the commands that run them: every other `cowproxy`
# command would pay for their start-up (the relay, the SQL analysis, pglast) otherwise.

DEFAULT_ADMIN = "127.0.0.1:9188"


def register(sub: Any, session_sub: Any) -> None:
    """Add this package's sub-commands to the ``cowproxy`` parser."""
    serve = sub.add_parser("serve", help="run the wire-protocol proxy in front of PostgreSQL")
    _endpoint_options(serve)
    _tls_options(serve)
    _relay_options(serve)
    _session_options(serve)
    _reuse_options(serve)
    serve.add_argument(
        "--workers",
        type=int,
        help="processes sharing the listen port (SO_REUSEPORT); worker i has metrics and admin on PORT + i",
    )
    serve.set_defaults(func=_serve)
    _route_commands(session_sub)


def _endpoint_options(serve: Any) -> None:
    """Where the proxy listens, relays to and serves its metrics and admin API; its config file."""
    serve.add_argument(
        "--upstream", help="PostgreSQL to relay to: HOST:PORT, or SOCKET_DIR:PORT for its Unix socket"
    )
    serve.add_argument(
        "--listen",
        help="where clients connect: HOST:PORT (default 127.0.0.1:6432), or SOCKET_DIR:PORT (Unix socket)",
    )
    serve.add_argument("--metrics", help="serve Prometheus /metrics on HOST:PORT")
    serve.add_argument("--admin", help=f"serve the admin API on HOST:PORT (e.g. {DEFAULT_ADMIN})")
    serve.add_argument("--admin-token", help="bearer token the admin API requires (default: none)")
    serve.add_argument("--config", help="TOML file with the same settings (flags override it)")


def _tls_options(serve: Any) -> None:
    serve.add_argument("--tls-cert", help="certificate for TLS to clients")
    serve.add_argument("--tls-key", help="private key for TLS to clients")
    serve.add_argument(
        "--upstream-tls",
        choices=["disable", "prefer", "require", "verify-ca", "verify-full"],
        help="TLS to PostgreSQL, as libpq's sslmode (default disable)",
    )
    serve.add_argument(
        "--upstream-tls-ca", help="CA certificates for verify-ca/verify-full (default: the system's store)"
    )
    serve.add_argument("--upstream-tls-cert", help="client certificate the proxy presents to PostgreSQL")
    serve.add_argument("--upstream-tls-key", help="private key of --upstream-tls-cert")


def _relay_options(serve: Any) -> None:
    """Limits, logging, the C relay and where routes are shared."""
    serve.add_argument("--max-message-size", type=int, help="largest client message in bytes")
    serve.add_argument("--drain-timeout", type=float, help="seconds SIGTERM waits for open transactions")
    serve.add_argument("--log-format", choices=["logfmt", "json"], help="log line format")
    serve.add_argument(
        "--fast-relay",
        action=argparse.BooleanOptionalAction,
        help="relay untagged connections on a C thread when the extension is built (default on)",
    )
    serve.add_argument(
        "--state-dsn",
        help="database where routes are shared by every worker and replica (cow.proxy_routes; default: "
        "routes kept in this process)",
    )


def _session_options(serve: Any) -> None:
    """How tagged connections join their sessions, what they may run, and the recording of their reads."""
    serve.add_argument(
        "--bind-secret-file",
        help="file with the layer's binding secret (cowproxy secret --rotate --file PATH); default: env "
        "COW_BIND_SECRET; without one, sessions are joined with cow.use_session (docs/threat-model.md)",
    )
    serve.add_argument(
        "--session-allow",
        action="append",
        metavar="RULE[,RULE]",
        help="lift a rule of the tagged connections' allow-list (ddl, function, do, dynamic, file, remote, "
        "catalog, system, statement; docs/proxy.md)",
    )
    serve.add_argument(
        "--reads-dsn",
        metavar="DSN",
        help="record the reads of tagged sessions into cow.reads (the DSN's host and role, each client's "
        "database); tagged connections then stay on the Python relay (docs/proxy.md, read traces)",
    )
    serve.add_argument(
        "--reads-queue", type=int, metavar="N", help="reads waiting to be written before more are dropped"
    )


def _reuse_options(serve: Any) -> None:
    """Server connections reused across client connections (proxy/pool.py, docs/proxy.md)."""
    serve.add_argument(
        "--server-reuse",
        action=argparse.BooleanOptionalAction,
        help="reset a server connection a client left idle (DISCARD ALL, unbound from its session) and give "
        "it to the next client with the same startup, as PgBouncer's session pooling (default "
        f"{'on' if SERVER_REUSE_DEFAULT else 'off'})",
    )
    serve.add_argument("--server-idle-max", type=int, metavar="N", help="idle server connections kept (100)")
    serve.add_argument(
        "--server-idle-per-startup",
        type=int,
        metavar="N",
        help="idle server connections kept per user, database and startup parameters (20)",
    )
    serve.add_argument(
        "--server-idle-timeout",
        type=float,
        metavar="S",
        help="seconds an idle server connection is kept (60)",
    )
    serve.add_argument(
        "--server-lifetime", type=float, metavar="S", help="seconds after which one is not reused (3600)"
    )
    serve.add_argument(
        "--server-check-delay",
        type=float,
        metavar="S",
        help="seconds idle after which one is checked with an empty query before reuse; 0: always (30)",
    )
    serve.add_argument(
        "--server-round-robin",
        action=argparse.BooleanOptionalAction,
        help="give out the longest idle server connection first (FIFO) instead of the most recent (LIFO)",
    )


def _route_commands(session_sub: Any) -> None:
    """``cowproxy session route|unroute``: through the admin API."""
    for name, helptext in (
        ("route", "tag every untagged connection to a database with a session (via the admin API)"),
        ("unroute", "stop routing a database's untagged connections to a session"),
    ):
        cmd = session_sub.add_parser(name, help=helptext)
        if name == "route":
            cmd.add_argument("session", help="session id")
        cmd.add_argument("--database", required=True, help="database whose untagged connections to route")
        cmd.add_argument(
            "--admin",
            default=os.environ.get("COWPROXY_ADMIN", DEFAULT_ADMIN),
            help=f"admin API URL or HOST:PORT (default $COWPROXY_ADMIN, then {DEFAULT_ADMIN})",
        )
        cmd.add_argument("--admin-token", default=os.environ.get("COWPROXY_ADMIN_TOKEN"), help="bearer token")
        add_format(cmd)
        cmd.set_defaults(func=_route if name == "route" else _unroute)


def _route(args: argparse.Namespace) -> int:
    from proxy.admin import admin_request  # noqa: PLC0415 (above)

    check_id(args.session, "session id")
    result = admin_request(
        args.admin, "POST", "/routes", {"database": args.database, "session": args.session}, args.admin_token
    )
    if args.format == "json":
        print(json.dumps(result))
    else:
        print(f"routed database {args.database} to session {args.session}")
    return 0


def _unroute(args: argparse.Namespace) -> int:
    from proxy.admin import admin_request  # noqa: PLC0415 (above)

    try:
        result = admin_request(
            args.admin, "DELETE", f"/routes/{quote(args.database, safe='')}", None, args.admin_token
        )
    except AdminError as exc:
        if "HTTP 404" in str(exc):
            raise AdminError(f"database {args.database} is not routed") from None
        raise
    if args.format == "json":
        print(json.dumps(result))
    else:
        print(f"unrouted database {args.database}")
    return 0


def setup_logging(fmt: str, level: str = "info") -> None:
    from proxy.server import LogfmtFormatter  # noqa: PLC0415 (above)

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter(as_json=fmt == "json"))
    logger = logging.getLogger("cowproxy")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False


def _serve(args: argparse.Namespace) -> int:
    flags = {
        "upstream": args.upstream,
        "listen": args.listen,
        "metrics": args.metrics,
        "admin": args.admin,
        "admin_token": args.admin_token,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "upstream_tls": args.upstream_tls,
        "upstream_tls_ca": args.upstream_tls_ca,
        "upstream_tls_cert": args.upstream_tls_cert,
        "upstream_tls_key": args.upstream_tls_key,
        "max_message_size": args.max_message_size,
        "drain_timeout": args.drain_timeout,
        "log_format": args.log_format,
        "fast_relay": args.fast_relay,
        "workers": args.workers,
        "state_dsn": args.state_dsn,
        "session_allow": args.session_allow,
        "bind_secret_file": args.bind_secret_file,
        "reads_dsn": args.reads_dsn,
        "reads_queue": args.reads_queue,
        "server_reuse": args.server_reuse,
        "server_idle_max": args.server_idle_max,
        "server_idle_per_startup": args.server_idle_per_startup,
        "server_idle_timeout": args.server_idle_timeout,
        "server_lifetime": args.server_lifetime,
        "server_check_delay": args.server_check_delay,
        "server_round_robin": args.server_round_robin,
    }
    config = build_config(flags, args.config)
    setup_logging(config.log_format, config.log_level)
    runner: Callable[..., Any] = asyncio.run
    try:
        import uvloop  # noqa: PLC0415 (above)

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        pass
    if config.workers > 1:
        return _serve_workers(config, runner)
    runner(run_proxy(config))
    return 0


def _serve_workers(config: Any, runner: Any) -> int:
    """Fork ``config.workers`` processes, each a whole proxy on the same listen port (the kernel spreads
    connections over them) with its metrics and admin API on PORT + its index; forward SIGTERM/SIGINT to
    them and wait. A worker that fails stops the others."""

    def shifted(address: Any, i: int) -> Any:
        return None if address is None else replace(address, port=address.port + i)

    children: list[int] = []
    for i in range(config.workers):
        pid = os.fork()
        if pid == 0:  # the worker: its own event loop, C relay thread and counters
            code = 0
            try:
                runner(
                    run_proxy(
                        replace(config, metrics=shifted(config.metrics, i), admin=shifted(config.admin, i))
                    )
                )
            except ProxyError as exc:
                print(f"cowproxy: worker {i}: {exc}", file=sys.stderr)
                code = 1
            except BaseException:
                traceback.print_exc()
                code = 1
            os._exit(code)
        children.append(pid)

    def forward(sig: int, _frame: Any) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    failed = False
    left = set(children)
    while left:
        pid, status = os.wait()
        left.discard(pid)
        if os.waitstatus_to_exitcode(status) != 0 and not failed:
            failed = True
            forward(signal.SIGTERM, None)
    return 1 if failed else 0


async def run_proxy(
    config: ProxyConfig, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None
) -> None:
    """Run until SIGTERM/SIGINT (or ``stop``), then drain."""
    from proxy.admin import AdminApi, MetricsEndpoint  # noqa: PLC0415 (above)
    from proxy.server import ProxyServer  # noqa: PLC0415

    proxy = ProxyServer(config)
    await proxy.start()
    # Everything imported and built so far lives as long as the process: keep it out of the collector's
    # generations, so that collections triggered by per-message garbage stay cheap.
    gc.freeze()
    extras = []
    try:
        if config.admin is not None:
            admin = AdminApi(proxy, config.admin_token)
            await admin.http.start(config.admin)
            extras.append(admin.http)
        if config.metrics is not None:
            metrics = MetricsEndpoint(proxy)
            await metrics.http.start(config.metrics)
            extras.append(metrics.http)
    except ProxyError:
        await proxy.drain(0)
        for http in extras:
            await http.close()
        raise
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT) if threading.current_thread() is threading.main_thread() else ()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        await proxy.drain()
        for http in extras:
            await http.close()
