"""A small client of the sample application's REST API: one call per OpenAPI operation.

Arguments are flat (path, query and body fields in one dict) and split by the operation's declared
parameters, which is also how the agents' ``execute`` tool takes them.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlencode

from demo.errors import DemoError
from demo.openapi import BY_ID


class ApiError(DemoError):
    """The application answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class Caller(Protocol):
    def call(self, operation_id: str, arguments: dict[str, Any]) -> Any: ...


@dataclass(frozen=True)
class PreparedRequest:
    method: str
    url: str
    body: bytes | None


def prepare(base_url: str, operation_id: str, arguments: dict[str, Any]) -> PreparedRequest:
    """Build the HTTP request of one operation; unknown operations or arguments raise ApiError(400)."""
    op = BY_ID.get(operation_id)
    if op is None:
        raise ApiError(400, f"unknown operation {operation_id!r}")
    params = {p.name: p for p in op.params}
    has_body = op.writes and op.method != "DELETE"
    unknown = sorted(set(arguments) - set(params))
    if unknown and not has_body:
        raise ApiError(400, f"unknown argument(s) for {operation_id}: {', '.join(unknown)}")
    path = op.path
    query: dict[str, str] = {}
    body: dict[str, Any] = {}
    for name, value in arguments.items():
        # Unknown names go to the body, where the application validates them (as it would any client's).
        where = params[name].location if name in params else "body"
        if where == "path":
            path = path.replace("{" + name + "}", str(value))
        elif where == "query":
            query[name] = str(value).lower() if isinstance(value, bool) else str(value)
        else:
            body[name] = value
    missing = [p.name for p in op.path_params if "{" + p.name + "}" in path]
    if missing:
        raise ApiError(400, f"missing path argument(s) for {operation_id}: {', '.join(missing)}")
    url = base_url.rstrip("/") + path + ("?" + urlencode(query) if query else "")
    data = json.dumps(body).encode() if has_body else None
    return PreparedRequest(op.method, url, data)


class HttpApi:
    """Calls the application over HTTP (stdlib urllib, one connection per call)."""

    def __init__(self, base_url: str, timeout: float = 30.0) -> None:
        self.base_url = base_url
        self.timeout = timeout

    def call(self, operation_id: str, arguments: dict[str, Any]) -> Any:
        req = prepare(self.base_url, operation_id, arguments)
        request = urllib.request.Request(
            req.url, data=req.body, method=req.method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                detail = exc.read().decode(errors="replace")
            try:
                message = json.loads(detail).get("error", detail)
            except ValueError:
                message = detail
            raise ApiError(exc.code, str(message)) from None
        except (urllib.error.URLError, OSError) as exc:
            raise DemoError(f"the sample application at {self.base_url} is unreachable: {exc}") from None
        return json.loads(raw) if raw else None
