"""People's labels joined with grader verdicts, and agreement (checked by hand)."""

from __future__ import annotations

from typing import Any

import pytest

from rubric_core.labels import (
    OVERALL,
    agreement_table,
    disagreements,
    labelled_verdicts,
    person_verdict,
)


def _label(seq: int, criterion: str, agree: bool, correct: bool | None = None) -> Any:
    return {"run_id": "r", "seq": seq, "criterion": criterion, "labeller": "ana",
            "agree": agree, "correct": correct, "note": "", "created_at": "",
            "updated_at": ""}


@pytest.mark.parametrize(("agree", "correct", "grader", "person"), [
    pytest.param(True, None, True, True, id="agree_takes_the_graders_pass"),
    pytest.param(True, None, False, False, id="agree_takes_the_graders_fail"),
    pytest.param(False, None, True, False, id="disagree_flips_without_a_correct_verdict"),
    pytest.param(False, True, False, True, id="disagree_takes_the_correct_verdict"),
])
def test_person_verdict(agree: bool, correct: bool | None, grader: bool, person: bool) -> None:
    assert person_verdict({"agree": agree, "correct": correct}, grader) is person


def test_agreement_per_criterion_and_overall_by_hand() -> None:
    evs = [{"iteration": 0, "criteria": [{"name": "A", "passed": True},
                                         {"name": "B", "passed": False}]},
           {"iteration": 1, "criteria": [{"name": "A", "passed": True},
                                         {"name": "B", "passed": True}]}]
    labels = [_label(0, "A", True), _label(0, "B", False), _label(1, "A", False),
              _label(1, "B", True), _label(5, "A", True), _label(0, "missing", True)]
    verdicts = labelled_verdicts(labels, {"r": evs})
    assert len(verdicts) == 4  # unknown evaluation and criterion are skipped
    table = agreement_table(verdicts).set_index("criterion")
    # A: grader (T, T), person (T, F): 50 %; κ undefined? pe = 1*0.5 + 0*0.5 = 0.5 → κ 0.
    assert table.loc["A", "n"] == 2 and table.loc["A", "percent_agreement"] == 50.0
    assert table.loc["A", "kappa"] == 0.0
    # B: grader (F, T), person (T, T): 50 %; pe = 0.5*1 + 0.5*0 = 0.5 → κ 0.
    # Overall: grader TFTT, person TTFT: po 0.5, pe = .75*.75 + .25*.25 = .625 → κ −1/3.
    assert table.loc[OVERALL, "n"] == 4 and table.loc[OVERALL, "percent_agreement"] == 50.0
    assert table.loc[OVERALL, "kappa"] == pytest.approx(-1 / 3, abs=1e-4)
    assert [(v.seq, v.criterion) for v in disagreements(verdicts)] == [(0, "B"), (1, "A")]


def test_agreement_without_labels_has_an_empty_overall_row() -> None:
    table = agreement_table([])
    assert list(table["criterion"]) == [OVERALL] and table["n"].iloc[0] == 0
