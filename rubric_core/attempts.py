"""Which attempt the final answer is: the last one, or the best one when they differ.

At the cap the loop ends on its *last* attempt, which may pass fewer criteria than an earlier
one. The best attempt is `rubric_core.revision.best_iteration` of the last grading run (most
criteria passing, ties to the later pass), the same rule as the middleware's private
``_rubric_best_iteration``. The Run and Review pages and the CLI label the answers they show
with `final_answers`, so all three say the same thing.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from rubric_core.revision import best_iteration

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from rubric_core.types import RubricEvaluation


@dataclasses.dataclass(frozen=True)
class ShownAnswer:
    """An answer to show, with what it is."""

    label: str
    """``"Final answer"`` (last and best are one), ``"last attempt (pass n of n)"`` or
    ``"best attempt (pass k of n)"``."""
    text: str
    """The answer."""
    passed: int
    """Criteria its pass passed."""
    total: int
    """Criteria graded on its pass."""


def _passed(ev: Mapping[str, Any]) -> tuple[int, int]:
    criteria = ev.get("criteria") or []
    return sum(1 for c in criteria if c.get("passed")), len(criteria)


def final_answers(evaluations: Sequence[RubricEvaluation]) -> list[ShownAnswer]:
    """The answers to show for a run: the last attempt, then the best one when they differ.

    Passes are numbered from 1 within the last grading run (of the ``n`` it has). With no
    evaluation the list is empty.
    """
    if not evaluations:
        return []
    last = evaluations[-1]
    current = [ev for ev in evaluations if ev["grading_run_id"] == last["grading_run_id"]]
    n = len(current)
    best = best_iteration(current)
    best_ev = next((ev for ev in current if ev["iteration"] == best), last)
    if best_ev is last or best_ev.get("answer") == last.get("answer"):
        return [ShownAnswer("Final answer", last.get("answer", ""), *_passed(last))]
    k = current.index(best_ev) + 1
    return [
        ShownAnswer(f"last attempt (pass {n} of {n})", last.get("answer", ""), *_passed(last)),
        ShownAnswer(f"best attempt (pass {k} of {n})", best_ev.get("answer", ""),
                    *_passed(best_ev)),
    ]
