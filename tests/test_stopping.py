"""Stop abandons a model call in progress without losing or repeating a recorded verdict.

The run's model calls go to the loopback OpenAI-compatible server; the worker's revision is
scripted to take 20 s, and Stop must not wait for it.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from openai_server import FakeOpenAI, slow, text, verdict

from rubric_core import session
from rubric_core.settings import RunSettings
from rubric_core.stopping import CheckpointGate, RunAbandoned
from rubric_core.store import Store

if TYPE_CHECKING:
    from pathlib import Path

SETTINGS = RunSettings(prompt="write it", rubric="- c1\n- c2",
                       worker_model="openai-compatible:w", grader_model="openai-compatible:g",
                       max_iterations=3)


def test_stop_abandons_the_workers_call_in_progress_and_resume_finishes_the_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RUBRIC_STUDIO_BASE_URL", raising=False)
    with FakeOpenAI() as server, Store(tmp_path / "db.sqlite3") as store:
        server.enqueue(text("first draft"), verdict("needs_revision", ("c2",)),
                       slow(120, text("never seen")))
        run = session.start(store, SETTINGS.replace(base_url=server.base_url))
        seen: list[dict[str, Any]] = []
        consumer = threading.Thread(target=lambda: seen.extend(run))
        consumer.start()
        deadline = time.monotonic() + 30
        while len(server.requests) < 3:  # the revision call is in progress
            assert time.monotonic() < deadline
            time.sleep(0.02)
        stopped_at = time.monotonic()
        assert session.request_stop(run.run_id)
        consumer.join(timeout=60)
        took = time.monotonic() - stopped_at
        assert not consumer.is_alive()
        assert took < 60, f"Stop took {took:.1f} s: it waited for the 120 s call"
        assert session.wait_until_inactive(run.run_id, timeout_s=5)
        stored = store.get_run(run.run_id)
        assert stored.status == "interrupted" and stored.iterations == 1
        first = store.evaluations(run.run_id)

        server.enqueue(text("second draft"), verdict("satisfied"))
        events = list(session.resume(store, run.run_id))
        assert events[-1]["type"] == "run_finished" and events[-1]["status"] == "satisfied"
        evaluations = store.evaluations(run.run_id)
    assert [e["iteration"] for e in evaluations] == [0, 1]  # none lost, none twice
    assert evaluations[0] == first[0]
    assert [e["answer"] for e in evaluations] == ["first draft", "second draft"]


def test_a_stopped_pass_keeps_the_calls_it_paid_for_and_resume_adds_none_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RUBRIC_STUDIO_BASE_URL", raising=False)
    with FakeOpenAI() as server, Store(tmp_path / "db.sqlite3") as store:
        server.enqueue(text("first draft"), slow(3, verdict("satisfied")))
        run = session.start(store, SETTINGS.replace(base_url=server.base_url))
        consumer = threading.Thread(target=lambda: list(run))
        consumer.start()
        deadline = time.monotonic() + 30
        while len(server.requests) < 2:  # the draft is answered, its grading in progress
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert session.request_stop(run.run_id)
        consumer.join(timeout=15)
        assert not consumer.is_alive()
        assert session.wait_until_inactive(run.run_id, timeout_s=5)
        assert store.get_run(run.run_id).iterations == 0  # the pass was cut before its verdict
        # The worker's call of the cut pass was paid for: it is recorded with the ending.
        assert [(c["role"], c["status"]) for c in store.calls(run.run_id)] == [("worker", "ok")]

        server.enqueue(verdict("satisfied"))
        events = list(session.resume(store, run.run_id))
        assert events[-1]["type"] == "run_finished" and events[-1]["status"] == "satisfied"
        calls = store.calls(run.run_id)
        # The abandoned grading ends on its own once its 3 s call returns (its writes refused);
        # let it, while the server still answers.
        for thread in threading.enumerate():
            if thread.name == f"run-{store.get_run(run.run_id).thread_id[:8]}":
                thread.join(timeout=15)
    assert [c["role"] for c in calls] == ["worker", "grader"]  # none twice
    assert len({c["call_id"] for c in calls}) == 2


class _Logged(InMemorySaver):
    def __init__(self) -> None:
        super().__init__()
        self.tasks: list[str] = []

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        self.tasks.append(task_id)
        super().put_writes(config, writes, task_id, task_path)


def test_a_closed_gate_refuses_writes_but_a_reported_verdict() -> None:
    inner = _Logged()
    gate = CheckpointGate(inner)
    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": "",
                                    "checkpoint_id": "1"}}
    gate.put_writes(config, [("messages", "a")], "open")
    gate.close()
    with pytest.raises(RunAbandoned):
        gate.put_writes(config, [("messages", "late answer")], "late")
    with pytest.raises(RunAbandoned):
        gate.put(config, {}, {}, {})  # type: ignore[arg-type]
    gate.put_writes(config, [("_rubric_evaluations", ["verdict"])], "verdict")
    assert inner.tasks == ["open", "verdict"]
    assert gate.get_tuple(config) is None  # reads still pass


def test_a_resume_records_a_held_pass_the_former_owner_did_not_before_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A process stopped (or killed) between a pass's verdict and its recording leaves the pass
    # in the thread only. The resume records it first, so passes keep their order: it used to
    # arrive with the ending, after the resume's own pass (seen with SIGSTOP and a takeover).
    monkeypatch.delenv("RUBRIC_STUDIO_BASE_URL", raising=False)
    with FakeOpenAI() as server, Store(tmp_path / "db.sqlite3") as store:
        server.enqueue(text("first draft"), verdict("needs_revision", ("c2",)),
                       slow(20, text("never seen")))
        run = session.start(store, SETTINGS.replace(base_url=server.base_url))
        consumer = threading.Thread(target=lambda: list(run))
        consumer.start()
        deadline = time.monotonic() + 30
        while len(server.requests) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert session.request_stop(run.run_id)
        consumer.join(timeout=15)
        assert session.wait_until_inactive(run.run_id, timeout_s=5)
        with store._connect(write=True) as conn:  # as if the verdict was never recorded
            conn.execute("DELETE FROM evaluations WHERE run_id = ?", (run.run_id,))
        server.enqueue(text("second draft"), verdict("satisfied"))
        events = list(session.resume(store, run.run_id))
        assert events[-1]["status"] == "satisfied"
        evaluations = store.evaluations(run.run_id)
    assert [(e["iteration"], e["result"]) for e in evaluations] == [
        (0, "needs_revision"), (1, "satisfied")]
