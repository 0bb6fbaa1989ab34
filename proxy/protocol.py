"""Sans-IO codec for the PostgreSQL frontend/backend protocol (3.0 and 3.2).

Bytes in, frozen dataclasses or raw frames out; no sockets and no asyncio here. Two readers:

- ``ClientReader`` frames what a client sends: the untyped startup packets first, then typed messages.
  Messages the proxy must inspect (Query, Parse, Bind, ...) are delivered whole; large messages of other
  types (CopyData, a 100 MB Bind) are streamed in chunks so that nothing is buffered without bound, and a
  message over the configured maximum is reported and skipped.
- ``ServerScanner`` walks what the server sends reading only the 5-byte headers, so that server bytes can
  be relayed in whole chunks; the caller asks for the body of the few messages it needs (ReadyForQuery,
  ErrorResponse, ...) and may drop or replace a message.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from proxy.errors import ProtocolError

# Startup request codes (the "protocol version" field of untyped packets).
SSL_REQUEST_CODE = 80877103
GSSENC_REQUEST_CODE = 80877104
CANCEL_REQUEST_CODE = 80877102
PROTOCOL_3_0 = 196608  # 3 << 16
PROTOCOL_3_2 = 196610

# A startup packet is small; PostgreSQL itself caps it at 10000 bytes (MAX_STARTUP_PACKET_LENGTH).
MAX_STARTUP_PACKET = 10000
# PostgreSQL's own cap on a typed message (PQ_LARGE_MESSAGE_LIMIT is 1 GB - 1).
PG_MAX_MESSAGE = 0x3FFFFFFF

_HEADER = struct.Struct("!cI")
_INT32 = struct.Struct("!I")


# ---------------------------------------------------------------------------------------------------------
# Startup packets


@dataclass(frozen=True)
class SSLRequest:
    pass


@dataclass(frozen=True)
class GSSENCRequest:
    pass


@dataclass(frozen=True)
class CancelRequest:
    pid: int
    key: bytes  # 4 bytes in protocol 3.0, up to 256 in 3.2

    def encode(self) -> bytes:
        body = _INT32.pack(CANCEL_REQUEST_CODE) + _INT32.pack(self.pid) + self.key
        return _INT32.pack(len(body) + 4) + body


@dataclass(frozen=True)
class StartupMessage:
    version: int
    params: tuple[tuple[str, str], ...]

    def get(self, name: str) -> str | None:
        for key, value in self.params:
            if key == name:
                return value
        return None

    def replace(self, name: str, value: str | None) -> StartupMessage:
        """A copy with ``name`` set to ``value`` (removed when None)."""
        params = [(k, v) for k, v in self.params if k != name]
        if value is not None:
            params.append((name, value))
        return StartupMessage(self.version, tuple(params))

    def encode(self) -> bytes:
        body = bytearray(_INT32.pack(self.version))
        for key, value in self.params:
            body += key.encode() + b"\0" + value.encode() + b"\0"
        body += b"\0"
        return _INT32.pack(len(body) + 4) + bytes(body)


StartupPacket = SSLRequest | GSSENCRequest | CancelRequest | StartupMessage


def parse_startup_packet(packet: bytes) -> StartupPacket:
    """Decode one whole untyped startup packet (length word included)."""
    if len(packet) < 8:
        raise ProtocolError("startup packet too short")
    (code,) = _INT32.unpack_from(packet, 4)
    body = packet[8:]
    if code == SSL_REQUEST_CODE and not body:
        return SSLRequest()
    if code == GSSENC_REQUEST_CODE and not body:
        return GSSENCRequest()
    if code == CANCEL_REQUEST_CODE:
        if len(body) < 8 or len(body) > 4 + 256:
            raise ProtocolError("malformed cancel request")
        (pid,) = _INT32.unpack_from(body, 0)
        return CancelRequest(pid, bytes(body[4:]))
    if code >> 16 != 3:
        raise ProtocolError(f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}")
    if not body.endswith(b"\0"):
        raise ProtocolError("startup packet is not terminated")
    parts = body[:-1].split(b"\0")
    if parts and parts[-1] == b"":
        parts.pop()
    if len(parts) % 2:
        raise ProtocolError("startup packet has a parameter without a value")
    try:
        params = tuple((parts[i].decode(), parts[i + 1].decode()) for i in range(0, len(parts), 2))
    except UnicodeDecodeError as exc:
        raise ProtocolError("startup parameters are not UTF-8") from exc
    if any(not key for key, _ in params):
        raise ProtocolError("startup packet has an empty parameter name")
    return StartupMessage(code, params)


# ---------------------------------------------------------------------------------------------------------
# Typed messages the proxy decodes


@dataclass(frozen=True)
class Query:
    sql: str


@dataclass(frozen=True)
class Parse:
    name: str
    sql: str
    param_types: tuple[int, ...]


@dataclass(frozen=True)
class Bind:
    portal: str
    statement: str


@dataclass(frozen=True)
class Close:
    kind: str  # "S" statement or "P" portal
    name: str


@dataclass(frozen=True)
class Execute:
    portal: str
    max_rows: int


def _cstring(body: bytes, pos: int) -> tuple[str, int]:
    end = body.find(b"\0", pos)
    if end < 0:
        raise ProtocolError("unterminated string in message")
    try:
        return body[pos:end].decode(), end + 1
    except UnicodeDecodeError as exc:
        raise ProtocolError("message text is not UTF-8") from exc


def decode_query(body: bytes) -> Query:
    sql, end = _cstring(body, 0)
    if end != len(body):
        raise ProtocolError("trailing bytes after Query")
    return Query(sql)


def decode_parse(body: bytes) -> Parse:
    name, pos = _cstring(body, 0)
    sql, pos = _cstring(body, pos)
    if pos + 2 > len(body):
        raise ProtocolError("truncated Parse")
    (count,) = struct.unpack_from("!H", body, pos)
    pos += 2
    if pos + 4 * count != len(body):
        raise ProtocolError("malformed Parse parameter types")
    types = struct.unpack_from(f"!{count}I", body, pos)
    return Parse(name, sql, tuple(types))


def decode_bind_names(body: bytes) -> Bind:
    """Only the portal and statement names: the parameters stay opaque bytes."""
    portal, pos = _cstring(body, 0)
    statement, _ = _cstring(body, pos)
    return Bind(portal, statement)


def rename_bind_statement(body: bytes, statement: str) -> bytes:
    """The Bind message of ``body`` with its statement name replaced (portal and parameters as they were)."""
    portal_end = body.find(b"\0")
    statement_end = body.find(b"\0", portal_end + 1) if portal_end >= 0 else -1
    if statement_end < 0:
        raise ProtocolError("unterminated string in message")
    return message(b"B", body[: portal_end + 1] + statement.encode() + body[statement_end:])


def decode_close(body: bytes) -> Close:
    if not body or body[0:1] not in (b"S", b"P"):
        raise ProtocolError("malformed Close/Describe")
    name, end = _cstring(body, 1)
    if end != len(body):
        raise ProtocolError("trailing bytes after Close/Describe")
    return Close(body[0:1].decode(), name)


def decode_execute(body: bytes) -> Execute:
    portal, pos = _cstring(body, 0)
    if pos + 4 != len(body):
        raise ProtocolError("malformed Execute")
    (rows,) = _INT32.unpack_from(body, pos)
    return Execute(portal, rows)


@dataclass(frozen=True)
class ErrorFields:
    """An ErrorResponse or NoticeResponse body."""

    fields: tuple[tuple[str, str], ...]

    def get(self, code: str) -> str | None:
        for key, value in self.fields:
            if key == code:
                return value
        return None

    @property
    def sqlstate(self) -> str:
        return self.get("C") or "XX000"

    @property
    def message(self) -> str:
        return self.get("M") or ""


def decode_error(body: bytes) -> ErrorFields:
    fields: list[tuple[str, str]] = []
    pos = 0
    while pos < len(body) and body[pos] != 0:
        code = chr(body[pos])
        value, pos = _cstring(body, pos + 1)
        fields.append((code, value))
    return ErrorFields(tuple(fields))


def decode_ready(body: bytes) -> str:
    if len(body) != 1 or body not in (b"I", b"T", b"E"):
        raise ProtocolError("malformed ReadyForQuery")
    return body.decode()


def decode_data_row(body: bytes) -> tuple[str | None, ...]:
    (count,) = struct.unpack_from("!H", body, 0)
    pos = 2
    values: list[str | None] = []
    for _ in range(count):
        (size,) = struct.unpack_from("!i", body, pos)
        pos += 4
        if size < 0:
            values.append(None)
        else:
            values.append(body[pos : pos + size].decode())
            pos += size
    return tuple(values)


def decode_command_tag(body: bytes) -> str:
    tag, _ = _cstring(body, 0)
    return tag


def decode_parameter_status(body: bytes) -> tuple[str, str]:
    """(name, value) of a ParameterStatus body."""
    name, pos = _cstring(body, 0)
    value, _ = _cstring(body, pos)
    return name, value


def decode_sasl_mechanisms(body: bytes) -> tuple[str, ...]:
    """The mechanism list of an AuthenticationSASL body (after the int32 code)."""
    names = body[4:].split(b"\0")
    return tuple(name.decode() for name in names if name)


# ---------------------------------------------------------------------------------------------------------
# Encoders


def message(kind: bytes, body: bytes = b"") -> bytes:
    return _HEADER.pack(kind, len(body) + 4) + body


def encode_query(sql: str) -> bytes:
    return message(b"Q", sql.encode() + b"\0")


def encode_parse(name: str, sql: str, param_types: tuple[int, ...] = ()) -> bytes:
    body = (
        name.encode()
        + b"\0"
        + sql.encode()
        + b"\0"
        + struct.pack(f"!H{len(param_types)}I", len(param_types), *param_types)
    )
    return message(b"P", body)


def encode_bind(portal: str, statement: str, params: tuple[str | None, ...]) -> bytes:
    """Bind with all parameters in text format and text results."""
    body = bytearray(portal.encode() + b"\0" + statement.encode() + b"\0")
    body += struct.pack("!HH", 0, len(params))
    for value in params:
        if value is None:
            body += struct.pack("!i", -1)
        else:
            data = value.encode()
            body += struct.pack("!i", len(data)) + data
    body += struct.pack("!H", 0)
    return message(b"B", bytes(body))


def encode_execute(portal: str = "", max_rows: int = 0) -> bytes:
    return message(b"E", portal.encode() + b"\0" + _INT32.pack(max_rows))


def encode_close(kind: str, name: str) -> bytes:
    return message(b"C", kind.encode() + name.encode() + b"\0")


SYNC = message(b"S")
FLUSH = message(b"H")
TERMINATE = message(b"X")


def encode_error(
    sqlstate: str, text: str, severity: str = "ERROR", extra: tuple[tuple[str, str], ...] = ()
) -> bytes:
    body = bytearray()
    for code, value in (("S", severity), ("V", severity), ("C", sqlstate), ("M", text), *extra):
        body += code.encode() + value.encode() + b"\0"
    body += b"\0"
    return message(b"E", bytes(body))


def encode_error_fields(fields: ErrorFields) -> bytes:
    body = bytearray()
    for code, value in fields.fields:
        body += code.encode() + value.encode() + b"\0"
    body += b"\0"
    return message(b"E", bytes(body))


def encode_ready(status: str) -> bytes:
    return message(b"Z", status.encode())


def encode_command_complete(tag: str) -> bytes:
    return message(b"C", tag.encode() + b"\0")


def encode_parameter_status(name: str, value: str) -> bytes:
    return message(b"S", name.encode() + b"\0" + value.encode() + b"\0")


def encode_sasl_mechanisms(mechanisms: tuple[str, ...]) -> bytes:
    body = _INT32.pack(10) + b"".join(m.encode() + b"\0" for m in mechanisms) + b"\0"
    return message(b"R", body)


# ---------------------------------------------------------------------------------------------------------
# Client side framing


@dataclass(frozen=True)
class Startup:
    """A whole untyped startup packet."""

    packet: StartupPacket
    raw: bytes


@dataclass(frozen=True)
class Frame:
    """A whole typed message: ``raw`` is header + body, ready to forward."""

    kind: bytes
    body: bytes
    raw: bytes


@dataclass(frozen=True)
class StreamStart:
    """A large message of a type the proxy does not inspect; its bytes follow as ``StreamChunk``s."""

    kind: bytes
    length: int  # body length
    header: bytes


@dataclass(frozen=True)
class StreamChunk:
    data: bytes
    last: bool


@dataclass(frozen=True)
class Oversized:
    """A message over the maximum size; the reader skips its body."""

    kind: bytes
    length: int


ClientEvent = Startup | Frame | StreamStart | StreamChunk | Oversized

# Types whose body the proxy reads; they are always delivered whole (still subject to the maximum).
INSPECTED = frozenset(b"QPBDECSHFXfcp")


class ClientReader:
    """Frames a client's byte stream. ``feed`` bytes, then iterate ``events()``."""

    def __init__(self, max_message: int = PG_MAX_MESSAGE, stream_threshold: int = 256 * 1024) -> None:
        self.max_message = max_message
        self.stream_threshold = stream_threshold
        self.expect_startup = True
        self._buf = bytearray()
        self._stream_left = 0  # body bytes of a streamed message still to come
        self._skip_left = 0  # body bytes of an oversized message still to skip

    def feed(self, data: bytes) -> None:
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf)

    @property
    def at_boundary(self) -> bool:
        """Nothing buffered and no message in the middle of streaming or skipping: the next byte is a type."""
        return not (self._buf or self._stream_left or self._skip_left)

    @staticmethod
    def _startup_packet(buf: bytearray, pos: int) -> bytes | None:
        """The startup packet at ``pos``, or None until it is all buffered."""
        if len(buf) - pos < 4:
            return None
        (length,) = _INT32.unpack_from(buf, pos)
        if length < 8 or length > MAX_STARTUP_PACKET:
            raise ProtocolError(f"invalid startup packet length {length}")
        if len(buf) - pos < length:
            return None
        return bytes(buf[pos : pos + length])

    def events(self) -> Iterator[ClientEvent]:
        buf = self._buf
        pos = 0
        try:
            while True:
                if self._skip_left:
                    take = min(self._skip_left, len(buf) - pos)
                    pos += take
                    self._skip_left -= take
                    if self._skip_left:
                        return
                    continue
                if self._stream_left:
                    take = min(self._stream_left, len(buf) - pos)
                    if take == 0:
                        return
                    self._stream_left -= take
                    yield StreamChunk(bytes(buf[pos : pos + take]), self._stream_left == 0)
                    pos += take
                    continue
                if self.expect_startup:
                    raw = self._startup_packet(buf, pos)
                    if raw is None:
                        return
                    pos += len(raw)
                    packet = parse_startup_packet(raw)
                    # After SSL/GSS negotiation another startup packet follows; otherwise typed messages.
                    self.expect_startup = isinstance(packet, SSLRequest | GSSENCRequest)
                    yield Startup(packet, raw)
                    continue
                if len(buf) - pos < 5:
                    return
                kind = bytes(buf[pos : pos + 1])
                (length,) = _INT32.unpack_from(buf, pos + 1)
                if length < 4:
                    raise ProtocolError(f"invalid message length {length} for type {kind!r}")
                body_len = length - 4
                if body_len > self.max_message:
                    pos += 5
                    self._skip_left = body_len
                    yield Oversized(kind, body_len)
                    continue
                if body_len > self.stream_threshold and kind[0] not in INSPECTED:
                    header = bytes(buf[pos : pos + 5])
                    pos += 5
                    self._stream_left = body_len
                    yield StreamStart(kind, body_len, header)
                    continue
                if len(buf) - pos < length + 1:
                    return
                raw = bytes(buf[pos : pos + length + 1])
                pos += length + 1
                yield Frame(kind, raw[5:], raw)
        finally:
            del buf[:pos]


# ---------------------------------------------------------------------------------------------------------
# Server side scanning

# What the caller wants done with a server message, decided from its type and length alone.
PASS = 0  # relay it without looking at the body
BODY = 1  # give me the body; I return the bytes to emit in its place


class ServerScanner:
    """Walks server messages by their headers and relays whole chunks.

    ``classify(kind, body_length)`` returns PASS or BODY. For BODY messages the scanner buffers the
    message and calls ``handle(kind, body)``, which returns the bytes to emit instead (the original
    ``raw`` to keep it, ``b""`` to drop it). Runs of PASS messages are emitted as slices of the input,
    so an ordinary chunk goes out as the very same bytes object.

    ``runs``: kinds whose decision holds for a whole run of messages of that kind (the caller's state
    does not change within it): after one such message is classified PASS, the rest of its run in the
    chunk is stepped over without ``classify`` or ``on_pass`` (a result's DataRows: ~3x less Python each).
    """

    def __init__(
        self,
        classify: Callable[[int, int], int],
        handle: Callable[[int, bytes, bytes], bytes],
        on_pass: Callable[[int], None] | None = None,
        runs: bytes = b"",
    ) -> None:
        self.classify = classify
        self.handle = handle
        self.on_pass = on_pass
        self.runs = frozenset(runs)
        self._partial = bytearray()  # an incomplete header, or an incomplete BODY message
        self._want = 0  # total bytes (header + body) of the BODY message in _partial; 0 = header only
        self._pass_left = 0  # bytes of a PASS message still to relay
        self.idle = True  # at a message boundary, with nothing buffered (kept by feed: read per reply)

    def feed(self, data: bytes) -> list[bytes]:
        self.idle = False  # until the end (a ProtocolError leaves it so)
        out: list[bytes] = []
        n = len(data)
        pos = 0
        start = 0  # start of the current run of relayed bytes
        while pos < n:
            if self._pass_left:
                take = min(self._pass_left, n - pos)
                pos += take
                self._pass_left -= take
                continue
            if self._partial:
                if start < pos:
                    out.append(data[start:pos])
                pos, complete = self._finish_partial(data, pos, out)
                start = pos
                if not complete:
                    break
                continue
            if n - pos < 5:
                return self._stash(data, start, pos, out, want=0)
            kind = data[pos]
            (length,) = _INT32.unpack_from(data, pos + 1)
            if length < 4:
                raise ProtocolError(f"server sent invalid length {length}")
            if self.classify(kind, length - 4) == PASS:
                pos = self._pass(data, pos + length + 1, kind)
                continue
            end = pos + length + 1
            if end > n:  # a BODY message split across chunks
                return self._stash(data, start, pos, out, want=length + 1)
            raw = data[pos:end]
            emitted = self.handle(kind, raw[5:], raw)
            if emitted is raw:  # kept as is: it stays part of the run
                pos = end
                continue
            if start < pos:
                out.append(data[start:pos])
            if emitted:
                out.append(emitted)
            pos = start = end
        if start < n and start < pos:
            out.append(data if start == 0 and pos == n else data[start:pos])
        self.idle = not self._partial and not self._pass_left
        return out

    def _pass(self, data: bytes, end: int, kind: int) -> int:
        """Step over a PASS message ending at ``end`` (and the rest of its run): where the walk goes on."""
        if self.on_pass is not None:
            self.on_pass(kind)
        if kind in self.runs:
            end = _run_end(data, end, kind)
        n = len(data)
        if end > n:
            self._pass_left = end - n
            return n
        return end

    def _stash(self, data: bytes, start: int, pos: int, out: list[bytes], *, want: int) -> list[bytes]:
        """End of the chunk inside a message: flush the run before it and buffer the rest (a header, or a
        BODY message of ``want`` bytes in all); not idle."""
        if start < pos:
            out.append(data[start:pos])
        self._partial += data[pos:]
        self._want = want
        return out

    def _finish_partial(self, data: bytes, pos: int, out: list[bytes]) -> tuple[int, bool]:
        """Go on with a header or a BODY message split across chunks: (position after what it took,
        whether the message is now complete). The rare path: most chunks end on a message boundary."""
        n = len(data)
        if not self._want:
            need = 5 - len(self._partial)
            self._partial += data[pos : pos + need]
            pos += min(need, n - pos)
            if len(self._partial) < 5:
                return pos, False
            header = bytes(self._partial)
            self._partial.clear()
            kind = header[0]
            (length,) = _INT32.unpack_from(header, 1)
            if length < 4:
                raise ProtocolError(f"server sent invalid length {length}")
            if self.classify(kind, length - 4) == PASS:
                if self.on_pass is not None:
                    self.on_pass(kind)
                out.append(header)
                self._pass_left = length - 4
                return pos, True
            self._partial += header
            self._want = length + 1
        need = self._want - len(self._partial)
        self._partial += data[pos : pos + need]
        pos += min(need, n - pos)
        if len(self._partial) < self._want:
            return pos, False
        raw = bytes(self._partial)
        self._partial.clear()
        self._want = 0
        emitted = self.handle(raw[0], raw[5:], raw)
        if emitted:
            out.append(emitted)
        return pos, True


def _run_end(data: bytes, end: int, kind: int) -> int:
    """The end of the run of ``kind`` messages from ``end`` on (whole headers in ``data`` only)."""
    n = len(data)
    while end + 5 <= n and data[end] == kind:
        (length,) = _INT32.unpack_from(data, end + 1)
        if length < 4:
            raise ProtocolError(f"server sent invalid length {length}")
        end += length + 1
    return end
