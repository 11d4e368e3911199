"""Runs on an event loop: `arun_rubric`, `session.astart`/`aresume`, `Store.acall`, and the
savers' async methods (what every experiment cell goes through)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import TYPE_CHECKING, Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from scripted import ScriptedChatModel, verdict

from rubric_core import session
from rubric_core.runner import RunSpec, arun_rubric, run_rubric
from rubric_core.settings import RunSettings

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from rubric_core.store import Store

RUBRIC = "- c1\n- c2"
FAIL = verdict("needs_revision", "c2 is missing", ["c1", ("c2", "add c2")])
PASS = verdict("satisfied", "all good", ["c1", "c2"])


def quiet_spec(worker: list[Any], grader: list[Any]) -> RunSpec:
    return RunSpec(prompt="write it", rubric=RUBRIC, watch_worker=False,
                   worker=ScriptedChatModel(replies=list(worker), default="another draft"),
                   grader=ScriptedChatModel(replies=list(grader)))


async def collect(events: AsyncIterator[Any]) -> list[Any]:
    return [event async for event in events]


def verdicts(final: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(e["iteration"], e["status"], e["answer"], e["criteria"])
            for e in final["evaluations"]]


@pytest.fixture(params=["memory", "store"])
def saver(request: pytest.FixtureRequest, store: Store) -> Any:
    """LangGraph's in-memory saver, or the store's own (SQLite, then PostgreSQL)."""
    return InMemorySaver() if request.param == "memory" else store.saver()


# --------------------------------------------------------------------------- arun_rubric


def test_an_async_run_gives_what_the_sync_run_gives(saver: Any) -> None:
    sync = list(run_rubric(quiet_spec(["d1", "d2"], [FAIL, PASS]), checkpointer=saver,
                           thread_id="sync"))
    run = quiet_spec(["d1", "d2"], [FAIL, PASS])
    events = asyncio.run(collect(arun_rubric(run, checkpointer=saver, thread_id="async")))
    assert [e["type"] for e in events] == [e["type"] for e in sync] == [
        "evaluation_started", "evaluation_finished"] * 2 + ["run_finished"]
    assert events[-1]["status"] == "satisfied" and events[-1]["answer"] == "d2"
    assert verdicts(events[-1]) == verdicts(sync[-1])
    assert events[-1]["thread_id"] == "async"


def test_a_stopped_async_run_resumes_without_redoing_work(saver: Any) -> None:
    run = quiet_spec(["d1", "d2"], [FAIL, PASS])
    events: list[Any] = []

    async def consume() -> None:
        def verdict_out() -> bool:
            return any(e["type"] == "evaluation_finished" for e in events)

        async for event in arun_rubric(run, checkpointer=saver, thread_id="cut",
                                       stop=verdict_out):
            events.append(event)

    asyncio.run(consume())
    # Stop was asked once the first verdict was out (the step that gave it still ends and is
    # kept); no RunFinished: the run did not end.
    assert [e["type"] for e in events] == ["evaluation_started", "evaluation_finished"]
    assert isinstance(run.worker, ScriptedChatModel) and isinstance(run.grader, ScriptedChatModel)
    assert len(run.worker.calls) == 1 and len(run.grader.calls) == 1
    events = asyncio.run(collect(arun_rubric(run, checkpointer=saver, thread_id="cut",
                                             resume=True)))
    final = events[-1]
    assert final["status"] == "satisfied" and final["answer"] == "d2"
    assert [e["result"] for e in final["evaluations"]] == ["needs_revision", "satisfied"]
    assert len(run.worker.calls) == 2 and len(run.grader.calls) == 2  # nothing done twice


def test_stop_is_asked_between_steps_never_in_the_middle_of_one(saver: Any) -> None:
    run = quiet_spec(["d1", "d2"], [FAIL, PASS])
    asked: list[tuple[int, int]] = []

    def stop() -> bool:
        assert isinstance(run.worker, ScriptedChatModel)
        assert isinstance(run.grader, ScriptedChatModel)
        asked.append((len(run.worker.calls), len(run.grader.calls)))
        return len(asked) == 3  # after the third step

    list(asyncio.run(collect(arun_rubric(run, checkpointer=saver, thread_id="steps", stop=stop))))
    # Steps: before_agent, model (worker answers), after_agent (grader judges): stop comes
    # after each has ended, with its calls made.
    assert asked == [(0, 0), (1, 0), (1, 1)]


def test_a_worker_that_raises_ends_the_async_run_in_error(saver: Any) -> None:
    run = quiet_spec(["d1", ConnectionError("worker server went away")], [FAIL, PASS])
    final = asyncio.run(collect(arun_rubric(run, checkpointer=saver, thread_id="boom")))[-1]
    assert final["status"] == "error"
    assert final["error"] == "ConnectionError: worker server went away"
    assert [e["result"] for e in final["evaluations"]] == ["needs_revision"]
    final = asyncio.run(collect(arun_rubric(run, checkpointer=saver, thread_id="boom",
                                            resume=True)))[-1]
    assert final["status"] == "satisfied" and final["answer"] == "another draft"


def test_an_async_run_refuses_to_stream_tokens() -> None:
    run = dataclasses.replace(quiet_spec(["d1"], [PASS]), watch_worker=True)
    with pytest.raises(ValueError, match="watch_worker"):
        asyncio.run(collect(arun_rubric(run)))


# --------------------------------------------------------------------------- sessions


def _settings() -> RunSettings:
    return RunSettings(prompt="write it", rubric=RUBRIC, worker_model="w", grader_model="g",
                       max_iterations=3)


def _models(worker: ScriptedChatModel, grader: ScriptedChatModel) -> session.ModelResolver:
    def resolve(model: str, role: session.Role, base_url: str | None) -> Any:
        del model, base_url
        return worker if role == "worker" else grader

    return resolve


def test_a_stopped_async_session_is_recorded_interrupted_then_resumed(store: Store) -> None:
    worker = ScriptedChatModel(replies=["d1", "d2"])
    grader = ScriptedChatModel(replies=[FAIL, PASS])
    models = _models(worker, grader)
    stop = threading.Event()

    async def start_then_stop() -> tuple[str, list[Any]]:
        run = await session.astart(store, _settings(), models=models, thread_id="t-async",
                                   stop=stop.is_set)
        events = []
        async for event in run:
            events.append(event)
            assert session.is_active(run.run_id)
            if event["type"] == "evaluation_finished":
                stop.set()
        return run.run_id, events

    run_id, events = asyncio.run(start_then_stop())
    assert events[-1]["type"] == "evaluation_finished"
    record = store.get_run(run_id)
    assert record is not None and record.status == "interrupted"
    assert not session.is_active(run_id)  # the registry was left, the heartbeat stopped
    assert [e["iteration"] for e in store.evaluations(run_id)] == [0]

    async def resume() -> list[Any]:
        return await collect(await session.aresume(store, run_id, models=models))

    events = asyncio.run(resume())
    assert events[-1]["status"] == "satisfied"
    record = store.get_run(run_id)
    assert record is not None and record.status == "satisfied"
    assert [e["result"] for e in store.evaluations(run_id)] == ["needs_revision", "satisfied"]
    assert len(worker.calls) == 2 and len(grader.calls) == 2  # nothing done twice


def test_a_cancelled_async_session_is_recorded_interrupted(store: Store) -> None:
    worker = ScriptedChatModel(replies=["d1", "d2"])
    models = _models(worker, ScriptedChatModel(replies=[FAIL, PASS]))

    async def start_then_cancel() -> str:
        run = await session.astart(store, _settings(), models=models, thread_id="t-cancel")
        seen = asyncio.Event()

        async def consume() -> None:
            async for event in run:
                if event["type"] == "evaluation_finished":
                    seen.set()
                    await asyncio.sleep(3600)

        task = asyncio.create_task(consume())
        await seen.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await run.aclose()
        return run.run_id

    run_id = asyncio.run(start_then_cancel())
    record = store.get_run(run_id)
    assert record is not None and record.status == "interrupted"
    assert not session.is_active(run_id)
    events = asyncio.run(collect_resumed(store, run_id, models))
    assert events[-1]["status"] == "satisfied"  # the thread goes on (a step may be redone)


async def collect_resumed(store: Store, run_id: str, models: session.ModelResolver
                          ) -> list[Any]:
    return await collect(await session.aresume(store, run_id, models=models))


def test_an_async_session_refuses_a_run_that_is_being_recorded(store: Store) -> None:
    record = store.create_run(_settings(), thread_id="busy")  # 'running', fresh heartbeat
    with pytest.raises(RuntimeError, match="still running"):
        asyncio.run(session.aresume(store, record.run_id))
    with pytest.raises(KeyError):
        asyncio.run(session.aresume(store, "no-such-run"))


# --------------------------------------------------------------------------- Store.acall


def test_store_calls_run_on_the_loop_for_sqlite_and_in_a_thread_for_postgresql(
        store: Store) -> None:
    def where() -> int:
        return threading.get_ident()

    async def ask() -> tuple[int, int]:
        return threading.get_ident(), await store.acall(where)

    loop_thread, call_thread = asyncio.run(ask())
    assert (loop_thread == call_thread) == (store.backend == "sqlite")


def test_a_cancelled_store_call_on_postgresql_still_ends_before_the_cancel(pg_url: str) -> None:
    from rubric_core.store import Store

    ended = threading.Event()
    release = threading.Event()

    def slow_write() -> None:
        release.wait(5)
        ended.set()

    async def cancel_midway() -> bool:
        with Store(pg_url) as pg:
            task = asyncio.create_task(pg.acall(slow_write))
            await asyncio.sleep(0.05)
            task.cancel()
            await asyncio.sleep(0.05)
            assert not task.done()  # waits for the write instead of abandoning it
            release.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            return ended.is_set()

    assert asyncio.run(cancel_midway())
