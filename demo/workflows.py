"""The paper's workflows (its Table 4) as rules over the application's data.

Each workflow reads the project through the API into a ``Snapshot`` and derives a ``Plan`` — the label
to create and the change of every work item — from its rule, so the ground truth always agrees with the
seed data. The same plans drive the scripted agents (see ``demo.agents``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from demo.api import Caller
from demo.errors import DemoError

NEW_LABEL = -1  # placeholder for the id of the label the plan creates

OPEN = ("Backlog", "Todo", "In Progress")
LOW_TO_MEDIUM = ("none", "low", "medium")


@dataclass(frozen=True)
class Snapshot:
    project: dict[str, Any]
    states: dict[str, int]  # name -> id
    labels: dict[str, int]  # name -> id
    members: dict[str, int]  # username -> id
    items: tuple[dict[str, Any], ...]

    def state_name(self, item: dict[str, Any]) -> str:
        return str(item["state"])

    def has_label(self, item: dict[str, Any], name: str) -> bool:
        return name in self.labels and self.labels[name] in item["label_ids"]


@dataclass(frozen=True)
class NewLabel:
    name: str
    color: str


@dataclass(frozen=True)
class ItemChange:
    """One work item's change: ``fields`` for the item itself, full new sets for assignees and labels."""

    item_id: int
    key: str
    fields: dict[str, Any] = field(default_factory=dict)
    assignee_ids: tuple[int, ...] | None = None
    label_ids: tuple[int, ...] | None = None

    def arguments(self, new_label_id: int | None) -> dict[str, Any]:
        args: dict[str, Any] = {"work_item_id": self.item_id, **self.fields}
        if self.assignee_ids is not None:
            args["assignee_ids"] = list(self.assignee_ids)
        if self.label_ids is not None:
            args["label_ids"] = [new_label_id if x == NEW_LABEL else x for x in self.label_ids]
        return args


@dataclass(frozen=True)
class Plan:
    new_label: NewLabel | None
    changes: tuple[ItemChange, ...]


@dataclass(frozen=True)
class Workflow:
    number: int  # its row in the paper's Table 4
    slug: str
    title: str
    project: str  # project identifier
    prompt: str
    rule: Callable[[Snapshot], Plan]


def snapshot(api: Caller, identifier: str) -> Snapshot:
    """Read one project through the API (what any client of the application would do)."""
    projects = api.call("listProjects", {})
    found = [p for p in projects if p["identifier"] == identifier]
    if not found:
        raise DemoError(f"no project {identifier} in the application")
    project = found[0]
    pid = project["id"]
    return Snapshot(
        project=project,
        states={s["name"]: s["id"] for s in api.call("listStates", {"project_id": pid})},
        labels={lab["name"]: lab["id"] for lab in api.call("listLabels", {"project_id": pid})},
        members={m["username"]: m["id"] for m in api.call("listMembers", {})},
        items=tuple(api.call("listWorkItems", {"project_id": pid})),
    )


def execute_plan(api: Caller, snap: Snapshot, plan: Plan) -> int:
    """Apply a plan through the API; returns the number of write calls made."""
    calls = 0
    new_label_id: int | None = None
    if plan.new_label is not None:
        created = api.call(
            "createLabel",
            {"project_id": snap.project["id"], "name": plan.new_label.name, "color": plan.new_label.color},
        )
        new_label_id = int(created["id"])
        calls += 1
    for change in plan.changes:
        api.call("updateWorkItem", change.arguments(new_label_id))
        calls += 1
    return calls


class _Edit:
    """Accumulates the change of one work item while a rule runs."""

    def __init__(self, snap: Snapshot, item: dict[str, Any]) -> None:
        self.snap = snap
        self.item = item
        self.fields: dict[str, Any] = {}
        self.assignees = list(item["assignee_ids"])
        self.labels = list(item["label_ids"])

    def state(self, name: str) -> None:
        if self.item["state"] != name:
            self.fields["state_id"] = self.snap.states[name]

    def priority(self, value: str) -> None:
        if self.item["priority"] != value:
            self.fields["priority"] = value

    def assign(self, username: str) -> None:
        member = self.snap.members[username]
        if member not in self.assignees:
            self.assignees.append(member)

    def unassign(self, username: str) -> None:
        member = self.snap.members[username]
        if member in self.assignees:
            self.assignees.remove(member)

    def add_label(self, name: str) -> None:
        label = NEW_LABEL if name == "*new*" else self.snap.labels[name]
        if label not in self.labels:
            self.labels.append(label)

    def remove_label(self, name: str) -> None:
        if name in self.snap.labels and self.snap.labels[name] in self.labels:
            self.labels.remove(self.snap.labels[name])

    def change(self) -> ItemChange | None:
        assignees = (
            None if self.assignees == list(self.item["assignee_ids"]) else tuple(sorted(self.assignees))
        )
        labels = None if self.labels == list(self.item["label_ids"]) else tuple(self.labels)
        if not self.fields and assignees is None and labels is None:
            return None
        return ItemChange(self.item["id"], self.item["key"], dict(self.fields), assignees, labels)


def _plan(
    snap: Snapshot,
    select: Callable[[dict[str, Any]], bool],
    edit: Callable[[_Edit], None],
    new_label: NewLabel | None = None,
) -> Plan:
    changes: list[ItemChange] = []
    for item in snap.items:
        if select(item):
            e = _Edit(snap, item)
            edit(e)
            change = e.change()
            if change is not None:
                changes.append(change)
    return Plan(new_label, tuple(changes))


def _unassigned(item: dict[str, Any]) -> bool:
    return not item["assignee_ids"]


def _any_label(snap: Snapshot, item: dict[str, Any], names: Iterable[str]) -> bool:
    return any(snap.has_label(item, n) for n in names)


# --- the rules ------------------------------------------------------------------------------------------


def sprint_kickoff(s: Snapshot) -> Plan:
    def edit(e: _Edit) -> None:
        e.state("In Progress")
        if not e.item["assignee_ids"]:
            e.assign("alice")
        if s.members["blub"] in e.item["assignee_ids"]:
            e.unassign("blub")
            e.assign("bob")

    return _plan(s, lambda i: i["state"] == "Todo", edit)


def security_incident_response(s: Snapshot) -> Plan:
    def edit(e: _Edit) -> None:
        e.state("In Progress")
        e.add_label("blocker")
        e.priority("urgent")
        if _unassigned(e.item):
            e.assign("dave")

    return _plan(s, lambda i: s.has_label(i, "security") and i["state"] in ("Backlog", "Todo"), edit)


def bug_escalation(s: Snapshot) -> Plan:
    def edit(e: _Edit) -> None:
        e.state("Todo")
        e.add_label("blocker")
        e.assign("frank")

    return _plan(s, lambda i: s.has_label(i, "bug") and i["state"] == "Backlog", edit)


def stale_backlog_cleanup(s: Snapshot) -> Plan:
    def edit(e: _Edit) -> None:
        e.add_label("stale")
        e.state("Cancelled")

    return _plan(
        s, lambda i: i["state"] == "Backlog" and _unassigned(i) and i["priority"] in ("low", "none"), edit
    )


def triage_unassigned_backlog(s: Snapshot) -> Plan:
    def edit(e: _Edit) -> None:
        if e.item["priority"] in ("high", "urgent"):
            e.assign("eve")
        elif e.item["priority"] == "medium":
            e.assign("frank")
        else:
            e.priority("medium")
            e.assign("frank")

    return _plan(s, lambda i: i["state"] == "Backlog" and _unassigned(i), edit)


def deprioritize_stale_medium_backlog(s: Snapshot) -> Plan:
    def edit(e: _Edit) -> None:
        e.priority("low")
        e.add_label("stale")

    return _plan(s, lambda i: i["state"] == "Backlog" and i["priority"] == "medium" and _unassigned(i), edit)


def escalate_high_to_urgent(s: Snapshot) -> Plan:
    def edit(e: _Edit) -> None:
        e.priority("urgent")
        if e.item["state"] == "Backlog":
            e.add_label("urgent")

    return _plan(s, lambda i: i["priority"] == "high" and i["state"] in OPEN, edit)


def _sprint(
    s: Snapshot, label: NewLabel, match: Iterable[str], owner: str, *, to_urgent: bool = False
) -> Plan:
    """The shape shared by the label-creating sprint workflows (11, 14, 16 in the paper's Table 4)."""
    names = tuple(match)

    def edit(e: _Edit) -> None:
        e.add_label("*new*")
        if e.item["state"] == "Backlog":
            e.state("Todo")
        if to_urgent:
            if e.item["priority"] == "high":
                e.priority("urgent")
        elif e.item["priority"] in LOW_TO_MEDIUM:
            e.priority("high")
        if _unassigned(e.item):
            e.assign(owner)

    return _plan(s, lambda i: _any_label(s, i, names) and i["state"] in OPEN, edit, label)


def q3_feature_prep(s: Snapshot) -> Plan:
    return _sprint(s, NewLabel("q3-target-v2", "#8b5cf6"), ("growth", "experiment"), "eve")


def campaign_push(s: Snapshot) -> Plan:
    return _sprint(s, NewLabel("campaign-active-v2", "#db2777"), ("campaign",), "eve", to_urgent=True)


def editorial_sprint(s: Snapshot) -> Plan:
    return _sprint(s, NewLabel("editorial-sprint-v2", "#f59e0b"), ("editorial",), "alice")


def in_progress_ownership_audit(s: Snapshot) -> Plan:
    def edit(e: _Edit) -> None:
        e.add_label("*new*")
        e.remove_label("stale")
        if _unassigned(e.item):
            e.assign("alice")
        if e.item["priority"] in LOW_TO_MEDIUM:
            e.priority("high")

    return _plan(s, lambda i: i["state"] == "In Progress", edit, NewLabel("active-sprint-v2", "#2563eb"))


def stale_backlog_cancel(s: Snapshot) -> Plan:
    def edit(e: _Edit) -> None:
        e.add_label("stale")
        e.state("Cancelled")

    return _plan(
        s,
        lambda i: (
            i["state"] == "Backlog"
            and _unassigned(i)
            and i["priority"] in ("low", "medium")
            and not s.has_label(i, "security")
        ),
        edit,
    )


def _assign_by_label(
    s: Snapshot, owners: tuple[tuple[str, str], ...], default: str, *, raise_to_high: bool
) -> Plan:
    """Backlog items with no assignee go to the owner of their first matching label (else ``default``)."""

    def edit(e: _Edit) -> None:
        owner = next((who for label, who in owners if s.has_label(e.item, label)), default)
        e.assign(owner)
        if raise_to_high and e.item["priority"] in LOW_TO_MEDIUM:
            e.priority("high")

    return _plan(s, lambda i: i["state"] == "Backlog" and _unassigned(i), edit)


def assign_backlog_by_specialty(s: Snapshot) -> Plan:
    return _assign_by_label(s, (("security", "dave"), ("bug", "bob")), "carol", raise_to_high=True)


def assign_backlog_by_role(s: Snapshot) -> Plan:
    return _assign_by_label(s, (("bug", "alice"), ("security", "carol")), "bob", raise_to_high=False)


def infra_sprint_kickoff(s: Snapshot) -> Plan:
    return _sprint(s, NewLabel("infra-sprint-v2", "#0284c7"), ("infra",), "dave")


def bug_triage_round_2(s: Snapshot) -> Plan:
    def edit(e: _Edit) -> None:
        e.add_label("*new*")
        e.add_label("blocker")
        if e.item["priority"] in LOW_TO_MEDIUM:
            e.priority("high")
        if _unassigned(e.item):
            e.assign("frank")

    label = NewLabel("bug-sprint-v2", "#dc2626")
    return _plan(s, lambda i: s.has_label(i, "bug") and i["state"] in OPEN, edit, label)


def performance_backlog_push(s: Snapshot) -> Plan:
    def edit(e: _Edit) -> None:
        e.add_label("*new*")
        if e.item["priority"] in LOW_TO_MEDIUM:
            e.priority("high")
        if _unassigned(e.item):
            e.assign("carol")
        if e.item["state"] == "Backlog":
            e.state("Todo")

    label = NewLabel("perf-sprint-v2", "#7c3aed")
    return _plan(
        s, lambda i: s.has_label(i, "performance") and i["state"] in ("Backlog", "Todo"), edit, label
    )


def bug_fix_sprint(s: Snapshot) -> Plan:
    return _sprint(s, NewLabel("bug-fix-sprint-v2", "#b91c1c"), ("bug",), "bob")


def security_hardening_sprint(s: Snapshot) -> Plan:
    def edit(e: _Edit) -> None:
        e.add_label("*new*")
        e.add_label("blocker")
        e.priority("urgent")
        if e.item["state"] == "Backlog":
            e.state("Todo")
        if _unassigned(e.item):
            e.assign("dave")

    label = NewLabel("security-sprint-v2", "#991b1b")
    return _plan(s, lambda i: s.has_label(i, "security") and i["state"] in OPEN, edit, label)


def backlog_ownership_assignment(s: Snapshot) -> Plan:
    def edit(e: _Edit) -> None:
        e.add_label("*new*")
        if e.item["priority"] in ("high", "urgent"):
            e.assign("eve")
        elif e.item["priority"] == "medium":
            e.assign("frank")
        else:
            e.priority("medium")
            e.assign("frank")
        e.state("Todo")

    label = NewLabel("needs-owner", "#d97706")
    return _plan(s, lambda i: i["state"] == "Backlog" and _unassigned(i), edit, label)


WORKFLOWS: tuple[Workflow, ...] = (
    Workflow(
        1,
        "sprint-kickoff",
        "Sprint Kickoff",
        "PSP",
        "Kick off the sprint in Paper Streets Press (PSP): move every issue that is in Todo to In Progress."
        " Issues without an assignee go to alice; issues assigned to blub are reassigned to bob instead.",
        sprint_kickoff,
    ),
    Workflow(
        2,
        "security-incident-response",
        "Security Incident Response",
        "PE",
        "Security incident in Platform Engineering (PE): every issue labelled security that is in Backlog or"
        " Todo moves to In Progress, gets the label blocker if it does not have it, gets priority urgent,"
        " and is assigned to dave if nobody is assigned. Keep existing labels and assignees.",
        security_incident_response,
    ),
    Workflow(
        3,
        "bug-escalation",
        "Bug Escalation",
        "GS",
        "Escalate the bugs in Growth and Subscriptions (GS): every issue labelled bug that is in Backlog"
        " moves to Todo, gets the label blocker (keep its other labels) and gets frank as an assignee"
        " (keep the existing assignees).",
        bug_escalation,
    ),
    Workflow(
        4,
        "stale-backlog-cleanup",
        "Stale Backlog Cleanup",
        "PSP",
        "Clean up the stale backlog of Paper Streets Press (PSP): every issue in Backlog with no assignee and"
        " priority low or none gets the label stale (keep its other labels) and moves to Cancelled.",
        stale_backlog_cleanup,
    ),
    Workflow(
        5,
        "triage-unassigned-backlog",
        "Triage Unassigned Backlog",
        "GS",
        "Triage the unassigned backlog of Growth and Subscriptions (GS): for every issue in Backlog with no"
        " assignee, assign eve if its priority is high or urgent, frank if it is medium; if it is low or"
        " none, set the priority to medium and assign frank.",
        triage_unassigned_backlog,
    ),
    Workflow(
        6,
        "stale-backlog-cancel",
        "Stale Backlog Cancel",
        "PE",
        "In Platform Engineering (PE), every issue in Backlog with no assignee, priority low or medium"
        " and without the label security gets the label stale (keep its other labels) and moves to"
        " Cancelled.",
        stale_backlog_cancel,
    ),
    Workflow(
        7,
        "assign-backlog-by-specialty",
        "Assign Backlog by Specialty",
        "PE",
        "Assign the unassigned backlog of Platform Engineering (PE) by specialty: every issue in Backlog"
        " with no assignee goes to dave if it is labelled security, otherwise to bob if it is labelled"
        " bug, otherwise to carol. Each issue you assign with priority none, low or medium becomes"
        " priority high.",
        assign_backlog_by_specialty,
    ),
    Workflow(
        8,
        "deprioritize-stale-medium-backlog",
        "Deprioritize Stale Medium Backlog",
        "PSP",
        "In Paper Streets Press (PSP), every issue in Backlog with priority medium and no assignee: lower the"
        " priority to low and add the label stale (keep its other labels).",
        deprioritize_stale_medium_backlog,
    ),
    Workflow(
        9,
        "escalate-high-to-urgent",
        "Escalate High to Urgent",
        "PE",
        "In Platform Engineering (PE), every issue with priority high in an open state (Backlog, Todo or"
        " In Progress) becomes priority urgent; those in Backlog also get the label urgent (keep their other"
        " labels).",
        escalate_high_to_urgent,
    ),
    Workflow(
        10,
        "assign-backlog-by-role",
        "Assign Backlog by Role",
        "PSP",
        "Assign the unassigned backlog of Paper Streets Press (PSP) by role: every issue in Backlog with"
        " no assignee goes to alice if it is labelled bug, otherwise to carol if it is labelled security,"
        " otherwise to bob.",
        assign_backlog_by_role,
    ),
    Workflow(
        11,
        "q3-feature-prep",
        "Q3 Feature Prep",
        "GS",
        "Prepare Q3 in Growth and Subscriptions (GS): create the label q3-target-v2 with color #8b5cf6. Every"
        " issue labelled growth or experiment that is not Done or Cancelled gets that label (keep its other"
        " labels); those in Backlog move to Todo; unassigned ones go to eve; priority none, low or medium"
        " becomes high.",
        q3_feature_prep,
    ),
    Workflow(
        12,
        "infra-sprint-kickoff",
        "Infra Sprint Kickoff",
        "PE",
        "Kick off the infrastructure sprint in Platform Engineering (PE): create the label"
        " infra-sprint-v2 with color #0284c7. Every issue labelled infra that is not Done or Cancelled"
        " gets that label (keep its other labels); those in Backlog move to Todo; unassigned ones go to"
        " dave; priority none, low or medium becomes high.",
        infra_sprint_kickoff,
    ),
    Workflow(
        13,
        "bug-triage-round-2",
        "Bug Triage Round 2",
        "GS",
        "Second bug triage in Growth and Subscriptions (GS): create the label bug-sprint-v2 with color"
        " #dc2626. Every issue labelled bug that is not Done or Cancelled gets that label and the label"
        " blocker if it does not have it (keep its other labels); priority none, low or medium becomes"
        " high; unassigned ones go to frank.",
        bug_triage_round_2,
    ),
    Workflow(
        14,
        "campaign-push",
        "Campaign Push",
        "GS",
        "Campaign push in Growth and Subscriptions (GS): create the label campaign-active-v2 with color"
        " #db2777. Every issue labelled campaign that is not Done or Cancelled gets that label (keep its"
        " other labels); those in Backlog move to Todo; priority high becomes urgent; unassigned ones go"
        " to eve.",
        campaign_push,
    ),
    Workflow(
        15,
        "in-progress-ownership-audit",
        "In Progress Ownership Audit",
        "PSP",
        "Audit the work in progress of Paper Streets Press (PSP): create the label active-sprint-v2 with"
        " color #2563eb. Every issue In Progress gets that label and loses the label stale if it has it;"
        " unassigned ones go to alice; priority none, low or medium becomes high.",
        in_progress_ownership_audit,
    ),
    Workflow(
        16,
        "editorial-sprint",
        "Editorial Sprint",
        "PSP",
        "Editorial sprint in Paper Streets Press (PSP): create the label editorial-sprint-v2 with color"
        " #f59e0b. Every issue labelled editorial that is not Done or Cancelled gets that label (keep its"
        " other labels); those in Backlog move to Todo; unassigned ones go to alice; priority none, low or"
        " medium becomes high.",
        editorial_sprint,
    ),
    Workflow(
        17,
        "performance-backlog-push",
        "Performance Backlog Push",
        "PE",
        "Push the performance work in Platform Engineering (PE): create the label perf-sprint-v2 with"
        " color #7c3aed. Every issue labelled performance that is in Backlog or Todo gets that label (keep"
        " its other labels); priority none, low or medium becomes high; unassigned ones go to carol; those"
        " in Backlog move to Todo.",
        performance_backlog_push,
    ),
    Workflow(
        18,
        "bug-fix-sprint",
        "Bug Fix Sprint",
        "PSP",
        "Bug fix sprint in Paper Streets Press (PSP): create the label bug-fix-sprint-v2 with color"
        " #b91c1c. Every issue labelled bug that is not Done or Cancelled gets that label (keep its other"
        " labels); priority none, low or medium becomes high; those in Backlog move to Todo; unassigned"
        " ones go to bob.",
        bug_fix_sprint,
    ),
    Workflow(
        19,
        "security-hardening-sprint",
        "Security Hardening Sprint",
        "PE",
        "Security hardening in Platform Engineering (PE): create the label security-sprint-v2 with color"
        " #991b1b. Every issue labelled security that is not Done or Cancelled gets that label and the"
        " label blocker if it does not have it (keep its other labels); its priority becomes urgent; those"
        " in Backlog move to Todo; unassigned ones go to dave.",
        security_hardening_sprint,
    ),
    Workflow(
        20,
        "backlog-ownership-assignment",
        "Backlog Ownership Assignment",
        "GS",
        "Give the backlog of Growth and Subscriptions (GS) owners: create the label needs-owner with"
        " color #d97706. Every issue in Backlog with no assignee gets that label (keep its other labels)"
        " and moves to Todo; it goes to eve if its priority is high or urgent, to frank if it is medium;"
        " if it is none or low, its priority becomes medium and it goes to frank.",
        backlog_ownership_assignment,
    ),
)

BY_SLUG = {w.slug: w for w in WORKFLOWS}
QUICK = ("sprint-kickoff", "bug-escalation", "campaign-push")


def plan_for(api: Caller, workflow: Workflow) -> tuple[Snapshot, Plan]:
    snap = snapshot(api, workflow.project)
    return snap, workflow.rule(snap)


def record_ground_truth(api: Caller, workflow: Workflow) -> int:
    """Perform the workflow's ideal writes through the API; returns the number of write calls."""
    snap, plan = plan_for(api, workflow)
    return execute_plan(api, snap, plan)


def with_state_shift(snap: Snapshot, plan: Plan, shift: dict[str, str]) -> Plan:
    """The plan with every target state replaced through ``shift`` (used by the wrong-values agent)."""
    names = {v: k for k, v in snap.states.items()}
    changes = []
    for c in plan.changes:
        fields = dict(c.fields)
        if "state_id" in fields:
            fields["state_id"] = snap.states[shift.get(names[fields["state_id"]], names[fields["state_id"]])]
        changes.append(replace(c, fields=fields))
    return Plan(plan.new_label, tuple(changes))
