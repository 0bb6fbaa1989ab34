"""The identity of a recorded read (``cow.reads``): equal for the same text with the same bound parameters,
which is what a repeated identical read is (docs/scoring.md, "Reads").

It is the 16 hex digits of BLAKE2b (8 bytes) of the statement's text as stored (UTF-8), followed, for a read
with a Bind message, by a NUL and the Bind's parameters (the message after the portal's name). From layer 52
the proxy stores the parameters (``params``) instead of hashing them on its path, and readers derive the
identity here; rows of older proxies keep the identity they were written with (the same digest).
"""

from __future__ import annotations

import hashlib
from typing import Any


def identity(statement: str, params: bytes | None) -> str:
    """The identity of a read of ``statement`` (as stored) with ``params`` (None: a simple query's)."""
    return identity_of_bytes(statement.encode(), params)


def identity_of_bytes(statement: bytes, params: bytes | None) -> str:
    """``identity`` of the statement's UTF-8 bytes."""
    digest = hashlib.blake2b(statement, digest_size=8)
    if params is not None:
        digest.update(b"\0")
        digest.update(params)
    return digest.hexdigest()


def row_identity(stored: str | None, statement: str, params: bytes | None) -> str:
    """A ``cow.reads`` row's identity: the one it was written with, else derived from its text and
    parameters."""
    return stored if stored is not None else identity(statement, params)


# What a reader asks first: whether the layer has read traces (cow.reads, layer 50) and stores parameters
# (layer 52; before it every row carries its identity, and a NULL stands for the column).
_READS_LAYER = """
SELECT pg_catalog.to_regclass('cow.reads') IS NOT NULL, EXISTS (
    SELECT 1 FROM pg_catalog.pg_attribute
    WHERE attrelid = pg_catalog.to_regclass('cow.reads') AND attname = 'params' AND NOT attisdropped
)
"""


async def params_column(conn: Any) -> str | None:
    """The select-list item of cow.reads' parameters on this connection's layer (asyncpg): ``params``, a
    NULL in its place before layer 52, or None when the layer has no read traces."""
    row = await conn.fetchrow(_READS_LAYER)
    if row is None or not row[0]:
        return None
    return "params" if row[1] else "NULL::bytea AS params"
