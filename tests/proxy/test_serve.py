"""``cowproxy serve`` as a process: flags and config file, metrics, admin API and its CLI, TLS, SIGTERM."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from proxy.admin import admin_request
from proxy.errors import AdminError
from tests.fix_db import PgServer
from tests.fix_proxy import RunningProxy
from tests.serve import free_port

pytestmark = pytest.mark.timeout(90)


def cowproxy(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cowproxy", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class Served:
    def __init__(self, proc: subprocess.Popen[str], port: int, admin: int, metrics: int) -> None:
        self.proc, self.port, self.admin, self.metrics = proc, port, admin, metrics

    def dsn(self, direct: str, **params: str) -> str:
        database = direct.rsplit("/", 1)[1]
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}" + (f"?{query}" if query else "")


@pytest.fixture
def served(pg_server: PgServer, tmp_path: Path) -> Iterator[Served]:
    port, admin, metrics = free_port(), free_port(), free_port()
    config = tmp_path / "cowproxy.toml"
    # The file gives the upstream and a bogus listen address; the flag overrides the latter.
    config.write_text(
        f'[proxy]\nupstream = "{pg_server.host}:{pg_server.port}"\nlisten = "127.0.0.1:1"\n'
        f'admin_token = "s3cret"\ndrain_timeout = 10\nlog_format = "json"\n'
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cowproxy",
            "serve",
            "--config",
            str(config),
            "--listen",
            f"127.0.0.1:{port}",
            "--admin",
            f"127.0.0.1:{admin}",
            "--metrics",
            f"127.0.0.1:{metrics}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", admin), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None, proc.communicate()[1]
            time.sleep(0.1)
    try:
        yield Served(proc, port, admin, metrics)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def test_serve_metrics_admin_and_route_cli(served: Served, layer_db: str) -> None:
    database = layer_db.rsplit("/", 1)[1]
    admin = f"127.0.0.1:{served.admin}"
    with psycopg.connect(served.dsn(layer_db), autocommit=True) as conn:
        conn.execute("SELECT count(*) FROM customers")
        conn.execute("/*cow_session='m1'*/ INSERT INTO customers (email, name) VALUES ('m@x', 'm')")
        with pytest.raises(psycopg.Error):
            conn.execute("SELECT 1/0")
        # Route through the CLI (the token is required), then an untagged write lands in the session.
        denied = cowproxy("session", "route", "r1", "--database", database, "--admin", admin)
        assert denied.returncode == 1 and "401" in denied.stderr and "Traceback" not in denied.stderr
        ok = cowproxy(
            "session", "route", "r1", "--database", database, "--admin", admin, "--admin-token", "s3cret"
        )
        assert ok.returncode == 0, ok.stderr
        conn.execute("INSERT INTO customers (email, name) VALUES ('r@x', 'r')")
        listed = admin_request(f"http://{admin}", "GET", "/connections", token="s3cret")
        assert [c["session"] for c in listed] == ["r1"]
        out = cowproxy(
            "session",
            "unroute",
            "--database",
            database,
            "--admin",
            admin,
            "--admin-token",
            "s3cret",
            "--format",
            "json",
        )
        assert out.returncode == 0 and '"removed": true' in out.stdout
        again = cowproxy(
            "session", "unroute", "--database", database, "--admin", admin, "--admin-token", "s3cret"
        )
        assert again.returncode == 1 and "not routed" in again.stderr
    with psycopg.connect(layer_db, autocommit=True) as direct:
        assert direct.execute("SELECT count(*) FROM public.customers").fetchone() == (3,)
        assert direct.execute("SELECT count(*) FROM cow.session_changes('r1')").fetchone() == (1,)
    health = admin_request(f"http://{admin}", "GET", "/health")
    assert health["status"] == "ok"
    text = urllib.request.urlopen(f"http://127.0.0.1:{served.metrics}/metrics", timeout=5).read().decode()
    assert 'cowproxy_statements_total{kind="select",tagged="false"}' in text
    assert 'cowproxy_statements_total{kind="insert",tagged="true"}' in text
    assert 'cowproxy_writes_total{kind="insert",table="public.customers"}' in text
    assert 'cowproxy_errors_total{sqlstate_class="22"}' in text
    assert "cowproxy_query_duration_seconds_bucket" in text
    assert 'cowproxy_bytes_total{direction="client_to_server"}' in text
    assert 'cowproxy_parse_cache_lookups_total{result="miss"}' in text
    assert 'cowproxy_connections{side="client",state="idle"}' in text


def test_sigterm_drains(served: Served, empty_db: str) -> None:
    idle = psycopg.connect(served.dsn(empty_db), autocommit=True)
    busy = psycopg.connect(served.dsn(empty_db))
    busy.execute("CREATE TABLE t (x int)")
    busy.execute("INSERT INTO t VALUES (1)")  # an open transaction
    served.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(served.dsn(empty_db), connect_timeout=2)
    with pytest.raises(psycopg.OperationalError):
        idle.execute("SELECT 1")
    busy.execute("INSERT INTO t VALUES (2)")
    busy.commit()  # the transaction finishes, then the proxy closes the connection
    served.proc.wait(10)
    assert served.proc.returncode == 0
    _, err = served.proc.communicate()
    assert '"event": "stopped"' in err and '"conn"' in err
    with psycopg.connect(empty_db, autocommit=True) as direct:
        assert direct.execute("SELECT count(*) FROM t").fetchone() == (2,)
    idle.close()
    busy.close()


def test_bad_configuration_is_one_line(tmp_path: Path) -> None:
    assert "no upstream" in cowproxy("serve").stderr
    result = cowproxy("serve", "--upstream", "nowhere")
    assert result.returncode == 1 and "HOST:PORT" in result.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("upstream = [1,\n")
    result = cowproxy("serve", "--config", str(bad))
    assert result.returncode == 1 and "bad.toml" in result.stderr and "Traceback" not in result.stderr
    bad.write_text('upstream = "127.0.0.1:5432"\nlisten_port = 3\n')
    assert "unknown setting(s): listen_port" in cowproxy("serve", "--config", str(bad)).stderr
    result = cowproxy("session", "route", "bad id", "--database", "d")
    assert result.returncode == 1 and "invalid session id" in result.stderr
    result = cowproxy("session", "route", "s", "--database", "d", "--admin", f"127.0.0.1:{free_port()}")
    assert result.returncode == 1 and "cannot reach" in result.stderr


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make a test certificate")
def test_tls_to_clients(pg_server: PgServer, empty_db: str, tmp_path: Path) -> None:
    from proxy.config import Address
    from tests.fix_proxy import run_proxy

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    with run_proxy(pg_server, tls_cert=str(cert), tls_key=str(key)) as proxy:
        with psycopg.connect(proxy.dsn(empty_db, sslmode="require"), autocommit=True) as conn:
            assert conn.pgconn.ssl_in_use
            assert conn.execute("SELECT 5").fetchone() == (5,)
        with psycopg.connect(proxy.dsn(empty_db, sslmode="disable"), autocommit=True) as conn:
            assert not conn.pgconn.ssl_in_use
        # TLS from a proxy to its upstream: a second proxy in front of the first, which ends that TLS.
        tls_front = Address(proxy.host, proxy.port)
        with (
            run_proxy(pg_server, upstream=tls_front, upstream_tls="require") as front,
            psycopg.connect(front.dsn(empty_db), autocommit=True) as conn,
        ):
            assert conn.execute("SELECT 6").fetchone() == (6,)
            inner = proxy.run(lambda: [c.tls for c in proxy.server.connections.values()])
            assert inner == [True]
    # "prefer" falls back to plain TCP when the server says no; "require" refuses.
    with (
        run_proxy(pg_server, upstream_tls="prefer") as proxy,
        psycopg.connect(proxy.dsn(empty_db), autocommit=True) as conn,
    ):
        assert conn.execute("SELECT 7").fetchone() == (7,)
    if pg_server.bindir is not None:  # the embedded server runs without TLS
        with (
            run_proxy(pg_server, upstream_tls="require") as proxy,
            pytest.raises(psycopg.OperationalError, match="refused TLS"),
        ):
            psycopg.connect(proxy.dsn(empty_db))


def test_admin_api_errors(proxy: RunningProxy) -> None:
    with pytest.raises(AdminError, match="404"):
        admin_request(proxy.admin_url, "GET", "/nope")
    with pytest.raises(AdminError, match="400"):
        admin_request(proxy.admin_url, "POST", "/routes", {"database": "d"})
    with pytest.raises(AdminError, match="invalid session id"):
        admin_request(proxy.admin_url, "POST", "/routes", {"database": "d", "session": "bad id"})
    assert admin_request(proxy.admin_url, "GET", "/routes") == {"routes": {}}
