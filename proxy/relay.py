"""The per-connection relay logic, sans-IO: client events and server bytes in, bytes to send out.

One ``Relay`` per client connection, after authentication. It forwards what the client sends, follows the
server's replies by their headers (a queue of what each forwarded message will be answered with), and
injects ``SELECT cow.use_session($1, $2)`` with bound parameters when the tags a statement needs differ from
the tags in force on the upstream connection. Injected replies never reach the client.

The relay decides what to do with each client message and coordinates collaborators with one job each: the
reply queue (``replies.ReplyQueue``), the connection's tags (``tagging.Tagging``), held client events
(``held.HeldEvents``), the proxy's own statements (``injected.InjectedBatches``) and those of its users (the
catalog gate, the path check, the read trace's transaction id), promoted unnamed statements, statements run
again (``rerun.Reruns``), the client's prepared statements (``prepared.Prepared``) and the decisions the C
relay may apply (``decisions.Decisions``); ``at_rest``, ``hand_off`` and ``take_back`` are its side of the
hand-off to the C relay (``handoff``).

Statements the proxy refuses (tampering with a tagged session, malformed tags, oversized messages, errors
from the SQL analysis) are not answered locally: they are replaced by a statement that fails on the server
and the server's ErrorResponse is replaced by ours, so that the server's transaction state (an aborted
block, an implicit transaction rolled back, skipping to Sync) is exactly what the client is told.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from time import perf_counter
from typing import Any

from proxy import protocol as p
from proxy import rerun
from proxy.analysis import ProxyAnalyzer, query_kind
from proxy.catalog_gate import CatalogGate
from proxy.catalogs import CatalogStore, private_store
from proxy.decisions import STALE_LIST, Decisions, undecidable
from proxy.errors import ProtocolError, TagError
from proxy.handoff import (
    AT_REST,
    Adoption,
    ConnectionState,
    Decision,
    Named,
    PromotionsBack,
    PromotionsGiven,
    TxnCounts,
)
from proxy.held import HeldEvents
from proxy.hooks import Hooks, NoHooks
from proxy.injected import Done, InjectedBatches
from proxy.path_check import PathCheck
from proxy.prepared import KindIndex, Prepared, Slots, Statement
from proxy.read_trace import PendingRead, ReadsCallback, ReadTrace
from proxy.replies import Entry, Kind, ReplyQueue
from proxy.sql import Analysis
from proxy.tagging import Tagging
from proxy.tags import UNTAGGED, Tags
from proxy.unnamed import Promotions

# A statement that fails to parse: sent in place of a refused one (its error is replaced by ours).
REFUSED_SQL = "cowproxy refused this statement"
USE_SESSION_SQL = "SELECT cow.use_session($1, $2)"  # without a binding secret (docs/threat-model.md)
BIND_SESSION_SQL = "SELECT cow.bind_session($1, $2, $3)"  # the secret a bound parameter, never in the text
INJECT_STATEMENT = "__cowproxy_inject"
# A join between transactions runs in a read-write block of its own (Relay._inject): a bind records the
# binding, which a client whose transactions are read-only by default would otherwise refuse with 25006.
BEGIN_WRITABLE_SQL = "BEGIN READ WRITE"

SQLSTATE_TOO_LARGE = "54000"
SQLSTATE_REFUSED = "42501"
TAMPER_MESSAGE = (
    'cowproxy: a tagged connection may not leave or change its session (rule "session": cow.session_id, '
    "session_authorization, session_replication_role, search_path outside the rewrites, RESET ALL, DISCARD "
    "ALL, cow.use_session)"
)
# Errors a rewritten statement gets when the tables it names changed since the catalog was read (app DDL on
# another connection): columns missing (42703) or added (42601: a UNION of unequal column lists), a table
# gone (42P01), a column's type changed (42804), a prepared statement's result changed (0A000).
_STALE_CATALOG_STATES = frozenset({"42601", "42703", "42P01", "42804", "0A000"})


@dataclass(frozen=True, slots=True)
class FastAnswer:
    """Python's answer to the C relay's request (``Relay.decide_for_fast``): the row C takes the Query by, or
    None and why not (C hands the connection back at it; the reason labels the requests' metric)."""

    row: Decision | None
    reason: str = ""


# Client messages that may wait for an injected cow.use_session (see _prepare, _client_bind, "F").
_INJECTION_TRIGGERS = (b"Q", b"F", b"P", b"B")
_C = ord("C")
_A = ord("A")
_I = ord("I")


class Relay:
    """Sans-IO relay of one client connection (after authentication).

    Call ``client_event`` for each event of the client's ``ClientReader`` and ``server_data`` for each
    chunk from the server; then take ``to_server`` and ``to_client`` (lists of bytes, cleared by the
    caller). ``holding`` tells the caller to stop reading from the client (bounded buffering while the
    relay waits for an injected statement).
    """

    def __init__(
        self,
        analysis: ProxyAnalyzer,
        default_tags: Tags,
        route: Callable[[], Tags | None],
        hooks: Hooks | None = None,
        max_message: int = p.PG_MAX_MESSAGE,
        *,
        catalogs: CatalogStore | None = None,
        bind_secret: str | None = None,
        reads: ReadsCallback | None = None,
        read_ids: str | None = None,
    ) -> None:
        self.analysis = analysis
        self.tagging = Tagging(default_tags, route)  # the tags in force, and those the server has
        self.hooks: Hooks = hooks or NoHooks()
        self.max_message = max_message
        # How the upstream joins a session: bound with the layer's secret (SQL on the connection cannot undo
        # it), or, without a secret, cow.use_session (the GUCs only).
        self.bind_secret = bind_secret
        self.join_sql = USE_SESSION_SQL if bind_secret is None else BIND_SESSION_SQL
        # Read traces (proxy/reads.py): None when the connection's reads are not recorded.
        self.trace = ReadTrace(reads, read_ids)
        self.to_server: list[bytes] = []
        self.to_client: list[bytes] = []
        self.replies = ReplyQueue(self)  # what the server owes, and the state its replies show
        self.reruns = rerun.Reruns()  # a statement alone in its implicit transaction that may run again
        self.prepared = Prepared()  # the client's statements and portals
        self.injector = InjectedBatches(self)  # the proxy's own statements, ahead of the client's
        catalogs = catalogs or private_store()
        self.gate = CatalogGate(analysis, catalogs, self.injector)  # its catalog
        self.path = PathCheck(self.injector, self._release)  # where a session's unqualified writes resolve
        self.unnamed = Promotions()  # unnamed statements run as proxy-owned named ones
        # Texts the C relay may forward without asking (those of the database's catalog, shared).
        self.decisions = Decisions(analysis, self.trace, catalogs.decisions)
        self.held = HeldEvents()  # the client's events held while the proxy's statements go ahead
        self.closing = False
        # Joined at start (``start``) and no statement of the client's seen yet: its first goes through
        # Python, not the C relay (which would hand back at once a first text it was not given).
        self._first_due = False
        self._batch_started = 0.0
        self._query_entry = Entry(Kind.QUERY)  # reused by fast_query when nothing is in flight
        # A Query text the C relay asked about and was answered "hand back" for: its request counted the
        # analysis (a hit or a miss), so its relaying here next does not count it again.
        self._asked: str | None = None

    @property
    def catalog(self) -> Any:
        """The connection's catalog of the CoW tables (None: not read yet), as the gate holds it."""
        return self.gate.catalog

    @catalog.setter
    def catalog(self, catalog: Any) -> None:
        self.gate.catalog = catalog

    # ------------------------------------------------------------------------------------------------
    # Tags

    # ------------------------------------------------------------------------------------------------
    # Client side

    def client_event(self, event: p.ClientEvent) -> None:
        held = self.held
        if held.holding:
            held.add(event)
            return
        if self.reruns.plan is not None:
            # Pipelined behind a statement that may run again: nothing may run between two runs.
            held.hold(until_idle=True)
            held.add(event)
            return
        self._dispatch_client(event)

    def _dispatch_client(self, event: p.ClientEvent) -> None:
        if isinstance(event, p.Frame):
            self._client_frame(event)
        elif isinstance(event, p.StreamStart):
            self.to_server.append(event.header)
        elif isinstance(event, p.StreamChunk):
            self.to_server.append(event.data)
        elif isinstance(event, p.Oversized):
            self._oversized(event)
        else:  # a startup packet after authentication
            raise ProtocolError("unexpected startup packet")

    def _client_frame(self, frame: p.Frame) -> None:
        self._first_due = False
        kind = frame.kind
        if self.replies.skip_until_sync and kind != b"S":
            # The server discards everything up to Sync; so do we (no decisions, no queue entries).
            self.to_server.append(frame.raw)
            return
        if kind == b"Q":
            self._client_query(frame)
        elif kind == b"P":
            self._client_parse(frame)
        elif kind == b"B":
            self._client_bind(frame)
        elif kind == b"E":
            self._client_execute(frame)
        elif kind == b"S":
            self._client_sync(frame)
        elif kind == b"D":
            alias = self.unnamed.alias
            if alias is not None and frame.body == b"S\0":  # Describe of the unnamed statement
                self._extended(
                    Entry(Kind.DESCRIBE, promoted=alias, rewritten=True),
                    p.message(b"D", b"S" + alias.encode() + b"\0"),
                )
            else:
                self._extended(Entry(Kind.DESCRIBE), frame.raw)
        elif kind == b"C":
            close = p.decode_close(frame.body)
            self.prepared.close(close.kind, close.name)
            if close.kind != "S":
                self.trace.bind_params.pop(close.name, None)
            if close.kind == "S" and not close.name:
                self.unnamed.alias = None
            self._extended(Entry(Kind.CLOSE), frame.raw)
        elif kind == b"F":
            # A FunctionCall (the large-object API) runs with the connection's tags like any statement.
            tags = self.tagging.desired(None, self.replies.at_transaction_start())
            if self.tagging.needs_join(tags, self.replies.status) and not self._inject(tags, b"F"):
                self.held.put_back(frame)
                return
            self.tagging.fresh = False
            self.replies.push(Entry(Kind.FUNC, started=time.perf_counter()))
            self.to_server.append(frame.raw)
        elif kind == b"X":
            self.closing = True
            self.to_server.append(frame.raw)
        else:  # Flush, CopyData/CopyDone/CopyFail, password messages
            if kind in b"cf":
                self.replies.copy_ends += 1
            self.to_server.append(frame.raw)

    def _client_sync(self, frame: p.Frame) -> None:
        skipped, self.replies.skip_until_sync = self.replies.skip_until_sync, False
        if self.replies.copy_in == self.replies.copy_ends:
            # The server ignores a Sync inside COPY FROM STDIN: no ReadyForQuery will answer it.
            self.reruns.group = None
            self.to_server.append(frame.raw)
            return
        if self.replies.status == "I" and self.trace.reads is not None and self._wants_xact():
            self._ask_xact(standalone=False)  # (the Sync ends an implicit transaction)
        self.replies.mid_batch = False
        self.replies.push(Entry(Kind.SYNC, started=self._batch_started or time.perf_counter()))
        self._batch_started = 0.0
        self.to_server.append(frame.raw)
        self.reruns.arm_batch(frame.raw, skipped, self.tagging.txn.tagged)

    def resume_rerun(self, batch: bytes) -> None:
        """The C relay hands back a statement that may be run again (``Reruns.resume``)."""
        self.reruns.resume(batch, self.replies.pending)

    def _run_again(self) -> None:
        self.hooks.rerun()
        for raw, entry in self.reruns.next_run():
            self.replies.push(entry)
            self.to_server.append(raw)

    def _extended(self, entry: Entry, raw: bytes) -> None:
        if not self.replies.mid_batch:
            self.reruns.batch_started(self.replies.at_transaction_start())
            self.replies.mid_batch = True
            self._batch_started = time.perf_counter()
        if self.reruns.group is not None:
            self.reruns.sent(raw, entry)
        self.replies.push(entry)
        self.to_server.append(raw)

    def _comment_tags(self, sql: str) -> Tags | TagError | None:
        try:
            return self.analysis.comment_tags(sql)
        except TagError as exc:
            return exc

    def _prepare(
        self, sql: str, trigger: bytes, event: p.ClientEvent, *, named: bool = False
    ) -> tuple[Tags, Analysis] | None:
        """Decide the tags for a statement text (``named``: of a named prepared statement); inject them when
        needed.

        Returns None when the event was held (it is replayed later) or refused.
        """
        comment = self._comment_tags(sql)
        if isinstance(comment, TagError):
            self._refuse_tags(trigger, p.encode_error(comment.sqlstate, str(comment)))
            return None
        switch = self.tagging.switch_refusal(comment)
        if switch is not None:
            self._refuse_tags(trigger, switch)
            return None
        tags = self.tagging.desired(comment, self.replies.at_transaction_start())
        gate = self.gate
        need = self.tagging.needs_join(tags, self.replies.status) or self._catalog_due(tags)
        if need and self.replies.status == "E":
            # (As a tagged text: the untagged analysis takes the kind from the first word alone.)
            as_tagged = self.analysis.analyze(sql, gate.catalog, True, prepared=named)
            need = not self.tagging.ends_failed_block(as_tagged, self.replies.status)
        if need and not self._inject(tags, trigger):
            self.held.put_back(event)
            return None
        verdict = self.analysis.analyze(sql, gate.catalog, tags.tagged, prepared=named)
        if (
            self._check_due(tags, verdict) is not None
            and not gate.checked
            and gate.can_check(self.replies.status)
        ):
            # App DDL on another connection may have changed the CoW tables: check before relying on them.
            gate.suspect = False
            gate.check(trigger, self._release)
            self.held.put_back(event)
            return None
        if tags.tagged and trigger == b"Q" and self._path_hold(verdict, trigger, event):
            return None
        self.tagging.fresh = False
        gate.checked = False
        if tags.tagged:
            if self._asked != sql:
                self.hooks.parse_cache(verdict.cache_hit)
            self._asked = None
        if comment is not None or self.replies.at_transaction_start():
            self.tagging.txn = tags
        if tags.tagged:
            if verdict.tampers and trigger == b"Q" and self.analysis.is_pool_reset(sql, gate.catalog):
                # A pool's reset ends the query string: let it run, and join the session again before
                # the next statement (only simple queries: a pipelined Bind could run before the reset).
                self.tagging.forget()
                return tags, verdict
            if verdict.tampers:
                self._refuse(trigger, p.encode_error(SQLSTATE_REFUSED, TAMPER_MESSAGE))
                return None
            if verdict.error is not None:
                detail = (("D", verdict.error_detail),) if verdict.error_detail else ()
                self._refuse(trigger, p.encode_error(verdict.error[0], verdict.error[1], extra=detail))
                return None
            if trigger == b"Q" and self._path_refused(trigger):
                return None
        self.path.followed(verdict)
        applied = self.tagging.applied
        if applied.tentative and verdict.kind in ("transaction", "other", "multi"):
            # COMMIT/ROLLBACK (TO SAVEPOINT) decide whether a set_config done in this block survives.
            applied.tags = None
        return tags, verdict

    def _refuse_tags(self, trigger: bytes, error: bytes) -> None:
        """Refuse a statement for its tags, before they are decided.

        At a transaction's start the connection's own tags still become the transaction's: a statement
        pipelined behind the refused one (not at a transaction start any more) runs with them, never with
        the tags of the connection's previous transaction (untagged, on a fresh connection).
        """
        if self.replies.at_transaction_start():
            self.tagging.txn = self.tagging.default()
        self._refuse(trigger, error)

    def _path_hold(self, verdict: Analysis, trigger: bytes, event: p.ClientEvent) -> bool:
        """Hold ``event`` while the server says where its write targets resolve, unless known already."""
        if self.path.clean or not self.path.needed(verdict, self.replies.status):
            return False
        self.path.check(trigger, verdict)
        self.held.put_back(event)
        return True

    def _path_refused(self, trigger: bytes) -> bool:
        """Refuse the statement just checked when the server's answer says so."""
        if not self.path.answered:
            return False
        refusal = self.path.take_refusal()
        if refusal is None:
            return False
        self._refuse(trigger, p.encode_error(*refusal))
        return True

    def _client_query(self, frame: p.Frame) -> None:
        query = p.decode_query(frame.body)
        prepared = self._prepare(query.sql, b"Q", frame)
        if prepared is None:
            return
        self.unnamed.forget_unnamed(frame.body)
        tags, verdict = prepared
        self.hooks.statement(verdict.kind, tags.tagged)
        for table, kind in verdict.writes:
            self.hooks.write(table, kind)
        sent = verdict.rewritten if tags.tagged else None
        if tags.tagged:  # (a rewritten text too: C sends it rewritten, decisions.rewritten_text)
            self.decisions.decide(b"Q", query.sql, verdict, self.tagging.txn, self.gate.catalog)
        alone = tags.tagged and self.replies.at_transaction_start() and rerun.may_rerun(verdict)
        trace = self.trace
        read = trace.pending_read(tags, verdict, query.sql, None)
        if trace.reads is not None:
            if verdict.kind == "transaction" and not self.replies.mid_batch and self._wants_xact():
                self._ask_xact(standalone=True)
            trace.sent(verdict, read)
        entry = Entry(
            Kind.QUERY,
            tag_map=verdict.tag_map,
            started=time.perf_counter(),
            rewritten=sent is not None,
            read=read,
        )
        self.replies.push(entry)
        if sent is not None:
            self.hooks.rewrite()
            raw = p.encode_query(sent)
        else:
            raw = frame.raw
        self.to_server.append(raw)
        if alone:
            self.reruns.arm_query(raw, entry)

    def _client_parse(self, frame: p.Frame) -> None:
        parse = p.decode_parse(frame.body)
        # An unnamed read may run as a named statement (Promotions.promote): analysed as one.
        named = bool(parse.name) or self.unnamed.can_promote()
        prepared = self._prepare(parse.sql, b"P", frame, named=named)
        if prepared is None:
            return
        tags, verdict = prepared
        if tags.tagged and verdict.rewritten is None:
            # (Also not rewritten as the other form of prepared statement: C takes any Parse of the text.)
            other = self.analysis.analyze(parse.sql, self.gate.catalog, True, prepared=not named)
            if other.rewritten is None:
                self.decisions.decide(b"P", parse.sql, verdict, self.tagging.txn, self.gate.catalog)
        comment = self._comment_tags(parse.sql)
        self.prepared.statements[parse.name] = Statement(
            comment if isinstance(comment, Tags) else None, verdict, parse.sql if self.trace.reads else None
        )
        sent = verdict.rewritten if tags.tagged else None
        self.unnamed.forget_unnamed(frame.body, unnamed=not parse.name)
        if sent is not None and not parse.name and verdict.kind == "select":
            if named and tags.tagged:
                self.decisions.decide_promoted(parse.sql, parse.param_types, verdict, self.gate.catalog)
            promoted = self.unnamed.promote(sent, parse.param_types)
            if promoted is not None:
                self.hooks.rewrite()
                self._extended(*promoted)
                return
        if sent is not None:
            self.hooks.rewrite()
            raw = p.encode_parse(parse.name, sent, parse.param_types)
        else:
            raw = frame.raw
        self._extended(Entry(Kind.PARSE, rewritten=sent is not None), raw)

    def _client_bind(self, frame: p.Frame) -> None:
        bind = p.decode_bind_names(frame.body)
        statement = self.prepared.statements.get(bind.statement)
        switch = self.tagging.switch_refusal(statement.tags if statement else None)
        if switch is not None:  # a route made since the Parse
            self._refuse_tags(b"P", switch)  # (a failing Parse: the server skips the rest of the batch)
            return
        tags = self.tagging.desired(
            statement.tags if statement else None, self.replies.at_transaction_start()
        )
        need = self.tagging.needs_join(tags, self.replies.status)
        if (
            need
            and statement is not None
            and self.tagging.ends_failed_block(statement.verdict, self.replies.status)
        ):
            need = False
        if need and not self._inject(tags, b"B"):
            self.held.put_back(frame)
            return
        if statement is None:
            self.path.changed()  # (not the proxy's to know: perhaps a SET ROLE)
        elif tags.tagged and self._path_hold(statement.verdict, b"B", frame):
            return
        if tags.tagged and self._path_refused(b"P"):  # (a failing Parse: the server skips the batch)
            return
        if statement is not None:
            self.path.followed(statement.verdict)
        self.tagging.fresh = False
        if (statement is not None and statement.tags is not None) or self.replies.at_transaction_start():
            self.tagging.txn = tags  # (as _prepare does: a Bind may start a transaction)
        if statement is not None:
            self.prepared.portals[bind.portal] = statement
            if self.trace.reads is not None and statement.sql is not None:
                self.trace.bound(bind.portal, frame.body)
        if statement is not None and statement.verdict.kind == "transaction" and self._wants_xact():
            self._ask_xact(standalone=False)  # (a COMMIT, or a ROLLBACK: its reads' operation either way)
        alias = self.unnamed.alias
        if alias is not None and not bind.statement:
            self._extended(
                Entry(Kind.BIND, promoted=alias, rewritten=True), p.rename_bind_statement(frame.body, alias)
            )
        else:
            self._extended(Entry(Kind.BIND), frame.raw)

    def at_rest(self) -> bool:
        """May the C relay carry on from here: the server's side in the state C starts a connection in
        (handoff.AT_REST: status I, nothing owed, no batch), nothing held, no read waiting for its
        transaction's operation, the tags in force those the next transaction needs (and known for good: not
        set inside a block that may roll back), outside a session no statement of the client's standing for
        one of the proxy's (in one, C carries it on: ``_promotes_on_fast``), the catalog not being read, no
        statement that may run again in flight, not before the first statement of a connection joined at
        ``start``."""
        return (
            self.replies.at_rest(self._block_at_rest())
            and self.held.at_rest()
            and not self.trace.txn.held  # (reads of the open transaction: its end here knows their operation)
            and not self.closing
            and (self.unnamed.at_rest() or self._promotes_on_fast())
            and self.gate.at_rest()
            and self.reruns.plan is None
            and self.tagging.settled()
            and not self._first_due
        )

    def _block_at_rest(self) -> bool:
        """Inside a transaction block (status T) a session may go to the C relay too: its tags were set before
        the block (``Tagging.settled``: not tentative, so no ROLLBACK TO can undo them, and C never joins),
        and no statement of the block may have changed the path (a ROLLBACK TO could undo what Python knows
        of it: ``PathCheck.changed_in_txn``). Not while reads are recorded: their transaction's operation is
        Python's to follow from its start. Django runs each test class in one block, with a savepoint per
        test: a text C hands back would otherwise keep the whole class in Python; C asks Python about new
        texts (``decide_for_fast``), so only what needs Python comes back."""
        return self.tagging.txn.tagged and not self.path.changed_in_txn and self.trace.reads is None

    def _promotes_on_fast(self) -> bool:
        """The C relay carries on with the unnamed statement standing for one of the proxy's: in a session
        (it is given the promotions), with no catalog check due before the next rewritten statement."""
        return self.tagging.txn.tagged and not self.gate.suspect

    def _client_execute(self, frame: p.Frame) -> None:
        execute = p.decode_execute(frame.body)
        statement = self.prepared.portals.get(execute.portal)
        tag_map = None
        read = None
        if statement is not None:
            verdict = statement.verdict
            self.hooks.statement(verdict.kind, self.tagging.txn.tagged)
            for table, kind in verdict.writes:
                self.hooks.write(table, kind)
            tag_map = verdict.tag_map if self.tagging.txn.tagged else None
            if statement.sql is not None:
                params = self.trace.bind_params.get(execute.portal)
                read = self.trace.pending_read(self.tagging.txn, verdict, statement.sql, params)
        if self.trace.reads is not None:
            self.trace.sent(statement.verdict if statement is not None else None, read)
        if statement is None or not self.tagging.txn.tagged or not rerun.may_rerun(statement.verdict):
            self.reruns.group = None  # (only the Execute of a statement that may get the 40001 runs again)
        entry = Entry(Kind.EXECUTE, tag_map=tag_map, read=read)
        if read is not None:
            entry.started = time.perf_counter()
        self._extended(entry, frame.raw)

    def _wants_xact(self) -> bool:
        replies = self.replies
        return self.trace.wants_xact(replies.status, replies.status_current())

    def _ask_xact(self, standalone: bool) -> None:
        if not standalone:
            self.reruns.group = None  # (asked inside the batch: a new run would go without the question)
        self.trace.ask_xact(self.injector, standalone)

    def _refuse(self, trigger: bytes, error: bytes) -> None:
        """Send a failing statement in place of the client's, and report ``error`` for it."""
        if trigger in (b"Q", b"F"):
            self.replies.push(Entry(Kind.QUERY, replace_error=error, started=time.perf_counter()))
            self.to_server.append(p.encode_query(REFUSED_SQL))
        else:
            self.unnamed.alias = None  # the failing Parse drops the server's unnamed statement
            self._extended(Entry(Kind.PARSE, replace_error=error), p.encode_parse("", REFUSED_SQL))

    def _oversized(self, event: p.Oversized) -> None:
        error = p.encode_error(
            SQLSTATE_TOO_LARGE,
            f"cowproxy: message of {event.length} bytes exceeds the maximum of {self.max_message} bytes",
        )
        if event.kind == b"d":
            # Inside COPY FROM STDIN: fail the copy; the server then drops further copy messages.
            for entry in reversed(self.replies.pending):
                if not entry.injected:
                    entry.replace_error = error
                    break
            self.to_server.append(p.message(b"f", b"cowproxy: message too large\0"))
            return
        if self.replies.skip_until_sync:
            return
        self._refuse(b"Q" if event.kind in (b"Q", b"F") else b"P", error)

    # ------------------------------------------------------------------------------------------------
    # Injection

    def _inject(self, tags: Tags, trigger: bytes, probe: bool = False, read_write: bool = False) -> bool:
        """Queue ``cow.use_session`` (and the catalog query) ahead of the trigger and hold the client
        (``probe``: and whether the joined path is clean, ``PathCheck.probe``; ``read_write``: the
        connection's transactions are known to be read-write by default, so a bind needs no block).

        Returns False: the caller holds the trigger, which is replayed when the injected replies are in.
        At a safe point (no unfinished extended batch) the injection is its own batch ending with Sync;
        inside a batch it is followed by Flush, and a failure makes the server skip the client's batch.
        """
        injector = self.injector
        standalone = injector.start(trigger)
        if standalone is None:
            return False
        forward = not standalone
        want_catalog = tags.tagged and self.gate.catalog is None and self.gate.wanted()
        # A join inside the batch is part of its transaction: after a failure the tags are unknown, so the
        # batch's statement is not run again (after checks of the catalog or the path, which change nothing,
        # it may be).
        self.reruns.group = None

        def applied(ok: bool) -> None:
            # On failure nothing changed on the server: the statement (and its transaction) rolled back.
            # Without a block of its own the join commits with its batch, after the probes that follow it:
            # held for good at the batch's ReadyForQuery only if nothing failed (Tagging.ready).
            if ok:
                tentative = not standalone or self.replies.status != "I" or not writable
                self.tagging.joined(tags, tentative=tentative)
                self.hooks.tags_applied(tags)
                self.path.changed()  # (joining puts the overlay path in force)
            elif injector.error is not None:
                self.hooks.tags_failed(tags, injector.error)

        def released(ok: bool) -> None:
            self.tagging.fresh = ok
            self._release()

        finished: Done = released

        params: tuple[str | None, ...] = (tags.session, tags.operation)
        if self.bind_secret is not None:
            params += (self.bind_secret,)
        # Between transactions (no block open, nothing in flight) the join holds for good once its batch
        # ends well: no rollback of the client's can undo it.
        between = standalone and self.replies.status == "I" and not self.replies.pending
        # Between transactions a bind runs in a read-write block of its own: it may record the binding,
        # and the client's transactions may be read-only by default (its role's or database's
        # default_transaction_read_only, its startup options). Inside the client's transaction or batch
        # the bind is part of it, as before (a read-only one gets 25006 for a bind that has to write).
        writable = self.bind_secret is not None and between and not read_write
        if writable:
            injector.queue_utility(BEGIN_WRITABLE_SQL)
        injector.send(p.encode_close("S", INJECT_STATEMENT), Kind.CLOSE, forward)  # (see queue_query)
        injector.send(p.encode_parse(INJECT_STATEMENT, self.join_sql), Kind.PARSE, forward)
        injector.send(p.encode_bind(INJECT_STATEMENT, INJECT_STATEMENT, params), Kind.BIND, forward)
        injector.send(p.encode_execute(INJECT_STATEMENT), Kind.EXECUTE, forward, on_done=applied)
        injector.send(p.encode_close("P", INJECT_STATEMENT), Kind.CLOSE, forward)
        if writable:
            injector.queue_utility("COMMIT")
        if probe and between and tags.tagged:
            # Whether the joined path is clean, in the same round trip: the session's first write by
            # unqualified names then needs no check of its own.
            finished = self.path.probe(finished)
        release = injector.rolled_back_on_failure(finished) if writable else finished
        if want_catalog:
            injector.send(p.encode_close("S", INJECT_STATEMENT), Kind.CLOSE, forward)
            close_last, on_done = self.gate.queue_first(forward, standalone, release)
        else:
            close_last, on_done = p.encode_close("S", INJECT_STATEMENT), release
        injector.finish(close_last, standalone, on_done)
        return False

    def start(self, read_write: bool = False) -> None:
        """Right after authentication: join the connection's own session (startup tags, else its database's
        route) at once, while the client is still reading the ReadyForQuery that ends its authentication,
        instead of after its first statement has arrived, and ask in the same batch whether the joined path
        is clean (so that a first write by unqualified names needs no round trip of its own). The client's
        first statement is Python's (``at_rest``), and its messages are held until the batch is answered
        (the session is joined before any of them runs, as for a join ahead of a statement); a join that
        fails leaves the tags unknown, so the next statement joins again and gets the error (fail closed).
        ``read_write``: the server reported ``default_transaction_read_only = off`` at authentication, so a
        bind runs in the batch's own transaction, without the read-write block (12 messages fewer)."""
        tags = self.tagging.default()
        if not tags.tagged or not self.replies.at_rest():
            return
        self.tagging.txn = tags  # (what the first transaction takes: the connection's own tags)
        self._first_due = True
        self._inject(tags, b"Q", probe=True, read_write=read_write)

    @property
    def holding(self) -> bool:
        """The caller is to stop reading the client: what it sends would be held."""
        return self.held.holding

    def hold(self, until_idle: bool) -> None:
        """Stop reading the client (``until_idle``: until no reply is owed); what it sends meanwhile is
        replayed by ``_release``."""
        self.held.hold(until_idle)

    def _release(self) -> None:
        """Stop holding: replay the held client events (which may hold again)."""
        self.held.replay(self._replay)
        if not self.held.holding:
            self.injector.error = None
            self.gate.checked = False  # it was for the statement just replayed
            self.path.released()

    def _replay(self, event: p.ClientEvent) -> None:
        error = self.injector.error
        if error is not None and isinstance(event, p.Frame) and event.kind in _INJECTION_TRIGGERS:
            # use_session failed before the statement that needed it: refuse that statement with the error
            # (fail closed; replaying it would only retry the switch, for ever). A refused Parse or Bind
            # makes the server skip the rest of the client's batch, as a failed one would. Without the
            # position: it points into the injected statement, not the client's.
            fields = p.ErrorFields(tuple(f for f in error.fields if f[0] not in "Ppq"))
            self.injector.error = None
            self._refuse(event.kind, p.encode_error_fields(fields))
            return
        self.injector.error = None
        self._dispatch_client(event)

    def fast_query(self, data: bytes) -> bool:
        """Take one whole simple Query of an untagged connection with the least work, if it is one.

        ``data`` is exactly one Query message. Returns True when the caller is to send ``data`` upstream
        as is (it is not put in ``to_server``: one write, no list); False (nothing done) whenever the
        general path is needed: a comment that may carry tags, tags to apply, anything pending.
        """
        replies = self.replies
        if self.held.holding or replies.skip_until_sync or replies.mid_batch:
            return False
        tagging = self.tagging
        applied = tagging.applied
        if applied.tentative:
            return False
        # Tagging.desired(None, ...) and needs_join, inlined: mid_batch is False here.
        pending = replies.pending
        if pending or replies.status != "I":
            tags = tagging.txn
        elif tagging.startup.session is not None:
            return False
        else:
            tags = tagging.route() or UNTAGGED
        if tags.session is not None:
            return False
        current = applied.tags
        if current is None or (current is not tags and current != tags):
            return False
        # What decode_query demands (one NUL, at the end; UTF-8), and no comment that may carry tags.
        if b"/*" in data or data.find(0, 5) != len(data) - 1:
            return False
        if not data.isascii():
            try:
                data[5:-1].decode()
            except UnicodeDecodeError:
                return False
        self.hooks.statement(query_kind(data), False)
        unnamed = self.unnamed
        if unnamed.alias is not None or unnamed.promoted or unnamed.promoting:
            unnamed.forget_unnamed(data)  # a simple Query drops the unnamed statement
        if pending:
            pending.append(Entry(Kind.QUERY, started=perf_counter(), copy_epoch=replies.copy_ends))
        else:
            tagging.txn = tags
            # Nothing in flight: the one Entry kept for this case is free (it leaves the queue with its
            # reply), so the usual request-reply rhythm allocates nothing here.
            entry = self._query_entry
            entry.replace_error = None  # an oversized CopyData may have set it (COPY FROM STDIN)
            entry.started = perf_counter()
            entry.copy_epoch = replies.copy_ends
            pending.append(entry)
        return True

    # ------------------------------------------------------------------------------------------------
    # The fast relay (proxy._fastrelay) carries on from this state and hands it back

    def hand_off(self, kind_index: KindIndex, slots: Slots) -> tuple[Adoption, list[Statement]]:
        """What the C relay carries on from (when ``at_rest``), and the statements its indexes name."""
        tags = self.tagging.txn
        statements, portals, objects = self.prepared.known(kind_index, slots, tags, self.path, self.trace)
        record = tags.tagged and self.trace.reads is not None  # (C records its reads)
        decisions, promotions = self._hand_off_decisions(kind_index, slots)
        txn = self.trace.txn
        state = replace(AT_REST, status=self.replies.status, txn=TxnCounts(txn.count, txn.reads, txn.wrote))
        resolve = record and tags.operation is None
        ask = tags.tagged and not record
        adoption = Adoption(
            statements, portals, tags.tagged, decisions, record, resolve, state, promotions, ask
        )
        return adoption, objects

    def decide_for_fast(self, sql: str, kind_index: KindIndex, slots: Slots) -> FastAnswer:
        """A Query text the C relay asks about while it keeps the connection (``Adoption.ask``: it has no
        decision for it). The row C takes it by when Python would send it as it is or as its rewritten text,
        with nothing of its own to do first (``_prepare`` and ``_client_query``: no comment tags, join,
        catalog read or check, path question, refusal or tag map), decided into the table as
        ``_client_query`` decides it (a decision depends on the text and the catalog alone); else no row and
        the reason: C hands the connection back at that Query, and Python takes it as before.

        Called only while the connection is on C, so the relay's state is the one it was adopted in: the
        tags, the catalog and the path C keeps to (what would change them goes back to Python)."""
        tags, gate = self.tagging.txn, self.gate
        if not tags.tagged:
            return FastAnswer(None, "untagged")
        if not self.tagging.settled():
            return FastAnswer(None, "join")
        if self._catalog_due(tags):
            return FastAnswer(None, "catalog read")
        if self.trace.reads is not None:
            return FastAnswer(None, "reads recorded")
        if self._comment_tags(sql) is not None:
            return FastAnswer(None, "comment")
        verdict = self.analysis.analyze(sql, gate.catalog, True)
        self.hooks.parse_cache(verdict.cache_hit)  # (C counts no hit of its own for it; Python not again)
        self._asked = sql
        due = self._check_due(tags, verdict)
        reason = due or undecidable(sql, verdict)
        if reason is not None:
            return FastAnswer(None, reason)
        key = self.decisions.decide(b"Q", sql, verdict, tags, gate.catalog)
        if key is None:
            return FastAnswer(None, "not decided")
        row = self.decisions.row(key, tags, kind_index, slots, self.path.clean)
        if isinstance(row, str):
            return FastAnswer(None, row)
        self._asked = None
        return FastAnswer(row)

    def _catalog_due(self, tags: Tags) -> bool:
        """A tagged statement waits for the catalog to be read (joining reads it first: ``_prepare``)."""
        return tags.tagged and self.gate.catalog is None and self.gate.wanted()

    def _check_due(self, tags: Tags, verdict: Analysis) -> str | None:
        """Why the catalog is to be checked before this tagged statement (app DDL on another connection may
        have changed the CoW tables its verdict relies on), or None; ``_prepare`` checks when it can."""
        if not tags.tagged:
            return None
        if verdict.catalog_dependent:
            return "catalog check"
        if self.gate.suspect and verdict.rewritten is not None:
            return "catalog suspect"  # (a rewritten statement failed as on a stale catalog)
        return None

    def _hand_off_decisions(
        self, kind_index: KindIndex, slots: Slots
    ) -> tuple[list[Decision], PromotionsGiven | None]:
        """In a session: the decisions C may apply, and the promotions (with their texts' decisions only when
        Python would promote them now: no catalog check due, names left or prepared)."""
        tags = self.tagging.txn
        if not tags.tagged:
            return [], None
        promote = self.unnamed.export if self._promotes_on_fast() and self.unnamed.can_promote() else None
        stale = STALE_LIST if self.trace.reads is None else 0  # (it asks: hand_off's ask)
        decisions = self.decisions.export(
            tags, self.gate.catalog, kind_index, slots, self.path.clean, promote=promote, stale=stale
        )
        if self.gate.suspect:  # (no rewritten text before the catalog check: C starts unsuspecting)
            decisions = [row for row in decisions if row[6] is None]
        if promote is None:
            self.unnamed.export([])
        return decisions, self.unnamed.for_fast()

    def take_back(
        self,
        state: ConnectionState,
        statements: list[Named],
        portals: list[Named],
        objects: list[Statement],
        *,
        resolved: bool,
        owed_reads: list[tuple[int, PendingRead, float]] | None = None,
        promotions: PromotionsBack | None = None,
    ) -> None:
        """Carry on from the state the C relay hands back (``resolved``: it counted the transaction's reads,
        ``Adoption.resolve``).

        ``owed_reads``: (position in ``state.owed``, the read, when it started) for the recorded reads among
        the replies owed. The statements and portals: its tables (``Prepared.restore``). ``promotions``: as C
        left those it was given in a session (None: an untagged stay, where the client may have deallocated
        statements)."""
        self.replies.resume(state, owed_reads or ())
        txn = self.trace.txn
        txn.count = state.txn.count
        if resolved:
            txn.reads, txn.wrote = state.txn.reads, state.txn.wrote
            if state.txn.xid:
                txn.xid = str(state.txn.xid)
        if promotions is None:
            self.unnamed.forget_all()
        else:
            self.unnamed.resume(promotions)
            if promotions.suspect:
                self.gate.suspect = True  # (a rewritten statement failed there as on a stale catalog)
        if state.mid_batch:
            self._batch_started = perf_counter()
        self.prepared.restore(statements, portals, objects, self._prepared_there, self.trace)

    def _prepared_there(self, sql: str) -> Statement:
        """A statement prepared on the C relay, analysed as ``_client_parse`` would have then: with the tags
        in force (in a session C took only texts with a decision: not rewritten in either form) and no
        comment tags (C takes no Parse with a comment opener)."""
        verdict = self.analysis.analyze(sql, self.gate.catalog, self.tagging.txn.tagged, prepared=True)
        return Statement(None, verdict, sql if self.trace.reads else None)

    # ------------------------------------------------------------------------------------------------
    # Server side

    def server_data(self, data: bytes) -> None:
        if self.fast_reply(data, releasing=True):
            self.to_client.append(data)
            if self.held.until_idle:
                self._release()
            return
        self.to_client.extend(self.replies.feed(data))

    def fast_reply(self, data: bytes, releasing: bool = False) -> bool:
        """``server_data`` for the common reply, when nothing else follows from it.

        True: the bookkeeping is done and the caller is to send ``data`` to the client as is (it is not
        put in ``to_client``). False: nothing done; call ``server_data`` (``releasing``: which takes it so
        too while the client is held until no reply is owed, then replays what was held).
        """
        held = self.held
        if (
            (held.until_idle and not releasing)
            or held.holding
            or self.tagging.applied.tentative
            or self.reruns.due  # (its ReadyForQuery is dropped: ready sends the new run)
        ):
            return False
        head = self.replies.fast_ready(data)
        if head is None:
            return False
        reruns = self.reruns
        if reruns.plan is not None:
            reruns.succeeded()  # (no ErrorResponse: a statement that may run again succeeded)
        trace = self.trace
        if head.read is not None:
            trace.fast_read_done(head, data, len(data) - 6)
        if trace.reads is not None and data[-1] == _I:
            trace.ended(not self.replies.pending)
        self.hooks.latency(perf_counter() - head.started)
        return True

    # The reply queue's questions (replies.Owner)

    def answer(self, head: Entry, kind: int, body: bytes, raw: bytes) -> bytes | None:
        before = b""
        if head.held is not None:
            held = self.reruns.reply(head, kind, raw)
            if held is None:
                return None
            before = held
        if kind == _C and head.tag_map is not None:
            tag = p.decode_command_tag(body)
            mapped = self.analysis.map_tag(tag, head.tag_map)
            if mapped != tag:
                raw = p.encode_command_complete(mapped)
            if head.read is not None:
                self.trace.read_done(head, mapped)
        elif kind == _C and head.read is not None:
            self.trace.read_done(head, p.decode_command_tag(body))
        return before + raw if before else raw

    def failed(self, head: Entry | None, fields: p.ErrorFields, raw: bytes) -> bytes:
        self.tagging.applied.error_since = True
        if head is None:
            self.hooks.error(fields.sqlstate)
            return raw
        out = raw
        if head.rewritten and fields.sqlstate in _STALE_CATALOG_STATES:
            self.gate.suspect = True  # check the catalog before the next rewritten statement
        if head.promoted is not None:
            self.unnamed.failed(head.promoted)  # (parsed anew the next time)
        sqlstate = fields.sqlstate
        if head.injected:
            self.injector.error = fields
            out = raw if head.forward_error else b""
        elif head.replace_error is not None:
            out = head.replace_error
            sqlstate = p.decode_error(out[5:]).sqlstate
        elif head.held is not None or head.echo:
            out = self.reruns.error(head, fields, raw)  # (after what was held of the run, if any)
        if out:
            self.hooks.error(sqlstate)
        return out

    def ready(self, head: Entry | None, status: str, raw: bytes) -> bytes:
        applied = self.tagging.applied
        if applied.tentative or applied.error_since:
            self.tagging.ready(status)
        if status == "I":
            if self.trace.reads is not None:
                self.trace.ended(not self.replies.pending)
            self.path.transaction_ended()
        if head is not None and head.injected:
            if head.on_done is not None:
                head.on_done(self.injector.error is None)
            return b""
        if self.reruns.plan is not None and head is not None:
            if self.reruns.due:
                self._run_again()
                return b""
            self.reruns.succeeded()
        if head is not None and head.started:
            self.hooks.latency(time.perf_counter() - head.started)
        if self.held.until_idle and not self.replies.pending:
            self._release()
        return raw
