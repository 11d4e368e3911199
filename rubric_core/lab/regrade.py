"""Re-grading: every answer of a set graded under every configuration, the worker never run.

`run_regrade` grades what a re-grade has not recorded yet and yields progress
(`rubric_core.lab.types.RegradeEvent`). One grading is one grader pass over one answer
(`rubric_core.lab.grading`). The scheduling is the queue engine's, the one experiment cells run
on (`rubric_core.engine`, DBOS on the store's own database):

- The re-grade's answers × configurations are queued as items, one DBOS workflow per
  (configuration, answer) with its repeats (`rubric_core.engine.item` says why that unit), with
  deterministic IDs on a queue of the re-grade's own, whose global concurrency is
  ``concurrency`` over every process (`rubric_core.engine.regrade_queue`). An item is one
  request in flight, so never more than ``concurrency`` requests are. Items are queued a page
  of answers at a time (`PAGE_ITEMS`), while the first ones are graded.
- Whoever dequeues an item grades it: this process, another process running the same re-grade
  (a second `run_regrade` joins it: it queues nothing twice and grades and watches too), or any
  ``rubric-studio worker``. A 429 or 5xx slows every grading of this process down through the
  shared backoff (`rubric_core.http_retry.SharedBackoff`) instead of failing one.
- Each grading is recorded once, in one transaction, under its key (configuration, item,
  repeat) with a unique constraint (`Store.record_regrade_result`): an item skips what is
  recorded, so a graded answer is never graded again (Resume, recovery, two processes). A
  grading that fails is recorded ``grader_error`` with its error; ``retry_errors`` (or
  `rubric_core.lab.retry_errors`) grades those again.
- Progress: this process's gradings as they end (``item_graded``), and every `WATCH_S` the
  counts recorded by any process.
- Stop (closing the iterator, or setting ``stop``) cancels the re-grade's items on every process:
  the gradings in flight here at once, elsewhere within
  `rubric_core.engine.item.CANCEL_POLL_S` (nothing of them is recorded), queued ones never
  start; the re-grade is left ``stopped``. Calling `run_regrade` again continues it: an item
  stopped gets its next attempt, one still queued is left queued.
- Ctrl-C or ``kill -9`` of this process (the status then still says ``running``): its items in
  flight are handed back to the queue by the next process's recovery sweep
  (`rubric_core.engine.regrade_queue.recover_stopped_items`; at once on this machine), which
  every driver runs at its start and every `rubric_core.engine.recovery.SWEEP_S`.
- A lost database stops the re-grade with the error (what is recorded stays).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from typing import TYPE_CHECKING

from rubric_core.background import drive
from rubric_core.experiments import check_limits
from rubric_core.http_retry import SharedBackoff
from rubric_core.lab.grading import (
    few_shot_examples,
    load_examples,
    prepare,
    regrade_models,
)
from rubric_core.types import DEFAULT_CONCURRENCY

if TYPE_CHECKING:
    from collections.abc import Generator

    from rubric_core.engine.launch import Engine
    from rubric_core.lab.grading import PreparedConfig
    from rubric_core.lab.types import RegradeEvent, RegradeFinished, RegradeProgress
    from rubric_core.store import RegradeJob, RegradeResult, Store
    from rubric_core.types import ModelResolver

PAGE_ITEMS = 200
"""Answers read from the database, and their items queued, at a time."""

WATCH_S = 0.5
"""How often the driver reads what every process recorded."""

_STOP_TIMEOUT_S = 10.0  # longest a Stop waits for the engine (a lost database: it retries)
_SETTLED_EVERY = 4  # watch rounds between checks that some item is still queued or running


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
    from rubric_core.engine.launch import engine_for

    job = store.get_regrade_job(job_id)
    if job is None:
        msg = f"no re-grade {job_id!r} in {store.location}"
        raise KeyError(msg)
    check_limits(concurrency)
    backoff = backoff or SharedBackoff()
    models = models or regrade_models(backoff)
    configs = [prepare(config, models) for config in job.configurations]
    if retry_errors:
        store.delete_regrade_errors(job_id)
    stop = stop or threading.Event()
    events: queue.Queue[RegradeEvent | None] = queue.Queue()
    with engine_for(store) as engine:  # not moved to another database while this runs
        driver = _Driver(store, job, configs, stop, events, concurrency, engine)
        yield from drive(driver, events, stop, backoff, "regrade_backoff")


class _Driver:
    """One session of a re-grade, as a coroutine on `rubric_core.background.work_loop`."""

    def __init__(self, store: Store, job: RegradeJob, configs: list[PreparedConfig],
                 stop: threading.Event, events: queue.Queue[RegradeEvent | None],
                 concurrency: int, engine: Engine) -> None:
        self.store, self.job, self.configs, self.stop = store, job, configs, stop
        self.events, self.concurrency, self.engine = events, concurrency, engine
        self.failure: BaseException | None = None
        """What ended the session with an exception, raised again on the consumer's thread."""
        self.started = time.monotonic()
        self.done = [0] * len(configs)
        self.errors = [0] * len(configs)
        self.totals = [0] * len(configs)
        self.at_start = 0
        """Gradings recorded when the session started (for the ETA)."""
        self.graded_here = asyncio.Event()
        self.producer: asyncio.Task[None] | None = None
        """What queues the items (`_produce`): once at the start, again if items ended
        unrecorded (`_watch`)."""

    async def run(self) -> None:
        """The whole session; it never raises (a failure is kept for the consumer's thread)."""
        status = "stopped"
        try:
            status = await self._main()
        except BaseException as exc:  # handed to the consumer's thread
            self.failure = exc
        finally:
            with contextlib.suppress(Exception):  # a lost database: nothing more to say
                await self.store.acall(self.store.set_regrade_status, self.job.job_id, status)
            finished: RegradeFinished = {
                "type": "regrade_finished", "job_id": self.job.job_id,
                "status": "finished" if status == "finished" else "stopped",
                "duration_s": round(time.monotonic() - self.started, 3)}
            self.events.put(finished)
            self.events.put(None)

    async def _load(self) -> None:
        store, job = self.store, self.job
        await store.acall(store.set_regrade_status, job.job_id, "running")
        info = await store.acall(store.answer_set_info, job.set_name, job.set_version)
        counts = await store.acall(store.regrade_counts, job.job_id)
        for index, prepared in enumerate(self.configs):
            self.totals[index] = info.item_count * prepared.config.grader_repeats
            self.done[index], self.errors[index] = counts.get(index, (0, 0))
        self.at_start = sum(self.done)
        await load_examples(store, job, self.configs)

    async def _main(self) -> str:
        from rubric_core.engine import item, regrade_queue
        from rubric_core.engine.launch import listen
        from rubric_core.engine.recovery import requeue_orphans

        await self._load()
        for index in range(len(self.configs)):
            self.events.put(self._progress(index))
        if sum(self.done) >= sum(self.totals):
            return "finished"
        job_id = self.job.job_id
        context = item.RegradeContext(job=self.job, configs=self.configs,
                                      on_graded=self._graded, on_failure=self._failed)
        item.attach(context)
        try:
            # A process of this machine killed mid re-grade: its items go back at once; so do
            # this process's own that nothing here runs (an earlier session's, after an outage).
            await regrade_queue.recover_stopped_items(self.store, me=self.engine.executor_id)
            await requeue_orphans(self.store, [regrade_queue.id_prefix(job_id)],
                                  self.engine.executor_id)
            listen(self.engine, await regrade_queue.register_queue(
                job_id, concurrency=self.concurrency))
            self.producer = asyncio.create_task(self._produce())
            try:
                await self._watch()
            except BaseException:  # a lost database: this process's gradings stop with it
                item.stop_here(job_id)
                raise
            finally:
                self.producer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self.producer
            await context.idle.wait()  # this process's items end (Stop: after their cancel)
        finally:
            item.detach(context)
        if self.failure is not None:
            raise self.failure
        await self._count()
        with contextlib.suppress(Exception):  # another driver may have deleted it
            if not await regrade_queue.active_items(job_id):
                # Nothing queued or running: no process need poll the queue any more.
                await regrade_queue.delete_queue(job_id)
        if self.stop.is_set():
            return "stopped"
        return "finished" if sum(self.done) >= sum(self.totals) else "stopped"

    async def _produce(self) -> None:
        """Queue every item with a grading not recorded yet, a page of answers at a time."""
        from rubric_core.engine import regrade_queue

        store, job = self.store, self.job
        latest = await regrade_queue.latest_attempts(job.job_id)
        offset = 0
        while not self.stop.is_set():
            page = await store.acall(store.answer_items, job.set_name, job.set_version,
                                     offset=offset, limit=PAGE_ITEMS)
            if not page:
                break
            graded = await store.acall(store.graded_keys, job.job_id, [i.id for i in page])
            wanted = [(index, it.id) for it in page for index, prepared in enumerate(self.configs)
                      if any((index, it.id, r) not in graded
                             for r in range(prepared.config.grader_repeats))]
            await regrade_queue.enqueue_items(job.job_id, wanted, latest)
            offset += len(page)

    async def _watch(self) -> None:
        """Count gradings until every one is recorded, no item is left, or Stop.

        Every item ended with gradings missing, and none by a Stop: their next attempts are
        queued, once more each time that made progress. Such an item is an earlier session's
        that this one found still running and left alone: its grading was cut by a lost
        database, and DBOS, retrying, recorded its end only later (seen in a fresh clone's
        run of `tests/test_regrade_outage.py`).
        """
        from rubric_core.engine import item, regrade_queue
        from rubric_core.engine.recovery import SWEEP_S, requeue_orphans

        job_id, rounds, swept = self.job.job_id, 0, time.monotonic()
        requeued_at: int | None = None  # gradings recorded when items were last queued again
        while True:
            if self.stop.is_set():
                item.stop_here(job_id)
                if self.failure is None:  # a lost database: nothing to cancel there
                    with contextlib.suppress(Exception):  # a busy database: Stop here at least
                        await asyncio.wait_for(regrade_queue.cancel_items(job_id),
                                               _STOP_TIMEOUT_S)
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.graded_here.wait(), WATCH_S)
            self.graded_here.clear()
            if self.stop.is_set():
                continue
            await self._count()
            if sum(self.done) >= sum(self.totals):
                return
            rounds += 1
            producer = self.producer
            if (producer is not None and producer.done() and rounds % _SETTLED_EVERY == 0
                    and not await regrade_queue.active_items(job_id)):
                if producer.exception() is not None:
                    raise producer.exception()  # type: ignore[misc]
                await self._count()  # what ended since the last count
                if (sum(self.done) >= sum(self.totals) or requeued_at == sum(self.done)
                        or await self._stopped_elsewhere()):
                    return
                requeued_at = sum(self.done)
                self.producer = asyncio.create_task(self._produce())
            if time.monotonic() - swept > SWEEP_S:
                swept = time.monotonic()
                with contextlib.suppress(Exception):  # a busy database: the next sweep
                    await regrade_queue.recover_stopped_items(self.store,
                                                              me=self.engine.executor_id)
                    await requeue_orphans(self.store, [regrade_queue.id_prefix(job_id)],
                                          self.engine.executor_id)

    async def _stopped_elsewhere(self) -> bool:
        """Whether an item's latest workflow was cancelled: a Stop, here or elsewhere.

        (An item cancelled before this session and graded in full counts too: its session
        then ends ``stopped``, as before.)
        """
        from rubric_core.engine import regrade_queue

        latest = await regrade_queue.latest_attempts(self.job.job_id)
        return any(status == "CANCELLED" for _, status in latest.values())

    async def _count(self) -> None:
        """Read what every process recorded; say where each configuration now stands."""
        counts = await self.store.acall(self.store.regrade_counts, self.job.job_id)
        for index in range(len(self.configs)):
            done, errors = counts.get(index, (0, 0))
            if (done, errors) != (self.done[index], self.errors[index]):
                self.done[index], self.errors[index] = done, errors
                self.events.put(self._progress(index))

    def _graded(self, result: RegradeResult, written: bool) -> None:
        """A grading ended in this process (on the loop): say so."""
        index = result.config_index
        if written:
            self.done[index] += 1
            self.errors[index] += result.result == "grader_error"
            self.events.put({"type": "item_graded", "job_id": self.job.job_id,
                             "config_index": index, "item_id": result.item_id,
                             "repeat_index": result.repeat_index, "result": result.result,
                             "error": result.error})
        self.events.put(self._progress(index))
        self.graded_here.set()

    def _failed(self, exc: BaseException) -> None:
        """An item here lost the database: the re-grade stops with that error."""
        if self.failure is None:
            self.failure = exc
        self.stop.set()
        self.graded_here.set()

    def _progress(self, index: int) -> RegradeProgress:
        elapsed = time.monotonic() - self.started
        since = sum(self.done) - self.at_start
        left = sum(self.totals) - sum(self.done)
        eta = round(left * elapsed / since, 1) if since > 0 else None
        return {"type": "regrade_progress", "job_id": self.job.job_id, "config_index": index,
                "label": self.configs[index].config.display_label(), "done": self.done[index],
                "total": self.totals[index], "errors": self.errors[index],
                "eta_s": max(0.0, eta) if eta is not None else None}


__all__ = ["PAGE_ITEMS", "WATCH_S", "few_shot_examples", "regrade_models", "run_regrade"]
