"""A session's unnamed reads that the proxy runs as its own named statements (proxy/unnamed.py), on the C
relay: C sends, by Python's decision, exactly what Promotions has the Python relay send, and hands the
promotions back as it left them. First on literal bytes (the C engine between two socket pairs, each end
read and written by the test), then through both relays against PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import psycopg
import pytest

from proxy import protocol as p
from proxy.fastrelay import AVAILABLE, UNAVAILABLE, FastRelay, Handback
from proxy.handoff import Adoption, Decision, Known, Promotion, PromotionsBack, PromotionsGiven
from proxy.unnamed import MAX_PROMOTED, PROMOTED_PREFIX, decision_key, types_bytes
from tests.fix_proxy import RunningProxy
from tests.proxy.fast_pairs import SocketPairs
from tests.proxy.test_adversity import RawClient, dbname, wait_for
from tests.proxy.test_fast_relay import relays

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not AVAILABLE, reason=f"{UNAVAILABLE}"),
]

TEXT = "SELECT v FROM t WHERE id = $1"
REWRITTEN = "SELECT v FROM ONLY t WHERE id = $1 /* rewritten */"  # (any text: C sends what it is given)
TYPES = (23,)
NAME = f"{PROMOTED_PREFIX}3"


class Engine(SocketPairs):
    """One connection on a C engine between two socket pairs: ``client`` and ``server`` are the test's
    ends (what the client sends and reads; what PostgreSQL would read and send)."""

    def __init__(
        self,
        fast: FastRelay,
        decisions: list[Any],
        promotions: tuple[list[Promotion], int, int, int, int],
        statements: list[Known] | None = None,
    ) -> None:
        adoption = Adoption(
            statements or [], [], True, decisions, False, False, promotions=PromotionsGiven(*promotions)
        )
        super().__init__(fast, 1, adoption)

    def upstream(self, data: bytes) -> bytes:
        """Send ``data`` as the client; what reaches the server (the same length is expected at least)."""
        self.client.sendall(data)
        return self.read(self.server)

    def downstream(self, data: bytes) -> bytes:
        self.server.sendall(data)
        return self.read(self.client)

    def handback(self) -> PromotionsBack:
        """The promotions as C hands them back (the connection at an idle point)."""
        back: Handback | None = self.fast.recall(1)
        assert back is not None, "not at an idle point"
        return back.promotions


def _decision(fast: FastRelay, promotion: int = 0) -> Decision:
    kind = fast.kind_index("select")
    assert kind is not None
    return (decision_key(TEXT, TYPES), kind, (), False, False, promotion, None)


def _engine(
    fast: FastRelay, *, number: int = 3, prepared: bool = True, made: int = 3, alias: int = 0
) -> Engine:
    promotion = (REWRITTEN.encode(), types_bytes(TYPES), number, prepared)
    return Engine(
        fast,
        statements=[(b"", 0, fast.kind_index("select") or 0, False, (), False, False)] if alias else [],
        decisions=[_decision(fast)],
        promotions=([promotion], made, MAX_PROMOTED, alias, 0 if alias else -1),
    )


CLIENT_PARSE = p.encode_parse("", TEXT, TYPES)
BIND = p.encode_bind("", "", ("1",))
DESCRIBE_S = p.message(b"D", b"S\0")
EXECUTE = p.encode_execute("")
READY = p.encode_ready("I")
REPLIES = b"1\0\0\0\x04" + b"2\0\0\0\x04" + b"n\0\0\0\x04" + p.encode_command_complete("SELECT 0") + READY


def test_a_prepared_promotion_sends_an_empty_parse_and_renames_bind_and_describe(fast: FastRelay) -> None:
    e = _engine(fast)
    try:
        sent = e.upstream(CLIENT_PARSE + BIND + DESCRIBE_S + EXECUTE + p.SYNC)
        # As Relay does: Parse("", "") in place of the client's, the Bind and Describe of the proxy's name.
        assert sent == (
            p.encode_parse("", "")
            + p.rename_bind_statement(BIND[5:], NAME)
            + p.message(b"D", b"S" + NAME.encode() + b"\0")
            + EXECUTE
            + p.SYNC
        )
        assert e.downstream(REPLIES) == REPLIES  # the client's replies, as the server sends them
        back = e.handback()
        assert (back.states, back.made, back.deallocations, back.suspect, back.alias) == (
            [(3, True)],
            3,
            0,
            False,
            3,
        )
    finally:
        e.close()


def test_the_first_time_a_parse_of_a_new_name_with_the_rewritten_text(fast: FastRelay) -> None:
    e = _engine(fast, number=0, prepared=False, made=4)
    try:
        sent = e.upstream(CLIENT_PARSE + BIND + EXECUTE + p.SYNC)
        name = f"{PROMOTED_PREFIX}5"
        assert sent == p.encode_parse(name, REWRITTEN, TYPES) + p.rename_bind_statement(BIND[5:], name) + (
            EXECUTE + p.SYNC
        )
        e.downstream(b"1\0\0\0\x04" + b"2\0\0\0\x04" + p.encode_command_complete("SELECT 0") + READY)
        # Prepared now: the next Parse of the text is the empty one.
        assert e.upstream(CLIENT_PARSE + p.SYNC) == p.encode_parse("", "") + p.SYNC
        e.downstream(b"1\0\0\0\x04" + READY)
        back = e.handback()
        assert (back.states, back.made, back.alias) == ([(5, True)], 5, 5)
    finally:
        e.close()


def test_a_failed_promotion_parse_is_not_prepared(fast: FastRelay) -> None:
    e = _engine(fast, number=0, prepared=False, made=0)
    try:
        e.upstream(CLIENT_PARSE + BIND + EXECUTE + p.SYNC)
        error = p.encode_error("42P01", 'relation "t" does not exist')
        assert e.downstream(error + READY) == error + READY
        back = e.handback()
        # The name is used up; the text is promoted anew the next time; a stale catalog is suspected.
        assert (back.states, back.made, back.suspect, back.alias) == ([(1, False)], 1, True, 1)
    finally:
        e.close()


def test_a_bind_that_fails_forgets_the_name(fast: FastRelay) -> None:
    e = _engine(fast)
    try:
        e.upstream(CLIENT_PARSE + BIND + EXECUTE + p.SYNC)
        error = p.encode_error("0A000", "cached plan must not change result type")
        e.downstream(b"1\0\0\0\x04" + error + READY)
        back = e.handback()
        assert (back.states, back.suspect) == ([(3, False)], True)
    finally:
        e.close()


def test_no_names_left_the_rewritten_text_goes_unnamed(fast: FastRelay) -> None:
    other = (b"SELECT 2", types_bytes(()), MAX_PROMOTED, True)  # (another text holds the last name)
    e = Engine(
        fast,
        decisions=[_decision(fast)],
        promotions=(
            [(REWRITTEN.encode(), types_bytes(TYPES), 0, False), other],
            MAX_PROMOTED,
            MAX_PROMOTED,
            0,
            -1,
        ),
    )
    try:
        assert e.upstream(CLIENT_PARSE + p.SYNC) == p.encode_parse("", REWRITTEN, TYPES) + p.SYNC
        e.downstream(b"1\0\0\0\x04" + READY)
        assert e.upstream(BIND + EXECUTE + p.SYNC) == BIND + EXECUTE + p.SYNC  # (nothing to rename)
        e.downstream(b"2\0\0\0\x04" + p.encode_command_complete("SELECT 0") + READY)
        back = e.handback()
        assert (back.states, back.made, back.alias) == (
            [(0, False), (MAX_PROMOTED, True)],
            MAX_PROMOTED,
            0,
        )
    finally:
        e.close()


def test_no_names_left_and_none_prepared_python_decides(fast: FastRelay) -> None:
    """Promotions.can_promote is false: Python analyses the text as an unnamed one (perhaps otherwise)."""
    e = _engine(fast, number=0, prepared=False, made=MAX_PROMOTED)
    try:
        e.client.sendall(CLIENT_PARSE + p.SYNC)
        assert wait_for(lambda: fast.take_handbacks() != [] or False, 5)
    finally:
        e.close()


def test_other_parameter_types_are_not_the_decision(fast: FastRelay) -> None:
    e = _engine(fast)
    try:
        e.client.sendall(p.encode_parse("", TEXT, (20,)) + p.SYNC)
        assert wait_for(lambda: fast.take_handbacks() != [] or False, 5)  # handed back: Python decides
    finally:
        e.close()


def test_a_deallocate_forgets_the_promotions(fast: FastRelay) -> None:
    kind = fast.kind_index("utility") or 0
    promotion = (REWRITTEN.encode(), types_bytes(TYPES), 3, True)
    e = Engine(
        fast,
        decisions=[_decision(fast), (b"QDEALLOCATE ALL", kind, (), False, False, -1, None)],
        promotions=([promotion], 3, MAX_PROMOTED, 0, -1),
    )
    try:
        e.upstream(p.encode_query("DEALLOCATE ALL"))
        e.downstream(p.encode_command_complete("DEALLOCATE ALL") + READY)
        # The next Parse of the text prepares it again, under a new name.
        assert (
            e.upstream(CLIENT_PARSE + p.SYNC)
            == p.encode_parse(f"{PROMOTED_PREFIX}4", REWRITTEN, TYPES) + p.SYNC
        )
        e.downstream(b"1\0\0\0\x04" + READY)
        back = e.handback()
        assert (back.states, back.made, back.deallocations, back.alias) == ([(4, True)], 4, 1, 4)
    finally:
        e.close()


def test_an_alias_given_at_adoption_renames_the_bind(fast: FastRelay) -> None:
    select = fast.kind_index("select") or 0
    promotion = (REWRITTEN.encode(), types_bytes(TYPES), 3, True)
    e = Engine(
        fast,
        statements=[(b"", 0, select, False, (), False, False)],
        decisions=[_decision(fast), (b"QSELECT 1", select, (), False, False, -1, None)],
        promotions=([promotion], 3, MAX_PROMOTED, 3, 0),
    )
    try:
        assert (
            e.upstream(BIND + EXECUTE + p.SYNC) == p.rename_bind_statement(BIND[5:], NAME) + EXECUTE + p.SYNC
        )
        e.downstream(b"2\0\0\0\x04" + p.encode_command_complete("SELECT 0") + READY)
        # A simple Query drops the unnamed statement: the alias ends with it (the Bind fails as it would).
        assert e.upstream(p.encode_query("SELECT 1")) == p.encode_query("SELECT 1")
        e.downstream(p.encode_command_complete("SELECT 1") + READY)
        assert e.upstream(BIND + p.SYNC) == BIND + p.SYNC
        e.downstream(p.encode_error("26000", "unnamed prepared statement does not exist") + READY)
        back = e.handback()
        assert (back.states, back.alias) == ([(3, True)], 0)
    finally:
        e.close()


# ---- through both relays against PostgreSQL: the Python relay (--no-fast-relay) is the oracle


def _rewrites(proxy: RunningProxy) -> int:
    engine = proxy.server.fast
    return engine.counts().rewrites if engine is not None else 0


def _replies(c: RawClient) -> list[Any]:
    out: list[Any] = []
    for kind, body in c.read_until(b"Z"):
        if kind == b"E":
            fields = p.decode_error(body)
            out.append(("E", fields.sqlstate, fields.message))
        elif kind not in (b"S", b"N"):
            out.append((kind, body))
    return out


def _raw_rounds(proxy: RunningProxy, database: str, session: str) -> list[Any]:
    """A session's unnamed key reads, described and run, round after round; another parameter type; a Bind
    of the unnamed statement after a simple Query dropped it; a Close of it, then a Describe."""
    c = RawClient(proxy.host, proxy.port, database, options=f"-c cow.session_id={session}")
    out: list[Any] = []
    try:
        c.sock.sendall(p.encode_query("UPDATE t SET v = 'in " + session + "' WHERE id = 3"))
        out.append(_replies(c))
        for i, types in enumerate([TYPES] * 4 + [(20,)] * 2 + [TYPES]):
            c.sock.sendall(
                p.encode_parse("", TEXT, types)
                + DESCRIBE_S
                + p.encode_bind("", "", (str(2 + i % 2),))
                + p.message(b"D", b"P\0")
                + EXECUTE
                + p.SYNC
            )
            out.append(_replies(c))
        c.sock.sendall(p.encode_bind("", "", ("3",)) + EXECUTE + p.SYNC)  # bound again, no Parse
        out.append(_replies(c))
        c.sock.sendall(p.encode_query("SELECT 1"))
        out.append(_replies(c))
        c.sock.sendall(p.encode_bind("", "", ("3",)) + EXECUTE + p.SYNC)  # (the Query dropped it)
        out.append(_replies(c))
        c.sock.sendall(CLIENT_PARSE + p.encode_close("S", "") + DESCRIBE_S + p.SYNC)
        out.append(_replies(c))
    finally:
        c.sock.close()
    return out


def test_raw_unnamed_reads_answer_alike_on_both_relays(relay_pair: Any) -> None:
    dsn, fast, slow = relay_pair
    database = dbname(dsn)
    before = _rewrites(fast)
    replies = [_raw_rounds(proxy, database, f"un-{side}") for proxy, side in ((slow, "s"), (fast, "f"))]
    # (each session's name is in the rows it updated: the same replies but for it)
    assert _normalise(replies[1]) == _normalise(replies[0])
    assert _rewrites(fast) - before >= 4, "the promotions' Parses were sent by the C relay"


def _normalise(replies: list[Any]) -> list[Any]:
    return [[(m[0], m[1].replace(b"un-f", b"un-s")) if m[0] == b"D" else m for m in r] for r in replies]


def test_psycopg_unnamed_statements_in_a_session_on_both_relays(relay_pair: Any) -> None:
    dsn, fast, slow = relay_pair
    results = []
    before = _rewrites(fast)
    for proxy in (slow, fast):
        options = "-c cow.session_id=un-psycopg"
        with psycopg.connect(proxy.dsn(dsn), autocommit=True, options=options) as conn:
            rows = [
                conn.execute(TEXT.replace("$1", "%s"), (i,), prepare=False).fetchall()
                for i in (1, 2, 1, 2, 5)
            ]
            with conn.transaction():
                rows += [
                    conn.execute(TEXT.replace("$1", "%s"), (i,), prepare=False).fetchall() for i in (3, 4)
                ]
            results.append(rows)
            if proxy is fast:
                assert relays(proxy) == {"fast": 1}
    assert (
        results[1]
        == results[0]
        == [[("v1",)], [("v2",)], [("v1",)], [("v2",)], [("v5",)], [("v3",)], [("v4",)]]
    )
    assert _rewrites(fast) - before >= 4


def test_asyncpg_unnamed_statements_in_a_session_on_both_relays(relay_pair: Any) -> None:
    dsn, fast, slow = relay_pair
    before = _rewrites(fast)

    async def run(proxy: RunningProxy) -> list[Any]:
        conn = await asyncpg.connect(
            proxy.dsn(dsn), statement_cache_size=0, server_settings={"cow.session_id": "un-asyncpg"}
        )
        try:
            out: list[Any] = [await conn.fetch(TEXT, i) for i in (1, 2, 3, 1)]
            out.append(await conn.fetchval(TEXT, 7))
            out.append([a.name for a in (await conn.prepare(TEXT)).get_attributes()])
            return [[tuple(r) for r in rows] if isinstance(rows, list) else rows for rows in out]
        finally:
            await conn.close()

    results = [asyncio.run(run(proxy)) for proxy in (slow, fast)]
    assert results[1] == results[0]
    assert results[0][:5] == [[("v1",)], [("v2",)], [("v3",)], [("v1",)], "v7"]
    assert _rewrites(fast) - before >= 3


def test_a_list_that_extends_the_last_one_takes_every_text(fast: FastRelay) -> None:
    """C loads a list of decisions that extends the one it loaded last (the same rows first, as Python's
    growing table gives them) as its new rows on top of that one's table: every text of the longer list is
    taken, of its first rows and of its new ones, by its exact text or its shape, chained as deep as C keeps
    them and then loaded whole; a text of neither goes back to Python."""
    kind = fast.kind_index("select")
    assert kind is not None
    rows = [(b"QSELECT %d" % i, kind, (), False, False, -1, None) for i in range(3)]
    lists = [list(rows)]
    for i in range(3, 14):  # (deeper than MAX_CHAIN: loaded whole again on the way)
        lists.append([*lists[-1], (b"QSELECT %d" % i, kind, (), False, False, -1, None)])
    lists.append([*lists[-1], (b"qSELECT x + \xff", kind, (), False, False, -1, None)])
    for n, decisions in enumerate(lists):
        engine = Engine(fast, decisions, ([], 0, 0, 0, -1))
        try:
            if n % 4 and n != len(lists) - 1:
                continue  # (loaded, and so the next list's base)
            for key in (decisions[0][0], decisions[len(decisions) // 2][0], decisions[-1][0]):
                text = key[1:].decode() if key[:1] == b"Q" else "SELECT x + 7"
                query = p.encode_query(text)
                assert engine.upstream(query) == query  # (taken: forwarded, no hand-back)
                engine.downstream(p.encode_command_complete("SELECT 1") + p.encode_ready("I"))
            engine.client.sendall(p.encode_query("SELECT 99"))  # no decision: handed back
            assert wait_for(lambda: [h.untaken for h in fast.take_handbacks()] == [ord("Q")], 5)
        finally:
            engine.close()
