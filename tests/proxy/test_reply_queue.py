"""The reply queue on literal message sequences (through the relay, which pushes what each message sent
will be answered with): errors, COPY FROM STDIN, what the client is shown of ParameterStatus."""

from __future__ import annotations

from proxy import protocol as p
from tests.proxy.test_relay_unit import relay, reply, send


def test_error_in_a_pipeline_skips_to_sync() -> None:
    r = relay()
    batch = (
        p.encode_parse("", "SELECT 1/0"),
        p.encode_bind("", "", ()),
        p.encode_execute(),
        p.encode_parse("", "SELECT 2"),
        p.encode_bind("", "", ()),
        p.encode_execute(),
        p.SYNC,
    )
    assert send(r, *batch) == b"".join(batch)
    assert len(r.replies.pending) == 7
    error = p.encode_error("22012", "division by zero")
    answer = p.message(b"1") + p.message(b"2") + error + p.encode_ready("I")
    assert reply(r, answer) == answer
    assert not r.replies.pending and r.replies.status == "I"


def test_syncs_inside_copy_from_stdin_are_not_owed_a_ready() -> None:
    # libpq's extended COPY: Execute and Sync, then the data, CopyDone and Sync. The server ignores the
    # first Sync (it arrives in copy mode), so only one ReadyForQuery comes; the queue must be empty after
    # it, else the next injected use_session waits for a reply that never comes.
    r = relay()
    start = (p.encode_parse("", "COPY t FROM STDIN"), p.encode_bind("", "", ()), p.encode_execute(), p.SYNC)
    assert send(r, *start) == b"".join(start)
    copy_in = p.message(b"G", b"\x00\x00\x00")
    assert reply(r, p.message(b"1"), p.message(b"2"), copy_in) == p.message(b"1") + p.message(b"2") + copy_in
    assert [e.kind.name for e in r.replies.pending] == ["EXECUTE"] and r.replies.mid_batch
    # A Sync before the CopyDone is ignored by the server too; the one after it is answered.
    rest = (p.message(b"d", b"1\n"), p.SYNC, p.message(b"c"), p.SYNC)
    assert send(r, *rest) == b"".join(rest)
    assert [e.kind.name for e in r.replies.pending] == ["EXECUTE", "SYNC"]
    reply(r, p.encode_command_complete("COPY 1"), p.encode_ready("I"))
    assert not r.replies.pending and not r.replies.mid_batch and r.replies.copy_in is None
    # All of it pipelined before the server answers: the Sync after CopyDone still counts.
    assert send(r, *start, p.message(b"d", b"2\n"), p.message(b"c"), p.SYNC)
    assert len(r.replies.pending) == 5
    reply(r, p.message(b"1"), p.message(b"2"), copy_in)
    assert [e.kind.name for e in r.replies.pending] == ["EXECUTE", "SYNC"]
    reply(r, p.encode_command_complete("COPY 1"), p.encode_ready("I"))
    assert not r.replies.pending
    # A failed COPY ends copy mode: the server reads the next Sync, whether or not CopyDone came first.
    send(r, *start)
    reply(r, p.message(b"1"), p.message(b"2"), copy_in)
    send(r, p.message(b"d", b"x\n"))
    reply(r, p.encode_error("22P02", "invalid input syntax for type integer"))
    assert r.replies.skip_until_sync and not r.replies.pending
    send(r, p.SYNC)
    reply(r, p.encode_ready("I"))
    assert not r.replies.pending and r.replies.status == "I"
    # Simple-protocol COPY: the same rule for a stray Sync.
    send(r, p.encode_query("COPY t FROM STDIN"))
    reply(r, copy_in)
    send(r, p.SYNC, p.message(b"c"))
    assert [e.kind.name for e in r.replies.pending] == ["QUERY"]
    reply(r, p.encode_command_complete("COPY 0"), p.encode_ready("I"))
    assert not r.replies.pending


def test_parameter_status_search_path_shows_the_application_path() -> None:
    """PostgreSQL 18 reports search_path: the overlay schemas are dropped from what the client is told,
    whether the report comes alone or with the rest of a reply (the fast path leaves it to the scanner)."""
    r = relay()
    query = p.encode_query("SET search_path = tenant_a, public")
    assert send(r, query) == query
    physical = p.encode_parameter_status(
        "search_path", "cow_overlay_tenant_a, tenant_a, cow_overlay_public, public"
    )
    other = p.encode_parameter_status("application_name", "cow_overlay_x")
    done = p.encode_command_complete("SET") + p.encode_ready("I")
    assert reply(r, physical, other, done) == (
        p.encode_parameter_status("search_path", "tenant_a, public") + other + done
    )
    # a path without overlay schemas passes as it is (outside a session), also alone
    plain = p.encode_parameter_status("search_path", '"$user", public')
    assert reply(r, plain) == plain
    assert p.decode_parameter_status(plain[5:]) == ("search_path", '"$user", public')


def test_the_fast_path_takes_a_whole_plain_reply_and_leaves_anything_else_to_the_scanner() -> None:
    r = relay()
    select = p.encode_query("SELECT 1")
    row = p.message(b"D", b"\x00\x01\x00\x00\x00\x011")
    whole = b"".join((p.message(b"T", b"\x00\x00"), row, p.encode_command_complete("SELECT 1")))
    send(r, select)
    # An ErrorResponse, a ParameterStatus or a reply cut short: nothing taken, the queue as it was.
    for chunk in (
        p.encode_error("22012", "division by zero") + p.encode_ready("I"),
        p.encode_parameter_status("search_path", "cow_overlay_public, public") + p.encode_ready("I"),
        whole + p.encode_ready("I")[:-1],
    ):
        assert not r.fast_reply(chunk)
        assert len(r.replies.pending) == 1 and r.replies.scanner.idle
    # The whole reply up to its ReadyForQuery: taken, the status kept, for the caller to send as it is.
    assert r.fast_reply(whole + p.encode_ready("T"))
    assert not r.replies.pending and r.replies.status == "T" and not r.to_client
    # Two statements owed: the reply of the first is the scanner's (it may end with a ReadyForQuery only).
    send(r, select, select)
    assert not r.fast_reply(whole + p.encode_ready("T"))
    assert reply(r, whole + p.encode_ready("T")) == whole + p.encode_ready("T")
    assert len(r.replies.pending) == 1
