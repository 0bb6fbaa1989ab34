"""Server connections reused across client connections (session pooling, as PgBouncer's), sans-IO.

A client that ends cleanly with its server connection idle leaves that connection to the next client whose
forwarded startup is the same, after a reset that gives it back what a new backend has (``Reset``). The
asyncio side (proxy/server.py) moves the bytes; this module decides:

- ``Greeting`` watches a new connection's authentication: whether the server granted it without a challenge
  (only those are pooled: the proxy cannot prove the next client's password), the ParameterStatus values and
  BackendKeyData a reused connection's client is given.
- ``Reset`` is the batch that resets a used backend, and reads its replies: any error, a transaction left
  open or a backend still bound to a session closes the connection instead (reuse is an optimisation).
- ``Check`` is the health check of a connection that sat idle longer than ``check_delay`` before it is given
  out (PgBouncer's ``server_check_delay`` with its default ``server_check_query``, the empty query).
- ``IdlePool`` keeps the idle ones by startup, with PgBouncer's limits (idle per key and in total, idle
  timeout, server lifetime) and order (LIFO, or FIFO: ``server_round_robin``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

from proxy import protocol as p
from proxy.errors import ProtocolError

_T = TypeVar("_T")

# Authentication request codes (the first word of an 'R' message): 0 is AuthenticationOk, anything else asks
# the client for something (a password, SASL, GSS).
_AUTH_OK = 0

# What a backend was reset with: DISCARD ALL (RESET ALL with SET SESSION AUTHORIZATION DEFAULT, DEALLOCATE
# ALL, CLOSE ALL, UNLISTEN *, pg_advisory_unlock_all(), DISCARD PLANS/TEMP/SEQUENCES). It runs alone: it
# refuses to run in a transaction block, which a multi-statement Query is.
DISCARD_SQL = "DISCARD ALL"
# The binding survives DISCARD ALL by design (11_binding.sql): a backend that was in a session is unbound
# with the proxy's secret, after DISCARD ALL (a role or default_transaction_read_only the client set would
# refuse the write), then RESET ALL undoes the GUCs the unbind's cow._join set, and the check must find it
# unbound.
UNBIND_SQL = "SELECT cow.bind_session(NULL, NULL, $1)"
BOUND_CHECK_SQL = "RESET ALL; SELECT cow.bound_session() IS NULL"
# A backend the proxy never joined to a session: DISCARD ALL drops its temporary tables but not its temporary
# schema, which a bind makes too (cow._bind, for the guard) and which stays until the backend ends. What a
# bind leaves that DISCARD ALL does not clear is its row in cow.bindings (this pid and this backend's start):
# no temporary schema, or no layer in the database, means it was never bound (one round trip, as before);
# otherwise the layer is asked (a second one, only for such backends), and one the client bound itself (with
# the secret) is closed.
UNBOUND_CHECK_SQL = (
    "SELECT pg_catalog.pg_my_temp_schema() = 0 OR pg_catalog.to_regprocedure('cow.bound_session()') IS NULL"
)
LAYER_CHECK_SQL = "SELECT cow.bound_session() IS NULL"


@dataclass(frozen=True)
class PoolKey:
    """A startup as forwarded to the server (the proxy's tags stripped): protocol version and parameters,
    order aside (the backend's state does not depend on it)."""

    version: int
    params: tuple[tuple[str, str], ...]

    @property
    def database(self) -> str:
        found = dict(self.params)
        return found.get("database") or found.get("user") or ""


def pool_key(startup: p.StartupMessage) -> PoolKey:
    return PoolKey(startup.version, tuple(sorted(startup.params)))


@dataclass
class Greeting:
    """What the server said during one connection's authentication, as far as reuse needs it."""

    challenged: bool = False  # an authentication request other than AuthenticationOk
    unusual: bool = False  # a message a reused connection's client would also need (NegotiateProtocolVersion)
    params: dict[str, str] = field(default_factory=dict)  # ParameterStatus values, in the server's order
    key_data: bytes | None = None  # the BackendKeyData message, whole
    # A ParameterStatus the server sent later was not kept (the C relay keeps those up to a size): the values
    # above may no longer be the backend's, so it is not pooled.
    lost: bool = False

    def message(self, kind: bytes, raw: bytes) -> None:
        """One whole server message of the authentication phase (``raw``: type byte and length included)."""
        body = raw[5:]
        if kind == b"R":
            if len(body) < 4 or int.from_bytes(body[:4], "big") != _AUTH_OK:
                self.challenged = True
        elif kind == b"S":
            name, value = p.decode_parameter_status(body)
            self.params[name] = value
        elif kind == b"K":
            self.key_data = raw
        elif kind not in b"NZE":
            self.unusual = True

    def reported(self, messages: bytes | None) -> None:
        """ParameterStatus messages (whole, in the order sent) the server sent after authentication, while
        a relay moved the bytes: the backend's values are the last ones reported (PostgreSQL reports a
        GUC_REPORT setting whenever it differs from what it last reported: a SET, a reload, a standby's
        promotion). None: some were not kept."""
        if messages is None:
            self.lost = True
            return
        pos = 0
        while pos + 5 <= len(messages):
            end = pos + 1 + int.from_bytes(messages[pos + 1 : pos + 5], "big")
            if messages[pos : pos + 1] != b"S" or end > len(messages) or end < pos + 5:
                break
            name, value = p.decode_parameter_status(messages[pos + 5 : end])
            self.params[name] = value
            pos = end
        if pos != len(messages):
            self.lost = True  # (not what C gives: never pool what cannot be read)

    @property
    def poolable(self) -> bool:
        return not self.challenged and not self.unusual and not self.lost and self.key_data is not None

    def encode(self) -> bytes:
        """What a client given the reused connection receives: what a new backend would have sent."""
        assert self.key_data is not None
        out = [p.message(b"R", _AUTH_OK.to_bytes(4, "big"))]
        out.extend(p.encode_parameter_status(name, value) for name, value in self.params.items())
        out.append(self.key_data)
        out.append(p.encode_ready("I"))
        return b"".join(out)


@dataclass(frozen=True)
class ResetResult:
    ok: bool
    reason: str = ""  # why not


class Reset:
    """The reset of one used backend: ``request`` to send, then ``feed`` the server's bytes until it answers
    (sending ``follow_up`` whenever ``feed`` leaves one there).

    ``in_session``: the backend was joined to a session (by the relay, now or for an earlier client): unbind
    it with ``secret`` (None: the proxy binds nothing, so there is nothing to unbind) and check with the layer
    that it is unbound; else check that it was never bound (``UNBOUND_CHECK_SQL``, then ``LAYER_CHECK_SQL``
    where that cannot tell). ParameterStatus messages the reset makes the server send update ``params`` (the
    values the next client is given).
    """

    def __init__(self, params: dict[str, str], *, in_session: bool, secret: str | None) -> None:
        self.params = params
        self.in_session = in_session
        out = [p.encode_query(DISCARD_SQL)]
        if in_session and secret is not None:
            out += [
                p.encode_parse("", UNBIND_SQL),
                p.encode_bind("", "", (secret,)),
                p.encode_execute(),
                p.SYNC,
            ]
        out.append(p.encode_query(BOUND_CHECK_SQL if in_session else UNBOUND_CHECK_SQL))
        self.request = b"".join(out)
        self.follow_up = b""  # to send now (the caller sends it and empties it)
        self.asked_layer = False  # the second question of a backend with a temporary schema was sent
        self._readies = len(out) - (3 if in_session and secret is not None else 0)
        self._buf = bytearray()
        self._last_row: tuple[str | None, ...] | None = None
        self._error: str | None = None

    def feed(self, data: bytes) -> ResetResult | None:
        """The server's bytes; a result once the reset is answered in full (or cannot succeed)."""
        self._buf += data
        messages = self._messages()
        for i, (kind, raw) in enumerate(messages):
            body = raw[5:]
            if kind == b"E" and self._error is None:
                fields = p.decode_error(body)
                self._error = f"{fields.sqlstate}: {fields.message}"
            elif kind == b"S":
                name, value = p.decode_parameter_status(body)
                self.params[name] = value
            elif kind == b"D":
                self._last_row = p.decode_data_row(body)
            elif kind == b"Z":
                self._readies -= 1
                status = p.decode_ready(body)
                if status != "I":
                    return ResetResult(False, f"transaction status {status} after the reset")
                if self._readies == 0:
                    trailing = i + 1 < len(messages) or bool(self._buf)
                    if not trailing and self._ask_layer():
                        return None
                    return self._result(trailing=trailing)
            elif kind not in b"CTNAn1t23s":
                # (CopyIn and the like: the server is somewhere a reset does not lead)
                return ResetResult(False, f"unexpected message {kind!r} during the reset")
        return None

    def _ask_layer(self) -> bool:
        """The first check of a backend never joined found a temporary schema in a database with the layer:
        ask the layer whether a bind is its cause (True: asked, wait for the answer)."""
        if self.in_session or self.asked_layer or self._error is not None or self._last_row != ("f",):
            return False
        self.asked_layer = True
        self.follow_up = p.encode_query(LAYER_CHECK_SQL)
        self._readies = 1
        self._last_row = None
        return True

    def _result(self, *, trailing: bool) -> ResetResult:
        if trailing:
            return ResetResult(False, "bytes after the reset's last ReadyForQuery")
        if self._error is not None:
            return ResetResult(False, self._error)
        if self._last_row != ("t",):
            return ResetResult(False, f"the backend may still be bound to a session ({self._last_row})")
        return ResetResult(True)

    def _messages(self) -> list[tuple[bytes, bytes]]:
        return _whole_messages(self._buf)


def _whole_messages(buf: bytearray) -> list[tuple[bytes, bytes]]:
    """The whole messages buffered (type, raw), taken out of the buffer."""
    pos = 0
    out = []
    while len(buf) - pos >= 5:
        length = int.from_bytes(buf[pos + 1 : pos + 5], "big")
        if length < 4:
            raise ProtocolError("server sent a malformed message to the pool")
        if len(buf) - pos < length + 1:
            break
        raw = bytes(buf[pos : pos + length + 1])
        pos += length + 1
        out.append((raw[:1], raw))
    del buf[:pos]
    return out


# PgBouncer's default server_check_query: the empty query, answered EmptyQueryResponse and ReadyForQuery
# without a parse or a snapshot.
CHECK_REQUEST = p.encode_query("")
_CHECK_ANSWER = p.message(b"I", b"") + p.encode_ready("I")


class Check:
    """The health check of a connection that sat idle a while, before a client is given it: ``CHECK_REQUEST``
    to send, then ``feed`` the server's bytes. Only the exact answer passes; anything else (a FATAL the loop
    had not read yet, a notice, a transaction status) fails it, and the connection is closed."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> ResetResult | None:
        self._buf += data
        if len(self._buf) < len(_CHECK_ANSWER) and _CHECK_ANSWER.startswith(self._buf):
            return None
        if self._buf == _CHECK_ANSWER:
            return ResetResult(True)
        return ResetResult(False, f"the check's answer was {bytes(self._buf[:64])!r}")


@dataclass(frozen=True)
class PoolLimits:
    max_idle: int = 100  # idle server connections in all (the oldest idle one goes for a new one)
    max_idle_per_key: int = 20  # idle ones of one startup (a further one is closed)
    idle_timeout: float = 60.0  # seconds an idle one is kept
    lifetime: float = 3600.0  # seconds from its start after which one is no longer reused
    check_delay: float = 30.0  # seconds idle after which one is checked before it is given out (0: always)
    # Give out the connection idle longest of a key (FIFO, PgBouncer's server_round_robin) instead of the most
    # recently idle (LIFO: warm caches, the fewest backends busy; FIFO spreads clients over what a load
    # balancer between the proxy and the servers reaches).
    round_robin: bool = False


class Taken(NamedTuple, Generic[_T]):
    conn: _T | None  # None: no idle connection of the key
    expired: list[_T]  # found past their limits on the way (to close)
    check: bool = False  # it sat idle at least check_delay: check it before giving it out


@dataclass
class _Idle(Generic[_T]):
    conn: _T
    key: PoolKey
    born: float
    since: float


class IdlePool(Generic[_T]):
    """Idle server connections by key, most recently idle first out (its caches are the warmest), or the
    longest idle first (``round_robin``)."""

    def __init__(self, limits: PoolLimits) -> None:
        self.limits = limits
        self._by_key: dict[PoolKey, list[_Idle[_T]]] = {}
        self._all: OrderedDict[int, _Idle[_T]] = OrderedDict()  # by id(conn), oldest idle first

    def __len__(self) -> int:
        return len(self._all)

    def put(self, key: PoolKey, conn: _T, born: float, now: float) -> list[_T]:
        """Keep ``conn`` idle; returns the connections to close (``conn`` itself when it may not be kept)."""
        limits = self.limits
        if now - born >= limits.lifetime or limits.max_idle < 1:
            return [conn]
        same = self._by_key.setdefault(key, [])
        if len(same) >= limits.max_idle_per_key:
            return [conn]
        closed = []
        while len(self._all) >= limits.max_idle:
            closed.append(self._pop(next(iter(self._all.values()))))
        entry = _Idle(conn, key, born, now)
        self._by_key.setdefault(key, []).append(entry)
        self._all[id(conn)] = entry
        return closed

    def take(self, key: PoolKey, now: float) -> Taken[_T]:
        """An idle connection for ``key`` (None: none), those found expired on the way (to close), and
        whether it is to be checked first."""
        expired = []
        same = self._by_key.get(key)
        while same:
            entry = same[0] if self.limits.round_robin else same[-1]
            self._pop(entry)
            if self._expired(entry, now):
                expired.append(entry.conn)
                continue
            return Taken(entry.conn, expired, now - entry.since >= self.limits.check_delay)
        return Taken(None, expired)

    def expire(self, now: float) -> list[_T]:
        """Remove and return those past the idle timeout or their lifetime."""
        gone = [entry for entry in self._all.values() if self._expired(entry, now)]
        return [self._pop(entry) for entry in gone]

    def remove(self, conn: _T) -> bool:
        entry = self._all.get(id(conn))
        if entry is None or entry.conn is not conn:
            return False
        self._pop(entry)
        return True

    def clear(self) -> list[_T]:
        return [self._pop(entry) for entry in list(self._all.values())]

    def idle_by_database(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for entry in self._all.values():
            database = entry.key.database
            counts[database] = counts.get(database, 0) + 1
        return counts

    def next_deadline(self) -> float | None:
        """When the next idle connection expires (monotonic seconds), or None."""
        limits = self.limits
        return min(
            (min(e.since + limits.idle_timeout, e.born + limits.lifetime) for e in self._all.values()),
            default=None,
        )

    def _expired(self, entry: _Idle[_T], now: float) -> bool:
        limits = self.limits
        return now - entry.since >= limits.idle_timeout or now - entry.born >= limits.lifetime

    def _pop(self, entry: _Idle[_T]) -> _T:
        del self._all[id(entry.conn)]
        same = self._by_key[entry.key]
        same.remove(entry)
        if not same:
            del self._by_key[entry.key]
        return entry.conn
