"""cowproxy.http, the HTTP/1.1 of the admin API and the demo app, on literal bytes and a real stream."""

from __future__ import annotations

import asyncio

import pytest

from cowproxy.http import HttpError, parse_head, read_request, response


def test_a_request_head_is_parsed_with_crlf_or_bare_lf() -> None:
    for raw in (
        b"post /routes HTTP/1.1\r\nContent-Length: 12\r\nAuthorization: Bearer t\r\n",
        b"post /routes HTTP/1.1\nContent-Length: 12\nAuthorization: Bearer t\n",
    ):
        head = parse_head(raw)
        assert (head.method, head.target, head.version) == ("POST", "/routes", "HTTP/1.1")
        assert head.headers == {"content-length": "12", "authorization": "Bearer t"}
        assert head.content_length == 12 and head.keep_alive
    assert not parse_head(b"GET / HTTP/1.0\r\n").keep_alive
    assert not parse_head(b"GET / HTTP/1.1\r\nConnection: Close\r\n").keep_alive


@pytest.mark.parametrize(
    "raw", [b"GET /\r\n", b"GET / HTTP/1.1 x\r\n", b"GET / HTTP/1.1\r\nno colon\r\n", b"\r\n"]
)
def test_a_malformed_head_is_a_400(raw: bytes) -> None:
    with pytest.raises(HttpError) as failure:
        parse_head(raw)
    assert failure.value.status == 400


def test_a_response_has_its_reason_length_and_connection() -> None:
    assert response(404, b"{}") == (
        b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
        b"Connection: close\r\n\r\n{}"
    )
    assert response(299, b"", "text/plain", keep_alive=True).startswith(b"HTTP/1.1 299 Status\r\n")
    assert b"Connection: keep-alive\r\n" in response(200, b"", keep_alive=True)


def _read(data: bytes, max_body: int = 10) -> object:
    async def go() -> object:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await read_request(reader, max_body)

    return asyncio.run(asyncio.wait_for(go(), 10))


def test_read_request_takes_the_head_and_exactly_the_body() -> None:
    got = _read(b"PUT /x HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcdef")
    assert isinstance(got, tuple)
    assert got[0].method == "PUT" and got[1] == b"abc"
    assert _read(b"") is None  # the client closed before a request


def test_read_request_refuses_a_large_body_or_head() -> None:
    with pytest.raises(HttpError) as failure:
        _read(b"PUT /x HTTP/1.1\r\nContent-Length: 11\r\n\r\n" + b"a" * 11)
    assert failure.value.status == 413
    with pytest.raises(HttpError) as failure:
        _read(b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * 20000 + b"\r\n\r\n")
    assert failure.value.status == 400
    with pytest.raises(HttpError):
        _read(b"PUT /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n")
