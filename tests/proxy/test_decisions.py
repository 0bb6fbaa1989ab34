"""Decisions (proxy/decisions.py): the texts of a tagged connection the C relay may forward as is, on literal
message sequences through the relay."""

from __future__ import annotations

from typing import Any

from proxy import protocol as p
from proxy.decisions import GENERATION, MAX_DECISIONS, STALE_LIST, Table
from proxy.sql import Analysis
from proxy.tags import Tags
from tests.proxy.test_relay_unit import _join, relay, reply, send


def test_texts_of_one_shape_share_a_decision() -> None:
    """The simple protocol's texts that differ only in literals get one decision, by their shape; texts whose
    literals may matter (a regclass cast, set_config) keep exact decisions or none. A shape whose proof
    needs a parse of its own (the fast path answered its text) is proven at its second text: the first one
    is decided by its exact text."""
    r = relay(Tags("S1"))
    _join(r, p.encode_query("SELECT v FROM t WHERE id = 1"))
    for sql in (
        "SELECT v FROM t WHERE id = 22",
        "UPDATE t SET v = 'a' WHERE id = -3",
        "UPDATE t SET v = 'it''s' WHERE id = -4",
        "SELECT 'x'::regclass",
        "SELECT 1 -- 2",
    ):
        send(r, p.encode_query(sql))
        reply(r, p.encode_command_complete("SELECT 1"), p.encode_ready("I"))
    assert set(r.decisions.table) == {
        b"QSELECT v FROM t WHERE id = 1",  # (the fast path's: its shape seen once)
        b"qSELECT v FROM t WHERE id = \xff",
        b"qUPDATE t SET v = \xfd WHERE id = -\xff",  # (parsed: proven at the first text)
        b"QSELECT 'x'::regclass",  # (outside a catalog's CoW tables: forwarded as it is, by its exact text)
        b"QSELECT 1 -- 2",  # (seen once)
    }


def test_decisions_live_in_two_generations() -> None:
    """A full young generation drops the old one and becomes old: the table never holds more than
    MAX_DECISIONS (the C relay's limit too), a text decided again after its decision was dropped is young
    again, and every change gives the exports a new version."""
    table = Table()
    verdict = Analysis("select")
    old = [b"Qold %d" % i for i in range(GENERATION)]
    for key in old:
        table.add(key, verdict)
    assert len(table) == GENERATION and table.turns == 0
    version = table.version
    table.add(old[0], verdict)  # (already decided: nothing changes)
    assert table.version == version
    young = [b"Qyoung %d" % i for i in range(GENERATION)]
    for key in young:
        table.add(key, verdict)
    assert len(table) == MAX_DECISIONS and table.turns == 1  # (the first turn: no old generation yet)
    table.add(b"Qnew", verdict)  # the young generation is full: the old one goes
    assert set(table) == {*young, b"Qnew"} and table.turns == 2
    assert table.young == {b"Qnew"}
    table.add(old[0], verdict)  # decided again (it came back to Python): young
    assert old[0] in table.young and len(table) == GENERATION + 2
    assert table.version > version


def test_a_full_table_still_takes_new_texts() -> None:
    """A session's texts keep being decided once the table has had MAX_DECISIONS of them (before: none
    more for the rest of the catalog's life)."""
    r = relay(Tags("S1"))
    _join(r, p.encode_query("SELECT v FROM t WHERE id = 1"))
    for i in range(MAX_DECISIONS + 10):
        send(r, p.encode_query(f"SELECT v{i} FROM t"))
        reply(r, p.encode_command_complete("SELECT 1"), p.encode_ready("I"))
    assert b"QSELECT v%d FROM t" % (MAX_DECISIONS + 9) in r.decisions.table
    assert len(r.decisions.table) <= MAX_DECISIONS


def test_a_connection_that_asks_takes_a_list_a_few_decisions_old() -> None:
    """Adoptions of connections that ask about the Query texts they lack (``Adoption.ask``) take the list
    made for the table up to STALE_LIST decisions ago (the same object: C keeps the table it loaded for it),
    until a Parse's decision came (C does not ask about those); one that does not ask gets every decision."""
    r = relay(Tags("S1"))
    _join(r, p.encode_query("SELECT 1"))

    def export(stale: int) -> list[Any]:
        return r.decisions.export(Tags("S1"), None, lambda kind: 0, lambda writes: (), True, stale=stale)

    first = export(STALE_LIST)
    for i in range(3):
        r.decisions.table.add(b"QSELECT %d AS asked" % i, Analysis("select"))
    assert export(STALE_LIST) is first
    fresh = export(0)
    assert fresh is not first and len(fresh) == len(first) + 3
    r.decisions.table.add(b"PSELECT $1", Analysis("select"))
    assert b"PSELECT $1" in [row[0] for row in export(STALE_LIST)]
    for i in range(STALE_LIST + 1):
        r.decisions.table.add(b"QSELECT %d AS later" % i, Analysis("select"))
    assert len(export(STALE_LIST)) == len(r.decisions.table)
