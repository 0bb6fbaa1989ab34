"""Decisions (proxy/decisions.py): the texts of a tagged connection the C relay may forward as is, on literal
message sequences through the relay."""

from __future__ import annotations

from proxy import protocol as p
from proxy.tags import Tags
from tests.proxy.test_relay_unit import _join, relay, reply, send


def test_texts_of_one_shape_share_a_decision() -> None:
    """The simple protocol's texts that differ only in literals get one decision, by their shape; texts whose
    literals may matter (a regclass cast, set_config) keep exact decisions or none."""
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
        b"qSELECT v FROM t WHERE id = \xff",
        b"qUPDATE t SET v = \xfd WHERE id = -\xff",
        b"QSELECT 'x'::regclass",  # (outside a catalog's CoW tables: forwarded as it is, by its exact text)
        b"qSELECT \xff -- 2",
    }
