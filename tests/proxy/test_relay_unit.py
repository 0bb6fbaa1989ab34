"""The sans-IO relay on literal message sequences: what goes to the server, what reaches the client."""

from __future__ import annotations

from typing import Any

from proxy import protocol as p
from proxy.analysis import ProxyAnalyzer, query_kind, quick_kind
from proxy.fastrelay import MAX_QUERY
from proxy.handoff import ConnectionState
from proxy.hooks import NoHooks
from proxy.injected import WRITABLE_STATEMENT
from proxy.relay import INJECT_STATEMENT, REFUSED_SQL, FastAnswer, Relay
from proxy.tags import UNTAGGED, Tags
from proxy.unnamed import PROMOTED_PREFIX
from tests.proxy_sql import catalogs


class NoCatalog(ProxyAnalyzer):
    """The real analysis, without the catalog query (these tests play the server by hand)."""

    def __init__(self) -> None:
        super().__init__()
        self.catalog_query = None


def relay(tags: Tags = UNTAGGED, route: Tags | None = None) -> Relay:
    return Relay(NoCatalog(), tags, lambda: route)


def send(r: Relay, *messages: bytes) -> bytes:
    reader = p.ClientReader()
    reader.expect_startup = False
    reader.feed(b"".join(messages))
    for event in reader.events():
        r.client_event(event)
    out = b"".join(r.to_server)
    r.to_server.clear()
    return out


def reply(r: Relay, *messages: bytes) -> bytes:
    r.server_data(b"".join(messages))
    out = b"".join(r.to_client)
    r.to_client.clear()
    return out


JOIN_START = p.encode_close("S", INJECT_STATEMENT) + p.encode_parse(
    INJECT_STATEMENT, "SELECT cow.use_session($1, $2)"
)
OK_SELECT = (
    p.message(b"T", b"\x00\x00"),
    p.encode_command_complete("SELECT 0"),
)


def test_untagged_query_passes_untouched() -> None:
    r = relay()
    query = p.encode_query("SELECT 1")
    assert send(r, query) == query
    answer = b"".join((*OK_SELECT, p.encode_ready("I")))
    assert reply(r, answer) == answer
    assert not r.replies.pending


def test_tagged_query_is_preceded_by_use_session_and_its_replies_are_hidden() -> None:
    r = relay(Tags("S1", "op"))
    query = p.encode_query("INSERT INTO t VALUES (1)")
    upstream = send(r, query)
    # Held: only the injection went out, with bound parameters and its own Sync.
    assert upstream == b"".join(
        (
            p.encode_close("S", INJECT_STATEMENT),  # (left by a failed join, it would fail the Parse)
            p.encode_parse(INJECT_STATEMENT, "SELECT cow.use_session($1, $2)"),
            p.encode_bind(INJECT_STATEMENT, INJECT_STATEMENT, ("S1", "op")),
            p.encode_execute(INJECT_STATEMENT),
            p.encode_close("P", INJECT_STATEMENT),
            p.encode_close("S", INJECT_STATEMENT),
            p.SYNC,
        )
    )
    assert r.holding
    injected_replies = (
        p.message(b"3"),
        p.message(b"1"),
        p.message(b"2"),
        p.message(b"S", b"search_path\x00cow_overlay_public, public\x00"),
        p.message(b"D", b"\x00\x01\x00\x00\x00\x00"),
        p.encode_command_complete("SELECT 1"),
        p.message(b"3"),
        p.message(b"3"),
        p.encode_ready("I"),
    )
    assert reply(r, *injected_replies) == b""  # nothing reaches the client
    assert b"".join(r.to_server) == query  # and the held query is released
    r.to_server.clear()
    assert r.tagging.applied.tags == Tags("S1", "op") and not r.tagging.applied.tentative
    done = p.encode_command_complete("INSERT 0 1") + p.encode_ready("I")
    assert reply(r, done) == done
    # Same tags next time: no injection.
    assert send(r, query) == query


def test_failed_injection_refuses_the_statement_with_that_error() -> None:
    r = relay(Tags("S1"))
    send(r, p.encode_query("INSERT INTO t VALUES (1)"))
    failure = p.encode_error("42883", "function cow.use_session(text, text) does not exist")
    assert reply(r, p.message(b"3"), p.message(b"1"), p.message(b"2"), failure, p.encode_ready("I")) == b""
    # Instead of the client's statement, one that cannot run; its error becomes the injection's.
    assert b"".join(r.to_server) == p.encode_query(REFUSED_SQL)
    syntax = p.encode_error("42601", 'syntax error at or near "cowproxy"')
    assert reply(r, syntax, p.encode_ready("I")) == failure + p.encode_ready("I")
    assert r.tagging.applied.tags == Tags()


def test_tampering_on_a_tagged_connection_is_refused_by_the_server_state() -> None:
    r = relay(route=Tags("R1"))
    r.tagging.applied.tags = Tags("R1")  # as if joined already
    upstream = send(r, p.encode_query("RESET ALL; SELECT 1"))
    assert upstream == p.encode_query(REFUSED_SQL)
    syntax = p.encode_error("42601", "syntax error")
    out = reply(r, syntax, p.encode_ready("I"))
    fields = p.decode_error(out[5 : out.index(b"Z") - 0])
    assert fields.sqlstate == "42501"
    assert out.endswith(p.encode_ready("I"))


def test_a_pool_reset_at_the_end_runs_and_the_session_is_joined_again() -> None:
    r = relay(route=Tags("R1"))
    r.tagging.applied.tags = Tags("R1")
    reset = p.encode_query("SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL")
    assert send(r, reset) == reset
    assert r.tagging.applied.tags is None  # cleared on the server: re-applied before the next statement
    reply(r, p.encode_command_complete("RESET"), p.encode_ready("I"))
    upstream = send(r, p.encode_query("SELECT 2"))
    assert upstream.startswith(JOIN_START)


def test_function_call_waits_for_the_session() -> None:
    r = relay(Tags("S2"))
    call = p.message(b"F", b"\x00\x00\x03\xe8\x00\x00\x00\x00\x00\x00")
    upstream = send(r, call)
    assert upstream.startswith(JOIN_START)
    assert call not in upstream and r.holding
    reply(r, p.message(b"3"), p.message(b"1"), p.message(b"2"), p.encode_command_complete("SELECT 1"))
    reply(r, p.message(b"3"), p.message(b"3"), p.encode_ready("I"))
    assert b"".join(r.to_server) == call


def test_fast_path_reuses_its_entry_without_carrying_a_copy_refusal_over() -> None:
    # COPY FROM STDIN on the fast path, an oversized CopyData: the proxy's 54000 replaces the server's
    # error for that COPY only; the next statement's own error reaches the client as the server sent it.
    r = relay()
    copy = p.encode_query("COPY t FROM STDIN")
    assert r.fast_query(copy)
    assert reply(r, p.message(b"G", b"\x00\x00\x00")) == p.message(b"G", b"\x00\x00\x00")
    r.client_event(p.Oversized(b"d", 10**9))
    assert r.to_server == [p.message(b"f", b"cowproxy: message too large\0")]
    r.to_server.clear()
    server_error = p.encode_error("57014", "COPY from stdin failed: cowproxy: message too large")
    answer = reply(r, server_error, p.encode_ready("I"))
    length = int.from_bytes(answer[1:5], "big")
    assert answer[:1] == b"E" and p.decode_error(answer[5 : 1 + length]).sqlstate == "54000"
    assert answer[1 + length :] == p.encode_ready("I")
    assert not r.replies.pending
    select = p.encode_query("SELECT 1/0")
    assert r.fast_query(select)
    division = p.encode_error("22012", "division by zero")
    assert reply(r, division, p.encode_ready("I")) == division + p.encode_ready("I")
    assert not r.replies.pending


def test_query_kind_matches_quick_kind_with_and_without_its_prefix_table() -> None:
    texts = [
        "SELECT 1",
        "select\n1",
        "UPDATE t SET a = 1",
        "BEGIN;",
        "END;",
        "selectx",
        "SELECTED_ROWS",
        "  -- c\nINSERT INTO t VALUES (1)",
        "(SELECT 1)",
        "VACUUM",
        "",
        "é",
    ]
    for _ in range(2):  # the second round answers from the prefix table
        for text in texts:
            assert query_kind(p.encode_query(text)) == quick_kind(text), text


def promoting_relay() -> Relay:
    """A relay in session S1 (joined already) with the sample catalog: ``projects`` reads by key rewrite."""
    r = relay(route=Tags("S1"))
    r.tagging.applied.tags = Tags("S1")
    r.catalog = catalogs.sample_catalog()
    return r


KEY_READ = "SELECT * FROM projects WHERE id = $1"


def test_an_unnamed_key_read_runs_as_a_named_statement_of_the_proxy() -> None:
    r = promoting_relay()
    sent = r.analysis.analyze(KEY_READ, r.catalog, True, prepared=True).rewritten
    assert sent is not None and "_cow_versions" in sent
    name = f"{PROMOTED_PREFIX}1"
    bind = p.encode_bind("", "", ("7",))
    renamed = p.encode_bind("", name, ("7",))
    executed = (p.message(b"1"), p.message(b"2"), *OK_SELECT, p.encode_ready("I"))
    # First time: the Parse goes out under the proxy's name, the Bind names it; the replies are the client's.
    first = (p.encode_parse("", KEY_READ), bind, p.encode_execute(), p.SYNC)
    assert send(r, *first) == b"".join((p.encode_parse(name, sent), renamed, p.encode_execute(), p.SYNC))
    assert reply(r, *executed) == b"".join(executed)
    assert r.unnamed.promoted == {(sent, ()): name}
    # Next time: an empty unnamed statement answers the Parse; Bind and Describe name the proxy's statement.
    again = (p.encode_parse("", KEY_READ), p.message(b"D", b"S\0"), bind, p.encode_execute(), p.SYNC)
    assert send(r, *again) == b"".join(
        (
            p.encode_parse("", ""),
            p.message(b"D", b"S" + name.encode() + b"\0"),
            renamed,
            p.encode_execute(),
            p.SYNC,
        )
    )
    assert reply(r, *executed) == b"".join(executed)
    # Another unnamed statement ends the alias: its Bind goes to the unnamed statement again.
    other = (p.encode_parse("", "SELECT 1"), bind, p.encode_execute(), p.SYNC)
    assert send(r, *other) == b"".join(other)
    assert reply(r, *executed) == b"".join(executed)
    # DEALLOCATE ALL drops the proxy's statements with the client's: the next read prepares a new one.
    deallocate = p.encode_query("DEALLOCATE ALL")
    assert send(r, deallocate) == deallocate
    assert reply(r, p.encode_command_complete("DEALLOCATE ALL"), p.encode_ready("I"))
    assert not r.unnamed.promoted and r.unnamed.alias is None
    name2 = f"{PROMOTED_PREFIX}2"
    assert send(r, *first) == b"".join(
        (p.encode_parse(name2, sent), p.encode_bind("", name2, ("7",)), p.encode_execute(), p.SYNC)
    )


def test_a_failed_promoted_statement_is_prepared_anew_and_a_failed_parse_binds_nothing_older() -> None:
    r = promoting_relay()
    sent = r.analysis.analyze(KEY_READ, r.catalog, True, prepared=True).rewritten
    assert sent is not None
    name = f"{PROMOTED_PREFIX}1"
    parse = p.encode_parse("", KEY_READ)
    send(r, parse, p.SYNC)
    reply(r, p.message(b"1"), p.encode_ready("I"))
    assert r.unnamed.promoted == {(sent, ()): name}
    # The plan went stale (app DDL): the Bind fails; the statement is forgotten and the catalog suspect.
    assert send(r, parse, p.encode_bind("", "", ("7",)), p.SYNC).startswith(p.encode_parse("", ""))
    stale = p.encode_error("0A000", "cached plan must not change result type")
    assert reply(r, p.message(b"1"), stale, p.encode_ready("I")) == p.message(b"1") + stale + p.encode_ready(
        "I"
    )
    assert not r.unnamed.promoted and r.gate.suspect
    # A Parse under a new name that fails: the Bind after the Sync still names it (26000 from the server),
    # never the unnamed statement that was there before.
    r.gate.suspect = False
    name2 = f"{PROMOTED_PREFIX}2"
    assert send(r, parse, p.SYNC) == p.encode_parse(name2, sent) + p.SYNC
    syntax = p.encode_error("42601", "each UNION query must have the same number of columns")
    reply(r, syntax, p.encode_ready("I"))
    assert not r.unnamed.promoted and r.unnamed.alias == name2
    assert send(r, p.encode_bind("", "", ("7",)), p.SYNC) == p.encode_bind("", name2, ("7",)) + p.SYNC


def test_pipelined_repetitions_wait_for_the_first_promotion_and_a_deallocate_voids_it() -> None:
    r = promoting_relay()
    sent = r.analysis.analyze(KEY_READ, r.catalog, True, prepared=True).rewritten
    assert sent is not None
    name = f"{PROMOTED_PREFIX}1"
    parse, bind = p.encode_parse("", KEY_READ), p.encode_bind("", "", ("7",))
    # The same text twice before the server answers: the second goes out unnamed (no second name).
    upstream = send(r, parse, bind, p.encode_execute(), p.SYNC, parse, bind, p.encode_execute(), p.SYNC)
    assert upstream == b"".join(
        (
            p.encode_parse(name, sent),
            p.encode_bind("", name, ("7",)),
            p.encode_execute(),
            p.SYNC,
            p.encode_parse("", sent),
            bind,
            p.encode_execute(),
            p.SYNC,
        )
    )
    # A DEALLOCATE ALL sent before the first ParseComplete arrives: that statement is gone, not recorded.
    send(r, p.encode_query("DEALLOCATE ALL"))
    executed = (p.message(b"1"), p.message(b"2"), *OK_SELECT, p.encode_ready("I"))
    reply(r, *executed, *executed, p.encode_command_complete("DEALLOCATE ALL"), p.encode_ready("I"))
    assert not r.unnamed.promoted and r.unnamed.count == 1
    assert send(r, parse, p.SYNC) == p.encode_parse(f"{PROMOTED_PREFIX}2", sent) + p.SYNC


def _join(r: Relay, query: bytes) -> None:
    """Send a tagged connection's first statement and play the injection's replies (no catalog)."""
    send(r, query)
    reply(
        r,
        p.message(b"3"),
        p.message(b"1"),
        p.message(b"2"),
        p.message(b"D", b"\x00\x01\x00\x00\x00\x00"),
        p.encode_command_complete("SELECT 1"),
        p.message(b"3"),
        p.message(b"3"),
        p.encode_ready("I"),
    )
    r.to_server.clear()
    reply(r, p.encode_command_complete("INSERT 0 1"), p.encode_ready("I"))


def test_at_rest_and_the_decisions_of_a_session() -> None:
    """What the C relay may carry on from: at rest in the session's tags, with the texts that went out as
    they are (and not a refused, rewritten or comment-tagged one)."""
    r = relay(Tags("S1"))
    assert not r.at_rest()  # the session not joined yet
    insert = "INSERT INTO t VALUES (1)"
    _join(r, p.encode_query(insert))
    assert r.at_rest()
    shape = b"qINSERT INTO t VALUES (\xff)"  # its literal normalised (proxy/sql/shapes.py)
    assert list(r.decisions.table) == [shape]
    send(r, p.encode_query("BEGIN"))
    assert not r.at_rest()  # in flight
    reply(r, p.encode_command_complete("BEGIN"), p.encode_ready("T"))
    assert r.at_rest()  # in a block, in the tags set before it
    send(r, p.encode_query("SET cow.session_id = 'x'"))  # refused
    reply(r, p.encode_error("42601", "syntax error"), p.encode_ready("E"))
    assert not r.at_rest()  # a failed block
    send(r, p.encode_query("ROLLBACK"))
    reply(r, p.encode_command_complete("ROLLBACK"), p.encode_ready("I"))
    assert r.at_rest()
    send(r, p.encode_query("/*cow_session='S2'*/ SELECT 1"))
    assert not r.at_rest()  # switching sessions
    assert set(r.decisions.table) == {shape, b"QBEGIN", b"QROLLBACK"}
    untagged = relay()
    send(untagged, p.encode_query(insert))
    reply(untagged, p.encode_command_complete("INSERT 0 1"), p.encode_ready("I"))
    assert untagged.at_rest() and not untagged.decisions.table  # untagged: C needs no decisions
    routed = relay(route=Tags("R"))
    assert not routed.at_rest()  # the route's tags not in force yet


def test_a_session_rests_in_a_block_only_as_long_as_python_knows_its_tags_and_path() -> None:
    """Inside a transaction block a session may go to the C relay when its tags were set before the block
    (C never joins, and a ROLLBACK TO cannot undo them) and no statement of the block may have changed the
    path; the adoption carries the status."""
    r = relay(Tags("S1"))
    _join(r, p.encode_query("INSERT INTO t VALUES (1)"))
    send(r, p.encode_query('BEGIN; SAVEPOINT "s1"'))
    reply(r, p.encode_command_complete("BEGIN"), p.encode_command_complete("SAVEPOINT"), p.encode_ready("T"))
    assert r.at_rest()
    adoption, _ = r.hand_off(lambda kind: 0, lambda writes: ())
    assert adoption.state.status == "T" and adoption.ask
    send(r, p.encode_query("SET ROLE app"))  # a ROLLBACK TO may undo it: where names resolve is unknown
    reply(r, p.encode_command_complete("SET"), p.encode_ready("T"))
    assert not r.at_rest()
    send(r, p.encode_query("COMMIT"))
    reply(r, p.encode_command_complete("COMMIT"), p.encode_ready("I"))
    assert r.at_rest()
    # Tags set inside a block (a comment's) are tentative: the block stays Python's.
    t = relay(Tags("S1"))
    _join(t, p.encode_query("INSERT INTO t VALUES (1)"))
    send(t, p.encode_query("BEGIN"))
    reply(t, p.encode_command_complete("BEGIN"), p.encode_ready("T"))
    send(t, p.encode_query("/*cow_operation='o2'*/ SELECT 1"))
    assert not t.at_rest()
    untagged = relay()
    send(untagged, p.encode_query("BEGIN"))
    reply(untagged, p.encode_command_complete("BEGIN"), p.encode_ready("T"))
    assert not untagged.at_rest()  # (only sessions go in a block)


def test_the_c_relay_asks_for_a_decision_as_the_relay_would_decide() -> None:
    """A text the C relay asks about (``decide_for_fast``): the row C takes it by, and the decision in the
    table, when Python would send it as it is; None (C hands back at it) for what Python must do itself."""
    r = relay(Tags("S1"))
    _join(r, p.encode_query("INSERT INTO t VALUES (1)"))
    kinds = ["select", "insert", "transaction", "utility", "other"]

    def ask(sql: str) -> Any:
        index = kinds.index
        return r.decide_for_fast(sql, lambda kind: index(kind) if kind in kinds else None, lambda w: ()).row

    assert ask("SELECT v AS asked FROM t") == (b"QSELECT v AS asked FROM t", 0, (), False, False, -1, None)
    assert b"QSELECT v AS asked FROM t" in r.decisions.table
    row = ask("SELECT v FROM t WHERE id = 7")  # (first sight of the shape: by the text; then by the shape)
    assert row is not None and row[0] == b"QSELECT v FROM t WHERE id = 7"
    row = ask("SELECT v FROM t WHERE id = 8")
    assert row is not None and row[0] == b"qSELECT v FROM t WHERE id = \xff"
    assert ask("BEGIN") is not None
    assert ask("SET cow.session_id = 'x'") is None  # refused
    assert ask("INSERT INTO t VALUES (2) ON CONFLICT DO NOTHING") is None  # catalog dependent (rewritten)
    assert ask("/*cow_operation='o2'*/ SELECT 1") is None  # a comment may carry tags
    assert ask("SET search_path TO public") is None  # a path change
    assert ask("ALTER TABLE t ADD COLUMN w int") is None  # catalog dependent
    assert ask("SELECT 1/0") is not None  # (an error of the server's is no decision of Python's)
    assert r.to_server == [] and r.to_client == []  # nothing sent: C holds the Query
    untagged = relay()
    assert untagged.decide_for_fast("SELECT 1", lambda kind: 0, lambda w: ()) == FastAnswer(None, "untagged")


class CountingHooks(NoHooks):
    def __init__(self) -> None:
        self.lookups: list[bool] = []
        self.rewrites = 0

    def parse_cache(self, hit: bool) -> None:
        self.lookups.append(hit)

    def rewrite(self) -> None:
        self.rewrites += 1


def _asking_relay() -> tuple[Relay, CountingHooks, Any]:
    """A session's relay joined already, with the sample catalog (``issues``: a schema-qualified name is
    rewritten), and its ``decide_for_fast`` as C calls it."""
    hooks = CountingHooks()
    r = Relay(NoCatalog(), Tags("S1"), lambda: None, hooks)
    _join(r, p.encode_query("INSERT INTO t VALUES (1)"))
    r.catalog = catalogs.sample_catalog()
    kinds = ["select", "insert", "update", "transaction", "utility", "other"]

    def ask(sql: str) -> FastAnswer:
        return r.decide_for_fast(sql, lambda kind: kinds.index(kind) if kind in kinds else None, lambda w: ())

    return r, hooks, ask


def test_a_rewritten_text_is_decided_with_its_rewritten_text() -> None:
    """A Query whose verdict is rewritten and needs nothing else of Python: its row carries the text C sends,
    keyed by the exact text (another literal is another text and another rewrite), from a request and from
    the Python relay alike; the reasons Python takes a text itself label the others."""
    r, hooks, ask = _asking_relay()
    one = "SELECT title FROM public.issues WHERE id = 1"
    row = ask(one).row
    assert row is not None and row[0] == b"Q" + one.encode() and row[6] is not None
    assert row[6] == r.analysis.analyze(one, r.catalog, True).rewritten.encode()  # type: ignore[union-attr]
    two = ask("SELECT title FROM public.issues WHERE id = 2").row
    assert two is not None and two[0] == b"QSELECT title FROM public.issues WHERE id = 2"
    assert two[6] is not None and b"id = 2" in two[6]
    write = ask("UPDATE public.issues SET title = 'x' WHERE id = 3").row
    assert write is not None and write[4] is True  # (may run again: C watches the rewritten text it sends)
    # The Python relay decides a rewritten Query it sends the same way.
    text = "SELECT title FROM public.issues WHERE id = 4"
    sent = send(r, p.encode_query(text))
    assert sent == p.encode_query(r.analysis.analyze(text, r.catalog, True).rewritten or "")
    assert b"Q" + text.encode() in r.decisions.table and hooks.rewrites == 1
    reply(r, p.encode_command_complete("SELECT 0"), p.encode_ready("I"))
    # Why not: each reason once.
    upsert = "INSERT INTO issues (id) VALUES (9) ON CONFLICT DO NOTHING"
    assert ask(upsert) == FastAnswer(None, "catalog check")
    assert ask("SET search_path TO public") == FastAnswer(None, "path change")
    assert ask("SET cow.session_id = 'x'") == FastAnswer(None, "refusal")
    assert ask("/*cow_operation='o2'*/ SELECT 1") == FastAnswer(None, "comment")
    assert ask("SELECT 1 /* no tags */") == FastAnswer(None, "comment")
    assert ask("SELECT 1; SELECT 2") == FastAnswer(None, "kind multi")  # (C counts one kind per Query)


def test_a_decided_text_without_a_row_says_why() -> None:
    """A text decided but not one C may take is answered with the row's own reason (``Decisions._row``):
    a write the server is to resolve first, writes C has no slot for, a kind it does not count, a rewritten
    text longer than it sends."""
    r, _, _ = _asking_relay()
    kinds = ["select", "insert", "update", "transaction", "utility", "other"]

    def ask(sql: str, slots: Any = lambda w: ()) -> FastAnswer:
        return r.decide_for_fast(sql, lambda kind: kinds.index(kind) if kind in kinds else None, slots)

    assert ask("UPDATE t SET a = 1") == FastAnswer(None, "path unknown")  # (PathCheck)
    assert ask("UPDATE public.issues SET title = 'y'", lambda w: None) == FastAnswer(None, "writes")
    assert ask("DELETE FROM public.issues WHERE id = 1") == FastAnswer(None, "kind delete")
    long = "SELECT title FROM public.issues WHERE title = '" + "x" * MAX_QUERY + "'"
    assert ask(long) == FastAnswer(None, "rewritten too long")
    assert ask("SELECT title FROM public.issues WHERE title = 'x'").row is not None


def test_a_suspect_catalog_stops_rewritten_texts_only() -> None:
    """After a rewritten statement failed as on a stale catalog, Python checks the catalog before the next
    rewritten one: no rewritten row is answered or given at adoption; plain texts still are."""
    r, _, ask = _asking_relay()
    one = "SELECT title FROM public.issues WHERE id = 1"
    assert ask(one).row is not None
    r.gate.suspect = True
    assert ask("SELECT title FROM public.issues WHERE id = 5") == FastAnswer(None, "catalog suspect")
    assert ask("SELECT 5").row is not None
    adoption, _ = r.hand_off(lambda kind: 0, lambda w: ())
    assert adoption.decisions and all(row[6] is None for row in adoption.decisions)
    r.gate.suspect = False
    adoption, _ = r.hand_off(lambda kind: 0, lambda w: ())
    assert any(row[0] == b"Q" + one.encode() and row[6] is not None for row in adoption.decisions)


def test_a_query_answered_hand_back_counts_one_lookup() -> None:
    """The request analysed the text (a miss); Python relaying it next does not count it again as a hit."""
    r, hooks, ask = _asking_relay()
    hooks.lookups.clear()
    text = "SET search_path TO public, app"
    answer = ask(text)
    assert answer == FastAnswer(None, "path change") and hooks.lookups == [False]
    send(r, p.encode_query(text))  # (rewritten: the path goes through the layer, app_path)
    assert hooks.lookups == [False]
    reply(r, p.encode_command_complete("SET"), p.encode_ready("I"))
    send(r, p.encode_query(text))  # (a later run of it: a hit)
    assert hooks.lookups == [False, True]


def test_a_rewritten_query_handed_back_in_flight_makes_a_stale_catalog_suspect() -> None:
    """C hands back with the rewritten Query's replies owed ("q"): its stale-catalog error is Python's to
    see (Relay.failed), as for a Query Python sent rewritten."""
    for owed, suspect in (("q", True), ("Q", False)):
        r, _, _ = _asking_relay()
        r.take_back(ConnectionState("I", owed), [], [], [], resolved=False)
        reply(r, p.encode_error("42703", 'column "x" does not exist'), p.encode_ready("I"))
        assert r.gate.suspect is suspect


def _recording(tags: Tags) -> tuple[Relay, list[tuple[str, str, str | None, bytes | None, int | None]]]:
    """A relay whose ``reads`` callback collects (sql, session, operation, params, rows)."""
    seen: list[tuple[str, str, str | None, bytes | None, int | None]] = []

    def ended(read: Any, rows: int | None, seconds: float, at: float) -> None:
        assert seconds >= 0
        seen.append((read.sql, read.session, read.operation, read.params, rows))

    r = Relay(NoCatalog(), tags, lambda: None, reads=ended)
    r.tagging.applied.tags = tags  # (joined already: these tests play the server by hand)
    return r, seen


def test_recorded_reads_come_from_command_complete_on_both_protocols() -> None:
    r, seen = _recording(Tags("S1", "op1"))
    # Simple query: one whole reply in one chunk (the relay's fast reply path).
    send(r, p.encode_query("SELECT * FROM t"))
    rows = (p.message(b"T", b"\x00\x00"), p.message(b"D", b"\x00\x00"), p.message(b"D", b"\x00\x00"))
    answer = b"".join((*rows, p.encode_command_complete("SELECT 2"), p.encode_ready("I")))
    assert reply(r, answer) == answer  # the client sees the reply as it was
    # A write and a failed read record nothing.
    send(r, p.encode_query("INSERT INTO t VALUES (1)"))
    reply(r, p.encode_command_complete("INSERT 0 1"), p.encode_ready("I"))
    send(r, p.encode_query("SELECT * FROM nope"))
    reply(r, p.encode_error("42P01", 'relation "nope" does not exist'), p.encode_ready("I"))
    # Extended protocol: the Bind's parameters identify the read; replies split across chunks.
    bind = p.encode_bind("", "", ("7",))
    send(r, p.encode_parse("", "SELECT * FROM t WHERE id = $1"), bind, p.encode_execute(""), p.SYNC)
    reply(r, p.message(b"1"), p.message(b"2"), p.message(b"D", b"\x00\x00"))
    reply(r, p.encode_command_complete("SELECT 1"), p.encode_ready("I"))
    assert seen == [
        ("SELECT * FROM t", "S1", "op1", None, 2),
        ("SELECT * FROM t WHERE id = $1", "S1", "op1", bind[6:], 1),
    ]
    assert not r.replies.pending


def test_untagged_reads_and_a_relay_without_recording_report_nothing() -> None:
    r, seen = _recording(UNTAGGED)
    send(r, p.encode_query("SELECT 1"))
    reply(r, *OK_SELECT, p.encode_ready("I"))
    assert seen == []
    plain = relay()
    send(plain, p.encode_query("SELECT 1"))
    assert plain.trace.reads is None and plain.replies.pending[0].read is None


SECRET = "unit-test-binding-secret"
BIND_SQL = "SELECT cow.bind_session($1, $2, $3)"


def _utility(sql: str) -> bytes:
    """The messages of one of the proxy's own utility statements in a join's block."""
    return b"".join(
        (
            p.encode_close("S", WRITABLE_STATEMENT),
            p.encode_parse(WRITABLE_STATEMENT, sql),
            p.encode_bind(WRITABLE_STATEMENT, WRITABLE_STATEMENT, ()),
            p.encode_execute(WRITABLE_STATEMENT),
            p.encode_close("P", WRITABLE_STATEMENT),
            p.encode_close("S", WRITABLE_STATEMENT),
        )
    )


def _utility_replies(tag: str) -> tuple[bytes, ...]:
    return (
        p.message(b"3"),
        p.message(b"1"),
        p.message(b"2"),
        p.encode_command_complete(tag),
        *[p.message(b"3")] * 2,
    )


def one_row_replies(row: bytes) -> tuple[bytes, ...]:
    """The server's replies to a one-row statement of the proxy's (Close, Parse, Bind, Execute, Close)."""
    return (
        p.message(b"3"),
        p.message(b"1"),
        p.message(b"2"),
        row,
        p.encode_command_complete("SELECT 1"),
        p.message(b"3"),
    )


JOIN_REPLIES = one_row_replies(p.message(b"D", b"\x00\x01\x00\x00\x00\x02S1"))
NOTICE_25P01 = p.message(b"N", b"SWARNING\0VWARNING\0C25P01\0Mthere is no transaction in progress\0\0")


def test_a_bind_between_transactions_runs_in_a_read_write_block_of_its_own() -> None:
    """A client's transactions may be read-only by default: the bind, which records the binding, runs in
    BEGIN READ WRITE ... COMMIT of the proxy's own; nothing of it (a notice neither) reaches the client,
    and the client's own notices do."""
    r = Relay(NoCatalog(), Tags("S1", "op"), lambda: None, bind_secret=SECRET)
    query = p.encode_query("SELECT * FROM t")
    assert send(r, query) == b"".join(
        (
            _utility("BEGIN READ WRITE"),
            p.encode_close("S", INJECT_STATEMENT),
            p.encode_parse(INJECT_STATEMENT, BIND_SQL),
            p.encode_bind(INJECT_STATEMENT, INJECT_STATEMENT, ("S1", "op", SECRET)),
            p.encode_execute(INJECT_STATEMENT),
            p.encode_close("P", INJECT_STATEMENT),
            _utility("COMMIT"),
            p.encode_close("S", INJECT_STATEMENT),
            p.SYNC,
        )
    )
    replies = (
        *_utility_replies("BEGIN"),
        NOTICE_25P01,  # (a notice among the proxy's replies is the proxy's: dropped)
        *JOIN_REPLIES,
        *_utility_replies("COMMIT"),
        p.message(b"3"),
        p.encode_ready("I"),
    )
    assert reply(r, *replies) == b""
    assert b"".join(r.to_server) == query and r.tagging.applied.tags == Tags("S1", "op")
    r.to_server.clear()
    answer = (NOTICE_25P01, *OK_SELECT, p.encode_ready("I"))
    assert reply(r, *answer) == b"".join(answer)  # the client's own notice arrives


def test_a_failed_bind_rolls_its_block_back_before_the_statement_is_refused() -> None:
    r = Relay(NoCatalog(), Tags("S1"), lambda: None, bind_secret=SECRET)
    send(r, p.encode_query("SELECT * FROM t"))
    wrong = p.encode_error("28P01", "cowproxy: bind_session: wrong binding secret")
    failed = (*_utility_replies("BEGIN"), *JOIN_REPLIES[:3], wrong, p.encode_ready("E"))
    assert reply(r, *failed) == b""
    assert b"".join(r.to_server) == p.encode_query("ROLLBACK") and r.holding  # the block first
    r.to_server.clear()
    assert reply(r, p.encode_command_complete("ROLLBACK"), p.encode_ready("I")) == b""
    assert b"".join(r.to_server) == p.encode_query(REFUSED_SQL)
    syntax = p.encode_error("42601", 'syntax error at or near "cowproxy"')
    assert reply(r, syntax, p.encode_ready("I")) == wrong + p.encode_ready("I")
    assert r.replies.status == "I" and r.tagging.applied.tags == Tags()


def test_a_bind_inside_the_clients_block_or_batch_has_no_block_of_its_own() -> None:
    """Inside the client's transaction the bind is part of it (a BEGIN would not be the proxy's to end)."""
    r = Relay(NoCatalog(), Tags("S1"), lambda: None, bind_secret=SECRET)
    r.tagging.applied.tags = Tags("S1")
    r.replies.status = "T"
    upstream = send(r, p.encode_query("/*cow_operation='o2'*/ SELECT 1"))
    assert upstream.startswith(
        p.encode_close("S", INJECT_STATEMENT) + p.encode_parse(INJECT_STATEMENT, BIND_SQL)
    )
    assert b"BEGIN" not in upstream and b"COMMIT" not in upstream
    r = Relay(NoCatalog(), Tags("S1"), lambda: None, bind_secret=SECRET)
    first = (p.encode_parse("", "SELECT 1"), p.encode_bind("", "", ()), p.encode_execute())
    r.tagging.applied.tags = UNTAGGED
    r.tagging.startup = UNTAGGED
    assert send(r, *first) == b"".join(first)  # untagged: no join; the batch is open
    upstream = send(r, p.encode_parse("", "/*cow_session='S1'*/ SELECT 2"))
    assert upstream.startswith(p.encode_close("S", INJECT_STATEMENT)) and b"BEGIN" not in upstream


def test_in_a_failed_block_a_transaction_statement_goes_without_a_join() -> None:
    """After an error in a block the tags are unknown; a join would fail (25P02) and refuse the ROLLBACK
    with it, for good. ROLLBACK (simple or extended) goes as it is; the next statement joins."""
    for messages in (
        (p.encode_query("ROLLBACK"),),
        (p.encode_parse("", "ROLLBACK"), p.encode_bind("", "", ()), p.encode_execute(), p.SYNC),
    ):
        r = relay(Tags("S1"))
        r.tagging.applied.tags = None
        r.replies.status = "E"
        assert send(r, *messages) == b"".join(messages)
        assert not r.holding
    r = relay(Tags("S1"))
    r.tagging.applied.tags = None
    r.replies.status = "E"
    upstream = send(r, p.encode_query("ROLLBACK; INSERT INTO t VALUES (1)"))  # not a lone one: joins first
    assert upstream.startswith(JOIN_START)


def _start_batch(r: Relay, read_write: bool) -> bytes:
    r.start(read_write=read_write)
    out = b"".join(r.to_server)
    r.to_server.clear()
    return out


def test_a_bind_at_start_of_a_read_write_connection_needs_no_block() -> None:
    """At start the server has reported default_transaction_read_only: when it is off, the bind runs in its
    batch's own transaction (no BEGIN READ WRITE ... COMMIT), and the join holds only once that batch has
    ended well (a failure after it, in the same batch, rolls it back: the tags are then unknown)."""
    blocked = _start_batch(Relay(NoCatalog(), Tags("S1"), lambda: None, bind_secret=SECRET), False)
    assert blocked.startswith(_utility("BEGIN READ WRITE")) and _utility("COMMIT") in blocked
    r = Relay(NoCatalog(), Tags("S1"), lambda: None, bind_secret=SECRET)
    plain = _start_batch(r, True)
    assert b"BEGIN" not in plain and b"COMMIT" not in plain
    assert plain.startswith(
        p.encode_close("S", INJECT_STATEMENT) + p.encode_parse(INJECT_STATEMENT, BIND_SQL)
    )
    assert blocked.replace(_utility("BEGIN READ WRITE"), b"").replace(_utility("COMMIT"), b"") == plain
    probe_failed = p.encode_error("57014", "canceling statement due to user request")
    assert reply(r, *JOIN_REPLIES, p.message(b"3"), p.message(b"1"), p.message(b"2"), probe_failed) == b""
    assert r.tagging.applied.tentative  # (not for good before the batch ends)
    assert reply(r, p.encode_ready("I")) == b""
    assert r.tagging.applied.tags is None  # rolled back with the batch: join again before the statement
    r = Relay(NoCatalog(), Tags("S1"), lambda: None, bind_secret=SECRET)
    _start_batch(r, True)
    probe = one_row_replies(p.message(b"D", b"\x00\x03\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00\x00\x01t"))
    assert reply(r, *JOIN_REPLIES, *probe, p.message(b"3"), p.encode_ready("I")) == b""
    assert r.tagging.applied.tags == Tags("S1") and not r.tagging.applied.tentative
    assert r.path.clean
