"""Adversarial containment: whatever a tagged connection sends, the base tables, the other sessions and the
layer stay intact, and its writes land in its own session or fail (docs/threat-model.md).

Two parts, both through a real ``cowproxy serve``, as the superuser and as a non-superuser role that owns
the application's tables, on whatever server the suite runs on (the embedded 18, or PG15 via COW_TEST_DSN):

- ``REGRESSIONS``: every attack sequence ever found (by hand or by the state machine), each on its own
  connection tagged at startup, the invariants checked after every step;
- a hypothesis ``RuleBasedStateMachine`` drawing sequences from the grammar of dangerous statements
  (``attacks.STATEMENTS`` with protocols, comment wrappers and multi-statement strings, reconnecting with
  dangerous startup options), the invariants checked after every step. Few examples by default; more
  under ``-m slow``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from tests.containment import attacks
from tests.containment.attacks import REGRESSIONS, Step
from tests.containment.world import AGENT, VICTIM, Outcome, Violation, World, run

pytestmark = pytest.mark.timeout(900)

ROLES = ("superuser", "owner")


def changes_table(world: World) -> str:
    with psycopg.connect(world.admin_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT changes_table FROM cow.registry WHERE table_name = 'items'").fetchone()
    assert row is not None
    return f"cow_changes.{row[0]}"


def send(world: World, conn: psycopg.Connection[Any], step: Step, table: str) -> Outcome:
    rendered = step.render(VICTIM, AGENT, table)
    if rendered.protocol == "simple" or conn.closed:
        if conn.closed:
            return Outcome("08003", "")
        return run(conn, rendered.sql)
    params = rendered.params or ()
    # psycopg's %s placeholders for the extended protocol; a statement without parameters is Parse'd as is
    statement = rendered.sql.replace("%", "%%")
    for i in range(len(params), 0, -1):
        statement = statement.replace(f"${i}", "%s")
    return run(conn, statement, params, rendered.protocol)


def attack(world: World, startup: str, steps: tuple[Step, ...]) -> None:
    """Run one sequence on its own connection; raise ``Violation`` at the first broken invariant."""
    table = changes_table(world)
    try:
        conn = world.attacker(startup)
    except psycopg.Error:
        world.check(None, ())  # refused at connect (fail closed): nothing may have changed
        return
    with conn:
        for step in steps:
            outcome = send(world, conn, step, table)
            world.check(conn, (outcome,))


def _case_id(case: tuple[str, str, tuple[Step, ...]]) -> str:
    cls, startup, steps = case
    return f"{cls}: {startup} {' / '.join(s.sql for s in steps)}"[:120]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("case", REGRESSIONS, ids=[_case_id(c) for c in REGRESSIONS])
def test_regression(
    new_world: Callable[[str], World],
    role: str,
    case: tuple[str, str, tuple[Step, ...]],
    request: pytest.FixtureRequest,
) -> None:
    _cls, startup, steps = case
    world = new_world(role)
    reason = world.open_escape([s.text for s in steps])
    if reason is not None:  # strict: contained one day, this test says so
        request.applymarker(pytest.mark.xfail(reason=reason, raises=Violation, strict=True))
    attack(world, startup, steps)


# -- the state machine -----------------------------------------------------------------------------------

STEPS = attacks.all_steps()
WRAPPERS = (
    "{}",
    "/* x */ {}",
    "{} -- trailing",
    "/*cow_operation='op-1'*/ {}",
    "/*cow_session='" + VICTIM + "'*/ {}",
    "{} /*cow_session='" + VICTIM + "'*/",
    "SELECT 1; {}",
    "{}; INSERT INTO notes (body) VALUES ('after')",
    "BEGIN; {}; COMMIT",
)


class Containment(RuleBasedStateMachine):
    """One attacker's connection (reconnected at will) against one fresh world."""

    make_world: Callable[[str], World]
    role: str

    def __init__(self) -> None:
        super().__init__()
        self.world = type(self).make_world(type(self).role)
        self.table = changes_table(self.world)
        self.conn: psycopg.Connection[Any] | None = None
        self.outcomes: list[Outcome] = []

    @initialize(startup=st.sampled_from(attacks.STARTUP_OPTIONS))
    def connect(self, startup: str) -> None:
        self.reconnect(startup)

    @rule(startup=st.sampled_from(attacks.STARTUP_OPTIONS))
    def reconnect(self, startup: str) -> None:
        if self.conn is not None:
            with contextlib.suppress(psycopg.Error):
                self.conn.close()
        try:
            self.conn = self.world.attacker(startup)
        except psycopg.Error:
            self.conn = self.world.attacker()  # refused at connect: attack on an ordinary connection

    @rule(step=st.sampled_from(STEPS), protocol=st.sampled_from(["simple", "extended", "prepared"]))
    def statement(self, step: tuple[str, Step], protocol: str) -> None:
        _cls, chosen = step
        if chosen.params is None and ";" in chosen.sql:
            protocol = "simple"  # a multi-statement string exists only as a Query
        elif chosen.params is not None:
            protocol = chosen.protocol
        self.send(Step(chosen.sql, chosen.params, protocol))

    @rule(step=st.sampled_from(STEPS), wrapper=st.sampled_from(WRAPPERS))
    def wrapped(self, step: tuple[str, Step], wrapper: str) -> None:
        _cls, chosen = step
        if chosen.params is not None:
            return
        self.send(Step(wrapper.format(chosen.sql)))

    def send(self, step: Step) -> None:
        assert self.conn is not None
        assume(self.world.open_escape([step.text]) is None)  # (those are test_regression's xfails)
        self.outcomes = [send(self.world, self.conn, step, self.table)]

    @invariant()
    def contained(self) -> None:
        if self.conn is not None:
            self.world.check(self.conn, self.outcomes)
            self.outcomes = []

    def teardown(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(psycopg.Error):
                self.conn.close()


def _run_machine(new_world: Callable[[str], World], role: str, examples: int, steps: int) -> None:
    attributes = {"make_world": staticmethod(new_world), "role": role}
    machine = type(f"Containment_{role}", (Containment,), attributes)
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=False,
        ),
    )


@pytest.mark.parametrize("role", ROLES)
def test_state_machine(new_world: Callable[[str], World], role: str) -> None:
    _run_machine(new_world, role, examples=6, steps=6)


@pytest.mark.slow
@pytest.mark.parametrize("role", ROLES)
def test_state_machine_long(new_world: Callable[[str], World], role: str) -> None:
    _run_machine(new_world, role, examples=60, steps=12)
