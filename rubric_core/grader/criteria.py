"""Criterion matching: which of a grader's answers name which rubric criteria, and what follows.

Criteria are matched to the rubric by name only (`criterion_key`), never by position; answers
for names that are not in the rubric are recorded (`CriteriaMatch.unknown`) and never counted,
and the result is recomputed from the rubric's own criteria (`recompute_result`). A verdict
that leaves criteria out is sent back once with `coverage_problem`'s text. A grader's reply is
untrusted, so what is kept of it is bounded (`bound_response`, `UNKNOWN_NAMES_LIMIT`).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rubric_core.grader.transcript import shorten
from rubric_core.rubric import normalize_name

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rubric_core.types import CriterionVerdict, GraderResponse

EXPLANATION_CHAR_LIMIT = 4_000
"""A verdict's explanation is recorded (and shown to the worker) up to this size, marked."""
GAP_CHAR_LIMIT = 2_000
"""Each criterion's gap is recorded (and sent back to the worker) up to this size, marked."""
UNKNOWN_NAMES_LIMIT = 50
"""Names of criteria not in the rubric kept from one verdict (each cut at 300 characters)."""


_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'",
                        "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"',
                        "\u00ab": '"', "\u00bb": '"', "\u2039": "'", "\u203a": "'"})
_EDGES = " \t\r\n'\"`*"
_TRAILING = _EDGES + ".,;:!?"


def criterion_key(name: str) -> str:
    """A criterion name reduced to what matching compares; equal keys name the same criterion.

    The rule, applied in this order:

    1. Unicode NFKC (full-width letters, non-breaking spaces and ligatures become plain ones)
       and typographic quotes (‘ ’ “ ” « » ‹ ›) become ASCII quotes;
    2. surrounding whitespace, quotes (``'`` ``"`` `````) and markdown emphasis (``*``) are
       stripped;
    3. one leading list marker is stripped as `rubric.parse_criteria` strips it (a bullet
       ``-`` ``*`` ``+`` ``•``, a number ``2.`` ``2)`` ``(2)``, a letter ``b.`` ``(b)``, a
       checkbox ``[ ]`` ``[x]``), then every quote and backtick, case (casefold) and runs of
       whitespace (one space) — `rubric.normalize_name`;
    4. surrounding whitespace, quotes and emphasis, and trailing ``. , ; : ! ?``, are stripped.

    Nothing else is forgiven: a paraphrase, a different word or a prefix such as
    ``Criterion 2:`` is a different name.
    """
    text = unicodedata.normalize("NFKC", name).translate(_QUOTES).strip(_EDGES)
    return normalize_name(text).strip(_EDGES).rstrip(_TRAILING)


def assign_answers(
    criteria: Sequence[str], names: Sequence[str]
) -> tuple[dict[int, list[int]], list[int]]:
    """Which answered names name which rubric criteria, by `criterion_key` alone.

    Args:
        criteria: The rubric's criteria, in order.
        names: The names the grader answered, in its order.

    Returns:
        For each rubric index that was answered, the positions (in `names`) of its answers;
        and the positions of names that match no criterion. Rubric criteria that share a key
        take that key's answers one each, in order; when there are more answers than such
        criteria, each of them gets every one of those answers.

    """
    slots: dict[str, list[int]] = {}
    for index, criterion in enumerate(criteria):
        slots.setdefault(criterion_key(criterion), []).append(index)
    by_key: dict[str, list[int]] = {}
    unknown: list[int] = []
    for pos, name in enumerate(names):
        key = criterion_key(name)
        if key and key in slots:
            by_key.setdefault(key, []).append(pos)
        else:
            unknown.append(pos)
    answers: dict[int, list[int]] = {}
    for key, positions in by_key.items():
        indexes = slots[key]
        if len(positions) <= len(indexes):
            for index, pos in zip(indexes, positions, strict=False):
                answers[index] = [pos]
        else:
            for index in indexes:
                answers[index] = list(positions)
    return answers, unknown


@dataclass(frozen=True)
class CriteriaMatch:
    """A grader's criteria mapped onto the rubric's."""

    verdicts: list[CriterionVerdict]
    """Verdicts of the answered criteria, in rubric order, named as in the rubric."""
    missing: list[str]
    """Rubric criteria left unanswered (conflicting answers count as unanswered)."""
    unknown: list[str]
    """Names answered that match no rubric criterion (at most `UNKNOWN_NAMES_LIMIT`)."""
    conflicting: list[str]
    """Rubric criteria answered more than once with different verdicts (also in `missing`)."""


def match_criteria(criteria: Sequence[str], graded: GraderResponse) -> CriteriaMatch:
    """Map the grader's criteria onto the rubric's, by name only (see `criterion_key`).

    Position and numbering never decide a match. A criterion answered twice counts once when
    the answers agree (the first one is kept) and as unanswered when they disagree.
    """
    answers, unknown = assign_answers(criteria, [item.name for item in graded.criteria])
    verdicts: list[CriterionVerdict] = []
    missing: list[str] = []
    conflicting: list[str] = []
    for index, name in enumerate(criteria):
        items = [graded.criteria[pos] for pos in answers.get(index, [])]
        if not items:
            missing.append(name)
            continue
        if len({item.passed for item in items}) > 1:
            conflicting.append(name)
            missing.append(name)
            continue
        verdict: CriterionVerdict = {"name": name, "passed": items[0].passed}
        if not items[0].passed:
            verdict["gap"] = items[0].gap or ""
        verdicts.append(verdict)
    names = [shorten(graded.criteria[pos].name, 300) for pos in unknown[:UNKNOWN_NAMES_LIMIT]]
    return CriteriaMatch(verdicts, missing, names, conflicting)


def bound_response(response: GraderResponse) -> GraderResponse:
    """The response with its explanation and gaps cut to their limits (head and tail kept).

    A grader's reply is untrusted: megabytes of explanation would be stored in every
    checkpoint and evaluation and sent back to the worker in every revision message.
    """
    explanation = shorten(response.explanation, EXPLANATION_CHAR_LIMIT)
    criteria = [item if item.gap is None or len(item.gap) <= GAP_CHAR_LIMIT
                else item.model_copy(update={"gap": shorten(item.gap, GAP_CHAR_LIMIT)})
                for item in response.criteria]
    if explanation == response.explanation and all(
            new is old for new, old in zip(criteria, response.criteria, strict=True)):
        return response
    return response.model_copy(update={"explanation": explanation, "criteria": criteria})


def recompute_result(response: GraderResponse, match: CriteriaMatch) -> GraderResponse:
    """The response with its result decided by the rubric's own criteria."""
    if response.result == "failed":
        return response
    result = "satisfied" if all(v["passed"] for v in match.verdicts) else "needs_revision"
    if result == response.result:
        return response
    note = (f" (Result set to {result!r}: it follows from the rubric's criteria; verdicts on "
            "criteria that are not in the rubric were ignored.)")
    return response.model_copy(update={"result": result,
                                        "explanation": response.explanation + note})


def coverage_problem(criteria: Sequence[str], match: CriteriaMatch) -> str:
    """The correction sent to a grader whose verdict left criteria out (`match.missing`)."""
    listing = "\n".join(f"- {m}" for m in match.missing)
    lines = [f"Your verdict leaves out {len(match.missing)} of the {len(criteria)} criteria:\n"
             f"{listing}"]
    if match.conflicting:
        lines.append("It answers these more than once with different verdicts: "
                     + "; ".join(repr(c) for c in match.conflicting) + ".")
    if match.unknown:
        lines.append("It names criteria that are not in the rubric (ignored): "
                     + "; ".join(repr(c) for c in match.unknown) + ".")
    lines.append("Call GraderResponse again answering every criterion once, by name, copying "
                 "each criterion's text exactly.")
    return "\n".join(lines)
