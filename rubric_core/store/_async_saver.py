"""LangGraph's async checkpoint methods for the store's sync savers.

``SqliteSaver`` and ``PostgresSaver`` implement only the sync methods; a graph run with
``astream`` (`rubric_core.runner.arun_rubric`, every experiment cell) needs the async ones.
`SyncBackedAsyncSaver` supplies them over the sync ones: on a local SQLite file it calls them
on the event loop itself (a write takes a fraction of a millisecond, and a thread switch per
call would cost more CPU than the call), on PostgreSQL in a worker thread (a round trip to the
server must not hold up the loop's other runs).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping, Sequence

    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
    )

T = TypeVar("T")


async def in_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a worker thread, run to its end even if the caller is cancelled.

    A cancelled ``asyncio.to_thread`` may never start its call (a work item still queued is
    dropped), so a Stop landing just after a step would lose that step's checkpoint writes;
    and a write that did start would go on unseen. Here the call always runs, and a cancelled
    caller waits for it to end before the cancellation goes on.
    """
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        if not task.cancelled():
            task.exception()  # retrieved: the cancellation is what the caller is told
        raise


class SyncBackedAsyncSaver:
    """Mixin: ``aget_tuple``, ``alist``, ``aput``, ``aput_writes``, ... over the sync methods.

    Put it before the saver class in the bases. `run_on_loop` says where the sync calls run.
    """

    run_on_loop: ClassVar[bool] = False
    """True: call the sync method on the event loop; False: in a worker thread."""

    async def _call(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        if self.run_on_loop:
            return fn(*args, **kwargs)
        return await in_thread(fn, *args, **kwargs)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """``get_tuple``."""
        return await self._call(self.get_tuple, config)  # type: ignore[attr-defined]

    async def alist(
        self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None, limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """``list``, read whole before the first item is given."""
        def read() -> list[CheckpointTuple]:
            return list(self.list(config, filter=filter, before=before,  # type: ignore[attr-defined]
                                  limit=limit))

        for item in await self._call(read):
            yield item

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions,
                   ) -> RunnableConfig:
        """``put``."""
        return await self._call(self.put, config, checkpoint, metadata,  # type: ignore[attr-defined]
                                new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        """``put_writes``."""
        await self._call(self.put_writes, config, writes, task_id,  # type: ignore[attr-defined]
                         task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """``delete_thread``."""
        await self._call(self.delete_thread, thread_id)  # type: ignore[attr-defined]

    async def aget_delta_channel_history(self, *, config: RunnableConfig,
                                         channels: Sequence[str]) -> Mapping[str, Any]:
        """``get_delta_channel_history``."""
        return await self._call(
            self.get_delta_channel_history,  # type: ignore[attr-defined]
            config=config, channels=channels)
