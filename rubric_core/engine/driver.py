"""One session of a batch on the engine: the lifecycle experiments and re-grades share.

A feature's driver (`rubric_core.experiments.driver.ExperimentDriver`,
`rubric_core.lab.regrade`) extends `BatchDriver`, which `rubric_core.background.drive` runs on
the work loop: `run` never raises (the failure is kept for the consumer's thread) and ends with
the feature's finished event; `watch` counts units as they end, here (the batch's listener sets
`BatchDriver.ended_here`) or on any process (read every `WATCH_S`), until every unit ended, the
queue settled (checked every `SETTLED_EVERY` reads) or Stop, and sweeps for stopped executors
and this process's orphans every `rubric_core.engine.recovery.SWEEP_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

from rubric_core.engine.launch import listen
from rubric_core.engine.recovery import SWEEP_S, recover_stopped_executors, requeue_orphans
from rubric_core.engine.runtime import attach, detach, stop_batch

if TYPE_CHECKING:
    import queue
    import threading

    from rubric_core.engine.body import Batch
    from rubric_core.engine.runtime import Engine
    from rubric_core.store import Store

WATCH_S = 0.5
"""How often a driver reads what every process did."""

SETTLED_EVERY = 4
"""Reads between checks that some unit of the batch is still queued or running."""

SETTLE_S = 2.0
"""Longest a driver waits at its end for its units' workflows to record their outcome."""


class BatchDriver:
    """The shared part of a feature's driver (see the module docstring).

    Args:
        store: The database.
        kind: The kind of the batch's units (`rubric_core.engine.body`).
        batch_id: The experiment or re-grade.
        stop: Set to stop (from any thread).
        events: The queue the driver puts its events on, ``None`` last.
        engine: This process's engine.
    """

    def __init__(self, store: Store, kind: str, batch_id: str, stop: threading.Event,
                 events: queue.Queue[Any], engine: Engine) -> None:
        self.store, self.kind, self.batch_id, self.stop = store, kind, batch_id, stop
        self.events, self.engine = events, engine
        self.failure: BaseException | None = None
        """What ended the session with an exception, raised again on the consumer's thread."""
        self.started = time.monotonic()
        self.ended_here = asyncio.Event()
        """Set (on the loop) when a unit of the batch ended in this process."""

    async def main(self) -> str:
        """The session; its status at the end (``finished`` or ``stopped``)."""
        raise NotImplementedError

    async def set_status(self, status: str) -> None:
        """Record the batch's status."""
        raise NotImplementedError

    def finished(self, status: str) -> dict[str, Any]:
        """The session's last event."""
        raise NotImplementedError

    def caught(self, exc: BaseException) -> None:
        """What ended `main`: kept as the failure raised on the consumer's thread."""
        self.failure = exc

    def complete(self) -> bool:
        """Whether every unit of the batch ended (as this session counts them)."""
        raise NotImplementedError

    async def count(self) -> None:
        """Count what other processes ended since the last count."""

    async def active(self) -> bool:
        """Whether some unit of the batch is queued or running on any process."""
        raise NotImplementedError

    async def settled(self) -> bool:
        """No unit is queued or running: whether the session ends (else it goes on)."""
        await self.count()
        return True

    async def cancel(self) -> None:
        """Stop: cancel the batch's queued and running units on every process."""
        raise NotImplementedError

    def prefixes(self) -> list[str]:
        """The workflow ID prefixes of the batch's units (for orphans)."""
        raise NotImplementedError

    async def run(self) -> None:
        """The whole session; it never raises (a failure is kept for the consumer's thread)."""
        status = "stopped"
        try:
            status = await self.main()
        except BaseException as exc:  # handed to the consumer's thread
            self.caught(exc)
        finally:
            with contextlib.suppress(Exception):  # a lost database: nothing more to say
                await self.set_status(status)
            self.events.put(self.finished(status))
            self.events.put(None)

    async def open(self, batch: Batch, queues: list[str], *, run_here: bool = True) -> None:
        """Attach ``batch``, take units from ``queues`` (``run_here``), hand back orphans."""
        attach(self.engine, self.kind, batch)
        if run_here:
            for name in queues:
                listen(self.engine, name)
        # This process's own units that nothing here runs (an earlier session's, after an
        # outage) go back to their queues before units are queued.
        await requeue_orphans(self.store, self.prefixes(), self.engine.executor_id)

    def close(self, batch: Batch) -> None:
        """Detach ``batch``: later units here load their own."""
        detach(self.engine, self.kind, batch)

    async def settle(self) -> bool:
        """Whether no unit is queued or running, once DBOS recorded the ends (`SETTLE_S` at most).

        A unit's end reaches the driver before DBOS records its workflow's outcome.
        """
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline and await self.active():
            await asyncio.sleep(0.05)
        return not await self.active()

    async def sweep(self) -> None:
        """Re-queue stopped executors' units and this process's orphans (errors: next time)."""
        with contextlib.suppress(Exception):
            await recover_stopped_executors(self.store, me=self.engine.executor_id)
            await requeue_orphans(self.store, self.prefixes(), self.engine.executor_id)

    async def watch(self, batch: Batch) -> None:
        """Count units as they end until every one ended, the queue settled, or Stop."""
        rounds, swept, read = 0, time.monotonic(), 0.0
        while not self.complete():
            if self.stop.is_set():
                stop_batch(self.engine, self.kind, self.batch_id)
                await self.cancel()
                await batch.idle.wait()  # this process's units end (after their step)
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.ended_here.wait(), WATCH_S)
            self.ended_here.clear()
            # A unit that ended here was counted by its own event; the engine's tables (what
            # other processes did) are read once a WATCH_S, not at every unit's end.
            if self.stop.is_set() or time.monotonic() - read < WATCH_S:
                continue
            read = time.monotonic()
            await self.count()
            if self.complete():
                return
            rounds += 1
            if rounds % SETTLED_EVERY == 0 and not await self.active() and await self.settled():
                return
            if time.monotonic() - swept > SWEEP_S:
                swept = time.monotonic()
                await self.sweep()


__all__ = ["SETTLED_EVERY", "SETTLE_S", "WATCH_S", "BatchDriver"]
