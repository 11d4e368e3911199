"""DBOS Transact behind one module: the only one of `rubric_core` that imports ``dbos``.

The rest of the engine calls the functions here. Public DBOS API is wrapped thinly; every
private name, table or data layout of DBOS 3.4.0 (pinned) that we rely on is used only here,
each pinned by a test named after the assumption (``tests/test_engine_dbos.py``), so an upgrade
of DBOS fails there first. Why each is needed: ``docs/engine.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import TYPE_CHECKING, Any

from dbos import (
    DBOS,
    DBOSClient,
    DBOSPortableJSONSerializer,
    SetEnqueueOptions,
    SetWorkflowID,
)
from dbos import error as dbos_error

from rubric_core.library_logs import CurrentStderr, library_logs_routed

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    import sqlalchemy as sa

ACTIVE = ("ENQUEUED", "PENDING", "DELAYED")
"""Statuses of a workflow that has not ended."""
QUEUED = ("ENQUEUED", "DELAYED")
"""Statuses of a workflow waiting in its queue."""
RUNNING = "PENDING"
"""The status of a workflow an executor runs (or ran, if it stopped)."""
DONE = "SUCCESS"
"""The status of a workflow that completed."""
CANCELLED = "CANCELLED"
"""The status of a cancelled workflow."""

WORKFLOW_TABLE = "workflow_status"
"""DBOS's table of workflows (the one whose presence says a database has engine tables)."""

CONSOLE_HANDLER = "__dbos_console_log_handler__"
"""The name of DBOS's console log handler, which it adds only to a ``dbos`` logger with none."""

QUEUE_THREAD_PREFIX = "queue-worker-"
"""How DBOS names the thread that polls a queue (``queue-worker-NAME``)."""

AwaitedCancelled = dbos_error.DBOSAwaitedWorkflowCancelledError
"""Raised by a handle's result when its workflow was cancelled."""

workflow = DBOS.workflow
"""DBOS's workflow decorator."""

_patched: list[tuple[Any, Any]] = []  # (DBOS's launch module, its own queue_thread), once


# -- launch and shutdown -----------------------------------------------------------------------

def config(*, name: str, url: str, version: str, executor_id: str, schema: str,
           engine: sa.Engine | None, connect_args: dict[str, Any] | None) -> dict[str, Any]:
    """DBOS's configuration: pinned version, portable JSON, no OTLP (module docstring)."""
    conf: dict[str, Any] = {
        "name": name, "system_database_url": url, "application_version": version,
        "executor_id": executor_id, "log_level": "WARNING",
        "serializer": DBOSPortableJSONSerializer(), "dbos_system_schema": schema,
        "enable_otlp": False,
    }
    if engine is not None:
        conf["system_database_engine"] = engine
    if connect_args is not None:
        conf["db_engine_kwargs"] = {"connect_args": connect_args}
    return conf


def launch(conf: dict[str, Any], *, listening: list[str] | None,
           wakeable: Callable[[threading.Event, Any], Any] | None) -> None:
    """Construct and launch DBOS (on the running loop, which DBOS adopts).

    ``listening``: the very list DBOS's queue thread rereads for the queues it polls (None:
    every queue). ``wakeable``: makes the object DBOS's queue threads sleep on from its stop
    event and its set of active workflows (`install_queue_thread`); None: DBOS's own.
    """
    _console_to_current_stderr()
    instance = DBOS(config=conf)  # type: ignore[arg-type]
    if wakeable is not None and not install_queue_thread(instance, wakeable):
        wakeable = None
    if wakeable is None:
        restore_queue_thread()
    if listening is not None:
        DBOS.listen_queues([])
        instance._listening_queues = listening
    try:
        DBOS.launch()
    except BaseException:
        DBOS.destroy()  # a half-launched singleton could not be launched again
        raise
    _give_up_lost_writes_at_exit()


def destroy() -> None:
    """Stop DBOS without waiting for its workflows, and give the loop its own thread pool back."""
    stop_retrying_lost_writes()
    DBOS.destroy(workflow_completion_timeout_sec=0)


def stop_retrying_lost_writes() -> None:
    """Make DBOS's writes retrying against a lost database give up at their next try.

    DBOS retries a lost connection without end on its pool's threads, which the interpreter
    joins at exit; its client's ``retry_connection_errors`` is read per write.
    """
    from dbos import _dbos

    sys_db = getattr(_dbos._dbos_global_instance, "_sys_db_field", None)
    if sys_db is not None:
        sys_db._retry_connection_errors = False


_at_exit: list[bool] = []


def _give_up_lost_writes_at_exit() -> None:
    """`stop_retrying_lost_writes` before the interpreter joins threads (once a process)."""
    if _at_exit:
        return
    _at_exit.append(True)
    register = getattr(threading, "_register_atexit", None)  # what concurrent.futures uses
    if register is not None:
        with contextlib.suppress(RuntimeError):  # the interpreter is exiting already
            register(stop_retrying_lost_writes)


class _CurrentStderr(CurrentStderr):
    """DBOS's console handler writing to the ``sys.stderr`` of the moment (not the first's)."""

    def __init__(self) -> None:
        super().__init__()
        self.name = CONSOLE_HANDLER


def _console_to_current_stderr() -> None:
    """Put `_CurrentStderr` in place of DBOS's console handler; WARNING and up, no propagation.

    A command that chose where library records go (`rubric_core.library_logs`: ``--verbose``,
    ``--log-file``) keeps its choice.
    """
    dbos_logger = logging.getLogger("dbos")
    dbos_logger.setLevel(logging.WARNING)
    for handler in list(dbos_logger.handlers):
        if handler.name == CONSOLE_HANDLER and not isinstance(handler, _CurrentStderr):
            dbos_logger.removeHandler(handler)
    if library_logs_routed():  # a command chose where they go: a file, stderr or nowhere
        dbos_logger.propagate = False
        return
    if not any(isinstance(h, _CurrentStderr) for h in dbos_logger.handlers):
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s (%(name)s) %(message)s",
                                               datefmt="%H:%M:%S"))
        dbos_logger.addHandler(handler)
    dbos_logger.propagate = False


# -- the queue thread's sleep (wakes) ----------------------------------------------------------

def queue_thread_hooks() -> tuple[Any, Any] | None:
    """DBOS's module that starts the queue thread and its ``queue_thread``; None if not there."""
    try:
        from dbos import _dbos
        from dbos._core import ActiveWorkflowById
    except ImportError:
        return None
    original = _patched[0][1] if _patched else getattr(_dbos, "queue_thread", None)
    if not callable(original) or not all(callable(getattr(ActiveWorkflowById, name, None))
                                         for name in ("_remove", "count_for_queue")):
        return None
    return _dbos, original


def install_queue_thread(instance: Any, wakeable: Callable[[threading.Event, Any], Any]) -> bool:
    """Have ``instance`` (before its launch) sleep its queue threads on ``wakeable(stop, active)``.

    DBOS starts its queue thread as ``queue_thread(stop_event, dbos)`` and stops its threads by
    setting the events it listed in ``background_thread_stop_events``; its set of active
    workflows releases an ended workflow's queue slot in ``_remove(key, bucket)``, a bucket
    being ``(queue, partition)``. The object made replaces the stop event in that list; its
    ``wake(queue)`` is called when a slot of ``queue`` frees here. Whether it could.
    """
    hooks = queue_thread_hooks()
    active = getattr(instance, "_active_workflows_set", None)
    stops = getattr(instance, "background_thread_stop_events", None)
    if hooks is None or active is None or not isinstance(stops, list):
        return False
    module, original = hooks
    made: list[Any] = []

    def queue_thread(stop_event: threading.Event, dbos: Any) -> None:
        made.append(wakeable(stop_event, dbos._active_workflows_set))
        events = dbos.background_thread_stop_events
        events[:] = [made[-1] if e is stop_event else e for e in events]
        original(made[-1], dbos)

    if not _patched:
        _patched.append((module, original))
    module.queue_thread = queue_thread
    remove = active._remove

    def released(key: str, bucket: Any) -> None:
        remove(key, bucket)
        if made and bucket is not None:
            made[-1].wake(bucket[0])

    active._remove = released
    return True


def restore_queue_thread() -> None:
    """DBOS's own queue thread for the next launch (after `install_queue_thread`)."""
    if _patched:
        module, original = _patched[0]
        module.queue_thread = original


def count_for_queue(active: Any, queue: str) -> int:
    """Workflows of ``queue`` running in this process, from DBOS's set of active workflows."""
    return int(active.count_for_queue(queue))


def running_here() -> set[str]:
    """The IDs of the workflows running in this process now."""
    from dbos._dbos import _get_dbos_instance

    return set(_get_dbos_instance()._active_workflows_set.activeList())


def listen_also(listening: list[str], queue: str) -> None:
    """Add ``queue`` to the list DBOS's queue thread rereads every second (`launch`)."""
    if queue not in listening:
        listening.append(queue)


# -- workflows and queues ----------------------------------------------------------------------

def current_workflow_id() -> str:
    """The ID of the workflow whose body runs now ("" outside one)."""
    return DBOS.workflow_id or ""


async def list_workflows(**query: Any) -> list[Any]:
    """DBOS's ``list_workflows`` (inputs and outputs not loaded unless asked)."""
    query.setdefault("load_input", False)
    query.setdefault("load_output", False)
    return list(await DBOS.list_workflows_async(**query))


def list_workflows_sync(**query: Any) -> list[Any]:
    """`list_workflows` from a thread of ours (not the loop)."""
    query.setdefault("load_input", False)
    query.setdefault("load_output", False)
    return list(DBOS.list_workflows(**query))


def args_of(workflow: Any) -> Sequence[Any]:
    """A listed workflow's positional inputs (portable JSON: ``{"args": [...], "kwargs": ...}``)."""
    return (workflow.input or {}).get("args") or ()


def epoch_ms(workflow: Any) -> int:
    """When a workflow was dequeued (else last updated), in ms by the database's clock."""
    return int(workflow.dequeued_at or workflow.updated_at or 0)


async def cancel(ids: list[str], *, children: bool = False) -> None:
    """Cancel workflows (and, with ``children``, the workflows they started)."""
    if ids:
        await DBOS.cancel_workflows_async(ids, cancel_children=children)


def cancel_sync(ids: list[str], *, children: bool = False) -> None:
    """`cancel` from a thread of ours."""
    if ids:
        DBOS.cancel_workflows(ids, cancel_children=children)


def set_attributes(workflow_id: str, attributes: dict[str, Any]) -> None:
    """Merge ``attributes`` into a workflow's (from a thread of ours)."""
    DBOS.update_workflow_attributes(workflow_id, attributes, merge=True)


async def register_queue(name: str, *, concurrency: int | None,
                         rate: tuple[int, float] | None = None,
                         partition_concurrency: int | None = None,
                         partition_rate: tuple[int, float] | None = None,
                         poll_s: float) -> None:
    """Create or update a queue with its limits (the latest registration's hold)."""
    def limiter(r: tuple[int, float] | None) -> Any:
        return None if r is None else {"limit": r[0], "period": r[1]}

    await DBOS.register_queue_async(
        name, global_concurrency=concurrency, limiter=limiter(rate),
        partition_concurrency=partition_concurrency, partition_limiter=limiter(partition_rate),
        polling_interval_sec=poll_s, on_conflict="always_update")


async def delete_queue(name: str) -> None:
    """Delete a queue (no process polls it any more)."""
    await DBOS.delete_queue_async(name)


async def queue_names() -> list[str]:
    """Every queue of the application."""
    return [q.name for q in await DBOS.list_queues_async()]


async def queue(name: str, what: str) -> Any:
    """The registered queue ``name`` (``what``: whose, for the error)."""
    found = await DBOS.retrieve_queue_async(name)
    if found is None:
        msg = f"{what} has no queue: register it first"
        raise KeyError(msg)
    return found


async def enqueue(queue: Any, fn: Any, *args: Any, workflow_id: str,
                  partition: str | None = None) -> Any:
    """Queue ``fn(*args)`` on `queue`'s under ``workflow_id`` (a no-op when that ID exists)."""
    with SetWorkflowID(workflow_id), SetEnqueueOptions(queue_partition_key=partition):
        return await queue.enqueue_async(fn, *args)


# -- recovery ----------------------------------------------------------------------------------

async def recover_executors(executors: list[str]) -> int:
    """Hand back to their queues the ``PENDING`` workflows of stopped executors; how many.

    Idempotent: a workflow is re-queued only while one of those executors still holds it.
    """
    return len(await asyncio.to_thread(DBOS._recover_pending_workflows, executors))


def recover_executors_sync(executors: list[str]) -> None:
    """`recover_executors` from a thread of ours."""
    DBOS._recover_pending_workflows(executors)


async def requeue_own(workflow_id: str, me: str) -> bool:
    """Hand one of this executor's ``PENDING`` workflows back to its queue; whether it was."""
    from dbos._dbos import _get_dbos_instance
    from dbos._utils import INTERNAL_QUEUE_NAME

    sys_db = _get_dbos_instance()._sys_db
    return bool(await asyncio.to_thread(sys_db.reenqueue_for_recovery, workflow_id, [me],
                                        INTERNAL_QUEUE_NAME))


# -- reading without launching -----------------------------------------------------------------

@contextlib.contextmanager
def client(engine: sa.Engine, schema: str) -> Iterator[DBOSClient]:
    """DBOS's client on an engine's tables (never migrates), closed afterwards."""
    opened = DBOSClient(system_database_engine=engine, dbos_system_schema=schema,
                        serializer=DBOSPortableJSONSerializer(), retry_connection_errors=False)
    try:
        yield opened
    finally:
        opened.destroy()


__all__ = ["ACTIVE", "CANCELLED", "CONSOLE_HANDLER", "DONE", "QUEUED", "QUEUE_THREAD_PREFIX",
           "RUNNING", "WORKFLOW_TABLE", "AwaitedCancelled", "args_of", "cancel", "cancel_sync",
           "client", "config", "count_for_queue", "current_workflow_id", "delete_queue",
           "destroy", "enqueue", "epoch_ms", "install_queue_thread", "launch", "list_workflows",
           "list_workflows_sync", "listen_also", "queue", "queue_names", "queue_thread_hooks",
           "recover_executors", "recover_executors_sync", "register_queue", "requeue_own",
           "restore_queue_thread", "running_here", "set_attributes", "stop_retrying_lost_writes",
           "workflow"]
