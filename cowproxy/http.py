"""The small HTTP/1.1 both servers of the project need (the proxy's admin API, the demo's sample app).

Sans-IO at the core: ``parse_head`` turns the bytes of a request head into a frozen ``RequestHead`` and
``response`` builds the bytes of a response, with one table of reason phrases; ``read_request`` is the thin
asyncio part that reads one request off a stream. No framework and no dependency: two JSON APIs with a
handful of routes need a request line, headers and a Content-Length body, nothing more (no chunked bodies,
no pipelining beyond keep-alive, no TLS).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

REASONS = {
    200: "OK",
    201: "Created",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Payload Too Large",
    422: "Unprocessable Entity",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
MAX_HEAD = 16 * 1024  # request line and headers


class HttpError(ValueError):
    """A request the server cannot read: malformed, or its head or body is too large."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class RequestHead:
    method: str  # upper case
    target: str
    version: str
    headers: Mapping[str, str]  # names lower case

    @property
    def content_length(self) -> int:
        try:
            length = int(self.headers.get("content-length", "0") or 0)
        except ValueError:
            raise HttpError(400, "bad Content-Length") from None
        if length < 0:
            raise HttpError(400, "bad Content-Length")
        return length

    @property
    def keep_alive(self) -> bool:
        return self.version == "HTTP/1.1" and self.headers.get("connection", "").lower() != "close"


def parse_head(data: bytes) -> RequestHead:
    """The request line and headers, from the bytes up to the blank line (CRLF or bare LF line ends)."""
    lines = data.decode("latin-1").replace("\r\n", "\n").split("\n")
    parts = lines[0].split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise HttpError(400, "bad request line")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(":")
        if not colon:
            raise HttpError(400, "bad header line")
        headers[name.strip().lower()] = value.strip()
    return RequestHead(parts[0].upper(), parts[1], parts[2], headers)


def response(
    status: int, body: bytes, content_type: str = "application/json", *, keep_alive: bool = False
) -> bytes:
    head = (
        f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    return head.encode() + body


async def read_request(reader: asyncio.StreamReader, max_body: int) -> tuple[RequestHead, bytes] | None:
    """One request off the stream, or None when the client closed it before sending one. Raises
    HttpError (413 for a body over ``max_body``, 400 for a malformed or oversized head)."""
    head = b""
    while True:
        line = await reader.readline()
        if not line:
            if not head:
                return None
            raise asyncio.IncompleteReadError(head, None)
        if line in (b"\r\n", b"\n"):
            if not head:
                raise HttpError(400, "bad request line")
            break
        head += line
        if len(head) > MAX_HEAD:
            raise HttpError(400, "request head too large")
    request = parse_head(head)
    length = request.content_length
    if length > max_body:
        raise HttpError(413, "request body too large")
    body = await reader.readexactly(length) if length else b""
    return request, body
