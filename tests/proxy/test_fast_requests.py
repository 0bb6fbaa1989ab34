"""A session's Query with no decision on the C relay: C holds it, stops reading the client and asks Python
for the text's decision (a request); Python answers with the row C takes it by, or "hand back" (docs/proxy.md,
"Sessions on the fast relay"). On literal bytes: the C engine between two socket pairs, each end read and
written by the test, and Python's side (``Relay.decide_for_fast``) answering as the server does."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from proxy import protocol as p
from proxy.fastrelay import AVAILABLE, UNAVAILABLE, FastRelay, Handback, Request
from proxy.handoff import Adoption, Decision
from tests.fix_proxy import RunningProxy
from tests.proxy.fast_pairs import SocketPairs
from tests.proxy.test_adversity import RawClient, dbname, wait_for
from tests.proxy.test_fast_relay import on_fast, relays, scrape
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

    def __init__(self, fast: FastRelay, conn_id: int = 1, ask: bool = True) -> None:
        self.fast = fast
        super().__init__(fast, conn_id, Adoption([], [], True, [self.row(KNOWN)], False, False, ask=ask))

    def row(self, text: str, kind: str = "select") -> Decision:
        index = self.fast.kind_index(kind)
        assert index is not None
        return (b"Q" + text.encode(), index, (), False, False, -1)

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
    assert fast.answer(1, request, (b"q" + key, index, (), False, False, -1))
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
        fast.answer(1, request, (b"P" + COLD.encode(), 0, (), False, False, -1))
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
