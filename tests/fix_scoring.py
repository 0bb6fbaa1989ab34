"""A database with the CoW layer where the paper's Figure 3 sessions were recorded through the layer.

The schema is a small helpdesk (tickets, comments with a foreign key); the ground-truth session ``gt-fig3``
and the agent session ``agent-fig3`` replay the paper's Figure 3 writes (docs/scoring.md) as SQL through the
overlay views.
Scoring only reads, so one database serves the module's tests.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql

from tests.fix_db import install_layer_at
from tests.scoring import figure3 as f3

SCHEMA = """
CREATE TABLE tickets (
    id text PRIMARY KEY,
    title text NOT NULL,
    status text NOT NULL DEFAULT 'open',
    priority text NOT NULL DEFAULT 'medium',
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE comments (
    id text PRIMARY KEY,
    ticket_id text NOT NULL REFERENCES tickets (id) ON DELETE CASCADE,
    body text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE notes (
    id serial PRIMARY KEY,
    body text NOT NULL
);
INSERT INTO tickets (id, title, status, priority) VALUES
    ('T-101', 'Login button misaligned', 'open', 'low'),
    ('T-102', 'Export to CSV drops accents', 'open', 'medium'),
    ('T-103', 'Checkout page times out', 'open', 'high'),
    ('T-104', 'Dark mode contrast too low', 'open', 'low');
"""


def record(
    conn: psycopg.Connection, session: str, rows: list[tuple[str, str, dict[str, object], bool]]
) -> None:
    """Replay (operation, table, row, created) as SQL in ``session``: inserts for new rows, updates else."""
    for op, table, row, created in rows:
        conn.execute("SELECT cow.use_session(%s, %s)", (session, op))
        name = sql.Identifier(table.rsplit(".", 1)[-1])
        if created:
            cols = [c for c in row if c != "updated_at"]
            query = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                name,
                sql.SQL(", ").join(map(sql.Identifier, cols)),
                sql.SQL(", ").join(sql.Placeholder() * len(cols)),
            )
            conn.execute(query, [row[c] for c in cols])
        else:
            sets = [c for c in row if c not in ("id", "updated_at")]
            query = sql.SQL("UPDATE {} SET {} WHERE id = %s").format(
                name, sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in sets)
            )
            conn.execute(query, [*(row[c] for c in sets), row["id"]])
    conn.execute("SELECT cow.use_session(NULL)")


@pytest.fixture(scope="module")
def fig3_dsn(create_database: Callable[..., str]) -> str:
    dsn = create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    install_layer_at(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for args in (
            ("gt-fig3", "ground_truth", "figure 3", None, None),
            ("agent-fig3", "agent", "figure 3", "scripted", "gt-fig3"),
            ("agent-perfect", "agent", None, "oracle", "gt-fig3"),
            ("agent-wrong-row", "agent", None, "sloppy", "gt-fig3"),
            ("agent-discarded", "agent", None, "gone", None),
            ("gt-serial", "ground_truth", None, None, None),
            ("agent-serial", "agent", None, "collides", "gt-serial"),
        ):
            conn.execute(
                "SELECT cow.create_session(%s, kind => %s, label => %s, model => %s, gt_session => %s)", args
            )
        record(conn, "gt-fig3", f3.GT_ROWS)
        record(conn, "agent-fig3", f3.AGENT_ROWS)
        conn.execute(
            "UPDATE cow.sessions SET metadata = '{\"completed\": true}' WHERE session_id = 'agent-fig3'"
        )
        record(conn, "agent-perfect", f3.GT_ROWS)
        # Edits another existing ticket than the ground truth's T-103, with other values.
        wrong = {"id": "T-104", "title": "Dark mode contrast too low", "status": "wontfix", "priority": "low"}
        record(conn, "agent-wrong-row", [("w1", f3.TICKETS, wrong, False)])
        record(conn, "agent-discarded", f3.GT_ROWS)
        conn.execute("SELECT cow.discard_session('agent-discarded')")
        # Both sessions get id 500 for different notes (as if each had its own sequence), and id 501 /
        # 900 for the same note: serial keys are paired by content, never by their values.
        record(
            conn, "gt-serial", [("n1", "notes", {"id": 500, "body": "Refund approved for order 5512"}, True)]
        )
        record(
            conn, "gt-serial", [("n2", "notes", {"id": 501, "body": "Customer asked for a callback"}, True)]
        )
        record(
            conn, "agent-serial", [("m1", "notes", {"id": 500, "body": "Quarterly newsletter draft"}, True)]
        )
        record(
            conn,
            "agent-serial",
            [("m2", "notes", {"id": 900, "body": "Customer asked for a callback"}, True)],
        )
    return dsn
