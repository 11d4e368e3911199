"""Store operations on PostgreSQL and SQLite, side by side, in one run.

Times three things a page or an experiment does all the time, on a SQLite file (in a temporary
directory) and on a throwaway PostgreSQL server on 127.0.0.1 (tests/pg_support.py: a fresh
cluster, fsync off, as in the tests; a real server with fsync on pays more per commit):

- create run: `Store.create_run` (one write transaction);
- add evaluation: `Store.add_evaluation` (a locked read and two writes, one transaction);
- list 1,000 runs: `Store.list_runs(limit=1000)` on a database holding ``--runs`` runs;
- checkpoint write: one ``put`` and one ``put_writes`` of the store's LangGraph saver (a
  small checkpoint and a step's writes), unfenced and fenced (`rubric_core.store.Fence`: the
  owner check in the write's transaction), as every step of a recorded run does;
- recorded run: a whole run through `rubric_core.session.start` (the offline ``demo`` worker
  and ``rules`` grader on the bundled haiku example: three passes, no network).

On a version without fences (before #27 item 3) the fenced row is left out, so the same
command measures both sides of the change.

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

from rubric_core import session
from rubric_core.examples import get_example
from rubric_core.settings import RunSettings
from rubric_core.store import Store

try:
    from rubric_core.store import Fence
except ImportError:  # a version before fenced checkpoints
    Fence = None  # type: ignore[assignment,misc]

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


def _checkpoint_write(store: Store, thread_id: str, configurable: dict[str, Any]) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"messages": ["an answer " * 20], "_rubric_iterations": 1}
    checkpoint["channel_versions"] = {"messages": 1, "_rubric_iterations": 1}
    saver = store.saver()
    saved = saver.put({"configurable": {"thread_id": thread_id, "checkpoint_ns": "",
                                        **configurable}},
                      checkpoint, {"source": "loop", "step": 1}, checkpoint["channel_versions"])
    saver.put_writes({"configurable": {**saved["configurable"], **configurable}},
                     [("messages", ["a revision"]), ("_rubric_iterations", 2)], task_id="t")


def _recorded_run(store: Store) -> None:
    example = get_example("haiku")
    settings = RunSettings(prompt=example.prompt, rubric=example.rubric, example_name="haiku",
                           worker_system_prompt=example.worker_system_prompt)
    final = list(session.start(store, settings, watch=False))[-1]
    assert final["type"] == "run_finished" and final["status"] == "satisfied", final


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
        times = {
            "create run": _per_op_ms(lambda i: _run(store, i), ops, repeats),
            "add evaluation": _per_op_ms(
                lambda _i: store.add_evaluation(target, EVALUATION), ops, repeats),
            "list 1,000 runs": _per_op_ms(lambda _i: store.list_runs(limit=1000),
                                          max(1, ops // 20), repeats),
        }
        owned = store.create_run(prompt="p", rubric="- a", owner="bench").run_id
        fenced = Fence(owned, "bench").configurable() if Fence is not None else None
        plain_rounds: list[float] = []
        fenced_rounds: list[float] = []
        for r in range(repeats):  # alternating rounds: the two see the same machine
            plain_rounds.append(_per_op_ms(
                lambda i, r=r: _checkpoint_write(store, f"plain-{r}-{i}", {}), ops, 1))
            if fenced is not None:
                fenced_rounds.append(_per_op_ms(
                    lambda i, r=r: _checkpoint_write(store, f"fenced-{r}-{i}", fenced), ops, 1))
        times["checkpoint write"] = statistics.median(plain_rounds)
        if fenced_rounds:
            times["fenced ckpt write"] = statistics.median(fenced_rounds)
        _recorded_run(store)  # warm: the first run compiles the agent
        times["recorded run"] = _per_op_ms(lambda _i: _recorded_run(store),
                                           max(1, ops // 20), repeats)
        return times


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
