"""The asyncio side of the proxy: listeners, one client and one upstream connection per client.

Everything protocol-shaped lives in ``proxy.protocol`` (codec) and ``proxy.relay`` (per-connection logic);
this module moves bytes, applies backpressure both ways (a side whose peer cannot keep up stops being
read), negotiates TLS, forwards cancel requests and drains on shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import itertools
import json
import logging
import os
import socket
import ssl
import stat
import struct
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Protocol, cast

from proxy import protocol as p
from proxy.analysis import ProxyAnalyzer
from proxy.catalogs import SharedCatalogs
from proxy.config import ProxyConfig
from proxy.errors import PolicyError, ProtocolError, ProxyError, TagError
from proxy.fastrelay import UNAVAILABLE as FAST_RELAY_UNAVAILABLE
from proxy.fastrelay import FastCounts, FastRelay, Handback
from proxy.handoff import Adoption, Decision, Encoder, FastRead, Known
from proxy.metrics import ConnectionHooks, Metrics
from proxy.pool import (
    CHECK_REQUEST,
    Check,
    Greeting,
    IdlePool,
    PoolKey,
    PoolLimits,
    Reset,
    ResetResult,
    pool_key,
)
from proxy.prepared import Statement
from proxy.read_trace import PendingRead
from proxy.reads import GATHER, ReadRecord, ReadRecorder, new_record
from proxy.relay import FastAnswer, Relay
from proxy.shared import SharedRoutes
from proxy.sql import shapes
from proxy.tags import Tags, check_id, read_startup_tags

log = logging.getLogger("cowproxy")
_Q = ord("Q")
# Client messages the C relay takes (what it hands back for, Python relays, and C may take again after).
_FAST_TYPES = frozenset(b"QPBDECSH")
_SHORT_STINT = 4  # client messages: less than a statement's Parse/Bind/Execute/Sync
# How often the read records of recorded sessions on the C relay are taken (also when a connection's ring
# passes its mark, and at hand-back): as long as the writer gathers (proxy/reads.py), and the records taken
# by this timer are written at once (ReadRecorder.write_soon). Each wake-up of the Python thread costs
# far more than its records at TPC-B's rates: every 0.1 s it was 3.5 µs of Python per record taken, every
# 1 s 1.2-1.4 µs (docs/benchmarks.md, "Read traces: the cost of taking and writing records").
_TAKE_READS = GATHER
_ids = itertools.count(1)


def log_event(level: int, event: str, **fields: Any) -> None:
    if log.isEnabledFor(level):
        log.log(level, event, extra={"fields": fields})


class LogfmtFormatter(logging.Formatter):
    def __init__(self, as_json: bool = False) -> None:
        super().__init__()
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "event": record.getMessage(),
        }
        fields.update(getattr(record, "fields", {}))
        if self.as_json:
            return json.dumps(fields, default=str)
        parts = []
        for key, value in fields.items():
            text = "" if value is None else str(value)
            if not text or any(c in text for c in ' "=\n'):
                text = json.dumps(text)
            parts.append(f"{key}={text}")
        return " ".join(parts)


class State(enum.Enum):
    STARTUP = "startup"
    TLS = "tls"
    CONNECTING = "connecting"
    AUTH = "auth"
    READY = "ready"
    CLOSED = "closed"


class UpstreamOwner(Protocol):
    """Who an upstream connection reports to: its client's connection, or the pool between clients."""

    def on_server_data(self, data: bytes) -> None: ...

    def on_upstream_lost(self) -> None: ...

    def pause_client_reading(self, reason: str) -> None: ...

    def resume_client_reading(self, reason: str) -> None: ...


class UpstreamProtocol(asyncio.Protocol):
    def __init__(self, client: UpstreamOwner) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.tls_answer: asyncio.Future[bytes] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have the same interface.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.tls_answer is not None and not self.tls_answer.done():
            self.tls_answer.set_result(data)
            return
        self.client.on_server_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.tls_answer is not None and not self.tls_answer.done():
            self.tls_answer.set_exception(ConnectionError("upstream closed during TLS negotiation"))
        self.client.on_upstream_lost()

    def pause_writing(self) -> None:
        self.client.pause_client_reading("upstream")

    def resume_writing(self) -> None:
        self.client.resume_client_reading("upstream")


_READY = State.READY  # a global read is cheaper than State.READY on the hot path
_INT32 = struct.Struct("!I")


class ClientConnection(asyncio.Protocol):
    """One client, its upstream connection and the relay between them."""

    def __init__(self, server: ProxyServer) -> None:
        self.server = server
        self.config = server.config
        self.metrics = server.metrics
        self.max_message_size = server.config.max_message_size
        self.id = next(_ids)
        self.state = State.STARTUP
        self.transport: asyncio.Transport | None = None
        self.reader = p.ClientReader(max_message=self.config.max_message_size)
        self.upstream: UpstreamProtocol | None = None
        self.relay: Relay | None = None
        self.tags = Tags()
        self.database = ""
        self.user = ""
        self.peer = ""
        self.cancel_key: tuple[int, bytes] | None = None
        self._early: list[bytes] = []  # client bytes that arrived before the upstream was ready
        self._auth_buf = bytearray()
        # default_transaction_read_only as the server reported it at authentication (PostgreSQL >= 14
        # reports it): "off" lets a bind at start run without a read-write block of its own.
        self._read_only_default: str | None = None
        self._pause_reasons: set[str] = set()
        self._upstream_paused = False
        self.draining = False
        self.started = time.monotonic()
        self.tls = False
        self.upstream_tls = False
        # On the C relay right now; may go there (cleared for good after a message C never takes, or TLS).
        self.fast = False
        self.fast_ok = server.fast is not None
        self._fast_statements: list[Statement] = []  # the Statements given to the C relay (Prepared.known)
        self._adoption: Adoption | None = None  # what the C relay was given with the connection
        # On the C relay with its session's reads recorded: the tags in force and the decisions C was given
        # (a read record names one of those, or one of _fast_statements).
        self._fast_reads: tuple[Tags, list[Decision]] | None = None
        self._fast_texts: dict[int, str] = {}  # the texts those records name, decoded
        self._short_stints = 0  # hand-backs in a row after fewer than _SHORT_STINT messages (in a session)
        self._fast_wait = 0  # replies to handle in Python before trying the C relay again
        # Server connection reuse (proxy/pool.py; None: off, or this startup cannot be pooled).
        self._pool_key: PoolKey | None = None
        self._greeting: Greeting | None = None  # what the server said at authentication
        self._upstream_born = 0.0  # when the server connection was opened (monotonic)
        # A session was joined on the server connection (by this client or one before): its resets unbind.
        self._in_session = False

    # ---- client transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have the same interface.
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "[local]")
        self.server.connections[self.id] = self
        self.server.metrics.connections_total += 1

    def data_received(self, data: bytes) -> None:
        size = len(data)
        self.metrics.bytes_up += size
        relay = self.relay
        if (
            relay is not None
            and data[0] == _Q
            and size > 5
            and _INT32.unpack_from(data, 1)[0] + 1 == size
            and size <= self.max_message_size
            and self.state is _READY
            and self.reader.at_boundary
            and relay.fast_query(data)
        ):
            # One whole untagged Query: straight upstream (relay.to_server is empty between events).
            upstream = self.upstream
            if upstream is not None and upstream.transport is not None:
                upstream.transport.write(data)
            return
        self.reader.feed(data)
        self._process_client()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        # A client gone without Terminate while its server connection is idle leaves it to the pool too.
        self.close("client closed" if exc is None else f"client lost: {exc}", pool=exc is None)

    def pause_writing(self) -> None:
        # The client reads slower than the server sends: stop reading the server.
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.pause_reading()
            self._upstream_paused = True

    def resume_writing(self) -> None:
        if self._upstream_paused and self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.resume_reading()
        self._upstream_paused = False
        if self.fast_ok:
            self.try_fast()

    def pause_client_reading(self, reason: str) -> None:
        if not self._pause_reasons and self.transport is not None:
            self.transport.pause_reading()
        self._pause_reasons.add(reason)

    def resume_client_reading(self, reason: str) -> None:
        self._pause_reasons.discard(reason)
        if not self._pause_reasons and self.transport is not None:
            self.transport.resume_reading()

    # ---- client side dispatch (one function per side)

    def _process_client(self) -> None:
        try:
            for event in self.reader.events():
                self._client_event(event)
                if self.state in (State.TLS, State.CLOSED):
                    break
        except ProxyError as exc:
            self.fail(exc.sqlstate, str(exc))
            return
        self._flush()

    def _client_event(self, event: p.ClientEvent) -> None:
        state = self.state
        if state is State.READY:
            assert self.relay is not None
            self.relay.client_event(event)
        elif state is State.AUTH:
            self._to_upstream(_raw(event))
        elif state is State.STARTUP:
            if not isinstance(event, p.Startup):
                raise ProtocolError("expected a startup packet")
            self._startup(event.packet)
        elif state is State.CONNECTING:
            self._early.append(_raw(event))

    def _startup(self, packet: p.StartupPacket) -> None:
        assert self.transport is not None
        if isinstance(packet, p.SSLRequest):
            if self.server.client_tls is None or self.tls:
                self.transport.write(b"N")
            else:
                self.transport.write(b"S")
                self.state = State.TLS
                self.reader.expect_startup = True
                self.server.spawn(self._start_client_tls())
        elif isinstance(packet, p.GSSENCRequest):
            self.transport.write(b"N")
        elif isinstance(packet, p.CancelRequest):
            self.server.forward_cancel(packet)
            self.state = State.CLOSED
            self.transport.close()
        else:
            try:
                found = read_startup_tags(packet)
            except (TagError, PolicyError) as exc:
                self.fail(exc.sqlstate, str(exc))
                return
            self.tags = found.tags
            self.user = packet.get("user") or ""
            self.database = packet.get("database") or self.user
            if self.server.pool is not None:
                self._pool_key = pool_key(found.startup)
            self.state = State.CONNECTING
            self.server.spawn(self._connect(found.startup))

    async def _start_client_tls(self) -> None:
        assert self.transport is not None and self.server.client_tls is not None
        loop = asyncio.get_running_loop()
        try:
            transport = await loop.start_tls(self.transport, self, self.server.client_tls, server_side=True)
        except (OSError, ssl.SSLError, ConnectionError) as exc:
            self.close(f"client TLS handshake failed: {exc}")
            return
        if transport is None:
            self.close("client TLS handshake failed")
            return
        self.transport = transport
        self.tls = True
        self.state = State.STARTUP
        self._process_client()

    async def _connect(self, startup: p.StartupMessage) -> None:
        if await self._from_pool():
            return
        loop = asyncio.get_running_loop()
        up = self.config.upstream
        upstream = UpstreamProtocol(self)
        try:
            async with asyncio.timeout(self.config.connect_timeout):
                if up.unix_path is not None:
                    transport, _ = await loop.create_unix_connection(lambda: upstream, up.unix_path)
                else:
                    transport, _ = await loop.create_connection(lambda: upstream, up.host, up.port)
                if self.server.upstream_tls is not None:
                    self.upstream_tls = await upstream_tls_handshake(
                        self.config, self.server.upstream_tls, transport, upstream
                    )
        except ssl.SSLCertVerificationError as exc:
            # The connection is not made: the client learns why (libpq has no SQLSTATE for this; 08006
            # is connection_failure, as for any upstream that cannot be reached).
            reason = exc.verify_message or str(exc)
            mode = self.config.upstream_tls
            log_event(
                logging.WARNING,
                "upstream_tls_verify_failed",
                conn=self.id,
                upstream=str(up),
                mode=mode,
                error=reason,
            )
            with contextlib.suppress(Exception):
                if upstream.transport is not None:
                    upstream.transport.close()
            self.fail(
                "08006", f"cowproxy: upstream {up} failed TLS certificate verification ({mode}): {reason}"
            )
            return
        except (OSError, ConnectionError, TimeoutError, ssl.SSLError) as exc:
            log_event(logging.WARNING, "upstream_connect_failed", conn=self.id, upstream=str(up), error=exc)
            with contextlib.suppress(Exception):
                if upstream.transport is not None:
                    upstream.transport.close()
            self.fail("08006", f"cowproxy: cannot connect to upstream {up}: {exc}")
            return
        if self.state is State.CLOSED:
            if upstream.transport is not None:
                upstream.transport.close()
            return
        self.upstream = upstream
        self.state = State.AUTH
        self.metrics.servers_opened += 1
        self._upstream_born = time.monotonic()
        if self._pool_key is not None:
            self._greeting = Greeting()
        self._to_upstream(startup.encode())
        for raw in self._early:
            self._to_upstream(raw)
        self._early.clear()
        self._log_connect()

    def _log_connect(self, **more: Any) -> None:
        log_event(
            logging.INFO,
            "connect",
            conn=self.id,
            peer=self.peer,
            database=self.database,
            user=self.user,
            session=self.tags.session,
            **more,
        )

    async def _from_pool(self) -> bool:
        """Take an idle server connection of this startup if there is one (True: taken, or the client left
        meanwhile: nothing more to connect)."""
        if self._pool_key is None or self._early or self.state is not State.CONNECTING:
            return False
        pooled = await self.server.take_pooled(self._pool_key)
        if pooled is not None:
            if self.state is State.CONNECTING and not self._early:
                self._reuse(pooled)
                return True
            # (the client left, or sent bytes early, while the connection was checked: it goes back)
            self.server.pool_idle(pooled)
        return self.state is not State.CONNECTING

    def _reuse(self, pooled: PooledServer) -> None:
        """Take a reset idle server connection: the client gets what a new backend of the same startup
        would have sent (AuthenticationOk, the backend's ParameterStatus values, its BackendKeyData,
        ReadyForQuery), then the connection goes on as a new one (the relay joins its session)."""
        assert self.transport is not None
        upstream, greeting = pooled.upstream, pooled.greeting
        upstream.client = self
        self.upstream = upstream
        self.upstream_tls = pooled.tls
        self._greeting = greeting
        self._upstream_born = pooled.born
        self._in_session = pooled.in_session
        self.metrics.servers_reused += 1
        key = greeting.key_data
        assert key is not None
        self.cancel_key = (int.from_bytes(key[5:9], "big"), bytes(key[9:]))
        self.server.cancel_keys[self.cancel_key] = self
        self._read_only_default = greeting.params.get("default_transaction_read_only")
        self.transport.write(greeting.encode())
        self.state = State.AUTH  # (as after a new connection's authentication, until _ready)
        self._log_connect(reused=self.cancel_key[0])
        self._ready(b"")

    # ---- server side dispatch

    def on_server_data(self, data: bytes) -> None:
        self.metrics.bytes_down += len(data)
        relay = self.relay
        if relay is not None and self.state is _READY and relay.fast_reply(data):
            # The whole chunk goes to the client unchanged; nothing else to send or decide (the relay's
            # to_server/to_client are empty between events and fast_reply leaves them so).
            if self.transport is not None:
                self.transport.write(data)
            if self._pause_reasons or self.draining or self.fast_ok:
                self._after_server()
            return
        try:
            if self.state is State.READY:
                assert self.relay is not None
                self.relay.server_data(data)
                self._flush()
                self._after_server()
            elif self.state is State.AUTH:
                self._auth_data(data)
        except ProxyError as exc:
            self.fail(exc.sqlstate, str(exc))

    def _auth_data(self, data: bytes) -> None:
        """Authentication: relay as is, except the SASL offer (no -PLUS: TLS ends here) and key data."""
        buf = self._auth_buf
        buf += data
        out: list[bytes] = []
        pos = 0
        ready = False
        while len(buf) - pos >= 5:
            kind = buf[pos : pos + 1]
            length = int.from_bytes(buf[pos + 1 : pos + 5], "big")
            if length < 4 or length > 1024 * 1024:
                raise ProtocolError("server sent a malformed message during authentication")
            if len(buf) - pos < length + 1:
                break
            raw = bytes(buf[pos : pos + length + 1])
            body = raw[5:]
            pos += length + 1
            if self._greeting is not None:
                self._greeting.message(bytes(kind), raw)
            if kind == b"R" and body[:4] == b"\x00\x00\x00\x0a":
                mechanisms = tuple(m for m in p.decode_sasl_mechanisms(body) if not m.endswith("-PLUS"))
                raw = p.encode_sasl_mechanisms(mechanisms)
            elif kind == b"K" and len(body) >= 8:
                self.cancel_key = (int.from_bytes(body[:4], "big"), bytes(body[4:]))
                self.server.cancel_keys[self.cancel_key] = self
            elif kind == b"S":
                name, value = p.decode_parameter_status(body)
                if name == "default_transaction_read_only":
                    self._read_only_default = value
            elif kind == b"E":
                fields = p.decode_error(body)
                log_event(logging.INFO, "auth_failed", conn=self.id, sqlstate=fields.sqlstate)
            elif kind == b"Z":
                ready = True
                out.append(raw)
                break
            out.append(raw)
        rest = bytes(buf[pos:])
        buf.clear()
        if self.transport is not None:
            self.transport.write(b"".join(out))
        if ready:
            self._ready(rest)
        else:
            buf += rest

    def _ready(self, rest: bytes) -> None:
        database = self.database
        server = self.server
        self.relay = Relay(
            server.analysis,
            self.tags,
            lambda: server.routes.get(database),
            LoggingHooks(server.metrics, self.id, self._joined),
            self.config.max_message_size,
            catalogs=server.catalogs.store(database, self.user),
            bind_secret=self.config.bind_secret,
            reads=None if server.reads is None else server.reads.for_connection(database, self._catalog),
        )
        if self._greeting is not None:
            self.relay.replies.parameters = self._greeting.params  # (kept for the next client: reuse)
        self.state = State.READY
        if rest:
            self.relay.server_data(rest)
        # A session's join goes out now, while the client reads the ReadyForQuery.
        self.relay.start(read_write=self._read_only_default == "off")
        self._process_client()
        if self.fast_ok:
            self.try_fast()

    def _joined(self) -> None:
        self._in_session = True

    def _catalog(self) -> Any:
        return self.relay.catalog if self.relay is not None else None

    def _after_server(self) -> None:
        relay = self.relay
        assert relay is not None
        if not relay.holding and "hold" in self._pause_reasons:
            self.resume_client_reading("hold")
            if self.reader.buffered:
                self._process_client()
        if self.draining and self.idle:
            self.close("drained", goodbye=True)
        elif self.fast_ok and not relay.replies.pending:
            self.try_fast()

    # ---- the fast relay (proxy._fastrelay): untagged connections relayed by a C thread

    def try_fast(self) -> None:
        """Hand both sockets to the C relay if Python's relay state is one it can carry on from."""
        fast = self.server.fast
        relay = self.relay
        if fast is None or self.tls or self.upstream_tls:
            self.fast_ok = False  # for good: client TLS ends here, upstream TLS is Python's
            return
        if self._fast_wait:  # (a session's statements that C kept handing back: see from_fast)
            self._fast_wait -= 1
            return
        if (
            self.fast
            or self.state is not _READY
            or self.draining
            or relay is None
            or not relay.at_rest()
            or not self.reader.at_boundary
            or self._pause_reasons
            or self._upstream_paused
        ):
            return
        upstream = self.upstream.transport if self.upstream is not None else None
        client = self.transport
        if (
            upstream is None
            or client is None
            or upstream.get_write_buffer_size()
            or client.get_write_buffer_size()
            or upstream.is_closing()
            or client.is_closing()
        ):
            return
        client_sock, upstream_sock = client.get_extra_info("socket"), upstream.get_extra_info("socket")
        if client_sock is None or upstream_sock is None:
            self.fast_ok = False
            return
        # In a session (startup tags or the database's route) C takes only the texts Python has decided on.
        adoption, self._fast_statements = relay.hand_off(fast.kind_index, fast.slots)
        encode = self._read_encoder(adoption) if adoption.record else None
        client.pause_reading()
        upstream.pause_reading()
        try:
            sockets = (client_sock.fileno(), upstream_sock.fileno())
            fast.adopt(self.id, *sockets, self.max_message_size, adoption, encode=encode)
        except (OSError, ValueError) as exc:
            log_event(logging.WARNING, "fast_relay_adopt_failed", conn=self.id, error=exc)
            self.fast_ok = False
            client.resume_reading()
            upstream.resume_reading()
            return
        self.fast = True
        self.metrics.fast_adoptions += 1
        self._adoption = adoption
        self._fast_reads = (relay.tagging.txn, adoption.decisions) if adoption.record else None
        self._fast_texts = {}

    def _read_encoder(self, adoption: Adoption) -> Encoder | None:
        """What C needs to write this connection's read records as runs itself (FastRelay.adopt's
        ``encode``): the text of each read it may record, by its ref."""
        recorder, relay = self.server.reads, self.relay
        if recorder is None or relay is None or relay.tagging.txn.session is None:
            return None
        texts: dict[int, tuple[int, str, bool]] = {}
        known: list[Known] = [*adoption.statements, *adoption.portals]
        for _, i, _, _, _, records, _ in known:
            sql = self._fast_statements[i].sql if records and i >= 0 else None
            if sql is not None:
                texts[i] = (i, sql, False)
        decisions: list[Decision] = adoption.decisions
        for i, (key, _, _, records, *_) in enumerate(decisions):
            if records:
                by_shape = key[:1].islower()  # (each record brings its text; the example names the shape's)
                text = key[1:].split(b"\0", 1)[0]  # (U: parameter types after)
                sql = shapes.example(key[1:]) if by_shape else text.decode()
                texts[-(i + 1)] = (-(i + 1), sql, by_shape)
        session, operation = relay.tagging.txn.session, relay.tagging.txn.operation
        return recorder.encoder(session, operation, relay.trace.txn.read_ids, texts.values(), self._catalog())

    def _read_text(self, ref: int) -> str | None:
        """The text of the read a C record names: Python's statement ``ref`` (>= 0) or decision ``-ref - 1``
        (decoded once per stay)."""
        assert self._fast_reads is not None
        sql = self._fast_texts.get(ref)
        if sql is None:
            sql = (
                self._fast_statements[ref].sql
                if ref >= 0
                else self._fast_reads[1][-ref - 1][0][1:].split(b"\0", 1)[0].decode()  # (U: types after)
            )
            if sql is not None:
                self._fast_texts[ref] = sql
        return sql

    def _read_of(self, ref: int, params: bytes | None, own: bytes | None) -> PendingRead | None:
        assert self._fast_reads is not None
        session, operation = self._fast_reads[0].session, self._fast_reads[0].operation
        sql = self._read_text(ref) if own is None else own.decode(errors="replace")
        return None if sql is None or session is None else PendingRead(sql, session, operation, params)

    def fast_reads(self, records: list[FastRead], open_txn: int | None = None) -> None:
        """Read records the C relay made for this connection: into the recorder, as the relay's ``reads``
        callback would have put them. With no operation id in force, a record takes its transaction's
        (Relay.trace.txn): the id C learned before it ended, else its read-only id; those of ``open_txn`` (at
        hand-back: still open) wait in the relay for its end."""
        recorder, relay, stay = self.server.reads, self.relay, self._fast_reads
        if recorder is None or relay is None or stay is None or stay[0].session is None:
            return
        session, operation = stay[0].session, stay[0].operation
        database, catalog, text, new = self.database, self._catalog(), self._read_text, new_record
        txn = relay.trace.txn
        batch = []
        for ref, rows, ended, duration_us, params, number, xid, own in records:
            sql = text(ref) if own is None else own.decode(errors="replace")  # (own: taken by its shape)
            if sql is None:
                continue
            op = operation
            if op is None:
                if number == open_txn:
                    txn.held.append((PendingRead(sql, session, None, params), rows, duration_us / 1e6, ended))
                    continue
                op = f"xact:{xid}" if xid else f"{txn.read_ids}.{number}"
            batch.append(
                new(ReadRecord, (database, session, op, sql, params, rows, ended, duration_us, catalog))
            )
        recorder.offer_many(batch)

    def fast_rows(self, rows: bytes, count: int) -> None:
        """Read records the C relay wrote as a run itself (adopted with ``_read_encoder``'s)."""
        recorder, stay = self.server.reads, self._fast_reads
        if recorder is not None and stay is not None and stay[0].session is not None:
            recorder.offer_rows(self.database, stay[0].session, rows, count)

    def fast_decision(self, text: bytes) -> FastAnswer:
        """The C relay asks for the decision of a Query text of this connection's session, which it holds
        (``Relay.decide_for_fast``); no row: it is to hand the connection back at that Query."""
        relay, fast, adoption = self.relay, self.server.fast, self._adoption
        if relay is None or fast is None or not self.fast or adoption is None or not adoption.ask:
            return FastAnswer(None, "not asking")
        try:
            sql = text.decode()
        except UnicodeDecodeError:
            return FastAnswer(None, "not UTF-8")
        return relay.decide_for_fast(sql, fast.kind_index, fast.slots)

    def from_fast(self, handback: Handback) -> None:
        """The C relay gave the connection back: resume in Python from the state it reports."""
        self.fast = False
        state = handback.state
        self._reported(handback.parameters)
        # (the rows C wrote first: the rest are the open transaction's, or reads C had no head for)
        self.fast_rows(handback.rows, handback.rows_count)
        self.fast_reads(handback.reads, state.txn.count)
        owed_reads = []
        for position, ref, started, params, own in state.owed_reads:
            read = self._read_of(ref, params, own)
            if read is not None:
                owed_reads.append((position, read, started))
        self._fast_reads = None
        untaken = handback.untaken
        self.metrics.count_handback(handback.reason, untaken)
        adoption, self._adoption = self._adoption, None
        if adoption is not None and adoption.tagged and untaken != -1:
            # A session whose statements C must keep handing back (texts Python has not seen: pgbench -M
            # simple's literals, a rewritten read) would bounce between the relays statement by statement:
            # after three short stays on C in a row, stay in Python for 8, 16, ... 1024 replies.
            self._short_stints = self._short_stints + 1 if handback.taken < _SHORT_STINT else 0
            if self._short_stints >= 3:
                self._fast_wait = min(2**self._short_stints, 1024)
        objects, self._fast_statements = self._fast_statements, []
        relay = self.relay
        if relay is None or self.state is not _READY:
            return
        reason = handback.reason
        if reason in ("client closed", "upstream closed"):
            self.close(reason)
            return
        if reason in ("client error", "upstream error"):
            side = reason.split()[0]
            self.close(f"{side} lost: {os.strerror(handback.errno) if handback.errno else 'error'}")
            return
        relay.take_back(
            state,
            handback.statements,
            handback.portals,
            objects,
            resolved=adoption is not None and adoption.resolve,
            owed_reads=owed_reads,
            promotions=handback.promotions
            if adoption is not None and adoption.promotions is not None
            else None,
        )
        if handback.batch is not None and not self._resume_rerun(relay, handback.batch, handback.server):
            return
        if untaken != -1 and untaken not in _FAST_TYPES:
            self.fast_ok = False  # FunctionCall (or the like): stay in Python, do not bounce
        if self.transport is not None:
            self.transport.resume_reading()
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.resume_reading()
        if handback.data:
            self.data_received(handback.data)
        if self.draining and self.idle and self.state is not State.CLOSED:
            self.close("drained", goodbye=True)

    def _reported(self, parameters: bytes | None) -> None:
        """The ParameterStatus messages the C relay moved: the values a reused server connection's next
        client is given (the Python relay's go to the greeting through ``ReplyQueue.parameters``)."""
        if self._greeting is not None:
            self._greeting.reported(parameters)

    def _resume_rerun(self, relay: Relay, batch: bytes, server: bytes) -> bool:
        """A statement that may run again, handed back before a reply that may be its failure: Python goes
        on from there (the C relay counted those server bytes; they are not counted again). False: the
        connection failed."""
        relay.resume_rerun(batch)
        try:
            relay.server_data(server)
        except ProxyError as exc:
            self.fail(exc.sqlstate, str(exc))
            return False
        self._flush()
        return True

    def _fast_state(self, states: dict[int, tuple[str, int]] | None = None) -> tuple[str, int]:
        """(transaction status, queries in flight) of a connection on the C relay."""
        if states is None:
            fast = self.server.fast
            states = fast.states() if fast is not None else {}
        return states.get(self.id, ("I", 0))

    def _flush(self) -> None:
        relay = self.relay
        if relay is not None:
            keep = relay.closing and relay.to_server[-1:] == [p.TERMINATE] and self._poolable()
            if keep:
                relay.to_server.pop()  # (the server connection stays, for the next client)
            if relay.to_server:
                self._to_upstream(
                    b"".join(relay.to_server) if len(relay.to_server) > 1 else relay.to_server[0]
                )
                relay.to_server.clear()
            if relay.to_client:
                if self.transport is not None:
                    # One write: uvloop's writelines defers the send to the next loop iteration.
                    out = relay.to_client
                    self.transport.write(out[0] if len(out) == 1 else b"".join(out))
                relay.to_client.clear()
            if relay.holding:
                self.pause_client_reading("hold")
            if relay.closing:
                self.close("client terminated", pool=keep)

    def _to_upstream(self, data: bytes) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.write(data)

    def on_upstream_lost(self) -> None:
        if self.state is not State.CLOSED:
            self.close("upstream closed")

    def _poolable(self) -> bool:
        """May the server connection serve another client once reset: reuse is on, its authentication had
        no challenge, the client ended cleanly with the server idle (status I, no reply owed, no batch, no
        COPY, nothing held, in Python's hands: the C relay gave it back), and the socket is sound."""
        relay, upstream = self.relay, self.upstream
        greeting = self._greeting
        return (
            self.server.pool is not None
            and greeting is not None
            and greeting.poolable
            and self.state is State.READY
            and not self.fast
            and not self.draining
            and relay is not None
            and relay.replies.at_rest()
            and relay.replies.status_current()
            and relay.held.at_rest()
            and relay.reruns.plan is None
            and self.reader.at_boundary
            and upstream is not None
            and upstream.transport is not None
            and not upstream.transport.is_closing()
        )

    # ---- state for the admin API and metrics

    @property
    def idle(self) -> bool:
        if self.fast:
            return self._fast_state() == ("I", 0)
        relay = self.relay
        if relay is None:
            return self.state in (State.STARTUP, State.CONNECTING, State.AUTH)
        return relay.replies.at_transaction_start() and not relay.holding

    def client_state(self, fast_states: dict[int, tuple[str, int]] | None = None) -> str:
        if self.draining:
            return "draining"
        if self.relay is None:
            return "startup"
        if self.fast:
            status, inflight = self._fast_state(fast_states)
            if inflight:
                return "active"
            return "idle" if status == "I" else "idle_in_transaction"
        if self.relay.replies.pending or self.relay.holding:
            return "active"
        return "idle" if self.relay.replies.status == "I" else "idle_in_transaction"

    def describe(self, fast_states: dict[int, tuple[str, int]] | None = None) -> dict[str, Any]:
        relay = self.relay
        applied = relay.tagging.applied.tags if relay is not None else None
        status = relay.replies.status if relay is not None else None
        if self.fast:
            status = self._fast_state(fast_states)[0]
        return {
            "id": self.id,
            "peer": self.peer,
            "database": self.database,
            "user": self.user,
            "state": self.client_state(fast_states),
            "relay": "fast" if self.fast else "python",
            "startup_session": self.tags.session,
            "startup_operation": self.tags.operation,
            "session": applied.session if applied is not None else None,
            "operation": applied.operation if applied is not None else None,
            "transaction_status": status,
            "tls": self.tls,
            "age_seconds": round(time.monotonic() - self.started, 3),
        }

    # ---- shutdown

    def fail(self, sqlstate: str, text: str) -> None:
        """Tell the client (FATAL) and close both sides."""
        log_event(logging.INFO, "connection_error", conn=self.id, sqlstate=sqlstate, error=text)
        self.server.metrics.count_error(sqlstate)
        if self.transport is not None and self.state is not State.CLOSED:
            self.transport.write(p.encode_error(sqlstate, text, severity="FATAL"))
        self.close(text)

    def close(self, reason: str, goodbye: bool = False, pool: bool = False) -> None:
        """Close both sides (``pool``: unless the server connection may serve another client: then it is
        reset for the pool instead)."""
        if self.state is State.CLOSED and self.transport is None and self.upstream is None:
            return
        keep = pool and self._poolable()
        was_closed = self.state is State.CLOSED
        self.state = State.CLOSED
        if self.fast:
            # Out of the C relay before the transports close the sockets it polls (its reads taken first).
            self.server.take_fast_reads()
            self.fast = False
            if self.server.fast is not None:
                self.server.fast.release(self.id)
        if goodbye and self.transport is not None:
            self.transport.write(
                p.encode_error("57P01", "terminating connection: cowproxy is shutting down", severity="FATAL")
            )
        if keep:
            assert self.upstream is not None and self._pool_key is not None and self._greeting is not None
            if self._upstream_paused and self.upstream.transport is not None:
                self.upstream.transport.resume_reading()  # (paused for this client's sake)
            self.server.reset_for_pool(
                PooledServer(
                    self.server,
                    self.upstream,
                    key=self._pool_key,
                    greeting=self._greeting,
                    born=self._upstream_born,
                    tls=self.upstream_tls,
                    in_session=self._in_session,
                )
            )
        elif self.upstream is not None and self.upstream.transport is not None:
            if goodbye:
                self.upstream.transport.write(p.TERMINATE)
            self.upstream.transport.close()
        self.upstream = None
        if self.transport is not None:
            self.transport.close()
        if self.cancel_key is not None:
            self.server.cancel_keys.pop(self.cancel_key, None)
            self.cancel_key = None
        if self.server.connections.pop(self.id, None) is not None and not was_closed:
            log_event(logging.INFO, "disconnect", conn=self.id, reason=reason, session=self.tags.session)
        self.server.connection_closed()


class LoggingHooks(ConnectionHooks):
    """Metrics, plus a log line when a connection switches sessions (debug) or cannot (warning)."""

    def __init__(self, metrics: Metrics, conn: int, joined: Callable[[], None] | None = None) -> None:
        super().__init__(metrics)
        self.conn = conn
        self.joined = joined  # told when a session was joined (the server connection's reset unbinds)

    def tags_applied(self, tags: Tags) -> None:
        super().tags_applied(tags)
        if tags.session is not None and self.joined is not None:
            self.joined()
        log_event(
            logging.DEBUG, "session_switch", conn=self.conn, session=tags.session, operation=tags.operation
        )

    def tags_failed(self, tags: Tags, error: p.ErrorFields) -> None:
        log_event(
            logging.WARNING,
            "session_switch_failed",
            conn=self.conn,
            session=tags.session,
            sqlstate=error.sqlstate,
            error=error.message,
        )


# How long a used server connection's reset may take before it is closed instead (it is one round trip).
_RESET_TIMEOUT = 10.0


class PooledServer:
    """A server connection between two clients: being reset, then idle in the pool (``UpstreamOwner``).

    Anything the server sends while it is idle (a FATAL at shutdown, idle_session_timeout) or a lost socket
    takes it out of the pool and closes it: only a connection the reset answered cleanly is handed out."""

    def __init__(
        self,
        server: ProxyServer,
        upstream: UpstreamProtocol,
        *,
        key: PoolKey,
        greeting: Greeting,
        born: float,
        tls: bool,
        in_session: bool,
    ) -> None:
        self.server = server
        self.upstream = upstream
        self.key = key
        self.greeting = greeting
        self.born = born
        self.tls = tls
        self.in_session = in_session  # ever: a bind leaves a temporary schema for the backend's life
        self.reset: Reset | None = None
        self._check: Check | None = None  # the health check under way, and who waits for its outcome
        self._checked: asyncio.Future[bool] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.closed = False

    @property
    def pid(self) -> int:
        key = self.greeting.key_data
        return int.from_bytes(key[5:9], "big") if key is not None else 0

    def start_reset(self, reset: Reset) -> None:
        self.reset = reset
        self.upstream.client = self
        transport = self.upstream.transport
        if transport is None:
            self.fail("upstream closed before its reset")
            return
        transport.write(reset.request)
        self._timer = asyncio.get_running_loop().call_later(_RESET_TIMEOUT, self.fail, "reset timed out")

    def check(self, timeout: float) -> asyncio.Future[bool]:
        """Send the health check; the future says whether the connection answered it (else it is closed)."""
        loop = asyncio.get_running_loop()
        self._checked = checked = loop.create_future()
        transport = self.upstream.transport
        if transport is None or self.closed:
            self._check_done(ResetResult(False, "upstream closed before its check"))
            return checked
        self._check = Check()
        transport.write(CHECK_REQUEST)
        self._timer = loop.call_later(timeout, self._check_done, ResetResult(False, "check timed out"))
        return checked

    def _check_done(self, result: ResetResult) -> None:
        self._check = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not result.ok:
            log_event(logging.INFO, "server_check_failed", pid=self.pid, error=result.reason)
            self.close("check failed")
        if self._checked is not None and not self._checked.done():
            self._checked.set_result(result.ok)

    def on_server_data(self, data: bytes) -> None:
        if self._check is not None:
            try:
                checked = self._check.feed(data)
            except ProxyError as exc:
                checked = ResetResult(False, str(exc))
            if checked is not None:
                self._check_done(checked)
            return
        reset = self.reset
        if reset is None:
            self.close("server sent data while idle")
            return
        try:
            result = reset.feed(data)
        except ProxyError as exc:
            result = ResetResult(False, str(exc))
        if result is None:
            if reset.follow_up and self.upstream.transport is not None:
                self.upstream.transport.write(reset.follow_up)
                reset.follow_up = b""
            return
        self.reset = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if result.ok:
            self.server.pool_idle(self)
        else:
            self.fail(result.reason)

    def fail(self, reason: str) -> None:
        """The reset did not end well: the connection is closed, not reused."""
        if self.closed:
            return
        self.server.metrics.server_reset_failures += 1
        log_event(logging.INFO, "server_reset_failed", pid=self.pid, error=reason)
        self.close(reason, counted=False)

    def on_upstream_lost(self) -> None:
        self.close("upstream closed")

    def pause_client_reading(self, reason: str) -> None:
        pass  # (nothing to stop reading: the reset is a few bytes)

    def resume_client_reading(self, reason: str) -> None:
        pass

    def alive(self) -> bool:
        """A cheap health check before reuse: the socket is open and has nothing to read (no EOF, no
        message the loop has not delivered yet): a peek on a duplicate of its descriptor."""
        transport = self.upstream.transport
        if self.closed or self.reset is not None or transport is None or transport.is_closing():
            return False
        sock = transport.get_extra_info("socket")
        if sock is None:
            return False
        try:
            probe = socket.socket(fileno=os.dup(sock.fileno()))
        except OSError:
            return False
        with probe:
            try:
                probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                return True  # open, nothing to read
            except OSError:
                return False
        return False  # EOF, or bytes an idle server should not have sent

    def close(self, reason: str, counted: bool = True) -> None:
        if self.closed:
            return
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._checked is not None and not self._checked.done():
            self._checked.set_result(False)  # (closed while checked: lost, shut down)
        self.server.forget_pooled(self)
        if counted:
            closed = self.server.metrics.servers_closed_idle
            closed[reason] = closed.get(reason, 0) + 1
        log_event(logging.DEBUG, "server_closed", pid=self.pid, reason=reason)
        transport = self.upstream.transport
        if transport is not None:
            if reason in _GOODBYE:
                transport.write(p.TERMINATE)
            transport.close()


# Reasons a sound idle connection is closed by the proxy (it says Terminate first, as a client would).
_GOODBYE = frozenset({"idle timeout", "lifetime", "pool full", "shutdown", "unhealthy"})


def _raw(event: p.ClientEvent) -> bytes:
    if isinstance(event, p.Frame | p.Startup):
        return event.raw
    if isinstance(event, p.StreamStart):
        return event.header
    if isinstance(event, p.StreamChunk):
        return event.data
    raise ProtocolError("message too large during authentication")


def _remove_stale_socket(path: str) -> None:
    """Remove a socket file left by a proxy that is gone; refuse to take over one that answers."""
    if not os.path.exists(path):
        return
    if not stat.S_ISSOCK(os.stat(path).st_mode):
        raise OSError(errno.EEXIST, f"{path} exists and is not a socket")
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # nobody listens: a leftover
            return
    raise OSError(errno.EADDRINUSE, f"another process listens on {path}")


def _ssl_request() -> bytes:
    return (8).to_bytes(4, "big") + p.SSL_REQUEST_CODE.to_bytes(4, "big")


def upstream_tls_context(config: ProxyConfig) -> ssl.SSLContext | None:
    """The client-side TLS context for the upstream, built once at startup (bad files fail there)."""
    mode = config.upstream_tls
    if mode == "disable":
        return None
    try:
        if mode in ("verify-ca", "verify-full"):
            # Without a CA file: the system's trust store (libpq would read ~/.postgresql/root.crt).
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=config.upstream_tls_ca)
            context.check_hostname = mode == "verify-full"
            context.verify_mode = ssl.CERT_REQUIRED
        else:  # prefer, require: encryption only, as libpq without a root certificate
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if config.upstream_tls_cert and config.upstream_tls_key:
            context.load_cert_chain(config.upstream_tls_cert, config.upstream_tls_key)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ProxyError(f"cannot load upstream TLS CA/certificate/key: {exc}") from None
    return context


async def upstream_tls_handshake(
    config: ProxyConfig,
    context: ssl.SSLContext,
    transport: asyncio.BaseTransport,
    protocol: UpstreamProtocol | _CancelProtocol,
) -> bool:
    """SSLRequest, then TLS as ``upstream_tls`` says (libpq's sslmode): True when TLS is on, False when
    ``prefer`` goes on in the clear; raises when TLS cannot be had. Go on with ``protocol.transport``."""
    loop = asyncio.get_running_loop()
    answer_future: asyncio.Future[bytes] = loop.create_future()
    protocol.tls_answer = answer_future
    cast(asyncio.Transport, transport).write(_ssl_request())
    try:
        answer = await answer_future
    finally:
        protocol.tls_answer = None
    if answer == b"S":
        new = await loop.start_tls(
            cast(asyncio.Transport, transport), protocol, context, server_hostname=config.upstream.host
        )
        if new is None:
            raise ConnectionError("upstream TLS handshake failed")
        protocol.transport = new
        return True
    if answer[:1] == b"S":
        # Bytes after 'S' came before the handshake, unencrypted (libpq's CVE-2021-23222): refuse.
        raise ConnectionError("upstream sent unencrypted data after its TLS answer")
    if config.upstream_tls != "prefer":
        raise ConnectionError("upstream refused TLS")
    return False


class _CancelProtocol(asyncio.Protocol):
    """A connection that carries one CancelRequest; PostgreSQL answers nothing and closes it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.tls_answer: asyncio.Future[bytes] | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.tls_answer is not None and not self.tls_answer.done():
            self.tls_answer.set_result(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.tls_answer is not None and not self.tls_answer.done():
            self.tls_answer.set_exception(ConnectionError("upstream closed during TLS negotiation"))
        if not self.closed.done():
            self.closed.set_result(None)


class ProxyServer:
    """Listeners and the registry of live connections, routes and cancel keys."""

    def __init__(self, config: ProxyConfig, metrics: Metrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        self.analysis = ProxyAnalyzer(
            cache_size=config.parse_cache_size,
            policy=config.session_allow,
            shape_key=FastRelay.shape_key if FAST_RELAY_UNAVAILABLE is None else None,
        )
        self.catalogs = SharedCatalogs()  # one CoW catalog per database (and user), for every connection
        self.connections: dict[int, ClientConnection] = {}
        self.routes: dict[str, Tags] = {}
        self.cancel_keys: dict[tuple[int, bytes], ClientConnection] = {}
        self.client_tls: ssl.SSLContext | None = None
        if config.tls_cert and config.tls_key:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            try:
                context.load_cert_chain(config.tls_cert, config.tls_key)
            except (OSError, ssl.SSLError) as exc:
                raise ProxyError(f"cannot load TLS certificate/key: {exc}") from None
            self.client_tls = context
        self.upstream_tls = upstream_tls_context(config)
        self._server: asyncio.Server | None = None
        self._idle_event: asyncio.Event | None = None
        self._tasks: set[asyncio.Future[None]] = set()
        self.fast: FastRelay | None = None  # started with the listener
        self._reads_timer: asyncio.TimerHandle | None = None  # takes C's read records (take_fast_reads)
        self.shared_routes: SharedRoutes | None = None  # routes kept in the database (config.state_dsn)
        # Read traces (config.reads_dsn): the recorder the relays of tagged connections report reads to.
        self.reads = ReadRecorder(config.reads_dsn, config.reads_queue) if config.reads_dsn else None
        self.metrics.reads = self.reads
        # Server connections reused across clients (config.server_reuse): the idle ones, and those resetting.
        self.pool: IdlePool[PooledServer] | None = None
        if config.server_reuse:
            self.pool = IdlePool(
                PoolLimits(
                    config.server_idle_max,
                    config.server_idle_per_startup,
                    config.server_idle_timeout,
                    config.server_lifetime,
                    config.server_check_delay,
                    config.server_round_robin,
                )
            )
        self._resetting: set[PooledServer] = set()  # (and those being checked before reuse)
        self._expiry: asyncio.TimerHandle | None = None
        self.metrics.watch_pool(self._idle_servers)
        self.metrics.watch_connections(self._connection_states)
        self.metrics.watch_fast(self._fast_counts)

    # ---- server connection reuse (proxy/pool.py)

    def _idle_servers(self) -> dict[str, int]:
        return self.pool.idle_by_database() if self.pool is not None else {}

    def reset_for_pool(self, pooled: PooledServer) -> None:
        """A client left its server connection idle: reset it, then keep it (``pool_idle``)."""
        if self.pool is None or self._idle_event is not None:  # (draining: no new idle ones)
            pooled.close("shutdown")
            return
        self._resetting.add(pooled)
        pooled.start_reset(
            Reset(pooled.greeting.params, in_session=pooled.in_session, secret=self.config.bind_secret)
        )

    def pool_idle(self, pooled: PooledServer) -> None:
        self._resetting.discard(pooled)
        if self.pool is None or self._idle_event is not None:
            pooled.close("shutdown")
            return
        now = time.monotonic()
        for gone in self.pool.put(pooled.key, pooled, pooled.born, now):
            gone.close("lifetime" if now - gone.born >= self.pool.limits.lifetime else "pool full")
        self._schedule_expiry()

    async def take_pooled(self, key: PoolKey) -> PooledServer | None:
        """A sound idle server connection for this startup (None: open a new one); the expired and the
        unhealthy ones met on the way are closed. One idle for ``server_check_delay`` or longer answers an
        empty query first (PgBouncer's server_check_query): a peer gone without a word (a host down, a NAT
        or firewall that dropped the idle flow) is found here, not by the client's first statement."""
        while True:
            pool = self.pool
            if pool is None or self._idle_event is not None:
                return None
            taken = pool.take(key, time.monotonic())
            for gone in taken.expired:
                gone.close("idle timeout")
            pooled = taken.conn
            if pooled is None:
                return None
            if not pooled.alive():
                pooled.close("unhealthy")
                continue
            if not taken.check:
                return pooled
            self._resetting.add(pooled)
            sound = await pooled.check(self.config.connect_timeout)
            self._resetting.discard(pooled)
            if sound:
                return pooled

    def forget_pooled(self, pooled: PooledServer) -> None:
        self._resetting.discard(pooled)
        if self.pool is not None:
            self.pool.remove(pooled)

    def _schedule_expiry(self) -> None:
        pool = self.pool
        if pool is None or self._expiry is not None:
            return
        deadline = pool.next_deadline()
        if deadline is not None:
            loop = asyncio.get_running_loop()
            self._expiry = loop.call_later(max(0.0, deadline - time.monotonic()) + 0.01, self._expire)

    def _expire(self) -> None:
        self._expiry = None
        pool = self.pool
        if pool is None:
            return
        now = time.monotonic()
        for gone in pool.expire(now):
            gone.close("lifetime" if now - gone.born >= pool.limits.lifetime else "idle timeout")
        self._schedule_expiry()

    def _close_pool(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        for pooled in [*(self.pool.clear() if self.pool is not None else ()), *self._resetting]:
            pooled.close("shutdown")
        self._resetting.clear()

    def _fast_counts(self) -> FastCounts | None:
        if self.fast is None:
            return None
        # (First the C relay's read records and hand-backs: the scrape's cowproxy_reads_queued then counts
        # every read done so far, which is what a client waiting for the trace to be written polls.)
        self._on_handbacks()
        return self.fast.counts() if self.fast is not None else None

    def fast_states(self) -> dict[int, tuple[str, int]] | None:
        return self.fast.states() if self.fast is not None else None

    def describe_connections(self) -> list[dict[str, Any]]:
        states = self.fast_states()
        return [conn.describe(states) for conn in list(self.connections.values())]

    def _connection_states(self) -> Iterator[tuple[str, str]]:
        states = self.fast_states()
        for conn in list(self.connections.values()):
            state = conn.client_state(states)
            yield ("client", state)
            if conn.upstream is not None:
                yield ("upstream", state)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        listen = self.config.listen
        try:
            if listen.unix_path is not None:
                _remove_stale_socket(listen.unix_path)
                self._server = await loop.create_unix_server(
                    lambda: ClientConnection(self), listen.unix_path, backlog=1024
                )
                # Like PostgreSQL's default unix_socket_permissions: access is decided by authentication.
                os.chmod(listen.unix_path, 0o777)
            else:
                self._server = await loop.create_server(
                    lambda: ClientConnection(self),
                    listen.host,
                    listen.port,
                    reuse_address=True,
                    reuse_port=self.config.workers > 1,  # the other workers listen on the same port
                    backlog=1024,
                )
        except OSError as exc:
            raise ProxyError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
        self._start_fast(loop)
        if self.reads is not None:
            self.reads.start()
        if self.config.state_dsn is not None:
            self.shared_routes = SharedRoutes(self.config.state_dsn, self._apply_routes)
            try:
                await self.shared_routes.start()
            except ProxyError:
                self.shared_routes = None
                self._server.close()
                self._stop_fast()
                raise
        log_event(
            logging.INFO,
            "listening",
            listen="{}:{}".format(*self.listen_address),  # the bound port when --listen gave port 0
            upstream=str(self.config.upstream),
            fast_relay="on" if self.fast is not None else "off",
            binding="on" if self.config.bind_secret is not None else "off",
        )
        if self.config.bind_secret is None:
            log_event(
                logging.WARNING,
                "binding_off",
                reason="no binding secret (--bind-secret-file or COW_BIND_SECRET): tagged connections join "
                "their sessions with cow.use_session, which SQL on the connection can undo",
            )

    def _start_fast(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self.config.fast_relay:
            return
        if FAST_RELAY_UNAVAILABLE is not None:
            reason = f"{FAST_RELAY_UNAVAILABLE}; relaying in Python"
            log_event(logging.WARNING, "fast_relay_unavailable", reason=reason)
            return
        self.fast = FastRelay()
        loop.add_reader(self.fast.fileno(), self._on_handbacks)
        if self.reads is not None:
            self._reads_timer = loop.call_later(_TAKE_READS, self._reads_tick)
            self.reads.collect = self._on_handbacks

    def _reads_tick(self) -> None:
        self.take_fast_reads()
        if self.reads is not None:
            self.reads.write_soon()  # (they have waited a tick: no second wait in the writer)
        if self.fast is not None:
            self._reads_timer = asyncio.get_running_loop().call_later(_TAKE_READS, self._reads_tick)

    def take_fast_reads(self) -> None:
        """Take the read records the C relay made so far into the recorder (its drops counted there)."""
        fast, recorder = self.fast, self.reads
        if fast is None or recorder is None:
            return
        dropped, batches = fast.take_reads()
        if dropped:
            recorder.dropped["relay_full"] += dropped
        for conn_id, records, rows, count in batches:
            conn = self.connections.get(conn_id)
            if conn is not None and conn.fast:
                if records:
                    conn.fast_reads(records)
                if count:
                    conn.fast_rows(rows, count)

    def _stop_fast(self) -> None:
        fast = self.fast
        if fast is None:
            return
        self.take_fast_reads()
        if self._reads_timer is not None:
            self._reads_timer.cancel()
            self._reads_timer = None
        self.fast = None
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(fast.fileno())
        for conn in list(self.connections.values()):
            if conn.fast:  # only after a failed start: drain takes every connection back first
                fast.release(conn.id)
                conn.fast = False
        fast.close()

    def _on_handbacks(self) -> None:
        fast = self.fast
        if fast is None:
            return
        self.take_fast_reads()  # (the thread also wakes the loop when a connection's read records pile up)
        for handback in fast.take_handbacks():
            conn = self.connections.get(handback.conn_id)
            if conn is not None and conn.fast:
                conn.from_fast(handback)
        # (after the hand-backs: a request of a connection handed back meanwhile is void, its Query came back)
        for conn_id, request, text in fast.take_requests():
            self._answer(fast, conn_id, request, text)

    def _answer(self, fast: FastRelay, conn_id: int, request: int, text: bytes) -> None:
        """Answer one request of the C relay, whatever happens while deciding: C does not read the client
        until it has the answer."""
        conn = self.connections.get(conn_id)
        decided = FastAnswer(None, "closed")
        try:
            if conn is not None:
                decided = conn.fast_decision(text)
        except Exception as exc:  # (the other requests of this wake-up wait for their answers too)
            log_event(logging.WARNING, "fast_relay_decide_failed", conn=conn_id, error=exc)
            decided = FastAnswer(None, "failed")
        try:
            live = fast.answer(conn_id, request, decided.row)
        except ValueError as exc:  # (a row C could not load: it hands the connection back at that Query)
            log_event(logging.WARNING, "fast_relay_answer_failed", conn=conn_id, error=exc)
            live, decided = True, FastAnswer(None, "bad row")
        answer = "void" if not live else "hand back" if decided.row is None else "decision"
        self.metrics.count_request(answer, decided.reason if answer == "hand back" else "")

    def recall(self, conn: ClientConnection) -> None:
        """Ask the C relay for a connection back at its next idle point (at once when idle)."""
        if self.fast is not None and conn.fast:
            handback = self.fast.recall(conn.id)
            if handback is not None:
                conn.from_fast(handback)

    @property
    def listen_address(self) -> tuple[str, int]:
        """(host, port) clients connect to; (socket directory, port) for a Unix socket."""
        assert self._server is not None
        if self.config.listen.unix_path is not None:
            return self.config.listen.host, self.config.listen.port
        sock = self._server.sockets[0].getsockname()
        return str(sock[0]), int(sock[1])

    def route(self, database: str, session: str) -> None:
        check_id(session, "session id")
        if not database:
            raise TagError("a route needs a database name")
        self.routes[database] = Tags(session)
        log_event(logging.INFO, "route", database=database, session=session)
        # Connections on the C relay come back to Python for their next transaction, to be tagged.
        for conn in list(self.connections.values()):
            if conn.database == database:
                self.recall(conn)

    async def set_route(self, database: str, session: str) -> None:
        """A route made through the admin API: in the state database when there is one (every worker and
        replica applies it when notified), else in this process."""
        check_id(session, "session id")
        if not database:
            raise TagError("a route needs a database name")
        if self.shared_routes is None:
            self.route(database, session)
        else:
            await self.shared_routes.put(database, session)

    async def remove_route(self, database: str) -> bool:
        if self.shared_routes is None:
            return self.unroute(database)
        return await self.shared_routes.remove(database)

    def _apply_routes(self, routes: dict[str, str]) -> None:
        """The state database's routes, (re)loaded: apply what changed."""
        for database in [db for db in self.routes if db not in routes]:
            self.unroute(database)
        for database, session in routes.items():
            current = self.routes.get(database)
            if current is None or current.session != session:
                self.route(database, session)

    def unroute(self, database: str) -> bool:
        found = self.routes.pop(database, None) is not None
        log_event(logging.INFO, "unroute", database=database, found=found)
        # Routed connections on the C relay (in the session) come back for their next transaction too.
        for conn in list(self.connections.values()):
            if found and conn.database == database:
                self.recall(conn)
        return found

    def forward_cancel(self, request: p.CancelRequest) -> None:
        conn = self.cancel_keys.get((request.pid, request.key))
        if conn is None:
            log_event(logging.INFO, "cancel_unknown_key", pid=request.pid)
            return
        log_event(logging.INFO, "cancel", conn=conn.id, pid=request.pid)
        self.spawn(self._send_cancel(request, conn.id))

    async def _send_cancel(self, request: p.CancelRequest, conn_id: int) -> None:
        """Send a cancel the way the connection was made: over TLS when ``upstream_tls`` asks for it (the
        key stays encrypted and goes only to a server that passes the same checks), bounded by
        ``connect_timeout``. Waits for PostgreSQL to close the connection, as libpq does: by then the
        cancel has been handled."""
        up = self.config.upstream
        loop = asyncio.get_running_loop()
        protocol = _CancelProtocol()
        tls = False
        try:
            async with asyncio.timeout(self.config.connect_timeout):
                if up.unix_path is not None:
                    transport, _ = await loop.create_unix_connection(lambda: protocol, up.unix_path)
                else:
                    transport, _ = await loop.create_connection(lambda: protocol, up.host, up.port)
                if self.upstream_tls is not None:
                    tls = await upstream_tls_handshake(self.config, self.upstream_tls, transport, protocol)
                assert protocol.transport is not None
                protocol.transport.write(request.encode())
                await protocol.closed
        except ssl.SSLCertVerificationError as exc:
            error = f"TLS certificate verification ({self.config.upstream_tls}): {exc.verify_message or exc}"
        except TimeoutError:
            error = f"no answer within connect_timeout ({self.config.connect_timeout:g} s)"
        except (OSError, ConnectionError, ssl.SSLError) as exc:
            error = str(exc) or type(exc).__name__
        else:
            log_event(logging.INFO, "cancel_sent", conn=conn_id, tls=tls)
            return
        finally:
            if protocol.transport is not None:
                protocol.transport.close()
        log_event(logging.WARNING, "cancel_failed", conn=conn_id, upstream=str(up), error=error)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def connection_closed(self) -> None:
        if self._idle_event is not None and not self.connections:
            self._idle_event.set()

    async def drain(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Stop accepting; close idle connections; let open transactions finish, up to ``timeout``."""
        timeout = self.config.drain_timeout if timeout is None else timeout
        if self._server is not None:
            self._server.close()
        self._idle_event = asyncio.Event()
        self._close_pool()
        for conn in list(self.connections.values()):
            conn.draining = True
            self.recall(conn)  # back to Python at once when idle (then closed just below), else when idle
            if conn.idle and conn.state is not State.CLOSED:
                conn.close("drained", goodbye=conn.relay is not None)
        if self.connections:
            log_event(logging.INFO, "draining", open=len(self.connections), timeout=timeout)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._idle_event.wait()
        for conn in list(self.connections.values()):
            conn.close("drain timeout", goodbye=True)
        self._close_pool()  # (those left by clients that ended while draining were closed already)
        self._stop_fast()
        if self.shared_routes is not None:
            await self.shared_routes.close()
        if self.reads is not None:
            await self.reads.close()  # flushes what the relays queued
        if self._server is not None:
            await self._server.wait_closed()
        path = self.config.listen.unix_path
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)
        log_event(logging.INFO, "stopped")
