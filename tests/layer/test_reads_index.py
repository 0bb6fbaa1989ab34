"""Layer 55: cow.reads keeps one index, its primary key (session, seq), which serves its readers (a session's
reads in seq order, and the triggers that drop them); an upgrade from layer 54 keeps the rows. From layer 57
the rows' table is cow.read_rows (cow.reads a view over it and cow.read_runs, each keyed the same way)."""

from __future__ import annotations

import psycopg

from migrations import install_layer
from tests.fix_layer import reads_as_layer_56
from tests.layer.test_install import run

INSERT = (
    "INSERT INTO cow.reads (session, operation, at, fingerprint, statement, params, duration_us)"
    " VALUES (%s, 'op', now(), 'fp', 'SELECT 1', NULL, 1)"
)
INDEXES = (
    "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid), indisprimary FROM pg_index"
    " WHERE indrelid = %s::regclass ORDER BY 1"
)


def _one_index(conn: psycopg.Connection[tuple[object, ...]], table: str = "cow.read_rows") -> None:
    (index,) = conn.execute(INDEXES, (table,)).fetchall()
    # (the rows' table keeps the key's name of the table it was)
    assert index[0] == {"cow.read_runs": "cow.read_runs_pkey"}.get(table, "cow.reads_pkey")
    assert index[2] is True
    assert index[1].endswith("USING btree (session, seq)")


def test_a_sessions_reads_use_the_one_index(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        _one_index(conn)
        _one_index(conn, "cow.read_runs")
        for session in ("ix1", "ix2", "ix1"):
            conn.execute(INSERT, (session,))
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN SELECT statement FROM cow.reads WHERE session = 'ix1' ORDER BY seq"
            ).fetchall()
        )
        assert "reads_pkey" in plan and "read_runs_pkey" in plan and "Seq Scan" not in plan, plan
        seqs = [r[0] for r in conn.execute("SELECT seq FROM cow.reads WHERE session = 'ix1' ORDER BY seq")]
        assert len(seqs) == 2 and seqs[0] < seqs[1]


def test_the_upgrade_from_54_keeps_the_rows_and_leaves_one_index(layer_db: str) -> None:
    with psycopg.connect(layer_db, autocommit=True) as conn:
        # cow.reads as layer 54 left it: the primary key seq and the index (session, seq).
        reads_as_layer_56(conn)
        conn.execute("ALTER TABLE cow.reads DROP CONSTRAINT reads_pkey, ADD PRIMARY KEY (seq)")
        conn.execute("CREATE INDEX reads_session ON cow.reads (session, seq)")
        conn.execute("DELETE FROM cow.migrations WHERE version = 55")
        for session in ("up1", "up2", "up1"):
            conn.execute(INSERT, (session,))
        assert len(conn.execute(INDEXES, ("cow.reads",)).fetchall()) == 2
    assert run(layer_db, install_layer).applied == (55, 57)
    with psycopg.connect(layer_db, autocommit=True) as conn:
        _one_index(conn)
        rows = conn.execute("SELECT session FROM cow.reads ORDER BY seq").fetchall()
        assert [r[0] for r in rows] == ["up1", "up2", "up1"]
