"""The revision turn a failing pass sends the agent, and which pass was the best attempt.

`RubricMiddleware` writes these into the agent's state; `rubric_core.attempts` reads the best
attempt back. Every name here is also importable from `rubric_core.middleware`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from langchain_core.messages import HumanMessage

from rubric_core.types import REVISION_SOURCE

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rubric_core.types import CriterionVerdict, RubricEvaluation

NOT_ASSESSED_GAP = "The grader did not assess this criterion; it is checked again next pass."


ANSWER_CUT_NOTE = (
    "Your last answer was cut off at the output token limit (max_tokens) before it ended, so "
    "it was graded incomplete: write a complete answer that is shorter.")
"""What the revision turn tells a worker whose answer stopped at its output token limit."""

BEST_ATTEMPT_NAME = "rubric_best_attempt"
"""Name of the message ``return_best`` appends (the best attempt's answer)."""


def revision_message(evaluation: RubricEvaluation) -> HumanMessage:
    """The feedback turn that sends a failing evaluation back to the agent.

    It lists the failing criteria with their gaps, the passing ones to keep, the criteria the
    last revision broke (``regressed``), says so when the answer did not change (``stalled``)
    or was cut at the worker's output token limit (``answer_cut``),
    and, for an unverified pass, names the criteria the grader never checked as a verification
    gap rather than a defect: it does not ask the agent to keep passes nobody verified.
    """
    criteria = evaluation["criteria"]
    unchecked = [c for c in criteria if not c["passed"] and c.get("gap") == NOT_ASSESSED_GAP]
    failing = [c for c in criteria if not c["passed"] and c not in unchecked]
    passing = [c for c in criteria if c["passed"]]
    regressed = set(evaluation.get("regressed") or ())
    parts = [
        "The grader checked your last answer against the rubric and it needs revision.",
        f"Grader's summary: {evaluation['explanation']}",
    ]
    if evaluation.get("answer_cut"):
        parts.append(ANSWER_CUT_NOTE)
    if evaluation.get("stalled"):
        parts.append("Your answer did not change from the previous attempt, so the same "
                     "criteria still fail: change the answer where the gaps below say.")
    if failing:
        parts.append("Failing criteria:\n" + "\n".join(
            f"- {c['name']}: {c.get('gap', '')}"
            + (" (it passed before your last revision: you broke it)" if c["name"] in regressed
               else "")
            for c in failing))
    if unchecked:
        parts.append(
            "Not verified (a verification gap in the grading, not a defect found in your "
            "answer; change nothing for these unless the request requires it):\n"
            + "\n".join(f"- {c['name']}" for c in unchecked))
    if passing:
        heading = ("Passing criteria (keep these):" if not unchecked
                   else "Criteria the grader verified as passing (keep these):")
        parts.append(heading + "\n" + "\n".join(f"- {c['name']}" for c in passing))
    parts.append(
        "Revise your answer so that every failing criterion passes and the passing ones still "
        "hold. Reply with the complete revised answer."
    )
    return HumanMessage(
        "\n\n".join(parts),
        name=REVISION_SOURCE,
        additional_kwargs={"lc_source": REVISION_SOURCE},
    )


def normalised(text: str) -> str:
    """`text` with its whitespace collapsed: how two attempts are compared for a stall."""
    return " ".join(text.split())


def best_iteration(evaluations: Sequence[RubricEvaluation]) -> int | None:
    """The pass (``iteration``) whose answer passed the most criteria; ties go to the later one.

    Args:
        evaluations: The passes of one grading run, in order.

    """
    best: tuple[int, int] | None = None
    for ev in evaluations:
        score = (sum(1 for c in ev["criteria"] if c["passed"]), ev["iteration"])
        if best is None or score >= best:
            best = score
    return None if best is None else best[1]


def merge_missing(
    criteria: Sequence[str], answered: list[CriterionVerdict]
) -> list[CriterionVerdict]:
    """The rubric's criteria in order: each answered verdict, or unverified (`NOT_ASSESSED_GAP`)."""
    by_name = {c["name"]: c for c in answered}
    merged: list[CriterionVerdict] = []
    for name in criteria:
        merged.append(by_name.get(name) or {"name": name, "passed": False, "gap": NOT_ASSESSED_GAP})
    return merged
