"""The labelled final answer: last attempt, and the best one when it differs."""

from __future__ import annotations

from typing import Any

from rubric_core.attempts import final_answers
from rubric_core.offline.demo import demo_knows
from rubric_core.offline.demo_dataset import demo_dataset


def _ev(i: int, answer: str, verdicts: list[bool], run: str = "g") -> Any:
    return {"grading_run_id": run, "iteration": i, "answer": answer,
            "criteria": [{"name": f"c{j}", "passed": v} for j, v in enumerate(verdicts)]}


def test_one_answer_when_the_last_is_the_best() -> None:
    [shown] = final_answers([_ev(0, "a", [False, True]), _ev(1, "b", [True, True])])
    assert (shown.label, shown.text, shown.passed, shown.total) == ("Final answer", "b", 2, 2)


def test_best_attempt_labelled_when_it_is_not_the_last() -> None:
    evs = [_ev(0, "a", [False, False]), _ev(1, "b", [True, False]), _ev(2, "c", [False, True]),
           _ev(3, "d", [False, False])]
    last, best = final_answers(evs)
    assert (last.label, last.text) == ("last attempt (pass 4 of 4)", "d")
    # b and c tie on criteria passed: the later pass wins, as in the middleware.
    assert (best.label, best.text, best.passed) == ("best attempt (pass 3 of 4)", "c", 1)


def test_only_the_last_grading_run_counts() -> None:
    evs = [_ev(0, "old", [True, True], run="g1"), _ev(0, "new", [False, True], run="g2")]
    [shown] = final_answers(evs)
    assert shown.text == "new" and final_answers([]) == []


def test_demo_knows_examples_and_dataset_rows_only() -> None:
    assert demo_knows("Write a haiku about spring.")
    row = demo_dataset().rows[0]
    assert demo_knows(row.prompt)
    assert not demo_knows("Write a limerick about a tax auditor.")
