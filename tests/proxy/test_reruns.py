"""Statements run again after the layer's row-changed 40001 (proxy/rerun.py, ``Reruns``), on literal message
sequences through the relay."""

from __future__ import annotations

from proxy import protocol as p
from proxy.relay import Relay
from proxy.rerun import MAX_RERUNS, RERUN_HINT
from proxy.tags import Tags
from tests.proxy.test_relay_unit import relay, reply, send
from tests.proxy_sql import catalogs

# A statement alone in its implicit transaction that fails with the layer's row-changed 40001 runs again
# (proxy/rerun.py): the client sees one result, never the first run's error or replies twice.
ROW_CHANGED = p.encode_error(
    "40001", "could not serialize access due to concurrent update", extra=(("H", RERUN_HINT),)
)
UPDATED = p.encode_command_complete("UPDATE 1")


def in_session() -> Relay:
    """A tagged relay already joined to its session, its search_path known to be clean (no injections)."""
    r = relay(Tags("S1"))
    r.tagging.applied.tags = r.tagging.txn = Tags("S1")
    r.path.clean = True
    return r


def test_an_autocommit_update_that_got_the_row_changed_40001_runs_again() -> None:
    r = in_session()
    query = p.encode_query("UPDATE t SET n = n + 1 WHERE id = 1")
    assert send(r, query) == query
    assert reply(r, ROW_CHANGED) == b""  # (the ReadyForQuery in a read of its own)
    assert reply(r, p.encode_ready("I")) == b""
    assert b"".join(r.to_server) == query and r.reruns.count == 1
    r.to_server.clear()
    assert reply(r, UPDATED, p.encode_ready("I")) == UPDATED + p.encode_ready("I")
    assert not r.replies.pending and not r.holding and r.at_rest()
    # One that succeeds at once: its reply goes through as is, nothing held.
    assert send(r, query) == query
    notice = p.message(b"N", b"SNOTICE\x00C00000\x00Mhello\x00\x00")
    assert reply(r, notice, UPDATED, p.encode_ready("I")) == notice + UPDATED + p.encode_ready("I")
    assert r.reruns.count == 1 and r.at_rest()


def test_a_rerun_holds_what_a_run_returned_until_it_did_not_fail() -> None:
    r = in_session()
    query = p.encode_query("UPDATE t SET n = n + 1 WHERE id = 1 RETURNING n")
    send(r, query)
    columns = p.message(
        b"T", b"\x00\x01n\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x17\x00\x04\xff\xff\xff\xff\x00\x00"
    )
    notice = p.message(b"N", b"SNOTICE\x00C00000\x00Mhello\x00\x00")
    # (a NotificationResponse of another session is not the statement's: it goes at once)
    notification = p.message(b"A", b"\x00\x00\x00\x07chan\x00x\x00")
    assert reply(r, columns, notice, notification, ROW_CHANGED, p.encode_ready("I")) == notification
    assert b"".join(r.to_server) == query
    r.to_server.clear()
    row = p.message(b"D", b"\x00\x01\x00\x00\x00\x0211")
    answer = (columns, row, UPDATED, p.encode_ready("I"))
    assert reply(r, *answer) == b"".join(answer)


def test_an_extended_batch_runs_again_without_its_parse_and_replies_the_client_has() -> None:
    r = in_session()
    parse = p.encode_parse("", "UPDATE t SET n = n + 1 WHERE id = $1")
    bind = p.encode_bind("", "", ("1",))
    describe = p.message(b"D", b"P\x00")
    execute = p.encode_execute()
    batch = (parse, bind, describe, execute, p.SYNC)
    assert send(r, *batch) == b"".join(batch)
    first = (p.message(b"1"), p.message(b"2"), p.message(b"n"))
    assert reply(r, *first, ROW_CHANGED, p.encode_ready("I")) == b"".join(first)
    # The statement stays prepared after the failed transaction; the portal does not.
    assert b"".join(r.to_server) == bind + describe + execute + p.SYNC
    r.to_server.clear()
    assert reply(r, p.message(b"2"), p.message(b"n"), UPDATED, p.encode_ready("I")) == (
        UPDATED + p.encode_ready("I")
    )
    assert not r.replies.pending and not r.replies.mid_batch


def test_statements_pipelined_behind_it_wait_for_the_rerun() -> None:
    r = in_session()
    query = p.encode_query("DELETE FROM t WHERE id = 1")
    after = p.encode_query("SELECT 1")
    assert send(r, query, after) == query  # (held until the DELETE has ended)
    assert reply(r, ROW_CHANGED, p.encode_ready("I")) == b""
    assert b"".join(r.to_server) == query
    r.to_server.clear()
    deleted = p.encode_command_complete("DELETE 1") + p.encode_ready("I")
    assert reply(r, deleted) == deleted
    assert b"".join(r.to_server) == after


def test_runs_are_bounded_then_the_40001_reaches_the_client() -> None:
    r = in_session()
    query = p.encode_query("UPDATE t SET n = 1 WHERE id = 1")
    send(r, query)
    for _ in range(MAX_RERUNS):
        assert reply(r, ROW_CHANGED, p.encode_ready("I")) == b""
        assert b"".join(r.to_server) == query
        r.to_server.clear()
    assert reply(r, ROW_CHANGED, p.encode_ready("I")) == ROW_CHANGED + p.encode_ready("I")
    assert not r.to_server and r.reruns.count == MAX_RERUNS and not r.holding


def test_any_other_40001_or_a_statement_in_a_block_is_never_run_again() -> None:
    genuine = p.encode_error("40001", "could not serialize access due to concurrent update")
    other_hint = p.encode_error(
        "40001", "could not serialize access due to concurrent update", extra=(("H", "Retry."),)
    )
    for error in (genuine, other_hint):
        r = in_session()
        send(r, p.encode_query("UPDATE t SET n = 1 WHERE id = 1"))
        assert reply(r, error, p.encode_ready("I")) == error + p.encode_ready("I")
        assert not r.to_server and r.reruns.count == 0
    # Inside a transaction block (the client's retry loop is there for it), and several statements in one
    # Query (one implicit transaction, but a later statement's failure is not the first one's to rerun).
    r = in_session()
    r.replies.status = "T"
    send(r, p.encode_query("UPDATE t SET n = 1 WHERE id = 1"))
    assert reply(r, ROW_CHANGED, p.encode_ready("E")) == ROW_CHANGED + p.encode_ready("E")
    r = in_session()
    send(r, p.encode_query("UPDATE t SET n = 1 WHERE id = 1; UPDATE t SET n = 2 WHERE id = 2"))
    assert reply(r, ROW_CHANGED, p.encode_ready("I")) == ROW_CHANGED + p.encode_ready("I")
    # Untagged: not a session's statement.
    r = relay()
    send(r, p.encode_query("UPDATE t SET n = 1 WHERE id = 1"))
    assert reply(r, ROW_CHANGED, p.encode_ready("I")) == ROW_CHANGED + p.encode_ready("I")
    assert not r.to_server


def test_a_rerun_statement_s_mapped_command_tag_comes_after_what_was_held() -> None:
    """TRUNCATE runs as a DELETE in a session (its tag mapped back): a notice held before its CommandComplete
    still reaches the client, first."""
    r = in_session()
    r.catalog = catalogs.sample_catalog()
    query = p.encode_query("TRUNCATE comments")
    sent = send(r, query)
    assert sent != query and b"DELETE" in sent  # (rewritten)
    notice = p.message(b"N", b"SNOTICE\x00C00000\x00Mhello\x00\x00")
    out = reply(r, notice, p.encode_command_complete("DELETE 3"), p.encode_ready("I"))
    assert out == notice + p.encode_command_complete("TRUNCATE TABLE") + p.encode_ready("I")
