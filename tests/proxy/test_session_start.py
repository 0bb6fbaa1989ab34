"""A tagged connection's start (issue 16): the join right after authentication (``Relay.start``) with the
path's answer in the same batch, and the decisions shared by the connections of one catalog; on literal
message sequences through the relay, and through a real server on both relays."""

from __future__ import annotations

import functools

import psycopg
import pytest

from proxy import protocol as p
from proxy.catalogs import SharedCatalogs
from proxy.fastrelay import AVAILABLE
from proxy.path_check import PATH_STATEMENT
from proxy.relay import INJECT_STATEMENT, REFUSED_SQL, Relay
from proxy.sql.rewrites.app_path import UNLAYERED_WRITE_SQL
from proxy.tags import Tags
from tests.fix_proxy import RunningProxy
from tests.proxy.test_path_check import data_row
from tests.proxy.test_relay_unit import NoCatalog, one_row_replies, relay, reply, send
from tests.proxy_sql import catalogs

JOIN = (
    p.encode_close("S", INJECT_STATEMENT),
    p.encode_parse(INJECT_STATEMENT, "SELECT cow.use_session($1, $2)"),
    p.encode_bind(INJECT_STATEMENT, INJECT_STATEMENT, ("S1", None)),
    p.encode_execute(INJECT_STATEMENT),
    p.encode_close("P", INJECT_STATEMENT),
)
PROBE = (
    p.encode_close("S", PATH_STATEMENT),
    p.encode_parse(PATH_STATEMENT, UNLAYERED_WRITE_SQL),
    p.encode_bind(PATH_STATEMENT, PATH_STATEMENT, ("{}",)),
    p.encode_execute(PATH_STATEMENT),
    p.encode_close("P", PATH_STATEMENT),
    p.encode_close("S", PATH_STATEMENT),
)
JOINED = one_row_replies(p.message(b"D", b"\x00\x01\x00\x00\x00\x00"))


def _probed(clean: bool) -> tuple[bytes, ...]:
    # cow._unlayered_write('{}'): NULL when no schema on the path lacks the layer, else '{}'.
    return (*one_row_replies(data_row(None, None, "t" if clean else "f")), p.message(b"3"))


def test_the_session_is_joined_at_start_with_the_paths_answer_and_the_client_waits() -> None:
    r = relay(Tags("S1"))
    r.catalog = catalogs.sample_catalog()
    r.start()
    # One batch: the join, whether the joined path is clean, Sync; the client held meanwhile.
    assert b"".join(r.to_server) == b"".join((*JOIN, *PROBE, p.encode_close("S", INJECT_STATEMENT), p.SYNC))
    r.to_server.clear()
    assert r.holding and not r.at_rest()
    write = p.encode_query("UPDATE t SET v = 'x' WHERE id = 1")
    assert send(r, write) == b""  # held: nothing of the client's runs before the join
    assert reply(r, *JOINED, *_probed(True), p.message(b"3"), p.encode_ready("I")) == b""
    # The write by an unqualified name goes out at once: the path's answer came with the join.
    assert b"".join(r.to_server) == write
    assert r.path.clean and r.path.checks == 0
    assert r.tagging.applied.tags == Tags("S1") and not r.tagging.applied.tentative
    r.to_server.clear()
    assert reply(r, p.encode_command_complete("UPDATE 1"), p.encode_ready("I")) == (
        p.encode_command_complete("UPDATE 1") + p.encode_ready("I")
    )
    assert r.at_rest()


def test_a_path_that_is_not_clean_is_checked_before_the_first_write() -> None:
    r = relay(Tags("S1"))
    r.catalog = catalogs.sample_catalog()  # (a session with CoW tables: its writes are watched)
    r.start()
    r.to_server.clear()
    assert reply(r, *JOINED, *_probed(False), p.message(b"3"), p.encode_ready("I")) == b""
    assert not r.path.clean and not r.holding
    # Nothing held (the client had sent nothing yet), but its first statement is Python's: the C relay would
    # hand back at once a first text it was not given.
    assert not r.at_rest()
    upstream = send(r, p.encode_query("UPDATE t SET v = 'x' WHERE id = 1"))
    assert p.encode_parse(PATH_STATEMENT, UNLAYERED_WRITE_SQL) in upstream  # asked for the write's names
    assert r.path.checks == 1
    clean = (p.message(b"3"), p.message(b"1"), p.message(b"2"), data_row(None, None, "t"))
    done = (p.encode_command_complete("SELECT 1"), p.message(b"3"), p.message(b"3"), p.encode_ready("I"))
    reply(r, *clean, *done)
    reply(r, p.encode_command_complete("UPDATE 1"), p.encode_ready("I"))
    assert r.at_rest()


def test_a_join_at_start_that_fails_refuses_the_held_statement_and_the_next_joins_again() -> None:
    r = relay(Tags("S1"))
    r.start()
    r.to_server.clear()
    query = p.encode_query("SELECT 1")
    assert send(r, query) == b""
    failure = p.encode_error("28P01", "cowproxy: wrong binding secret")
    assert reply(r, p.message(b"3"), p.message(b"1"), p.message(b"2"), failure, p.encode_ready("I")) == b""
    # Fail closed: the statement held is refused with the join's error, never run outside the session.
    assert b"".join(r.to_server) == p.encode_query(REFUSED_SQL)
    r.to_server.clear()
    syntax = p.encode_error("42601", 'syntax error at or near "cowproxy"')
    assert reply(r, syntax, p.encode_ready("I")) == failure + p.encode_ready("I")
    assert not r.path.clean and r.tagging.applied.tags != Tags("S1")
    # The next statement joins again (and would get the error again).
    assert send(r, query).startswith(JOIN[0] + JOIN[1])


def test_an_untagged_connection_starts_with_nothing() -> None:
    r = relay()
    r.start()
    assert r.to_server == [] and not r.holding and r.at_rest()


def test_connections_of_one_catalog_share_its_decisions() -> None:
    """A text one connection decided is the C relay's on every connection of the same catalog; a new
    catalog starts a table of its own, and a connection still on the old one keeps a table of its own."""
    shared = SharedCatalogs()
    old, new = catalogs.sample_catalog(), catalogs.sample_catalog()
    shared.put(("db", "u"), "v1", old)

    def joined(catalog: object) -> Relay:
        r = Relay(NoCatalog(), Tags("S1"), lambda: None, catalogs=shared.store("db", "u"))
        r.catalog = catalog
        r.tagging.joined(Tags("S1"), tentative=False)
        r.tagging.txn = Tags("S1")
        return r

    def decide(r: Relay, sql: str) -> None:
        query = p.encode_query(sql)
        assert send(r, query) == query
        reply(r, p.encode_command_complete("SELECT 1"), p.encode_ready("I"))

    first, second = joined(old), joined(old)
    decide(first, "SELECT v FROM t WHERE id = 1")
    decide(second, "SELECT 2")
    assert second.decisions.table is first.decisions.table and len(first.decisions.table) == 2
    shared.put(("db", "u"), "v2", new)  # (another connection read the catalog at a new version)
    third, late = joined(new), joined(old)
    decide(third, "SELECT 3")
    decide(third, "SELECT 33")
    decide(late, "SELECT 4")
    # (A text the fast path answered is decided by its exact text; the next text of its shape proves the
    # shape: the literal normalised.)
    assert set(third.decisions.table) == {b"QSELECT 3", b"qSELECT \xff"}
    assert late.decisions.table is not first.decisions.table and len(first.decisions.table) == 2
    # What the C relay is given is made once per table size, for every connection of the table.
    given = first.hand_off(lambda kind: 0, lambda writes: ())[0].decisions
    assert [row[0] for row in given] == [b"QSELECT v FROM t WHERE id = 1", b"QSELECT 2"]
    made = dict(first.decisions.table.exports)
    assert second.hand_off(lambda kind: 0, lambda writes: ())[0].decisions == given
    assert first.decisions.table.exports == made and all(
        first.decisions.table.exports[k] is made[k] for k in made
    )
    decide(second, "SELECT 5 FROM t")
    # (A connection that asks about the Query texts it lacks takes the list a few decisions old: STALE_LIST.)
    assert first.hand_off(lambda kind: 0, lambda writes: ())[0].decisions is given
    assert len(first.decisions.export(Tags("S1"), old, lambda kind: 0, lambda writes: (), True)) == 3


def _path_checks(proxy: RunningProxy) -> list[tuple[int, bool]]:
    """(path checks, path known clean) of each connection of the proxy (on its loop)."""
    return [(c.relay.path.checks, c.relay.path.clean) for c in proxy.server.connections.values() if c.relay]


@pytest.mark.timeout(120)
def test_a_new_session_writes_without_a_check_of_its_own_and_takes_what_others_decided(
    relay_pair: tuple[str, RunningProxy, RunningProxy],
) -> None:
    """Through a real server, on both relays: each new tagged connection's first statement, a write by an
    unqualified name, runs in its session right after the join (no path check of its own: the answer came
    with the join); on the C relay the second connection's read is taken by a decision the first made (in
    the list it was given, or by Python's answer to its request)."""
    dsn, fast, slow = relay_pair
    engine = fast.server.fast

    def taken() -> int:
        asked = fast.server.metrics.fast_requests.get("decision", 0)
        return asked + (engine.counts().decision_hits if engine is not None else 0)

    for proxy, side in ((fast, "f"), (slow, "s")):
        for i in range(2):
            hits = taken()
            url = proxy.dsn(dsn, options=f"-c%20cow.session_id%3Dstart{side}{i}")
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("UPDATE t SET v = 'started' WHERE id = 3")
                assert conn.execute("SELECT v FROM t WHERE v = 'started'").fetchall() == [("started",)]
                checks = proxy.run(functools.partial(_path_checks, proxy))
                assert checks == [(0, True)]
            if proxy is fast and i == 1 and AVAILABLE:
                assert engine is not None and taken() > hits
    with psycopg.connect(dsn) as conn:  # the base table untouched
        assert conn.execute("SELECT v FROM t WHERE id = 3").fetchone() == ("v3",)
