"""A queue's next cell starts as soon as a slot of it frees in this process, not at its next poll.

DBOS 3.4.0 dequeues by polling: each queue has a worker thread that sleeps
``polling_interval_sec`` (`rubric_core.engine.queues.POLL_S`) between dequeues, and nothing
wakes it when a slot frees. A slot freed by a cell that ended therefore stayed empty for half a
poll on average plus the dequeue itself: 78 ms a cell at C = 4 and 112 ms at C = 16 on
``bench/experiment.py``'s 0.8 s cells, which held the engine's span efficiency well under plain
asyncio's. Polling faster costs every idle process CPU for each queue it listens to.

Here a workflow of a queue that ends in this process (its outcome recorded, its entry in
DBOS's set of active workflows released) wakes that queue's worker thread at once, which then
dequeues as it would have at its next poll: same transaction, same limits (global,
per-worker, partitions, rate), so nothing about what may start changes, only when. Installed only
where one process runs the cells (the embedded SQLite file, `rubric_core.engine.launch`):
between processes a wake is unfair, the process that freed a slot takes it again before any
other process polls, so processes that did not grab slots first would get none.

Two private points of DBOS 3.4.0 (the version is pinned, `rubric_core.engine.launch`): the
stop event DBOS's queue threads sleep on (the first argument of ``dbos._dbos.queue_thread``,
wrapped in a `Wakeable` that DBOS also sets to stop them), and the active-workflow set's
``_remove``. `install` checks that both exist and changes nothing otherwise (the queues are then
polled as before; `installed` says which, and ``tests/test_engine_wake.py`` fails on a DBOS
without them, so an upgrade cannot lose this silently).
"""

from __future__ import annotations

import threading
import time
from typing import Any

_THREAD_PREFIX = "queue-worker-"
"""How DBOS 3.4.0 names the thread that polls a queue (``queue-worker-NAME``)."""

_lock = threading.Lock()
_stops: list[Wakeable] = []  # the launched DBOS's queue threads' (one launch at a time)
_patched: list[Any] = []  # DBOS's own queue_thread, once replaced


class Wakeable:
    """DBOS's stop event as its queue threads see it, plus one wake per queue.

    DBOS calls `wait` with a timeout between dequeues (a queue's worker thread) and to pace its
    queue manager thread, and `set` to stop them all. A queue's worker thread waits on its
    queue's wake instead; any other thread waits on the stop event itself.
    """

    def __init__(self, stop: threading.Event) -> None:
        self._stop = stop
        self._wakes: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self.wakes = 0
        """How many waits a wake ended early (for tests and benchmarks)."""

    def _wake_of(self, queue: str) -> threading.Event:
        with self._lock:
            event = self._wakes.get(queue)
            if event is None:
                event = self._wakes[queue] = threading.Event()
                if self._stop.is_set():
                    event.set()
            return event

    def is_set(self) -> bool:
        """Whether DBOS asked its threads to stop."""
        return self._stop.is_set()

    def set(self) -> None:
        """Stop: every thread waiting wakes up and sees it."""
        self._stop.set()
        with self._lock:
            for event in self._wakes.values():
                event.set()

    def wake(self, queue: str) -> None:
        """End the current (or next) wait of ``queue``'s worker thread."""
        self._wake_of(queue).set()

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until stopped, ``timeout`` passed or (a queue's thread) its queue is woken.

        Returns:
            Whether DBOS asked its threads to stop.

        """
        name = threading.current_thread().name
        if not name.startswith(_THREAD_PREFIX):
            return self._stop.wait(timeout)
        event = self._wake_of(name[len(_THREAD_PREFIX):])
        went = time.monotonic()
        if event.wait(timeout):
            event.clear()  # a wake after this clear ends the next wait: none is lost
            if not self._stop.is_set() and (timeout is None
                                            or time.monotonic() - went < timeout):
                self.wakes += 1
        return self._stop.is_set()


def wake(queue: str | None) -> None:
    """A slot of ``queue`` freed in this process: its worker thread dequeues at once."""
    if queue is None:
        return
    with _lock:
        stops = list(_stops)
    for stop in stops:
        stop.wake(queue)


def installed() -> Wakeable | None:
    """The launched engine's `Wakeable`, or None (not launched, or DBOS lacks the hooks)."""
    with _lock:
        return _stops[-1] if _stops else None


def _hooks() -> tuple[Any, Any] | None:
    """DBOS's module that starts the queue thread, and its queue_thread; None if not there."""
    try:
        from dbos import _dbos
        from dbos._core import ActiveWorkflowById
    except ImportError:
        return None
    original = getattr(_dbos, "queue_thread", None)
    if not callable(original) or not callable(getattr(ActiveWorkflowById, "_remove", None)):
        return None
    return _dbos, original


def install(instance: Any) -> bool:
    """Make ``instance`` (a `DBOS`, before its launch) wake its queues; whether it could."""
    hooks = _hooks()
    active = getattr(instance, "_active_workflows_set", None)
    stops = getattr(instance, "background_thread_stop_events", None)
    if hooks is None or active is None or not isinstance(stops, list):
        return False
    module, original = hooks
    with _lock:
        _stops.clear()  # a previous launch's (destroyed)
        if not _patched:
            _patched.append(original)

            def queue_thread(stop_event: threading.Event, dbos: Any) -> None:
                wakeable = Wakeable(stop_event)
                events = dbos.background_thread_stop_events
                with _lock:
                    # DBOS stops its threads by setting what it listed: set ours, which sets
                    # its event and wakes every queue thread.
                    events[:] = [wakeable if e is stop_event else e for e in events]
                    _stops.append(wakeable)
                _patched[0](wakeable, dbos)

            module.queue_thread = queue_thread
    remove = active._remove

    def released(key: str, bucket: Any) -> None:
        remove(key, bucket)
        wake(bucket[0] if bucket is not None else None)

    active._remove = released
    return True


__all__ = ["Wakeable", "install", "installed", "wake"]
