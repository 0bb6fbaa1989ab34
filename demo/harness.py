"""``cowproxy demo``: the whole system on the sample application, in one process tree.

Embedded PostgreSQL (or a server given with ``--dsn``) → sample database + CoW layer → ``cowproxy serve``
(a subprocess) → the sample application (its pool's ``DATABASE_URL`` points at the proxy) → ground-truth
and agent sessions routed through the proxy's admin API → scoring → tables, HTML report, metrics →
discard (or commit). Everything started here is stopped here, also on Ctrl-C or an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg

import migrations
import scoring
from demo import agents, layer_ops, proxy_ops, report, seed, workflows
from demo.api import HttpApi
from demo.app import AppConfig, BackgroundApp, setup_database
from demo.errors import DemoError
from demo.openapi import BY_ID
from demo.report import SessionScore
from demo.workflows import Workflow
from migrations.binding import rotate_secret, write_secret_file
from migrations.embedded import embedded_postgres
from scoring import api


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
    fixed_scores: tuple[SessionScore, ...] = ()  # the re-run with the fixed tool surface


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

BIND_SECRET_FILE = "bind-secret"  # in the run's work directory: the proxy binds its sessions with it


async def _install_layer(dsn: str, secret_file: Path) -> list[asyncpg.Record]:

    conn = await asyncpg.connect(dsn)
    try:
        await migrations.install_layer(conn, schemas=("public",))
        # A fresh binding secret the demo's proxy holds (the install's own is shown once, not kept).
        secret = await rotate_secret(conn)
        write_secret_file(secret_file, secret)
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

    fn = getattr(scoring, "score_sessions", None)
    if fn is None:  # the documented name (docs/interfaces.md); fall back to where it is defined
        fn = api.score_sessions
    return fn(dsn, gt, agent)


def _finish_sessions(dsn: str, sessions: Sequence[str], commit: str | None) -> None:

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

    def wait_reads(self) -> None:
        """Before scoring: the read traces recorded so far are written (only the proxy records them)."""

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

        self.database = database
        self.listen = ("127.0.0.1", _free_port())
        self.metrics_addr = ("127.0.0.1", _free_port())
        self.admin_addr = ("127.0.0.1", _free_port())
        self.log_path = workdir / "proxy.log"
        secret_file = workdir / BIND_SECRET_FILE
        self.process: subprocess.Popen[bytes] | None = None
        self.stopped_pid: int | None = None
        self.in_process: proxy_ops.InProcessProxy | None = None
        self.notes: list[str] = []
        self.database_url = _with_host_port(database_url_template, *self.listen)
        self.app: BackgroundApp | None = None
        try:
            self.process = proxy_ops.start(
                upstream,
                self.listen,
                self.metrics_addr,
                self.admin_addr,
                self.log_path,
                secret_file=secret_file,
                reads_dsn=database_url_template,  # its reads, in the demo database's cow.reads
            )
            self._start_app()
        except DemoError as exc:
            # E.g. `cowproxy serve` crashing on its event loop (seen with uvloop while the proxy was built):
            # the same proxy code on the standard asyncio loop in this process still shows the system; say so.
            self._stop_all()
            self.notes.append(f"cowproxy serve (subprocess) failed: {exc}; running the proxy in-process")
            self.name = "proxy admin route (proxy in-process)"
            self.in_process = proxy_ops.InProcessProxy(
                upstream,
                self.listen,
                self.metrics_addr,
                self.admin_addr,
                secret_file,
                reads_dsn=database_url_template,
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

        proxy_ops.route(self.admin_addr, session, self.database)

    def leave(self) -> None:

        proxy_ops.unroute(self.admin_addr, self.database)

    def wait_reads(self) -> None:
        proxy_ops.wait_reads(self.metrics_addr)

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


@dataclass
class _Run:
    """What the demo's steps share while it runs."""

    cfg: DemoConfig
    interrupts: Interrupts
    out: TextIO
    progress: Progress
    stack: contextlib.ExitStack
    workdir: Path
    resources: dict[str, Any]
    run_id: str = ""
    db_dsn: str = ""
    overlay: str = "public"
    checksum_before: str = ""
    tagging: ProxyTagging | DirectTagging | None = None
    fallback: str | None = None
    sessions: list[str] = field(default_factory=list)
    gt_rows: dict[str, int] = field(default_factory=dict)

    def gt(self, wf: Workflow) -> str:
        return f"gt-{wf.slug}-{self.run_id}"

    @property
    def tags(self) -> ProxyTagging | DirectTagging:
        assert self.tagging is not None, "the tagging step runs before the sessions"
        return self.tagging


@dataclass(frozen=True)
class _AgentRun:
    agent: agents.Agent
    workflow: Workflow
    session: str
    outcome: agents.AgentResult
    calls: tuple[agents.ToolCall, ...]
    fixed: bool


def _run_demo(cfg: DemoConfig, interrupts: Interrupts) -> DemoResult:
    chosen = _chosen_workflows(cfg)
    agent_list = _make_agents(cfg)
    for path in (cfg.report_path, cfg.json_path):
        if path is not None and not path.resolve().parent.is_dir():
            raise DemoError(f"cannot write {path}: {path.resolve().parent} is not a directory")
    out = cfg.out or sys.stdout
    progress = Progress(out, 12, interrupts.checkpoint)
    with contextlib.ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="cowproxy-demo-"))
        stack.callback(_rmtree, workdir)
        # What was started, so that a caller (the tests) can check that it is all gone afterwards.
        run = _Run(cfg, interrupts, out, progress, stack, workdir, {"workdir": str(workdir)})
        run.run_id = secrets.token_hex(2)
        server_dsn = _start_postgres(run)
        _create_database(run, server_dsn)
        _start_tagging(run)
        _record_ground_truths(run, chosen)
        runs = _run_agents(run, agent_list, chosen, fixed=False)
        scores, results = _score_runs(run, runs)
        _print_tables(run, scores)
        fixed_scores, fixed_results = _fix_loop(run, agent_list, chosen, runs, scores)
        untouched = _check_base(run)
        report_path = _write_report(run, chosen, scores + fixed_scores, {**results, **fixed_results})
        metrics = _show_metrics(run)
        result = _finish(
            run,
            chosen,
            scores=scores,
            fixed_scores=fixed_scores,
            untouched=untouched,
            report_path=report_path,
            metrics=metrics,
        )
    progress.say("stopped the application, the proxy and PostgreSQL; removed the temporary files")
    for note in result.proxy_notes:
        progress.say(f"NOTE: {note}")
    if result.fallback:
        progress.say(
            f"NOTE: sessions were tagged with startup options, not through the proxy: {result.fallback}"
        )
    if cfg.json_path is not None:
        cfg.json_path.write_text(json.dumps({**_as_json(result), "resources": run.resources}, indent=2))
    return result


def _chosen_workflows(cfg: DemoConfig) -> list[Workflow]:
    chosen = []
    for slug in cfg.workflows:
        if slug not in workflows.BY_SLUG:
            raise DemoError(f"unknown workflow {slug!r}; known: {', '.join(workflows.BY_SLUG)}")
        chosen.append(workflows.BY_SLUG[slug])
    return chosen


def _start_postgres(run: _Run) -> str:
    """Step 1: the server (given, or an embedded PostgreSQL); its maintenance DSN."""
    if run.cfg.server_dsn:
        run.progress(f"using the PostgreSQL server at {_redact(run.cfg.server_dsn)}")
        server_dsn = run.cfg.server_dsn
    else:
        run.progress("starting an embedded PostgreSQL (initdb + pg_ctl, a temporary data directory)")
        server = run.stack.enter_context(embedded_postgres())
        run.resources["datadir"] = str(server.datadir)
        server_dsn = server.dsn("postgres")
    version = _run(_admin(server_dsn, ("SHOW server_version", ())))[0][0][0]
    run.progress.detail(f"PostgreSQL {version} at {_redact(server_dsn)}")
    return server_dsn


def _create_database(run: _Run, server_dsn: str) -> None:
    """Steps 2-3: the sample application's database, seeded, with the CoW layer on schema public."""
    database = f"cowproxy_demo_{os.getpid()}_{secrets.token_hex(3)}"
    _run(_admin(server_dsn, (f'CREATE DATABASE "{database}"', ())))
    run.stack.callback(_drop_database, server_dsn, database)
    run.db_dsn = _with_database(server_dsn, database)
    counts = _run(setup_database(run.db_dsn))
    run.progress(
        f"created the sample application's database {database}: {counts.projects} projects,"
        f" {counts.members} members, {counts.states} states, {counts.labels} labels,"
        f" {counts.work_items} work items"
    )
    tables = _run(_install_layer(run.db_dsn, run.workdir / BIND_SECRET_FILE))
    run.overlay = str(tables[0]["overlay_schema"]) if tables else "public"
    run.progress(
        f"installed the CoW layer: {len(tables)} tables in schema public, overlay schema {run.overlay}"
    )
    run.checksum_before = _base_checksum(run.db_dsn)


def _start_tagging(run: _Run) -> None:
    """Steps 4-5: the proxy (or startup-option tagging) and the application behind it."""
    parts = urlsplit(run.db_dsn)
    database = (parts.path or "/").lstrip("/")
    upstream = (parts.hostname or "127.0.0.1", parts.port or 5432)
    progress = run.progress
    tagging: ProxyTagging | DirectTagging
    if run.cfg.use_proxy:
        try:
            tagging = ProxyTagging(upstream, database, run.db_dsn, run.workdir)
        except DemoError as exc:
            run.fallback = f"the proxy could not start ({exc})"
            progress(f"{run.fallback}; tagging with startup options instead (the layer's own tag source)")
            tagging = DirectTagging(run.db_dsn, run.overlay)
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
        run.fallback = "--no-proxy"
        progress("no proxy (--no-proxy): the application is tagged with startup options")
        tagging = DirectTagging(run.db_dsn, run.overlay)
    run.tagging = tagging
    run.stack.callback(tagging.close)
    run.resources["app_url"] = tagging.app_url
    if isinstance(tagging, ProxyTagging):
        pid = tagging.process.pid if tagging.process is not None else tagging.stopped_pid
        if pid is not None:
            run.resources["proxy_pid"] = pid
        run.resources["proxy_listen"] = list(tagging.listen)
    app_db_url = getattr(tagging, "database_url", run.db_dsn)
    progress(f"started the sample application at {tagging.app_url} (DATABASE_URL={_redact(app_db_url)})")
    progress.detail(f"OpenAPI document: {tagging.app_url}/openapi.json")


def _record_ground_truths(run: _Run, chosen: Sequence[Workflow]) -> None:
    """Step 6: one ground-truth session per workflow, its writes derived from the data through the API."""
    run.progress(f"recording {len(chosen)} ground-truth session(s) through the application's API")
    for wf in chosen:
        gt = run.gt(wf)
        _register(run.db_dsn, gt, "ground_truth", workflow=wf, model=None, gt=None)
        run.sessions.append(gt)
        run.tags.enter(gt)
        try:
            calls = workflows.record_ground_truth(HttpApi(run.tags.app_url), wf)
        finally:
            run.tags.leave()
        run.gt_rows[wf.slug] = _session_rows(run.db_dsn, gt)
        run.progress.detail(f"{wf.title:<36} {calls:3d} write calls  {run.gt_rows[wf.slug]:3d} rows  ({gt})")


def _run_agents(
    run: _Run, agent_list: Sequence[agents.Agent], chosen: Sequence[Workflow], *, fixed: bool
) -> list[_AgentRun]:
    """Step 7 (and 9 with ``fixed``): every agent on every workflow, one session each."""
    surface = "the fixed tool surface" if fixed else "tools discover/execute"
    run.progress(
        f"running {len(agent_list)} agent(s) × {len(chosen)} workflow(s), {surface},"
        f" limit {agents.OPERATION_LIMIT} operations"
    )
    runs: list[_AgentRun] = []
    for agent in agent_list:
        for wf in chosen:
            # Session ids are [A-Za-z0-9._:-]{1,128}; model names may hold anything ("org/model v2").
            name = f"{agent.name}-{wf.slug}-{run.run_id}" + ("-fixed" if fixed else "")
            session = re.sub(r"[^A-Za-z0-9._:-]", "-", name)[-128:]
            _register(run.db_dsn, session, "agent", workflow=wf, model=agent.model, gt=run.gt(wf))
            run.sessions.append(session)
            run.tags.enter(session)
            tools = agents.Tools(
                HttpApi(run.tags.app_url), checkpoint=run.interrupts.checkpoint, fixed_vocabulary=fixed
            )
            try:
                outcome = agent.run(wf, tools)
            except agents.BudgetExhausted as exc:
                outcome = agents.AgentResult(False, str(exc))
            except DemoError as exc:  # e.g. a model endpoint's malformed reply: a failed run, not the demo's
                outcome = agents.AgentResult(False, f"failed: {exc}")
            finally:
                run.tags.leave()
            runs.append(_AgentRun(agent, wf, session, outcome, tuple(tools.calls), fixed))
            run.progress.detail(
                f"{agent.name:<14} {wf.slug:<36} {len(tools.calls):3d} tool calls"
                f"  {'done' if outcome.completed else 'incomplete'}: {outcome.message}"
            )
    return runs


def _call_counts(calls: Sequence[agents.ToolCall]) -> tuple[int, int, int]:
    """(discover, read, write) calls of a run."""
    discover = sum(1 for c in calls if c.tool == "discover")
    writes = sum(1 for c in calls if c.tool == "execute" and c.argument in BY_ID and BY_ID[c.argument].writes)
    return discover, len(calls) - discover - writes, writes


def _score_runs(run: _Run, runs: Sequence[_AgentRun]) -> tuple[list[SessionScore], dict[str, Any]]:
    """Step 8: every agent session against its ground truth (cow.session_changes)."""
    what = "the re-run" if runs and runs[0].fixed else "every agent session"
    run.progress(f"scoring {what} against its ground truth (cow.session_changes)")
    scores: list[SessionScore] = []
    results: dict[str, Any] = {}
    run.tags.wait_reads()
    for r in runs:
        result = _score(run.db_dsn, run.gt(r.workflow), r.session)
        results[r.session] = result
        discover, reads, writes = _call_counts(r.calls)
        scores.append(
            SessionScore(
                agent=r.agent.name,
                model=r.agent.model,
                workflow=r.workflow.slug,
                gt_session=run.gt(r.workflow),
                session=r.session,
                completed=r.outcome.completed,
                tool_calls=len(r.calls),
                overall=float(result.overall),
                struct=float(result.struct_score),
                content=float(result.content_score),
                precision=float(result.precision),
                recall=float(result.recall),
                f1=float(result.f1),
                matched=int(result.counts.matched),
                missing=int(result.counts.missing),
                extra=int(result.counts.extra),
                gt_rows=run.gt_rows[r.workflow.slug],
                message=r.outcome.message,
                fixed=r.fixed,
                discover_calls=discover,
                read_calls=reads,
                write_calls=writes,
            )
        )
    return scores, results


def _print_tables(run: _Run, scores: Sequence[SessionScore]) -> None:
    out = run.out
    print("\nPer agent (mean over workflows; like the paper's Table 5):", file=out)
    print(report.agent_table(report.summarize(scores)), file=out)
    print("\nLowest-scoring sessions per agent (like the paper's Table 6):", file=out)
    print(report.lowest_table(report.lowest(scores)), file=out)
    print(file=out, flush=True)


def _fix_loop(
    run: _Run,
    agent_list: Sequence[agents.Agent],
    chosen: Sequence[Workflow],
    runs: Sequence[_AgentRun],
    scores: Sequence[SessionScore],
) -> tuple[list[SessionScore], dict[str, Any]]:
    """Steps 9-10, the paper's score → diagnose → fix loop: show why the failing agents failed (their
    searches for "issue" found no operation), fix the tool surface ("issue" also finds work-item
    operations) and re-run the agents that left sessions incomplete; print the before/after table."""
    failing = [a for a in agent_list if any(s.agent == a.name and not s.completed for s in scores)]
    if not failing:
        run.progress("diagnosis: every agent completed every workflow; no tool-surface fix to try")
        return [], {}
    run.progress("diagnosis: what the agents with incomplete sessions searched for")
    for agent in failing:
        mine = [r for r in runs if r.agent.name == agent.name and not r.outcome.completed]
        searched = [c for r in mine for c in r.calls if c.tool == "discover"]
        issue = [c for c in searched if "issue" in c.argument.lower()]
        run.progress.detail(
            f"{agent.name}: {len(mine)} incomplete session(s), {len(searched)} discover call(s),"
            f' {len(issue)} of them for "issue" (the application says "work item")'
        )
        for query in dict.fromkeys(c.argument for c in issue[:20]):
            run.progress.detail(f"  discover({query!r})")
    run.progress.detail('the fix: discover reads "issue" as "work item"; work-item operations say so')
    fixed_runs = _run_agents(run, failing, chosen, fixed=True)
    fixed_scores, fixed_results = _score_runs(run, fixed_runs)
    print("\nBefore and after fixing the tool surface (like the paper's Table 1):", file=run.out)
    print(report.fix_table(report.before_after(scores, fixed_scores)), file=run.out)
    print(file=run.out, flush=True)
    return fixed_scores, fixed_results


def _check_base(run: _Run) -> bool:
    untouched = _base_checksum(run.db_dsn) == run.checksum_before
    if not untouched:
        raise DemoError("the base tables changed while sessions ran: a session wrote outside its overlay")
    run.progress.detail(f"base tables unchanged after {len(run.sessions)} sessions: yes (checksummed)")
    return untouched


def _write_report(
    run: _Run, chosen: Sequence[Workflow], scores: Sequence[SessionScore], results: dict[str, Any]
) -> Path:
    notes = [
        f"tagging: {run.tags.name}" + (f" ({run.fallback})" if run.fallback else ""),
        f"workflows: {', '.join(w.slug for w in chosen)}",
        "base tables untouched by the sessions: yes",
    ]
    details = [
        (
            f"{s.agent} on {s.workflow}" + (" (fixed tools)" if s.fixed else ""),
            _detail_html(results[s.session]),
        )
        for s in scores
    ]
    report_path = run.cfg.report_path.resolve()
    report_path.write_text(report.html_report(scores, notes, details, results))
    run.progress.detail(f"HTML report: {report_path}")
    return report_path


def _show_metrics(run: _Run) -> list[str]:
    metrics: list[str] = []
    with contextlib.suppress(OSError):
        metrics = run.tags.metrics()
    if metrics:
        run.progress.detail("a few of the proxy's Prometheus metrics:")
        for line in _pick_metrics(metrics):
            run.progress.detail(f"  {line}")
    elif isinstance(run.tags, DirectTagging):
        run.progress.detail("no proxy metrics: the proxy did not run")
    return metrics


def _keep_running(run: _Run) -> None:
    progress, tagging = run.progress, run.tags
    progress.say("--keep: leaving everything running; press Ctrl-C to stop and clean up")
    progress.detail(f"application: {tagging.app_url}   database: {_redact(run.db_dsn)}")
    if isinstance(tagging, ProxyTagging):
        progress.detail(
            f"proxy: {_redact(tagging.database_url)}   metrics: http://127.0.0.1:{tagging.metrics_addr[1]}"
            f"/metrics   admin: 127.0.0.1:{tagging.admin_addr[1]}"
        )
    progress.detail(f"sessions: {', '.join(run.sessions)}")
    while not run.interrupts.count:  # Ctrl-C ends the wait, then the demo finishes normally
        time.sleep(0.2)
    run.interrupts.count = 0


def _finish(
    run: _Run,
    chosen: Sequence[Workflow],
    *,
    scores: Sequence[SessionScore],
    fixed_scores: Sequence[SessionScore],
    untouched: bool,
    report_path: Path,
    metrics: list[str],
) -> DemoResult:
    """Step 11: discard every session (or commit the first ground truth), read the registry back."""
    committed = run.gt(chosen[0]) if run.cfg.commit else None
    if run.cfg.keep:
        _keep_running(run)
    _finish_sessions(run.db_dsn, [s for s in run.sessions if s != committed], committed)
    changed = None if committed is None else _base_checksum(run.db_dsn) != run.checksum_before
    registry = _run(
        _admin(
            run.db_dsn,
            (
                "SELECT session_id, kind, label, model, gt_session, status FROM cow.sessions"
                " WHERE session_id = ANY($1::text[]) ORDER BY created_at, session_id",
                (run.sessions,),
            ),
        )
    )[0]
    if committed:
        run.progress(
            f"committed {committed} into the base tables; discarded the other {len(run.sessions) - 1}"
        )
        run.progress.detail(f"base tables changed by the commit: {'yes' if changed else 'NO'}")
    else:
        run.progress(f"discarded all {len(run.sessions)} sessions (use --commit to commit one)")
    return DemoResult(
        scores=tuple(scores),
        gt_rows=run.gt_rows,
        tagging=run.tags.name,
        base_untouched=untouched,
        committed=committed,
        metrics=tuple(metrics),
        report_path=str(report_path),
        base_changed_by_commit=changed,
        registry=tuple(dict(r) for r in registry),
        fallback=run.fallback,
        proxy_notes=tuple(getattr(run.tags, "notes", ())),
        fixed_scores=tuple(fixed_scores),
    )


def _as_json(result: DemoResult) -> dict[str, Any]:
    return {
        **asdict(result),
        "scores": [asdict(s) for s in result.scores],
        "fixed_scores": [asdict(s) for s in result.fixed_scores],
        "before_after": [asdict(r) for r in report.before_after(result.scores, result.fixed_scores)],
    }


def _detail_html(result: Any) -> str:

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

    shutil.rmtree(path, ignore_errors=True)


__all__ = ["DemoConfig", "DemoResult", "run", "seed"]
