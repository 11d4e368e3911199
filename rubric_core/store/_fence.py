"""Fenced checkpoints: a run's LangGraph writes are stored only while their writer owns the run.

A run has one owner at a time (``runs.owner``, handed over by `RunStore.claim_run`). The run
index refuses a former owner's passes and ending (`RunTakenOver`); this module extends that to
the checkpoints. A graph run that carries a `Fence` in its config (`Fence.configurable`, merged
into ``config["configurable"]``) has every ``put`` and ``put_writes`` of the store's saver run
the owner check and the write in ONE transaction, on the saver's own connection:

- SQLite: ``BEGIN IMMEDIATE`` (the file's one write lock, so no claim can commit in between),
  ``SELECT owner FROM runs``, the saver's statements, ``COMMIT``;
- PostgreSQL: a transaction holding ``SELECT owner FROM runs ... FOR SHARE`` on the run's row,
  then the saver's statements: a concurrent claim (an ``UPDATE`` of that row) waits for the
  write to commit, and a write after a claim reads the new owner.

A refused write raises `RunTakenOver` and writes nothing, so a paused process that lost its run
never forks the run's thread; the fence's `Fence.lost` event is set, so the session recording
the run stops as it does when its heartbeat is refused. Reads (``get_tuple``, ``list``) are not
fenced. The fence travels in the graph's config rather than in a saver object per run, so one
compiled agent (`rubric_core.runner.build_agent`) serves every run on the same saver.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rubric_core.store._schema import StoreError

if TYPE_CHECKING:
    from collections.abc import Iterator


class RunTakenOver(StoreError):
    """A recorder wrote to a run that another server or process has taken over (resumed)."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"Run {run_id[:8]} was taken over by another server or process (it "
                         "found this one silent and resumed it); this one stopped recording it.")


def holds(current: str | None, owner: str | None) -> bool:
    """Whether the writer ``owner`` may write a run whose row names ``current`` as its owner.

    A writer that names no owner, and a run that has none, are not fenced; otherwise the two
    must be the same. The one rule for the run index (`rubric_core.store._runs`) and the
    checkpoints.
    """
    return owner is None or current is None or current == owner


FENCE_KEY = "__rubric_studio_fence"
"""The key of ``config["configurable"]`` that holds a graph run's `Fence`.

Its leading ``__`` keeps it out of checkpoint metadata (LangGraph copies the other configurable
values there) and out of secret scrubbing (`rubric_core.redact.scrub_checkpoint_config`).
"""

OWNER_SQL = "SELECT owner FROM runs WHERE run_id = ?"
"""The owner check's query (``?`` placeholder; PostgreSQL's saver spells it ``%s``)."""

_WRITING: ContextVar[Fence | None] = ContextVar("rubric_studio_fence", default=None)


@dataclass(frozen=True, eq=False)
class Fence:
    """Who may write a run's checkpoints: ``owner``, while the run's row names it.

    Args:
        run_id: The run (its row in ``runs``).
        owner: The writer's name (`rubric_core.registry.new_owner`).
        lost: Set when a write was refused because another owner holds the run now.

    """

    run_id: str
    owner: str
    lost: threading.Event = field(default_factory=threading.Event)

    def configurable(self) -> dict[str, Any]:
        """What to merge into a graph run's ``config["configurable"]`` to fence its writes."""
        return {FENCE_KEY: self}

    def admit(self, row: Any) -> None:
        """Raise unless the run's row, as `OWNER_SQL` read it, names this fence's owner.

        Raises:
            KeyError: The run is gone (deleted): its thread takes no more checkpoints.
            RunTakenOver: Another owner holds the run now; `lost` is set.

        """
        if row is None:
            msg = f"no run with id {self.run_id!r}: its checkpoints are no longer written"
            raise KeyError(msg)
        if not holds(row["owner"] if isinstance(row, Mapping) else row[0], self.owner):
            self.lost.set()
            raise RunTakenOver(self.run_id)


def fence_of(config: Mapping[str, Any] | None) -> Fence | None:
    """The `Fence` a saver call's config carries, if any."""
    fence = ((config or {}).get("configurable") or {}).get(FENCE_KEY)
    return fence if isinstance(fence, Fence) else None


@contextmanager
def writing(config: Mapping[str, Any] | None) -> Iterator[None]:
    """Mark the saver write made in the body as fenced by ``config``'s `Fence` (if any).

    The saver's cursor (the one place its statements run) reads it with `current`, so the
    owner check shares the write's transaction.
    """
    token = _WRITING.set(fence_of(config))
    try:
        yield
    finally:
        _WRITING.reset(token)


def current() -> Fence | None:
    """The fence of the saver write in progress on this thread or task, if any."""
    return _WRITING.get()
