"""Rubric Studio's library: the rubric grading loop as LangChain agent middleware.

The public names are re-exported here; see the README for a tour.
"""

from __future__ import annotations

from rubric_core.middleware import RubricMiddleware, revision_message
from rubric_core.rubric import LintIssue, RubricError, lint_rubric, parse_criteria
from rubric_core.types import (
    GraderResponse,
    RubricEvaluation,
    RubricState,
    RubricStatus,
)

__all__ = [
    "GraderResponse",
    "LintIssue",
    "RubricError",
    "RubricEvaluation",
    "RubricMiddleware",
    "RubricState",
    "RubricStatus",
    "lint_rubric",
    "parse_criteria",
    "revision_message",
]
