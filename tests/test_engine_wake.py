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


def test_the_pinned_dbos_has_both_hooks() -> None:
    """An upgrade of DBOS without them would silently bring back polling: it fails here."""
    assert wake._hooks() is not None


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
        stop = wake.installed()
    assert events[-1]["status"] == "finished"  # type: ignore[typeddict-item]
    assert stop is not None, "the engine was launched without its wakes"
    # Two slots, eight cells: each of the six cells after the first two can start on a wake.
    assert stop.wakes >= 1
