"""The lab's events: what `rubric_core.lab.run_regrade` yields while it re-grades.

Tagged TypedDicts in the shape of `rubric_core.types`' experiment events, so a page or the CLI
draws a re-grade's progress as it draws an experiment's. (They live beside the lab rather than
in `rubric_core.types` only because the lab was built in its own package first; they are
re-exported from `rubric_core.lab`.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from typing_extensions import TypedDict

if TYPE_CHECKING:
    from rubric_core.types import ExperimentStatus


class RegradeProgress(TypedDict):
    """Where one configuration of a re-grade stands; sent at the start and after each grading."""

    type: Literal["regrade_progress"]
    """Event tag."""
    job_id: str
    """The re-grade."""
    config_index: int
    """0-based index of the configuration."""
    label: str
    """The configuration's label."""
    done: int
    """Gradings recorded (items × repeats), errors included, by any process: this session's at
    once, other processes' within `rubric_core.engine.driver.WATCH_S`."""
    total: int
    """Gradings of this configuration (items × repeats)."""
    errors: int
    """Recorded gradings that ended ``grader_error`` (retryable)."""
    eta_s: float | None
    """Seconds until the whole re-grade ends, at this session's pace (None at first)."""


class ItemGraded(TypedDict):
    """One answer was graded (one repeat, under one configuration) and recorded."""

    type: Literal["item_graded"]
    """Event tag."""
    job_id: str
    """The re-grade."""
    config_index: int
    """0-based index of the configuration."""
    item_id: str
    """The answer."""
    repeat_index: int
    """0-based repeat."""
    result: str
    """The grader's verdict, or ``grader_error``."""
    error: str | None
    """The error of a ``grader_error``."""


class RegradeBackoff(TypedDict):
    """A model server answered 429 or 5xx: every grading's next request waits (shared backoff)."""

    type: Literal["regrade_backoff"]
    """Event tag."""
    status_code: int
    """The HTTP status that caused it."""
    wait_s: float
    """How long new requests wait."""
    hits: int
    """Rate-limit or server errors absorbed so far in this session."""


class RegradeFinished(TypedDict):
    """The session ended: every grading recorded (``finished``) or it was stopped."""

    type: Literal["regrade_finished"]
    """Event tag."""
    job_id: str
    """The re-grade."""
    status: ExperimentStatus
    """The re-grade's status now."""
    duration_s: float
    """Wall-clock seconds of this session."""


RegradeEvent = RegradeProgress | ItemGraded | RegradeBackoff | RegradeFinished
"""What `rubric_core.lab.run_regrade` yields."""
