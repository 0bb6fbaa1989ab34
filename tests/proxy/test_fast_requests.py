"""A session's Query with no decision on the C relay: C holds it, stops reading the client and asks Python
for the text's decision (a request); Python answers with the row C takes it by, or "hand back" (docs/proxy.md,
"Sessions on the fast relay"). On literal bytes: the C engine between two socket pairs, each end read and
written by the test, and Python's side (``Relay.decide_for_fast``) answering as the server does."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from proxy import protocol as p
from proxy.fastrelay import AVAILABLE, MAX_QUERY, UNAVAILABLE, FastRelay, Handback, Request
from proxy.handoff import Adoption, Decision
from proxy.rerun import RERUN_HINT
from tests.fix_proxy import RunningProxy
from tests.proxy.fast_pairs import SocketPairs
from tests.proxy.test_adversity import RawClient, dbname, wait_for
from tests.proxy.test_fast_relay import on_fast, relays, scrape
from tests.proxy.test_fast_sessions import TABLE_LIST
from tests.proxy.test_tagging import base_customers, changes

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not AVAILABLE, reason=f"{UNAVAILABLE}"),
]

COLD = "SELECT v FROM t WHERE id = 7"
KNOWN = "SELECT 1"
READY_I = p.encode_ready("I")
NOTICE = p.message(b"N", b"SNOTICE\0C00000\0Mhello\0\0")


class Engine(SocketPairs):
    """One session's connection on a C engine between two socket pairs (``client``, ``server``: the test's
    ends), adopted with the decision of ``KNOWN`` and asking for the others."""

    def __init__(
        self, fast: FastRelay, conn_id: int = 1, ask: bool = True, more: tuple[Decision, ...] = ()
    ) -> None:
        self.fast = fast
        decisions = [self.row(KNOWN), *more]
        super().__init__(fast, conn_id, Adoption([], [], True, decisions, False, False, ask=ask))

    def row(
        self, text: str, kind: str = "select", rewritten: str | None = None, rerun: bool = False
    ) -> Decision:
        index = self.fast.kind_index(kind)
        assert index is not None
        sent = None if rewritten is None else rewritten.encode()
        return (b"Q" + text.encode(), index, (), False, rerun, -1, sent)

    def upstream_query(self, sql: str) -> bytes:
        """Send ``sql`` as the client's Query; what reaches the server."""
        self.client.sendall(p.encode_query(sql))
        return self.read(self.server)

    def requests(self, n: int = 1) -> list[Request]:
        """The next ``n`` requests (the engine's thread makes them)."""
        got: list[Request] = []
        deadline = time.monotonic() + 5
        while len(got) < n and time.monotonic() < deadline:
            got += self.fast.take_requests()
            time.sleep(0.005)
        assert len(got) == n, got
        return got

    def handbacks(self) -> list[Handback]:
        got: list[Handback] = []
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            got = self.fast.take_handbacks()
            time.sleep(0.005)
        return got


@pytest.fixture
def engine(fast: FastRelay) -> Iterator[Engine]:
    fast.take_requests()
    fast.take_handbacks()
    e = Engine(fast)
    yield e
    e.close()


def test_a_cold_query_is_asked_and_taken_by_the_answer(fast: FastRelay, engine: Engine) -> None:
    before = fast.counts()
    cold = p.encode_query(COLD)
    engine.client.sendall(cold + p.encode_query(KNOWN))  # (the known one pipelined behind it waits too)
    [(conn_id, request, text)] = engine.requests()
    assert (conn_id, text) == (1, COLD.encode())
    engine.server.settimeout(0.3)
    with pytest.raises(TimeoutError):
        engine.server.recv(100)  # nothing goes up before the answer
    assert fast.answer(1, request, engine.row(COLD)) is True
    assert engine.read(engine.server) == cold + p.encode_query(KNOWN)  # in order, as sent
    after = fast.counts()
    # Both counted as the session's statements on C; the asked one is no decision hit (Python counted it).
    assert after.statements[("select", True)] - before.statements.get(("select", True), 0) == 2
    assert after.decision_hits - before.decision_hits == 1
    assert fast.answer(1, request, engine.row(COLD)) is False  # answered once: a second answer is void
    # The answer's decision holds for the rest of the stay: no second request.
    engine.client.sendall(cold)
    assert engine.read(engine.server) == cold
    assert fast.take_requests() == []


def test_a_decision_by_shape_answers_every_text_of_the_shape(fast: FastRelay, engine: Engine) -> None:
    engine.client.sendall(p.encode_query("SELECT v FROM t WHERE id = 8"))
    [(_, request, _)] = engine.requests()
    key = fast.shape_key(b"SELECT v FROM t WHERE id = 8")
    assert key is not None
    index = fast.kind_index("select")
    assert index is not None
    assert fast.answer(1, request, (b"q" + key, index, (), False, False, -1, None))
    assert engine.read(engine.server) == p.encode_query("SELECT v FROM t WHERE id = 8")
    engine.client.sendall(p.encode_query("SELECT v FROM t WHERE id = 9"))
    assert engine.read(engine.server) == p.encode_query("SELECT v FROM t WHERE id = 9")
    assert fast.take_requests() == []


def test_hand_back_answer_gives_the_query_back_untaken(fast: FastRelay, engine: Engine) -> None:
    cold = p.encode_query(COLD)
    engine.client.sendall(cold)
    [(_, request, _)] = engine.requests()
    assert fast.answer(1, request, None) is True
    [back] = engine.handbacks()
    assert (back.reason, chr(back.untaken), back.data) == ("client message", "Q", cold)
    assert back.state.status == "I" and back.state.owed == ""


def test_hand_back_waits_for_the_replies_in_flight(fast: FastRelay, engine: Engine) -> None:
    """A known Query in flight ahead of the cold one: the hand-back comes at its ReadyForQuery, as it
    would without asking."""
    known, cold = p.encode_query(KNOWN), p.encode_query(COLD)
    engine.client.sendall(known + cold)
    [(_, request, _)] = engine.requests()
    assert engine.read(engine.server) == known
    assert fast.answer(1, request, None) is True
    assert fast.take_handbacks() == []  # (its reply is owed)
    reply = p.message(b"C", b"SELECT 1\0") + READY_I
    engine.server.sendall(reply)
    assert engine.read(engine.client) == reply
    [back] = engine.handbacks()
    assert (back.reason, back.data, back.state.owed) == ("client message", cold, "")


def test_server_messages_pass_while_a_request_is_pending(fast: FastRelay, engine: Engine) -> None:
    """An async NoticeResponse, a ParameterStatus or the replies to a query in flight reach the client while
    its next Query waits for its answer."""
    known, cold = p.encode_query(KNOWN), p.encode_query(COLD)
    engine.client.sendall(known + cold)
    [(_, request, _)] = engine.requests()
    assert engine.read(engine.server) == known
    status = p.message(b"S", b"application_name\0x\0")
    reply = NOTICE + status + p.message(b"C", b"SELECT 1\0") + p.encode_ready("T")
    engine.server.sendall(reply)
    assert engine.read(engine.client) == reply
    assert fast.answer(1, request, engine.row(COLD)) is True
    assert engine.read(engine.server) == cold
    assert fast.states()[1] == ("T", 1)


def test_a_client_closing_while_a_request_is_pending(fast: FastRelay, engine: Engine) -> None:
    """The Query is still taken by the answer (the client sent it whole); then C sees the end of the client
    and hands the connection back, once."""
    cold = p.encode_query(COLD)
    engine.client.sendall(cold)
    [(_, request, _)] = engine.requests()
    engine.client.shutdown(socket.SHUT_WR)
    assert fast.answer(1, request, engine.row(COLD)) is True
    assert engine.read(engine.server) == cold
    [back] = engine.handbacks()
    assert back.reason == "client closed" and back.data == b""


def test_a_recall_while_a_request_is_pending_voids_it(fast: FastRelay, engine: Engine) -> None:
    """At an idle point the recall hands the connection back at once with the Query untaken; the answer
    that comes after is void, so the Query runs once, in Python."""
    cold = p.encode_query(COLD)
    engine.client.sendall(cold)
    [(_, request, _)] = engine.requests()
    back = fast.recall(1)
    assert back is not None and (back.reason, back.data) == ("recall", cold)
    assert fast.answer(1, request, engine.row(COLD)) is False
    engine.server.settimeout(0.3)
    with pytest.raises(TimeoutError):
        engine.server.recv(100)


def test_an_answer_for_another_stay_is_void(fast: FastRelay) -> None:
    """A request's number names one stay's Query: an answer to a request of an earlier stay of the same
    connection id does nothing to the next."""
    fast.take_requests()
    first = Engine(fast, conn_id=5)
    first.client.sendall(p.encode_query(COLD))
    [(_, old, _)] = first.requests()
    assert fast.recall(5) is not None
    first.close()
    second = Engine(fast, conn_id=5)
    try:
        second.client.sendall(p.encode_query(COLD))
        [(_, new, _)] = second.requests()
        assert new != old
        assert fast.answer(5, old, second.row(COLD)) is False
        assert fast.answer(5, new, second.row(COLD)) is True
        assert second.read(second.server) == p.encode_query(COLD)
    finally:
        second.close()


def test_a_bad_row_is_answered_as_hand_back(fast: FastRelay, engine: Engine) -> None:
    engine.client.sendall(p.encode_query(COLD))
    [(_, request, _)] = engine.requests()
    with pytest.raises(ValueError, match="bad answered decision"):
        fast.answer(1, request, (b"P" + COLD.encode(), 0, (), False, False, -1, None))
    [back] = engine.handbacks()
    assert back.reason == "client message"


def test_an_answer_that_does_not_match_the_text_hands_back(fast: FastRelay, engine: Engine) -> None:
    """An answer whose decision C cannot find the held text by: C hands back at that Query instead of asking
    again (no request loop)."""
    cold = p.encode_query(COLD)
    engine.client.sendall(cold)
    [(_, request, _)] = engine.requests()
    assert fast.answer(1, request, engine.row("SELECT something else")) is True
    [back] = engine.handbacks()
    assert (back.reason, back.data) == ("client message", cold)
    assert fast.take_requests() == []


def test_without_ask_a_cold_query_hands_back_at_once(fast: FastRelay) -> None:
    fast.take_requests()
    e = Engine(fast, conn_id=7, ask=False)
    try:
        e.client.sendall(p.encode_query(COLD))
        [back] = e.handbacks()
        assert back.reason == "client message" and fast.take_requests() == []
    finally:
        e.close()


# ---- through the proxy, against PostgreSQL


def test_a_session_block_stays_on_the_c_relay_through_cold_texts(proxy: RunningProxy, layer_db: str) -> None:
    """Inside a block C entered, every new plain text is asked and taken; a refusal is handed back, refused by
    Python as before, and its block fails as PostgreSQL's would."""
    c = RawClient(proxy.host, proxy.port, dbname(layer_db), options="-c cow.session_id=fq-block")
    assert c.query("SELECT 1")[-1] == (b"Z", b"I")
    assert on_fast(proxy)
    before = scrape(proxy)

    def delta(name: str) -> float:
        return scrape(proxy).get(name, 0.0) - before.get(name, 0.0)

    assert c.query("BEGIN")[-1] == (b"Z", b"T")
    for i in range(5):
        replies = c.query(f"SELECT email AS fq_{i} FROM customers WHERE id = 1")
        assert replies[-1] == (b"Z", b"T") and replies[-2][0] == b"C"
    assert relays(proxy) == {"fast": 1}
    assert delta('cowproxy_fast_requests_total{answer="decision"}') >= 5
    replies = c.query("SET cow.session_id TO 'fq-elsewhere'")
    assert replies[0][0] == b"E" and b"42501" in replies[0][1] and replies[-1] == (b"Z", b"E")
    assert c.query("ROLLBACK")[-1] == (b"Z", b"I")
    assert wait_for(lambda: relays(proxy) == {"fast": 1}, 5)
    c.sock.close()


def test_a_client_closing_while_its_query_is_asked(proxy: RunningProxy, layer_db: str) -> None:
    """A client that sends a new text and closes at once: its write lands once in its session, none in the
    base table, and the connection ends."""
    c = RawClient(proxy.host, proxy.port, dbname(layer_db), options="-c cow.session_id=fq-close")
    assert c.query("SELECT 1")[-1] == (b"Z", b"I")
    assert on_fast(proxy)
    before = scrape(proxy)
    c.sock.sendall(p.encode_query("INSERT INTO customers (email, name) VALUES ('fq-close@x', 'x')"))
    c.sock.close()
    assert wait_for(lambda: not proxy.server.connections, 5)
    asked = sum(
        scrape(proxy).get(f'cowproxy_fast_requests_total{{answer="{a}"}}', 0.0)
        - before.get(f'cowproxy_fast_requests_total{{answer="{a}"}}', 0.0)
        for a in ("decision", "void")
    )
    assert asked == 1
    assert wait_for(lambda: [row[2] for row in changes(layer_db, "fq-close")] == ["fq-close@x"], 5)
    assert "fq-close@x" not in base_customers(layer_db)


# ---- rewritten texts (decisions.rewritten_text): C sends Python's rewritten text in place of the client's

QUALIFIED = "SELECT v FROM public.t WHERE id = 7"
OVERLAY = "SELECT v FROM cow_overlay_public.t WHERE id = 7"  # (any text: C sends what it is given)
STALE = p.encode_error("42703", 'column "v" does not exist')


def test_a_rewritten_answer_sends_the_rewritten_text(fast: FastRelay, engine: Engine) -> None:
    """The answer's rewritten text goes up in place of the client's, counted as a rewrite (not a decision
    hit: Python counted the analysis), and holds for the rest of the stay."""
    before = fast.counts()
    engine.client.sendall(p.encode_query(QUALIFIED) + p.encode_query(KNOWN))
    [(_, request, text)] = engine.requests()
    assert text == QUALIFIED.encode()
    assert fast.answer(1, request, engine.row(QUALIFIED, rewritten=OVERLAY)) is True
    assert engine.read(engine.server) == p.encode_query(OVERLAY) + p.encode_query(KNOWN)
    engine.client.sendall(p.encode_query(QUALIFIED))
    assert engine.read(engine.server) == p.encode_query(OVERLAY)
    after = fast.counts()
    assert after.rewrites - before.rewrites == 2
    assert after.decision_hits - before.decision_hits == 2  # (KNOWN, and the second QUALIFIED)
    assert after.statements[("select", True)] - before.statements.get(("select", True), 0) == 3
    assert fast.take_requests() == []


def test_a_rewritten_text_is_never_taken_by_a_shape(fast: FastRelay, engine: Engine) -> None:
    """A rewritten row may come keyed by the exact text only (the rewrite is made of its literals), and only
    for a Query with no read record; anything else is a bad row, answered as hand back."""
    engine.client.sendall(p.encode_query(QUALIFIED))
    [(_, request, _)] = engine.requests()
    key = fast.shape_key(QUALIFIED.encode())
    assert key is not None
    with pytest.raises(ValueError, match="bad rewritten text"):
        fast.answer(1, request, (b"q" + key, 0, (), False, False, -1, OVERLAY.encode()))
    [back] = engine.handbacks()
    assert (back.reason, back.data) == ("client message", p.encode_query(QUALIFIED))
    client, server = socket.socketpair()
    try:
        for bad in (
            (b"P" + QUALIFIED.encode(), 0, (), False, False, -1, OVERLAY.encode()),
            (b"Q" + QUALIFIED.encode(), 0, (), True, False, -1, OVERLAY.encode()),  # (a recorded read)
            (b"Q" + QUALIFIED.encode(), 0, (), False, False, -1, b"SELECT \0 1"),
            (b"Q" + QUALIFIED.encode(), 0, (), False, False, -1, b"x" * MAX_QUERY),
            (b"Q" + QUALIFIED.encode(), 0, (), False, False, -1, "text"),
        ):
            adoption = Adoption([], [], True, [bad], False, False, ask=True)  # type: ignore[list-item]
            with pytest.raises(ValueError, match="bad rewritten text"):
                fast.adopt(9, client.fileno(), server.fileno(), p.PG_MAX_MESSAGE, adoption)
    finally:
        client.close()
        server.close()


def _rewritten_engine(fast: FastRelay, conn_id: int = 3, rerun: bool = False) -> Engine:
    """A session's connection adopted with the rewritten decision of ``QUALIFIED`` and not asking."""
    fast.take_requests()
    fast.take_handbacks()
    index = fast.kind_index("update" if rerun else "select")
    assert index is not None
    row = (b"Q" + QUALIFIED.encode(), index, (), False, rerun, -1, OVERLAY.encode())
    return Engine(fast, conn_id=conn_id, ask=False, more=(row,))


def test_a_rewritten_text_that_fails_as_on_a_stale_catalog_marks_it_suspect(fast: FastRelay) -> None:
    """As the promotions' Parses do (Relay.failed): the next rewritten text is Python's (it checks the
    catalog first), a plain decided text still C's; the hand-back says suspect."""
    e = _rewritten_engine(fast)
    try:
        assert e.upstream_query(QUALIFIED) == p.encode_query(OVERLAY)
        failed = STALE + READY_I
        e.server.sendall(failed)
        assert e.read(e.client) == failed  # (the client gets the server's error as it is)
        assert e.upstream_query(KNOWN) == p.encode_query(KNOWN)  # (not rewritten: still taken)
        e.server.sendall(p.message(b"C", b"SELECT 1\0") + READY_I)
        e.read(e.client)
        e.client.sendall(p.encode_query(QUALIFIED))
        [back] = e.handbacks()
        assert (back.reason, back.data, back.promotions.suspect) == (
            "client message",
            p.encode_query(QUALIFIED),
            True,
        )
    finally:
        e.close()


def test_another_error_of_a_rewritten_text_is_no_stale_catalog(fast: FastRelay) -> None:
    e = _rewritten_engine(fast)
    try:
        assert e.upstream_query(QUALIFIED) == p.encode_query(OVERLAY)
        e.server.sendall(p.encode_error("22012", "division by zero") + READY_I)
        e.read(e.client)
        assert e.upstream_query(QUALIFIED) == p.encode_query(OVERLAY)  # (taken again)
        e.server.sendall(p.message(b"C", b"SELECT 1\0") + READY_I)
        e.read(e.client)
        back = fast.recall(3)
        assert back is not None and not back.promotions.suspect
    finally:
        e.close()


def test_a_rewritten_query_in_flight_is_handed_back_as_rewritten(fast: FastRelay) -> None:
    """A hand-back with the rewritten Query's replies still owed names it "q": Python's entry for it is
    rewritten too, so its stale-catalog error makes Python's gate suspect (replies.ReplyQueue.resume)."""
    e = _rewritten_engine(fast)
    try:
        # (A batch opened behind it, then a Parse C has no decision for: handed back at once, mid-batch.)
        bind = p.encode_bind("", "x", ())
        e.client.sendall(p.encode_query(QUALIFIED) + bind + p.encode_parse("", COLD))
        assert e.read(e.server) == p.encode_query(OVERLAY) + bind
        [back] = e.handbacks()
        assert (back.state.owed, back.data) == ("qB", p.encode_parse("", COLD))
    finally:
        e.close()


def test_a_rewritten_write_that_may_run_again_is_watched_as_sent(fast: FastRelay) -> None:
    """Alone in its implicit transaction, a rewritten text that may get the layer's row-changed 40001 is
    watched as it went up: the hand-back's batch is the rewritten Query, which Python's plan sends again
    (rerun.Reruns.resume), and the error stays with Python."""
    e = _rewritten_engine(fast, conn_id=4, rerun=True)
    try:
        assert e.upstream_query(QUALIFIED) == p.encode_query(OVERLAY)
        error = p.encode_error("40001", "row changed", extra=(("H", RERUN_HINT),))
        e.server.sendall(error + READY_I)
        [back] = e.handbacks()
        assert (back.reason, back.batch, back.state.owed) == ("rerun", p.encode_query(OVERLAY), "q")
        assert back.server == error + READY_I
    finally:
        e.close()


# An M2M add as Django sends it (``bulk_create(ignore_conflicts=True)``).
M2M_ADD = "INSERT INTO t (id, v) VALUES (41, 'a'), (42, 'b') ON CONFLICT DO NOTHING"


def test_rewritten_texts_in_a_session_block_stay_on_the_c_relay(relay_pair: Any) -> None:
    """In a block, the table list and a schema-qualified read (rewritten, nothing else of Python's) are asked
    and sent rewritten by C, the connection staying there; the M2M add (ON CONFLICT: the catalog is checked
    before each one) is handed back with its reason counted. Every reply equals the Python relay's."""
    dsn, fast, slow = relay_pair
    read = "SELECT v FROM public.t WHERE id = 3"
    texts = ["BEGIN", TABLE_LIST, read, TABLE_LIST, M2M_ADD, M2M_ADD, "COMMIT"]
    replies = []
    for proxy, side in ((slow, "s"), (fast, "f")):
        c = RawClient(proxy.host, proxy.port, dbname(dsn), options=f"-c cow.session_id=rw-{side}")
        try:
            assert c.query("SELECT 1")[-1] == (b"Z", b"I")
            if proxy is fast:
                assert on_fast(proxy)
                before, counts = scrape(proxy), proxy.server.fast.counts()
            got = []
            for i, text in enumerate(texts):
                got.append(c.query(text))
                if proxy is fast and i < 4:
                    assert relays(proxy) == {"fast": 1}, text  # (no hand-back: the rewritten ones stayed)
            replies.append(got)
            if proxy is fast:
                after = scrape(proxy)
                rewrites = proxy.server.fast.counts().rewrites - counts.rewrites
                reason = 'cowproxy_fast_request_handbacks_total{reason="catalog check"}'
                asked = 'cowproxy_fast_requests_total{answer="decision"}'
        finally:
            c.sock.close()
    assert replies[1] == replies[0]
    [table_list] = [r for r in replies[0][1] if r[0] == b"D" and b"\0\0\0\x01t" in r[1]] or [None]
    assert table_list is not None  # (t is listed, once: not its overlay)
    assert replies[0][4][0] == (b"C", b"INSERT 0 2\0") and replies[0][5][0] == (b"C", b"INSERT 0 0\0")
    assert rewrites == 3  # (the table list twice: the second by the answer's decision; the read)
    assert after.get(asked, 0) - before.get(asked, 0) == 4  # (BEGIN, the list once, the read, COMMIT)
    assert after.get(reason, 0) - before.get(reason, 0) >= 1
