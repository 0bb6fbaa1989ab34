"""A hand-written catalog (as CATALOG_QUERY would return it) for the tests that need no database."""

from __future__ import annotations

import json
from collections.abc import Sequence

from proxy.sql import Catalog

# table: (pk, [(column, type, generated)], [(unique name, columns, nulls_not_distinct)], [(referencing
# schema, table, fk name, on_delete)])
SAMPLE: dict[
    tuple[str, str],
    tuple[
        list[str],
        list[tuple[str, str, bool]],
        list[tuple[str, list[str], bool]],
        list[tuple[str, str, str, str]],
    ],
] = {
    ("public", "projects"): (
        ["id"],
        [("id", "integer", False), ("name", "text", False), ("budget", "numeric", False)],
        [("projects_pkey", ["id"], False), ("projects_name_key", ["name"], False)],
        [
            ("public", "issues", "issues_project_id_fkey", "c"),
            ("public", "members", "members_project_id_fkey", "r"),
        ],
    ),
    ("public", "issues"): (
        ["id"],
        [
            ("id", "integer", False),
            ("project_id", "integer", False),
            ("title", "character varying", False),
            ("points", "integer", False),
            ("slug", "text", True),
        ],
        [("issues_pkey", ["id"], False), ("issues_project_id_title_key", ["project_id", "title"], False)],
        [("public", "comments", "comments_issue_id_fkey", "c")],
    ),
    ("public", "comments"): (
        ["id"],
        [("id", "integer", False), ("issue_id", "integer", False), ("body", "text", False)],
        [("comments_pkey", ["id"], False)],
        [],
    ),
    ("public", "members"): (
        ["id"],
        [("id", "integer", False), ("project_id", "integer", False), ("email", "text", False)],
        [("members_pkey", ["id"], False), ("members_email_key", ["email"], True)],
        [],
    ),
    ("public", "labels"): (  # a composite primary key; point has no equality operator
        ["project_id", "name"],
        [
            ("project_id", "integer", False),
            ("name", "text", False),
            ("color", "text", False),
            ("pos", "point", False),
        ],
        [("labels_pkey", ["project_id", "name"], False)],
        [],
    ),
    ("app", "events"): (
        ["id"],
        [("id", "bigint", False), ("payload", "jsonb", False)],
        [("events_pkey", ["id"], False)],
        [],
    ),
}


DEFAULTS = {
    ("projects", "budget"): "0",
    ("issues", "id"): "nextval('issues_id_seq'::regclass)",
    ("issues", "points"): "1",
}


# (table, column): GENERATED ALWAYS AS IDENTITY
IDENTITY_ALWAYS = {("events", "id")}
# Leading columns of non-unique indexes (the unique ones' come from SAMPLE).
INDEXED = {"comments": {"issue_id"}}
# Tables with row security enabled.
ROW_SECURITY = {"members"}


def rows(spec: dict = SAMPLE) -> Sequence[Sequence[str | None]]:  # type: ignore[type-arg]
    out = []
    for number, ((schema, name), (pk, columns, unique, refs)) in enumerate(spec.items(), 1):
        doc = {
            "pk": pk,
            "key": pk,
            "changes": f"t{number}",
            "row_security": name in ROW_SECURITY,
            "columns": [
                {
                    "name": c,
                    "type": t,
                    "generated": g,
                    "identity": (name, c) in IDENTITY_ALWAYS,
                    "identity_always": (name, c) in IDENTITY_ALWAYS,
                    "default": DEFAULTS.get((name, c)),
                }
                for c, t, g in columns
            ],
            "unique": [
                {
                    "name": n,
                    "columns": cols,
                    "constraint": True,
                    "nulls_not_distinct": nnd,
                    "partial": False,
                    "expressions": False,
                }
                for n, cols, nnd in unique
            ],
            "referenced_by": [{"schema": s, "table": t, "name": n, "on_delete": d} for s, t, n, d in refs],
            "indexed": sorted({cols[0] for _, cols, _ in unique} | INDEXED.get(name, set())),
        }
        out.append((schema, name, f"cow_{schema}", json.dumps(doc)))
    return out


def sample_catalog() -> Catalog:
    return Catalog.from_rows(rows())
