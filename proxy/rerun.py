"""Running a statement again after the layer's row-changed 40001, as READ COMMITTED would have run it.

In a session an ``UPDATE`` or ``DELETE`` that another transaction of the session changed a row under (it
waited for that transaction's row lock, or the row's version changed after the statement's snapshot) fails
with 40001: the overlay view's scan read the row before the change, and an ``INSTEAD OF`` trigger cannot
evaluate the statement's ``WHERE`` and ``SET`` again on the row's new version as PostgreSQL's EvalPlanQual
does on the plain table. When the statement ran alone in its implicit transaction (autocommit: a simple Query
of one statement, or an extended-protocol batch with one Execute before its Sync, started with the connection
idle) its failure left nothing, and running it again is what READ COMMITTED gives: a statement that reads the
committed new version. The relay (``proxy/relay.py``) does that, holding the statement's replies until they
show whether it failed so, and the client sees one result. The layer marks the 40001 it may run again with
``RERUN_HINT`` (``cow._row_changed_hint()``, only in READ COMMITTED); any other 40001 reaches the client as
is.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy import protocol as p
from proxy.sql import Analysis

SQLSTATE = "40001"
# cow._row_changed_hint() in READ COMMITTED (migrations/sql/functions/10_core.sql): exactly this text.
RERUN_HINT = "Retry the transaction: in READ COMMITTED it runs on the row's new version."
# Runs after the first: each one means yet another transaction of the session changed a row the statement
# writes while it ran. After them the 40001 goes to the client (whose retry loop is there for it).
MAX_RERUNS = 5
# Write kinds whose statements may get that 40001 (an INSERT's only through a rewrite: an upsert's UPDATE).
_REWRITING_KINDS = frozenset({"update", "delete", "merge", "truncate"})


def may_rerun(verdict: Analysis) -> bool:
    """Whether a statement of a session may fail with the layer's row-changed 40001 (and so is worth holding
    the replies of, when it runs alone in its implicit transaction): one statement that updates or deletes
    rows, or a rewritten write (an upsert's ``ON CONFLICT DO UPDATE``)."""
    if verdict.kind == "multi" or not verdict.writes or verdict.error is not None or verdict.tampers:
        return False
    return verdict.rewritten is not None or any(kind in _REWRITING_KINDS for _, kind in verdict.writes)


def rerunnable(error: p.ErrorFields) -> bool:
    """The layer's row-changed 40001 of a READ COMMITTED transaction (never a genuine serialization failure,
    REPEATABLE READ's, or a commit's conflict: those carry no such hint)."""
    return error.sqlstate == SQLSTATE and error.get("H") == RERUN_HINT


@dataclass(frozen=True, slots=True)
class Resend:
    """One message to send again for a new run: its bytes, the reply kind it is owed (``relay.Kind``), and
    whether the client already has its reply (a Bind's BindComplete, a portal Describe's RowDescription or
    NoData: dropped) or it is the statement's run (its replies held as the first run's were)."""

    raw: bytes
    kind: int
    echo: bool


@dataclass(frozen=True, slots=True)
class Plan:
    """What a new run sends (in order, ending with the Query or the Sync) and how many runs are left."""

    messages: tuple[Resend, ...]
    left: int = MAX_RERUNS

    def next(self) -> Plan:
        return Plan(self.messages, self.left - 1)
