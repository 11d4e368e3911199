"""The queue engine of this process: DBOS launched once on the store's own database.

`Engine` holds everything the engine keeps in this process (the batches attached, the units
running, Stop's and leaving's state, the queues' limits for wakes); `current_engine` is the one
launched. Settings every process sharing a database must share are written here once: where
DBOS's tables are (`engine_database`: PostgreSQL's own database in `SYSTEM_SCHEMA`, or a
SQLite file beside the store's, in WAL), the pinned `APPLICATION_VERSION`, the portable JSON
serializer, one executor ID per process (`rubric_core.registry.new_owner`, or a supervised
worker slot's). DBOS runs on `rubric_core.background.work_loop`. A worker takes units from every
queue; a process driving experiments or re-grades only from the queues it `listen` s to. Why
each: ``docs/engine.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rubric_core.background import work_loop
from rubric_core.engine import _dbos
from rubric_core.engine.runtime import LAUNCHED as _launched
from rubric_core.engine.runtime import LOCK as _lock
from rubric_core.engine.runtime import Engine, current_engine
from rubric_core.engine.wake import Wakeable
from rubric_core.registry import new_owner

if TYPE_CHECKING:
    from collections.abc import Iterator

    from rubric_core.store import Store

APP_NAME = "rubric-studio"
"""DBOS's application name: queues and workflows are listed per application."""

APPLICATION_VERSION = "rubric-studio-cells-1"
"""Pinned DBOS application version: DBOS runs and recovers only its own version's workflows.
Change it only with a migration note (README, the queue engine)."""

SYSTEM_SCHEMA = "rubric_engine"
"""The PostgreSQL schema DBOS's tables go in (ours are in ``public``)."""

ENGINE_SUFFIX = ".engine.sqlite3"
"""Names the SQLite engine file beside the store's: ``runs.sqlite3`` → ``runs.engine.sqlite3``."""

_PG_POOL = 8  # connections per process: the queue threads, recovery, cancellations




def engine_database(store_location: str) -> str:
    """The DBOS system database URL for a store's location (see the module docstring)."""
    if store_location.startswith(("postgresql://", "postgres://")):
        return "postgresql://" + store_location.split("://", 1)[1]
    path = Path(store_location)
    name = (path.stem if path.suffix else path.name) + ENGINE_SUFFIX
    return f"sqlite:///{path.with_name(name)}"


class EngineFileConnection(sqlite3.Connection):
    """DBOS's connections to the engine's SQLite file: WAL and ``synchronous=NORMAL``.

    As the store's; DBOS leaves SQLite's defaults (a journal file made, synced and deleted per
    commit).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            self.execute("PRAGMA journal_mode = WAL")
        self.execute("PRAGMA synchronous = NORMAL")


def _config(location: str, executor_id: str) -> dict[str, Any]:
    url = engine_database(location)
    if not url.startswith("postgresql://"):
        return _dbos.config(name=APP_NAME, url=url, version=APPLICATION_VERSION,
                            executor_id=executor_id, schema=SYSTEM_SCHEMA, engine=None,
                            connect_args={"factory": EngineFileConnection})
    import sqlalchemy as sa

    from rubric_core.store._postgres import ENDS_IDLE_TRANSACTIONS

    engine_url = sa.make_url(url).set(drivername="postgresql+psycopg")
    # A paused process's transaction must not hold a workflow's row; the URL's options are kept.
    own = engine_url.query.get("options", "")
    options = " ".join([*([own] if isinstance(own, str) else own),
                        ENDS_IDLE_TRANSACTIONS]).strip()
    engine = sa.create_engine(engine_url, pool_size=_PG_POOL, max_overflow=0,
                              pool_pre_ping=True, pool_timeout=30,
                              connect_args={"options": options})
    return _dbos.config(name=APP_NAME, url=url, version=APPLICATION_VERSION,
                        executor_id=executor_id, schema=SYSTEM_SCHEMA, engine=engine,
                        connect_args=None)


def launch_engine(store: Store, *, every_queue: bool = True,
                  executor_id: str | None = None) -> Engine:
    """The engine of this process, launched on ``store``'s database the first time.

    Args:
        store: The database.
        every_queue: Take units from every queue (a worker); False: only from the queues named
            later with `listen` (a process driving experiments or re-grades).
        executor_id: Launch under this executor ID (a worker restarted by its supervisor: DBOS
            re-queues at launch what the ID's previous process left running); None: a new one.
            Ignored when the engine already runs in this process.

    An engine launched on another database is stopped first and launched again on this one
    when nothing holds it (`engine_for`): DBOS is one per process.

    Raises:
        ValueError: The engine runs on another database for a batch it drives now, or as a
            worker, or it takes units from some queues only and is asked for every queue.

    """
    location = store.connect_location()
    with _lock:
        if _launched and _launched[0].location != location:
            if _launched[0].holds or _launched[0].listening is None:
                msg = (f"the queue engine of this process runs on {_launched[0].store.location} "
                       f"for an experiment it runs now, not {store.location}: one database at "
                       "a time per process (let it end, or stop it)")
                raise ValueError(msg)
            _shutdown(settle_s=1.0)
        if _launched:
            if every_queue and _launched[0].listening is not None:
                msg = ("the queue engine of this process runs the cells of the experiments it "
                       "drives only; start a worker in a process of its own")
                raise ValueError(msg)
            return _launched[0]
        if os.environ.get("DBOS__CLOUD") == "true":
            # DBOS Cloud mode replaces the pinned version and may connect to Conductor.
            msg = "DBOS__CLOUD is set: Rubric Studio's queue engine runs only self-hosted"
            raise ValueError(msg)
        executor_id = executor_id or new_owner()
        conf = _config(location, executor_id)
        # The caller's store, not a second one on the same file: opening a SQLite store reads
        # the file's header with a plain open() and close(), and closing any descriptor of the
        # file drops every POSIX lock this process holds on it, the live connections' too.
        engine = Engine(location=location, store=store.open(), executor_id=executor_id,
                        listening=None if every_queue else [])

        def wakeable(stop: threading.Event, active: Any) -> Wakeable:
            engine.wakeable = Wakeable(stop, active, engine.limits)
            return engine.wakeable

        # Wakes only where one process runs the units (the embedded SQLite file): between
        # processes the one that frees a slot would take it again before any other polls.
        wakes = engine_database(location).startswith("sqlite")

        async def on_loop() -> None:  # DBOS adopts the loop it is launched on
            _dbos.launch(conf, listening=engine.listening, wakeable=wakeable if wakes else None)

        asyncio.run_coroutine_threadsafe(on_loop(), work_loop()).result()
        _launched.append(engine)
        return engine


@contextlib.contextmanager
def engine_for(store: Store) -> Iterator[Engine]:
    """`launch_engine` for a process driving batches, held (not moved) until the block ends."""
    with _lock:
        engine = launch_engine(store, every_queue=False)
        engine.holds += 1
    try:
        yield engine
    finally:
        with _lock:
            engine.holds -= 1


def listen(engine: Engine, queue: str) -> None:
    """Take units from ``queue`` too (a process launched with ``every_queue=False``).

    Its first units start at once where wakes are installed, else within DBOS's look for new
    queues (once a second).
    """
    with _lock:
        if engine.listening is not None:
            _dbos.listen_also(engine.listening, queue)
    if engine.wakeable is not None:
        engine.wakeable.discover(queue)


def shutdown_engine(settle_s: float = 5.0) -> None:
    """Stop this process's engine; a later launch starts again.

    Waits up to ``settle_s`` for the units that ended here to have their ending recorded;
    units still running are left to recovery (`rubric_core.engine.recovery`).
    """
    with _lock:
        _shutdown(settle_s)


def _shutdown(settle_s: float) -> None:
    """`shutdown_engine` with `_lock` held."""
    if not _launched:
        return
    engine = _launched.pop()
    deadline = time.monotonic() + settle_s

    def settle() -> None:
        with contextlib.suppress(Exception):  # a database gone already: nothing to wait for
            while time.monotonic() < deadline and _dbos.list_workflows_sync(
                    status=_dbos.RUNNING, executor_id=engine.executor_id):
                time.sleep(0.05)

    # In a thread of its own, waited for at most settle_s: DBOS retries a lost database
    # without end, and a process stopping its engine must not wait for it to come back.
    waiting = threading.Thread(target=settle, name="rubric-engine-settle", daemon=True)
    waiting.start()
    waiting.join(settle_s + 1.0)
    _dbos.destroy()

    async def own_threads() -> None:
        # DBOS made its thread pool the loop's default executor and has shut it down.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor())

    asyncio.run_coroutine_threadsafe(own_threads(), work_loop()).result()


__all__ = ["APPLICATION_VERSION", "APP_NAME", "SYSTEM_SCHEMA", "Engine", "current_engine",
           "engine_database", "engine_for", "launch_engine", "listen", "shutdown_engine"]
