"""A queue's next unit starts as soon as a slot of it frees in this process, not at its next poll.

DBOS dequeues by polling: a queue's worker thread sleeps ``polling_interval_sec`` between
dequeues. Here its sleep is a `Wakeable`'s (installed by `rubric_core.engine.launch` through
`rubric_core.engine._dbos.install_queue_thread`, on the embedded SQLite file only): a unit of
the queue that ends here wakes it, a queue this process has just registered and listens to
(`Wakeable.discover`) wakes DBOS's queue manager thread (which looks for new queues once a
second) and ends its first wait, and while every slot of a queue is taken by units running
here its timed polls are skipped (for at most `SATURATED_POLL_S`): they could start nothing.
The dequeue itself is DBOS's, with all its limits: only *when* changes. Measured and why:
``docs/engine.md``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rubric_core.engine import _dbos

SATURATED_POLL_S = 1.0
"""How often a queue whose every slot is taken by a unit running here is polled all the same
(this bounds what nothing here announces, such as a limit raised by another process)."""


class Wakeable:
    """DBOS's stop event as its queue threads see it, plus one wake per queue.

    DBOS calls `wait` with a timeout between dequeues (a queue's worker thread) and to pace its
    queue manager thread, and `set` to stop them all.

    Args:
        stop: DBOS's stop event.
        active: DBOS's set of the workflows running here (for full queues), or None.
        limits: Queue -> its global concurrency as registered (the engine's, kept current).
    """

    def __init__(self, stop: threading.Event, active: Any = None,
                 limits: dict[str, int] | None = None) -> None:
        self._stop = stop
        self._active = active
        self._limits = limits if limits is not None else {}
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

        A queue's thread sleeps past ``timeout`` while its queue is full here. Returns whether
        DBOS asked its threads to stop.
        """
        name = threading.current_thread().name
        if not name.startswith(_dbos.QUEUE_THREAD_PREFIX):  # the queue manager thread
            if self._manager.wait(timeout):
                self._manager.clear()  # a discover after this clear ends the next wait
                if not self._stop.is_set():
                    self.discoveries += 1
            return self._stop.is_set()
        queue = name[len(_dbos.QUEUE_THREAD_PREFIX):]
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
        """Whether units running here take every slot of ``queue``'s global limit."""
        cap = self._limits.get(queue)
        return (cap is not None and self._active is not None
                and _dbos.count_for_queue(self._active, queue) >= cap)


__all__ = ["SATURATED_POLL_S", "Wakeable"]
