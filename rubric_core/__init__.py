"""Rubric Studio's library: the rubric grading loop as LangChain agent middleware.

The public names are re-exported here; see the README for a tour. They are loaded on first
use, so importing a light module (``rubric_core.settings``, ``rubric_core.store``) does not
import LangChain's agents through this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rubric_core.middleware import RubricMiddleware
    from rubric_core.revision import revision_message
    from rubric_core.rubric import LintIssue, RubricError, lint_rubric, parse_criteria
    from rubric_core.state import RubricState
    from rubric_core.types import GraderResponse, RubricEvaluation, RubricStatus

_HOMES = {
    "GraderResponse": "rubric_core.types",
    "LintIssue": "rubric_core.rubric",
    "RubricError": "rubric_core.rubric",
    "RubricEvaluation": "rubric_core.types",
    "RubricMiddleware": "rubric_core.middleware",
    "RubricState": "rubric_core.state",
    "RubricStatus": "rubric_core.types",
    "lint_rubric": "rubric_core.rubric",
    "parse_criteria": "rubric_core.rubric",
    "revision_message": "rubric_core.revision",
}


def __getattr__(name: str) -> Any:
    """Load a re-exported public name from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


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
