"""Labelling a stored answer set: a verdict is recorded in that version (and changed, and
removed by a skip), a re-grade of it judges against it at once, and what is typed is checked
and scrubbed as Review's labels are."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from rubric_core.lab import (
    BUNDLED_NAME,
    BUNDLED_RUBRIC,
    GraderConfig,
    bundled_answer_set,
    create_regrade,
    criterion_health,
    label_answer,
    run_regrade,
)
from rubric_core.redact import register_secret
from rubric_core.types import LABELLER_CHAR_LIMIT

if TYPE_CHECKING:
    from rubric_core.store import Store

SUNLIGHT = "The answer mentions sunlight"


@pytest.fixture
def stored(store: Store) -> Store:
    store.save_answer_set(bundled_answer_set())
    return store


def _mine(store: Store, who: str = "Cy") -> dict[tuple[str, str], bool]:
    return {(lb.item_id, lb.criterion): lb.passed
            for lb in store.answer_labels(BUNDLED_NAME, 1) if lb.labeller == who}


def test_a_verdict_is_recorded_changed_and_removed_in_place(stored: Store) -> None:
    before = stored.answer_set_info(BUNDLED_NAME).label_count
    label_answer(stored, BUNDLED_NAME, 1, "a01", SUNLIGHT, "Cy", True)
    label_answer(stored, BUNDLED_NAME, 1, "a01", SUNLIGHT, "Cy", False, note="says sun")
    assert _mine(stored) == {("a01", SUNLIGHT): False}  # changed, not added twice
    info = stored.answer_set_info(BUNDLED_NAME)
    assert (info.version, info.label_count) == (1, before + 1)  # the same version, counted
    label_answer(stored, BUNDLED_NAME, 1, "a01", SUNLIGHT, "Cy", None)  # skip: no verdict
    assert _mine(stored) == {}
    assert stored.answer_set_info(BUNDLED_NAME).label_count == before
    # importing the same set again keeps the version (and whatever was labelled in it)
    label_answer(stored, BUNDLED_NAME, 1, "a02", SUNLIGHT, "Cy", True)
    assert stored.save_answer_set(bundled_answer_set()) == 1
    assert _mine(stored) == {("a02", SUNLIGHT): True}


def test_a_regrade_of_the_set_judges_against_a_new_verdict_at_once(stored: Store) -> None:
    job = create_regrade(stored, BUNDLED_NAME, [GraderConfig(rubric=BUNDLED_RUBRIC)])
    list(run_regrade(stored, job.job_id))
    n = {h.criterion: h.people_n for h in criterion_health(stored, job.job_id).criteria}
    label_answer(stored, BUNDLED_NAME, 1, "a03", SUNLIGHT, "Cy", True)
    after = {h.criterion: h.people_n for h in criterion_health(stored, job.job_id).criteria}
    assert after[SUNLIGHT] == n[SUNLIGHT] + 1
    assert after["The answer is one sentence"] == n["The answer is one sentence"]


@pytest.mark.parametrize(("labeller", "criterion", "problem"), [
    pytest.param("", SUNLIGHT, "needs the labeller's name", id="no_name"),
    pytest.param("x" * (LABELLER_CHAR_LIMIT + 1), SUNLIGHT, "at most 100", id="long_name"),
    pytest.param("Cy\nDee", SUNLIGHT, "on one line", id="two_line_name"),
    pytest.param("Cy", "", "one line", id="no_criterion"),
    pytest.param("Cy", "a\nb", "one line", id="two_line_criterion"),
])
def test_bad_text_is_refused_and_nothing_is_stored(stored: Store, labeller: str,
                                                    criterion: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        label_answer(stored, BUNDLED_NAME, 1, "a01", criterion, labeller, True)
    assert not [lb for lb in stored.answer_labels(BUNDLED_NAME, 1)
                if lb.labeller not in ("Ana", "Ben")]


def test_an_unknown_answer_is_refused(stored: Store) -> None:
    with pytest.raises(KeyError, match="no answer 'zz'"):
        label_answer(stored, BUNDLED_NAME, 1, "zz", SUNLIGHT, "Cy", True)


def test_a_key_typed_as_a_name_or_note_is_stored_scrubbed(stored: Store) -> None:
    secret = "lab-labelling-secret-" + "Q" * 24
    register_secret(secret)
    label = label_answer(stored, BUNDLED_NAME, 1, "a01", SUNLIGHT, f"Cy {secret}", True,
                         note=f"see {secret}")
    assert label is not None and secret not in label.labeller
    stored_labels = stored.answer_labels(BUNDLED_NAME, 1)
    assert all(secret not in f"{lb.labeller} {lb.note}" for lb in stored_labels)
    assert any(lb.labeller.startswith("Cy ") for lb in stored_labels)
