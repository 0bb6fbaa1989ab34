"""The scorer in memory: the paper's worked example, pairing rules, comparators, explanations."""

from __future__ import annotations

import pytest

from scoring import ScoringError, Write, score_writes
from tests.scoring import figure3 as f3


def check_figure3(result: object) -> None:
    from scoring import ScoringResult

    assert isinstance(result, ScoringResult)
    exp = f3.EXPECTED
    assert result.struct_score == pytest.approx(exp["struct_score"])
    assert result.content_score == pytest.approx(exp["content_score"])
    assert result.precision == pytest.approx(exp["precision"])
    assert result.recall == pytest.approx(exp["recall"])
    assert result.f1 == pytest.approx(exp["f1"])
    assert round(result.f1, 3) == 0.667
    assert result.overall == pytest.approx(exp["overall"])
    assert result.efficiency == pytest.approx(exp["efficiency"])
    assert result.scores["agent_cow_weighted"] == pytest.approx(exp["agent_cow_weighted"])
    assert result.scores["overall"] == pytest.approx(exp["overall"])
    assert [o.operation_id for o in result.operations] == list(exp["u_struct"])
    for op in result.operations:
        assert op.struct_utility == pytest.approx(exp["u_struct"][op.operation_id]), op
    assert sum(o.struct_utility for o in result.operations) == pytest.approx(result.struct_score)
    c = result.counts
    assert (c.matched, c.missing, c.extra, c.gt_ops, c.agent_ops) == (3, 1, 2, 4, 5)


@pytest.mark.parametrize("with_created", [True, False], ids=["created-known", "created-unknown"])
def test_figure3_in_memory(with_created: bool) -> None:
    result = score_writes(
        f3.writes(f3.GT_ROWS, with_created), f3.writes(f3.AGENT_ROWS, with_created), f3.METADATA
    )
    check_figure3(result)
    contents = {o.operation_id: o.content_utility for o in result.operations}
    assert contents == {"op01": 1.0, "op02": 1.0, "op03": 1.0, "op04": 0.0, "op05": 0.0}
    statuses = {(r.table, r.status, (r.gt_pk or r.agent_pk or {}).get("id")) for r in result.rows}
    assert statuses == {
        (f3.TICKETS, "matched", "T-103"),
        (f3.TICKETS, "matched", "T-106"),
        (f3.COMMENTS, "matched", "C-201"),
        (f3.TICKETS, "missing", "T-108"),
        (f3.TICKETS, "extra", "T-107"),
        (f3.COMMENTS, "extra", "C-202"),
    }
    missing = next(r for r in result.rows if r.status == "missing")
    assert "similarity" in missing.reason and "min_similarity" in missing.reason


def test_figure3_json_shape() -> None:
    data = score_writes(f3.writes(f3.GT_ROWS), f3.writes(f3.AGENT_ROWS), f3.METADATA).to_json()
    for key in ("struct_score", "content_score", "overall", "efficiency", "precision", "recall", "f1"):
        assert isinstance(data[key], float)
    assert set(data["counts"]) >= {"matched", "missing", "extra", "gt_ops", "agent_ops"}
    assert [o["operation_id"] for o in data["operations"]] == ["op01", "op02", "op03", "op04", "op05"]
    assert set(data["operations"][0]) >= {"operation_id", "struct_utility", "content_utility"}
    assert set(data["scores"]) >= {"overall", "precision", "recall", "f1", "agent_cow_weighted"}


def test_wrong_row_is_missing_plus_extra() -> None:
    gt = [Write("t", {"id": 1}, {"id": 1, "name": "alpha", "state": "done"}, "g1", 1, created=False)]
    agent = [Write("t", {"id": 2}, {"id": 2, "name": "beta", "state": "cancelled"}, "a1", 1, created=False)]
    result = score_writes(gt, agent)
    assert (result.counts.matched, result.counts.missing, result.counts.extra) == (0, 1, 1)
    assert result.struct_score == 0.0
    # Same with nothing known about which rows existed before: the similarity floor keeps them apart.
    gt = [Write("t", {"id": 1}, {"id": 1, "name": "alpha", "state": "done"}, "g1", 1)]
    agent = [Write("t", {"id": 2}, {"id": 2, "name": "beta", "state": "cancelled"}, "a1", 1)]
    result = score_writes(gt, agent)
    assert (result.counts.matched, result.counts.missing, result.counts.extra) == (0, 1, 1)
    # min_similarity 0 reproduces agent-cow's behaviour (any pair goes), to show the floor is what matters.
    result = score_writes(gt, agent, min_similarity=0.0)
    assert result.counts.matched == 1


def test_existing_row_edited_elsewhere_never_pairs_even_if_similar() -> None:
    gt = [Write("t", {"id": 1}, {"id": 1, "name": "alpha", "state": "done"}, "g1", 1, created=False)]
    agent = [Write("t", {"id": 2}, {"id": 2, "name": "alpha", "state": "done"}, "a1", 1, created=False)]
    result = score_writes(gt, agent)
    assert result.counts.matched == 0
    extra = next(r for r in result.rows if r.status == "extra")
    assert "did not change this existing row" in extra.reason


def test_same_row_wrong_values_is_a_match_with_lower_content() -> None:
    gt = [Write("t", {"id": 1}, {"id": 1, "name": "alpha", "state": "done"}, "g1", 1, created=False)]
    agent = [Write("t", {"id": 1}, {"id": 1, "name": "alpha", "state": "todo"}, "a1", 1, created=False)]
    result = score_writes(gt, agent)
    assert result.counts.matched == 1
    # name equal (1.0), state by SequenceMatcher: "done" vs "todo" share "do" -> 2*2/8 = 0.5
    assert result.content_score == pytest.approx(0.75)
    (row,) = result.rows
    assert [d.column for d in row.diffs] == ["state"]
    assert (row.diffs[0].gt, row.diffs[0].agent) == ("done", "todo")


def test_unknown_comparator_is_a_clear_error() -> None:
    with pytest.raises(ScoringError, match="unknown comparator 'fuzzy'"):
        score_writes([], [], column_comparators={("t", "name"): "fuzzy"})


def test_collapse_and_wasted_operations() -> None:
    gt = [Write("t", {"id": 1}, {"id": 1, "name": "keep"}, "g1", 1, created=False)]
    agent = [
        Write("t", {"id": 1}, {"id": 1, "name": "first try"}, "a1", 1, created=False),
        Write("t", {"id": 9}, {"id": 9, "name": "scratch"}, "a2", 2, created=True),
        Write("t", {"id": 9}, None, "a3", 3, deleted=True, created=True),
        Write("t", {"id": 1}, {"id": 1, "name": "keep"}, "a4", 4, created=False),
    ]
    plain = score_writes(gt, agent)
    # a1 was overwritten by a4; a2's row and a3's deletion cancel out: three of four operations wasted.
    assert plain.counts.wasted_ops == 3
    assert plain.efficiency == pytest.approx(min(1, 1 / 4) * (1 - 3 / 4))
    assert (plain.counts.matched, plain.counts.extra) == (1, 1)  # the deleted scratch row is extra
    collapsed = score_writes(gt, agent, collapse=True)
    assert (collapsed.counts.matched, collapsed.counts.extra, collapsed.struct_score) == (1, 0, 1.0)
    assert sum(o.struct_utility for o in collapsed.operations) == pytest.approx(1.0)


def test_deleting_a_row_the_ground_truth_updated_is_missing_plus_extra() -> None:
    gt = [Write("t", {"id": 1}, {"id": 1, "name": "renamed"}, "g1", 1, created=False)]
    agent = [
        Write("t", {"id": 1}, {"id": 1, "name": "renamed"}, "a1", 1, created=False),
        Write("t", {"id": 1}, None, "a2", 2, deleted=True, created=False),
    ]
    r = score_writes(gt, agent)
    assert (r.counts.matched, r.counts.missing, r.counts.extra) == (0, 1, 1)
    # a1 made the match (+1), a2's deletion undid it (-1): per-operation scoring sees both.
    assert [o.struct_utility for o in r.operations] == pytest.approx([1.0, -1.0])
    assert "deleted this row" in next(x.reason for x in r.rows if x.status == "missing")


def test_large_table_path_agrees_on_figure3() -> None:
    """With a tiny dense-matrix budget the identical-rows-first and blocked path runs; same result."""
    result = score_writes(f3.writes(f3.GT_ROWS), f3.writes(f3.AGENT_ROWS), f3.METADATA, max_dense_cells=1)
    check_figure3(result)


def test_coinciding_generated_keys_are_not_the_same_row() -> None:
    from scoring import ColumnMeta, Metadata, TableMeta

    meta = Metadata(
        {
            "t": TableMeta(
                "t",
                (ColumnMeta("id", "integer", "numeric", generated=True), ColumnMeta("name", "text", "text")),
                ("id",),
            )
        }
    )
    gt = [Write("t", {"id": 5}, {"id": 5, "name": "Refund approved"}, "g", 1, created=True)]
    other = [Write("t", {"id": 5}, {"id": 5, "name": "Newsletter draft"}, "a", 1, created=True)]
    same = [Write("t", {"id": 5}, {"id": 5, "name": "Refund approved"}, "a", 1, created=True)]
    assert score_writes(gt, other, meta).counts.matched == 0
    assert score_writes(gt, same, meta).counts.matched == 1
    # Without the generated flag (a natural key), equal keys are the same row, matched whatever the values.
    assert score_writes(gt, other).counts.matched == 1
