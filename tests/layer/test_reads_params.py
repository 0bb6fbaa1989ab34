"""Layer 52: cow.reads stores a read's Bind parameters and readers derive its identity (the proxy no longer
hashes it). An upgrade from layer 51 keeps the rows written before with their identities; `cowproxy session
reads` and the scorer give the same identities and repeated reads for rows of either kind."""

from __future__ import annotations

import hashlib
import json

import psycopg

from cowproxy.read_identity import identity
from migrations import install_layer
from scoring.extract import fetch_reads
from tests.fix_layer import reads_as_layer_56
from tests.layer.test_cli import cli
from tests.layer.test_install import run

TEXT = "SELECT name FROM customers WHERE id = $1"
INSERT = (
    "INSERT INTO cow.reads (session, operation, at, fingerprint, statement, identity, {params} duration_us)"
    " VALUES (%s, 'op', now(), 'fp', %s, %s, {value} 1)"
)


def _as_layer_51(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """cow.reads as migration 51 left it (no params, identity NOT NULL), 52 not applied (nor 57)."""
    reads_as_layer_56(conn)
    conn.execute("ALTER TABLE cow.reads DROP COLUMN params, ALTER COLUMN identity SET NOT NULL")
    conn.execute("DELETE FROM cow.migrations WHERE version = 52")


def _old_row(conn: psycopg.Connection[tuple[object, ...]], session: str, params: bytes | None) -> None:
    """A row as a proxy before layer 52 wrote it: the identity hashed, no parameters."""
    conn.execute(INSERT.format(params="", value=""), (session, TEXT, identity(TEXT, params)))


def _new_row(conn: psycopg.Connection[tuple[object, ...]], session: str, params: bytes | None) -> None:
    """A row as the proxy writes it from layer 52: the parameters, no identity."""
    conn.execute(INSERT.format(params="params,", value="%s,"), (session, TEXT, None, params))


def test_the_upgrade_from_51_keeps_old_identities_and_readers_derive_new_ones(layer_db: str) -> None:
    key1, key2 = b"\0\0\0\x01\0\0\0\x011", b"\0\0\0\x01\0\0\0\x012"
    with psycopg.connect(layer_db, autocommit=True) as conn:
        _as_layer_51(conn)
        for params in (key1, key2, key1, None):
            _old_row(conn, "up1", params)
    assert run(layer_db, install_layer).applied == (52, 57)
    with psycopg.connect(layer_db, autocommit=True) as conn:
        nullable = conn.execute(
            "SELECT attnotnull FROM pg_attribute"
            " WHERE attrelid = 'cow.read_rows'::regclass AND attname = 'identity'"
        ).fetchone()
        assert nullable == (False,)
        stored = conn.execute("SELECT identity, params FROM cow.reads WHERE session = 'up1' ORDER BY seq")
        assert [r[1] for r in stored] == [None] * 4  # (the old rows keep their identities)
        for params in (key1, key2, key1, None):
            _new_row(conn, "up1", params)
    # The same reads written either way have the same identity: 4 of the 8 repeat an earlier one.
    expected = [identity(TEXT, p) for p in (key1, key2, key1, None)] * 2
    assert expected[0] == hashlib.blake2b(TEXT.encode() + b"\0" + key1, digest_size=8).hexdigest()
    out = cli("session", "reads", "up1", "--format", "json", dsn=layer_db)
    assert out.returncode == 0, out.stderr
    (operation,) = json.loads(out.stdout)["operations"]
    assert [r["identity"] for r in operation["reads"]] == expected
    assert operation["repeated"] == 5
    scored = run(layer_db, lambda conn: fetch_reads(conn, "up1"))
    assert [r.identity for r in scored] == expected


def test_readers_of_a_layer_before_52_take_the_stored_identities(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        _as_layer_51(conn)
        for params in (b"k1", b"k1", None):
            _old_row(conn, "old1", params)
    out = cli("session", "reads", "old1", "--format", "json", dsn=layer_db)
    assert out.returncode == 0, out.stderr
    (operation,) = json.loads(out.stdout)["operations"]
    assert [r["identity"] for r in operation["reads"]] == [identity(TEXT, p) for p in (b"k1", b"k1", None)]
    assert operation["repeated"] == 1
    scored = run(layer_db, lambda conn: fetch_reads(conn, "old1"))
    assert [r.identity for r in scored] == [identity(TEXT, p) for p in (b"k1", b"k1", None)]
