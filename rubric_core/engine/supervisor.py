"""Local workers of one experiment, started and kept alive by ``eval --workers N``.

A `Supervisor` starts N ``rubric-studio worker`` processes that take cells from that
experiment's queue only (more processes use more cores; the queue's limits hold over all of
them), and restarts one that dies under its slot's executor ID, so DBOS re-queues at its launch
what the dead one left. Not restarted: a worker stopped by a signal (exit 130, or ended by
SIGINT or SIGTERM in its start-up) and a slot that died `RESTART_LIMIT` times; their cells are
handed back at once. A worker exits when its supervisor dies (its standard input reaches its
end). Stopping sends every worker SIGTERM and kills one that takes longer than
`STOP_TIMEOUT_S`. Why each: ``docs/engine.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import threading
from typing import IO, TYPE_CHECKING

from rubric_core.redact import redact
from rubric_core.registry import new_owner
from rubric_core.store import DB_ENV_VAR

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path
    from types import TracebackType

RESTART_LIMIT = 5
"""Restarts of one worker slot before the supervisor gives up on it."""

STOP_TIMEOUT_S = 40.0
"""How long a worker asked to stop may take before it is killed (its cells end their step
within `rubric_core.engine.worker.LEAVE_TIMEOUT_S`)."""

WATCH_S = 0.2
"""How often the supervisor looks for workers that died."""

LOG_TAIL_CHARS = 1000
"""How much of a failed worker's standard error its failure message quotes."""

STOPPED = 130
"""A worker's exit status when it was stopped by a signal it handled (never restarted)."""

_ASKED_TO_STOP = {STOPPED, -signal.SIGINT, -signal.SIGTERM}  # (the last two: in its start-up)


@dataclasses.dataclass(eq=False)
class Slot:
    """One worker of the supervisor: its executor ID and its current process."""

    number: int
    """Its number in messages, from 1."""
    executor_id: str
    """The DBOS executor ID every process of this slot launches under."""
    proc: subprocess.Popen[bytes] | None = None
    """The process running now (or the last one)."""
    log: IO[bytes] | None = None
    """The current process's standard error."""
    restarts: int = 0
    """How many times it was started again."""
    done: bool = False
    """Not watched any more (stopped, or given up on)."""


class Supervisor:
    """The N worker processes of ``eval --workers N`` (see the module docstring).

    Use as a context manager: entering starts the workers and the thread that restarts them;
    leaving stops them (also on KeyboardInterrupt, which then goes on).

    Args:
        db: The database, given to the workers in the environment (a URL's password would show
            in ``ps`` on a command line).
        experiment_id: The experiment whose queue the workers take cells from.
        count: How many workers.
        on_message: Called with a line to show for each start, restart and failure (from the
            supervisor's thread for restarts).
    """

    def __init__(self, db: str | Path, experiment_id: str, count: int, *,
                 on_message: Callable[[str], None] | None = None) -> None:
        self.db, self.experiment_id = db, experiment_id
        self.slots = [Slot(number=i + 1, executor_id=new_owner()) for i in range(count)]
        self.on_message = on_message
        self.failures: list[str] = []
        """A message per worker slot given up on, or that failed when stopped."""
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # spawning and stopping never overlap
        self._watcher: threading.Thread | None = None

    def __enter__(self) -> Supervisor:
        """Start every worker and the watcher."""
        try:
            with self._lock:
                for slot in self.slots:
                    self._spawn(slot)
            self._watcher = threading.Thread(target=self._watch, name="rubric-supervisor",
                                             daemon=True)
            self._watcher.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Stop every worker (see `stop`)."""
        self.stop()

    def _say(self, line: str) -> None:
        if self.on_message is not None:
            self.on_message(line)

    def _spawn(self, slot: Slot) -> None:
        """Start the slot's worker under its executor ID (the lock held)."""
        env = {**os.environ, DB_ENV_VAR: str(self.db)}
        # --verbose: its standard error is the log quoted when it fails, not a terminal.
        cmd = [sys.executable, "-m", "rubric_core", "worker", "--experiment",
               self.experiment_id, "--executor-id", slot.executor_id, "--supervised",
               "--verbose"]
        log: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed with the slot
        try:
            slot.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE,
                                         stdout=subprocess.DEVNULL, stderr=log)
        except BaseException:
            log.close()
            raise
        if slot.log is not None:
            slot.log.close()
        slot.log = log
        self._say(f"worker {slot.number}: pid {slot.proc.pid}")

    def _tail(self, slot: Slot) -> str:
        if slot.log is None:
            return ""
        slot.log.seek(0)
        return redact(slot.log.read().decode("utf-8", "replace").strip()[-LOG_TAIL_CHARS:])

    def _watch(self) -> None:
        """Restart the workers that died (see the module docstring) until `stop`."""
        while not self._stopping.wait(WATCH_S):
            with self._lock:
                if self._stopping.is_set():
                    return
                for slot in self.slots:
                    if slot.done or slot.proc is None or (code := slot.proc.poll()) is None:
                        continue
                    self._close_stdin(slot)
                    if code in _ASKED_TO_STOP:
                        slot.done = True
                        self._say(f"worker {slot.number} (pid {slot.proc.pid}) was stopped")
                        self._hand_back(slot)
                    elif slot.restarts >= RESTART_LIMIT:
                        slot.done = True
                        message = (f"worker {slot.number} (pid {slot.proc.pid}) exited {code} "
                                   f"{slot.restarts + 1} times, not restarted: "
                                   f"{self._tail(slot)}")
                        self.failures.append(message)
                        self._say(message)
                        self._hand_back(slot)
                    else:
                        slot.restarts += 1
                        old = slot.proc.pid
                        try:
                            self._spawn(slot)
                        except OSError as exc:
                            slot.done = True
                            self.failures.append(
                                f"worker {slot.number} could not be restarted: {exc}")
                            continue
                        assert slot.proc is not None
                        self._say(f"worker {slot.number} (pid {old}) exited {code}: restarted "
                                  f"under its executor ID as pid {slot.proc.pid}")

    @staticmethod
    def _hand_back(slot: Slot) -> None:
        """Re-queue at once the cells a slot that will not be restarted left running.

        Other processes' sweeps would only after `rubric_core.session.STALE_AFTER_S` (the pid
        its executor ID names, this one, is alive). Needs the engine launched in this process
        (the driver's); without it, the sweeps do it.
        """
        from rubric_core.engine import _dbos
        from rubric_core.engine.runtime import current_engine

        if current_engine() is None:
            return
        with contextlib.suppress(Exception):  # a busy database: the sweeps do it later
            _dbos.recover_executors_sync([slot.executor_id])

    @staticmethod
    def _close_stdin(slot: Slot) -> None:
        if slot.proc is not None and slot.proc.stdin is not None:
            with contextlib.suppress(OSError):
                slot.proc.stdin.close()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop restarting; ask every worker to stop (SIGTERM), kill those that take too long.

        Safe to call more than once. A worker's exit status other than 130 (stopped) is kept
        in `failures`.
        """
        self._stopping.set()
        with self._lock:
            for slot in self.slots:
                if slot.proc is not None and slot.proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        slot.proc.send_signal(signal.SIGTERM)
            for slot in self.slots:
                if slot.proc is None:
                    continue
                try:
                    code = slot.proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    slot.proc.kill()
                    code = slot.proc.wait()
                if not slot.done and code not in _ASKED_TO_STOP:
                    self.failures.append(f"worker {slot.number} (pid {slot.proc.pid}) exited "
                                         f"{code}: {self._tail(slot)}")
                slot.done = True
                self._close_stdin(slot)
                if slot.log is not None:
                    slot.log.close()
                    slot.log = None
        if self._watcher is not None and self._watcher is not threading.current_thread():
            # A Ctrl-C can interrupt the watcher's start (__enter__): it may not have begun,
            # and joining it would raise in place of the KeyboardInterrupt (exit 1, not 130).
            with contextlib.suppress(RuntimeError):
                self._watcher.join(timeout=5)


@contextlib.contextmanager
def supervised(db: str | Path, experiment_id: str, count: int, *,
               on_message: Callable[[str], None] | None = None) -> Iterator[Supervisor]:
    """`Supervisor` as a context (nothing started when ``count`` is 0)."""
    supervisor = Supervisor(db, experiment_id, count, on_message=on_message)
    if count == 0:
        yield supervisor
        return
    with supervisor:
        yield supervisor


__all__ = ["RESTART_LIMIT", "STOPPED", "STOP_TIMEOUT_S", "Slot", "Supervisor", "supervised"]
