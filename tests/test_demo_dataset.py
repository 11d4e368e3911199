"""The bundled offline dataset: every row runs end to end with `demo` and `rules`."""

from __future__ import annotations

import pytest

from rubric_core.datasets import parse_dataset
from rubric_core.offline.demo import demo_answer
from rubric_core.offline.demo_dataset import DEMO_ROWS, demo_dataset, demo_row_for
from rubric_core.runner import RunSpec, run_rubric


def test_the_dataset_is_big_and_mixed_enough() -> None:
    ds = demo_dataset()
    assert len(ds.rows) >= 20 and len({r.id for r in ds.rows}) == len(ds.rows)
    kinds = {r.variables["kind"] for r in ds.rows}
    assert kinds == {"haiku", "summary", "short answer", "json"}
    # It survives the same checks an uploaded file gets.
    assert parse_dataset(ds.to_jsonl(), fmt="jsonl").rows == ds.rows


@pytest.mark.parametrize("row", DEMO_ROWS, ids=[r.id for r in DEMO_ROWS])
def test_each_row_fails_first_then_is_fixed_from_feedback(row: object) -> None:
    assert demo_row_for(row.prompt) is row  # type: ignore[attr-defined]
    spec = RunSpec(prompt=row.prompt, rubric=row.rubric,  # type: ignore[attr-defined]
                   worker="demo", grader="rules", max_iterations=3)
    [final] = [e for e in run_rubric(spec) if e["type"] == "run_finished"]
    first, *rest = final["evaluations"]
    assert [c for c in first["criteria"] if not c["passed"]], "the first draft must fail"
    assert rest and final["status"] == "satisfied", final["evaluations"][-1]["explanation"]


def test_an_unknown_prompt_still_gets_the_demo_notice() -> None:
    from langchain_core.messages import HumanMessage

    assert "offline demo model" in demo_answer([HumanMessage("Write a sonnet about cheese.")])
