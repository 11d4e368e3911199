"""run_rubric: event order, spec validation, stopping and resuming, and worker failures."""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from scripted import ScriptedChatModel, verdict

from rubric_core.rubric import RubricError
from rubric_core.runner import MAX_ITERATIONS_CAP, RunSpec, build_agent, run_rubric

if TYPE_CHECKING:
    from collections.abc import Iterator

RUBRIC = "- c1\n- c2"
FAIL = verdict("needs_revision", "c2 is missing", ["c1", ("c2", "add c2")])
PASS = verdict("satisfied", "all good", ["c1", "c2"])


def spec(worker: list[Any], grader: list[Any], **kwargs: Any) -> RunSpec:
    return RunSpec(
        prompt="write it",
        rubric=RUBRIC,
        worker=ScriptedChatModel(replies=list(worker), default="another draft"),
        grader=ScriptedChatModel(replies=list(grader)),
        **kwargs,
    )


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def thread_values(run: RunSpec, saver: Any, thread: str) -> dict[str, Any]:
    config = {"configurable": {"thread_id": thread}}
    return build_agent(run, saver).get_state(config).values


@pytest.fixture(params=["memory", "sqlite"])
def saver(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    if request.param == "memory":
        yield InMemorySaver()
        return
    conn = sqlite3.connect(tmp_path / "threads.sqlite3", check_same_thread=False)
    try:
        yield SqliteSaver(conn)
    finally:
        conn.close()


# --------------------------------------------------------------------------- events


def test_events_arrive_in_loop_order() -> None:
    events = list(run_rubric(spec(["draft 1", "draft 2"], [FAIL, PASS]), thread_id="t1"))
    collapsed = [t for i, t in enumerate(types(events))
                 if t != "worker_token" or types(events)[i - 1] != "worker_token"]
    assert collapsed == [
        "worker_started", "worker_token", "worker_message",
        "evaluation_started", "evaluation_finished",
    ] * 2 + ["run_finished"]
    workers = [e for e in events if e["type"] in ("worker_started", "worker_message")]
    assert [e["iteration"] for e in workers] == [0, 0, 1, 1]
    assert [e["text"] for e in workers if e["type"] == "worker_message"] == [
        "draft 1", "draft 2"]
    tokens = [e for e in events if e["type"] == "worker_token"]
    assert "".join(t["text"] for t in tokens) == "draft 1draft 2"

    started = [e for e in events if e["type"] == "evaluation_started"]
    finished = [e["evaluation"] for e in events if e["type"] == "evaluation_finished"]
    assert [e["iteration"] for e in started] == [0, 1]
    assert [e["status"] for e in finished] == ["needs_revision", "satisfied"]
    assert {e["grading_run_id"] for e in started} == {e["grading_run_id"] for e in finished}

    final = events[-1]
    assert final["thread_id"] == "t1"
    assert final["status"] == "satisfied" and final["error"] is None
    assert final["answer"] == "draft 2"
    assert final["evaluations"] == finished
    assert final["duration_s"] >= 0


def test_an_unwatched_run_records_the_same_verdicts_without_worker_events() -> None:
    watched = list(run_rubric(spec(["draft 1", "draft 2"], [FAIL, PASS]), thread_id="w"))
    quiet = list(run_rubric(dataclasses.replace(
        spec(["draft 1", "draft 2"], [FAIL, PASS]), watch_worker=False), thread_id="w"))
    assert types(quiet) == ["evaluation_started", "evaluation_finished"] * 2 + ["run_finished"]

    def verdicts(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [(e["iteration"], e["status"], e["answer"], e["criteria"])
                for e in events[-1]["evaluations"]]

    assert verdicts(quiet) == verdicts(watched)
    assert quiet[-1]["status"] == watched[-1]["status"] == "satisfied"
    assert quiet[-1]["answer"] == "draft 2"


def test_closing_an_unwatched_run_leaves_the_thread_resumable(saver: Any) -> None:
    run = dataclasses.replace(spec(["draft 1", "draft 2"], [FAIL, PASS]), watch_worker=False)
    gen = run_rubric(run, checkpointer=saver, thread_id="quiet")
    for event in gen:
        if event["type"] == "evaluation_finished":
            break
    gen.close()  # a Stop: the graph is aborted after the first verdict
    assert isinstance(run.worker, ScriptedChatModel) and len(run.worker.calls) == 1
    final = list(run_rubric(run, checkpointer=saver, thread_id="quiet", resume=True))[-1]
    assert final["status"] == "satisfied" and final["answer"] == "draft 2"
    assert [e["iteration"] for e in final["evaluations"]] == [0, 1]
    assert len(run.worker.calls) == 2 and len(run.grader.calls) == 2


@pytest.mark.parametrize(
    ("grader", "max_iterations", "status"),
    [
        pytest.param([FAIL, FAIL], 2, "max_iterations_reached", id="cap"),
        pytest.param([verdict("failed", "about images", ["c1", ("c2", "n/a")])], 3, "failed",
                     id="failed"),
        pytest.param([RuntimeError("bad key")], 3, "grader_error", id="grader_error"),
    ],
)
def test_run_finished_carries_the_terminal_status(
    grader: list[Any], max_iterations: int, status: str
) -> None:
    final = list(run_rubric(spec(["a1", "a2"], grader, max_iterations=max_iterations)))[-1]
    assert final["status"] == status and final["error"] is None
    assert final["evaluations"][-1]["status"] == status


def test_only_the_current_grading_run_is_reported() -> None:
    saver = InMemorySaver()
    list(run_rubric(spec(["a1"], [PASS]), checkpointer=saver, thread_id="t"))
    final = list(run_rubric(spec(["b1"], [PASS]), checkpointer=saver, thread_id="t"))[-1]
    (ev,) = final["evaluations"]
    assert ev["answer"] == "b1"


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        pytest.param({"prompt": ""}, ValueError, "prompt is empty", id="empty_prompt"),
        pytest.param({"prompt": " \n\t"}, ValueError, "prompt is empty", id="blank_prompt"),
        pytest.param({"rubric": ""}, ValueError, "rubric is empty", id="empty_rubric"),
        pytest.param({"rubric": "\n \n"}, ValueError, "rubric is empty", id="blank_rubric"),
        pytest.param({"rubric": "- c\n" * 262_144}, RubricError, "limit is",
                     id="one_megabyte_rubric"),
        pytest.param({"max_iterations": 0}, ValueError, "between 1 and 50", id="zero_cap"),
        pytest.param({"max_iterations": MAX_ITERATIONS_CAP + 1}, ValueError, "between 1 and 50",
                     id="cap_51"),
        pytest.param({"max_iterations": True}, ValueError, "whole number", id="bool_cap"),
        pytest.param({"max_iterations": 2.0}, ValueError, "whole number", id="float_cap"),
    ],
)
def test_invalid_spec_is_rejected_before_any_model_call(
    changes: dict[str, Any], error: type[Exception], message: str
) -> None:
    run = spec(["a1"], [PASS])
    for name, value in changes.items():
        setattr(run, name, value)
    with pytest.raises(error, match=message):
        run.validate()
    with pytest.raises(error, match=message):
        next(run_rubric(run))
    assert isinstance(run.worker, ScriptedChatModel) and not run.worker.calls
    assert isinstance(run.grader, ScriptedChatModel) and not run.grader.calls


def test_cap_of_fifty_is_accepted() -> None:
    spec(["a1"], [PASS], max_iterations=MAX_ITERATIONS_CAP).validate()


# --------------------------------------------------------------------------- stop and resume


@pytest.mark.parametrize("stop_after", ["worker_message", "evaluation_finished"])
def test_closing_the_generator_leaves_the_thread_resumable(saver: Any, stop_after: str) -> None:
    run = spec(["draft 1", "draft 2"], [FAIL, PASS])
    gen = run_rubric(run, checkpointer=saver, thread_id="stop")
    for event in gen:
        if event["type"] == stop_after:
            break
    gen.close()  # what a Stop button does
    assert isinstance(run.worker, ScriptedChatModel) and isinstance(run.grader, ScriptedChatModel)

    events = list(run_rubric(run, checkpointer=saver, thread_id="stop", resume=True))
    final = events[-1]
    assert final["status"] == "satisfied" and final["answer"] == "draft 2"
    assert [e["iteration"] for e in final["evaluations"]] == [0, 1]
    assert [e["answer"] for e in final["evaluations"]] == ["draft 1", "draft 2"]
    assert len({e["grading_run_id"] for e in final["evaluations"]}) == 1
    # Work finished before the stop is kept, not redone: one call per answer and per verdict.
    assert len(run.worker.calls) == 2 and len(run.grader.calls) == 2
    assert "add c2" in str(run.worker.calls[1][-1].content)
    assert [e["iteration"] for e in events if e["type"] == "worker_started"] == [1]
    values = thread_values(run, saver, "stop")
    assert [m.content for m in values["messages"] if isinstance(m, AIMessage)] == [
        "draft 1", "draft 2"]
    assert [m.type for m in values["messages"]].count("human") == 2  # prompt + one revision


def test_stop_after_the_last_verdict_then_resume_commits_without_model_calls(saver: Any) -> None:
    run = spec(["draft 1"], [PASS])
    gen = run_rubric(run, checkpointer=saver, thread_id="last")
    for event in gen:
        if event["type"] == "evaluation_finished":
            break
    gen.close()
    events = list(run_rubric(run, checkpointer=saver, thread_id="last", resume=True))
    assert types(events) == ["run_finished"]
    assert events[0]["status"] == "satisfied"
    assert [e["result"] for e in events[0]["evaluations"]] == ["satisfied"]
    assert isinstance(run.grader, ScriptedChatModel) and len(run.grader.calls) == 1
    # A later prompt on the thread starts a new grading run and keeps the earlier verdict.
    final = list(run_rubric(spec(["b1"], [PASS]), checkpointer=saver, thread_id="last"))[-1]
    values = thread_values(run, saver, "last")
    assert final["status"] == "satisfied"
    assert [e["answer"] for e in values["_rubric_evaluations"]] == ["draft 1", "b1"]


def test_resume_of_a_finished_thread_finishes_at_once(saver: Any) -> None:
    run = spec(["draft 1"], [PASS])
    list(run_rubric(run, checkpointer=saver, thread_id="done"))
    assert isinstance(run.worker, ScriptedChatModel)
    calls = len(run.worker.calls)
    events = list(run_rubric(run, checkpointer=saver, thread_id="done", resume=True))
    assert types(events) == ["run_finished"]
    assert events[0]["status"] == "satisfied" and events[0]["answer"] == "draft 1"
    assert len(events[0]["evaluations"]) == 1
    assert len(run.worker.calls) == calls


def test_resume_of_an_unknown_thread_starts_a_fresh_run(saver: Any) -> None:
    events = list(run_rubric(spec(["a1"], [PASS]), checkpointer=saver, thread_id="new",
                             resume=True))
    assert events[-1]["status"] == "satisfied" and events[-1]["answer"] == "a1"


def test_worker_that_raises_ends_in_error_with_the_thread_kept(saver: Any) -> None:
    run = spec(["draft 1", ConnectionError("worker server went away")], [FAIL, PASS])
    final = list(run_rubric(run, checkpointer=saver, thread_id="boom"))[-1]
    assert final["status"] == "error"
    assert final["error"] == "ConnectionError: worker server went away"
    assert final["answer"] == "draft 1"
    assert [e["result"] for e in final["evaluations"]] == ["needs_revision"]
    values = thread_values(run, saver, "boom")
    assert [m.type for m in values["messages"]] == ["human", "ai", "human"]

    # The worker recovers (its queue now answers the default draft): the run continues.
    final = list(run_rubric(run, checkpointer=saver, thread_id="boom", resume=True))[-1]
    assert final["status"] == "satisfied" and final["answer"] == "another draft"
    assert len({e["grading_run_id"] for e in final["evaluations"]}) == 1


def test_worker_that_raises_on_the_first_call() -> None:
    final = list(run_rubric(spec([ValueError("no such model")], [PASS])))[-1]
    assert final["status"] == "error" and "no such model" in (final["error"] or "")
    assert final["evaluations"] == [] and final["answer"] == ""


# --------------------------------------------------------------------------- the agent cache


def test_an_agent_is_compiled_once_per_model_objects_and_settings() -> None:
    saver = InMemorySaver()
    run = spec([], [PASS])
    agent = build_agent(run, saver)
    # The prompt and the rubric are the graph's input: other rows reuse the compiled agent.
    assert build_agent(dataclasses.replace(run, prompt="other", rubric="- c3"), saver) is agent
    assert build_agent(dataclasses.replace(run, max_iterations=5), saver) is not agent
    assert build_agent(dataclasses.replace(run, grader_system_prompt="strict"), saver) is not agent
    assert build_agent(run, InMemorySaver()) is not agent
    other_grader = dataclasses.replace(run, grader=ScriptedChatModel(replies=[PASS]))
    assert build_agent(other_grader, saver) is not agent
    by_name = dataclasses.replace(run, worker="demo", grader="rules")
    assert build_agent(by_name, saver) is not build_agent(by_name, saver)


class _Echo(ScriptedChatModel):
    """Answers with the first human message it was given, so an answer names its row."""

    def _generate(self, messages: list[Any], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> Any:
        from langchain_core.outputs import ChatGeneration, ChatResult

        time.sleep(0.05)  # overlap the two runs
        first = next(m for m in messages if m.type == "human")
        return ChatResult(generations=[ChatGeneration(message=AIMessage(f"echo {first.content}"))])


def test_runs_sharing_one_compiled_agent_keep_their_own_threads() -> None:
    saver = InMemorySaver()
    worker, grader = _Echo(), ScriptedChatModel(default=PASS)
    runs = [RunSpec(prompt=f"row {i}", rubric=RUBRIC, worker=worker, grader=grader)
            for i in range(6)]
    assert len({id(build_agent(r, saver)) for r in runs}) == 1
    answers: dict[int, str] = {}

    def one(i: int) -> None:
        events = list(run_rubric(runs[i], checkpointer=saver, thread_id=f"t{i}"))
        answers[i] = events[-1]["answer"]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == {i: f"echo row {i}" for i in range(6)}
    for i in range(6):
        values = thread_values(runs[i], saver, f"t{i}")
        assert [m.content for m in values["messages"]][:2] == [f"row {i}", f"echo row {i}"]


class _LostDatabaseSaver(InMemorySaver):
    """A checkpointer whose server goes away after ``ok`` checkpoints (reads keep working)."""

    def __init__(self, ok: int) -> None:
        super().__init__()
        self.ok = ok

    def put(self, *args: Any, **kwargs: Any) -> Any:
        if self.ok <= 0:
            from rubric_core.store import StoreUnavailable

            msg = "Lost the connection to the PostgreSQL server"
            raise StoreUnavailable(msg)
        self.ok -= 1
        return super().put(*args, **kwargs)


@pytest.mark.parametrize("watch", [True, False], ids=["stream_events", "custom_stream"])
def test_a_checkpoint_cut_by_a_lost_database_ends_interrupted_not_error(watch: bool) -> None:
    # The run did nothing wrong: Resume must continue it, and --retry-errors must not be needed.
    run = dataclasses.replace(spec([AIMessage("draft")], [FAIL, PASS]), watch_worker=watch)
    events = list(run_rubric(run, checkpointer=_LostDatabaseSaver(ok=2), thread_id="t"))
    assert events[-1]["type"] == "run_finished"
    assert events[-1]["status"] == "interrupted", events[-1]
    assert "Lost the connection" in (events[-1]["error"] or "")
