"""Two experiment workers vs one on the same experiment, against the loopback server.

An experiment of N rows (each ``2 × passes`` model calls, a fixed delay per call) is run to
the end by one ``rubric-studio eval --resume`` process, then a copy of it by two such processes
started together, each with the same ``--concurrency``; they share the cells through leases
(`Store.claim_cell`). Reported: wall seconds from starting the processes to the last one
exiting (interpreter start-up included), the server's span (first request to last response),
both ratios (target: two workers ≥ 1.8x one), and that every cell ran exactly once.

Run from the repository root:

    .venv/bin/python bench/experiment_workers.py              # 128 rows, 2 passes, C = 4
    .venv/bin/python bench/experiment_workers.py --db postgresql://user@127.0.0.1:5432/db
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from experiment import CRITERION, Server

from rubric_core.datasets import parse_dataset
from rubric_core.experiments import create_experiment
from rubric_core.settings import ExperimentConfig
from rubric_core.store import Store

ROOT = Path(__file__).resolve().parents[1]


def _experiment(db: str, rows: int, base_url: str) -> str:
    data = "prompt\n" + "".join(f"question {i}\n" for i in range(rows))
    config = ExperimentConfig(worker_model="openai-compatible:w",
                              grader_model="openai-compatible:g", rubric=f"- {CRITERION}",
                              max_iterations=8, base_url=base_url)
    with Store(db) as store:
        return create_experiment(store, parse_dataset(data, name="bench"), [config]).experiment_id


def _workers(db: str, experiment_id: str, count: int, concurrency: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": "bench-key"}
    cmd = [sys.executable, "-m", "rubric_core", "eval", "--resume", experiment_id, "--db", db,
           "--concurrency", str(concurrency)]
    started = time.monotonic()
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for _ in range(count)]
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            msg = f"a worker exited {proc.returncode}: {err.decode(errors='replace')[-2000:]}"
            raise SystemExit(msg)
    return time.monotonic() - started


def _check(db: str, experiment_id: str, rows: int) -> None:
    with Store(db) as store:
        cells = store.experiment_cells(experiment_id)
        runs = Counter(r.thread_id for r in store.list_runs(limit=None))
    if [c.status for c in cells] != ["satisfied"] * rows:
        msg = f"not every cell satisfied: {Counter(c.status for c in cells)}"
        raise SystemExit(msg)
    if [runs[c.thread_id] for c in cells] != [1] * rows:
        msg = "a cell ran more than once"
        raise SystemExit(msg)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--delay-ms", type=float, default=200.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--db", help="database URL or path (default: a temporary SQLite file)")
    args = parser.parse_args()
    delay = args.delay_ms / 1000
    server = Server(delay, args.passes)
    print(f"{args.rows} rows x {2 * args.passes} calls, {args.delay_ms:g} ms per call, "
          f"--concurrency {args.concurrency} per worker")
    print(f"{'workers':>7} {'wall s':>7} {'span s':>7} {'peak':>5}")
    results = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for count in (1, 2):
                db = args.db or str(Path(tmp) / f"bench-{count}.sqlite3")
                exp_id = _experiment(db, args.rows, server.base_url)
                wall = _workers(db, exp_id, count, args.concurrency)
                times, done, peak = server.stats()
                _check(db, exp_id, args.rows)
                results[count] = (wall, max(done) - min(times))
                print(f"{count:>7} {wall:>7.2f} {results[count][1]:>7.2f} {peak:>5}")
    finally:
        server.close()
    (wall1, span1), (wall2, span2) = results[1], results[2]
    print(f"two workers vs one: {wall1 / wall2:.2f}x wall, {span1 / span2:.2f}x span "
          "(target 1.8x); every cell ran exactly once")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
