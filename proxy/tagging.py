"""The tags of one connection: those it is fixed to (startup tags, else its database's route), those in force
for its current transaction, and those in force upstream as far as the proxy knows (``Applied``), which a
join (``cow.use_session`` or ``cow.bind_session``, proxy/relay.py) sets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from proxy import protocol as p
from proxy.sql import Analysis
from proxy.sql.analyze import SQLSTATE_REFUSED
from proxy.tags import UNTAGGED, Tags


@dataclass
class Applied:
    """The tags in force on the upstream connection, as far as the proxy knows."""

    tags: Tags | None = UNTAGGED  # None: unknown (re-apply before the next statement)
    tentative: bool = False  # set inside a transaction that may still roll back
    error_since: bool = False


class Tagging:
    """What a connection's statements are tagged with, and whether the upstream has to join first."""

    def __init__(self, startup: Tags, route: Callable[[], Tags | None]) -> None:
        self.startup = startup
        self.route = route
        self.txn: Tags = UNTAGGED  # tags in force for the current transaction
        self.applied = Applied()
        self.fresh = False  # a join just completed for the held statement

    def default(self) -> Tags:
        """The connection's own tags: its startup tags, else its database's route."""
        if self.startup.tagged:
            return self.startup
        return self.route() or UNTAGGED

    def desired(self, comment: Tags | None, at_start: bool) -> Tags:
        """The tags a statement runs with (``comment``: its comment tags; ``at_start``: it starts a
        transaction)."""
        if comment is not None:
            base = self.default() if at_start else self.txn
            session = comment.session or base.session
            if session is None:  # an operation id without any session to put it in
                return UNTAGGED
            return Tags(session, comment.operation)
        return self.default() if at_start else self.txn

    def needs_join(self, tags: Tags, status: str) -> bool:
        applied = self.applied
        if applied.tags is None or applied.tags != tags:
            return True
        # Set inside an explicit block: a ROLLBACK TO SAVEPOINT may have undone it, so set it again
        # before each tagged statement of this block (unless it was set just now, for this statement).
        return applied.tentative and status != "I" and tags.tagged and not self.fresh

    @staticmethod
    def ends_failed_block(verdict: Analysis, status: str) -> bool:
        """In a failed block no join goes before a lone transaction statement (ROLLBACK, COMMIT, ROLLBACK TO
        SAVEPOINT): it would fail (25P02) and so refuse the one statement that can end the failure, for good.
        Such a statement reads and writes nothing, and the tags stay unknown: the next statement joins."""
        return status == "E" and verdict.kind == "transaction"

    def switch_refusal(self, comment: Tags | None) -> bytes | None:
        """A comment may not move a connection whose session is fixed (at startup, by a route) elsewhere.

        The comment is the application's per-statement tag; an agent's connection is tagged at startup or
        routed, and a comment on it (which the agent writes) may still name the operation, not the session.
        """
        if comment is None or comment.session is None:
            return None
        fixed = self.default().session
        if fixed is None or comment.session == fixed:
            return None
        how = "at startup" if self.startup.tagged else "by a route"
        return p.encode_error(
            SQLSTATE_REFUSED,
            f"cowproxy: this connection's session is fixed ({how}); a /*cow_session=…*/ comment may not "
            'switch it (rule "session")',
        )

    def joined(self, tags: Tags, tentative: bool) -> None:
        self.applied = Applied(tags, tentative=tentative)

    def forget(self) -> None:
        """The server's tags are unknown (a pool's reset, a failed block): join again before the next
        statement."""
        self.applied = Applied(None)

    def ready(self, status: str) -> None:
        """ReadyForQuery: tags set inside a transaction hold once it ended well; after an error they are
        unknown."""
        applied = self.applied
        if applied.tentative and applied.tags is not None:
            if applied.error_since:
                self.applied = Applied(None)
            elif status == "I":
                applied.tentative = False
        self.applied.error_since = False

    def settled(self) -> bool:
        """The tags in force upstream are those the next transaction needs, known for good (not set inside a
        block that may roll back)."""
        applied = self.applied
        return (
            not applied.tentative
            and applied.tags is not None
            and applied.tags == self.txn
            and applied.tags == self.default()
        )
