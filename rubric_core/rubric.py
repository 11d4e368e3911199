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
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Iterable

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
_QUOTED_SPAN = re.compile(r"`[^`]*`|\"[^\"]*\"|“[^”]*”|(?<!\w)'[^']+'(?!\w)")
_AND = re.compile(r"\band\b", re.IGNORECASE)
_OR = re.compile(r"\bor\b(?!\s+(?:fewer|less|more|under|below|above)\b)", re.IGNORECASE)
_SPLIT_ADVICE = "split it so each can pass or fail on its own."
_NUMBER = (r"(?:\d+(?:st|nd|rd|th)?|one|two|three|four|five|six|seven|eight|nine|ten|first|"
           r"second|third|fourth|fifth|last)")
# "Lines 1, 2 and 5 rhyme": which lines, not several checks.
_NUMBER_LIST = re.compile(rf"\b{_NUMBER}(?:\s*,\s*{_NUMBER})*,?\s+(?:and|or)\s+{_NUMBER}\b",
                          re.IGNORECASE)


def _joins_several_checks(criterion: str) -> bool:
    if _JOINERS.search(criterion):
        return True
    # "X has A and Y is B": two verbs of checking on either side of a plain "and".
    parts = _AND.split(criterion)
    if len(parts) >= 2 and sum(bool(_CHECK_WORDS.search(p)) for p in parts) >= 2:
        return True
    # "Is short and funny and rhymes", "is clear, concise and accurate": three or more
    # qualities in a row (a list the rules read as one check never gets here).
    unquoted = _NUMBER_LIST.sub(" N ", _QUOTED_SPAN.sub(" ", criterion))
    ands = len(_AND.findall(unquoted))
    return ands >= 2 or (ands == 1 and "," in unquoted)


def _compound_issue(criterion: str, tool_names: Iterable[str]) -> LintIssue | None:
    """A warning for a criterion that joins several checks, naming what the rules read of it."""
    # Imported here: the rules module sits in the offline graders package, which imports this one.
    from rubric_core.offline.rules import partial_reading, read

    if read(criterion, tool_names) is not None:
        return None  # the rules read it as one check ("mentions light, water and oxygen")
    partial = partial_reading(criterion, tool_names)
    unquoted = _QUOTED_SPAN.sub(" ", criterion)
    if partial is None and _AND.search(unquoted) and _OR.search(unquoted):
        message = (
            "This criterion mixes “and” with “or”, so it can be read more than one way (the "
            "rules grader does not guess). Say “all of X, Y” or “at least one of X, Y”, or "
            f"{_SPLIT_ADVICE}"
        )
    elif partial is None:
        if not _joins_several_checks(criterion):
            return None
        message = f"This criterion seems to join several checks; {_SPLIT_ADVICE}"
    elif not partial[1]:
        listed = "; ".join(r.text for r in partial[0])
        message = (
            f"This criterion joins several checks ({listed}); the rules grader reads each one "
            "but not the criterion as written. Write one criterion per check, so each can pass "
            "or fail on its own."
        )
    else:
        listed = "; ".join(r.text for r in partial[0])
        rest = "; ".join(f"“{t}”" for t in partial[1])
        message = (
            f"The rules grader reads only part of this criterion ({listed}), not {rest}, so "
            "it cannot check the criterion at all. Split it into one criterion per check: the "
            "rules then check their part, and an LLM grader (or a rephrasing) the rest."
        )
    return LintIssue("warning", message, criterion)


def lint_rubric(rubric: str, *, tool_names: Iterable[str] = ()) -> list[LintIssue]:
    """Find problems worth fixing before a run: empty, duplicate, compound or too many criteria.

    A criterion that joins several checks is reported with what the rules grader reads of it
    (`rubric_core.offline.rules.partial_reading`), since that is where joined checks go
    unchecked; whether the rules can check each criterion at all is reported by
    `rubric_core.offline.rules.unrecognised_criteria`, for the rules grader only.

    Args:
        rubric: The rubric text.
        tool_names: Grader tools that will be bound (the rules read tool criteria with them).
    """
    issues: list[LintIssue] = []
    try:
        validate_rubric(rubric)
    except RubricError as exc:
        return [LintIssue("error", str(exc))]
    criteria = parse_criteria(rubric)
    if not criteria:
        return [LintIssue("error", "The rubric has no criteria: write one criterion per line.")]
    names = tuple(tool_names)
    seen: dict[str, str] = {}
    for c in criteria:
        key = normalize_name(c)
        if key in seen:
            issues.append(
                LintIssue("error", f"Duplicate criterion: {c!r} appears more than once.", c)
            )
        seen.setdefault(key, c)
        if compound := _compound_issue(c, names):
            issues.append(compound)
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
