"""Several proxy processes as one: `cowproxy serve --workers N` (one listen port, SO_REUSEPORT) and
replicas, with the admin routes shared through the state database (cow.proxy_routes, LISTEN/NOTIFY).
A route made through one is obeyed by the others; each worker's metrics count its own connections and
statements, and they add up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import psycopg
import pytest

from proxy.admin import admin_request
from tests.fix_db import PgServer
from tests.fix_proxy import run_proxy
from tests.proxy.test_adversity import dbname, wait_for
from tests.proxy.test_tagging import base_customers, changes
from tests.serve import free_port, free_port_run

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]


def samples(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


def accepted(found: dict[str, float]) -> float:
    return found.get("cowproxy_client_connections_total", 0)


def insert(dsn: str, email: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO customers (email, name) VALUES (%s, 'w')", (email,))


def _serve_two_workers(pg_server: PgServer, layer_db: str) -> tuple[subprocess.Popen[str], int, int, int]:
    """``cowproxy serve --workers 2`` on free ports. Worker i listens for metrics and admin on the given
    port + i: both runs must be free. Another suite on the machine may take one between the check and the
    bind; then the server exits saying so, and new ports are tried (at most three times)."""
    for _ in range(3):
        port, metrics, admin = free_port(), free_port_run(2), free_port_run(2)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cowproxy",
                "serve",
                "--workers",
                "2",
                "--upstream",
                f"{pg_server.host}:{pg_server.port}",
                "--listen",
                f"127.0.0.1:{port}",
                "--metrics",
                f"127.0.0.1:{metrics}",
                "--admin",
                f"127.0.0.1:{admin}",
                "--state-dsn",
                layer_db,
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stderr=subprocess.PIPE,
            text=True,
        )

        def up(metrics: int = metrics) -> bool:
            try:
                return all(samples(m) is not None for m in (metrics, metrics + 1))
            except OSError:
                return False

        # Two workers each import the proxy and load the catalog: slow on a loaded 2-core machine.
        if wait_for(lambda proc=proc: up() or proc.poll() is not None, 90) and up():
            return proc, port, metrics, admin
        proc.kill()
        err = proc.communicate(timeout=10)[1]
        if "address already in use" not in err:
            pytest.fail(f"workers not up (exit {proc.poll()}): {err[-2000:]}")
    pytest.fail("workers not up: three runs of free ports were taken before the workers could bind them")


def test_two_workers_share_the_port_the_routes_and_add_up(pg_server: PgServer, layer_db: str) -> None:
    proc, port, metrics, admin = _serve_two_workers(pg_server, layer_db)
    try:
        through = f"postgresql://postgres@127.0.0.1:{port}/{dbname(layer_db)}"
        # A route made through worker 1's admin API: every connection, whichever worker takes it, obeys.
        admin_request(
            f"http://127.0.0.1:{admin + 1}",
            "POST",
            "/routes",
            {"database": dbname(layer_db), "session": "w1"},
        )
        # The kernel spreads connections over both listeners by a hash of the client's port, and a
        # worker still binding under load gets none: connect until both served one (bounded), not a
        # fixed count that may all land on one.
        routed = 0
        per_worker = [samples(m) for m in (metrics, metrics + 1)]
        while routed < 12 or not all(accepted(s) > 0 for s in per_worker):
            assert routed < 200, [accepted(s) for s in per_worker]
            insert(through, f"routed{routed}@w")
            routed += 1
            per_worker = [samples(m) for m in (metrics, metrics + 1)]

        # A worker's scrape is served by a thread of its own: the last insert's count may land just after
        # its reply reached the client (counted, not lost: wait a bounded while for it).
        def tagged_inserts() -> list[float]:
            return [
                s.get('cowproxy_statements_total{kind="insert",tagged="true"}', 0)
                for s in (samples(m) for m in (metrics, metrics + 1))
            ]

        wait_for(lambda: sum(tagged_inserts()) >= routed, 10)
        per_worker = [samples(m) for m in (metrics, metrics + 1)]
        untagged = [s.get('cowproxy_statements_total{kind="insert",tagged="false"}', 0) for s in per_worker]
        assert sum(tagged_inserts()) == routed, (tagged_inserts(), untagged)
        assert sum(accepted(s) for s in per_worker) == routed
        # Unrouted through worker 0: back to the base tables everywhere.
        admin_request(f"http://127.0.0.1:{admin}", "DELETE", f"/routes/{dbname(layer_db)}")
        for i in range(6):
            insert(through, f"plain{i}@w")
        assert admin_request(f"http://127.0.0.1:{admin + 1}", "GET", "/routes") == {"routes": {}}
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert sorted(row[2] for row in changes(layer_db, "w1")) == sorted(f"routed{i}@w" for i in range(routed))
    base = set(base_customers(layer_db))
    assert {f"plain{i}@w" for i in range(6)} <= base
    assert not [e for e in base if e.startswith("routed")]


def test_replicas_obey_a_route_made_through_another(pg_server: PgServer, layer_db: str) -> None:
    database = dbname(layer_db)
    with run_proxy(pg_server, state_dsn=layer_db) as one, run_proxy(pg_server, state_dsn=layer_db) as two:
        with psycopg.connect(two.dsn(layer_db), autocommit=True) as pooled:  # open before the route
            pooled.execute("SELECT 1")
            admin_request(one.admin_url, "POST", "/routes", {"database": database, "session": "rep"})
            assert wait_for(lambda: database in two.server.routes, 10)
            pooled.execute("INSERT INTO customers (email, name) VALUES ('pooled@rep', 'r')")
            insert(two.dsn(layer_db), "new@rep")
            admin_request(two.admin_url, "DELETE", f"/routes/{database}")
            assert wait_for(lambda: database not in one.server.routes, 10)
            pooled.execute("INSERT INTO customers (email, name) VALUES ('after@rep', 'r')")
        insert(one.dsn(layer_db), "one@rep")
    assert sorted(row[2] for row in changes(layer_db, "rep")) == ["new@rep", "pooled@rep"]
    assert {"after@rep", "one@rep"} <= set(base_customers(layer_db))


def test_workers_settings_are_checked(pg_server: PgServer) -> None:
    def serve(*args: str) -> str:
        upstream = f"{pg_server.host}:{pg_server.port}"
        run = subprocess.run(
            [sys.executable, "-m", "cowproxy", "serve", "--upstream", upstream, *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert run.returncode != 0
        return run.stderr.strip()

    assert "fixed port" in serve("--workers", "2", "--listen", "127.0.0.1:0")
    assert "state_dsn" in serve("--workers", "2", "--listen", "127.0.0.1:6999", "--admin", "127.0.0.1:7999")
    assert "from 1 to 64" in serve("--workers", "0")
    assert "state database" in serve(
        "--state-dsn", "postgresql://nobody@127.0.0.1:1/x", "--listen", "127.0.0.1:0"
    )
