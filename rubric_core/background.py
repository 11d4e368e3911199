"""Batch work on one background event loop: the loop, and a bridge to synchronous callers.

Experiments (`rubric_core.experiments.scheduler`) and re-grades (`rubric_core.lab.regrade`)
both run their work items as coroutines on this process's one background loop, and both hand
their progress to a synchronous caller (the app's page thread, the CLI) as a generator:

- `work_loop`: the loop, in a daemon thread, started once for the life of the process. Chat
  models' async HTTP clients (pooled connections, the shared backoff's client) belong to the
  loop that opened them, so every batch of the process uses this one.
- `drive`: starts a driver's ``run()`` on that loop and yields the events it puts on its queue
  until it puts ``None``; closing the generator (or the caller's ``stop``) stops the driver,
  waits for it to end, and re-raises the failure it kept. The shared backoff's waits are
  reported on the same queue as ``{type: backoff_type, status_code, wait_s, hits}``.

The caller's thread (a CLI's main thread) never waits without end for the next event: it
wakes every `WAKE_S`. Linux hands a process's SIGINT to whichever of its threads is ready
first, and a thread that happens to be starting a thread (or changing its signal mask) at that
moment is ready first; Python then runs its handler only when the main thread next runs
Python code. A main thread blocked on a queue until the next event (none comes once the
workers of ``eval --workers`` stopped on the same Ctrl-C) would never raise its
KeyboardInterrupt: a Ctrl-C that did nothing, seen about one in 150 in the Ctrl-C drill.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import queue
import threading
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from collections.abc import Iterator

    from rubric_core.http_retry import SharedBackoff

E = TypeVar("E")

WAKE_S = 0.2
"""How often the caller's thread wakes while it waits for the next event (see above)."""

_loop_lock = threading.Lock()
_loop_holder: list[asyncio.AbstractEventLoop] = []


def work_loop() -> asyncio.AbstractEventLoop:
    """This process's event loop for batch work, running in a daemon thread (started once)."""
    with _loop_lock:
        if not _loop_holder:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="rubric-work-loop",
                             daemon=True).start()
            _loop_holder.append(loop)
        return _loop_holder[0]


class Driver(Protocol):
    """What `drive` runs: a coroutine that keeps its failure instead of raising it."""

    failure: BaseException | None
    """The exception that ended ``run()``, re-raised to the caller; None when it ended well."""

    async def run(self) -> None:
        """Do the work, putting events on the driver's queue and ``None`` when done."""


def drive(driver: Driver, events: queue.Queue[Any], stop: threading.Event,
          backoff: SharedBackoff, backoff_type: str) -> Iterator[Any]:
    """Run ``driver`` on `work_loop` and yield its events (see the module docstring).

    Args:
        driver: The batch's driver; it watches ``stop``.
        events: The queue the driver puts its events on, ``None`` last.
        stop: Set when the caller closes the generator (Stop), before waiting for the driver.
        backoff: The batch's shared backoff, whose waits become events.
        backoff_type: The ``type`` of those events.

    Raises:
        BaseException: The failure the driver kept, after it ended.

    """
    def on_backoff(status_code: int, wait_s: float, hits: int) -> None:
        events.put({"type": backoff_type, "status_code": status_code,
                    "wait_s": round(wait_s, 3), "hits": hits})

    backoff.listeners.append(on_backoff)
    with old_objects_frozen():
        running = asyncio.run_coroutine_threadsafe(driver.run(), work_loop())
        try:
            while (event := _next(events)) is not None:
                yield event
        finally:
            stop.set()
            running.result()  # driver.run() keeps its failure instead of raising
            backoff.listeners.remove(on_backoff)
    if driver.failure is not None:
        raise driver.failure


_frozen_lock = threading.Lock()
_frozen_batches = [0]


@contextlib.contextmanager
def old_objects_frozen() -> Iterator[None]:
    """Keep the objects alive when a batch starts out of the garbage collector's full passes.

    By the time a batch runs, the process holds a few hundred thousand long-lived objects
    (LangChain, LangGraph, DBOS, the app's modules) that no collection will free, and a batch
    allocates fast enough to trigger a full (oldest-generation) collection every few seconds:
    each walks every one of them, about 100 ms with the GIL held, during which no cell of the
    loop moves. ``gc.freeze`` moves them to a generation no collection walks; they go back
    (``gc.unfreeze``) when the last batch running in this process ends, so garbage cycles among
    them are still collected later. Objects made during the batch are collected as usual.
    """
    with _frozen_lock:
        _frozen_batches[0] += 1
        if _frozen_batches[0] == 1:
            gc.freeze()
    try:
        yield
    finally:
        with _frozen_lock:
            _frozen_batches[0] -= 1
            if _frozen_batches[0] == 0:
                gc.unfreeze()


def _next(events: queue.Queue[Any]) -> Any:
    """The next event, waking every `WAKE_S` so that a pending Ctrl-C is raised (see above)."""
    while True:
        try:
            return events.get(timeout=WAKE_S)
        except queue.Empty:
            continue


__all__ = ["WAKE_S", "Driver", "drive", "work_loop"]
