"""Every assumption about DBOS that `rubric_core.engine._dbos` relies on, one test each.

DBOS is pinned (``dbos==3.4.0``); an upgrade that changes one of these fails the test named
after it, here, not somewhere in a drill. Real engine on a SQLite file; units are queued on a
queue this process does not listen to (so nothing runs them) unless a test says otherwise.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sqlite3
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from rubric_core.background import work_loop
from rubric_core.engine import _dbos, queues
from rubric_core.engine.launch import current_engine, engine_database, launch_engine, listen
from rubric_core.engine.runtime import ITEM_WORKFLOW, item_workflow
from rubric_core.store import Store

if TYPE_CHECKING:
    from collections.abc import Coroutine, Iterator
    from pathlib import Path

    from rubric_core.engine.runtime import Engine


def _on_loop(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, work_loop()).result(timeout=60)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    """The engine launched on a fresh SQLite store, taking units from no queue."""
    with Store(tmp_path / "db.sqlite3") as store:
        yield launch_engine(store, every_queue=False)


def _queued(engine: Engine, job: str, count: int = 1) -> list[str]:
    """``count`` items of re-grade ``job`` queued (on a queue nobody listens to); their IDs."""
    async def queue_them() -> None:
        await queues.register_regrade_queue(job, concurrency=1)
        await queues.enqueue_items(job, [(0, f"a{i}") for i in range(count)], {})

    _on_loop(queue_them())
    return [queues.item_workflow_id(job, 0, f"a{i}", 1) for i in range(count)]


def _set(engine: Engine, workflow_id: str, **columns: Any) -> None:
    """Change a workflow's row in the engine's file as another process would."""
    system = engine_database(engine.location).removeprefix("sqlite:///")
    names = ", ".join(f"{name} = ?" for name in columns)
    with sqlite3.connect(system) as conn:
        assert conn.execute(f"UPDATE workflow_status SET {names} WHERE workflow_uuid = ?",
                            (*columns.values(), workflow_id)).rowcount == 1


def _status(workflow_id: str) -> Any:
    [found] = _on_loop(_dbos.list_workflows(workflow_ids=[workflow_id], load_input=True))
    return found


def test_the_queue_thread_is_started_as_queue_thread_of_stop_event_and_dbos() -> None:
    hooks = _dbos.queue_thread_hooks()
    assert hooks is not None, "dbos._dbos.queue_thread or ActiveWorkflowById's hooks are gone"
    assert list(inspect.signature(hooks[1]).parameters) == ["stop_event", "dbos"]


def test_dbos_stops_its_threads_through_the_events_it_listed(engine: Engine) -> None:
    """The replaced stop event is the one DBOS sets when it is destroyed."""
    from rubric_core.engine.launch import shutdown_engine

    wakeable = engine.wakeable
    assert wakeable is not None, "the queue thread was not replaced"
    assert not wakeable.is_set()
    shutdown_engine(settle_s=0)
    assert wakeable.is_set()


def test_a_queues_worker_thread_is_named_queue_worker_and_its_name(engine: Engine) -> None:
    name = queues.regrade_queue_name("named")
    _on_loop(queues.register_regrade_queue("named", concurrency=1))
    listen(engine, name)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if any(t.name == _dbos.QUEUE_THREAD_PREFIX + name for t in threading.enumerate()):
            return
        time.sleep(0.05)
    pytest.fail("no thread named queue-worker-QUEUE")


def test_the_active_set_releases_a_slot_as_remove_of_key_and_queue_bucket() -> None:
    from dbos._core import ActiveWorkflowById

    active = ActiveWorkflowById()
    released: list[Any] = []
    remove = active._remove
    active._remove = lambda key, bucket: (released.append(bucket), remove(key, bucket))  # type: ignore[method-assign]
    entries = [active.add("w1", "q", "p1"), active.add("w2", "q", "p2"), active.add("w3")]
    assert _dbos.count_for_queue(active, "q") == 2  # over every partition
    entries[0].release()
    assert released == [("q", "p1")]
    assert _dbos.count_for_queue(active, "q") == 1
    assert "w2" in active.activeList()


def test_the_listening_list_is_the_one_dbos_rereads(engine: Engine) -> None:
    from dbos._dbos import _get_dbos_instance

    assert _get_dbos_instance()._listening_queues is engine.listening


def test_enqueuing_an_id_that_exists_is_a_no_op(engine: Engine) -> None:
    [wid] = _queued(engine, "twice")

    async def again() -> None:
        queue = await _dbos.queue(queues.regrade_queue_name("twice"), "twice")
        await _dbos.enqueue(queue, item_workflow, "twice", 0, "other", workflow_id=wid)

    _on_loop(again())
    assert list(_dbos.args_of(_status(wid))) == ["twice", 0, "a0"]  # the first inputs stand


def test_inputs_are_listed_as_args_in_portable_json(engine: Engine) -> None:
    [wid] = _queued(engine, "inputs")
    found = _status(wid)
    assert found.name == ITEM_WORKFLOW
    assert list(_dbos.args_of(found)) == ["inputs", 0, "a0"]


def test_a_dequeue_is_stamped_in_milliseconds_by_the_database(engine: Engine) -> None:
    import rubric_core.lab.grading  # noqa: F401 - the item body (it fails: no such re-grade)

    name = queues.regrade_queue_name("stamped")
    [wid] = _queued(engine, "stamped")
    before = time.time() * 1000
    listen(engine, name)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _status(wid).status in _dbos.QUEUED:
        time.sleep(0.05)
    stamped = _dbos.epoch_ms(_status(wid))
    assert before - 60_000 < stamped < time.time() * 1000 + 60_000


def test_recovering_an_executor_requeues_what_it_holds_once(engine: Engine) -> None:
    [wid] = _queued(engine, "dead")
    _set(engine, wid, status="PENDING", executor_id="dead-executor")
    assert _on_loop(_dbos.recover_executors(["dead-executor"])) == 1
    assert _status(wid).status == "ENQUEUED"
    assert _on_loop(_dbos.recover_executors(["dead-executor"])) == 0  # it holds it no more


def test_an_own_pending_workflow_can_be_handed_back(engine: Engine) -> None:
    [wid] = _queued(engine, "own")
    _set(engine, wid, status="PENDING", executor_id=engine.executor_id)
    assert wid not in _dbos.running_here()
    assert _on_loop(_dbos.requeue_own(wid, engine.executor_id)) is True
    assert _status(wid).status == "ENQUEUED"
    assert _on_loop(_dbos.requeue_own(wid, engine.executor_id)) is False


def test_a_cancelled_workflows_result_raises_awaited_cancelled(engine: Engine) -> None:
    _queued(engine, "cancelled")

    async def cancel_and_wait() -> None:
        queue = await _dbos.queue(queues.regrade_queue_name("cancelled"), "cancelled")
        handle = await _dbos.enqueue(queue, item_workflow, "cancelled", 0, "b",
                                     workflow_id="rubric-item:cancelled:0:1:b")
        await _dbos.cancel([handle.get_workflow_id()])
        with pytest.raises(_dbos.AwaitedCancelled):
            await handle.get_result()

    _on_loop(cancel_and_wait())


def test_lost_writes_stop_retrying_through_the_system_databases_flag(engine: Engine) -> None:
    from dbos import _dbos as dbos_module

    sys_db = getattr(dbos_module._dbos_global_instance, "_sys_db_field", None)
    assert sys_db is not None and sys_db._retry_connection_errors is True
    _dbos.stop_retrying_lost_writes()
    assert sys_db._retry_connection_errors is False


def test_dbos_keeps_one_console_handler_by_its_name(engine: Engine) -> None:
    handlers = [h for h in logging.getLogger("dbos").handlers
                if h.name == _dbos.CONSOLE_HANDLER]
    assert len(handlers) == 1 and type(handlers[0]).__name__ == "_CurrentStderr"


def test_the_workflows_table_is_workflow_status(engine: Engine) -> None:
    system = engine_database(engine.location).removeprefix("sqlite:///")
    with sqlite3.connect(system) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert _dbos.WORKFLOW_TABLE in tables


def test_attributes_merge_and_list_with_the_workflow(engine: Engine) -> None:
    [wid] = _queued(engine, "attributes")
    _dbos.set_attributes(wid, {"a": "1"})
    _dbos.set_attributes(wid, {"b": True})
    assert (_status(wid).attributes or {}) == {"a": "1", "b": True}
    assert current_engine() is engine
