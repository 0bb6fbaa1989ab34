"""A small HTTP/1.1 admin API (asyncio, no framework) and its client, plus the ``/metrics`` endpoint.

Endpoints (JSON; an optional bearer token guards all of them but ``/health``):
  GET    /health                   {"status": "ok", "connections": N}
  GET    /connections              [{id, peer, database, user, state, session, operation, ...}]
  GET    /routes                   {"routes": {database: session}}
  POST   /routes  {"database": D, "session": S}     route D's untagged connections to S
  DELETE /routes/D                                  unroute D
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cowproxy.http import read_request, response
from proxy.config import Address
from proxy.errors import AdminError, ProxyError
from proxy.server import ProxyServer

MAX_BODY = 64 * 1024
Handler = Callable[[str, str, dict[str, str], bytes], Awaitable[tuple[int, str, bytes]]]


class HttpServer:
    """Serves one request per connection (``Connection: close``); enough for an admin API."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.server: asyncio.Server | None = None

    async def start(self, address: Address) -> None:
        try:
            self.server = await asyncio.start_server(self._serve, address.host, address.port)
        except OSError as exc:
            raise ProxyError(f"cannot listen on {address}: {exc.strerror}") from None

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(10):
                got = await read_request(reader, MAX_BODY)
                if got is None:
                    writer.close()
                    return
                request, body = got
                status, ctype, payload = await self.handler(
                    request.method, request.target, dict(request.headers), body
                )
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            status, ctype, payload = 400, "application/json", _json({"error": "bad request"})
        except ConnectionError:
            writer.close()
            return
        with contextlib.suppress(ConnectionError):
            writer.write(response(status, payload, ctype))
            await writer.drain()
        writer.close()


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True).encode()


class AdminApi:
    def __init__(self, proxy: ProxyServer, token: str | None) -> None:
        self.proxy = proxy
        self.token = token
        self.http = HttpServer(self.handle)

    async def handle(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, str, bytes]:
        auth = headers.get("authorization", "").encode()
        path = urllib.parse.urlsplit(target).path.rstrip("/") or "/"
        if path == "/health" and method == "GET":
            return (
                200,
                "application/json",
                _json({"status": "ok", "connections": len(self.proxy.connections)}),
            )
        if self.token is not None:
            expected = f"Bearer {self.token}".encode()
            if not hmac.compare_digest(auth, expected):
                return 401, "application/json", _json({"error": "missing or wrong bearer token"})
        if path == "/connections" and method == "GET":
            conns = self.proxy.describe_connections()
            return 200, "application/json", _json(conns)
        if path == "/routes" and method == "GET":
            routes = {db: tags.session for db, tags in self.proxy.routes.items()}
            return 200, "application/json", _json({"routes": routes})
        if path == "/routes" and method == "POST":
            try:
                data = json.loads(body or b"{}")
                database, session = str(data["database"]), str(data["session"])
                await self.proxy.set_route(database, session)
            except (ValueError, KeyError, TypeError):
                return 400, "application/json", _json({"error": 'expected {"database": D, "session": S}'})
            except ProxyError as exc:
                return 400, "application/json", _json({"error": str(exc)})
            return 200, "application/json", _json({"database": database, "session": session})
        if path.startswith("/routes/") and method == "DELETE":
            database = urllib.parse.unquote(path[len("/routes/") :])
            try:
                found = await self.proxy.remove_route(database)
            except ProxyError as exc:
                return 503, "application/json", _json({"error": str(exc)})
            return (
                (200 if found else 404),
                "application/json",
                _json({"database": database, "removed": found}),
            )
        if path in ("/health", "/connections", "/routes") or path.startswith("/routes/"):
            return 405, "application/json", _json({"error": "method not allowed"})
        return 404, "application/json", _json({"error": "not found"})


class MetricsEndpoint:
    def __init__(self, proxy: ProxyServer) -> None:
        self.proxy = proxy
        self.http = HttpServer(self.handle)

    async def handle(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, str, bytes]:
        path = urllib.parse.urlsplit(target).path
        if path != "/metrics":
            return 404, "text/plain", b"not found: try /metrics\n"
        if method != "GET":
            return 405, "text/plain", b"method not allowed\n"
        return 200, CONTENT_TYPE_LATEST, generate_latest(self.proxy.metrics.registry)


def admin_request(
    base_url: str, method: str, path: str, body: dict[str, Any] | None = None, token: str | None = None
) -> Any:
    """Call the admin API (for the CLI); raises AdminError with a one-line reason."""
    url = base_url.rstrip("/") + path
    if "://" not in url:
        url = "http://" + url
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read()).get("error", exc.reason)
        except (ValueError, AttributeError):
            detail = exc.reason
        raise AdminError(f"admin API {method} {path}: HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise AdminError(f"cannot reach the cowproxy admin API at {base_url}: {reason}") from None
