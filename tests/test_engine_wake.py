"""A queue's worker thread is woken when a slot of its queue frees here (`rubric_core.engine.wake`).

The `Wakeable` on its own (real threads named as DBOS names them), the pinned DBOS's hooks, and
a real experiment on the real engine (SQLite, loopback model server) whose cells were
dequeued on wakes. How much sooner cells start is a benchmark's business
(``bench/experiment.py``), not a test's.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import pytest
from openai_server import DelayedServer, verdict
from test_engine_orphans import one_config_experiment

from rubric_core.engine import wake
from rubric_core.experiments import experiment_models, run_experiment
from rubric_core.http_retry import SharedBackoff
from rubric_core.store import Store

if TYPE_CHECKING:
    from pathlib import Path

LONG_S = 30.0
"""A wait's timeout that no passing test reaches (it would mean the wake was lost)."""


def _waiting(stop: wake.Wakeable, name: str, results: list[tuple[bool, float]],
             timeout: float = LONG_S) -> threading.Thread:
    """A thread named ``name`` that waits once on ``stop``: (what wait returned, seconds)."""
    def run() -> None:
        went = time.monotonic()
        results.append((stop.wait(timeout), time.monotonic() - went))

    thread = threading.Thread(target=run, name=name)
    thread.start()
    return thread


def test_a_wake_ends_its_queue_threads_wait_and_no_other() -> None:
    stop = wake.Wakeable(threading.Event())
    woken: list[tuple[bool, float]] = []
    other: list[tuple[bool, float]] = []
    thread = _waiting(stop, "queue-worker-a", woken)
    sleeper = _waiting(stop, "queue-worker-b", other, timeout=0.5)
    time.sleep(0.1)
    stop.wake("a")
    thread.join(LONG_S)
    sleeper.join(LONG_S)
    assert woken and woken[0][0] is False and woken[0][1] < LONG_S / 2
    assert other and other[0][0] is False and other[0][1] >= 0.5  # its own timeout
    assert stop.wakes == 1


def test_a_wake_before_the_wait_is_not_lost() -> None:
    stop = wake.Wakeable(threading.Event())
    stop.wake("a")  # the slot freed while the thread was dequeuing
    results: list[tuple[bool, float]] = []
    _waiting(stop, "queue-worker-a", results).join(LONG_S)
    assert results and results[0][1] < LONG_S / 2


def test_stop_ends_every_wait_and_says_so() -> None:
    event = threading.Event()
    stop = wake.Wakeable(event)
    results: list[tuple[bool, float]] = []
    threads = [_waiting(stop, name, results)
               for name in ("queue-worker-a", "queue-worker-b", "queue-manager")]
    time.sleep(0.1)
    stop.set()
    for thread in threads:
        thread.join(LONG_S)
    assert event.is_set()
    assert len(results) == 3 and all(stopped for stopped, _ in results)
    assert stop.wakes == 0  # a stop is no wake


def test_a_discover_ends_the_managers_wait_and_the_new_queues_first_one() -> None:
    stop = wake.Wakeable(threading.Event())
    manager: list[tuple[bool, float]] = []
    other: list[tuple[bool, float]] = []
    thread = _waiting(stop, "queue-manager", manager)
    sleeper = _waiting(stop, "queue-worker-b", other, timeout=0.5)
    time.sleep(0.1)
    stop.discover("a")  # registered here: the manager looks for it now
    thread.join(LONG_S)
    assert manager and manager[0][0] is False and manager[0][1] < LONG_S / 2
    first: list[tuple[bool, float]] = []
    _waiting(stop, "queue-worker-a", first).join(LONG_S)  # the new queue's thread
    assert first and first[0][0] is False and first[0][1] < LONG_S / 2
    sleeper.join(LONG_S)
    assert other and other[0][1] >= 0.5  # another queue's thread is not woken
    assert stop.discoveries == 1


def test_a_discover_before_the_managers_wait_is_not_lost() -> None:
    stop = wake.Wakeable(threading.Event())
    stop.discover("a")  # while the manager was listing the queues
    results: list[tuple[bool, float]] = []
    _waiting(stop, "queue-manager", results).join(LONG_S)
    assert results and results[0][1] < LONG_S / 2


class _Running:
    """DBOS's set of the workflows running here, as a `Wakeable` reads it."""

    def __init__(self, count: int) -> None:
        self.count = count

    def count_for_queue(self, queue: str) -> int:
        return self.count if queue == "a" else 0


def _limited(monkeypatch: pytest.MonkeyPatch, concurrency: int, saturated_s: float
             ) -> dict[str, int]:
    """Queue ``a``'s global limit as the engine mirrors it, and the saturated poll's period."""
    monkeypatch.setattr(wake, "SATURATED_POLL_S", saturated_s)
    return {"a": concurrency}


def _installed() -> wake.Wakeable | None:
    from rubric_core.engine.launch import current_engine

    engine = current_engine()
    return engine.wakeable if engine is not None else None


def test_a_queue_full_here_skips_its_timed_polls_until_a_slot_frees(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every slot taken by a cell running here: a poll could start nothing, so the thread
    sleeps on past its timeouts; the wake of a freed slot ends the wait at once."""
    limits = _limited(monkeypatch, 2, saturated_s=LONG_S / 2)
    stop = wake.Wakeable(threading.Event(), _Running(2), limits)
    results: list[tuple[bool, float]] = []
    thread = _waiting(stop, "queue-worker-a", results, timeout=0.05)
    time.sleep(0.3)
    assert not results, "a full queue's thread polled at its timeout"
    stop.wake("a")
    thread.join(LONG_S)
    assert results and results[0][0] is False and results[0][1] < LONG_S / 2
    assert stop.skipped >= 1 and stop.wakes == 1


def test_a_full_queue_is_still_polled_every_saturated_poll_s(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What nothing here announces (a limit raised elsewhere) is seen within SATURATED_POLL_S."""
    limits = _limited(monkeypatch, 2, saturated_s=0.6)
    stop = wake.Wakeable(threading.Event(), _Running(3), limits)
    results: list[tuple[bool, float]] = []
    _waiting(stop, "queue-worker-a", results, timeout=0.05).join(LONG_S)
    assert results and results[0][0] is False and 0.6 <= results[0][1] < LONG_S / 2
    assert stop.wakes == 0


@pytest.mark.parametrize(("running", "queue"), [
    pytest.param(1, "queue-worker-a", id="a-free-slot"),
    pytest.param(2, "queue-worker-b", id="another-queue-no-limit"),
])
def test_a_queue_with_a_free_slot_polls_at_its_timeout(
        monkeypatch: pytest.MonkeyPatch, running: int, queue: str) -> None:
    limits = _limited(monkeypatch, 2, saturated_s=LONG_S / 2)
    stop = wake.Wakeable(threading.Event(), _Running(running), limits)
    results: list[tuple[bool, float]] = []
    _waiting(stop, queue, results, timeout=0.1).join(LONG_S)
    assert results and 0.1 <= results[0][1] < LONG_S / 4  # a skip would take LONG_S / 2
    assert stop.skipped == 0


def test_an_experiments_cells_are_dequeued_on_wakes(tmp_path: Path) -> None:
    rows = 8
    server = DelayedServer(0.1, grader_reply=verdict("satisfied", "fine",
                                                     ["answers the question"]))
    with server.fake, Store(tmp_path / "db.sqlite3") as store:
        backoff = SharedBackoff()
        models = experiment_models(backoff, api_key="test-key")
        exp_id = one_config_experiment(store, rows, server.fake.base_url, models)
        events = list(run_experiment(store, exp_id, concurrency=2, models=models,
                                     backoff=backoff))
        stop = _installed()
    assert events[-1]["status"] == "finished"  # type: ignore[typeddict-item]
    assert stop is not None, "the engine was launched without its wakes"
    # Two slots, eight cells: each of the six cells after the first two can start on a wake.
    assert stop.wakes >= 1
    # The experiment's queue was looked for when the driver listened to it, not up to a
    # second later at the manager thread's next round.
    assert stop.discoveries >= 1
    # Both slots were taken for most of the run: the queue's timed polls were left out.
    assert stop.skipped >= 1


def test_a_launch_on_postgresql_after_one_on_sqlite_polls_as_dbos_does(
        tmp_path: Path, pg_url: str) -> None:
    """DBOS's queue thread stays replaced after a launch on SQLite; a later launch on
    PostgreSQL in the same process (the app switching databases, a test run) must still have
    no wakes: between processes they are unfair (the module docstring), and a queue registered
    here would be polled at once here while the other processes find it a second later."""
    from rubric_core.engine.launch import launch_engine, listen, shutdown_engine

    with Store(tmp_path / "db.sqlite3") as store:
        launch_engine(store, every_queue=False)
        try:
            assert _installed() is not None
        finally:
            shutdown_engine(settle_s=0)
    with Store(pg_url) as store:
        engine = launch_engine(store, every_queue=False)
        try:
            listen(engine, "some-queue")
            deadline = time.monotonic() + 3  # DBOS's queue manager thread has started by then
            while time.monotonic() < deadline:
                assert _installed() is None
                time.sleep(0.05)
        finally:
            shutdown_engine(settle_s=0)
