"""Running a statement again after the layer's row-changed 40001, as READ COMMITTED would have run it.

In a session an ``UPDATE`` or ``DELETE`` that another transaction of the session changed a row under (it
waited for that transaction's row lock, or the row's version changed after the statement's snapshot) fails
with 40001: the overlay view's scan read the row before the change, and an ``INSTEAD OF`` trigger cannot
evaluate the statement's ``WHERE`` and ``SET`` again on the row's new version as PostgreSQL's EvalPlanQual
does on the plain table. When the statement ran alone in its implicit transaction (autocommit: a simple Query
of one statement, or an extended-protocol batch with one Execute before its Sync, started with the connection
idle) its failure left nothing, and running it again is what READ COMMITTED gives: a statement that reads the
committed new version. ``Reruns`` does that for the relay (``proxy/relay.py``), holding the statement's
replies until they show whether it failed so, and the client sees one result. The layer marks the 40001
it may run again with ``RERUN_HINT`` (``cow._row_changed_hint()``, only in READ COMMITTED); any other 40001
reaches the client as is.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from proxy import protocol as p
from proxy.replies import KIND_LETTERS, Entry, Kind
from proxy.sql import Analysis

SQLSTATE = "40001"
# cow._row_changed_hint() in READ COMMITTED (migrations/sql/functions/10_core.sql): exactly this text.
RERUN_HINT = "Retry the transaction: in READ COMMITTED it runs on the row's new version."
# Runs after the first: each one means yet another transaction of the session changed a row the statement
# writes while it ran. After them the 40001 goes to the client (whose retry loop is there for it).
MAX_RERUNS = 5
# Write kinds whose statements may get that 40001 (an INSERT's only through a rewrite: an upsert's UPDATE).
_REWRITING_KINDS = frozenset({"update", "delete", "merge", "truncate"})
_A = ord("A")
# Replies that do not yet show whether a statement succeeded: RowDescription, NoticeResponse.
_UNDECIDED = frozenset(b"TN")


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


def batch_plan(messages: list[tuple[bytes, Kind]], sync: bytes) -> Plan | None:
    """How to run an extended batch's statement again (``messages`` as sent before its ``sync``), if the batch
    is one Execute, last, of a portal bound in it: its Binds, portal Describes, Execute and Sync (the
    Binds' and Describes' replies the client has already: ``echo``). None: a batch of another shape."""
    kinds = [kind for _, kind in messages]
    if kinds.count(Kind.EXECUTE) != 1 or kinds[-1] != Kind.EXECUTE or Kind.BIND not in kinds:
        return None
    if any(kind not in (Kind.PARSE, Kind.BIND, Kind.DESCRIBE, Kind.EXECUTE) for kind in kinds):
        return None
    resend = [
        Resend(raw, kind, kind != Kind.EXECUTE)
        for raw, kind in messages
        if kind in (Kind.BIND, Kind.EXECUTE) or (kind == Kind.DESCRIBE and raw[5:6] == b"P")
    ]
    resend.append(Resend(sync, Kind.SYNC, False))
    return Plan(tuple(resend))


class Reruns:
    """One connection's statement that may run again: the extended batch's messages as sent so far (``group``;
    None: not such a batch), then the plan while it is in flight (what the client sends meanwhile is held:
    nothing may run between two runs), the statement's entry of the first run (its tag map), and whether the
    next ReadyForQuery ends a run that is to be run again (``due``)."""

    def __init__(self) -> None:
        self.group: list[tuple[bytes, Entry]] | None = None
        self.plan: Plan | None = None
        self.first: Entry | None = None
        self.due = False
        self.count = 0  # new runs sent

    def batch_started(self, at_transaction_start: bool) -> None:
        """A batch that starts an implicit transaction may hold a statement to run again: its messages."""
        self.group = [] if at_transaction_start else None

    def sent(self, raw: bytes, entry: Entry) -> None:
        if self.group is not None:
            self.group.append((raw, entry))

    def arm_batch(self, sync: bytes, skipped: bool, tagged: bool) -> None:
        """A Sync ends the batch: arm a new run of its statement if it is one Execute of a statement that may
        get the layer's row-changed 40001, bound in this batch, which started an implicit transaction. A new
        run sends the batch again but its Parses and statement Describes (the statement stays prepared,
        unnamed or named, after a failed transaction; a portal does not), and the client is not sent the
        replies it already has."""
        group, self.group = self.group, None
        if group is None or skipped or not tagged:
            return
        if any(entry.replace_error is not None for _, entry in group):
            return
        plan = batch_plan([(raw, entry.kind) for raw, entry in group], sync)
        if plan is not None:
            self.arm(plan, group[-1][1])

    def arm_query(self, raw: bytes, entry: Entry) -> None:
        self.arm(Plan((Resend(raw, Kind.QUERY, False),)), entry)

    def resume(self, batch: bytes, pending: Iterable[Entry]) -> None:
        """The C relay hands back a statement that may be run again (``batch``: its Query or batch as it
        sent it; the replies owed are ``pending``) before a reply that may be its failure: arm it as a Query
        or ``arm_batch`` would have (C took only a text or statement that may get the 40001, starting an
        implicit transaction; nothing it forwarded showed the outcome)."""
        reader = p.ClientReader()
        reader.expect_startup = False
        reader.feed(batch)
        frames = [event for event in reader.events() if isinstance(event, p.Frame) and event.kind != b"H"]
        if len(frames) == 1 and frames[0].kind == b"Q":
            plan: Plan | None = Plan((Resend(frames[0].raw, Kind.QUERY, False),))
            statement = Kind.QUERY
        elif frames and frames[-1].kind == b"S":
            sync = frames.pop().raw
            plan = batch_plan([(f.raw, KIND_LETTERS.get(f.kind.decode(), Kind.FUNC)) for f in frames], sync)
            statement = Kind.EXECUTE
        else:
            return
        entry = next((e for e in pending if e.kind == statement and not e.injected), None)
        if plan is not None and entry is not None:
            self.arm(plan, entry)

    def arm(self, plan: Plan, entry: Entry) -> None:
        """Hold the statement's replies (``entry``'s) until they show whether it is to run again, and what
        the client sends before it has ended: it would run before the new run."""
        entry.held = []
        self.plan = plan
        self.first = entry

    def succeeded(self) -> None:
        self.plan = self.first = None

    def reply(self, head: Entry, kind: int, raw: bytes) -> bytes | None:
        """A reply to the statement while its replies are ``held``: None when it does not go to the client
        now, else what was held to go before it. A run's RowDescription or notices wait until a row, its
        CommandComplete (or anything else) shows that it did not fail (then they go first)."""
        if kind == _A:
            return b""  # (a notification of another session's: not the statement's)
        assert head.held is not None
        if kind in _UNDECIDED:
            head.held.append(raw)
            return None
        held, head.held = head.held, None
        return b"".join(held)

    def error(self, head: Entry, fields: p.ErrorFields, raw: bytes) -> bytes:
        """The ErrorResponse of a statement that may run again: dropped, with what was held of the run, when
        it is the layer's row-changed 40001 of a READ COMMITTED transaction and runs are left (its
        ReadyForQuery then sends the new run: ``due``); otherwise the client gets it after what was held."""
        held, head.held = head.held or [], None
        plan = self.plan
        if not head.echo and plan is not None and plan.left > 0 and rerunnable(fields):
            self.due = True
            return b""
        self.plan = None  # (this run's error is the client's: no other)
        return b"".join(held) + raw

    def next_run(self) -> list[tuple[bytes, Entry]]:
        """The run failed with the layer's row-changed 40001 and its ReadyForQuery came (both dropped): the
        messages to send again, as the plan says, with their queue entries."""
        plan, first = self.plan, self.first
        assert plan is not None and first is not None
        self.plan = plan.next()
        self.due = False
        self.count += 1
        now = time.perf_counter()
        run = []
        for message in plan.messages:
            kind = Kind(message.kind)
            if message.echo:
                entry = Entry(kind, echo=True)
            elif kind in (Kind.QUERY, Kind.EXECUTE):
                entry = Entry(kind, tag_map=first.tag_map, rewritten=first.rewritten, started=now, held=[])
            else:
                entry = Entry(kind, started=now)
            run.append((message.raw, entry))
        return run
