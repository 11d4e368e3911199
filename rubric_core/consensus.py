"""Grading the same answer several times: one verdict per criterion from k repeats.

LLM judges are not deterministic: the same answer can pass a criterion on one call and fail it
on the next. With ``RubricMiddleware(grader_repeats=k)`` each pass grades the answer k times and
`combine` turns the k outcomes into one:

- **per criterion**, ``majority``: passes when more repeats pass it than fail it; a tie fails,
  since the grader could not agree that it passes. ``unanimous``: passes only when every repeat
  that answered it passed it. A repeat that left a criterion out votes neither way; a criterion
  no repeat answered stays unanswered (the pass is then unverified, as with one call).
- ``agreement`` on each criterion is the share of the k repeats whose verdict equals the
  consensus (a repeat that left it out does not agree); criteria below 1.0 are ``unstable``.
- **the pass's result**: ``failed`` when more than half the repeats judged the rubric unusable;
  otherwise ``satisfied`` exactly when every criterion passes by consensus, else
  ``needs_revision``.
- the gap of a failing criterion is the first failing repeat's; the explanation is that of the
  first repeat whose own result matches the consensus, with the repeat count and the unstable
  criteria appended; tokens, retries, model and tool calls are the sum of all repeats.
"""

from __future__ import annotations

import contextvars
import dataclasses
from typing import TYPE_CHECKING

from rubric_core.grader import GradeOutcome
from rubric_core.types import CONSENSUS_MODES as CONSENSUS_MODES  # re-exported
from rubric_core.types import MAX_GRADER_REPEATS as MAX_GRADER_REPEATS  # re-exported
from rubric_core.types import Consensus as Consensus  # re-exported
from rubric_core.types import CriterionVerdict, GraderResponse
from rubric_core.usage import token_sum

if TYPE_CHECKING:
    from collections.abc import Sequence


REPEATS_IN_SEQUENCE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "rubric_repeats_in_sequence", default=False)
"""Set where a task stands for one request in flight (an experiment's cell holds one of its
``concurrency`` slots): the async middleware then makes a pass's k grader calls one after
another instead of at once, so an experiment never has more than ``concurrency`` requests in
flight (provider rate limits count requests, not cells). One run's repeats stay concurrent."""


@dataclasses.dataclass(frozen=True)
class Combined:
    """The consensus of k repeats of one grading pass."""

    outcome: GradeOutcome
    """One outcome, as a single grader call would give it."""
    agreement: dict[str, float]
    """Per criterion: share of repeats agreeing with the consensus."""
    unstable: list[str]
    """Criteria whose repeats disagreed, in rubric order."""


def combine(
    outcomes: Sequence[GradeOutcome], criteria: Sequence[str], mode: Consensus = "majority"
) -> Combined:
    """The consensus of ``outcomes`` (k repeats of one pass) over the rubric's ``criteria``.

    Args:
        outcomes: At least one outcome, each with verdicts named as in the rubric.
        criteria: The rubric's criteria, in order.
        mode: ``majority`` or ``unanimous`` (see the module docstring).

    Raises:
        ValueError: No outcomes, or an unknown mode.

    """
    if not outcomes:
        msg = "combine needs at least one outcome"
        raise ValueError(msg)
    if mode not in CONSENSUS_MODES:
        msg = f"consensus must be one of {CONSENSUS_MODES}, got {mode!r}"
        raise ValueError(msg)
    k = len(outcomes)
    votes: dict[str, list[CriterionVerdict]] = {name: [] for name in criteria}
    for outcome in outcomes:
        for cast_vote in outcome.criteria:
            if cast_vote["name"] in votes:
                votes[cast_vote["name"]].append(cast_vote)
    merged: list[CriterionVerdict] = []
    agreement: dict[str, float] = {}
    missing: list[str] = []
    for name in criteria:
        cast = votes[name]
        if not cast:
            missing.append(name)
            continue
        passes = sum(1 for v in cast if v["passed"])
        fails = len(cast) - passes
        passed = passes > fails if mode == "majority" else fails == 0
        agree = passes if passed else fails
        agreement[name] = round(agree / k, 4)
        verdict: CriterionVerdict = {"name": name, "passed": passed}
        if not passed:
            verdict["gap"] = next(v.get("gap", "") for v in cast if not v["passed"])
        merged.append(verdict)
    unstable = [name for name in criteria if name in agreement and agreement[name] < 1.0]

    failed_votes = sum(1 for o in outcomes if o.response.result == "failed")
    if failed_votes * 2 > k:
        result = "failed"
    elif all(v["passed"] for v in merged):
        result = "satisfied"  # any unanswered criterion makes the pass unverified downstream
    else:
        result = "needs_revision"
    lead = next((o for o in outcomes if o.response.result == result), outcomes[0])
    explanation = lead.response.explanation
    if k > 1:
        note = f"{k} repeats, {mode}"
        if unstable:
            note += "; not unanimous on: " + "; ".join(unstable)
        explanation = f"{explanation} ({note}.)"
    response = GraderResponse.model_construct(
        result=result, explanation=explanation, criteria=list(lead.response.criteria)
    )
    unknown: list[str] = []
    for outcome in outcomes:
        unknown += [n for n in outcome.unknown_criteria if n not in unknown]
    combined = GradeOutcome(
        response=response,
        criteria=merged,
        missing=missing,
        input_tokens=token_sum(*(o.input_tokens for o in outcomes)),
        output_tokens=token_sum(*(o.output_tokens for o in outcomes)),
        cached_input_tokens=token_sum(*(o.cached_input_tokens for o in outcomes)),
        model_calls=sum(o.model_calls for o in outcomes),
        tool_calls=[name for o in outcomes for name in o.tool_calls],
        unknown_criteria=unknown,
        retries=sum(o.retries for o in outcomes),
    )
    return Combined(combined, agreement, unstable)
