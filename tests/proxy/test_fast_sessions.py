"""Tagged connections on the C relay: Python decides once per statement text (forward it as is, or not),
C applies the decisions it was given and asks Python about a new Query text; what needs Python (a rewrite,
a refusal, a comment that may carry tags) hands the connection back (docs/proxy.md, "Sessions on the fast
relay")."""

from __future__ import annotations

import subprocess
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from proxy import protocol as p
from proxy.admin import admin_request
from proxy.fastrelay import AVAILABLE, UNAVAILABLE
from tests.fix_db import PgServer, install_layer_at
from tests.fix_proxy import RunningProxy
from tests.proxy.test_adversity import RawClient, dbname, wait_for
from tests.proxy.test_fast_relay import _exchange, _message, fast_counted, on_fast, relays, scrape
from tests.proxy.test_tagging import base_customers, changes

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not AVAILABLE, reason=f"{UNAVAILABLE}"),
]


def tagged_counted(proxy: RunningProxy, kind: str) -> int:
    return fast_counted(proxy).get((kind, True), 0)


def test_repeated_texts_of_a_session_run_on_the_fast_relay(proxy: RunningProxy, layer_db: str) -> None:
    c = RawClient(proxy.host, proxy.port, dbname(layer_db), options="-c cow.session_id=fs1")
    # (One text, run again and again: the email is made by the server, customers.email is unique.)
    insert = "INSERT INTO customers (email, name) VALUES ('fs1-' || md5(random()::text), 'x')"
    read = "SELECT email FROM customers WHERE email LIKE 'fs1%'"
    assert c.query(insert)[-1] == (b"Z", b"I")  # joins the session, reads the catalog (Python)
    assert on_fast(proxy)  # at rest in its session
    assert c.query(read)[-2][0] == b"C"  # a new text: handed back, decided, forwarded by Python
    assert on_fast(proxy)
    before = (tagged_counted(proxy, "select"), tagged_counted(proxy, "insert"))
    for _ in range(3):
        assert c.query(insert)[-1] == (b"Z", b"I")
    assert len([b for k, b in c.query(read) if k == b"D"]) == 4
    assert relays(proxy) == {"fast": 1}
    assert (tagged_counted(proxy, "select"), tagged_counted(proxy, "insert")) == (
        before[0] + 1,
        before[1] + 3,
    )
    # The extended protocol: a Parse of a decided text, its Bind and Execute.
    c.sock.sendall(
        p.encode_parse("ins", "INSERT INTO customers (email, name) VALUES ($1, 'x')")
        + p.encode_bind("", "ins", ("fs1b@x",))
        + p.encode_execute("")
        + p.SYNC
    )
    assert c.read_until(b"Z")[-1] == (b"Z", b"I")
    assert on_fast(proxy)
    c.sock.sendall(p.encode_bind("", "ins", ("fs1c@x",)) + p.encode_execute("") + p.SYNC)
    assert c.read_until(b"Z")[-1] == (b"Z", b"I")
    assert relays(proxy) == {"fast": 1}
    # A refusal still comes from Python: the connection is handed back for the new text.
    replies = c.query("SET cow.session_id TO 'elsewhere'")
    assert replies[0][0] == b"E" and b"42501" in replies[0][1]
    assert c.query(insert)[-1] == (b"Z", b"I")
    c.sock.close()
    assert not [e for e in base_customers(layer_db) if e.startswith("fs1")]
    emails = [row[2] for row in changes(layer_db, "fs1")]
    assert [e if e.endswith("@x") else "fs1-" for e in emails] == ["fs1-"] * 4 + ["fs1b@x", "fs1c@x", "fs1-"]


def test_autocommit_writes_that_may_run_again_stay_on_the_fast_relay(
    proxy: RunningProxy, layer_db: str
) -> None:
    """An autocommit UPDATE of a session may be run again (proxy/rerun.py): C watches it and keeps it while
    it succeeds (a hand-back before each one put prepared statements on the Python relay)."""
    c = RawClient(proxy.host, proxy.port, dbname(layer_db), options="-c cow.session_id=fs-rerun")
    update = "UPDATE customers SET name = name || '.' WHERE id = 1"
    assert c.query(update)[-1] == (b"Z", b"I")  # joins the session, decides the text (Python)
    assert on_fast(proxy)
    c.sock.sendall(p.encode_parse("upd", "UPDATE customers SET name = name || '.' WHERE id = $1") + p.SYNC)
    assert c.read_until(b"Z")[-1] == (b"Z", b"I")
    assert on_fast(proxy)
    before = tagged_counted(proxy, "update")
    for _ in range(3):
        assert c.query(update)[-2] == (b"C", b"UPDATE 1\0")
        c.sock.sendall(p.encode_bind("", "upd", ("1",)) + p.encode_execute("") + p.SYNC)
        assert c.read_until(b"Z")[-2:] == [(b"C", b"UPDATE 1\0"), (b"Z", b"I")]
    assert relays(proxy) == {"fast": 1}
    assert tagged_counted(proxy, "update") == before + 6
    c.sock.close()


def test_stays_on_the_c_relay_are_counted(proxy: RunningProxy, layer_db: str) -> None:
    """The metrics say where a session's statements went: adoptions by the C relay, its hand-backs by reason
    and the client message it did not take, and the statements each relay took."""
    c = RawClient(proxy.host, proxy.port, dbname(layer_db), options="-c cow.session_id=fs-count")
    assert c.query("SELECT 1")[-1] == (b"Z", b"I")  # joins the session (Python), then goes to C
    assert on_fast(proxy)
    before = scrape(proxy)

    def delta(name: str) -> float:
        return scrape(proxy).get(name, 0.0) - before.get(name, 0.0)

    python = 'cowproxy_relay_statements_total{relay="python",tagged="true"}'
    on_c = 'cowproxy_relay_statements_total{relay="c",tagged="true"}'
    cold = 'cowproxy_fast_handbacks_total{message="Q",reason="client message"}'
    for _ in range(3):
        assert c.query("SELECT 1")[-1] == (b"Z", b"I")  # (decided: C takes it)
    assert (delta(on_c), delta(python), delta(cold)) == (3, 0, 0)
    # A new text: C asks Python for its decision and takes it, the connection stays.
    assert c.query("SELECT 2 AS fs_count")[-1] == (b"Z", b"I")
    assert (delta(on_c), delta(python), delta(cold)) == (4, 0, 0)
    assert delta('cowproxy_fast_requests_total{answer="decision"}') == 1
    # A refusal: Python answers "hand back", and takes the Query as before.
    replies = c.query("SET cow.session_id TO 'fs-elsewhere'")
    assert replies[0][0] == b"E" and b"42501" in replies[0][1]
    assert on_fast(proxy)  # (at rest: adopted again)
    assert (delta(on_c), delta(python), delta(cold)) == (4, 0, 1)  # (a refusal is no statement)
    assert delta('cowproxy_fast_requests_total{answer="hand back"}') == 1
    assert delta("cowproxy_fast_adoptions_total") == 1
    c.sock.sendall(p.TERMINATE)  # (C takes no Terminate: Python closes)
    assert wait_for(
        lambda: delta('cowproxy_fast_handbacks_total{message="X",reason="client message"}') == 1, 5
    )
    c.sock.close()


def _shape_hits(proxy: RunningProxy) -> int:
    fast = proxy.server.fast
    assert fast is not None
    return fast.counts().shape_hits


def test_savepoints_of_a_session_run_on_the_fast_relay(proxy: RunningProxy, layer_db: str) -> None:
    """Savepoint commands with ever-new names (Django's) are taken by C by their shape, inside a block C
    carries on in; they behave as PostgreSQL's: a ROLLBACK TO undoes the session's write, an unknown name
    fails with 3B001, a savepoint outside a block with 25P01; only the session's changes are written."""
    c = RawClient(proxy.host, proxy.port, dbname(layer_db), options="-c cow.session_id=fs-sp")
    insert = "INSERT INTO customers (email, name) VALUES ('{}@fs-sp', 'x')"

    def block(n: int) -> list[tuple[bytes, bytes]]:
        replies = c.query("BEGIN")
        for text in (
            f'SAVEPOINT "s{n}_x1"',
            insert.format(f"gone{n}"),
            f'ROLLBACK TO SAVEPOINT "s{n}_x1"',
            f'RELEASE SAVEPOINT "s{n}_x1"',
            f"SAVEPOINT sp{n}",
            insert.format(f"kept{n}"),
            f"RELEASE sp{n}",
            "COMMIT",
        ):
            replies += c.query(text)
        return [reply for reply in replies if reply[0] != b"N"]

    c.query("SELECT 1")  # joins the session (Python)
    first = block(1)  # decides the texts (each new text hands the connection back to Python)
    # (A shape whose proof needs a parse of its own, a savepoint command's, is proven at its second text.)
    assert [k for k, _ in block(2)] == [k for k, _ in first]
    for _ in range(64):  # (so many short stays on C in a row keep it in Python for a few replies)
        if wait_for(lambda: relays(proxy) == {"fast": 1}, 0.2):
            break
        c.query("SELECT 1")
    assert on_fast(proxy)
    hits = _shape_hits(proxy)
    second = block(3)
    assert relays(proxy) == {"fast": 1}
    assert _shape_hits(proxy) - hits == 7  # (the five savepoint commands and the two inserts: shapes)
    assert [k for k, _ in second] == [k for k, _ in first]
    assert (b"C", b"ROLLBACK\0") in second and (b"C", b"RELEASE\0") in second
    # An unknown savepoint in a block C carries on in: the server's 3B001, and the block fails.
    assert c.query("BEGIN")[-1] == (b"Z", b"T")
    assert on_fast(proxy)
    failed = c.query('ROLLBACK TO SAVEPOINT "s9_x1"')
    assert failed[0][0] == b"E" and b"C3B001" in failed[0][1] and failed[-1] == (b"Z", b"E")
    assert c.query("ROLLBACK")[-1] == (b"Z", b"I")
    outside = c.query('SAVEPOINT "s4_x1"')  # not in a block
    assert outside[0][0] == b"E" and b"C25P01" in outside[0][1]
    c.sock.close()
    assert not [e for e in base_customers(layer_db) if e.endswith("@fs-sp")]
    assert sorted(row[2] for row in changes(layer_db, "fs-sp")) == [
        "kept1@fs-sp",
        "kept2@fs-sp",
        "kept3@fs-sp",
    ]


def test_server_side_cursors_of_a_session_run_by_their_shape(proxy: RunningProxy, layer_db: str) -> None:
    """psycopg's server-side cursors (Django's ``iterator()``), named anew each time, are taken by their shape
    once it is known: a later cursor's DECLARE (an unnamed Parse), FETCH and CLOSE are no new texts to the
    proxy, and they read the session's rows through the overlay."""
    insert = "INSERT INTO customers (email, name) VALUES ('{}@fs-cur', 'x')"
    analyzer = proxy.server.analysis.analyzer
    with psycopg.connect(proxy.dsn(layer_db), options="-c cow.session_id=fs-cur", autocommit=True) as conn:
        conn.execute(insert.format("a"))

        def read(n: int) -> list[str]:
            with conn.cursor(f"_django_curs_140_sync_{n}", withhold=True) as cursor:
                cursor.execute("SELECT email FROM customers WHERE name = 'x' AND email LIKE '%@fs-cur'")
                return [row[0] for row in cursor.fetchmany(2000)]

        for n in (1, 2):  # (the second cursor proves the shapes the fast path answered)
            assert read(n) == ["a@fs-cur"]
        misses, shape_hits = analyzer.misses, analyzer.shape_hits
        conn.execute(insert.format("b"))
        assert sorted(read(3)) == ["a@fs-cur", "b@fs-cur"]
        # (The insert's text is new; the DECLARE, analysed as both forms of a Parse, and the FETCH and CLOSE
        # are answered by their shapes: by the analysis where Python relays them, or by C.)
        assert analyzer.misses - misses - (analyzer.shape_hits - shape_hits) <= 1
    assert not [e for e in base_customers(layer_db) if e.endswith("@fs-cur")]


def test_a_comment_tag_hands_a_session_back(proxy: RunningProxy, layer_db: str) -> None:
    c = RawClient(proxy.host, proxy.port, dbname(layer_db), options="-c cow.session_id=fs2")
    insert = "INSERT INTO customers (email, name) VALUES ('{}' || md5(random()::text), 'x')"
    c.query(insert.format("a@fs2"))
    assert on_fast(proxy)
    c.query(insert.format("a@fs2"))  # decided
    assert on_fast(proxy)
    c.query("/*cow_operation='fs2b'*/ " + insert.format("b@fs2"))  # another operation, for this statement
    refused = c.query("/*cow_session='fs2c'*/ " + insert.format("c@fs2"))  # not another session (fixed)
    assert refused[0][0] == b"E" and b"42501" in refused[0][1]
    c.query(insert.format("a@fs2"))  # back in its own operation
    assert on_fast(proxy)
    c.query(insert.format("a@fs2"))
    c.sock.close()
    assert [row[2][:5] for row in changes(layer_db, "fs2")] == ["a@fs2"] * 2 + ["b@fs2"] + ["a@fs2"] * 2
    assert changes(layer_db, "fs2c") == []
    assert not [e for e in base_customers(layer_db) if "@fs2" in e]


def test_a_routed_connection_runs_in_its_session_on_the_fast_relay(
    proxy: RunningProxy, layer_db: str
) -> None:
    database = dbname(layer_db)
    admin_request(proxy.admin_url, "POST", "/routes", {"database": database, "session": "fs3"})
    with psycopg.connect(proxy.dsn(layer_db), autocommit=True) as conn:
        insert = "INSERT INTO customers (email, name) VALUES (%s, 'x')"
        conn.execute(insert, ("a@fs3",), prepare=True)
        assert on_fast(proxy)
        conn.execute(insert, ("b@fs3",), prepare=True)
        assert relays(proxy) == {"fast": 1}
        # Unrouted: it comes back and its next transaction is untagged.
        admin_request(proxy.admin_url, "DELETE", f"/routes/{database}")
        conn.execute(insert, ("c@fs3",), prepare=True)
        assert on_fast(proxy)
        conn.execute(insert, ("d@fs3",), prepare=True)
    assert [row[2] for row in changes(layer_db, "fs3")] == ["a@fs3", "b@fs3"]
    assert {"c@fs3", "d@fs3"} <= set(base_customers(layer_db))


@pytest.mark.parametrize("mode", ["prepared", "extended", "simple"])
def test_pgbench_in_sessions(
    proxy: RunningProxy, pg_server: PgServer, create_database: Any, mode: str
) -> None:
    """TPC-B in two sessions: every statement counted once (by either relay), the writes in the sessions'
    changes, the base tables untouched; with -M prepared most of them on the C relay."""
    pgbench = pg_server.tool("pgbench")
    dsn = create_database()
    init = subprocess.run(
        [pgbench, "-i", "-s", "1", "-q", dsn], capture_output=True, text=True, timeout=60, check=False
    )
    assert init.returncode == 0, init.stderr
    install_layer_at(dsn)
    before, fast_before = scrape(proxy), tagged_counted(proxy, "update")
    runs = [
        subprocess.Popen(
            [pgbench, "-M", mode, "-c", "1", "-t", "50", "-n", proxy.dsn(dsn)],
            env={"PGOPTIONS": f"-c cow.session_id=bench{i}", "PATH": "/usr/bin:/bin"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for run in runs:
        _, err = run.communicate(timeout=90)
        assert run.returncode == 0, err
    after = scrape(proxy)

    def delta(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    assert delta('cowproxy_statements_total{kind="update",tagged="true"}') == 300
    assert delta('cowproxy_statements_total{kind="insert",tagged="true"}') == 100
    assert delta('cowproxy_writes_total{kind="insert",table="public.pgbench_history"}') == 100
    if mode == "prepared":
        assert tagged_counted(proxy, "update") - fast_before >= 250
    with psycopg.connect(dsn, autocommit=True) as direct:
        assert direct.execute("SELECT count(*) FROM pgbench_history").fetchone() == (0,)
        for i in range(2):
            (n,) = direct.execute(
                "SELECT count(*) FROM cow.session_changes(%s) WHERE table_name = 'pgbench_history'",
                (f"bench{i}",),
            ).fetchone() or (None,)
            assert n == 50


# ---- the C relay against the Python relay in sessions, with tag switches, message stream by stream


# Django's table list (its introspection's get_table_list): pg_table_is_visible rewritten into the layer's
# set.
TABLE_LIST = (
    "SELECT c.relname, CASE WHEN c.relispartition THEN 'p' WHEN c.relkind IN ('m', 'v') THEN 'v' "
    "ELSE 't' END FROM pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relkind IN ('f', 'm', 'p', 'r', 'v') AND n.nspname NOT IN ('pg_catalog', 'pg_toast') "
    "AND pg_catalog.pg_table_is_visible(c.oid) ORDER BY 1"
)
# {o}: another session of this run (a comment tag switches to it for one statement or transaction); {n}: a
# literal that differs in each round (its texts are new: C takes them by their shape's decision).
_SESSION_TEXTS = st.sampled_from(
    [
        "SELECT v FROM t WHERE id = {n}",
        "SELECT v AS c{n} FROM t WHERE id = 3",  # (a new text and shape each round: C asks Python)
        "UPDATE t SET v = 'v{n}' WHERE id = -{n} OR id = {n} - 10",
        "INSERT INTO t VALUES (1{n}, 'n{n}')",
        "SELECT v, 1.{n} FROM t WHERE v = 'v{n}' -- {n}",
        "SELECT set_config('application_name', 'a{n}', false)",
        "SELECT '{n}'::regclass",
        "SELECT v FROM t WHERE id = 3",
        "SELECT count(*) FROM t",
        "SELECT id, v FROM t ORDER BY id LIMIT 3",
        "UPDATE t SET v = v || '!' WHERE id = 1",
        "DELETE FROM t WHERE id = 2",
        "INSERT INTO t VALUES (100, 'x')",
        "INSERT INTO t VALUES (101, 'y') ON CONFLICT (id) DO UPDATE SET v = 'z'",
        "BEGIN",
        "COMMIT",
        "ROLLBACK",
        'SAVEPOINT "s{n}_x1"',  # (a new name each round: C takes it by its shape's decision)
        'RELEASE SAVEPOINT "s{n}_x1"',
        'ROLLBACK TO SAVEPOINT "s{n}_x1"',
        "ROLLBACK TO SAVEPOINT nope{n}",  # (3B001 in a block)
        "SELECT 1/0",
        "SET cow.session_id TO 'elsewhere'",
        "SET search_path TO public",
        "/*cow_session='{o}'*/ UPDATE t SET v = 'o' WHERE id = 4",
        "/*cow_session='{o}'*/ SELECT v FROM t WHERE id = 4",
        "/*cow_session='{o}'*/ BEGIN",
        # Rewritten, with nothing else of Python's: C sends the rewritten text (decided by the exact text).
        "SELECT v FROM public.t WHERE id = {n}",
        "SELECT id, count(*) FROM t GROUP BY id ORDER BY id LIMIT 3",
        "UPDATE public.t SET v = v || '?' WHERE id = 5",  # (may run again: watched as sent)
        TABLE_LIST,
    ]
)
_SESSION_KINDS = ["query", "query", "parse", "named", "keep", "again", "errmid", "promoted", "promoted2"]
# An unnamed key read the proxy runs as a named statement of its own (proxy/unnamed.py): its parameter type
# chosen by the text drawn (a Parse with other types is another decision), described, bound, run; promoted2:
# twice in one batch (the second Parse goes out while the first one's is unanswered).
_KEY_READ = "SELECT v FROM t WHERE id = $1"


def _session_message(kind: str, text: str) -> bytes:
    if not kind.startswith("promoted"):
        return _message(kind, text)
    one = (
        p.encode_parse("", _KEY_READ, (23,) if len(text) % 2 else (20,))
        + p.message(b"D", b"S\0")
        + p.encode_bind("", "", (str(len(text) % 7),))
        + p.encode_execute("")
    )
    return (one * (2 if kind == "promoted2" else 1)) + p.SYNC


_SESSION_STREAMS = st.lists(
    st.tuples(st.sampled_from(_SESSION_KINDS), _SESSION_TEXTS), min_size=1, max_size=6
)
_runs = iter(range(1_000_000))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=_SESSION_STREAMS, pipelined=st.booleans())
# Two streams sure to give C each kind of decision the last test checks (a connection's first statement is
# Python's, so short drawn streams may give it none): texts and a shape taken by C in the second round, and
# a promotion whose Parse C sends itself (the second connection finds the decision the first one's made).
@example(
    stream=[
        ("query", "SELECT v FROM t WHERE id = 3"),
        ("named", "SELECT count(*) FROM t"),
        ("query", "SELECT v FROM t WHERE id = {n}"),
        ("promoted", "SELECT 1"),
    ],
    pipelined=False,
)
@example(stream=[("query", "SELECT v FROM t WHERE id = 3"), ("promoted", "SELECT 1")], pipelined=False)
# Cold texts arriving on the C relay (asked of Python) inside a block and pipelined, with a comment tag's
# switch (handed back) between them.
@example(
    stream=[
        ("query", "BEGIN"),
        ("query", "SELECT v AS c{n} FROM t WHERE id = 3"),
        ("query", "/*cow_session='{o}'*/ SELECT v FROM t WHERE id = 4"),
        ("query", "SELECT v AS c{n} FROM t WHERE id = 3"),
        ("query", "COMMIT"),
    ],
    pipelined=True,
)
# Rewritten texts C sends itself (by the Python relay's decisions in the second round, by a request's answer
# in a block), an autocommit rewritten write among them.
@example(
    stream=[
        ("query", "SELECT v FROM public.t WHERE id = {n}"),
        ("query", TABLE_LIST),
        ("query", "BEGIN"),
        ("query", "SELECT v FROM public.t WHERE id = 1{n}"),
        ("query", "COMMIT"),
        ("query", "UPDATE public.t SET v = v || '?' WHERE id = 5"),
    ],
    pipelined=False,
)
def test_fast_relay_matches_the_python_relay_in_sessions(
    relay_pair: Any, stream: list[tuple[str, str]], pipelined: bool
) -> None:
    """Each stream runs twice on one connection (so its texts are decided, then taken by C's decisions),
    then reads the table: the replies of the C relay's proxy equal the Python relay's."""
    dsn, fast, slow = relay_pair
    database = dbname(dsn)
    run = next(_runs)
    replies = []
    engine = fast.server.fast
    assert engine is not None
    hits, shapes, rewrites = (
        engine.counts().decision_hits,
        engine.counts().shape_hits,
        engine.counts().rewrites,
    )
    asked = fast.server.metrics.fast_requests.get("decision", 0)
    for proxy, side in ((slow, "s"), (fast, "f")):
        other = f"o{run}{side}"
        messages = [
            _session_message(kind, text.replace("{o}", other).replace("{n}", str(11 + round_)))
            for round_ in range(2)
            for kind, text in stream
        ]
        messages.append(p.encode_query("SELECT id, v FROM t ORDER BY id"))
        replies.append(_exchange(proxy, database, messages, pipelined, session=f"h{run}{side}"))
    assert replies[1] == replies[0]
    assert wait_for(lambda: not fast.server.connections and not slow.server.connections)
    _decided.append(engine.counts().decision_hits - hits)
    _shaped.append(engine.counts().shape_hits - shapes)
    _promoted.append(engine.counts().rewrites - rewrites)
    _asked.append(fast.server.metrics.fast_requests.get("decision", 0) - asked)
    if not any(kind.startswith("promoted") for kind, _ in stream):
        _rewrote.append(engine.counts().rewrites - rewrites)


_decided: list[int] = []  # decisions C took, per example of the comparison above
_shaped: list[int] = []  # of those, by a shape's decision
_promoted: list[int] = []  # promotions' Parses C sent
_asked: list[int] = []  # cold texts C asked Python about and took by the answer
_rewrote: list[int] = []  # rewritten Queries C sent (examples with no promotion)


def test_the_comparison_ran_decisions_on_the_fast_relay() -> None:
    if not _decided:
        pytest.skip("the comparison did not run in this session")
    assert sum(_decided) > 0, _decided
    assert sum(_shaped) > 0, _shaped
    assert sum(_promoted) > 0, _promoted
    assert sum(_asked) > 0, _asked
    assert sum(_rewrote) > 0, _rewrote
