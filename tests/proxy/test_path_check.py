"""The path check on literal message sequences: the server is asked where a session's unqualified writes
resolve before they run, and its answer refuses the write or marks the path clean until it may change."""

from __future__ import annotations

import struct

from proxy import protocol as p
from proxy.path_check import PATH_STATEMENT
from proxy.relay import REFUSED_SQL, Relay
from proxy.sql.rewrites import app_path
from proxy.tags import Tags
from tests.proxy.test_relay_unit import relay, reply, send
from tests.proxy_sql import catalogs

INSERT = p.encode_query("INSERT INTO t VALUES (1)")


def data_row(*values: str | None) -> bytes:
    body = struct.pack("!H", len(values))
    for value in values:
        body += struct.pack("!i", -1) if value is None else struct.pack("!i", len(value)) + value.encode()
    return p.message(b"D", body)


def question(targets: str) -> bytes:
    """The injected batch that asks ``cow._unlayered_write`` about the write targets, at a safe point."""
    return b"".join(
        (
            p.encode_close("S", PATH_STATEMENT),
            p.encode_parse(PATH_STATEMENT, app_path.UNLAYERED_WRITE_SQL),
            p.encode_bind(PATH_STATEMENT, PATH_STATEMENT, (targets,)),
            p.encode_execute(PATH_STATEMENT),
            p.encode_close("P", PATH_STATEMENT),
            p.encode_close("S", PATH_STATEMENT),
            p.SYNC,
        )
    )


def answer(*row: str | None) -> tuple[bytes, ...]:
    return (
        p.message(b"3"),
        p.message(b"1"),
        p.message(b"2"),
        data_row(*row),
        p.encode_command_complete("SELECT 1"),
        p.message(b"3"),
        p.message(b"3"),
        p.encode_ready("I"),
    )


def joined() -> Relay:
    r = relay(Tags("S1"))
    r.tagging.applied.tags = r.tagging.txn = Tags("S1")
    r.catalog = catalogs.sample_catalog()  # (a session with CoW tables: its writes are watched)
    return r


def test_a_write_that_resolves_outside_the_layer_is_refused() -> None:
    r = joined()
    assert send(r, INSERT) == question('{"t"}')
    assert r.holding and r.path.checks == 1
    assert reply(r, *answer("tenant_plain", "t", "f")) == b""  # nothing of the question reaches the client
    assert b"".join(r.to_server) == p.encode_query(REFUSED_SQL)  # the server fails it, as the client is told
    r.to_server.clear()
    out = reply(r, p.encode_error("42601", 'syntax error at or near "cowproxy"'), p.encode_ready("I"))
    error = p.decode_error(out[5 : out.index(p.encode_ready("I"))])
    assert (error.sqlstate, error.message) == app_path.unlayered_refusal("tenant_plain", "t", "insert")
    assert not r.path.clean


def test_a_clean_path_is_asked_about_once_until_it_changes() -> None:
    r = joined()
    send(r, INSERT)
    assert reply(r, *answer(None, None, "t")) == b""
    assert b"".join(r.to_server) == INSERT and r.path.clean  # released as it is
    r.to_server.clear()
    done = p.encode_command_complete("INSERT 0 1") + p.encode_ready("I")
    assert reply(r, done) == done
    assert send(r, INSERT) == INSERT  # known clean: no question
    reply(r, done)
    # A change of path ends what was known: the next write is asked about again.
    send(r, p.encode_query("SET search_path = tenant_a, public"))
    reply(r, p.encode_command_complete("SET"), p.encode_ready("I"))
    assert not r.path.clean
    assert send(r, INSERT) == question('{"t"}') and r.path.checks == 2
