"""What per-model limits cost on the queue engine: each limited model is one more queue level.

The same experiment as ``bench/experiment.py`` (one configuration, worker and grader both
``openai-compatible``, the tests' `DelayedServer` in its own process), run on the queue engine
(`run_experiment`, SQLite beside the store's, or ``--db postgresql://…``)
three ways at concurrency C:

- ``none``: no model limit (a cell is one workflow on the experiment's queue);
- ``worker``: a limit of C on the worker model (one level: the model's queue), never binding;
- ``both``: limits of C on the worker and the grader model (two levels), never binding.

So any difference is the levels' own cost. Reported per mode: span efficiency (ideal / (last
response - first request), ideal = calls × delay / C) and its ratio to ``none``; and from
DBOS's own rows, per cell with levels, the time from its workflow's dequeue to its innermost
level's dequeue (what the levels add before the cell starts: up to one poll of each queue)
and from the innermost level's end to the cell workflow's end (the result polls; an outer
level holds its queue's slot that long after the cell ended). Medians of ``--repeat`` runs,
modes in turn.

Run from the repository root:

    .venv/bin/python bench/engine_limits.py                  # 48 rows, C = 8, 200 ms per call
    .venv/bin/python bench/engine_limits.py --concurrency 16 --repeat 3
    .venv/bin/python bench/engine_limits.py --pg --headroom 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from experiment import CRITERION, Server

from rubric_core.datasets import parse_dataset
from rubric_core.experiments import (
    SharedBackoff,
    create_experiment,
    experiment_models,
    run_experiment,
)
from rubric_core.settings import ExperimentConfig
from rubric_core.store import Store

WORKER, GRADER = "openai-compatible:w", "openai-compatible:g"
MODES = {"none": (), "worker": (WORKER,), "both": (WORKER, GRADER)}


def _levels(experiment_id: str) -> tuple[list[float], list[float]]:
    """Per cell with levels: (dequeue to innermost dequeue, innermost end to cell end), s."""
    from dbos import DBOS

    from rubric_core.engine import queues
    from rubric_core.engine.runtime import GATE_ID_PREFIX

    cells = {w.workflow_id: w for w in DBOS.list_workflows(
        workflow_id_prefix=queues.id_prefix(experiment_id), load_input=False,
        load_output=False)}
    levels = DBOS.list_workflows(workflow_id_prefix=queues.gate_prefix(experiment_id),
                                 load_input=False, load_output=False)
    innermost: dict[str, Any] = {}
    for level in levels:
        cell = "rubric-cell:" + level.workflow_id.removeprefix(GATE_ID_PREFIX).rpartition("#")[0]
        depth = int(level.workflow_id.rpartition("#")[2])
        if cell not in innermost or depth > innermost[cell][0]:
            innermost[cell] = (depth, level)
    before, after = [], []
    for cell_id, (_, level) in innermost.items():
        cell = cells[cell_id]
        if cell.dequeued_at and level.dequeued_at:
            before.append((level.dequeued_at - cell.dequeued_at) / 1000)
        if cell.updated_at and level.updated_at:
            after.append((cell.updated_at - level.updated_at) / 1000)
    return before, after


def _run(server: Server, db: str | None, rows: int, concurrency: int, limited: tuple[str, ...],
         global_c: int) -> tuple[list[float], list[float]]:
    from rubric_core.engine import shutdown_engine

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(db or Path(tmp) / "bench.sqlite3").open()
        try:
            backoff = SharedBackoff()
            models = experiment_models(backoff, api_key="bench-key")
            data = "prompt\n" + "".join(f"question {i}\n" for i in range(rows))
            config = ExperimentConfig(worker_model=WORKER, grader_model=GRADER,
                                      rubric=f"- {CRITERION}", max_iterations=8,
                                      base_url=server.base_url)
            exp = create_experiment(store, parse_dataset(data, name="bench"), [config],
                                    models=models)
            events = list(run_experiment(
                store, exp.experiment_id, concurrency=global_c, backoff=backoff,
                models=models, per_model=dict.fromkeys(limited, concurrency)))
            levels = _levels(exp.experiment_id)
        finally:
            shutdown_engine()
            store.close()
    statuses = [e["status"] for e in events if e["type"] == "cell_finished"]
    if len(statuses) != rows or set(statuses) != {"satisfied"}:
        msg = f"expected {rows} satisfied cells, got {statuses}"
        raise SystemExit(msg)
    return levels


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=48)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--delay-ms", type=float, default=200.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--headroom", type=int, default=1,
                        help="with model limits, the experiment's concurrency is C times this "
                        "(2: the model limit binds, as when a user sets one)")
    parser.add_argument("--pg", action="store_true",
                        help="run on PostgreSQL (a throwaway server, tests/pg_support.py; a "
                        "database per run) instead of a fresh SQLite file per run")
    args = parser.parse_args()
    if args.pg:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from pg_support import create_database, postgres_server

        with postgres_server() as server_url:
            return _bench(args, lambda: create_database(server_url))
    return _bench(args, lambda: None)


def _bench(args: argparse.Namespace, new_db: Any) -> int:
    delay, c = args.delay_ms / 1000, args.concurrency
    print(f"{args.rows} rows x {2 * args.passes} calls, {args.delay_ms:g} ms per call, C = {c}, "
          f"{'PostgreSQL' if args.pg else 'SQLite'}"
          + (f", medians of {args.repeat} runs" if args.repeat > 1 else ""))
    server = Server(delay, args.passes)
    spans: dict[str, list[float]] = {mode: [] for mode in MODES}
    before: dict[str, list[float]] = {mode: [] for mode in MODES}
    after: dict[str, list[float]] = {mode: [] for mode in MODES}
    try:
        for _ in range(max(1, args.repeat)):
            for mode, limited in MODES.items():
                server.stats()  # forget what came before
                b, a = _run(server, new_db(), args.rows, c, limited,
                            c * args.headroom if limited else c)
                times, done, _ = server.stats()
                ideal = len(times) * delay / c
                spans[mode].append(ideal / (max(done) - min(times)))
                before[mode] += b
                after[mode] += a
    finally:
        server.close()
    base = statistics.median(spans["none"])
    print(f"{'mode':>7} {'span eff':>9} {'vs none':>8} {'to start (median/p90)':>22} "
          f"{'end lag (median/p90)':>21}")
    for mode in MODES:
        span = statistics.median(spans[mode])
        row = f"{mode:>7} {span:>9.2f} {span / base:>8.2f}"
        if before[mode]:
            b = sorted(before[mode])
            a = sorted(after[mode])
            row += (f" {1000 * statistics.median(b):>11.0f}/{1000 * b[int(0.9 * len(b))]:<4.0f} ms"
                    f" {1000 * statistics.median(a):>10.0f}/{1000 * a[int(0.9 * len(a))]:<4.0f} ms")
        print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
