"""Driving ``cowproxy serve`` from the demo: start it as a subprocess, route and unroute sessions.

Uses the proxy's documented surfaces only: the ``serve`` command line and the admin HTTP API
(``GET /health``, ``POST /routes {"database", "session"}``, ``DELETE /routes/{database}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote

from demo.errors import DemoError
from proxy.commands import run_proxy
from proxy.config import build_config
from proxy.errors import ProxyError

Address = tuple[str, int]


def _addr(a: Address) -> str:
    return f"{a[0]}:{a[1]}"


def _request(admin: Address, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        f"http://{_addr(admin)}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            detail = exc.read().decode(errors="replace")
        raise DemoError(
            f"proxy admin API {method} {path}: HTTP {exc.code}: {' '.join(detail.split())}"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        raise DemoError(f"proxy admin API at {_addr(admin)} unreachable: {exc}") from None
    return json.loads(raw) if raw.strip() else None


def start(
    upstream: Address,
    listen: Address,
    metrics: Address,
    admin: Address,
    log: Path,
    *,
    secret_file: Path,
    reads_dsn: str | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``cowproxy serve`` and wait until its admin API answers; DemoError if it cannot start.
    ``reads_dsn``: record the sessions' reads (``--reads-dsn``)."""
    cmd = [
        sys.executable, "-m", "cowproxy", "serve",
        "--upstream", _addr(upstream), "--listen", _addr(listen),
        "--metrics", _addr(metrics), "--admin", _addr(admin), "--bind-secret-file", str(secret_file),
    ]  # fmt: skip
    if reads_dsn is not None:
        cmd += ["--reads-dsn", reads_dsn]
    with open(log, "wb") as sink:
        process = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise DemoError(f"cowproxy serve exited with {process.returncode}: {' | '.join(tail)}")
        with contextlib.suppress(DemoError):
            _request(admin, "GET", "/health")
            return process
        time.sleep(0.1)
    process.kill()
    process.wait(5)
    raise DemoError("cowproxy serve did not answer on its admin API within 20 s")


def reads_pending(metrics: Address) -> float | None:
    """``cowproxy_reads_queued``: read records not written yet (None: the proxy records no reads)."""
    try:
        with urllib.request.urlopen(f"http://{_addr(metrics)}/metrics", timeout=10) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        raise DemoError(f"proxy metrics at {_addr(metrics)} unreachable: {exc}") from None
    for line in text.splitlines():
        if line.startswith("cowproxy_reads_queued "):
            return float(line.split()[1])
    return None


def wait_reads(metrics: Address, timeout: float = 10.0) -> None:
    """Wait until the proxy has written every read recorded so far (scores read ``cow.reads``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pending = reads_pending(metrics)
        if not pending:
            return
        time.sleep(0.05)


def route(admin: Address, session: str, database: str) -> None:
    _request(admin, "POST", "/routes", {"database": database, "session": session})


def unroute(admin: Address, database: str) -> None:
    _request(admin, "DELETE", "/routes/" + quote(database, safe=""))


def routes(admin: Address) -> dict[str, str]:
    got = _request(admin, "GET", "/routes")
    return dict(got.get("routes", {})) if isinstance(got, dict) else {}


class InProcessProxy:
    """The proxy's ``run_proxy`` on its own asyncio loop in a thread (when the subprocess cannot start)."""

    def __init__(
        self,
        upstream: Address,
        listen: Address,
        metrics: Address,
        admin: Address,
        secret_file: Path,
        *,
        reads_dsn: str | None = None,
    ) -> None:

        try:
            config = build_config(
                {"upstream": _addr(upstream), "listen": _addr(listen), "metrics": _addr(metrics),
                 "admin": _addr(admin), "bind_secret_file": str(secret_file), "reads_dsn": reads_dsn}
            )  # fmt: skip
        except ProxyError as exc:
            raise DemoError(f"the proxy refused its configuration: {exc}") from None
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None

        def run() -> None:
            async def main() -> None:
                self._stop = asyncio.Event()
                ready = asyncio.Event()
                task = asyncio.create_task(run_proxy(config, ready, self._stop))
                waiter = asyncio.create_task(ready.wait())
                await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                self._ready.set()
                await task

            try:
                self._loop.run_until_complete(main())
            except BaseException as exc:  # reported to the starting thread
                self._error = exc
                self._ready.set()
            finally:
                self._loop.close()

        self._thread = threading.Thread(target=run, name="cowproxy-in-process", daemon=True)
        self._thread.start()
        if not self._ready.wait(20) or self._error is not None:
            self.stop()
            raise DemoError(f"the in-process proxy did not start: {self._error}")

    def stop(self) -> None:
        if self._thread.is_alive() and self._stop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(15)
