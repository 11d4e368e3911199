"""`rubric_core.workers`: how the limits are shared out between processes, and a helper
process that stops cleanly when asked, whatever SIGINT disposition it was started with."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from openai_server import DelayedServer, Reply, verdict

from rubric_core.datasets import parse_dataset
from rubric_core.experiments import create_experiment
from rubric_core.settings import ExperimentConfig
from rubric_core.store import Store
from rubric_core.workers import STOP_TIMEOUT_S, WorkerPlan, shares, start_helpers

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRITERION = "answers the question"


class HoldingServer(DelayedServer):
    """A `DelayedServer` whose grader passes `CRITERION` at once, that answers its first
    ``free`` calls and holds every later one until `release`.

    While it holds them no cell can end, so a test can act on the processes calling it without
    racing them. A stopped run ends after its step in progress, so release the calls after
    asking for the stop.

    Attributes:
        held: Calls held so far (released or not).
    """

    def __init__(self, *, free: int, delay_s: float = 0.05) -> None:
        super().__init__(delay_s=delay_s, grader_reply=verdict("satisfied", (), (CRITERION,)))
        self.free, self.calls, self.held = free, 0, 0
        self._gate = threading.Event()
        self._count = threading.Lock()

    def respond(self, body: dict[str, Any]) -> Reply:
        """Hold the call once ``free`` calls were answered, then answer as `DelayedServer`."""
        with self._count:
            self.calls += 1
            hold = self.calls > self.free
            self.held += hold
        if hold:
            self._gate.wait()
        return super().respond(body)

    def release(self, after_s: float = 0.0) -> None:
        """Answer the held calls and every later one (``after_s`` from now, in the background)."""
        if after_s:
            threading.Timer(after_s, self._gate.set).start()
        else:
            self._gate.set()

    def wait_held(self, count: int, timeout_s: float = 60.0) -> None:
        """Wait until ``count`` calls are held (or fail the test)."""
        deadline = time.monotonic() + timeout_s
        while self.held < count and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.held >= count, f"only {self.held} of {count} calls arrived"


@contextlib.contextmanager
def sigint(disposition: Any) -> Iterator[None]:
    """Processes started inside inherit this SIGINT disposition (``SIG_IGN`` stays ignored; a
    handler becomes the default action, so a Python child raises KeyboardInterrupt)."""
    before = signal.signal(signal.SIGINT, disposition)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize(("total", "parts", "expected"), [
    pytest.param(4, 2, [2, 2], id="even"),
    pytest.param(5, 2, [3, 2], id="first_larger"),
    pytest.param(3, 3, [1, 1, 1], id="one_each"),
    pytest.param(7, 1, [7], id="one_part"),
])
def test_shares_are_as_even_as_can_be_and_add_up(total: int, parts: int,
                                                 expected: list[int]) -> None:
    assert shares(total, parts) == expected


def test_a_plan_shares_every_limit_out_and_keeps_the_first_share_here() -> None:
    plan = WorkerPlan.split(workers=3, concurrency=7, per_model={"a": 3, "b": 5})
    assert plan.workers == 3
    assert plan.concurrency == (3, 2, 2)
    assert plan.per_model == ({"a": 1, "b": 2}, {"a": 1, "b": 2}, {"a": 1, "b": 1})


@pytest.mark.parametrize(("kwargs", "message"), [
    pytest.param({"concurrency": 0}, "concurrency must be from 1 to 64, got 0", id="no_cells"),
    pytest.param({"concurrency": 65}, "concurrency must be from 1 to 64, got 65", id="too_many"),
    pytest.param({"per_model": {"m": 0}}, "model limit m=0 must be from 1 to 64",
                 id="model_limit_0"),
    pytest.param({"workers": 0}, "workers must be from 1 to the concurrency (4), got 0",
                 id="no_workers"),
    pytest.param({"workers": 5}, "workers must be from 1 to the concurrency (4), got 5",
                 id="more_workers_than_cells"),
    pytest.param({"workers": 3, "per_model": {"m": 2}},
                 "model limit m=2 is shared out between 3 workers", id="model_limit_too_small"),
])
def test_a_plan_refuses_limits_a_worker_cannot_run_with(kwargs: dict[str, Any],
                                                        message: str) -> None:
    args: dict[str, Any] = {"workers": 1, "concurrency": 4, **kwargs}
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        WorkerPlan.split(**args)


def test_a_helper_started_with_sigint_ignored_still_stops_cleanly_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A background job of a script starts with SIGINT ignored, and so do its helpers: asked to
    # stop, a helper must end its running cells `interrupted` and exit, not run on until killed.
    monkeypatch.setenv("PYTHONPATH", ROOT)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    server = HoldingServer(free=0)
    db = tmp_path / "db.sqlite3"
    data = "prompt\n" + "".join(f"question {i}\n" for i in range(6))
    with server.fake, Store(db) as store:
        config = ExperimentConfig(worker_model="openai-compatible:w",
                                  grader_model="openai-compatible:g",
                                  rubric=f"- {CRITERION}", base_url=server.fake.base_url)
        exp_id = create_experiment(store, parse_dataset(data, name="q"), [config]).experiment_id
        plan = WorkerPlan.split(workers=2, concurrency=4)
        stopped_at = 0.0
        with (pytest.raises(KeyboardInterrupt), sigint(signal.SIG_IGN),
              start_helpers(exp_id, db, plan) as helpers):
            server.wait_held(plan.concurrency[1])  # the helper runs its cells
            stopped_at = time.monotonic()
            server.release(after_s=0.5)  # the helper's step in progress ends after its stop
            raise KeyboardInterrupt  # this process's Ctrl-C: the helpers are stopped
        took = time.monotonic() - stopped_at
        [(helper, _)] = helpers.procs
        assert helper.returncode == 130, f"helper exited {helper.returncode}"
        assert took < STOP_TIMEOUT_S / 2  # it stopped when asked, it was not killed
        cells = store.experiment_cells(exp_id)
    assert sorted(c.status for c in cells) == ["interrupted"] * 2 + ["pending"] * 4
