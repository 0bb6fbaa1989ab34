"""Comparators, config files and the id mapping through foreign keys."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from scoring import (
    ColumnMeta,
    ForeignKey,
    Metadata,
    ScoringError,
    TableMeta,
    Write,
    load_config,
    score_writes,
)
from scoring.compare import FieldContext, register_comparator

T = "public.items"
META = Metadata(
    {
        T: TableMeta(
            T,
            (
                ColumnMeta("id", "bigint", "numeric"),
                ColumnMeta("title", "text", "text"),
                ColumnMeta("price", "numeric", "numeric"),
                ColumnMeta("attrs", "jsonb", "json"),
                ColumnMeta("tags", "text[]", "array"),
                ColumnMeta("kind", "item_kind", "enum"),
                ColumnMeta("seen_at", "timestamptz", "timestamp"),
            ),
            ("id",),
        )
    }
)
BASE = {
    "id": 1,
    "title": "Blue kettle",
    "price": 10,
    "attrs": {"a": [1, 2]},
    "tags": ["x", "y"],
    "kind": "tool",
    "seen_at": "2026-01-01T00:00:00Z",
}


def pair(**agent_changes: object) -> tuple[list[Write], list[Write]]:
    gt = [Write(T, {"id": 1}, BASE, "g", 1, created=False)]
    agent = [Write(T, {"id": 1}, {**BASE, **agent_changes}, "a", 1, created=False)]
    return gt, agent


def fields(result: object) -> dict[str, float]:
    (row,) = result.rows  # type: ignore[attr-defined]
    return {d.column: d.similarity for d in row.diffs}


def test_default_comparators_per_type() -> None:
    r = score_writes(
        *pair(
            title="Blue kettles",
            price=10.0,
            attrs={"a": [1, 2]},
            tags=["y", "x", "z"],
            seen_at="2027-05-05T00:00:00Z",
        ),
        META,
    )
    diffs = fields(r)
    # timestamp ignored, numeric 10 == 10.0, json deep-equal, array as multiset (Jaccard 2/3), text ratio
    assert set(diffs) == {"title", "tags"}
    assert diffs["tags"] == pytest.approx(2 / 3)
    assert diffs["title"] == pytest.approx(2 * 11 / 23)
    assert score_writes(*pair(attrs={"a": [2, 1]}), META).content_score < 1.0
    # five compared fields (id is a generated key, seen_at a timestamp): one enum differs
    assert score_writes(*pair(kind="toy"), META).content_score == pytest.approx(4 / 5)


def test_options_tolerance_timestamps_ignored_columns() -> None:
    gt, agent = pair(price=10.4, seen_at="2027-05-05T00:00:00Z")
    assert score_writes(gt, agent, META).content_score < 1.0
    assert "price" not in fields(
        score_writes(gt, agent, META, numeric_tolerance=0.5, compare_timestamps=False)
    )
    assert "seen_at" in fields(score_writes(gt, agent, META, compare_timestamps=True))
    assert score_writes(gt, agent, META, ignore_columns=["price"]).content_score == 1.0
    assert score_writes(gt, agent, META, ignore_tables=["items"]).counts.matched == 0


def test_toml_config(tmp_path: Path) -> None:
    path = tmp_path / "score.toml"
    path.write_text(
        """
min_similarity = 0.7
ignore_columns = ["items.kind"]
[types]
text = "text_casefold"
[tables."public.items".columns]
price = { comparator = "numeric", tolerance = 1 }
"""
    )
    cfg = load_config(path)
    assert cfg.min_similarity == 0.7
    r = score_writes(*pair(title="  BLUE KETTLE ", price=10.9, kind="toy"), META, config=cfg)
    assert r.content_score == 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):  # parsed once, never changed
        cfg.min_similarity = 0.1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[tables.items.columns]\ntitle = "nope"', "unknown comparator 'nope' for items.title"),
        ('[types]\ntext = "nope"', "unknown comparator 'nope' for type text"),
        ('[types]\nstring = "text"', "unknown value type 'string'"),
        ("min_similarity = 2", "min_similarity must be within"),
        ("min_similarity = true", "wrong type"),
        ("colapse = true", "unknown setting(s) colapse"),
        ('[tables.items]\nrow = "no.such.module:fn"', "table items: cannot import no.such.module:fn"),
        ('[scores]\nmine = "no_colon"', "score mine: a function is written module:function"),
        ('[tables.items.columns]\nprice = { comparator = "numeric", tol = 1 }', "bad parameters"),
        ("min_similarity = ", "not valid TOML"),
    ],
)
def test_config_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ScoringError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(path)
    with pytest.raises(ScoringError, match="cannot read config"):
        load_config(tmp_path / "missing.toml")


def test_row_function_and_custom_comparator(tmp_path: Path) -> None:
    path = tmp_path / "score.toml"
    path.write_text('[tables.items]\nrow = "tests.scoring.rowfns:same_title_words"\n')
    r = score_writes(*pair(title="kettle blue", price=99), META, config=path)
    assert r.content_score == 1.0  # the row function looks at title words only

    def first_letter(gt: object, agent: object, ctx: FieldContext) -> float:
        assert ctx.column.name == "title" and ctx.table.name == T
        return 1.0 if str(gt)[:1] == str(agent)[:1] else 0.0

    register_comparator("first_letter", lambda: first_letter)
    r = score_writes(
        *pair(title="Bronze kettle"), META, column_comparators={("items", "title"): "first_letter"}
    )
    assert r.content_score == 1.0


PARENTS, LINKS = "s.labels", "s.item_labels"
FK_META = Metadata(
    {
        PARENTS: TableMeta(
            PARENTS, (ColumnMeta("id", "uuid", "uuid"), ColumnMeta("name", "text", "text")), ("id",)
        ),
        LINKS: TableMeta(
            LINKS,
            (ColumnMeta("item_id", "bigint", "numeric"), ColumnMeta("label_id", "uuid", "uuid")),
            ("item_id", "label_id"),
            (ForeignKey(("label_id",), PARENTS, ("id",)),),
        ),
    }
)


def test_children_align_once_parents_do() -> None:
    """Label ids are generated on each side; links (a key of foreign keys) pair through the mapping."""
    gt = [
        Write(PARENTS, {"id": "g-1"}, {"id": "g-1", "name": "q3-target"}, "g1", 1, created=True),
        Write(PARENTS, {"id": "g-2"}, {"id": "g-2", "name": "infra-sprint"}, "g1", 2, created=True),
        Write(
            LINKS, {"item_id": 7, "label_id": "g-1"}, {"item_id": 7, "label_id": "g-1"}, "g2", 3, created=True
        ),
        Write(
            LINKS, {"item_id": 8, "label_id": "g-2"}, {"item_id": 8, "label_id": "g-2"}, "g3", 4, created=True
        ),
    ]
    agent = [
        Write(PARENTS, {"id": "a-9"}, {"id": "a-9", "name": "infra-sprint"}, "a1", 1, created=True),
        Write(PARENTS, {"id": "a-8"}, {"id": "a-8", "name": "q3-target"}, "a2", 2, created=True),
        Write(
            LINKS, {"item_id": 7, "label_id": "a-8"}, {"item_id": 7, "label_id": "a-8"}, "a3", 3, created=True
        ),
        Write(
            LINKS, {"item_id": 8, "label_id": "a-8"}, {"item_id": 8, "label_id": "a-8"}, "a4", 4, created=True
        ),
    ]
    r = score_writes(gt, agent, FK_META)
    # labels pair by name; link (7, a-8) is (7, g-1) after mapping; (8, a-8) is not (8, g-2)
    assert (r.counts.matched, r.counts.missing, r.counts.extra) == (3, 1, 1)
    how = {(x.table, x.status, x.how) for x in r.rows}
    assert (LINKS, "matched", "key") in how and (PARENTS, "matched", "similarity") in how
    # The link op depends on the op that created its label: a2 (label a-8) comes before a3 and a4.
    order = [o.operation_id for o in r.operations]
    assert order.index("a2") < order.index("a3") and order.index("a2") < order.index("a4")
    assert sum(o.struct_utility for o in r.operations) == pytest.approx(r.struct_score)


def test_topological_order_overrides_interleaving() -> None:
    """An operation whose first write comes earlier but that references a row another operation created
    is scored after it."""
    gt = [Write(PARENTS, {"id": "g-1"}, {"id": "g-1", "name": "x"}, "g", 1, created=True)]
    agent = [
        Write(PARENTS, {"id": "p"}, {"id": "p", "name": "other"}, "late", 1, created=True),
        Write(PARENTS, {"id": "q"}, {"id": "q", "name": "x"}, "early", 2, created=True),
        Write(
            LINKS, {"item_id": 1, "label_id": "q"}, {"item_id": 1, "label_id": "q"}, "late", 3, created=True
        ),
    ]
    r = score_writes(gt, agent, FK_META)
    assert [o.operation_id for o in r.operations] == ["early", "late"]


def test_named_score_from_config(tmp_path: Path) -> None:
    path = tmp_path / "score.toml"
    path.write_text('[scores]\nstrict = "tests.scoring.rowfns:strict_score"\n')
    gt, agent = pair()
    assert score_writes(gt, agent, META, config=path).scores["strict"] == 1.0
    gt, agent = pair(title="Red kettle")
    r = score_writes(gt, agent, META, config=path)
    assert r.scores["strict"] == 0.0 and r.scores["overall"] < 1.0
    assert "strict" not in score_writes(gt, agent, META).scores
