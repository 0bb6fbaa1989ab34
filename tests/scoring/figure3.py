"""The paper's Figure 3 (docs/scoring.md) as data: the writes of both sessions and the expected scores."""

from __future__ import annotations

from typing import Any

from scoring import ColumnMeta, ForeignKey, Metadata, TableMeta, Write

TICKETS = "public.tickets"
COMMENTS = "public.comments"

METADATA = Metadata(
    {
        TICKETS: TableMeta(
            TICKETS,
            (
                ColumnMeta("id", "text", "text"),
                ColumnMeta("title", "text", "text"),
                ColumnMeta("status", "text", "text"),
                ColumnMeta("priority", "text", "text"),
                ColumnMeta("updated_at", "timestamp with time zone", "timestamp"),
            ),
            ("id",),
        ),
        COMMENTS: TableMeta(
            COMMENTS,
            (
                ColumnMeta("id", "text", "text"),
                ColumnMeta("ticket_id", "text", "text"),
                ColumnMeta("body", "text", "text"),
                ColumnMeta("updated_at", "timestamp with time zone", "timestamp"),
            ),
            ("id",),
            (ForeignKey(("ticket_id",), TICKETS, ("id",)),),
        ),
    }
)

T103 = {"id": "T-103", "title": "Checkout page times out", "status": "resolved", "priority": "high"}
T106 = {"id": "T-106", "title": "Refund request for order 5512", "status": "open", "priority": "medium"}
T108 = {"id": "T-108", "title": "Password reset email never arrives", "status": "open", "priority": "urgent"}
T107 = {"id": "T-107", "title": "Update the billing FAQ wording", "status": "closed", "priority": "low"}
C201 = {"id": "C-201", "ticket_id": "T-106", "body": "Refund approved, processing within 3 days."}
C202 = {"id": "C-202", "ticket_id": "T-107", "body": "FAQ reworded per marketing."}

# Rows as the CoW layer would give them (the base row T-103 existed before; the rest are inserts).
GT_ROWS: list[tuple[str, str, dict[str, Any], bool]] = [
    ("gt-op1", TICKETS, T103, False),
    ("gt-op2", TICKETS, T106, True),
    ("gt-op3", TICKETS, T108, True),
    ("gt-op4", COMMENTS, C201, True),
]
AGENT_ROWS: list[tuple[str, str, dict[str, Any], bool]] = [
    ("op01", TICKETS, T106, True),
    ("op02", COMMENTS, C201, True),
    ("op03", TICKETS, T103, False),
    ("op04", TICKETS, T107, True),
    ("op05", COMMENTS, C202, True),
]


def writes(rows: list[tuple[str, str, dict[str, Any], bool]], with_created: bool = True) -> list[Write]:
    return [
        Write(
            table,
            {"id": row["id"]},
            {**row, "updated_at": f"2026-01-0{i + 1}T00:00:00Z"},
            op,
            i + 1,
            created=created if with_created else None,
        )
        for i, (op, table, row, created) in enumerate(rows)
    ]


EXPECTED = {
    "struct_score": 0.5,
    "content_score": 1.0,
    "precision": 0.6,
    "recall": 0.75,
    "f1": 2 * 0.6 * 0.75 / 1.35,
    "overall": 0.75,
    "agent_cow_weighted": 0.71,
    "efficiency": 0.8,
    "u_struct": {"op01": 0.25, "op02": 0.25, "op03": 0.25, "op04": -0.15, "op05": -0.10},
}
