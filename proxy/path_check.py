"""Where a session's writes by unqualified names resolve: a schema on the search_path without the layer has no
guard, so a write that lands there would reach a base table.

The relay asks ``needed`` before a statement that writes by unqualified names runs (a simple Query, a Bind;
not at a Parse: PostgreSQL resolves a prepared statement's names again when the path has changed since). If
the path is not known to be clean, ``check`` queues ``cow._unlayered_write`` of the statement's write targets
ahead of it and the relay holds it; the answer either refuses it (``take_refusal``) or says that no schema on
the path lacks the layer (``clean``), which holds until the path or the role may have changed.
"""

from __future__ import annotations

from collections.abc import Callable

from proxy.injected import InjectedBatches
from proxy.replies import Kind
from proxy.sql import Analysis
from proxy.sql.analyze import SQLSTATE_REFUSED
from proxy.sql.rewrites import app_path

PATH_STATEMENT = "__cowproxy_path"

Refusal = tuple[str, str]  # (SQLSTATE, message)


class PathCheck:
    """What one connection knows of its search_path, and the server's answer for the statement held."""

    def __init__(self, injector: InjectedBatches, release: Callable[[], None]) -> None:
        self.injector = injector
        self.release = release  # replays the held statement once the answer is in
        # True once the server said that no schema on the search_path in force lacks the layer, until a change
        # of path or role, a join, or the end of a transaction that changed either (it may have rolled back
        # to another path).
        self.clean = False
        self._changed_in_txn = False
        self.answered = False  # the server answered for the statement being replayed (take_refusal)
        self._refusal: Refusal | None = None  # its answer: refuse it so
        self.checks = 0

    def needed(self, verdict: Analysis, status: str) -> bool:
        """Whether the server is to say where the statement's write targets resolve before it runs."""
        return not (
            not verdict.resolves_writes
            or verdict.tampers
            or verdict.error is not None
            or self.clean
            or self.answered
            or status == "E"  # (a failed block: the statement fails whatever its names)
        )

    def unknown_for(self, verdict: Analysis) -> bool:
        """The statement's write targets resolve where the proxy does not know yet (the C relay hands it
        back)."""
        return verdict.resolves_writes and not self.clean

    def check(self, trigger: bytes, verdict: Analysis) -> None:
        """Queue ``cow._unlayered_write`` of the statement's unqualified write targets and hold the client
        (as ``CatalogGate.check``). The answer: refuse the statement when a name resolves to a relation of a
        schema without the layer; the path clean when no schema on it lacks the layer."""
        injector = self.injector
        standalone = injector.start(trigger)
        if standalone is None:
            return
        self.checks += 1
        rows: list[tuple[str | None, ...]] = []
        kinds = dict(verdict.unqualified_writes)

        def checked(ok: bool) -> None:
            self.answered = True
            self._refusal = None
            if ok and len(rows) == 1 and len(rows[0]) == 3:
                schema, name, clean = rows[0]
                if clean == "t":
                    self.clean = True
                elif schema is not None and name is not None:
                    self._refusal = app_path.unlayered_refusal(schema, name, kinds.get(name, "write"))
                elif verdict.executes:
                    self._refusal = app_path.EXECUTE_REFUSAL
            elif injector.error is None:  # (with one, the relay refuses the statement with it)
                self._refusal = (SQLSTATE_REFUSED, app_path.UNCHECKED_MESSAGE)
            self.release()

        params = (app_path.text_array([name for name, _ in verdict.unqualified_writes]),)
        close = injector.queue_query(
            PATH_STATEMENT, app_path.UNLAYERED_WRITE_SQL, not standalone, params=params, capture=rows
        )
        injector.finish(close, standalone, checked)

    def probe(self, finished: Callable[[bool], None]) -> Callable[[bool], None]:
        """Queue ``cow._unlayered_write`` of no names in a join's batch of its own, between transactions
        (after the join): NULL when no schema on the joined path lacks the layer, whatever the names. Returns
        ``finished`` wrapped to take the answer once the batch has ended well (its ReadyForQuery: the join
        committed, and ``transaction_ended`` already ran for the path the join changed)."""
        rows: list[tuple[str | None, ...]] = []
        close = self.injector.queue_query(
            PATH_STATEMENT, app_path.UNLAYERED_WRITE_SQL, False, params=("{}",), capture=rows
        )
        self.injector.send(close, Kind.CLOSE, False)

        def ended(ok: bool) -> None:
            if ok and rows == [(None, None, "t")]:
                self.clean = True
                self._changed_in_txn = False
            finished(ok)

        return ended

    def take_refusal(self) -> Refusal | None:
        """The answer for the statement just checked, if it is to be refused; the answer is used up."""
        refusal, self._refusal = self._refusal, None
        self.answered = False
        return refusal

    def released(self) -> None:
        """The held statement was replayed: the answer was for it only."""
        self.answered = False
        self._refusal = None

    def followed(self, verdict: Analysis) -> None:
        """A statement that may change the path or the role goes out: what was known of the path ends."""
        if verdict.path_change or (verdict.kind == "transaction" and self._changed_in_txn):
            self.changed()

    @property
    def changed_in_txn(self) -> bool:
        """The open transaction may have changed the path or the role (a ROLLBACK TO may undo it)."""
        return self._changed_in_txn

    def changed(self) -> None:
        self.clean = False
        self._changed_in_txn = True

    def transaction_ended(self) -> None:
        """ReadyForQuery with status I: a path changed in the transaction is now committed, or rolled back to
        what it was before: either way not known."""
        if self._changed_in_txn:
            self._changed_in_txn = False
            self.clean = False
