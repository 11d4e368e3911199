"""Rubric text to criteria, and the checks that run before any token is spent.

A rubric is a newline list of criteria. Parsing is local and deterministic, so the grader is
told exactly which criteria to answer and a verdict that leaves one out can be caught.

Rules:
- one criterion per bullet or line; bullets (``-``, ``*``, ``+``, ``•``), numbering (``1.``,
  ``2)``, ``(a)``) and checkboxes (``[ ]``, ``[x]``) are stripped;
- blank lines are ignored;
- an indented line that carries no bullet continues the criterion above it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

MAX_RUBRIC_CHARS = 100_000
"""Rubrics longer than this are rejected before any model call."""

MAX_CRITERIA = 200
"""More criteria than this are rejected before any model call."""

LONG_RUBRIC_CRITERIA = 40
"""Lint warns above this many criteria: graders lose precision on very long rubrics."""

_MARKER = re.compile(
    r"""^\s*(?:
        [-*+•‣▪◦]\s+                        # bullet
      | \(?[0-9]{1,3}[.)]\s+                # 1.  2)  (3)
      | \(?[a-zA-Z][.)]\s+(?=\S)            # a.  b)  (c)
      )?
      (?:\[[ xX]?\]\s+)?                    # [ ] or [x]
    """,
    re.VERBOSE,
)
_HAS_MARKER = re.compile(r"^\s*(?:[-*+•‣▪◦]\s+|\(?[0-9]{1,3}[.)]\s+|\[[ xX]?\]\s+)")
_SPACES = re.compile(r"\s+")
_BARE_MARKERS = frozenset({"-", "*", "+", "•", "[ ]", "[]", "[x]"})


class RubricError(ValueError):
    """A rubric that cannot be used at all (wrong type, too large)."""


def _strip_marker(line: str) -> str:
    return _MARKER.sub("", line, count=1).strip()


def parse_criteria(rubric: str) -> list[str]:
    """Split rubric text into criteria.

    Args:
        rubric: The rubric as typed by a person.

    Returns:
        The criteria in order, markers stripped, continuation lines joined with a space.
    """
    criteria: list[str] = []
    for raw in rubric.splitlines():
        if not raw.strip():
            continue
        indented = raw[:1] in (" ", "\t")
        if indented and criteria and not _HAS_MARKER.match(raw):
            criteria[-1] = f"{criteria[-1]} {raw.strip()}"
            continue
        text = _strip_marker(raw)
        if text and text not in _BARE_MARKERS:
            criteria.append(text)
    return criteria


def normalize_name(name: str) -> str:
    """A criterion name reduced for matching: no markers, case or repeated whitespace."""
    text = _strip_marker(name).strip().rstrip(".").casefold()
    return _SPACES.sub(" ", text.replace("`", "").replace('"', "").replace("'", ""))


def validate_rubric(rubric: object) -> str:
    """Check a rubric's type and size, returning it unchanged.

    Raises:
        RubricError: The rubric is not a string, or exceeds the size limits.
    """
    if not isinstance(rubric, str):
        msg = f"rubric must be a string (one criterion per line), got {type(rubric).__name__}"
        raise RubricError(msg)
    if len(rubric) > MAX_RUBRIC_CHARS:
        msg = (
            f"rubric is {len(rubric):,} characters; the limit is {MAX_RUBRIC_CHARS:,}. "
            "Split it into smaller rubrics or shorten the criteria."
        )
        raise RubricError(msg)
    count = len(parse_criteria(rubric))
    if count > MAX_CRITERIA:
        msg = f"rubric has {count} criteria; the limit is {MAX_CRITERIA}."
        raise RubricError(msg)
    return rubric


@dataclass(frozen=True)
class LintIssue:
    """One problem found in a rubric before running it."""

    level: Literal["error", "warning"]
    """`error` blocks a run; `warning` is advice."""
    message: str
    """What is wrong and what to do about it."""
    criterion: str | None = None
    """The criterion concerned, when there is one."""


_JOINERS = re.compile(r"\b(?:and also|as well as|and then)\b|;", re.IGNORECASE)
_CHECK_WORDS = re.compile(
    r"\b(?:has|have|is|are|uses?|contains?|mentions?|includes?|follows?|returns?|passe?s?)\b",
    re.IGNORECASE,
)


def _joins_several_checks(criterion: str) -> bool:
    if _JOINERS.search(criterion):
        return True
    # "X has A and Y is B": two verbs of checking on either side of a plain "and".
    parts = re.split(r"\band\b", criterion, flags=re.IGNORECASE)
    return len(parts) >= 2 and sum(bool(_CHECK_WORDS.search(p)) for p in parts) >= 2


def lint_rubric(rubric: str) -> list[LintIssue]:
    """Find problems worth fixing before a run: empty, duplicate, compound or too many criteria.

    Checks that depend on the grader (criteria the rules grader cannot check) live with that
    grader; this function knows only the rubric text.
    """
    issues: list[LintIssue] = []
    try:
        validate_rubric(rubric)
    except RubricError as exc:
        return [LintIssue("error", str(exc))]
    criteria = parse_criteria(rubric)
    if not criteria:
        return [LintIssue("error", "The rubric has no criteria: write one criterion per line.")]
    seen: dict[str, str] = {}
    for c in criteria:
        key = normalize_name(c)
        if key in seen:
            issues.append(
                LintIssue("error", f"Duplicate criterion: {c!r} appears more than once.", c)
            )
        seen.setdefault(key, c)
        if _joins_several_checks(c):
            issues.append(
                LintIssue(
                    "warning",
                    "This criterion seems to join several checks; split it so each can pass "
                    "or fail on its own.",
                    c,
                )
            )
        if len(c) > 500:
            issues.append(
                LintIssue("warning", "This criterion is very long (over 500 characters).", c)
            )
    if len(criteria) > LONG_RUBRIC_CRITERIA:
        issues.append(
            LintIssue(
                "warning",
                f"{len(criteria)} criteria: graders get less reliable past "
                f"{LONG_RUBRIC_CRITERIA}. Consider splitting the rubric.",
            )
        )
    return issues
