"""Paths through the wire protocol (COPY both ways and both protocols, failures inside COPY, suspended
portals, Flush, pipelines with errors, empty queries, unknown names, extra Syncs), each followed by
statements that switch sessions by comment: the relay's count of owed replies must stay exact, on the C
relay and the Python relay, untagged and tagged. Spoken by hand (RawClient) to take each path precisely."""

from __future__ import annotations

import psycopg
import pytest

from proxy import protocol as p
from tests.fix_proxy import RunningProxy
from tests.proxy.test_adversity import RawClient, dbname

BOTH_RELAYS = True
pytestmark = pytest.mark.timeout(120)

P, B, E, S = p.encode_parse, p.encode_bind, p.encode_execute, p.SYNC


def D(kind: bytes, name: str = "") -> bytes:
    return p.message(b"D", kind + name.encode() + b"\0")


FLUSH = p.message(b"H")

COPYIN = P("", "COPY customers (email, name) FROM STDIN") + B("", "", ()) + E() + S
SCENARIOS = {
    "copy-out-ext": [P("", "COPY (SELECT 1) TO STDOUT") + B("", "", ()) + E() + S, b"Z"],
    "copy-in-ext-fail": [COPYIN, b"G", p.message(b"f", b"nope\0") + S, b"Z"],
    "copy-in-ext-baddata": [COPYIN, b"G", p.message(b"d", b"bad\n") + p.message(b"c") + S, b"Z"],
    "copy-in-ext-baddata-nodone": [COPYIN, b"G", p.message(b"d", b"bad\n"), b"E", S, b"Z"],
    "copy-in-simple-fail": [
        p.encode_query("COPY customers (email, name) FROM STDIN"),
        b"G",
        p.message(b"f", b"nope\0"),
        b"Z",
    ],
    "copy-in-simple-ok": [
        p.encode_query("COPY customers (email, name) FROM STDIN"),
        b"G",
        p.message(b"d", b"q@x\tq\n") + p.message(b"c"),
        b"Z",
    ],
    "describe-only": [P("s1", "SELECT $1::int") + D(b"S", "s1") + S, b"Z"],
    "empty-query": [p.encode_query(""), b"Z"],
    "empty-ext": [P("", "") + B("", "", ()) + E() + S, b"Z"],
    "suspended": [P("", "SELECT generate_series(1,5)") + B("", "", ()) + E("", 2) + E("", 2) + S, b"Z"],
    "flush-then-sync": [P("", "SELECT 1") + B("", "", ()) + E() + FLUSH, b"C", S, b"Z"],
    "error-pipeline": [
        P("", "SELECT 1/0") + B("", "", ()) + E() + P("", "SELECT 2") + B("", "", ()) + E() + S,
        b"Z",
    ],
    "multi-stmt": [p.encode_query("SELECT 1; SELECT 1/0; SELECT 3"), b"Z"],
    "txn-error": [p.encode_query("BEGIN; SELECT 1/0"), b"Z", p.encode_query("ROLLBACK"), b"Z"],
    "two-syncs": [P("", "SELECT 1") + B("", "", ()) + E() + S + S, b"Z", b"Z"],
    "sync-only": [S, b"Z"],
    "close-unknown": [p.encode_close("S", "nosuch") + S, b"Z"],
    "bind-unknown": [B("", "nosuch", ()) + E() + S, b"Z"],
    "copy-ext-in-txn": [
        p.encode_query("BEGIN"),
        b"Z",
        COPYIN,
        b"G",
        p.message(b"d", b"z@x\tz\n") + p.message(b"c") + S,
        b"Z",
        p.encode_query("COMMIT"),
        b"Z",
    ],
}


def drive(c: RawClient, steps: list[bytes]) -> None:
    for step in steps:
        if len(step) == 1:
            c.read_until(step)
        else:
            c.sock.sendall(step)


@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged"])
def test_the_relay_stays_in_step(proxy: RunningProxy, layer_db: str, tagged: bool) -> None:
    """After each path through the protocol, statements that switch sessions (untagged connection) or
    operations (a session fixed at startup) by comment (an injected cow.use_session whose replies the relay
    hides) and plain ones get exactly their own answers: a relay that counted one reply too many or too few
    hangs or hands a client the wrong reply here."""
    params = {"application_name": "cow:startup"} if tagged else {}
    tag = "cow_session='startup',cow_operation='paths{}'" if tagged else "cow_session='paths{}'"
    for name, steps in SCENARIOS.items():
        c = RawClient(proxy.host, proxy.port, dbname(layer_db), **params)
        c.sock.settimeout(10)
        try:
            drive(c, steps)
            for i in range(2):
                email = f"{name}-{i}@x"
                got = c.query(
                    f"/*{tag.format(i)}*/ INSERT INTO customers (email, name) VALUES ('{email}', 'x')"
                )
                assert (b"C", b"INSERT 0 1\0") in got, (name, got)
                got = c.query("SELECT 7")
                assert [k for k, _ in got] == [b"T", b"D", b"C", b"Z"] and got[1][1].endswith(b"7"), (
                    name,
                    got,
                )
                c.sock.sendall(P("", "SELECT 8") + B("", "", ()) + E() + S)
                got = c.read_until(b"Z")
                assert [k for k, _ in got] == [b"1", b"2", b"D", b"C", b"Z"], (name, got)
                assert got[2][1].endswith(b"8"), (name, got)
        finally:
            c.sock.close()
    with psycopg.connect(layer_db, autocommit=True) as conn:
        base = conn.execute("SELECT count(*) FROM public.customers WHERE email LIKE '%-_@x'").fetchone()
        assert base == (0,)
        for i in range(2):
            rows = conn.execute(
                "SELECT row_data ->> 'email' FROM cow.session_changes(%s) WHERE table_name = 'customers'"
                " AND (%s OR operation_id = %s)",
                ("startup" if tagged else f"paths{i}", not tagged, f"paths{i}"),
            ).fetchall()
            assert sorted(r[0] for r in rows) == sorted(f"{name}-{i}@x" for name in SCENARIOS)
