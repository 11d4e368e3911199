"""One session of a re-grade on the queue engine, with the events of `run_regrade`.

`RegradeDriver` (a `rubric_core.engine.driver.BatchDriver`) hands back a stopped process's
items and its own orphans, registers the re-grade's queue, queues every item with a grading
not recorded yet a page of answers at a time (`PAGE_ITEMS`, while the first are graded) and
counts what every process records. Items that all ended with gradings missing, none by a Stop
(an earlier session's, cut by a lost database), are queued again, once more each time that
made progress. Imports DBOS: `run_regrade` imports it only when it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

from rubric_core.engine import queues
from rubric_core.engine.body import ITEM
from rubric_core.engine.driver import BatchDriver
from rubric_core.engine.recovery import recover_stopped_executors
from rubric_core.engine.runtime import stop_batch
from rubric_core.lab.grading import RegradeBatch, load_examples

if TYPE_CHECKING:
    import queue
    import threading

    from rubric_core.engine.runtime import Engine
    from rubric_core.lab.grading import PreparedConfig
    from rubric_core.lab.types import RegradeEvent, RegradeProgress
    from rubric_core.store import RegradeJob, RegradeResult, Store

PAGE_ITEMS = 200
"""Answers read from the database, and their items queued, at a time."""

STOP_TIMEOUT_S = 10.0
"""Longest a Stop waits for the engine to cancel (a lost database: DBOS retries)."""


class RegradeDriver(BatchDriver):
    """One session of a re-grade (see the module docstring)."""

    def __init__(self, store: Store, job: RegradeJob, configs: list[PreparedConfig],
                 stop: threading.Event, events: queue.Queue[RegradeEvent | None],
                 concurrency: int, engine: Engine) -> None:
        super().__init__(store, ITEM, job.job_id, stop, events, engine)
        self.job, self.configs, self.concurrency = job, configs, concurrency
        self.done = [0] * len(configs)
        self.errors = [0] * len(configs)
        self.totals = [0] * len(configs)
        self.at_start = 0
        """Gradings recorded when the session started (for the ETA)."""
        self.producer: asyncio.Task[None] | None = None
        """What queues the items (`_produce`)."""
        self.requeued_at: int | None = None
        """Gradings recorded when items were last queued again (`settled`)."""

    async def set_status(self, status: str) -> None:
        """Record the re-grade's status."""
        await self.store.acall(self.store.set_regrade_status, self.batch_id, status)

    def finished(self, status: str) -> dict[str, Any]:
        """``regrade_finished``."""
        return {"type": "regrade_finished", "job_id": self.batch_id,
                "status": "finished" if status == "finished" else "stopped",
                "duration_s": round(time.monotonic() - self.started, 3)}

    def complete(self) -> bool:
        """Whether every grading is recorded."""
        return sum(self.done) >= sum(self.totals)

    async def active(self) -> bool:
        """Whether items are still being queued, or one is queued or running."""
        return (self.producer is not None and not self.producer.done()) or bool(
            await queues.active_items(self.batch_id))

    async def cancel(self) -> None:
        """Cancel the re-grade's items on every process (not with the database lost)."""
        if self.failure is None:
            with contextlib.suppress(Exception):  # a busy database: Stop here at least
                await asyncio.wait_for(queues.cancel_items(self.batch_id), STOP_TIMEOUT_S)

    def prefixes(self) -> list[str]:
        """The workflow ID prefix of the re-grade's items."""
        return [queues.item_prefix(self.batch_id)]

    async def main(self) -> str:
        """Queue the items left, watch them end; the status at the end."""
        await self._load()
        for index in range(len(self.configs)):
            self.events.put(self._progress(index))
        if self.complete():
            return "finished"
        batch = RegradeBatch(self.batch_id, job=self.job, configs=self.configs,
                             on_graded=self._graded, on_failure=self._failed)
        try:
            # A process of this machine killed mid re-grade: its items go back at once.
            await recover_stopped_executors(self.store, me=self.engine.executor_id)
            await self.open(batch, [await queues.register_regrade_queue(
                self.batch_id, concurrency=self.concurrency)])
            self.producer = asyncio.create_task(self._produce())
            try:
                await self.watch(batch)
            except BaseException:  # a lost database: this process's gradings stop with it
                stop_batch(self.engine, ITEM, self.batch_id)
                raise
            finally:
                self.producer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self.producer
            await batch.idle.wait()  # this process's items end (Stop: after their cancel)
        finally:
            self.close(batch)
        if self.failure is not None:
            raise self.failure
        await self.count()
        with contextlib.suppress(Exception):  # another driver may have deleted it
            # A re-grade reported finished shows no item running in its queue.
            if await self.settle():
                await queues.delete_regrade_queue(self.batch_id)
        if self.stop.is_set():
            return "stopped"
        return "finished" if self.complete() else "stopped"

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

    async def _produce(self) -> None:
        """Queue every item with a grading not recorded yet, a page of answers at a time."""
        store, job = self.store, self.job
        latest = await queues.latest_items(job.job_id)
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
            await queues.enqueue_items(job.job_id, wanted, latest)
            offset += len(page)

    async def settled(self) -> bool:
        """No item queued or running: whether the session ends.

        It goes on when items ended with gradings missing, none by a Stop, and gradings were
        recorded since items were last queued again: their next attempts are queued.
        """
        assert self.producer is not None
        if self.producer.exception() is not None:
            raise self.producer.exception()  # type: ignore[misc]
        await self.count()  # what ended since the last count
        if self.complete() or self.requeued_at == sum(self.done) or any(
                status == "CANCELLED"
                for _, status in (await queues.latest_items(self.batch_id)).values()):
            return True
        self.requeued_at = sum(self.done)
        self.producer = asyncio.create_task(self._produce())
        return False

    async def count(self) -> None:
        """Read what every process recorded; say where each configuration now stands."""
        counts = await self.store.acall(self.store.regrade_counts, self.batch_id)
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
            self.events.put({"type": "item_graded", "job_id": self.batch_id,
                             "config_index": index, "item_id": result.item_id,
                             "repeat_index": result.repeat_index, "result": result.result,
                             "error": result.error})
        self.events.put(self._progress(index))
        self.ended_here.set()

    def _failed(self, exc: BaseException) -> None:
        """An item here lost the database: the re-grade stops with that error."""
        if self.failure is None:
            self.failure = exc
        self.stop.set()
        self.ended_here.set()

    def _progress(self, index: int) -> RegradeProgress:
        elapsed = time.monotonic() - self.started
        since = sum(self.done) - self.at_start
        left = sum(self.totals) - sum(self.done)
        eta = round(left * elapsed / since, 1) if since > 0 else None
        return {"type": "regrade_progress", "job_id": self.batch_id, "config_index": index,
                "label": self.configs[index].config.display_label(), "done": self.done[index],
                "total": self.totals[index], "errors": self.errors[index],
                "eta_s": max(0.0, eta) if eta is not None else None}


__all__ = ["PAGE_ITEMS", "STOP_TIMEOUT_S", "RegradeDriver"]
