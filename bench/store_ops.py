"""Store operations on PostgreSQL and SQLite, side by side, in one run.

Times three things a page or an experiment does all the time, on a SQLite file (in a temporary
directory) and on a throwaway PostgreSQL server on 127.0.0.1 (tests/pg_support.py: a fresh
cluster, fsync off, as in the tests; a real server with fsync on pays more per commit):

- create run: `Store.create_run` (one write transaction);
- add evaluation: `Store.add_evaluation` (a locked read and two writes, one transaction);
- list 1,000 runs: `Store.list_runs(limit=1000)` on a database holding ``--runs`` runs.

Each is the median of ``--repeats`` rounds of ``--ops`` operations, per operation, and the
ratio PostgreSQL / SQLite (above 1: PostgreSQL is slower).

Run from the repository root:

    .venv/bin/python bench/store_ops.py                  # 200 ops × 5 rounds, 1,000 runs
    .venv/bin/python bench/store_ops.py --ops 50 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rubric_core.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the test server
from pg_support import create_database, postgres_server

if TYPE_CHECKING:
    from collections.abc import Callable

EVALUATION: dict[str, Any] = {
    "grading_run_id": "g", "iteration": 0, "result": "needs_revision", "explanation": "not yet",
    "status": "needs_revision", "unverified": False, "duration_s": 0.2, "input_tokens": 100,
    "output_tokens": 20, "answer": "an answer " * 20,
    "criteria": [{"name": f"criterion {i}", "passed": i % 2 == 0, "gap": "fix it"}
                 for i in range(4)],
}


def _run(store: Store, i: int) -> str:
    return store.create_run(title=f"run {i}", prompt="Write a haiku about " + "rain " * 20,
                            rubric="- 3 lines\n- mentions spring", worker_model="demo",
                            grader_model="rules", max_iterations=3).run_id


def _per_op_ms(action: Callable[[int], object], ops: int, repeats: int) -> float:
    rounds = []
    for r in range(repeats):
        start = time.perf_counter()
        for i in range(ops):
            action(r * ops + i)
        rounds.append((time.perf_counter() - start) / ops * 1000)
    return statistics.median(rounds)


def measure(location: str | Path, *, ops: int, repeats: int, runs: int) -> dict[str, float]:
    """Milliseconds per operation on one database."""
    with Store(location) as store:
        for i in range(runs):
            _run(store, i)
        target = _run(store, -1)
        return {
            "create run": _per_op_ms(lambda i: _run(store, i), ops, repeats),
            "add evaluation": _per_op_ms(
                lambda _i: store.add_evaluation(target, EVALUATION), ops, repeats),
            "list 1,000 runs": _per_op_ms(lambda _i: store.list_runs(limit=1000),
                                          max(1, ops // 20), repeats),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=200, help="operations per round")
    parser.add_argument("--repeats", type=int, default=5, help="rounds (the median is shown)")
    parser.add_argument("--runs", type=int, default=1000, help="runs in the database first")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, postgres_server() as server:
        sqlite = measure(Path(tmp) / "bench.sqlite3", ops=args.ops, repeats=args.repeats,
                         runs=args.runs)
        pg = measure(create_database(server), ops=args.ops, repeats=args.repeats,
                     runs=args.runs)
    print(f"{'operation':18} {'SQLite ms':>10} {'PostgreSQL ms':>14} {'PG / SQLite':>12}")
    for name, lite in sqlite.items():
        print(f"{name:18} {lite:10.3f} {pg[name]:14.3f} {pg[name] / lite:11.2f}x")


if __name__ == "__main__":
    main()
