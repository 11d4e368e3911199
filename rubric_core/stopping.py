"""Stop a watched run at once: its graph on a thread of its own, behind a checkpoint gate.

A Stop used to wait for the model call in progress (13 s with a slow stream): closing
LangGraph's synchronous stream waits for the node that is running. Here the graph runs on a
thread of its own (`RunPump`) and its events reach the recorder through a queue, so whoever
records the run can stop reading at any moment; the node left running is *abandoned*.

Abandoning is safe because of `CheckpointGate`, the checkpointer the abandoned graph writes
through: once closed it refuses every later write, so the abandoned call's result never
reaches the thread, and a resume starts from the last step that was whole. A worker's answer
is not recorded anywhere until a grader pass judges it, so losing it loses nothing. A grading
pass is recorded when its verdict is reported (`rubric_evaluation_end`), and the node's writes
that hold that verdict (``_rubric_evaluations``) are the one thing the gate still lets
through after it closed: what the stream reported is then also what the thread holds, so a
verdict is never recorded twice or lost. A pass cut off before its verdict records nothing
and is graded again on resume.
"""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from rubric_core.runner import CallFinished, run_rubric

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
    )

    from rubric_core.runner import RunEvent, RunSpec
    from rubric_core.types import ModelCallRecord

POLL_S = 0.1
"""How often a reader waiting for the next event looks at its stop signal."""

VERDICT_CHANNEL = "_rubric_evaluations"
"""The state key a grading pass's writes carry its verdict in (`rubric_core.state`)."""


class RunAbandoned(RuntimeError):
    """A write of an abandoned run's graph, refused by its `CheckpointGate`."""

    def __init__(self) -> None:
        super().__init__("this run was stopped: its graph may write no more checkpoints")


class CheckpointGate(BaseCheckpointSaver[Any]):
    """A checkpointer that passes everything to ``inner`` until it is closed.

    Reads always pass. After `close`, ``put`` and ``put_writes`` raise `RunAbandoned` (which
    ends the graph), except the pending writes of a grading pass that carry its verdict (see
    the module docstring). Closing waits for a write in progress, so once `close` returns,
    nothing but such a verdict is written.
    """

    def __init__(self, inner: BaseCheckpointSaver[Any]) -> None:
        super().__init__(serde=inner.serde)
        self._inner = inner
        self._lock = threading.Lock()
        self._open = True

    @property
    def closed(self) -> bool:
        """Whether the gate refuses writes now."""
        return not self._open

    def close(self) -> None:
        """Refuse every later write (a write in progress finishes first)."""
        with self._lock:
            self._open = False

    @property
    def config_specs(self) -> list[Any]:
        """The inner saver's configuration fields."""
        return list(self._inner.config_specs)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The inner saver's checkpoint."""
        return self._inner.get_tuple(config)

    def list(self, config: RunnableConfig | None, **kwargs: Any) -> Iterator[CheckpointTuple]:
        """The inner saver's checkpoints."""
        return self._inner.list(config, **kwargs)

    def get_next_version(self, current: Any, channel: None) -> Any:
        """The inner saver's version numbering."""
        return self._inner.get_next_version(current, channel)

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        """Write a checkpoint, unless the gate is closed."""
        with self._lock:
            if not self._open:
                raise RunAbandoned
            return self._inner.put(config, checkpoint, metadata, new_versions)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        """Write a task's pending writes, unless the gate is closed (a verdict still passes)."""
        with self._lock:
            if not self._open and not any(channel == VERDICT_CHANNEL for channel, _ in writes):
                raise RunAbandoned
            self._inner.put_writes(config, writes, task_id, task_path)

    def delete_thread(self, thread_id: str) -> None:
        """Refused: a gate only runs one run's graph."""
        msg = "a CheckpointGate does not delete threads"
        raise NotImplementedError(msg)


_DONE = object()


class RunPump:
    """`rubric_core.runner.run_rubric` on a daemon thread, its events read through a queue.

    Each model call also sends a ``call_finished`` event (`rubric_core.runner.CallFinished`)
    the moment it ends, so a reader can show what the run has spent so far during a pass (the
    graph's own events come only between steps).

    Args:
        spec: What to run.
        saver: The store's checkpointer (wrapped in a `CheckpointGate`).
        thread_id: The run's LangGraph thread.
        resume: Continue the thread instead of sending the prompt.
        configurable: Extra graph configuration (the run's checkpoint fence,
            `rubric_core.store.Fence`), passed to the runner.

    """

    def __init__(self, spec: RunSpec, saver: BaseCheckpointSaver[Any], thread_id: str, *,
                 resume: bool, configurable: Mapping[str, Any] | None = None) -> None:
        self.gate = CheckpointGate(saver)
        self._queue: queue.Queue[Any] = queue.Queue()
        self._args = (spec, thread_id, resume)
        self._configurable = configurable
        self._thread = threading.Thread(target=self._pump, daemon=True,
                                        name=f"run-{thread_id[:8]}")

    def _pump(self) -> None:
        spec, thread_id, resume = self._args
        events = run_rubric(spec, checkpointer=self.gate, thread_id=thread_id, resume=resume,
                            configurable=self._configurable, call_listener=self._call_ended)
        try:
            for event in events:
                if self.gate.closed:
                    break  # abandoned: nobody reads on
                self._queue.put(event)
        except BaseException as exc:  # handed to the reader, who raises it
            self._queue.put(exc)
        finally:
            events.close()  # waits here, on this thread, for a node still running
            self._queue.put(_DONE)

    def _call_ended(self, record: ModelCallRecord) -> None:
        if not self.gate.closed:  # abandoned: nobody reads on
            self._queue.put(CallFinished(type="call_finished", call=record))

    def events(self, stop: threading.Event, check: Callable[[], None] | None = None
               ) -> Iterator[RunEvent]:
        """The run's events as they come, until it ends or ``stop`` is set.

        Once ``stop`` is set the graph is abandoned (`abandon`), the events it had already
        sent are yielded, and the iteration ends without a ``run_finished``.

        Args:
            stop: Set it (from any thread) to stop the run.
            check: Called while waiting (e.g. to raise when the run was taken over).

        Raises:
            Exception: Whatever the runner raised (a spec that cannot run).

        """
        if self._thread.ident is None:  # not started yet
            self._thread.start()
        while True:
            try:
                item = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                if check is not None:
                    check()
                if stop.is_set():
                    self.abandon()
                    yield from self._drain()
                    return
                continue
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
            if stop.is_set():
                self.abandon()
                yield from self._drain()
                return

    def _drain(self) -> Iterator[RunEvent]:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is _DONE or isinstance(item, BaseException):
                return
            yield item

    def abandon(self) -> None:
        """Close the gate: the graph writes nothing more, and its thread ends on its own."""
        self.gate.close()


__all__ = ["POLL_S", "VERDICT_CHANNEL", "CheckpointGate", "RunAbandoned", "RunPump"]
