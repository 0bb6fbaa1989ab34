"""The C relay writes its read records as runs itself (``FastRelay.adopt``'s ``encode``, ``take_reads``):
dictionary runs (proxy/reads.py, DICT_RUN) that ``run_rows`` decodes, byte for byte, into the rows
proxy/reads.py's ``encode_rows`` makes of the same records, which tests/proxy/test_reads.py checks against
``cow.reads`` (and tests/layer/test_read_runs.py the layer's reader of both kinds of runs). Compared on
bytes, no server: texts of any characters and lengths, parameters or none (written as they came: readers
derive the identity), every kind of operation (an id in force, a written transaction's ``xact:``, a
read-only one's), rows or none, and Queries taken by their shape's decision (``-M simple``), whose records
bring their own texts."""

from __future__ import annotations

import hashlib
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cowproxy.read_identity import identity
from proxy import fastrelay
from proxy.fastrelay import AVAILABLE, UNAVAILABLE, FastRead
from proxy.reads import (
    _NULL,
    DICT_MARK,
    ReadRecord,
    ReadRecorder,
    _Shapes,
    encode_rows,
    read_fingerprint,
    relations_read,
    run_rows,
    with_identities,
)
from proxy.sql import Catalog, shapes
from tests.proxy_sql.catalogs import sample_catalog

pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"{UNAVAILABLE}")

READ_IDS = "readonly:0123456789ab"
TEXTS = (
    "SELECT * FROM projects p JOIN issues i ON i.project_id = p.id WHERE p.id = $1",
    "SELECT abalance FROM pgbench_accounts WHERE aid = $1",
    "  /* a comment */ SELECT 'tab\there', E'\\\\N', 'é' FROM projects  ",
    "SELECT " + ", ".join(f"c{i}" for i in range(80)) + " FROM issues",  # (over two BLAKE2b blocks)
    "SELEKT not sql",
)


def _python_operation(operation: str | None, number: int, xid: int) -> str:
    """The operation ClientConnection.fast_reads gives a record."""
    if operation is not None:
        return operation
    return f"xact:{xid}" if xid else f"{READ_IDS}.{number}"


def both(
    session: str,
    operation: str | None,
    texts: tuple[str, ...],
    records: list[FastRead],
    catalog: Catalog | None,
) -> tuple[bytes, bytes]:
    """(C's run decoded into COPY rows, Python's rows) of the same records; a record's ref is an index into
    ``texts``, or a decision's -(index + 1); a record with its own text (a Query C took by its shape's
    decision) names the text's shape, which C is given as its example."""
    refs: dict[int, tuple[int, str, bool]] = {}
    for ref, *_, own in records:
        if own is None:
            refs[ref] = (ref, texts[ref if ref >= 0 else -ref - 1], False)
        else:
            key = shapes.key(own)
            assert key is not None
            refs[ref] = (ref, shapes.example(key), True)
    recorder = ReadRecorder("postgresql://unused@127.0.0.1:1/x")
    encode = recorder.encoder(session, operation, READ_IDS, refs.values(), catalog)
    assert fastrelay._fastrelay is not None
    run = fastrelay._fastrelay.encode_run(encode, records)
    assert run.startswith(DICT_MARK) or not records
    c_rows = run_rows(run, session)
    python = [
        ReadRecord(
            "db",
            session,
            _python_operation(operation, number, xid),
            refs[ref][1] if own is None else own.decode(),
            params,
            rows,
            ended,
            us,
            catalog,
        )
        for ref, rows, ended, us, params, number, xid, own in records
    ]
    return c_rows, encode_rows(python, _Shapes())


def test_the_c_relays_rows_are_the_writers_bytes() -> None:
    """Each text, with and without parameters and rows, under each kind of operation."""
    now = time.time()
    records: list[FastRead] = []
    for i in range(len(TEXTS)):
        records.append((i, 3, now, 41, b"\0\0\0\x01\0\0\0\x0212", 7, 0, None))
        records.append((-(i + 1), None, now + 0.5, 0, None, 8, 2**64 - 1, None))
        records.append((i, 0, now - 86_400.25, 1_000_000, b"\x01" * 300, 9, 12345, None))
    for operation in ("op-7", None):
        c_rows, python_rows = both("s1", operation, TEXTS, records, sample_catalog())
        assert c_rows == python_rows
    assert b"public.projects" in c_rows and b"xact:18446744073709551615" in c_rows
    assert f"{READ_IDS}.7".encode() in c_rows


def test_the_rows_carry_the_parameters_and_an_older_layers_identity_is_hashlibs_blake2b() -> None:
    """C writes a read's Bind parameters as they came (short ones kept in the record, long ones not), the
    identity left to readers; for a layer before 52 the writer puts in its place the identity, hashlib's
    8-byte BLAKE2b of the text, a NUL and the parameters (lengths around the block size, 127-129 bytes),
    which is what readers derive from a layer 52 row."""
    for n in (0, 1, 39, 40, 41, 63, 127, 128, 129, 255, 256, 257, 1000):
        text = "SELECT " + "x" * n
        for params in (None, b"", b"p" * n, bytes(range(256))[:n]):
            c_rows, python_rows = both("s1", "op", (text,), [(0, 1, 1.0e9, 2, params, 0, 0, None)], None)
            assert c_rows == python_rows
            field = _NULL if params is None else len(params).to_bytes(4, "big") + params
            at = len(c_rows) - 24 - len(field)  # (the row ends with the parameters, rows and duration_us)
            assert c_rows[at : at + len(field)] == field
            data = text.strip().encode() + (b"" if params is None else b"\0" + params)
            expected = hashlib.blake2b(data, digest_size=8).hexdigest()
            assert identity(text.strip(), params) == expected
            ident = b"\0\0\0\x10" + expected.encode()
            assert with_identities(c_rows) == c_rows[:at] + ident + c_rows[at + len(field) :]


_RECORDS = st.tuples(
    st.just(0),
    st.none() | st.integers(0, 2**62),  # rows
    st.floats(946_684_800.0, 4_102_444_800.0),  # ended
    st.integers(0, 10**9),  # duration in µs
    st.none() | st.binary(max_size=400),  # Bind parameters
    st.integers(0, 2**62),  # the transaction's number
    st.integers(0, 2**64 - 1),  # its id
    st.none(),  # its own text
)


@settings(max_examples=150, deadline=None)
@given(
    text=st.text(min_size=1, max_size=300),
    record=_RECORDS,
    operation=st.none() | st.sampled_from(["op1", "xact:5", "a" * 128]),
)
def test_any_record_is_the_same_bytes_from_c_and_python(
    text: str, record: FastRead, operation: str | None
) -> None:
    c_rows, python_rows = both("sess.1", operation, (text,), [record, record], sample_catalog())
    assert c_rows == python_rows


# Texts with literals of each class (pgbench -M simple's among them); the spaces around a text that the
# server (and so the lexer and pglast) takes for spaces: a record's text has no others at its edges (U+3000
# there is an identifier character to the server, a syntax error), though C strips those as Python does.
SHAPED = (
    "SELECT abalance FROM pgbench_accounts WHERE aid = 1;",
    "SELECT abalance FROM pgbench_accounts WHERE aid = 2147483647;",
    "SELECT * FROM projects WHERE name = 'x' AND budget > 1.5 AND id = -3",
    "SELECT * FROM projects WHERE name = '' AND budget > 99999999999 AND id = -0",
    "SELECT i.title FROM issues i JOIN projects p ON p.id = i.project_id WHERE p.name = 'é ''q'''",
)
_SPACES = st.text(st.sampled_from(" \t\n\r\x0c"), max_size=4)


def test_a_shapes_example_has_its_texts_fingerprint_and_tables() -> None:
    """The head C is given for a shape's decision comes from ``shapes.example``: pglast's fingerprint and
    the tables of every text of the shape."""
    catalog = sample_catalog()
    for text in SHAPED:
        key = shapes.key(text.encode())
        assert key is not None
        example = shapes.example(key)
        assert example != text
        assert read_fingerprint(example) == read_fingerprint(text)
        assert relations_read(example, catalog) == relations_read(text, catalog)
    assert relations_read(shapes.example(shapes.key(SHAPED[4].encode()) or b""), catalog) == (
        "public.issues",
        "public.projects",
    )


def test_queries_taken_by_their_shape_are_the_writers_bytes() -> None:
    """A record with its own text (``-M simple`` on the C relay): its statement is the text stripped as
    Python strips it and cut at MAX_TEXT characters, its identity the digest of that."""
    now = time.time()
    long_text = "SELECT name FROM projects WHERE name = 'é" + "ü" * 5000 + "'"
    pads = (("", ""), ("  ", " "), ("\n\t", "\r\n"), ("\x0c ", " \x0c"))
    texts = [lead + text + trail for text in (*SHAPED, long_text) for lead, trail in pads]
    records: list[FastRead] = [  # (one decision per shape: the pads that are not spaces to the lexer count)
        (-(i + 1), i, now + i, 10 + i, None, i, 0, text.encode()) for i, text in enumerate(texts)
    ]
    for operation in ("op", None):
        c_rows, python_rows = both("s1", operation, (), records, sample_catalog())
        assert c_rows == python_rows
    assert b"aid = 2147483647;" in c_rows and b"aid = 1;" in c_rows
    assert "ü".encode() * 3959 in c_rows and "ü".encode() * 3960 not in c_rows  # (4,000 characters)


@settings(max_examples=150, deadline=None)
@given(
    literal=st.text(
        st.characters(blacklist_characters="'\\\0/*", blacklist_categories=("Cs",)), max_size=300
    ),
    lead=_SPACES,
    trail=_SPACES,
    record=_RECORDS,
)
def test_any_query_taken_by_its_shape_is_the_same_bytes(
    literal: str, lead: str, trail: str, record: FastRead
) -> None:
    own = f"{lead}SELECT name FROM projects WHERE name = '{literal}'{trail}".encode()
    _, rows, ended, us, _, number, xid, _ = record
    records: list[FastRead] = [(-1, rows, ended, us, None, number, xid, own)]
    c_rows, python_rows = both("sess.1", None, (), records, sample_catalog())
    assert c_rows == python_rows


def test_a_run_holds_each_statement_once_and_a_read_in_a_few_bytes() -> None:
    """A take of 1,000 reads of two statements (pgbench -S's, and a join) holds each text, fingerprint and
    table list once; a read with 8 bytes of parameters is 42 bytes with the operation id in force, 50 with a
    read-only transaction's of its own (where a COPY row per read was ~200)."""
    now = time.time()
    catalog = sample_catalog()
    records: list[FastRead] = [
        (i % 2, 1, now + i, 40, b"\0\0\0\x04\0\0\0\x07", i, 0, None) for i in range(1000)
    ]
    recorder = ReadRecorder("postgresql://unused@127.0.0.1:1/x")
    assert fastrelay._fastrelay is not None
    for operation, per_read in (("op-1", 42), (None, 50)):
        reads = [(0, TEXTS[1], False), (1, TEXTS[0], False)]
        encode = recorder.encoder("s1", operation, READ_IDS, reads, catalog)
        run = fastrelay._fastrelay.encode_run(encode, records)
        for text in (TEXTS[0], TEXTS[1], "public.projects", read_fingerprint(TEXTS[0])):
            assert run.count(text.encode()) == 1
        rows = run_rows(run, "s1")
        assert rows.count(TEXTS[1].encode()) == 500
        head = len(run) - 1000 * per_read
        assert head < len(TEXTS[0]) + len(TEXTS[1]) + 200 and len(rows) > 4 * len(run)
