"""``cowproxy demo``: the whole system on the sample application, in one process tree.

Embedded PostgreSQL (or a server given with ``--dsn``) → sample database + CoW layer → ``cowproxy serve``
(a subprocess) → the sample application (its pool's ``DATABASE_URL`` points at the proxy) → ground-truth
and agent sessions routed through the proxy's admin API → scoring → tables, HTML report, metrics →
discard (or commit). Everything started here is stopped here, also on Ctrl-C or an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TextIO
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg

from demo import agents, report, seed, workflows
from demo.api import HttpApi
from demo.app import AppConfig, BackgroundApp, setup_database
from demo.errors import DemoError
from demo.report import SessionScore
from demo.workflows import Workflow


@dataclass(frozen=True)
class DemoConfig:
    workflows: tuple[str, ...]
    agent_names: tuple[str, ...]
    model: agents.ModelConfig | None = None
    report_path: Path = Path("cowproxy-report.html")
    commit: bool = False
    keep: bool = False
    server_dsn: str | None = None  # None: an embedded PostgreSQL
    use_proxy: bool = True
    json_path: Path | None = None
    out: TextIO | None = None  # None: sys.stdout at run time


@dataclass(frozen=True)
class DemoResult:
    scores: tuple[SessionScore, ...]
    gt_rows: dict[str, int]
    tagging: str
    base_untouched: bool
    committed: str | None
    base_changed_by_commit: bool | None  # None without --commit
    registry: tuple[dict[str, Any], ...]  # cow.sessions rows of this run after discard/commit
    fallback: str | None  # why the proxy was not used, when it was not
    metrics: tuple[str, ...]
    report_path: str
    proxy_notes: tuple[str, ...] = ()  # e.g. the subprocess failed and the proxy ran in-process


class Progress:
    def __init__(self, out: TextIO, steps: int, checkpoint: Callable[[], None] = lambda: None) -> None:
        self.out = out
        self.checkpoint = checkpoint
        self.steps = steps
        self.step = 0
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        self.checkpoint()
        self.step += 1
        self.say(f"[{self.step}/{self.steps}] {message}")

    def say(self, message: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"{elapsed:6.1f}s  {message}", file=self.out, flush=True)

    def detail(self, message: str) -> None:
        self.checkpoint()
        print(f"         {message}", file=self.out, flush=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _with_database(dsn: str, database: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path="/" + database))


def _with_host_port(dsn: str, host: str, port: int) -> str:
    parts = urlsplit(dsn)
    user = parts.username or "postgres"
    auth = user + (f":{parts.password}" if parts.password else "")
    return urlunsplit(parts._replace(netloc=f"{auth}@{host}:{port}"))


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _admin(dsn: str, *queries: tuple[str, Sequence[Any]]) -> list[list[asyncpg.Record]]:
    conn = await asyncpg.connect(dsn)
    try:
        return [await conn.fetch(q, *args) for q, args in queries]
    finally:
        await conn.close()


# --- the layer and the scorer ------------------------------------------------------------------------


async def _install_layer(dsn: str) -> list[asyncpg.Record]:
    import migrations

    conn = await asyncpg.connect(dsn)
    try:
        await migrations.install_layer(conn, schemas=("public",))
        return list(await conn.fetch("SELECT table_schema, table_name, overlay_schema FROM cow.tables"))
    finally:
        await conn.close()


# The layer's registration function (docs/layer.md): kind, workflow label, prompt, model, ground truth.
_REGISTER = "SELECT cow.create_session($1, $2, $3, $4, $5, $6, $7::jsonb)"


def _register(
    dsn: str, session: str, kind: str, *, workflow: Workflow, model: str | None, gt: str | None
) -> None:
    meta = json.dumps({"workflow": workflow.slug, "paper_table4_row": workflow.number, "demo": True})
    _run(_admin(dsn, (_REGISTER, (session, kind, workflow.slug, workflow.prompt, model, gt, meta))))


_BASE_TABLES = (
    "workspaces",
    "members",
    "projects",
    "project_members",
    "states",
    "labels",
    "work_items",
    "work_item_assignees",
    "work_item_labels",
)


def _base_checksum(dsn: str) -> str:
    """A digest of every base table, read by a plain connection (no session)."""
    queries = [
        (f"SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) FROM public.{t} t", ())
        for t in _BASE_TABLES
    ]
    rows = _run(_admin(dsn, *queries))
    return ",".join(str(r[0][0]) for r in rows)


def _session_rows(dsn: str, session: str) -> int:
    rows = _run(
        _admin(dsn, ("SELECT count(DISTINCT (table_name, pk)) FROM cow.session_changes($1)", (session,)))
    )
    return int(rows[0][0][0])


def _score(dsn: str, gt: str, agent: str) -> Any:
    import scoring

    fn = getattr(scoring, "score_sessions", None)
    if fn is None:  # the documented name (docs/interfaces.md); fall back to where it is defined
        from scoring import api

        fn = api.score_sessions
    return fn(dsn, gt, agent)


def _finish_sessions(dsn: str, sessions: Sequence[str], commit: str | None) -> None:
    from demo import layer_ops

    layer_ops.finish(dsn, sessions, commit)


# --- tagging the application's connections --------------------------------------------------------------


class Tagging:
    """How the application's connections land in a session."""

    name = "none"
    app_url = ""

    def enter(self, session: str) -> None:
        raise NotImplementedError

    def leave(self) -> None:
        raise NotImplementedError

    def metrics(self) -> list[str]:
        return []


class DirectTagging(Tagging):
    """No proxy: restart the application's pool with ``options=-c cow.session_id=S`` and the overlay
    first in ``search_path`` (a tag source the layer supports on its own)."""

    name = "startup options (no proxy)"

    def __init__(self, database_url: str, overlay: str) -> None:
        self.database_url = database_url
        self.overlay = overlay
        self.app: BackgroundApp | None = None
        self.port = _free_port()  # the same port across restarts: the application's URL stays put
        self._start(self.database_url)

    def _start(self, url: str) -> None:
        self.app = BackgroundApp(AppConfig(url, port=self.port))
        self.app_url = self.app.start()

    def _stop(self) -> None:
        if self.app is not None:
            self.app.stop()
            self.app = None

    def enter(self, session: str) -> None:
        self._stop()
        options = f"-c cow.session_id={session} -c search_path={self.overlay},public"
        sep = "&" if "?" in self.database_url else "?"
        self._start(f"{self.database_url}{sep}options={quote(options)}")

    def leave(self) -> None:
        self._stop()
        self._start(self.database_url)

    def close(self) -> None:
        self._stop()


class ProxyTagging(Tagging):
    """The proxy — ``cowproxy serve`` in a subprocess, or in-process if that cannot start — with sessions
    routed through its admin API."""

    name = "proxy admin route"

    def __init__(
        self, upstream: tuple[str, int], database: str, database_url_template: str, workdir: Path
    ) -> None:
        from demo import proxy_ops

        self.database = database
        self.listen = ("127.0.0.1", _free_port())
        self.metrics_addr = ("127.0.0.1", _free_port())
        self.admin_addr = ("127.0.0.1", _free_port())
        self.log_path = workdir / "proxy.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.stopped_pid: int | None = None
        self.in_process: proxy_ops.InProcessProxy | None = None
        self.notes: list[str] = []
        self.database_url = _with_host_port(database_url_template, *self.listen)
        self.app: BackgroundApp | None = None
        try:
            self.process = proxy_ops.start(
                upstream, self.listen, self.metrics_addr, self.admin_addr, self.log_path
            )
            self._start_app()
        except DemoError as exc:
            # E.g. `cowproxy serve` crashing on its event loop (seen with uvloop while the proxy was built):
            # the same proxy code on the standard asyncio loop in this process still shows the system; say so.
            self._stop_all()
            self.notes.append(f"cowproxy serve (subprocess) failed: {exc}; running the proxy in-process")
            self.name = "proxy admin route (proxy in-process)"
            self.in_process = proxy_ops.InProcessProxy(
                upstream, self.listen, self.metrics_addr, self.admin_addr
            )
            try:
                self._start_app()
            except DemoError:
                self._stop_all()
                raise

    def _start_app(self) -> None:
        self.app = BackgroundApp(AppConfig(self.database_url))
        try:
            self.app_url = self.app.start()
            HttpApi(self.app_url).call("listProjects", {})  # one round trip through the proxy
        except DemoError as exc:
            log = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
            tail = " ".join(log.strip().splitlines()[-1:])[:200]
            raise DemoError(f"{exc}" + (f" (proxy log: {tail})" if tail else "")) from None

    def enter(self, session: str) -> None:
        from demo import proxy_ops

        proxy_ops.route(self.admin_addr, session, self.database)

    def leave(self) -> None:
        from demo import proxy_ops

        proxy_ops.unroute(self.admin_addr, self.database)

    def metrics(self) -> list[str]:
        url = f"http://{self.metrics_addr[0]}:{self.metrics_addr[1]}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        return [line for line in text.splitlines() if line.startswith("cowproxy_")]

    def _stop_all(self) -> None:
        if self.app is not None:
            self.app.stop()
            self.app = None
        if self.in_process is not None:
            self.in_process.stop()
            self.in_process = None
        if self.process is not None:
            with contextlib.suppress(OSError):
                self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
            self.stopped_pid = self.process.pid
            self.process = None

    def close(self) -> None:
        self._stop_all()


# --- the run -------------------------------------------------------------------------------------------


class Interrupts:
    """Ctrl-C and SIGTERM stop the demo at the next checkpoint (between tool calls, sessions and steps),
    not in the middle of a database call; a second Ctrl-C interrupts at once. Either way the cleanup runs."""

    def __init__(self) -> None:
        self.count = 0
        self.unwinding = False

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count > 1 and not self.unwinding:
            raise KeyboardInterrupt

    def checkpoint(self) -> None:
        if self.count and not self.unwinding:
            self.unwinding = True
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        try:
            previous = {sig: signal.signal(sig, self._handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        except ValueError:  # not the main thread: leave signals alone
            yield
            return
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _make_agents(cfg: DemoConfig) -> list[agents.Agent]:
    known = {cls.name: cls for cls in agents.SCRIPTED}
    out: list[agents.Agent] = []
    for name in cfg.agent_names:
        if name not in known:
            raise DemoError(f"unknown agent {name!r}; scripted agents: {', '.join(known)}")
        out.append(known[name]())
    if cfg.model is not None:
        out.append(agents.OpenAIChatAgent(cfg.model))
    return out


def run(cfg: DemoConfig) -> DemoResult:
    """Run the demo; user-facing failures raise DemoError, Ctrl-C/SIGTERM raise KeyboardInterrupt."""
    interrupts = Interrupts()
    with interrupts.installed():
        try:
            return _run_demo(cfg, interrupts)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            if interrupts.count:  # e.g. PostgreSQL got the terminal's Ctrl-C too and shut down first
                raise KeyboardInterrupt from None
            raise DemoError(f"the demo failed: {' '.join(str(exc).split()) or type(exc).__name__}") from None
        except DemoError:
            if interrupts.count:
                raise KeyboardInterrupt from None
            raise


def _run_demo(cfg: DemoConfig, interrupts: Interrupts) -> DemoResult:
    chosen = []
    for slug in cfg.workflows:
        if slug not in workflows.BY_SLUG:
            raise DemoError(f"unknown workflow {slug!r}; known: {', '.join(workflows.BY_SLUG)}")
        chosen.append(workflows.BY_SLUG[slug])
    agent_list = _make_agents(cfg)
    for path in (cfg.report_path, cfg.json_path):
        if path is not None and not path.resolve().parent.is_dir():
            raise DemoError(f"cannot write {path}: {path.resolve().parent} is not a directory")
    out = cfg.out or sys.stdout
    progress = Progress(out, 9, interrupts.checkpoint)
    with contextlib.ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="cowproxy-demo-"))
        # What was started, so that a caller (the tests) can check that it is all gone afterwards.
        resources: dict[str, Any] = {"workdir": str(workdir)}
        stack.callback(_rmtree, workdir)

        # 1. PostgreSQL
        if cfg.server_dsn:
            progress(f"using the PostgreSQL server at {_redact(cfg.server_dsn)}")
            server_dsn = cfg.server_dsn
        else:
            progress("starting an embedded PostgreSQL (initdb + pg_ctl, a temporary data directory)")
            from migrations.embedded import embedded_postgres

            server = stack.enter_context(embedded_postgres())
            resources["datadir"] = str(server.datadir)
            server_dsn = server.dsn("postgres")
        version = _run(_admin(server_dsn, ("SHOW server_version", ())))[0][0][0]
        progress.detail(f"PostgreSQL {version} at {_redact(server_dsn)}")

        # 2. the sample application's database
        database = f"cowproxy_demo_{os.getpid()}_{secrets.token_hex(3)}"
        _run(_admin(server_dsn, (f'CREATE DATABASE "{database}"', ())))
        stack.callback(_drop_database, server_dsn, database)
        db_dsn = _with_database(server_dsn, database)
        counts = _run(setup_database(db_dsn))
        progress(
            f"created the sample application's database {database}: {counts.projects} projects,"
            f" {counts.members} members, {counts.states} states, {counts.labels} labels,"
            f" {counts.work_items} work items"
        )

        # 3. the CoW layer
        tables = _run(_install_layer(db_dsn))
        overlay = str(tables[0]["overlay_schema"]) if tables else "public"
        progress(f"installed the CoW layer: {len(tables)} tables in schema public, overlay schema {overlay}")
        checksum_before = _base_checksum(db_dsn)

        # 4-5. the proxy and the application
        tagging: ProxyTagging | DirectTagging
        fallback: str | None = None
        parts = urlsplit(db_dsn)
        upstream = (parts.hostname or "127.0.0.1", parts.port or 5432)
        if cfg.use_proxy:
            try:
                tagging = ProxyTagging(upstream, database, db_dsn, workdir)
            except DemoError as exc:
                fallback = f"the proxy could not start ({exc})"
                progress(f"{fallback}; tagging with startup options instead (the layer's own tag source)")
                tagging = DirectTagging(db_dsn, overlay)
            else:
                for note in tagging.notes:
                    progress.detail(note)
                how = "cowproxy serve" if tagging.process else "the proxy (in-process)"
                progress(
                    f"started {how} on {tagging.listen[0]}:{tagging.listen[1]} (upstream"
                    f" {upstream[0]}:{upstream[1]}, metrics :{tagging.metrics_addr[1]}, admin"
                    f" :{tagging.admin_addr[1]})"
                )
        else:
            fallback = "--no-proxy"
            progress("no proxy (--no-proxy): the application is tagged with startup options")
            tagging = DirectTagging(db_dsn, overlay)
        stack.callback(tagging.close)
        resources["app_url"] = tagging.app_url
        if isinstance(tagging, ProxyTagging):
            pid = tagging.process.pid if tagging.process is not None else tagging.stopped_pid
            if pid is not None:
                resources["proxy_pid"] = pid
            resources["proxy_listen"] = list(tagging.listen)
        app_db_url = getattr(tagging, "database_url", db_dsn)
        progress(f"started the sample application at {tagging.app_url} (DATABASE_URL={_redact(app_db_url)})")
        progress.detail(f"OpenAPI document: {tagging.app_url}/openapi.json")

        # 6. ground truth
        progress(f"recording {len(chosen)} ground-truth session(s) through the application's API")
        sessions: list[str] = []
        gt_rows: dict[str, int] = {}
        run_id = secrets.token_hex(2)
        for wf in chosen:
            gt = f"gt-{wf.slug}-{run_id}"
            _register(db_dsn, gt, "ground_truth", workflow=wf, model=None, gt=None)
            sessions.append(gt)
            tagging.enter(gt)
            try:
                calls = workflows.record_ground_truth(HttpApi(tagging.app_url), wf)
            finally:
                tagging.leave()
            gt_rows[wf.slug] = _session_rows(db_dsn, gt)
            progress.detail(f"{wf.title:<36} {calls:3d} write calls  {gt_rows[wf.slug]:3d} rows  ({gt})")

        # 7. agents
        progress(
            f"running {len(agent_list)} agent(s) × {len(chosen)} workflow(s), tools discover/execute,"
            f" limit {agents.OPERATION_LIMIT} operations"
        )
        runs: list[tuple[agents.Agent, Workflow, str, agents.AgentResult, int]] = []
        for agent in agent_list:
            for wf in chosen:
                # Session ids are [A-Za-z0-9._:-]{1,128}; model names may hold anything ("org/model v2").
                session = re.sub(r"[^A-Za-z0-9._:-]", "-", f"{agent.name}-{wf.slug}-{run_id}")[-128:]
                _register(
                    db_dsn, session, "agent", workflow=wf, model=agent.model, gt=f"gt-{wf.slug}-{run_id}"
                )
                sessions.append(session)
                tagging.enter(session)
                tools = agents.Tools(HttpApi(tagging.app_url), checkpoint=interrupts.checkpoint)
                try:
                    outcome = agent.run(wf, tools)
                except agents.BudgetExhausted as exc:
                    outcome = agents.AgentResult(False, str(exc))
                finally:
                    tagging.leave()
                runs.append((agent, wf, session, outcome, len(tools.calls)))
                progress.detail(
                    f"{agent.name:<14} {wf.slug:<36} {len(tools.calls):3d} tool calls"
                    f"  {'done' if outcome.completed else 'incomplete'}: {outcome.message}"
                )

        # 8. scoring
        progress("scoring every agent session against its ground truth (cow.session_changes)")
        scores: list[SessionScore] = []
        details: list[tuple[str, str]] = []
        for agent, wf, session, outcome, ncalls in runs:
            gt = f"gt-{wf.slug}-{run_id}"
            r = _score(db_dsn, gt, session)
            scores.append(
                SessionScore(
                    agent=agent.name,
                    model=agent.model,
                    workflow=wf.slug,
                    gt_session=gt,
                    session=session,
                    completed=outcome.completed,
                    tool_calls=ncalls,
                    overall=float(r.overall),
                    struct=float(r.struct_score),
                    content=float(r.content_score),
                    precision=float(r.precision),
                    recall=float(r.recall),
                    f1=float(r.f1),
                    matched=int(r.counts.matched),
                    missing=int(r.counts.missing),
                    extra=int(r.counts.extra),
                    gt_rows=gt_rows[wf.slug],
                    message=outcome.message,
                )
            )
            details.append((f"{agent.name} on {wf.slug}", _detail_html(r)))
        summaries = report.summarize(scores)
        print("\nPer agent (mean over workflows; like the paper's Table 5):", file=out)
        print(report.agent_table(summaries), file=out)
        print("\nLowest-scoring sessions per agent (like the paper's Table 6):", file=out)
        print(report.lowest_table(report.lowest(scores)), file=out)
        print(file=out, flush=True)

        untouched = _base_checksum(db_dsn) == checksum_before
        notes = [
            f"tagging: {tagging.name}" + (f" ({fallback})" if fallback else ""),
            f"workflows: {', '.join(w.slug for w in chosen)}",
            f"base tables untouched by the sessions: {'yes' if untouched else 'NO'}",
        ]
        if not untouched:
            raise DemoError("the base tables changed while sessions ran: a session wrote outside its overlay")
        progress.detail(f"base tables unchanged after {len(sessions)} sessions: yes (checksummed)")
        report_path = cfg.report_path.resolve()
        report_path.write_text(report.html_report(scores, notes, details))
        progress.detail(f"HTML report: {report_path}")

        metrics: list[str] = []
        with contextlib.suppress(OSError):
            metrics = tagging.metrics()
        if metrics:
            progress.detail("a few of the proxy's Prometheus metrics:")
            for line in _pick_metrics(metrics):
                progress.detail(f"  {line}")
        elif isinstance(tagging, DirectTagging):
            progress.detail("no proxy metrics: the proxy did not run")

        # 9. discard / commit
        committed = f"gt-{chosen[0].slug}-{run_id}" if cfg.commit else None
        if cfg.keep:
            progress.say("--keep: leaving everything running; press Ctrl-C to stop and clean up")
            progress.detail(f"application: {tagging.app_url}   database: {_redact(db_dsn)}")
            if isinstance(tagging, ProxyTagging):
                progress.detail(
                    f"proxy: {_redact(tagging.database_url)}   metrics: http://127.0.0.1:{tagging.metrics_addr[1]}"
                    f"/metrics   admin: 127.0.0.1:{tagging.admin_addr[1]}"
                )
            progress.detail(f"sessions: {', '.join(sessions)}")
            while not interrupts.count:  # Ctrl-C ends the wait, then the demo finishes normally
                time.sleep(0.2)
            interrupts.count = 0
        _finish_sessions(db_dsn, [s for s in sessions if s != committed], committed)
        changed = None if committed is None else _base_checksum(db_dsn) != checksum_before
        registry = _run(
            _admin(
                db_dsn,
                (
                    "SELECT session_id, kind, label, model, gt_session, status FROM cow.sessions"
                    " WHERE session_id = ANY($1::text[]) ORDER BY created_at, session_id",
                    (sessions,),
                ),
            )
        )[0]
        if committed:
            progress(f"committed {committed} into the base tables; discarded the other {len(sessions) - 1}")
            progress.detail(f"base tables changed by the commit: {'yes' if changed else 'NO'}")
        else:
            progress(f"discarded all {len(sessions)} sessions (use --commit to commit one)")
        result = DemoResult(
            scores=tuple(scores),
            gt_rows=gt_rows,
            tagging=tagging.name,
            base_untouched=untouched,
            committed=committed,
            metrics=tuple(metrics),
            report_path=str(report_path),
            base_changed_by_commit=changed,
            registry=tuple(dict(r) for r in registry),
            fallback=fallback,
            proxy_notes=tuple(getattr(tagging, "notes", ())),
        )
    progress.say("stopped the application, the proxy and PostgreSQL; removed the temporary files")
    for note in result.proxy_notes:
        progress.say(f"NOTE: {note}")
    if result.fallback:
        progress.say(
            f"NOTE: sessions were tagged with startup options, not through the proxy: {result.fallback}"
        )
    if cfg.json_path is not None:
        cfg.json_path.write_text(json.dumps({**_as_json(result), "resources": resources}, indent=2))
    return result


def _as_json(result: DemoResult) -> dict[str, Any]:
    return {**asdict(result), "scores": [asdict(s) for s in result.scores]}


def _detail_html(result: Any) -> str:
    import html

    rows = getattr(result, "rows", ())
    lines = []
    for r in rows:
        if r.status == "matched" and (r.similarity or 0) >= 1.0:
            continue
        diffs = "; ".join(f"{d.column}: {d.gt!r} → {d.agent!r}" for d in getattr(r, "diffs", ()))
        lines.append(
            f"<li>{html.escape(r.status)} {html.escape(r.table)} "
            f"{html.escape(str(dict(r.gt_pk or r.agent_pk or {})))} {html.escape(diffs)}</li>"
        )
    return "<ul>" + ("".join(lines) or "<li>every row matched exactly</li>") + "</ul>"


_METRIC_PREFERENCE = (
    "cowproxy_client_connections_total",
    "cowproxy_session_switches_total",
    "cowproxy_writes_total",
    "cowproxy_query_duration_seconds_count",
    "cowproxy_query_duration_seconds_sum",
    "cowproxy_parse_cache_lookups_total",
    "cowproxy_rewrites_total",
)


def _pick_metrics(lines: Sequence[str], n: int = 12) -> list[str]:
    """The samples worth showing: connections, session switches, writes per table, latency, parse cache."""
    picked: list[str] = []
    for name in _METRIC_PREFERENCE:
        picked += [line for line in lines if line.split("{")[0].split(" ")[0] == name]
    return picked[:n]


def _redact(dsn: str) -> str:
    parts = urlsplit(dsn)
    if parts.password:
        netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    return dsn


def _drop_database(server_dsn: str, database: str) -> None:
    with contextlib.suppress(OSError, asyncpg.PostgresError):
        _run(_admin(server_dsn, (f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)', ())))


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


__all__ = ["DemoConfig", "DemoResult", "run", "seed"]
