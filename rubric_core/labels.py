"""People's labels of the grader's verdicts, and how often the grader agrees with them.

A person labels one criterion verdict of one evaluation (`rubric_core.store.Store.set_label`):
*agree* or *disagree*, optionally the correct verdict and a note. The person's verdict is the
grader's when they agree; when they disagree it is the correct verdict they gave, else the
opposite of the grader's (verdicts are pass/fail). Agreement is then percent agreement and
Cohen's κ (`rubric_core.analytics.cohen_kappa`) over (grader, person) pairs, per criterion
(matched across runs by `rubric_core.rubric.normalize_name`) and overall, with n.

What a person types is bounded before it is stored (`check_label_text`): a note goes into
every Align grader prompt and every labels export, and a name keys every label.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import pandas as pd

from rubric_core.analytics import cohen_kappa
from rubric_core.rubric import normalize_name
from rubric_core.store import check_label_text as check_label_text  # re-exported
from rubric_core.types import LABEL_NOTE_CHAR_LIMIT as LABEL_NOTE_CHAR_LIMIT  # re-exported
from rubric_core.types import LABELLER_CHAR_LIMIT as LABELLER_CHAR_LIMIT  # re-exported

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from rubric_core.types import CriterionLabel

OVERALL = "(all criteria)"
"""The ``criterion`` of the overall row of `agreement_table`."""

AGREEMENT_COLUMNS: tuple[str, ...] = ("criterion", "n", "percent_agreement", "kappa")
"""Columns of `agreement_table`, in order."""



@dataclasses.dataclass(frozen=True)
class LabelledVerdict:
    """One labelled criterion verdict: what the grader said and what the person says."""

    run_id: str
    """The run."""
    seq: int
    """0-based position of the evaluation in the run."""
    iteration: int
    """The evaluation's 0-based pass index within its grading run."""
    criterion: str
    """The criterion's name as the evaluation records it."""
    labeller: str
    """Who labelled it."""
    grader: bool
    """The grader's verdict (True: pass)."""
    person: bool
    """The person's verdict (see the module docstring)."""
    note: str
    """The person's note."""


def person_verdict(label: Mapping[str, Any], grader_passed: bool) -> bool:
    """The person's pass/fail verdict from a label and the grader's verdict."""
    if label["agree"]:
        return bool(grader_passed)
    correct = label.get("correct")
    return (not grader_passed) if correct is None else bool(correct)


def labelled_verdicts(
    labels: Iterable[CriterionLabel],
    evaluations: Mapping[str, Sequence[Mapping[str, Any]]],
) -> list[LabelledVerdict]:
    """Labels joined with the grader verdicts they label.

    Args:
        labels: Labels (`Store.labels`).
        evaluations: Each labelled run's evaluations in record order (`Store.evaluations`).

    Returns:
        One entry per label whose evaluation and criterion exist, in the labels' order.

    """
    out: list[LabelledVerdict] = []
    for label in labels:
        evs = evaluations.get(label["run_id"]) or []
        if not 0 <= label["seq"] < len(evs):
            continue
        ev = evs[label["seq"]]
        graded = next((c for c in ev.get("criteria") or []
                       if c.get("name") == label["criterion"]), None)
        if graded is None:
            continue
        grader = bool(graded.get("passed"))
        out.append(LabelledVerdict(
            run_id=label["run_id"], seq=label["seq"], iteration=int(ev.get("iteration") or 0),
            criterion=label["criterion"], labeller=label["labeller"], grader=grader,
            person=person_verdict(label, grader), note=label.get("note") or "",
        ))
    return out


def agreement_table(verdicts: Iterable[LabelledVerdict]) -> pd.DataFrame:
    """Grader vs people per criterion and overall (the last row, `OVERALL`).

    Returns:
        A DataFrame with :data:`AGREEMENT_COLUMNS`: pairs compared, percent agreement (0-100)
        and Cohen's κ (empty when undefined: one verdict throughout). Criteria are in order of
        first appearance, named as first written.

    """
    items = list(verdicts)
    groups: dict[str, tuple[str, list[tuple[bool, bool]]]] = {}
    for v in items:
        name, pairs = groups.setdefault(normalize_name(v.criterion), (v.criterion, []))
        pairs.append((v.grader, v.person))
    rows = []
    for name, pairs in [*groups.values(), (OVERALL, [(v.grader, v.person) for v in items])]:
        agreement = cohen_kappa(pairs)
        rows.append((name, agreement.n, agreement.percent, agreement.kappa))
    return pd.DataFrame.from_records(rows, columns=list(AGREEMENT_COLUMNS))


def disagreements(verdicts: Iterable[LabelledVerdict]) -> list[LabelledVerdict]:
    """The labelled verdicts where the person and the grader differ."""
    return [v for v in verdicts if v.grader != v.person]
