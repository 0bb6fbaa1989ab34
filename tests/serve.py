"""A real ``cowproxy serve`` process on a free local port, for suites that run the proxy as its users do."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO


class ServeError(RuntimeError):
    """``cowproxy serve`` exited or did not listen in time (the message ends with its output)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_run(count: int) -> int:
    """The first of ``count`` consecutive free ports (``serve --workers N`` listens on metrics port + i)."""
    for _ in range(100):
        base = free_port()
        if base + count > 65536:
            continue
        with contextlib.ExitStack() as held:
            try:
                for port in range(base, base + count):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise ServeError(f"no {count} consecutive free ports on 127.0.0.1")


def cpu_seconds(pid: int) -> float:
    """The user + system CPU time of process ``pid`` so far, all its threads (from /proc: Linux only)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # (the name in parentheses may hold spaces)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


@contextlib.contextmanager
def cowproxy_process(
    cowproxy: Sequence[str],
    upstream: str,
    extra: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[int]:
    """``[*cowproxy, "serve", …]`` listening on a free port (yielded), stopped afterwards."""
    with cowproxy_popen(cowproxy, upstream, extra, env=env, cwd=cwd) as (port, _):
        yield port


@contextlib.contextmanager
def cowproxy_popen(
    cowproxy: Sequence[str],
    upstream: str,
    extra: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """``cowproxy_process``, yielding the process too (its pid: for ``cpu_seconds``)."""
    port = free_port()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [*cowproxy, "serve", "--upstream", upstream, "--listen", f"127.0.0.1:{port}", *extra],
            cwd=cwd,
            env=None if env is None else dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_listening(proc, port, log)
            yield port, proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_listening(proc: subprocess.Popen[bytes], port: int, log: IO[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        if proc.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            raise ServeError(f"cowproxy serve did not start: {log.read()[-2000:].decode(errors='replace')}")
        time.sleep(0.1)
