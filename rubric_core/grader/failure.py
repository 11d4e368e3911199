"""What is known about a failed grader pass, and how its exception comes to say it.

A pass that fails raises an exception whose message names the grader model, the HTTP status
and the retries made, and, for a reply that could not be used, the reply itself (capped at
`RAW_REPLY_CHAR_LIMIT`). `describe_failure` adds those facts to the exception as it leaves the
pass; `grader_failure` reads them back as fields.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from rubric_core.grader.cache import chat_model

logger = logging.getLogger(__name__)

RAW_REPLY_CHAR_LIMIT = 4_000
"""A grader reply that could not be used is kept up to this size (head and tail, marked)."""

_FAILURE_ATTR = "rubric_grader_failure"


class GraderOutputError(ValueError):
    """The grader did not produce a usable verdict after its one correction."""


@dataclass
class GraderFailure:
    """What is known about a failed grader pass; attached to the exception the pass raises."""

    message: str
    """The exception's own message, before the facts below were added to it."""
    model: str | None = None
    """The grader model's name, where the chat model has one (`model_label`)."""
    status: int | None = None
    """The HTTP status of the failed call, when the failure was an HTTP error."""
    retryable: bool | None = None
    """Whether a failed model call was a transient error (None when no call failed)."""
    retries: int = 0
    """Retries made after transient errors during the pass."""
    raw_reply: str | None = None
    """The unusable reply as received, capped at `RAW_REPLY_CHAR_LIMIT` characters."""
    input_tokens: int | None = None
    """Input tokens the pass's calls used before it failed (None: no usage reported)."""
    output_tokens: int | None = None
    """Output tokens the pass's calls used before it failed (None: no usage reported)."""
    cached_input_tokens: int | None = None
    """Of the input tokens, those read from the provider's prompt cache."""

    def render(self) -> str:
        """The exception message: its own text, the facts in parentheses, then the reply.

        Nothing is added in parentheses when there is nothing to name (a model without a name,
        no HTTP status and no retries).
        """
        facts: list[str] = []
        if self.model:
            facts.append(f"grader model {self.model!r}")
        if self.status is not None:
            facts.append(f"HTTP {self.status}")
        if facts or self.retries:
            if self.retryable is not None:
                facts.append("retryable error" if self.retryable else "not retryable")
            facts.append(f"{self.retries} {'retry' if self.retries == 1 else 'retries'} made")
        text = self.message + (f" ({', '.join(facts)})" if facts else "")
        if self.raw_reply is not None:
            text += (f"\nGrader reply as received (up to {RAW_REPLY_CHAR_LIMIT:,} characters):\n"
                     f"{self.raw_reply}")
        return text


def grader_failure(exc: BaseException) -> GraderFailure | None:
    """The facts a failed grader pass attached to its exception, or None for other exceptions."""
    failure = getattr(exc, _FAILURE_ATTR, None)
    return failure if isinstance(failure, GraderFailure) else None


def describe_failure(exc: BaseException, **facts: Any) -> BaseException:
    """Add `facts` to the failure record of `exc` and rewrite its message to name them.

    The exception keeps its type (callers still catch a rate limit as a rate limit); only its
    message grows, because a ``grader_error`` explanation is built from ``str(exc)``.

    Args:
        exc: The exception leaving the pass.
        **facts: `GraderFailure` fields to set (``model``, ``status``, ``retries``, ...).

    Returns:
        `exc` itself, so that ``raise describe_failure(exc, ...)`` reads as one step.

    """
    failure = grader_failure(exc) or GraderFailure(message=str(exc))
    for name, value in facts.items():
        setattr(failure, name, value)
    try:
        setattr(exc, _FAILURE_ATTR, failure)
        exc.args = (failure.render(),)
    except (AttributeError, TypeError):  # an exception type that refuses new attributes
        logger.debug("cannot annotate %s", type(exc).__name__)
    return exc


def model_label(model: Any) -> str | None:
    """The name of a (possibly tool-bound) chat model, for messages; None when it has none.

    Offline graders name themselves with a ``grader_label`` attribute; other chat models by
    their ``model_name``, ``model``, ``model_id`` or ``deployment_name`` field.
    """
    model = chat_model(model)
    for attr in ("grader_label", "model_name", "model", "model_id", "deployment_name"):
        value = getattr(model, attr, None)
        if isinstance(value, str) and value:
            return value
    return None
