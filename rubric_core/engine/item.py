"""The re-grade item workflow: one answer graded under one configuration, all its repeats.

A re-grade's work (`rubric_core.lab.regrade`) is queued on the queue engine as items: one DBOS
workflow per (configuration, answer), on whichever process dequeues it (the process driving
the re-grade, another driver joining it, or any ``rubric-studio worker``). Why that unit, and
not one workflow per grading or per page of answers (measured: ``bench/regrade_unit.py``):

- A workflow is one request in flight (its repeats in sequence, as a cell's grader repeats
  are), so the re-grade's queue's global concurrency is the number of requests in flight over
  every process, which is what ``concurrency`` always meant. A page of answers per workflow
  would either grade its page one answer at a time (a small set could not use its
  concurrency) or several at once (no longer bounded by the queue).
- Its cost is what DBOS writes per workflow (enqueue, dequeue, status, end: a few ms on
  SQLite and PostgreSQL), small beside a grading (a model call); repeats share one workflow,
  so a set graded three times costs a third of the workflows one per grading would.
- What it gives up: repeats of one answer never run at once, so a set with fewer answers than
  ``concurrency`` keeps fewer requests in flight than it might.

The workflow's inputs are ids only (re-grade, configuration, answer); its body grades the
repeats not recorded yet, one after another, and records each at once
(`rubric_core.store.Store.record_regrade_result`: once per key, so a grading recorded is never
graded again, and a grading racing another process's is recorded once). It makes no DBOS call:
a recovered item simply starts again and skips what was recorded.

What an item needs beyond its ids comes from this process's `RegradeContext` for its re-grade:
the driver's (its models, its shared backoff, its listener that turns gradings into events),
or one built here from the stored re-grade (a worker: models from this process's keys).

Stop: each process watches the items it runs (one query every `CANCEL_POLL_S` while items
run) and cancels the grading in flight of an item whose workflow was cancelled: nothing of
it is recorded. An item the queue handed out just before the Stop's cancel can start after
it: one cancelled by this process (`note_cancelled`) grades nothing, even once the driver
that stopped has gone. A process that leaves (a worker stopped by a signal) cancels its
gradings and leaves its items' workflows ``PENDING``, for recovery
(`rubric_core.engine.regrade_queue`).

Liveness: while items of a re-grade run here, this process touches the re-grade's row every
`rubric_core.session.HEARTBEAT_S` (`Store.touch_regrade`), which is how another machine's
recovery tells a re-grade still being graded from one whose processes died.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import time
from typing import TYPE_CHECKING, Any

from dbos import DBOS

if TYPE_CHECKING:
    from collections.abc import Callable

    from rubric_core.lab.grading import PreparedConfig
    from rubric_core.store import RegradeJob, RegradeResult, Store

ITEM_WORKFLOW = "rubric_studio.regrade_item"
"""The item workflow's registered name (stored with every queued item: never rename it)."""

ITEM_ID_PREFIX = "rubric-item:"
"""What an item's workflow ID starts with (`rubric_core.engine.regrade_queue.workflow_id`)."""

CANCEL_POLL_S = 0.5
"""How often a process asks whether the items it runs were cancelled (Stop)."""


@dataclasses.dataclass(eq=False)
class RegradeContext:
    """What this process needs to grade a re-grade's items (see the module docstring)."""

    job: RegradeJob
    """The re-grade."""
    configs: list[PreparedConfig]
    """Its configurations, ready to grade with."""
    on_graded: Callable[[RegradeResult, bool], None] | None = None
    """Called (on the loop) with each grading done here and whether it was recorded (False: that
    key was recorded already)."""
    on_failure: Callable[[BaseException], None] | None = None
    """Called (on the loop) when an item here failed for want of the database."""
    stopping: bool = False
    """Set by the driver's Stop: items dequeued here from now on grade nothing."""
    running: int = 0
    """Items of this re-grade running here now."""
    idle: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    """Set whenever no item of this re-grade runs here."""


@dataclasses.dataclass(eq=False)
class _Running:
    job_id: str
    task: asyncio.Task[int]
    stopped: bool = False


# Touched on the work loop only.
_contexts: dict[str, RegradeContext] = {}
_running: dict[str, _Running] = {}  # item's workflow id -> its grading task
_watcher: list[asyncio.Task[None]] = []
_leaving: list[bool] = [False]  # this process stops taking part: items left for recovery
_cancelled: set[str] = set()  # item workflows this process cancelled (`note_cancelled`)


def attach(context: RegradeContext) -> None:
    """Make ``context`` the one this process's items of its re-grade use (a driver's)."""
    context.idle.set()
    _contexts[context.job.job_id] = context


def detach(context: RegradeContext) -> None:
    """Forget ``context`` (a driver that ended); later items here build a default one."""
    if _contexts.get(context.job.job_id) is context:
        del _contexts[context.job.job_id]


def stop_here(job_id: str) -> int:
    """Cancel the gradings in flight of the re-grade's items running here; how many.

    Items of it dequeued here afterwards (before their cancellation reaches the queue) grade
    nothing while the driver's context is attached.
    """
    if (context := _contexts.get(job_id)) is not None:
        context.stopping = True
    count = 0
    for running in _running.values():
        if running.job_id == job_id and not running.task.done():
            running.stopped = True
            running.task.cancel()
            count += 1
    return count


def note_cancelled(workflow_ids: list[str]) -> None:
    """Remember items this process is cancelling (a Stop).

    One that starts here all the same (dequeued just before its cancel) grades nothing.
    """
    _cancelled.update(workflow_ids)


def rejoin() -> None:
    """Take part again after `leave` (a new launch of the engine in this process)."""
    _leaving[0] = False


async def leave(timeout_s: float = 30.0) -> int:
    """Cancel every grading running here, leaving its item's workflow for recovery.

    Items dequeued from now on start nothing. Returns how many were still running when
    ``timeout_s`` ran out.
    """
    _leaving[0] = True
    for running in list(_running.values()):
        running.stopped = True
        running.task.cancel()
    deadline = time.monotonic() + timeout_s
    while _running and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return len(_running)


async def _context(store: Store, job_id: str) -> RegradeContext:
    context = _contexts.get(job_id)
    if context is None:
        from rubric_core.http_retry import SharedBackoff
        from rubric_core.lab.grading import load_examples, prepare, regrade_models

        job = await store.acall(store.get_regrade_job, job_id)
        if job is None:
            msg = f"no re-grade {job_id!r}: deleted while queued?"
            raise KeyError(msg)
        models = regrade_models(SharedBackoff())
        configs = [prepare(config, models) for config in job.configurations]
        await load_examples(store, job, configs)
        context = _contexts.setdefault(job_id, RegradeContext(job=job, configs=configs))
        context.idle.set()
    return context


async def _watch(store: Store) -> None:
    """Cancel the gradings of items cancelled elsewhere (Stop); touch the re-grades graded."""
    from rubric_core.session import HEARTBEAT_S

    touched: dict[str, float] = {}
    while _running:
        await asyncio.sleep(CANCEL_POLL_S)
        ids = list(_running)
        if not ids:
            break
        with contextlib.suppress(Exception):  # a busy database: the next round asks again
            for status in await DBOS.list_workflows_async(
                    workflow_ids=ids, status="CANCELLED", load_input=False, load_output=False):
                if (running := _running.get(status.workflow_id)) is not None:
                    running.stopped = True
                    running.task.cancel()
        now = time.monotonic()
        for job_id in {r.job_id for r in _running.values()}:
            if now - touched.get(job_id, 0.0) >= HEARTBEAT_S:
                touched[job_id] = now
                with contextlib.suppress(Exception):  # the next round touches it again
                    await store.acall(store.touch_regrade, job_id)
    _watcher.clear()


def _ensure_watcher(store: Store) -> None:
    if not _watcher or _watcher[0].done():
        _watcher.clear()
        loop = asyncio.get_running_loop()
        # An empty context: the watcher must not run as a step of the workflow that starts it.
        _watcher.append(contextvars.Context().run(loop.create_task, _watch(store)))


async def _grade_item(store: Store, context: RegradeContext, config_index: int,
                      item_id: str) -> int:
    """Grade the item's repeats not recorded yet, recording each; how many were graded."""
    from rubric_core.lab.grading import grade

    job = context.job
    prepared = context.configs[config_index]
    [item] = await store.acall(store.answer_items, job.set_name, job.set_version, ids=[item_id])
    recorded = await store.acall(store.graded_keys, job.job_id, [item_id])
    graded = 0
    for repeat in range(prepared.config.grader_repeats):
        if (config_index, item_id, repeat) in recorded:
            continue
        result = await grade(prepared, config_index, item, repeat)
        written = await store.acall(store.record_regrade_result, job.job_id, result)
        graded += 1
        if context.on_graded is not None:
            context.on_graded(result, written)
    return graded


@DBOS.workflow(name=ITEM_WORKFLOW)
async def item_workflow(job_id: str, config_index: int, item_id: str) -> dict[str, Any]:
    """Grade one answer's repeats under one configuration here (see the module docstring).

    Args:
        job_id: The re-grade.
        config_index: The configuration.
        item_id: The answer.

    Returns:
        ``graded`` (gradings made here) and ``stopped`` (cancelled before the last).

    """
    from rubric_core.engine.launch import current_engine

    engine = current_engine()
    if engine is None:  # pragma: no cover - DBOS runs workflows only once launched
        msg = "the queue engine is not launched in this process"
        raise RuntimeError(msg)
    own_id = DBOS.workflow_id or ""
    if own_id in _cancelled:  # dequeued just before this process's Stop cancelled it
        _cancelled.discard(own_id)
        return {"graded": 0, "stopped": True}
    if _leaving[0]:
        await asyncio.Event().wait()  # left PENDING here: recovery hands it on
    store = engine.store
    context = await _context(store, job_id)
    if context.stopping:
        return {"graded": 0, "stopped": True}
    loop = asyncio.get_running_loop()
    # An empty context: the grading is not a step of this workflow (it makes no DBOS call).
    task = contextvars.Context().run(
        loop.create_task, _grade_item(store, context, int(config_index), item_id))
    running = _running[own_id] = _Running(job_id, task)
    _ensure_watcher(store)
    context.running += 1
    context.idle.clear()
    graded, failure = 0, None
    try:
        graded = await asyncio.shield(task)
    except asyncio.CancelledError:
        if not running.stopped:  # this workflow itself was cancelled (the engine stopping)
            task.cancel()
            raise
    except Exception as exc:  # a lost database: said to the driver, raised to DBOS
        failure = exc
    finally:
        _running.pop(own_id, None)
        context.running -= 1
        if context.running == 0:
            context.idle.set()
    if failure is not None:
        if context.on_failure is not None:
            context.on_failure(failure)
        raise failure
    if _leaving[0]:
        # Never completes: the workflow stays PENDING on this executor, which recovery hands
        # to another process once this one has exited (`rubric_core.engine.worker`).
        await asyncio.Event().wait()
    return {"graded": graded, "stopped": running.stopped}


__all__ = ["CANCEL_POLL_S", "ITEM_ID_PREFIX", "ITEM_WORKFLOW", "RegradeContext", "attach",
           "detach", "item_workflow", "leave", "note_cancelled", "rejoin", "stop_here"]
