"""What a re-grade item workflow costs on the queue engine, on SQLite and on PostgreSQL.

Chooses (and keeps honest) the unit of a re-grade's items (`rubric_core.lab.grading.ItemBody`):
one DBOS workflow per (configuration, answer) with its repeats. Graded by the offline ``rules``
grader (no model call: a grading costs well under a millisecond), so what is measured is the
engine's share:

- ``enqueue``: queuing N items on a re-grade's queue (`rubric_core.engine.queues.
  enqueue_items`), milliseconds per workflow;
- ``run``: `rubric_core.lab.run_regrade` from start to end at concurrency C in this one
  process (enqueue, dequeue, grade, record, end of each workflow, the watch), milliseconds per
  workflow and per grading, for the same gradings cut two ways: N answers × R repeats (this
  unit: N workflows) and N × R answers × 1 repeat (what one workflow per grading would be).

Compare the per-workflow milliseconds with a real grading (a model call: hundreds of
milliseconds and up): that ratio is the engine's overhead.

Run from the repository root (a temporary SQLite file; a throwaway PostgreSQL cluster as the
tests' `pg_support` starts, which needs PostgreSQL's binaries):

    .venv/bin/python bench/regrade_unit.py                      # N = 300, R = 3, C = 8
    .venv/bin/python bench/regrade_unit.py --db sqlite --answers 1000
"""

from __future__ import annotations

import argparse
import asyncio
import time

from engine_workers import throwaway_database  # bench/ is the script's directory

from rubric_core.background import work_loop
from rubric_core.lab import GraderConfig, create_regrade, parse_answers, run_regrade
from rubric_core.store import Store


def _job(store: Store, answers: int, repeats: int, name: str) -> str:
    data = "id,request,answer\n" + "".join(
        f"q{i},question {i},The answer {i}.\n" for i in range(answers))
    config = GraderConfig(rubric="- The answer mentions the answer", grader_repeats=repeats)
    return create_regrade(store, parse_answers(data, name=name), [config]).job_id


def _enqueue_ms(store: Store, answers: int) -> float:
    """Milliseconds per item queued (a re-grade queued only: nothing graded, then stopped)."""
    from rubric_core.engine import launch_engine
    from rubric_core.engine import queues as regrade_queue

    job_id = _job(store, answers, 1, "enqueue")
    launch_engine(store, every_queue=False)  # not listening: nothing runs here

    async def enqueue() -> float:
        await regrade_queue.register_regrade_queue(job_id, concurrency=1)
        latest = await regrade_queue.latest_items(job_id)
        started = time.perf_counter()
        await regrade_queue.enqueue_items(job_id, [(0, f"q{i}") for i in range(answers)],
                                          latest)
        took = time.perf_counter() - started
        await regrade_queue.cancel_items(job_id)
        await regrade_queue.delete_regrade_queue(job_id)
        return took

    took = asyncio.run_coroutine_threadsafe(enqueue(), work_loop()).result()
    return 1000 * took / answers


def _run_s(store: Store, answers: int, repeats: int, concurrency: int, name: str) -> float:
    job_id = _job(store, answers, repeats, name)
    started = time.perf_counter()
    events = list(run_regrade(store, job_id, concurrency=concurrency))
    took = time.perf_counter() - started
    assert events[-1]["status"] == "finished"  # type: ignore[typeddict-item]
    assert sum(n for n, _ in store.regrade_counts(job_id).values()) == answers * repeats
    return took


def main() -> None:
    """Measure and print (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--answers", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    from rubric_core.engine import shutdown_engine

    kinds = ("sqlite", "postgres") if args.db == "both" else (args.db,)
    n, r, c = args.answers, args.repeats, args.concurrency
    for kind in kinds:
        with throwaway_database(kind) as db, Store(db) as store:
            enqueue = _enqueue_ms(store, n)
            unit = _run_s(store, n, r, c, "unit")
            per_grading = _run_s(store, n * r, 1, c, "grading")
            shutdown_engine()
        print(f"{kind:8s} enqueue {enqueue:6.2f} ms/workflow | {n} answers x {r} repeats "
              f"({n} workflows): {unit:6.2f} s = {1000 * unit / n:6.2f} ms/workflow, "
              f"{1000 * unit / (n * r):6.2f} ms/grading | {n * r} answers x 1 "
              f"({n * r} workflows): {per_grading:6.2f} s = "
              f"{1000 * per_grading / (n * r):6.2f} ms/workflow and grading | C = {c}")


if __name__ == "__main__":
    main()
