"""LangGraph's ``PostgresSaver``, made to keep no secret and to fail with a `StoreError`.

``PostgresSaver`` writes a channel's value through its serializer only when it is not a
primitive: strings, numbers and booleans go into the ``checkpoints`` row's JSONB as they are,
as does the metadata. `rubric_core.redact.RedactingSerializer` never sees them, so they are
scrubbed here before ``put`` (SQLite's saver serializes the whole checkpoint, so there only the
metadata needs it: `rubric_core.redact.scrub_checkpoint_config`).

A database error inside any of the saver's operations (the server went away mid-run, say)
comes out as the store's `StoreError`, with the message `PostgresBackend.error` writes: the
caller (the runner, a page, the CLI) is told what happened and what to do, and never sees a
psycopg exception or a password. Imported only with the ``postgres`` extra installed.

Fenced writes (`rubric_core.store._fence`): a ``put`` or ``put_writes`` whose config carries a
`Fence` runs in one transaction that first reads the run's owner ``FOR SHARE`` (writes of one
owner do not wait for each other; a claim's ``UPDATE`` of the row waits for them, and a write
after the claim reads the new owner and is refused), statement by statement, never pipelined,
``executemany`` included (`_OneAtATime`), so the server ends it if its process pauses inside it
(`_postgres.ENDS_IDLE_TRANSACTIONS`, `_postgres.execute_each`).
Unfenced, ``PostgresSaver`` runs a write's statements on an autocommit connection.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from langgraph.checkpoint.postgres import PostgresSaver

from rubric_core.redact import redact_data, scrub_checkpoint_config, secret_values
from rubric_core.store import _fence
from rubric_core.store._async_saver import SyncBackedAsyncSaver
from rubric_core.store._schema import execute_each

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata
    from langgraph.checkpoint.serde.base import SerializerProtocol
    from psycopg import Cursor
    from psycopg.rows import DictRow
    from psycopg_pool import ConnectionPool


_FENCE_SQL = _fence.OWNER_SQL.replace("?", "%s") + " FOR SHARE"


class _OneAtATime:
    """A cursor whose ``executemany`` sends one statement at a time (`_postgres.execute_each`).

    What a fenced write's statements run on: ``PostgresSaver`` writes blobs and writes with
    ``executemany``, which psycopg pipelines, leaving the transaction untimed right after it.
    """

    def __init__(self, cursor: Cursor[DictRow]) -> None:
        self._cursor = cursor

    def executemany(self, query: Any, params_seq: Iterable[Any], *,
                    returning: bool = False) -> None:
        if returning:  # not used by the saver; its results would be the last statement's only
            msg = "executemany(returning=True) is not supported on a fenced write"
            raise NotImplementedError(msg)
        execute_each(self._cursor, query, params_seq)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class RedactingPostgresSaver(SyncBackedAsyncSaver, PostgresSaver):
    """A ``PostgresSaver`` whose inline values are scrubbed and whose errors are explained.

    Its async methods (for ``astream``) run the sync ones in worker threads.

    Args:
        pool: The store's connection pool.
        serde: The serializer (the store passes a redacting one).
        errors: The exception types that mean a database failure.
        explain: Turns one of them into the `StoreError` to raise instead.

    """

    def __init__(self, pool: ConnectionPool[Any], *, serde: SerializerProtocol,
                 errors: tuple[type[Exception], ...],
                 explain: Callable[[Exception], Exception]) -> None:
        super().__init__(cast("Any", pool), serde=serde)
        self._errors = errors
        self._explain = explain

    @contextmanager
    def _cursor(self, *, pipeline: bool = False) -> Iterator[Cursor[DictRow]]:
        # Every operation of PostgresSaver (get, list, put, writes, delete, setup) runs here.
        fence = _fence.current()
        try:
            # Not pipelined when fenced: a session in or just out of a pipeline is not timed,
            # so a process paused mid-write would hold the row's lock past the server's
            # idle-transaction timeout (`rubric_core.store._postgres.execute_each`).
            with super()._cursor(pipeline=pipeline and fence is None) as cur:
                if fence is None:
                    yield cur
                else:
                    with cur.connection.transaction():
                        cur.execute(_FENCE_SQL, (fence.run_id,))
                        fence.admit(cur.fetchone())
                        yield cast("Cursor[DictRow]", _OneAtATime(cur))
        except self._errors as exc:
            raise self._explain(exc) from exc

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Scrub the primitives stored inline, then save as ``PostgresSaver`` does."""
        known = secret_values()
        values = {key: redact_data(value, secrets=known) if isinstance(value, str) else value
                  for key, value in checkpoint["channel_values"].items()}
        scrubbed = cast("Checkpoint", {**checkpoint, "channel_values": values})
        clean_config, clean_metadata = scrub_checkpoint_config(config, metadata)
        with _fence.writing(config):
            return super().put(cast("RunnableConfig", clean_config), scrubbed,
                               cast("CheckpointMetadata", clean_metadata), new_versions)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Save as ``PostgresSaver`` does, fenced when the config carries a `Fence`."""
        with _fence.writing(config):
            super().put_writes(config, writes, task_id, task_path)
