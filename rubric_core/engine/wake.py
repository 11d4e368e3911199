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
per-worker, partitions, rate), so nothing about what may start changes, only when.

A queue this process has just registered and listens to (`discover`, called by
`rubric_core.engine.launch.listen`: an experiment's or a re-grade's start) wakes DBOS's queue
manager thread, which otherwise looks for new queues once a second, and its new worker
thread's first wait ends at once: the first cells start some 10 ms after they are queued,
not about a second later (measured on ``bench/experiment.py``: 1.1 s from the last enqueue to
the first cell's start, before this). Installed only
where one process runs the cells (the embedded SQLite file, `rubric_core.engine.launch`):
between processes a wake is unfair, the process that freed a slot takes it again before any
other process polls, so processes that did not grab slots first would get none.

While every slot of a queue is taken by a cell running here, its worker thread does not poll
at the end of each wait (it could start nothing: the queue's global limit counts at least the
cells running here) but sleeps on, until a slot frees here (the wake above) or for at most
`SATURATED_POLL_S`. Each poll is a few transactions of DBOS's through SQLAlchemy that take
the GIL from the cells; on ``bench/experiment.py`` at C = 16 (64 cells) a queue was polled 83
times, 44 of them for nothing, and now 63 times (22), its thread's CPU 5.4–7.2 → 5.0–5.6 ms a
cell. The limit is the one `rubric_core.engine.queues` registered (`limit`); the count DBOS's
own of the workflows running in this process per queue. A count above the database's (a
workflow whose end DBOS recorded but not yet released here) delays a poll only until that
release, which wakes it.

Two private points of DBOS 3.4.0 (the version is pinned, `rubric_core.engine.launch`): the
stop event DBOS's queue threads sleep on (the first argument of ``dbos._dbos.queue_thread``,
wrapped in a `Wakeable` that DBOS also sets to stop them), and the active-workflow set's
``_remove`` and ``count_for_queue``. `install` checks that they exist and changes nothing
otherwise (the queues are then polled as before; `installed` says which, and
``tests/test_engine_wake.py`` fails on a DBOS without them, so an upgrade cannot lose this
silently).
"""

from __future__ import annotations

import threading
import time
from typing import Any

_THREAD_PREFIX = "queue-worker-"
"""How DBOS 3.4.0 names the thread that polls a queue (``queue-worker-NAME``)."""

SATURATED_POLL_S = 1.0
"""How often a queue whose every slot is taken by a cell running here is polled all the same
(a slot freed here wakes it at once; this bounds what nothing here announces, such as a
limit raised by another process)."""

_lock = threading.Lock()
_limits: dict[str, int] = {}  # queue -> its global concurrency (`limit`)
_stops: list[Wakeable] = []  # the launched DBOS's queue threads' (one launch at a time)
_original: list[tuple[Any, Any]] = []  # (DBOS's module, its own queue_thread), once replaced


class Wakeable:
    """DBOS's stop event as its queue threads see it, plus one wake per queue.

    DBOS calls `wait` with a timeout between dequeues (a queue's worker thread) and to pace its
    queue manager thread, and `set` to stop them all. A queue's worker thread waits on its
    queue's wake instead; the manager thread (the one other thread that waits on it) on a wake
    of its own, set by `discover` and by a stop.
    """

    def __init__(self, stop: threading.Event, active: Any = None) -> None:
        self._stop = stop
        self._active = active  # DBOS's set of the workflows running here (count_for_queue)
        self._manager = threading.Event()
        self._wakes: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self.wakes = 0
        """How many waits a wake ended early (for tests and benchmarks)."""
        self.discoveries = 0
        """How many of the manager thread's waits a `discover` ended (for tests)."""
        self.skipped = 0
        """How many polls were left out because their queue was full here (for tests)."""

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
        self._manager.set()
        with self._lock:
            for event in self._wakes.values():
                event.set()

    def wake(self, queue: str) -> None:
        """End the current (or next) wait of ``queue``'s worker thread."""
        self._wake_of(queue).set()

    def discover(self, queue: str) -> None:
        """Have the manager thread look for new queues now, and ``queue``'s first wait end."""
        self.wake(queue)  # before its worker thread exists: its first wait ends at once
        self._manager.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until stopped, ``timeout`` passed or (a queue's thread) its queue is woken.

        A queue's thread sleeps past ``timeout`` while its queue is full here (module docstring).

        Returns:
            Whether DBOS asked its threads to stop.

        """
        name = threading.current_thread().name
        if not name.startswith(_THREAD_PREFIX):  # the queue manager thread
            if self._manager.wait(timeout):
                self._manager.clear()  # a discover after this clear ends the next wait
                if not self._stop.is_set():
                    self.discoveries += 1
            return self._stop.is_set()
        queue = name[len(_THREAD_PREFIX):]
        event = self._wake_of(queue)
        first = time.monotonic()
        while True:
            went = time.monotonic()
            if event.wait(timeout):
                event.clear()  # a wake after this clear ends the next wait: none is lost
                if not self._stop.is_set() and (timeout is None
                                                or time.monotonic() - went < timeout):
                    self.wakes += 1
                return self._stop.is_set()
            if (self._stop.is_set() or timeout is None or not self._full(queue)
                    or time.monotonic() - first >= SATURATED_POLL_S):
                return self._stop.is_set()
            self.skipped += 1  # a poll now could start nothing: sleep on

    def _full(self, queue: str) -> bool:
        """Whether cells running here take every slot of ``queue``'s global limit."""
        with _lock:
            cap = _limits.get(queue)
        return (cap is not None and self._active is not None
                and self._active.count_for_queue(queue) >= cap)


def wake(queue: str | None) -> None:
    """A slot of ``queue`` freed in this process: its worker thread dequeues at once."""
    if queue is None:
        return
    with _lock:
        stops = list(_stops)
    for stop in stops:
        stop.wake(queue)


def limit(queue: str, concurrency: int | None) -> None:
    """``queue``'s global concurrency as registered with DBOS (None: none, or deleted)."""
    with _lock:
        if concurrency is None:
            _limits.pop(queue, None)
        else:
            _limits[queue] = concurrency


async def register_queue(queue: str, *, concurrency: int | None, **options: Any) -> None:
    """Create or update ``queue`` in DBOS with its global limit, which `limit` then mirrors.

    Every queue of ours is registered here, so none misses its full-queue skips. ``options``:
    DBOS's own (rate limiter, partitions, polling interval).
    """
    from dbos import DBOS

    await DBOS.register_queue_async(queue, global_concurrency=concurrency,
                                    on_conflict="always_update", **options)
    limit(queue, concurrency)


async def delete_queue(queue: str) -> None:
    """Delete ``queue`` from DBOS (no process polls it any more) and forget its limit."""
    from dbos import DBOS

    await DBOS.delete_queue_async(queue)
    limit(queue, None)


def discover(queue: str) -> None:
    """This process has just registered ``queue`` and listens to it: start polling it now."""
    with _lock:
        stops = list(_stops)
    for stop in stops:
        stop.discover(queue)


def disarm() -> None:
    """The next launch polls as DBOS does: its own queue thread, no wakes, no `discover`.

    For a launch on PostgreSQL in a process that launched on SQLite before (the app switching
    databases; the tests): `install` replaced DBOS's queue thread for that launch.
    """
    with _lock:
        _stops.clear()
        if _original:
            module, original = _original[0]
            module.queue_thread = original


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
    if not callable(original) or not all(
            callable(getattr(ActiveWorkflowById, name, None))
            for name in ("_remove", "count_for_queue")):
        return None
    return _dbos, original


def _queue_thread(stop_event: threading.Event, dbos: Any) -> None:
    """DBOS's queue thread, sleeping on a `Wakeable` of its stop event (`install`)."""
    wakeable = Wakeable(stop_event, dbos._active_workflows_set)
    events = dbos.background_thread_stop_events
    with _lock:
        # DBOS stops its threads by setting what it listed: set ours, which sets its event and
        # wakes every queue thread.
        events[:] = [wakeable if e is stop_event else e for e in events]
        _stops.append(wakeable)
    _original[0][1](wakeable, dbos)


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
        if not _original:
            _original.append((module, original))
        module.queue_thread = _queue_thread
    remove = active._remove

    def released(key: str, bucket: Any) -> None:
        remove(key, bucket)
        wake(bucket[0] if bucket is not None else None)

    active._remove = released
    return True


__all__ = ["SATURATED_POLL_S", "Wakeable", "delete_queue", "disarm", "discover", "install",
           "installed", "limit", "register_queue", "wake"]
