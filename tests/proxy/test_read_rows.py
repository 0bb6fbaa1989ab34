"""The C relay writes its read records as COPY rows itself (``FastRelay.adopt``'s ``encode``,
``take_reads``): byte for byte the rows proxy/reads.py's ``encode_rows`` makes of the same records, which
tests/proxy/test_reads.py checks against ``cow.reads``. Compared on bytes, no server: texts of any
characters and lengths (the identity's BLAKE2b over several blocks), parameters or none, every kind of
operation (an id in force, a written transaction's ``xact:``, a read-only one's), rows or none."""

from __future__ import annotations

import hashlib
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import fastrelay
from proxy.fastrelay import AVAILABLE, UNAVAILABLE, FastRead
from proxy.reads import ReadRecord, ReadRecorder, _Shapes, encode_rows
from proxy.sql import Catalog
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
    """(C's rows, Python's rows) of the same records; a record's ref is an index into ``texts``, or a
    decision's -(index + 1)."""
    refs = {ref: texts[ref if ref >= 0 else -ref - 1] for ref, *_ in records}
    recorder = ReadRecorder("postgresql://unused@127.0.0.1:1/x")
    encode = recorder.encoder(session, operation, READ_IDS, refs.items(), catalog)
    assert fastrelay._fastrelay is not None
    c_rows = fastrelay._fastrelay.encode_rows(encode, records)
    python = [
        ReadRecord(
            "db",
            session,
            _python_operation(operation, number, xid),
            refs[ref],
            params,
            rows,
            ended,
            us,
            catalog,
        )
        for ref, rows, ended, us, params, number, xid in records
    ]
    return c_rows, encode_rows(python, _Shapes())


def test_the_c_relays_rows_are_the_writers_bytes() -> None:
    """Each text, with and without parameters and rows, under each kind of operation."""
    now = time.time()
    records: list[FastRead] = []
    for i in range(len(TEXTS)):
        records.append((i, 3, now, 41, b"\0\0\0\x01\0\0\0\x0212", 7, 0))
        records.append((-(i + 1), None, now + 0.5, 0, None, 8, 2**64 - 1))
        records.append((i, 0, now - 86_400.25, 1_000_000, b"\x01" * 300, 9, 12345))
    for operation in ("op-7", None):
        c_rows, python_rows = both("s1", operation, TEXTS, records, sample_catalog())
        assert c_rows == python_rows
    assert b"public.projects" in c_rows and b"xact:18446744073709551615" in c_rows
    assert f"{READ_IDS}.7".encode() in c_rows


def test_the_identity_is_hashlibs_blake2b() -> None:
    """The identity C writes for lengths around the block size (127-129 bytes: the last block is
    compressed as the last only at the end) is hashlib's 8-byte BLAKE2b of the text, a NUL and the
    parameters."""
    for n in (0, 1, 63, 127, 128, 129, 255, 256, 257, 1000):
        text = "SELECT " + "x" * n
        for params in (None, b"", b"p" * n):
            c_rows, python_rows = both("s1", "op", (text,), [(0, 1, 1.0e9, 2, params, 0, 0)], None)
            data = text.strip().encode() + (b"" if params is None else b"\0" + params)
            expected = hashlib.blake2b(data, digest_size=8).hexdigest().encode()
            assert expected in c_rows
            assert c_rows == python_rows


_RECORDS = st.tuples(
    st.just(0),
    st.none() | st.integers(0, 2**62),  # rows
    st.floats(946_684_800.0, 4_102_444_800.0),  # ended
    st.integers(0, 10**9),  # duration in µs
    st.none() | st.binary(max_size=400),  # Bind parameters
    st.integers(0, 2**62),  # the transaction's number
    st.integers(0, 2**64 - 1),  # its id
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
