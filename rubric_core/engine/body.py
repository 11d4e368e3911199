"""What a feature gives the engine to run its units: the interface the engine owns.

A unit is one DBOS workflow of ours: an experiment's cell (`rubric_core.experiments`) or a
re-grade's item (`rubric_core.lab`). The engine (`rubric_core.engine.runtime`) dequeues,
registers, stops and parks units; what a unit does is its kind's `Body`, registered by the
feature when it is imported (`register`). A batch (an experiment, a re-grade) is what a
process needs to run its units: the driver's, attached while it runs
(`rubric_core.engine.runtime.attach`), else one its body loads. No DBOS here: features import
this module without importing DBOS.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rubric_core.store import Store

CELL = "cell"
"""The kind of an experiment's cells."""
ITEM = "item"
"""The kind of a re-grade's items."""


@dataclasses.dataclass(eq=False)
class Batch:
    """What this process needs to run one batch's units; features extend it."""

    batch_id: str
    """The experiment or re-grade."""
    stopping: threading.Event = dataclasses.field(default_factory=threading.Event, kw_only=True)
    """Set by the driver's Stop: units of the batch here stop, and later ones start nothing."""
    running: int = dataclasses.field(default=0, kw_only=True)
    """Units of the batch running here now."""
    idle: asyncio.Event = dataclasses.field(default_factory=asyncio.Event, kw_only=True)
    """Set whenever no unit of the batch runs here."""

    def failed(self, exc: BaseException) -> None:
        """A unit here failed with ``exc`` (a lost database); the default says nothing."""


@dataclasses.dataclass(eq=False)
class Unit:
    """One unit as its body sees it, running in this process."""

    kind: str
    """`CELL` or `ITEM`."""
    workflow_id: str
    """Its own workflow's ID."""
    unit_id: str
    """The unit's ID as Stop knows it: the cell's own workflow for a level on a model queue."""
    parent: str | None
    """The cell's own workflow when this workflow is its level on a model queue, else None."""
    batch: Batch
    """Its batch."""
    args: tuple[Any, ...]
    """The workflow's inputs after the batch's id."""
    store: Store
    """The database."""
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    """Set when the unit must stop (cancelled, Stop here, the process leaving)."""
    leaving: threading.Event = dataclasses.field(default_factory=threading.Event)
    """The engine's: set while this process leaves (its units are left for recovery)."""
    unstarted: bool = False
    """Set by a body that started nothing and ends for good (a Resume queues it again): its
    workflow completes even while the process leaves."""
    task: asyncio.Task[dict[str, Any]] | None = dataclasses.field(default=None, repr=False)
    """The body's task (set by the engine)."""

    def stopping(self) -> bool:
        """Whether the unit must stop now (see `stop`, `Batch.stopping`)."""
        return self.stop.is_set() or self.batch.stopping.is_set() or self.leaving.is_set()


class Body(Protocol):
    """A kind's body: what its units do (see the module docstring)."""

    @property
    def halted(self) -> dict[str, Any] | None:
        """What a halted unit's workflow returns, or None.

        None: a halted unit watches `Unit.stopping` and ends after its step. Else a Stop
        cancels the unit's task (nothing of it recorded) and this is its workflow's result.
        """
        ...

    async def load(self, store: Store, batch_id: str) -> Batch:
        """A batch for a unit dequeued here while no driver of it is attached."""
        ...

    async def run(self, unit: Unit) -> dict[str, Any]:
        """Run the unit here to its end; its result is the workflow's."""
        ...

    def lost(self, batch_id: str, exc: BaseException) -> dict[str, Any] | None:
        """The result of a unit whose batch could not be loaded (``exc``); None: raise it."""
        ...

    async def beat(self, store: Store, batch_id: str) -> None:
        """Called every `rubric_core.session.HEARTBEAT_S` while units of the batch run here."""
        ...


_bodies: dict[str, Body] = {}


def register(kind: str, body: Body) -> None:
    """Make ``body`` what units of ``kind`` run in this process (at the feature's import)."""
    _bodies[kind] = body


def body_of(kind: str) -> Body:
    """The body registered for ``kind``."""
    body = _bodies.get(kind)
    if body is None:
        msg = (f"no body for the engine's {kind} units in this process: import the feature "
               "(rubric_core.experiments, rubric_core.lab) before the engine runs them")
        raise RuntimeError(msg)
    return body


__all__ = ["CELL", "ITEM", "Batch", "Body", "Unit", "body_of", "register"]
