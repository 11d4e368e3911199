"""Record a run in the run index while its events stream past (shared by the app and the CLI).

`run_title` is the label both give a new run.

`record_events` wraps the runner's event iterator: each evaluation is stored as it finishes,
``run_finished`` sets the run's final status and duration, an exception marks the run
``error`` and an early stop marks it ``interrupted`` (its thread stays in the database, so the
run can be resumed).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from rubric_core.examples import get_example
from rubric_core.redact import redact, redact_data
from rubric_core.store import StoreError

if TYPE_CHECKING:
    from rubric_core.runner import RunEvent
    from rubric_core.store import Store
    from rubric_core.types import RubricEvaluation


TITLE_CHARS = 60
"""Longest run title taken from a prompt."""


def run_title(prompt: str, example_name: str | None = None) -> str:
    """A short label for the run index: the bundled example's title, else the prompt's start."""
    if example_name:
        try:
            return get_example(example_name).title
        except KeyError:
            pass
    first = " ".join(prompt.split())
    return first if len(first) <= TITLE_CHARS else first[: TITLE_CHARS - 1] + "…"


def record_events(
    store: Store, run_id: str, events: Iterator[RunEvent], *, prior_duration_s: float = 0.0
) -> Iterator[RunEvent]:
    """Pass the runner's events through, recording the run in the store as they arrive.

    Each evaluation is added when it finishes (once, even when a resumed node repeats it);
    ``run_finished`` sets the final status. When the events stop early — the consumer closed
    this generator — the runner is closed too (aborting the graph) and the run is marked
    ``interrupted``.

    Args:
        store: The database.
        run_id: The run's id in the index.
        events: ``run_rubric(...)``.
        prior_duration_s: Seconds the run already took before a resume.

    Yields:
        The runner's events, unchanged.
    """
    seen = {_eval_key(e) for e in store.evaluations(run_id)}
    started = time.perf_counter()
    finished = False

    def add(evaluation: RubricEvaluation) -> None:
        key = _eval_key(evaluation)
        if key not in seen:
            store.add_evaluation(run_id, redact_data(evaluation))
            seen.add(key)

    try:
        for event in events:
            if event["type"] == "evaluation_finished":
                add(event["evaluation"])
            elif event["type"] == "run_finished":
                for evaluation in event["evaluations"]:
                    add(evaluation)
                store.finish_run(
                    run_id, event["status"], error=redact(event["error"] or "") or None,
                    duration_s=round(prior_duration_s + event["duration_s"], 3),
                )
                finished = True
            yield event
    except Exception as exc:
        if not finished:
            finished = True
            _finish_quietly(store, run_id, "error", redact(f"{type(exc).__name__}: {exc}"),
                            prior_duration_s + time.perf_counter() - started)
        raise
    finally:
        if not finished:
            close = getattr(events, "close", None)
            if close is not None:
                close()
            _finish_quietly(store, run_id, "interrupted", None,
                            prior_duration_s + time.perf_counter() - started)


def _eval_key(ev: Mapping[str, Any]) -> tuple[str, int]:
    return str(ev.get("grading_run_id")), int(ev.get("iteration") or 0)


def _finish_quietly(
    store: Store, run_id: str, status: str, error: str | None, duration_s: float
) -> None:
    # On failure the record stays 'running', which the Run page still offers to resume.
    with contextlib.suppress(StoreError, KeyError):
        store.finish_run(run_id, status, error=error, duration_s=round(duration_s, 3))
