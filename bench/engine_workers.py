"""Two queue-engine workers vs one on the same experiment, against the loopback server.

The engine's counterpart of `experiment_workers.py`: an experiment of N rows (each
``2 × passes`` model calls, a fixed delay per call) is queued on the engine (DBOS) by this
process, which runs no cell itself, and run to the end by one ``rubric-studio worker --db URL``
process, then a copy of it by two such processes started together. As there, each worker
brings ``--concurrency`` slots: the queue's global limit is ``workers × C`` and its
per-process limit C (DBOS's ``worker_concurrency``, set through DBOS's public queue API; the
engine has no such setting of its own yet). Reported: wall seconds from starting the
processes to the last cell ended (interpreter start-up and the engine's launch included), the
server's span (first request to last response), both ratios (target: two workers ≥ 1.8x
one), the most requests in flight, how many cells each worker ran, and that every cell ran
exactly once.

The database: by default a throwaway PostgreSQL cluster started for the run (as the tests'
`pg_support` does; needs PostgreSQL's binaries), or ``--db sqlite`` (a temporary file), where
DBOS counts a queue's running cells outside the claim's transaction, so several processes can
together exceed the global limit (the peak shows it).

Run from the repository root:

    .venv/bin/python bench/engine_workers.py               # 256 rows, 2 passes, C = 4
    .venv/bin/python bench/engine_workers.py --db sqlite --rows 128
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from experiment import CRITERION, TESTS, Server

from rubric_core.background import work_loop
from rubric_core.datasets import parse_dataset
from rubric_core.experiments import create_experiment
from rubric_core.settings import ExperimentConfig
from rubric_core.store import Store
from rubric_core.types import ENDED_STATUSES

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def throwaway_database(kind: str) -> Iterator[str]:
    """A temporary SQLite file (``sqlite``), or a database on a throwaway PostgreSQL cluster."""
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield str(Path(tmp) / "bench.sqlite3")
        return
    sys.path.insert(0, str(TESTS))
    from pg_support import create_database, postgres_server

    with postgres_server() as server:
        yield create_database(server)


def _queue(store: Store, rows: int, base_url: str, workers: int, concurrency: int) -> str:
    """Create an experiment and queue its cells (this process takes none of them)."""
    from dbos import DBOS

    from rubric_core.engine import launch_engine, queues

    data = "prompt\n" + "".join(f"question {i}\n" for i in range(rows))
    config = ExperimentConfig(worker_model="openai-compatible:w",
                              grader_model="openai-compatible:g", rubric=f"- {CRITERION}",
                              max_iterations=8, base_url=base_url)
    exp = create_experiment(store, parse_dataset(data, name="bench"), [config])
    launch_engine(store, every_queue=False)

    async def enqueue() -> None:
        await queues.register_queue(exp.experiment_id, concurrency=workers * concurrency)
        queue = await DBOS.retrieve_queue_async(queues.queue_name(exp.experiment_id))
        assert queue is not None
        await queue.set_worker_concurrency_async(concurrency)
        cells = store.experiment_cells(exp.experiment_id)
        await queues.enqueue_cells(exp.experiment_id, [(c.key, c.thread_id) for c in cells],
                                   retry_errors=False)

    asyncio.run_coroutine_threadsafe(enqueue(), work_loop()).result(timeout=120)
    return exp.experiment_id


def _run(db: str, store: Store, experiment_id: str, rows: int, count: int
         ) -> tuple[float, Counter[str]]:
    """Start ``count`` workers, wait for every cell to end; wall seconds and cells per pid."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": "bench-key"}
    started = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-m", "rubric_core", "worker", "--db", db],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for _ in range(count)]
    try:
        deadline = started + 30 + rows * 2
        while True:
            cells = store.experiment_cells(experiment_id)
            if all(c.status in ENDED_STATUSES for c in cells):
                break
            for proc in procs:
                if proc.poll() is not None:
                    msg = f"a worker exited: {proc.communicate()[1].decode()[-2000:]}"
                    raise SystemExit(msg)
            if time.monotonic() > deadline:
                msg = "the experiment did not end"
                raise SystemExit(msg)
            time.sleep(0.1)
        wall = time.monotonic() - started
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    per_pid = Counter((c.run.owner or "").split(":")[1] for c in cells if c.run is not None)
    return wall, per_pid


def _check(store: Store, experiment_id: str, rows: int) -> None:
    cells = store.experiment_cells(experiment_id)
    if [c.status for c in cells] != ["satisfied"] * rows:
        msg = f"not every cell satisfied: {Counter(c.status for c in cells)}"
        raise SystemExit(msg)
    threads = {c.thread_id for c in cells}
    runs = Counter(r.thread_id for r in store.list_runs(limit=None) if r.thread_id in threads)
    if [runs[c.thread_id] for c in cells] != [1] * rows:
        msg = "a cell ran more than once"
        raise SystemExit(msg)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--delay-ms", type=float, default=200.0)
    parser.add_argument("--concurrency", type=int, default=4, help="slots per worker")
    parser.add_argument("--db", choices=("postgresql", "sqlite"), default="postgresql")
    args = parser.parse_args()
    from rubric_core.engine import shutdown_engine

    server = Server(args.delay_ms / 1000, args.passes)
    print(f"{args.rows} rows x {2 * args.passes} calls, {args.delay_ms:g} ms per call, "
          f"{args.concurrency} slots per worker, engine on {args.db}")
    print(f"{'workers':>7} {'wall s':>7} {'span s':>7} {'peak':>5}  cells per worker")
    results = {}
    failed = False
    try:
        with throwaway_database(args.db) as db, Store(db) as store:
            for count in (1, 2):
                exp_id = _queue(store, args.rows, server.base_url, count, args.concurrency)
                wall, per_pid = _run(db, store, exp_id, args.rows, count)
                times, done, peak = server.stats()
                _check(store, exp_id, args.rows)
                results[count] = (wall, max(done) - min(times))
                print(f"{count:>7} {wall:>7.2f} {results[count][1]:>7.2f} {peak:>5}  "
                      + " ".join(str(n) for n in sorted(per_pid.values(), reverse=True)))
                if peak > count * args.concurrency:
                    print(f"FAIL: {peak} requests in flight, limit {count * args.concurrency}")
                    failed = True
            shutdown_engine()
    finally:
        server.close()
    (wall1, span1), (wall2, span2) = results[1], results[2]
    print(f"two workers vs one: {wall1 / wall2:.2f}x wall, {span1 / span2:.2f}x span "
          "(target 1.8x); every cell ran exactly once")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
