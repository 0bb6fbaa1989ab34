"""Seed data of the sample application, shaped like the paper's Plane study (appendix C.2).

3 projects (PSP, PE, GS), 7 workspace members (the admin agent ``blub`` and six personas), 5 states per
project (15), 26 labels (10 + 8 + 8) and 63 work items (32 + 16 + 15) with assignees, priorities, labels
and descriptions. Ids are fixed so that the workflows, the scripted agents and the tests can name rows.
The work items are written so that every shipped workflow has several targets and several near misses.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

WORKSPACE = ("paper-streets", "Paper Streets")

# username, display name, role; "blub" is the workspace's admin agent account the prompts name.
MEMBERS: tuple[tuple[str, str, str], ...] = (
    ("blub", "Blub (admin agent)", "admin"),
    ("alice", "Alice Moreau", "member"),
    ("bob", "Bob Okafor", "member"),
    ("carol", "Carol Lindqvist", "member"),
    ("dave", "Dave Ibarra", "member"),
    ("eve", "Eve Nakamura", "member"),
    ("frank", "Frank Osei", "member"),
)

STATES: tuple[tuple[str, str], ...] = (
    ("Backlog", "backlog"),
    ("Todo", "unstarted"),
    ("In Progress", "started"),
    ("Done", "completed"),
    ("Cancelled", "cancelled"),
)

_LABEL_COLORS = {
    "bug": "#ef4444",
    "security": "#b91c1c",
    "urgent": "#f97316",
    "blocker": "#7f1d1d",
    "stale": "#9ca3af",
    "editorial": "#0ea5e9",
    "feature": "#22c55e",
    "design": "#a855f7",
    "docs": "#64748b",
    "performance": "#eab308",
    "infra": "#0f766e",
    "reliability": "#2563eb",
    "growth": "#16a34a",
    "experiment": "#c026d3",
    "campaign": "#db2777",
    "billing": "#854d0e",
}


@dataclass(frozen=True)
class SeedItem:
    name: str
    state: str
    priority: str
    assignees: tuple[str, ...]
    labels: tuple[str, ...]
    description: str


def _i(name: str, state: str, priority: str, assignees: str, labels: str, description: str) -> SeedItem:  # noqa: PLR0917
    return SeedItem(name, state, priority, tuple(assignees.split()), tuple(labels.split()), description)


@dataclass(frozen=True)
class SeedProject:
    identifier: str
    name: str
    description: str
    members: tuple[str, ...]
    labels: tuple[str, ...]
    items: tuple[SeedItem, ...]


PROJECTS: tuple[SeedProject, ...] = (
    SeedProject(
        "PSP",
        "Paper Streets Press",
        "The publishing house: catalogue, storefront, author portal and editorial calendar.",
        ("blub", "alice", "bob", "carol", "dave", "eve", "frank"),
        (
            "bug",
            "security",
            "urgent",
            "blocker",
            "stale",
            "editorial",
            "feature",
            "design",
            "docs",
            "performance",
        ),
        (
            _i(
                "Fix broken footnote links in the reader",
                "Todo",
                "high",
                "",
                "bug",
                "Footnote anchors in the web reader jump to the top of the chapter instead of the note.",
            ),
            _i(
                "Draft spring catalogue copy",
                "Todo",
                "medium",
                "blub",
                "editorial",
                "Write the blurbs for the twelve spring titles; marketing needs them by the 15th.",
            ),
            _i(
                "Add ISBN validation to the submission form",
                "Todo",
                "medium",
                "carol",
                "feature",
                "Reject malformed ISBN-13 values and check the checksum digit before saving.",
            ),
            _i(
                "Update author style guide",
                "Todo",
                "low",
                "",
                "docs editorial",
                "Bring the style guide in line with the 2026 house style (serial comma, numerals).",
            ),
            _i(
                "Compress cover images on the storefront",
                "Todo",
                "medium",
                "blub",
                "performance",
                "Cover images are served at full resolution; generate WebP variants at three sizes.",
            ),
            _i(
                "Review translation rights contract template",
                "Todo",
                "none",
                "eve",
                "",
                "Legal asked for a review of the template before the Frankfurt book fair.",
            ),
            _i(
                "Redesign the newsletter header",
                "Todo",
                "low",
                "",
                "design",
                "The header looks dated next to the new storefront; match the new typography.",
            ),
            _i(
                "Migrate the manuscript archive to object storage",
                "Backlog",
                "none",
                "",
                "feature",
                "The archive still lives on the old file server; move it and keep the folder layout.",
            ),
            _i(
                "Typo sweep on the backlist pages",
                "Backlog",
                "low",
                "",
                "editorial",
                "Readers reported typos on several backlist landing pages.",
            ),
            _i(
                "Evaluate a new e-book converter",
                "Backlog",
                "low",
                "",
                "",
                "Compare two EPUB converters on footnotes, tables and right-to-left text.",
            ),
            _i(
                "Author portal dark mode",
                "Backlog",
                "none",
                "",
                "design",
                "Several authors asked for a dark theme in the portal.",
            ),
            _i(
                "Archive 2019 marketing assets",
                "Backlog",
                "medium",
                "",
                "",
                "Move the 2019 campaign assets out of the shared drive into the archive.",
            ),
            _i(
                "Consolidate duplicate author records",
                "Backlog",
                "medium",
                "",
                "bug",
                "Some authors appear twice after the CRM import; merge them and keep the royalties history.",
            ),
            _i(
                "Add reading-time estimates to articles",
                "Backlog",
                "medium",
                "",
                "feature",
                "Show an estimated reading time under each article title.",
            ),
            _i(
                "Audit third-party scripts on the storefront",
                "Backlog",
                "high",
                "",
                "security",
                "List every third-party script the storefront loads and remove the ones nobody owns.",
            ),
            _i(
                "Rework royalty statement layout",
                "Backlog",
                "low",
                "dave",
                "design",
                "Authors find the statement hard to read; group the lines by title.",
            ),
            _i(
                "Index back issues for search",
                "Backlog",
                "medium",
                "bob",
                "feature",
                "Back issues of the magazine are not in the search index yet.",
            ),
            _i(
                "Patch XSS in the comment widget",
                "Backlog",
                "urgent",
                "carol",
                "security bug",
                "The comment widget renders author names without escaping.",
            ),
            _i(
                "Document the release checklist",
                "Backlog",
                "none",
                "frank",
                "docs",
                "Write down the steps we follow before publishing a new edition.",
            ),
            _i(
                "Proofread the autumn anthology",
                "In Progress",
                "high",
                "alice",
                "editorial",
                "Second proofreading pass on the anthology before it goes to the printer.",
            ),
            _i(
                "Speed up the catalogue search page",
                "In Progress",
                "medium",
                "bob",
                "performance",
                "The catalogue search takes four seconds on mobile; add an index and paginate.",
            ),
            _i(
                "Replace the payment provider SDK",
                "In Progress",
                "urgent",
                "",
                "security",
                "The current SDK is end-of-life and misses the latest card network requirements.",
            ),
            _i(
                "Write the contributor onboarding guide",
                "In Progress",
                "low",
                "",
                "docs stale",
                "A guide for freelance editors joining a project mid-way.",
            ),
            _i(
                "Fix pagination on the archive page",
                "In Progress",
                "none",
                "dave",
                "bug",
                "Page 2 of the archive repeats the last item of page 1.",
            ),
            _i(
                "Set up the print-on-demand export",
                "In Progress",
                "medium",
                "eve frank",
                "feature stale",
                "Export print-ready PDFs with bleed and crop marks for the print-on-demand partner.",
            ),
            _i(
                "Refresh the homepage hero layout",
                "In Progress",
                "high",
                "carol",
                "design",
                "New hero with the featured title of the month.",
            ),
            _i(
                "Launch the new author bios",
                "Done",
                "medium",
                "alice",
                "editorial",
                "Longer author bios with photos on every title page.",
            ),
            _i(
                "Fix the RSS feed encoding",
                "Done",
                "high",
                "bob",
                "bug",
                "Accented characters were double-encoded in the RSS feed.",
            ),
            _i(
                "Move DNS to the new registrar",
                "Done",
                "low",
                "dave",
                "",
                "Transfer the domains before the old registrar contract ends.",
            ),
            _i(
                "Publish the accessibility statement",
                "Done",
                "medium",
                "carol",
                "docs",
                "Publish the statement required for the public-sector catalogue.",
            ),
            _i(
                "Podcast companion site",
                "Cancelled",
                "low",
                "",
                "feature",
                "A small site for the podcast; dropped when the podcast was paused.",
            ),
            _i(
                "Print a 2020 wall calendar",
                "Cancelled",
                "none",
                "eve",
                "stale",
                "Left over from an old merchandising idea.",
            ),
        ),
    ),
    SeedProject(
        "PE",
        "Platform Engineering",
        "Infrastructure, security and reliability of every service the company runs.",
        ("blub", "bob", "carol", "dave", "eve", "frank"),
        ("bug", "security", "urgent", "blocker", "stale", "infra", "performance", "reliability"),
        (
            _i(
                "Rotate the leaked CI deploy token",
                "Todo",
                "high",
                "",
                "security",
                "A deploy token showed up in a public build log; rotate it and audit its use.",
            ),
            _i(
                "Enforce MFA for the admin console",
                "Backlog",
                "medium",
                "carol",
                "security",
                "Admin console logins still accept password-only sign-in.",
            ),
            _i(
                "Patch OpenSSL on the edge nodes",
                "Todo",
                "urgent",
                "dave",
                "security blocker",
                "Apply the vendor patch for the OpenSSL advisory on every edge node.",
            ),
            _i(
                "Audit IAM roles for unused permissions",
                "Backlog",
                "low",
                "",
                "security infra",
                "Several roles still grant write access to buckets nobody uses.",
            ),
            _i(
                "Harden the bastion host SSH config",
                "In Progress",
                "high",
                "bob",
                "security",
                "Disable password auth and agent forwarding on the bastion.",
            ),
            _i(
                "Add read replicas for the reporting database",
                "Backlog",
                "high",
                "",
                "infra performance",
                "Reporting queries slow down the primary every Monday morning.",
            ),
            _i(
                "Cut p99 latency of the auth service",
                "Todo",
                "high",
                "eve",
                "performance",
                "p99 of token validation is 800 ms; the target is 150 ms.",
            ),
            _i(
                "Fix flaky health checks on the queue workers",
                "In Progress",
                "high",
                "frank",
                "bug reliability",
                "Workers are restarted when a health check times out under load.",
            ),
            _i(
                "Upgrade Kubernetes to 1.31",
                "Backlog",
                "medium",
                "dave",
                "infra",
                "The clusters run 1.29, which leaves support next quarter.",
            ),
            _i(
                "Remove the legacy metrics exporter",
                "Backlog",
                "low",
                "",
                "infra stale",
                "Nothing reads the old exporter since the move to the new metrics stack.",
            ),
            _i(
                "Document the incident runbook",
                "Backlog",
                "none",
                "",
                "reliability",
                "One page per alert: what it means and what to do first.",
            ),
            _i(
                "Fix memory leak in the log shipper",
                "Todo",
                "medium",
                "bob",
                "bug",
                "The log shipper grows by 200 MB a day until it is restarted.",
            ),
            _i(
                "Move backups to a second region",
                "In Progress",
                "medium",
                "carol",
                "infra reliability",
                "Backups and their restore test should not live in the primary region.",
            ),
            _i(
                "Migrate CI runners to ARM",
                "Done",
                "high",
                "dave",
                "infra",
                "ARM runners are cheaper and faster for our builds.",
            ),
            _i(
                "Tune autovacuum on the primary",
                "Done",
                "medium",
                "eve",
                "performance",
                "The largest tables were vacuumed too rarely.",
            ),
            _i(
                "Replace the home-grown feature flags",
                "Cancelled",
                "low",
                "",
                "stale",
                "Superseded by the flag service the product team adopted.",
            ),
        ),
    ),
    SeedProject(
        "GS",
        "Growth and Subscriptions",
        "Acquisition, billing and retention: checkout, plans, campaigns and experiments.",
        ("blub", "alice", "bob", "carol", "dave", "eve", "frank"),
        ("bug", "blocker", "urgent", "stale", "growth", "experiment", "campaign", "billing"),
        (
            _i(
                "Fix double charge on plan upgrade",
                "Backlog",
                "high",
                "",
                "bug billing",
                "Upgrading mid-cycle charges the full price and the prorated price.",
            ),
            _i(
                "Coupon codes ignored at checkout",
                "Backlog",
                "medium",
                "eve",
                "bug campaign",
                "Campaign coupon codes are accepted but the discount is not applied.",
            ),
            _i(
                "Trial reminder email sent twice",
                "Backlog",
                "low",
                "frank",
                "bug",
                "Users on a trial get the day-12 reminder twice.",
            ),
            _i(
                "Churn survey does not save answers",
                "Todo",
                "medium",
                "",
                "bug",
                "The cancellation survey posts the answers to an endpoint that was removed.",
            ),
            _i(
                "Referral credits not applied",
                "Backlog",
                "none",
                "",
                "bug growth blocker",
                "Referral credits are granted but never applied to the next invoice.",
            ),
            _i(
                "Black Friday landing page",
                "Backlog",
                "high",
                "",
                "campaign growth",
                "Landing page with the Black Friday annual-plan offer.",
            ),
            _i(
                "Win-back email sequence",
                "Todo",
                "medium",
                "carol",
                "campaign",
                "Three emails for subscribers who cancelled in the last 90 days.",
            ),
            _i(
                "Spring promo banner A/B test",
                "In Progress",
                "high",
                "eve",
                "campaign experiment",
                "Test two banner variants for the spring promotion.",
            ),
            _i(
                "Partner newsletter swap",
                "Done",
                "low",
                "alice",
                "campaign",
                "Swap newsletter mentions with two partner publishers.",
            ),
            _i(
                "Onboarding checklist experiment",
                "Backlog",
                "medium",
                "",
                "experiment",
                "Show a five-step checklist to new subscribers and measure activation.",
            ),
            _i(
                "Annual plan discount test",
                "Todo",
                "low",
                "bob",
                "experiment billing",
                "Test 15 % against 20 % off for the annual plan.",
            ),
            _i(
                "Invite-a-teammate prompt",
                "In Progress",
                "none",
                "",
                "growth",
                "Prompt team-plan owners to invite a teammate after the first week.",
            ),
            _i(
                "Pricing page copy refresh",
                "Done",
                "medium",
                "dave",
                "growth",
                "Simplify the plan comparison table on the pricing page.",
            ),
            _i(
                "Dunning flow for failed payments",
                "Backlog",
                "urgent",
                "",
                "billing",
                "Retry failed card payments and email the subscriber before suspending.",
            ),
            _i(
                "Retire the legacy referral widget",
                "Cancelled",
                "none",
                "",
                "stale growth",
                "The new referral program replaced the widget.",
            ),
        ),
    ),
)


@dataclass(frozen=True)
class SeedCounts:
    projects: int
    members: int
    states: int
    labels: int
    work_items: int


def counts() -> SeedCounts:
    return SeedCounts(
        projects=len(PROJECTS),
        members=len(MEMBERS),
        states=len(PROJECTS) * len(STATES),
        labels=sum(len(p.labels) for p in PROJECTS),
        work_items=sum(len(p.items) for p in PROJECTS),
    )


async def load(conn: asyncpg.Connection) -> SeedCounts:
    """Create the schema's rows in one transaction; ids are assigned in a fixed order from 1."""
    async with conn.transaction():
        workspace_id = await conn.fetchval(
            "INSERT INTO workspaces (slug, name) VALUES ($1, $2) RETURNING id", *WORKSPACE
        )
        member_ids: dict[str, int] = {}
        for username, display, role in MEMBERS:
            member_ids[username] = await conn.fetchval(
                "INSERT INTO members (workspace_id, username, display_name, email, role)"
                " VALUES ($1, $2, $3, $4, $5) RETURNING id",
                workspace_id,
                username,
                display,
                f"{username}@paperstreets.example",
                role,
            )
        for project in PROJECTS:
            project_id = await conn.fetchval(
                "INSERT INTO projects (workspace_id, identifier, name, description)"
                " VALUES ($1, $2, $3, $4) RETURNING id",
                workspace_id,
                project.identifier,
                project.name,
                project.description,
            )
            await conn.executemany(
                "INSERT INTO project_members (project_id, member_id) VALUES ($1, $2)",
                [(project_id, member_ids[m]) for m in project.members],
            )
            state_ids: dict[str, int] = {}
            for position, (state, group) in enumerate(STATES):
                state_ids[state] = await conn.fetchval(
                    'INSERT INTO states (project_id, name, "group", sequence) VALUES ($1, $2, $3, $4)'
                    " RETURNING id",
                    project_id,
                    state,
                    group,
                    (position + 1) * 1000,
                )
            label_ids: dict[str, int] = {}
            for label in project.labels:
                label_ids[label] = await conn.fetchval(
                    "INSERT INTO labels (project_id, name, color) VALUES ($1, $2, $3) RETURNING id",
                    project_id,
                    label,
                    _LABEL_COLORS[label],
                )
            for number, item in enumerate(project.items, start=1):
                item_id = await conn.fetchval(
                    "INSERT INTO work_items (project_id, sequence_id, name, description, priority, state_id)"
                    " VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
                    project_id,
                    number,
                    item.name,
                    item.description,
                    item.priority,
                    state_ids[item.state],
                )
                await conn.executemany(
                    "INSERT INTO work_item_assignees (work_item_id, member_id) VALUES ($1, $2)",
                    [(item_id, member_ids[m]) for m in item.assignees],
                )
                await conn.executemany(
                    "INSERT INTO work_item_labels (work_item_id, label_id) VALUES ($1, $2)",
                    [(item_id, label_ids[lab]) for lab in item.labels],
                )
    return counts()
