"""Server connection reuse's decisions on literal bytes (proxy/pool.py): which authentication may be pooled,
what a reused connection's client is sent, how a reset's replies are read, the idle pool's limits; and its
settings, parsed once at the edge (proxy/config.py, the CLI's flags)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from proxy import protocol as p
from proxy.config import SERVER_REUSE_DEFAULT, build_config
from proxy.errors import ConfigError
from proxy.fastrelay import AVAILABLE, UNAVAILABLE, FastRelay, Handback
from proxy.handoff import Adoption
from proxy.pool import (
    BOUND_CHECK_SQL,
    CHECK_REQUEST,
    DISCARD_SQL,
    LAYER_CHECK_SQL,
    UNBIND_SQL,
    UNBOUND_CHECK_SQL,
    Check,
    Greeting,
    IdlePool,
    PoolKey,
    PoolLimits,
    Reset,
    pool_key,
)
from tests.proxy.fast_pairs import SocketPairs
from tests.proxy.test_serve import cowproxy

AUTH_OK = b"R\x00\x00\x00\x08\x00\x00\x00\x00"
AUTH_MD5 = b"R\x00\x00\x00\x0c\x00\x00\x00\x05salt"
AUTH_SASL = b"R\x00\x00\x00\x17\x00\x00\x00\x0aSCRAM-SHA-256\x00\x00"
KEY_DATA = b"K\x00\x00\x00\x0c\x00\x00\x30\x39\x01\x02\x03\x04"  # pid 12345
READY_I = b"Z\x00\x00\x00\x05I"
READY_T = b"Z\x00\x00\x00\x05T"
TRUE_ROW = b"D\x00\x00\x00\x0b\x00\x01\x00\x00\x00\x01t"
FALSE_ROW = b"D\x00\x00\x00\x0b\x00\x01\x00\x00\x00\x01f"
# RowDescription of one bool column "?column?" (type 16, size 1, modifier -1, text)
ROW_DESC = p.message(
    b"T", b"\x00\x01?column?\x00" + bytes(6) + b"\x00\x00\x00\x10\x00\x01\xff\xff\xff\xff\x00\x00"
)


def _status(name: str, value: str) -> bytes:
    return (
        b"S"
        + (len(name) + len(value) + 6).to_bytes(4, "big")
        + name.encode()
        + b"\0"
        + value.encode()
        + b"\0"
    )


def _complete(tag: str) -> bytes:
    return b"C" + (len(tag) + 5).to_bytes(4, "big") + tag.encode() + b"\0"


def _greet(*raws: bytes) -> Greeting:
    greeting = Greeting()
    for raw in raws:
        greeting.message(raw[:1], raw)
    return greeting


def test_a_trusted_authentication_is_poolable_and_replayed_as_the_server_sent_it() -> None:
    greeting = _greet(
        AUTH_OK, _status("server_version", "15.8"), _status("TimeZone", "UTC"), KEY_DATA, READY_I
    )
    assert greeting.poolable
    assert greeting.params == {"server_version": "15.8", "TimeZone": "UTC"}
    assert greeting.encode() == AUTH_OK + _status("server_version", "15.8") + _status("TimeZone", "UTC") + (
        KEY_DATA + READY_I
    )


@pytest.mark.parametrize("challenge", [AUTH_MD5, AUTH_SASL, b"R\x00\x00\x00\x08\x00\x00\x00\x03"])
def test_a_challenged_authentication_is_never_poolable(challenge: bytes) -> None:
    # (the server's final AuthenticationOk after the password does not make it trusted)
    assert not _greet(challenge, AUTH_OK, KEY_DATA, READY_I).poolable


def test_a_negotiated_protocol_or_no_key_data_is_not_poolable() -> None:
    negotiate = b"v\x00\x00\x00\x0c\x00\x03\x00\x00\x00\x00\x00\x00"
    assert not _greet(negotiate, AUTH_OK, KEY_DATA, READY_I).poolable
    assert not _greet(AUTH_OK, READY_I).poolable


def test_the_key_is_the_forwarded_startup_whatever_its_order() -> None:
    a = p.StartupMessage(p.PROTOCOL_3_0, (("user", "u"), ("database", "d"), ("application_name", "x")))
    b = p.StartupMessage(p.PROTOCOL_3_0, (("application_name", "x"), ("database", "d"), ("user", "u")))
    assert pool_key(a) == pool_key(b)
    assert pool_key(a) != pool_key(a.replace("application_name", "y"))
    assert pool_key(a) != pool_key(p.StartupMessage(p.PROTOCOL_3_0 + 2, a.params))  # (3.2: other key data)
    assert pool_key(a).database == "d"
    assert pool_key(a.replace("database", None)).database == "u"


def test_a_reset_outside_sessions_discards_and_checks_for_no_temporary_schema() -> None:
    reset = Reset({}, in_session=False, secret="s" * 20)
    assert reset.request == p.encode_query(DISCARD_SQL) + p.encode_query(UNBOUND_CHECK_SQL)
    assert reset.feed(_complete("DISCARD ALL") + READY_I) is None
    result = reset.feed(ROW_DESC + TRUE_ROW + _complete("SELECT 1") + READY_I)
    assert result is not None and result.ok
    assert (reset.follow_up, reset.asked_layer) == (b"", False)  # (one round trip)


CHECKED = ROW_DESC + FALSE_ROW + _complete("SELECT 1") + READY_I  # a temporary schema, and the layer


@pytest.mark.parametrize(
    ("answer", "ok"),
    [
        (ROW_DESC + TRUE_ROW + _complete("SELECT 1") + READY_I, True),  # temporary tables only
        (ROW_DESC + FALSE_ROW + _complete("SELECT 1") + READY_I, False),  # bound (by the client itself)
        (p.encode_error("42501", "permission denied") + READY_I, False),
    ],
)
def test_a_temporary_schema_outside_sessions_is_asked_of_the_layer(answer: bytes, ok: bool) -> None:
    """DISCARD ALL leaves the temporary schema, which temporary tables or a bind made: the layer tells them
    apart (the binding's row), in a second round trip that only such backends pay."""
    reset = Reset({}, in_session=False, secret=None)
    assert reset.feed(_complete("DISCARD ALL") + READY_I) is None
    assert reset.feed(CHECKED) is None
    assert reset.follow_up == p.encode_query(LAYER_CHECK_SQL) and reset.asked_layer
    reset.follow_up = b""
    result = reset.feed(answer)
    assert result is not None and result.ok is ok
    assert reset.follow_up == b""  # (asked once)


def test_a_first_check_with_bytes_after_it_is_not_followed() -> None:
    reset = Reset({}, in_session=False, secret=None)
    result = reset.feed(_complete("DISCARD ALL") + READY_I + CHECKED + b"N")
    assert result is not None and not result.ok and reset.follow_up == b""


def test_a_reset_in_a_session_unbinds_with_the_secret_then_checks_with_the_layer() -> None:
    reset = Reset({}, in_session=True, secret="secret-of-twenty-chars")
    assert reset.request == b"".join(
        [
            p.encode_query(DISCARD_SQL),
            p.encode_parse("", UNBIND_SQL),
            p.encode_bind("", "", ("secret-of-twenty-chars",)),
            p.encode_execute(),
            p.SYNC,
            p.encode_query(BOUND_CHECK_SQL),
        ]
    )
    replies = [
        _complete("DISCARD ALL") + READY_I,
        b"1\x00\x00\x00\x04" + b"2\x00\x00\x00\x04" + TRUE_ROW + _complete("SELECT 1") + READY_I,
        _complete("RESET") + ROW_DESC + TRUE_ROW + _complete("SELECT 1") + READY_I,
    ]
    data = b"".join(replies)
    # Byte by byte: the reader waits for whole messages.
    results = [reset.feed(data[i : i + 1]) for i in range(len(data))]
    assert all(r is None for r in results[:-1])
    assert results[-1] is not None and results[-1].ok


def test_without_a_secret_a_reset_in_a_session_only_checks() -> None:
    reset = Reset({}, in_session=True, secret=None)
    assert reset.request == p.encode_query(DISCARD_SQL) + p.encode_query(BOUND_CHECK_SQL)


@pytest.mark.parametrize(
    ("replies", "reason"),
    [
        # still bound: the check says no
        (_complete("RESET") + ROW_DESC + FALSE_ROW + _complete("SELECT 1") + READY_I, "bound"),
        # an error anywhere
        (
            p.encode_error("42883", "no") + READY_I,
            "42883",
        ),
        # a transaction left open
        (ROW_DESC + TRUE_ROW + _complete("SELECT 1") + READY_T, "transaction status T"),
        # somewhere a reset does not lead
        (b"G\x00\x00\x00\x07\x00\x00\x00", "unexpected message"),
    ],
)
def test_a_reset_that_does_not_end_well_fails(replies: bytes, reason: str) -> None:
    reset = Reset({}, in_session=True, secret=None)
    assert reset.feed(_complete("DISCARD ALL") + READY_I) is None
    result = reset.feed(replies)
    assert result is not None and not result.ok and reason in result.reason


def test_a_reset_that_discards_in_a_transaction_block_fails() -> None:
    # DISCARD ALL refuses to run in a block: its error fails the reset even if the check then says yes.
    reset = Reset({}, in_session=False, secret=None)
    error = p.encode_error("25001", "no")
    result = reset.feed(error + READY_I + ROW_DESC + TRUE_ROW + _complete("SELECT 1") + READY_I)
    assert result is not None and not result.ok and "25001" in result.reason


def test_a_reset_takes_the_parameter_status_the_server_reports() -> None:
    params = {"application_name": "agent-1", "TimeZone": "UTC"}
    reset = Reset(params, in_session=False, secret=None)
    reset.feed(_complete("DISCARD ALL") + _status("application_name", "") + READY_I)
    result = reset.feed(ROW_DESC + TRUE_ROW + _complete("SELECT 1") + READY_I)
    assert result is not None and result.ok
    assert params == {"application_name": "", "TimeZone": "UTC"}


def test_parameter_status_after_authentication_updates_the_greeting() -> None:
    """What the relays saw the server report while a client had the backend (a SET, a reload): the last
    value of each name counts; order of first appearance kept."""
    greeting = _greet(AUTH_OK, _status("application_name", ""), _status("TimeZone", "UTC"), KEY_DATA, READY_I)
    greeting.reported(_status("TimeZone", "Asia/Tokyo") + _status("in_hot_standby", "off"))
    greeting.reported(b"")
    assert greeting.params == {"application_name": "", "TimeZone": "Asia/Tokyo", "in_hot_standby": "off"}
    assert greeting.poolable
    first = AUTH_OK + _status("application_name", "") + _status("TimeZone", "Asia/Tokyo")
    assert greeting.encode().startswith(first)


@pytest.mark.parametrize("messages", [None, _status("TimeZone", "UTC")[:-3], b"Z\x00\x00\x00\x05I"])
def test_parameter_status_not_kept_or_unreadable_makes_the_backend_unpoolable(messages: bytes | None) -> None:
    greeting = _greet(AUTH_OK, _status("TimeZone", "UTC"), KEY_DATA, READY_I)
    greeting.reported(messages)
    assert greeting.lost and not greeting.poolable


def test_the_check_passes_on_its_exact_answer_only() -> None:
    assert CHECK_REQUEST == b"Q\x00\x00\x00\x05\x00"
    answer = b"I\x00\x00\x00\x04" + READY_I
    check = Check()
    results = [check.feed(answer[i : i + 1]) for i in range(len(answer))]  # (byte by byte)
    assert all(r is None for r in results[:-1])
    assert results[-1] is not None and results[-1].ok
    notice = p.message(b"N", b"SNOTICE\0C00000\0Mhi\0\0")
    for wrong in (
        p.encode_error("57P01", "terminating connection") + READY_I,
        notice + answer,
        b"I\x00\x00\x00\x04" + READY_T,
        answer + b"N",
    ):
        result = Check().feed(wrong)
        assert result is not None and not result.ok


def test_bytes_after_the_last_ready_fail_the_reset() -> None:
    reset = Reset({}, in_session=False, secret=None)
    reset.feed(_complete("DISCARD ALL") + READY_I)
    result = reset.feed(ROW_DESC + TRUE_ROW + _complete("SELECT 1") + READY_I + b"N")
    assert result is not None and not result.ok
    reset = Reset({}, in_session=False, secret=None)
    reset.feed(_complete("DISCARD ALL") + READY_I)
    result = reset.feed(
        ROW_DESC + TRUE_ROW + _complete("SELECT 1") + READY_I + p.encode_error("57P01", "bye")
    )
    assert result is not None and not result.ok


KEY_A = PoolKey(196608, (("database", "a"), ("user", "u")))
KEY_B = PoolKey(196608, (("database", "b"), ("user", "u")))


def test_the_pool_gives_the_most_recently_idle_of_a_key() -> None:
    pool: IdlePool[str] = IdlePool(PoolLimits())
    assert pool.put(KEY_A, "a1", born=0, now=1) == []
    assert pool.put(KEY_A, "a2", born=0, now=2) == []
    assert pool.put(KEY_B, "b1", born=0, now=3) == []
    assert pool.idle_by_database() == {"a": 2, "b": 1}
    assert pool.take(KEY_A, now=4) == ("a2", [], False)
    assert pool.take(KEY_A, now=4) == ("a1", [], False)
    assert pool.take(KEY_A, now=4) == (None, [], False)
    assert len(pool) == 1


def test_round_robin_gives_the_longest_idle_first_and_the_stale_are_checked() -> None:
    pool: IdlePool[str] = IdlePool(PoolLimits(round_robin=True, check_delay=5))
    for i, name in enumerate(["a1", "a2", "a3"]):
        pool.put(KEY_A, name, born=0, now=i)
    assert pool.take(KEY_A, now=6) == ("a1", [], True)  # (idle 6 s: checked first)
    assert pool.take(KEY_A, now=6) == ("a2", [], True)  # (idle 5 s)
    assert pool.take(KEY_A, now=6) == ("a3", [], False)
    always: IdlePool[str] = IdlePool(PoolLimits(check_delay=0))
    always.put(KEY_A, "a", born=0, now=1)
    assert always.take(KEY_A, now=1).check


def test_the_pool_keeps_its_limits() -> None:
    pool: IdlePool[str] = IdlePool(PoolLimits(max_idle=3, max_idle_per_key=2, idle_timeout=10, lifetime=100))
    assert pool.put(KEY_A, "a1", born=0, now=1) == []
    assert pool.put(KEY_A, "a2", born=0, now=1) == []
    assert pool.put(KEY_A, "a3", born=0, now=1) == ["a3"]  # per key
    assert pool.put(KEY_B, "b1", born=0, now=2) == []
    assert pool.put(KEY_B, "b2", born=0, now=3) == ["a1"]  # in total: the oldest idle goes
    assert pool.put(KEY_B, "old", born=0, now=100) == ["old"]  # past its lifetime
    assert pool.next_deadline() == 11
    assert pool.expire(now=12.5) == ["a2", "b1"]  # idle 10 s and more
    assert pool.take(KEY_B, now=13.5) == (None, ["b2"], False)  # expired on the way
    assert pool.put(KEY_A, "young", born=50, now=60) == []
    assert pool.expire(now=150) == ["young"]  # its lifetime
    assert pool.remove("gone") is False


def test_a_pool_of_no_idle_connections_keeps_none() -> None:
    pool: IdlePool[str] = IdlePool(PoolLimits(max_idle=0))
    assert pool.put(KEY_A, "a", born=0, now=0) == ["a"]
    assert pool.clear() == []


def test_the_settings_are_parsed_once_at_the_edge(tmp_path: Path) -> None:
    assert build_config({"upstream": "127.0.0.1:5432"}).server_reuse is False
    toml = tmp_path / "proxy.toml"
    toml.write_text(
        'upstream = "127.0.0.1:5432"\nserver-reuse = true\nserver-idle-timeout = 5\nserver-lifetime = 60.5\n'
        "server-idle-max = 0\nserver-check-delay = 0\nserver-round-robin = true\n"
    )
    config = build_config({"server_idle_per_startup": 3}, str(toml))
    assert (config.server_reuse, config.server_idle_timeout, config.server_lifetime) == (True, 5, 60.5)
    assert (config.server_idle_max, config.server_idle_per_startup) == (0, 3)
    assert (config.server_check_delay, config.server_round_robin) == (0, True)
    assert build_config({"upstream": "127.0.0.1:5432"}).server_check_delay == 30
    for name, value in [
        ("server_reuse", "yes"),
        ("server_idle_max", -1),
        ("server_idle_per_startup", True),
        ("server_idle_timeout", 0),
        ("server_lifetime", "1h"),
        ("server_check_delay", -1),
        ("server_round_robin", 1),
    ]:
        with pytest.raises(ConfigError, match=name):
            build_config({"upstream": "127.0.0.1:5432", name: value})


def test_the_flags_reach_the_configuration() -> None:
    result = cowproxy("serve", "--upstream", "127.0.0.1:5432", "--server-reuse", "--server-idle-timeout", "0")
    assert result.returncode == 1 and "server_idle_timeout must be a positive number" in result.stderr
    assert "Traceback" not in result.stderr
    result = cowproxy("serve", "--upstream", "127.0.0.1:5432", "--server-check-delay", "-1")
    assert result.returncode == 1 and "server_check_delay must be a non-negative number" in result.stderr
    result = cowproxy("serve", "--help")
    assert "--server-round-robin" in result.stdout and "--no-server-reuse" in result.stdout


def test_reuse_is_decided_in_one_place() -> None:
    """The flag and the file leave it unset unless given; the configuration's default is the constant."""
    assert (
        build_config({"upstream": "127.0.0.1:5432", "server_reuse": None}).server_reuse
        is SERVER_REUSE_DEFAULT
    )
    assert build_config({"upstream": "127.0.0.1:5432", "server_reuse": False}).server_reuse is False
    assert build_config({"upstream": "127.0.0.1:5432", "server_reuse": True}).server_reuse is True


# ---- the C relay keeps the ParameterStatus messages it relays, for the hand-back


def _relayed(fast: FastRelay, server_sends: list[bytes]) -> Handback:
    """An untagged connection on the C relay: the client's Query, the server's reply in the pieces given (one
    send each, so headers and bodies cross reads), then a Terminate, which C hands back."""
    fast.take_handbacks()
    pair = SocketPairs(fast, 41, Adoption([], [], False, [], False, False))
    try:
        pair.client.sendall(p.encode_query("SET application_name = 'b'"))
        assert pair.read(pair.server) == p.encode_query("SET application_name = 'b'")
        for piece in server_sends:
            pair.server.sendall(piece)
            time.sleep(0.02)
        assert pair.read(pair.client) == b"".join(server_sends)  # (relayed as sent)
        pair.client.sendall(p.TERMINATE)
        deadline = time.monotonic() + 5
        backs: list[Handback] = []
        while not backs and time.monotonic() < deadline:
            backs = fast.take_handbacks()
            time.sleep(0.01)
        [back] = backs
        assert back.reason == "client message" and back.untaken == ord("X")
        return back
    finally:
        pair.close()


@pytest.mark.skipif(not AVAILABLE, reason=f"{UNAVAILABLE}")
def test_the_c_relay_hands_back_the_last_parameter_status_of_each_name(fast: FastRelay) -> None:
    reply = (
        _status("application_name", "a")
        + _status("TimeZone", "Asia/Tokyo")
        + _status("application_name", "b")
        + _complete("SET")
        + READY_I
    )
    # Whole, then cut inside a header and inside a body.
    for pieces in ([reply], [reply[:3], reply[3:30], reply[30:]]):
        back = _relayed(fast, pieces)
        assert back.parameters == _status("TimeZone", "Asia/Tokyo") + _status("application_name", "b")
    # None sent: nothing; one too long to keep: None (the server connection is then not pooled).
    assert _relayed(fast, [_complete("SET") + READY_I]).parameters == b""
    long_path = _status("search_path", "x" * 20_000)
    assert _relayed(fast, [long_path, _complete("SET") + READY_I]).parameters is None
