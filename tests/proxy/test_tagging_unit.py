"""The tags of a connection (proxy/tagging.py): which a statement runs with, when the upstream joins again,
and the refusal of a comment that would move a fixed session."""

from __future__ import annotations

from proxy import protocol as p
from proxy.tagging import Tagging
from proxy.tags import UNTAGGED, Tags


def test_a_statement_runs_with_its_comment_tags_else_the_transaction_s_else_the_connection_s() -> None:
    route: list[Tags | None] = [None]
    tagging = Tagging(UNTAGGED, lambda: route[0])
    assert tagging.desired(None, at_start=True) == UNTAGGED
    route[0] = Tags("R")
    assert tagging.desired(None, at_start=True) == Tags("R")  # a route counts from the next transaction
    assert tagging.desired(None, at_start=False) == UNTAGGED  # (the transaction's, as it started)
    assert tagging.desired(Tags(None, "op"), at_start=True) == Tags("R", "op")  # an operation in the route's
    assert tagging.desired(Tags(None, "op"), at_start=False) == UNTAGGED  # no session to put it in
    tagging.txn = Tags("S")
    assert tagging.desired(Tags(None, "op2"), at_start=False) == Tags("S", "op2")


def test_a_join_is_needed_until_the_tags_are_known_and_again_inside_a_block() -> None:
    tagging = Tagging(Tags("S"), lambda: None)
    assert tagging.needs_join(Tags("S"), "I")  # nothing joined yet
    tagging.joined(Tags("S"), tentative=True)  # inside the client's block
    assert not tagging.needs_join(Tags("S"), "I")
    assert tagging.needs_join(Tags("S"), "T")  # a ROLLBACK TO SAVEPOINT may have undone it
    tagging.fresh = True
    assert not tagging.needs_join(Tags("S"), "T")  # (set just now, for this statement)
    tagging.applied.error_since = True
    tagging.ready("I")  # the block failed: the server's tags are unknown
    assert tagging.applied.tags is None and tagging.needs_join(Tags("S"), "I")
    tagging.joined(Tags("S"), tentative=True)
    tagging.ready("I")  # ended well: known for good
    tagging.txn = Tags("S")
    assert not tagging.applied.tentative and tagging.settled()


def test_a_comment_may_not_move_a_fixed_session() -> None:
    assert Tagging(UNTAGGED, lambda: None).switch_refusal(Tags("X")) is None  # nothing fixed: it may
    fixed = Tagging(Tags("S"), lambda: None)
    assert fixed.switch_refusal(Tags("S", "op")) is None and fixed.switch_refusal(Tags(None, "op")) is None
    refusal = fixed.switch_refusal(Tags("X"))
    assert refusal is not None
    error = p.decode_error(refusal[5:])
    assert error.sqlstate == "42501" and "fixed (at startup)" in error.message
    routed = Tagging(UNTAGGED, lambda: Tags("R")).switch_refusal(Tags("X"))
    assert routed is not None and "fixed (by a route)" in p.decode_error(routed[5:]).message
