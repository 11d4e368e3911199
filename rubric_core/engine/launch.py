"""Launching the queue engine (DBOS Transact) in this process, on the store's own database.

Why DBOS: experiment cells need a durable queue with a global concurrency limit, a rate limit,
idempotent enqueue and recovery of a dead worker's items; DBOS keeps all of that in tables of
the database we already use, so there is no server to run (issue #27). Why this module: DBOS
is a process-wide singleton with settings that must be the same on every process sharing a
database, so they are written once, here:

- Where: PostgreSQL: the store's own database, DBOS's tables in their own schema
  (`SYSTEM_SCHEMA`), through an engine we build, so DBOS never tries ``CREATE DATABASE``.
  SQLite: a sibling file of the store's (``NAME.engine.sqlite3``, `engine_database`), never
  the store's own file (DBOS migrates its database as it likes), in WAL mode with
  ``synchronous=NORMAL`` like the store's (`EngineFileConnection`).
- `APPLICATION_VERSION`, pinned: DBOS recovers and dequeues only the workflows of its own
  application version, and would otherwise derive it from a hash of the source, so any code
  change (an upgrade of Rubric Studio or of DBOS) would strand the cells queued or running
  under the old one. Change it only with a migration note (README, the queue engine).
- The portable JSON serializer, not pickle: a cell's inputs and result are ids and statuses,
  readable by any process and never code.
- Each process gets its own executor ID (`rubric_core.registry.new_owner`: host, pid, random),
  so a process that stopped is recognised as gone (`rubric_core.engine.recovery`), except a
  worker supervised by ``eval --workers``, which keeps the ID its supervisor made for its slot
  (the supervisor's host and pid) across restarts (`rubric_core.engine.supervisor`). DBOS 3.4.0
  has no admin server; Conductor and OTLP stay off (no key, no endpoint): nothing listens and
  nothing is called outside the database.
- DBOS runs queued async workflows on the event loop that launched it: it is launched on
  `rubric_core.background.work_loop`, where the experiments' chat models and HTTP clients
  live.
- Which queues a process takes cells from: a worker (``rubric-studio worker``) every
  experiment's; a process that drives experiments (``eval``, the app) only theirs
  (`listen`), so it never starts another experiment's cell that it would abandon when it exits.
  DBOS 3.4.0's queue thread rereads its list of queues to listen to every second, so a queue is
  added to it after launch (`listen`, a private attribute).
- On the embedded SQLite file (one process runs the cells), a queue's worker thread is woken
  when a slot of its queue frees in this process (`rubric_core.engine.wake`, two more private
  points of DBOS 3.4.0), instead of waiting for its next poll. Not on PostgreSQL: there the
  process that freed a slot would take it again before any other process polled.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rubric_core.background import work_loop
from rubric_core.library_logs import CurrentStderr, library_logs_routed
from rubric_core.registry import new_owner

if TYPE_CHECKING:
    from collections.abc import Iterator

    from rubric_core.store import Store

APP_NAME = "rubric-studio"
"""DBOS's application name: queues and workflows are listed per application."""

APPLICATION_VERSION = "rubric-studio-cells-1"
"""Pinned DBOS application version (see the module docstring). Workflows queued under another
version are neither run nor recovered by this code."""

SYSTEM_SCHEMA = "rubric_engine"
"""The PostgreSQL schema DBOS's tables go in (ours are in ``public``)."""

ENGINE_SUFFIX = ".engine.sqlite3"
"""Names the SQLite engine file beside the store's: ``runs.sqlite3`` → ``runs.engine.sqlite3``."""

_PG_POOL = 8  # connections per process: the queue threads, recovery, cancellations


@dataclasses.dataclass(frozen=True)
class Engine:
    """The engine as launched in this process."""

    location: str
    """The store's database it serves (a SQLite path or a URL with its password: never shown)."""
    store: Store
    """The store the engine was launched with, which the cells write through (a closed store
    opens new connections when used)."""
    executor_id: str
    """This process's DBOS executor ID."""
    listening: list[str] | None
    """The queues this process takes cells from; None: every queue (a worker)."""


_lock = threading.RLock()  # `engine_for` launches with it held
_launched: list[Engine] = []
_users = [0]  # how many `engine_for` holds are open (experiments this process drives now)


def engine_database(store_location: str) -> str:
    """The DBOS system database URL for a store's location (see the module docstring)."""
    if store_location.startswith(("postgresql://", "postgres://")):
        return "postgresql://" + store_location.split("://", 1)[1]
    path = Path(store_location)
    name = (path.stem if path.suffix else path.name) + ENGINE_SUFFIX
    return f"sqlite:///{path.with_name(name)}"


class EngineFileConnection(sqlite3.Connection):
    """DBOS's connections to the engine's SQLite file: WAL, ``synchronous=NORMAL``.

    DBOS 3.4.0 leaves its SQLite file in SQLite's defaults, a rollback journal and
    ``synchronous=FULL``: every one of its transactions (a cell's dequeue, its start, its
    outcome: several a cell) created, synced and deleted a journal file, 1.0 ms of wall time
    and 0.45 ms of CPU a commit on this machine's disk against 0.02 ms in WAL with
    ``synchronous=NORMAL`` (measured with plain ``sqlite3``), on the threads that hand the
    next cell its slot. The pairing is SQLite's recommended one for WAL and the store's own
    (`rubric_core.store._sqlite`): a commit survives the process being killed; a power loss
    may take the last commits back, never leave the file corrupt, and recovery redoes what a
    lost outcome would have said (`rubric_core.engine.recovery`). Given to DBOS as the
    ``factory`` of its SQLite engine's connections (its public ``db_engine_kwargs``); WAL is
    the file's own setting, made once by the first connection.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            self.execute("PRAGMA journal_mode = WAL")
        self.execute("PRAGMA synchronous = NORMAL")


def _config(location: str, executor_id: str) -> dict[str, Any]:
    from dbos import DBOSPortableJSONSerializer

    url = engine_database(location)
    config: dict[str, Any] = {
        "name": APP_NAME, "system_database_url": url,
        "application_version": APPLICATION_VERSION, "executor_id": executor_id,
        "log_level": "WARNING", "serializer": DBOSPortableJSONSerializer(),
        "dbos_system_schema": SYSTEM_SCHEMA, "enable_otlp": False,
    }
    if url.startswith("postgresql://"):
        import sqlalchemy as sa

        from rubric_core.store._postgres import ENDS_IDLE_TRANSACTIONS

        engine_url = sa.make_url(url).set(drivername="postgresql+psycopg")
        # A paused process's DBOS transaction must not hold a workflow's row either; the
        # URL's own options are kept (libpq takes ``options`` from the keyword alone).
        own = engine_url.query.get("options", "")
        options = " ".join([*([own] if isinstance(own, str) else own),
                            ENDS_IDLE_TRANSACTIONS]).strip()
        config["system_database_engine"] = sa.create_engine(
            engine_url, pool_size=_PG_POOL, max_overflow=0, pool_pre_ping=True,
            pool_timeout=30, connect_args={"options": options})
    else:
        config["db_engine_kwargs"] = {"connect_args": {"factory": EngineFileConnection}}
    return config


def launch_engine(store: Store, *, every_queue: bool = True,
                  executor_id: str | None = None) -> Engine:
    """The engine of this process, launched on ``store``'s database the first time.

    Args:
        store: The database.
        every_queue: Take cells from every experiment's queue (a worker); False: only from
            the queues named later with `listen` (a process driving experiments).
        executor_id: Launch under this executor ID (a worker restarted by its supervisor,
            `rubric_core.engine.supervisor`): DBOS then re-queues at launch the cells the
            ID's previous process left running. None: a new one (`new_owner`). Ignored
            when the engine already runs in this process.

    An engine launched on another database is stopped first and launched again on this one
    when nothing holds it (`engine_for`): DBOS is one per process, and one process (the app, a
    test run) may use several databases one after the other.

    Raises:
        ValueError: The engine runs on another database in this process for an experiment
            it drives now, or as a worker (one database at a time per process), or it was
            launched to take cells from some queues only and is now asked to take them from
            every queue.

    """
    location = store.connect_location()
    with _lock:
        if _launched and _launched[0].location != location:
            if _users[0] or _launched[0].listening is None:
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
        from rubric_core.engine import (
            cell,  # registers the cell workflow
            item,  # registers the re-grade item workflow
            wake,
        )

        cell.rejoin()
        item.rejoin()

        executor_id = executor_id or new_owner()
        config = _config(location, executor_id)

        listening: list[str] | None = None if every_queue else []
        # Wakes only where one process runs the cells (the embedded SQLite file): between
        # processes they are unfair, the process that frees a slot takes it again before any
        # other polls, so a worker that did not grab slots first would get none (seen in
        # tests/test_engine_limits.py). On PostgreSQL freed slots go to whoever polls first.
        single_process = engine_database(location).startswith("sqlite")

        async def on_loop() -> None:  # DBOS adopts the loop it is launched on
            from dbos import DBOS

            instance = DBOS(config=config)  # type: ignore[arg-type]
            if single_process:  # a slot freed here starts the next cell at once
                wake.install(instance)
            else:
                wake.disarm()
            if listening is not None:
                DBOS.listen_queues([])
                # The very list DBOS's queue thread rereads: `listen` adds to it.
                instance._listening_queues = listening
            try:
                DBOS.launch()
            except BaseException:
                DBOS.destroy()  # a half-launched singleton could not be launched again
                raise

        _dbos_logs_to_current_stderr()
        _give_up_lost_writes_at_exit()
        asyncio.run_coroutine_threadsafe(on_loop(), work_loop()).result()
        # The caller's store, not a second one on the same file: opening a SQLite store reads
        # the file's header with a plain open() and close(), and closing any descriptor of the
        # file drops every POSIX lock this process holds on it, the live connections' too (the
        # process could then lose its WAL to another process that believes itself alone).
        engine = Engine(location=location, store=store.open(), executor_id=executor_id,
                        listening=listening)
        _launched.append(engine)
        return engine


@contextlib.contextmanager
def engine_for(store: Store) -> Iterator[Engine]:
    """`launch_engine` for a process driving experiments, held until the block ends.

    While held, the engine is not moved to another database (`launch_engine`).
    """
    with _lock:
        engine = launch_engine(store, every_queue=False)
        _users[0] += 1
    try:
        yield engine
    finally:
        with _lock:
            _users[0] -= 1


def listen(engine: Engine, queue: str) -> None:
    """Take cells from ``queue`` too (a process launched with ``every_queue=False``).

    Its first cells start at once where wakes are installed (`rubric_core.engine.wake.discover`),
    else within DBOS's one-second look for new queues plus a poll.
    """
    from rubric_core.engine import wake

    with _lock:
        if engine.listening is not None and queue not in engine.listening:
            engine.listening.append(queue)
    wake.discover(queue)


def current_engine() -> Engine | None:
    """The engine launched in this process, if any."""
    with _lock:
        return _launched[0] if _launched else None


def shutdown_engine(settle_s: float = 5.0) -> None:
    """Stop this process's engine (nothing runs here afterwards); a later launch starts again.

    Waits up to ``settle_s`` for the cells that ended here to have their ending recorded by
    DBOS; cells still running are left to recovery (`rubric_core.engine.recovery`).
    """
    with _lock:
        _shutdown(settle_s)


def _shutdown(settle_s: float) -> None:
    """`shutdown_engine` with `_lock` held."""
    if not _launched:
        return
    engine = _launched.pop()
    from dbos import DBOS

    deadline = time.monotonic() + settle_s

    def settle() -> None:
        with contextlib.suppress(Exception):  # a database gone already: nothing to wait for
            while time.monotonic() < deadline and DBOS.list_workflows(
                    status="PENDING", executor_id=engine.executor_id, load_input=False,
                    load_output=False):
                time.sleep(0.05)

    # In a thread of its own, waited for at most settle_s: DBOS retries a lost database
    # without end, and a process stopping its engine must not wait for it to come back.
    waiting = threading.Thread(target=settle, name="rubric-engine-settle", daemon=True)
    waiting.start()
    waiting.join(settle_s + 1.0)
    _stop_retrying_lost_writes()
    DBOS.destroy(workflow_completion_timeout_sec=0)

    async def own_threads() -> None:
        # DBOS made its thread pool the loop's default executor and has shut it down.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor())

    asyncio.run_coroutine_threadsafe(own_threads(), work_loop()).result()


def _stop_retrying_lost_writes() -> None:
    """Make the writes DBOS is retrying against a lost database give up at their next try.

    DBOS 3.4.0 retries a system-database write that lost its connection without end, sleeping
    up to 90 s between tries, on its pool's threads, which the interpreter joins at exit: a
    process whose database is gone for good never exited once its engine had such a write
    (seen as a test run hanging at exit for an hour). Once the engine stops nothing waits for
    those writes (what they would have recorded is redone by recovery,
    `rubric_core.engine.recovery`), so they stop at their next try instead of retrying on.
    DBOS reads this per write (its client's ``retry_connection_errors=False``); the runtime
    has no setting for it, hence the private attribute.
    """
    from dbos import _dbos

    instance = _dbos._dbos_global_instance
    sys_db = getattr(instance, "_sys_db_field", None)
    if sys_db is not None:
        sys_db._retry_connection_errors = False


_at_exit: list[bool] = []


def _give_up_lost_writes_at_exit() -> None:
    """At the interpreter's exit, `_stop_retrying_lost_writes` before threads are waited for.

    A CLI or app process that exits with its engine launched would otherwise wait without end
    for DBOS's retrying threads when its database is gone for good. ``atexit`` runs too late
    (after the threads are joined); ``threading._register_atexit`` is the hook
    `concurrent.futures` itself uses for its pools. Registered once per process.
    """
    if _at_exit:
        return
    _at_exit.append(True)
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        with contextlib.suppress(RuntimeError):  # the interpreter is exiting already
            register(_stop_retrying_lost_writes)


DBOS_CONSOLE_HANDLER = "__dbos_console_log_handler__"
"""The name DBOS 3.4.0 gives its console log handler, which it adds only to a ``dbos`` logger
that has no handler yet (and whose level its ``consoleLogLevel`` setting changes)."""


class _CurrentStderr(CurrentStderr):
    """`CurrentStderr` under the name of DBOS's console handler, in its place.

    DBOS's own console handler keeps the ``sys.stderr`` of the first launch in the process,
    and DBOS flushes it on every later launch: once that stream is closed (a test's captured
    stderr, an app that redirected its output), the next launch fails with "I/O operation on
    closed file", and its warnings go nowhere.
    """

    def __init__(self) -> None:
        super().__init__()
        self.name = DBOS_CONSOLE_HANDLER


def _dbos_logs_to_current_stderr() -> None:
    """Put `_CurrentStderr` in place of DBOS's console handler, before DBOS is constructed.

    Before: DBOS's constructor flushes its handlers (the stale stream's flush is what fails),
    and adds its own only when the ``dbos`` logger has none. Its records do not propagate to
    the root logger, as DBOS sets up itself: an app's own logging configuration does not show
    them twice. DBOS logs every queue it registers at INFO, and our commands print their own
    progress: WARNING and above only. A command that chose where library records go
    (`rubric_core.library_logs`, ``--verbose`` or ``--log-file``) keeps its choice.
    """
    dbos_logger = logging.getLogger("dbos")
    dbos_logger.setLevel(logging.WARNING)
    for handler in list(dbos_logger.handlers):
        if handler.name == DBOS_CONSOLE_HANDLER and not isinstance(handler, _CurrentStderr):
            dbos_logger.removeHandler(handler)
    if library_logs_routed():  # a command chose where they go: a file, stderr or nowhere
        dbos_logger.propagate = False
        return
    if not any(isinstance(h, _CurrentStderr) for h in dbos_logger.handlers):
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s (%(name)s) %(message)s",
                                               datefmt="%H:%M:%S"))
        dbos_logger.addHandler(handler)
    dbos_logger.propagate = False


__all__ = ["APPLICATION_VERSION", "APP_NAME", "SYSTEM_SCHEMA", "Engine", "current_engine",
           "engine_database", "engine_for", "launch_engine", "listen", "shutdown_engine"]
