"""Re-grading: every answer of a set graded under every configuration, the worker never run.

`run_regrade` grades what a re-grade has not recorded yet and yields progress
(`rubric_core.lab.types.RegradeEvent`), on the queue engine as experiment cells are
(`rubric_core.engine`): one item per (configuration, answer) with its repeats, graded by
whichever process dequeues it (`rubric_core.lab.grading.ItemBody`), on a queue of the
re-grade's own whose global limit is ``concurrency``: never more requests in flight, over every
process. The session (`rubric_core.lab.regrade_driver`) queues the items a page of answers at a
time and counts what every process records; a second `run_regrade` of the same re-grade joins
it. Each grading is recorded once under its key, so Resume, recovery and two processes never
grade an answer twice; a failed one is recorded ``grader_error`` and graded again only with
``retry_errors``. Stop cancels the items on every process (nothing of a grading in flight is
recorded); a lost database stops the re-grade with the error. Why one item per answer and
configuration: ``docs/engine.md``.
"""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING

from rubric_core.background import drive
from rubric_core.experiments.limits import check_concurrency
from rubric_core.http_retry import SharedBackoff
from rubric_core.lab.grading import few_shot_examples, prepare, regrade_models
from rubric_core.types import DEFAULT_CONCURRENCY

if TYPE_CHECKING:
    from collections.abc import Generator

    from rubric_core.lab.types import RegradeEvent
    from rubric_core.store import Store
    from rubric_core.types import ModelResolver


def run_regrade(
    store: Store,
    job_id: str,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    models: ModelResolver | None = None,
    backoff: SharedBackoff | None = None,
    retry_errors: bool = False,
    stop: threading.Event | None = None,
) -> Generator[RegradeEvent, None, None]:
    """Grade (or continue grading) a re-grade's answers, yielding progress as gradings end.

    Closing the iterator early is Stop (see the module docstring); calling this again
    continues. Another process running the same re-grade is joined, not refused.

    Args:
        store: The database.
        job_id: The re-grade (`rubric_core.lab.create_regrade`).
        concurrency: Gradings (requests) at once over every process grading this re-grade, 1
            to `rubric_core.types.MAX_CONCURRENCY`.
        models: Builds the grader models of the gradings made in this process
            (`regrade_models(backoff)` when omitted).
        backoff: The shared backoff (a new `SharedBackoff` when omitted).
        retry_errors: First forget the gradings that ended ``grader_error``, to grade them
            again.
        stop: Set it (from any thread) to stop, like closing the iterator.

    Yields:
        ``regrade_progress`` for every configuration at the start and after each grading,
        ``item_graded`` for the gradings made in this process, ``regrade_backoff``, and one
        ``regrade_finished`` at the end.

    Raises:
        KeyError: No such re-grade.
        ValueError: A bad concurrency, or a grader tool that does not exist.
        ModelConfigError: A grader model cannot be built.

    """
    from rubric_core.engine.launch import engine_for  # imports DBOS: only when run
    from rubric_core.lab.regrade_driver import RegradeDriver

    job = store.get_regrade_job(job_id)
    if job is None:
        msg = f"no re-grade {job_id!r} in {store.location}"
        raise KeyError(msg)
    check_concurrency(concurrency)
    backoff = backoff or SharedBackoff()
    models = models or regrade_models(backoff)
    configs = [prepare(config, models) for config in job.configurations]
    if retry_errors:
        store.delete_regrade_errors(job_id)
    stop = stop or threading.Event()
    events: queue.Queue[RegradeEvent | None] = queue.Queue()
    with engine_for(store) as engine:  # not moved to another database while this runs
        driver = RegradeDriver(store, job, configs, stop, events, concurrency, engine)
        yield from drive(driver, events, stop, backoff, "regrade_backoff")


__all__ = ["few_shot_examples", "regrade_models", "run_regrade"]
