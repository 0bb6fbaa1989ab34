"""The sans-IO codec on literal bytes, and fuzzed with hypothesis."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import protocol as p
from proxy.errors import PolicyError, ProtocolError, TagError
from proxy.tags import Tags, join_options, read_startup_tags, split_options


def test_startup_packets() -> None:
    assert p.parse_startup_packet(b"\x00\x00\x00\x08\x04\xd2\x16\x2f") == p.SSLRequest()
    assert p.parse_startup_packet(b"\x00\x00\x00\x08\x04\xd2\x16\x30") == p.GSSENCRequest()
    cancel = b"\x00\x00\x00\x10\x04\xd2\x16\x2e\x00\x00\x30\x39\xde\xad\xbe\xef"
    assert p.parse_startup_packet(cancel) == p.CancelRequest(12345, b"\xde\xad\xbe\xef")
    long_key = bytes(range(32))  # protocol 3.2: variable-length keys
    request = p.CancelRequest(7, long_key)
    assert p.parse_startup_packet(request.encode()) == request
    startup = b"\x00\x00\x00\x22\x00\x03\x00\x00user\x00alice\x00database\x00shop\x00\x00"
    packet = p.parse_startup_packet(startup)
    assert packet == p.StartupMessage(p.PROTOCOL_3_0, (("user", "alice"), ("database", "shop")))
    assert isinstance(packet, p.StartupMessage)
    assert packet.encode() == startup
    assert packet.replace("user", None).params == (("database", "shop"),)
    v32 = p.StartupMessage(p.PROTOCOL_3_2, (("user", "u"),))
    assert p.parse_startup_packet(v32.encode()) == v32


@pytest.mark.parametrize(
    "raw",
    [
        b"\x00\x00\x00\x04",
        b"\x00\x00\x00\x0c\x00\x02\x00\x00user\x00",  # protocol 2
        b"\x00\x00\x00\x0d\x00\x03\x00\x00user\x00",  # parameter without value
        b"\x00\x00\x00\x0c\x00\x03\x00\x00user",  # unterminated
        b"\x00\x00\x00\x0c\x04\xd2\x16\x2e\x00\x00\x00\x01",  # cancel without key
    ],
)
def test_bad_startup_packets(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        p.parse_startup_packet(raw)


def test_message_decoders() -> None:
    assert p.decode_query(b"SELECT 1\x00") == p.Query("SELECT 1")
    parse = p.encode_parse("s1", "SELECT $1", (23,))
    assert parse == b"P\x00\x00\x00\x17s1\x00SELECT $1\x00\x00\x01\x00\x00\x00\x17"
    assert p.decode_parse(parse[5:]) == p.Parse("s1", "SELECT $1", (23,))
    bind = p.encode_bind("", "s1", ("42", None))
    assert bind == b"B\x00\x00\x00\x18\x00s1\x00\x00\x00\x00\x02\x00\x00\x00\x0242\xff\xff\xff\xff\x00\x00"
    assert p.decode_bind_names(bind[5:]) == p.Bind("", "s1")
    assert p.decode_execute(p.encode_execute("", 0)[5:]) == p.Execute("", 0)
    assert p.decode_close(b"Sname\x00") == p.Close("S", "name")
    error = p.encode_error("42501", "no")
    assert error == b"E\x00\x00\x00\x1eSERROR\x00VERROR\x00C42501\x00Mno\x00\x00"
    fields = p.decode_error(error[5:])
    assert (fields.sqlstate, fields.message) == ("42501", "no")
    assert p.encode_error_fields(fields) == error
    assert p.decode_ready(b"T") == "T"
    assert p.decode_data_row(b"\x00\x02\x00\x00\x00\x01a\xff\xff\xff\xff") == ("a", None)
    assert p.decode_command_tag(b"INSERT 0 1\x00") == "INSERT 0 1"
    sasl = p.encode_sasl_mechanisms(("SCRAM-SHA-256",))
    assert sasl == b"R\x00\x00\x00\x17\x00\x00\x00\x0aSCRAM-SHA-256\x00\x00"
    assert p.decode_sasl_mechanisms(b"\x00\x00\x00\x0aSCRAM-SHA-256\x00SCRAM-SHA-256-PLUS\x00\x00") == (
        "SCRAM-SHA-256",
        "SCRAM-SHA-256-PLUS",
    )
    with pytest.raises(ProtocolError):
        p.decode_parse(b"s\x00SELECT 1\x00\x00\x02\x00\x00\x00\x17")
    with pytest.raises(ProtocolError):
        p.decode_query(b"SELECT 1")
    with pytest.raises(ProtocolError):
        p.decode_ready(b"X")


STARTUP = p.StartupMessage(p.PROTOCOL_3_0, (("user", "u"),)).encode()


def _events(reader: p.ClientReader, data: bytes, step: int) -> list[p.ClientEvent]:
    events: list[p.ClientEvent] = []
    for i in range(0, len(data), step):
        reader.feed(data[i : i + step])
        events.extend(reader.events())
    return events


def test_client_reader_frames_at_every_split() -> None:
    stream = STARTUP + p.encode_query("SELECT 1") + p.encode_parse("", "SELECT 2") + p.SYNC
    expected = None
    for step in range(1, len(stream) + 1):
        events = _events(p.ClientReader(), stream, step)
        kinds = [e.kind if isinstance(e, p.Frame) else type(e).__name__ for e in events]
        assert kinds == ["Startup", b"Q", b"P", b"S"]
        if expected is None:
            expected = events
        assert events == expected
    ssl_then_startup = b"\x00\x00\x00\x08\x04\xd2\x16\x2f" + STARTUP
    events = _events(p.ClientReader(), ssl_then_startup, 3)
    assert [type(e) for e in events] == [p.Startup, p.Startup]


def test_client_reader_streams_large_copy_data_and_skips_oversized() -> None:
    reader = p.ClientReader(max_message=1000, stream_threshold=100)
    reader.expect_startup = False
    copy = p.message(b"d", b"x" * 500)
    big_query = p.encode_query("SELECT '" + "y" * 2000 + "'")
    stream = copy + big_query + p.SYNC
    events = _events(reader, stream, 64)
    assert isinstance(events[0], p.StreamStart) and events[0].length == 500
    chunks = [e for e in events if isinstance(e, p.StreamChunk)]
    assert b"".join(c.data for c in chunks) == b"x" * 500 and chunks[-1].last
    oversized = [e for e in events if isinstance(e, p.Oversized)]
    assert oversized == [p.Oversized(b"Q", len(big_query) - 5)]
    assert isinstance(events[-1], p.Frame) and events[-1].kind == b"S"
    # Nothing is buffered beyond one chunk while streaming.
    assert reader.buffered == 0


def test_client_reader_rejects_bad_lengths() -> None:
    reader = p.ClientReader()
    reader.expect_startup = False
    reader.feed(b"Q\x00\x00\x00\x02")
    with pytest.raises(ProtocolError):
        list(reader.events())
    reader = p.ClientReader()
    reader.feed(b"\x7f\x00\x00\x00")
    with pytest.raises(ProtocolError):
        list(reader.events())


def _scanner(
    kept: list[tuple[int, bytes]], drop: int | None = None, runs: bytes = b"", seen: list[int] | None = None
) -> p.ServerScanner:
    def classify(kind: int, length: int) -> int:
        if seen is not None:
            seen.append(kind)
        return p.BODY if kind in (ord("Z"), drop) else p.PASS

    def handle(kind: int, body: bytes, raw: bytes) -> bytes:
        kept.append((kind, body))
        return b"" if kind == drop else raw

    return p.ServerScanner(classify, handle, runs=runs)


SERVER = (
    p.message(b"T", b"\x00\x00")
    + p.message(b"D", b"\x00\x01\x00\x00\x00\x03abc")
    + p.encode_command_complete("SELECT 1")
    + p.encode_ready("I")
)


def test_server_scanner_relays_the_same_chunk() -> None:
    kept: list[tuple[int, bytes]] = []
    out = _scanner(kept).feed(SERVER)
    assert len(out) == 1 and out[0] is SERVER
    assert kept == [(ord("Z"), b"I")]


def test_server_scanner_drops_and_splits() -> None:
    for step in range(1, len(SERVER) + 1):
        kept: list[tuple[int, bytes]] = []
        scanner = _scanner(kept, drop=ord("D"))
        out = b"".join(b"".join(scanner.feed(SERVER[i : i + step])) for i in range(0, len(SERVER), step))
        assert out == SERVER.replace(p.message(b"D", b"\x00\x01\x00\x00\x00\x03abc"), b"")
        assert kept == [(ord("D"), b"\x00\x01\x00\x00\x00\x03abc"), (ord("Z"), b"I")]


messages = st.lists(
    st.tuples(st.sampled_from(list(b"TDCZNAS123nsIE")), st.binary(max_size=300)), min_size=1, max_size=20
)


def test_server_scanner_steps_over_a_run_without_classifying_each_message() -> None:
    """A run of DataRows is classified once per chunk it starts in; a run split across chunks once per
    chunk, and a message of the run split in two is passed on whole."""
    row = p.message(b"D", b"\x00\x01\x00\x00\x00\x03abc")
    stream = (
        p.message(b"T", b"\x00\x00") + row * 5 + p.encode_command_complete("SELECT 5") + p.encode_ready("I")
    )
    seen: list[int] = []
    kept: list[tuple[int, bytes]] = []
    out = _scanner(kept, runs=b"D", seen=seen).feed(stream)
    assert len(out) == 1 and out[0] is stream and seen == list(b"TDCZ") and kept == [(ord("Z"), b"I")]
    seen.clear()
    scanner = _scanner(kept, runs=b"D", seen=seen)
    cut = 7 + 2 * len(row) + 7  # in the middle of the third row's body
    assert b"".join(scanner.feed(stream[:cut]) + scanner.feed(stream[cut:])) == stream
    assert seen == list(b"TDDCZ")
    with pytest.raises(ProtocolError):  # a bad length inside a run is still caught
        _scanner(kept, runs=b"D").feed(row + b"D\x00\x00\x00\x02" + row)


@settings(max_examples=150, deadline=None)
@given(
    messages,
    st.integers(min_value=1, max_value=400),
    st.sampled_from([None, ord("D"), ord("N")]),
    st.sampled_from([b"", b"D", b"DT"]),
)
def test_fuzz_server_scanner_roundtrip(
    msgs: list[tuple[int, bytes]], step: int, drop: int | None, runs: bytes
) -> None:
    if drop is not None and drop in runs:
        runs = b""  # a kind whose decision is BODY is never a run (the caller's contract)
    stream = b"".join(p.message(bytes([k]), b) for k, b in msgs)
    kept: list[tuple[int, bytes]] = []
    scanner = _scanner(kept, drop, runs)
    out = b"".join(b"".join(scanner.feed(stream[i : i + step])) for i in range(0, len(stream), step))
    assert out == b"".join(p.message(bytes([k]), b) for k, b in msgs if k != drop)
    assert kept == [(k, b) for k, b in msgs if k in (ord("Z"), drop)]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400), st.integers(min_value=1, max_value=64), st.booleans())
def test_fuzz_client_reader_never_crashes(data: bytes, step: int, startup: bool) -> None:
    reader = p.ClientReader(max_message=200, stream_threshold=50)
    reader.expect_startup = startup
    try:
        for i in range(0, len(data), step):
            reader.feed(data[i : i + step])
            for event in reader.events():
                if isinstance(event, p.Frame):
                    assert len(event.raw) == len(event.body) + 5 <= 205
    except ProtocolError:
        pass


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(list(b"QPBESDCHdcf")), st.binary(max_size=120)), max_size=15))
def test_fuzz_client_reader_reframes(msgs: list[tuple[int, bytes]]) -> None:
    stream = b"".join(p.message(bytes([k]), b) for k, b in msgs)
    reader = p.ClientReader(max_message=100, stream_threshold=60)
    reader.expect_startup = False
    events = _events(reader, stream, 7)
    rebuilt = bytearray()
    for event in events:
        if isinstance(event, p.Frame):
            rebuilt += event.raw
        elif isinstance(event, p.StreamStart):
            rebuilt += event.header
        elif isinstance(event, p.StreamChunk):
            rebuilt += event.data
        elif isinstance(event, p.Oversized):
            rebuilt += event.kind + struct.pack("!I", event.length + 4) + bytes(event.length)
    expected = b"".join(p.message(bytes([k]), b if len(b) <= 100 else bytes(len(b))) for k, b in msgs)
    assert bytes(rebuilt) == expected


def test_options_split_and_join() -> None:
    assert split_options(r"-c a=b  -c x=y\ z") == ["-c", "a=b", "-c", "x=y z"]
    assert split_options(join_options(["-c", "x=y z", "a\\b"])) == ["-c", "x=y z", "a\\b"]


def test_startup_tags() -> None:
    def tags(**params: str) -> tuple[Tags, p.StartupMessage]:
        found = read_startup_tags(p.StartupMessage(p.PROTOCOL_3_0, tuple(params.items())))
        return found.tags, found.startup

    t, s = tags(user="u", options="-c cow.session_id=S1 -c cow.operation_id=o.1 -c work_mem=4MB")
    assert t == Tags("S1", "o.1") and s.get("options") == "-c work_mem=4MB"
    t, s = tags(user="u", options="--cow.session_id=S2")
    assert t == Tags("S2", None) and s.get("options") is None
    t, s = tags(user="u", options="-ccow.session_id=S3")
    assert t == Tags("S3", None)
    t, s = tags(user="u", application_name="cow:S4")
    assert t == Tags("S4", None) and s.get("application_name") == "cow:S4"
    t, _ = tags(user="u", options="-c cow.session_id=S5", application_name="cow:other")
    assert t == Tags("S5", None)
    t, _ = tags(user="u", application_name="psql")
    assert t == Tags()
    with pytest.raises(TagError):
        tags(user="u", application_name="cow:bad id!")
    with pytest.raises(TagError):
        tags(user="u", options="-c cow.operation_id=o1")
    with pytest.raises(TagError):
        tags(user="u", options="-c cow.session_id=" + "x" * 129)


def test_startup_tags_as_parameters_of_their_own() -> None:
    """asyncpg's server_settings and libpq keywords send settings as startup parameters, not in options."""

    def tags(*params: tuple[str, str]) -> tuple[Tags, p.StartupMessage]:
        found = read_startup_tags(p.StartupMessage(p.PROTOCOL_3_0, (("user", "u"), *params)))
        return found.tags, found.startup

    t, s = tags(("cow.session_id", "P1"), ("cow.operation_id", "o.2"), ("work_mem", "4MB"))
    assert t == Tags("P1", "o.2")
    assert s.params == (("user", "u"), ("work_mem", "4MB"))  # the tags do not go upstream
    t, s = tags(("options", "-c cow.session_id=P2"), ("cow.session_id", "P2"))
    assert t == Tags("P2", None) and s.params == (("user", "u"),)
    t, _ = tags(("options", "-c cow.session_id=P3"), ("cow.operation_id", "o.3"))
    assert t == Tags("P3", "o.3")
    with pytest.raises(TagError, match="given twice"):
        tags(("options", "-c cow.session_id=P4"), ("cow.session_id", "other"))
    with pytest.raises(TagError):
        tags(("cow.operation_id", "o.4"))
    for setting in (("session_replication_role", "replica"), ("cow.app_search_path", "public")):
        with pytest.raises(PolicyError, match='rule "session"'):
            tags(("cow.session_id", "P5"), setting)
        tags(setting)  # untagged: the client's business


@pytest.mark.parametrize(
    "options",
    [
        "-c cow.session_id=S -c session_replication_role=replica",
        "-c cow.session_id=S -c cow.app_search_path=public",
        "--session-authorization=postgres -c cow.session_id=S",
    ],
)
def test_a_tagged_startup_may_not_bring_settings_that_leave_the_session(options: str) -> None:
    with pytest.raises(PolicyError, match='rule "session"') as info:
        read_startup_tags(p.StartupMessage(p.PROTOCOL_3_0, (("user", "u"), ("options", options))))
    assert info.value.sqlstate == "42501"
    # untagged, the same settings are the client's business (PostgreSQL checks its privileges)
    untagged = options.replace("cow.session_id=S", "work_mem=4MB")
    read_startup_tags(p.StartupMessage(p.PROTOCOL_3_0, (("user", "u"), ("options", untagged))))
