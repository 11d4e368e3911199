"""One experiment run by several processes on this machine (``rubric-studio eval --workers N``).

A process is bound to one CPU core by Python's GIL, so more processes use more cores. This one
runs its share of the experiment's cells, and N - 1 helper processes (``python -m
rubric_core.workers``) run theirs; they share the cells through the store's leases, as workers
on other machines would. The concurrency and per-model limits are totals over all of them,
shared out by `WorkerPlan`.

Stopping: when this process stops early (Ctrl-C, an error), it asks every helper to stop with
SIGTERM, which a helper turns into a clean stop (its running cells end ``interrupted`` and
resume later), waits, and kills the ones that do not end. SIGTERM, not SIGINT, because a
process started as a background job of a script inherits SIGINT ignored, and a helper must
stop when asked even then.

This module is deliberately small and self-contained: a queue engine will take its place.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
from typing import IO, TYPE_CHECKING

from rubric_core.experiments import check_limits, run_experiment
from rubric_core.redact import install_log_redaction, install_traceback_redaction, redact
from rubric_core.store import DB_ENV_VAR, Store

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping
    from pathlib import Path
    from types import FrameType

    from rubric_core.types import ExperimentEvent

STOP_TIMEOUT_S = 30.0
"""How long a helper asked to stop may take to end its cells before it is killed."""

LOG_TAIL_CHARS = 1000
"""How much of a failed helper's standard error its failure message quotes."""


def shares(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` whole numbers as even as can be (the first ones larger)."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerPlan:
    """What each process of one run may do at once: entry 0 is this process's share."""

    concurrency: tuple[int, ...]
    """Cells at once, per process."""
    per_model: tuple[dict[str, int], ...]
    """Cells at once using a model, by model string, per process."""

    @property
    def workers(self) -> int:
        """How many processes run the experiment (this one included)."""
        return len(self.concurrency)

    @classmethod
    def split(cls, *, workers: int, concurrency: int,
              per_model: Mapping[str, int] | None = None) -> WorkerPlan:
        """Share the limits out between ``workers`` processes.

        Args:
            workers: Processes, this one included (1: no helpers).
            concurrency: Cells at once over all processes (1 to ``MAX_CONCURRENCY``).
            per_model: Cells at once using a model over all processes, by model string.

        Raises:
            ValueError: A limit out of range, more workers than cells at once, or a per-model
                limit smaller than the number of workers (each process runs at least one).

        """
        per_model = dict(per_model or {})
        check_limits(concurrency, per_model)
        if not 1 <= workers <= concurrency:
            msg = (f"workers must be from 1 to the concurrency ({concurrency}), got {workers}: "
                   "each worker runs at least one cell at a time")
            raise ValueError(msg)
        for model, limit in per_model.items():
            if limit < workers:
                msg = (f"model limit {model}={limit} is shared out between {workers} workers: "
                       f"give each at least one (a limit of at least {workers})")
                raise ValueError(msg)
        limits = {model: shares(limit, workers) for model, limit in per_model.items()}
        return cls(concurrency=tuple(shares(concurrency, workers)),
                   per_model=tuple({m: n[i] for m, n in limits.items()}
                                   for i in range(workers)))


class Helpers:
    """The helper processes of one run (see `start_helpers`)."""

    def __init__(self) -> None:
        self.procs: list[tuple[subprocess.Popen[bytes], IO[bytes]]] = []

    def wait(self) -> list[str]:
        """Wait for every helper to end; a message for each that failed (with its stderr)."""
        failed = []
        for index, (proc, log) in enumerate(self.procs, start=2):
            code = proc.wait()
            if code != 0:
                log.seek(0)
                tail = redact(log.read().decode("utf-8", "replace").strip()[-LOG_TAIL_CHARS:])
                failed.append(f"worker {index} (pid {proc.pid}) exited {code}: {tail}")
        return failed

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Ask every helper still running to stop cleanly; kill those that take too long."""
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in self.procs:
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def start_helpers(experiment_id: str, db: str | Path, plan: WorkerPlan, *,
                  retry_errors: bool = False) -> Iterator[Helpers]:
    """Start a helper process for each share of ``plan`` but the first.

    The database goes to them in the environment, not on the command line (a URL's password
    would show in ``ps``). If the body raises (KeyboardInterrupt included), the helpers are
    stopped (`Helpers.stop`) before the exception goes on.
    """
    helpers = Helpers()
    env = {**os.environ, DB_ENV_VAR: str(db)}
    try:
        for concurrency, per_model in zip(plan.concurrency[1:], plan.per_model[1:], strict=True):
            cmd = [sys.executable, "-m", "rubric_core.workers", experiment_id,
                   "--concurrency", str(concurrency), "--per-model", json.dumps(per_model),
                   *(["--retry-errors"] if retry_errors else [])]
            log: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed after it ends
            try:
                proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=log)
            except BaseException:
                log.close()
                raise
            helpers.procs.append((proc, log))
        yield helpers
    except BaseException:
        helpers.stop()
        raise
    finally:
        for _, log in helpers.procs:
            log.close()


def run_with_workers(store: Store, experiment_id: str, plan: WorkerPlan, *, db: str | Path,
                     on_event: Callable[[ExperimentEvent], None],
                     retry_errors: bool = False) -> list[str]:
    """Run an experiment here and in ``plan.workers - 1`` helper processes, until it ends.

    Args:
        store: The database, open in this process.
        experiment_id: The experiment (already created).
        plan: The limits of each process (`WorkerPlan.split`).
        db: Where the helpers open the same database: a SQLite path or a URL.
        on_event: Called with each of this process's `run_experiment` events.
        retry_errors: Also run again the cells that ended in an error.

    Returns:
        A message for each helper that failed; its cells are left for a later resume.

    Raises:
        KeyError: No such experiment.
        ValueError: A share out of `run_experiment`'s range.
        KeyboardInterrupt: Ctrl-C; every helper was stopped cleanly first.

    """
    with start_helpers(experiment_id, db, plan, retry_errors=retry_errors) as helpers:
        for event in run_experiment(store, experiment_id, retry_errors=retry_errors,
                                    concurrency=plan.concurrency[0],
                                    per_model=plan.per_model[0]):
            on_event(event)
        return helpers.wait()


# -- the helper process ---------------------------------------------------------------------


def _stop_once(signum: int, frame: FrameType | None) -> None:  # noqa: ARG001 - signal API
    """A helper's SIGTERM (and SIGINT) handler: stop cleanly, and let nothing interrupt that."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def helper_main(argv: list[str]) -> int:
    """A helper process: run one share of an experiment until no cell is left.

    The database is named by the environment (``RUBRIC_STUDIO_DB``). Returns 0 when no cell
    is left, 2 on an error (its message on standard error), 130 when stopped.
    """
    from rubric_core.models import ModelConfigError
    from rubric_core.store import StoreError

    signal.signal(signal.SIGTERM, _stop_once)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # ignored: the parent's choice
        signal.signal(signal.SIGINT, _stop_once)
    try:
        install_log_redaction()
        install_traceback_redaction()
        parser = argparse.ArgumentParser(prog="python -m rubric_core.workers")
        parser.add_argument("experiment_id")
        parser.add_argument("--concurrency", type=int, required=True)
        parser.add_argument("--per-model", type=json.loads, default={})
        parser.add_argument("--retry-errors", action="store_true")
        args = parser.parse_args(argv)
        store = Store(os.environ[DB_ENV_VAR])
        try:
            for _ in run_experiment(store, args.experiment_id, concurrency=args.concurrency,
                                    per_model=args.per_model, retry_errors=args.retry_errors):
                pass
        finally:
            store.close()
    except KeyboardInterrupt:
        return 130
    except (KeyError, ValueError, ModelConfigError, StoreError, OSError) as exc:
        text = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        sys.stderr.write(f"error: {redact(str(text))}\n")
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(helper_main(sys.argv[1:]))
