"""Experiment throughput against the tests' loopback OpenAI-compatible server.

One configuration (worker and grader both ``openai-compatible``) over N rows at several
concurrency limits C, against the tests' `DelayedServer` (a fixed delay per call) running in
its own process, so its CPU is not charged to the client's GIL. Each row takes ``--passes``
grading passes: the grader fails the worker's answers until the last pass, so a row is
``2 × passes`` model calls. Measured side by side in one run, per C:

- ``loop``: `run_experiment` — every cell the full rubric loop (agent graph, middleware,
  checkpoints in a SQLite file, recording in the run index);
- ``plain``: the same calls from plain asyncio with one ``ChatOpenAI`` (``ainvoke``), bounded
  by a semaphore: the floor for any client in Python;
  Its cells are queued on the engine (`rubric_core.engine`, DBOS's SQLite file beside the
  store's; the engine's launch counts in the wall time, not the span).

Reported: span efficiency = ideal / (last response - first request) and wall efficiency =
ideal / wall time (creation and start-up included), ideal = calls × delay / C; the ratio of
the loop's span efficiency to plain asyncio's; the most requests the server saw in flight
(must never exceed C); and the client's CPU milliseconds per row (the server's are not
counted), which is what caps a GIL-bound client at high C.

This machine is shared and its speed drifts from one run to the next (the same run's client
CPU per row varies by a third), so ``--repeat N`` runs loop and plain N times each, in turn,
and reports the medians.

Run from the repository root:

    .venv/bin/python bench/experiment.py      # 64 rows, 2 passes, 200 ms, C = 1 4 16 32
    .venv/bin/python bench/experiment.py --concurrency 16 --repeat 5
    .venv/bin/python bench/experiment.py --rows 32 --passes 1 --concurrency 1 16
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from rubric_core.datasets import parse_dataset
from rubric_core.engine import shutdown_engine
from rubric_core.experiments import (
    SharedBackoff,
    create_experiment,
    experiment_models,
    run_experiment,
)
from rubric_core.settings import ExperimentConfig
from rubric_core.store import Store

TESTS = Path(__file__).resolve().parents[1] / "tests"
CRITERION = "answers the question"
GRADER_TOOL = {"type": "function", "function": {
    "name": "GraderResponse", "description": "The verdict.",
    "parameters": {"type": "object", "properties": {"result": {"type": "string"}}}}}


def _serve(conn: Any, delay_s: float, passes: int) -> None:
    """The child process: a DelayedServer answering until told to stop; stats on request."""
    sys.path.insert(0, str(TESTS))
    from openai_server import DelayedServer, verdict

    server = DelayedServer(delay_s, grader_reply=verdict("satisfied", (), (CRITERION,)),
                           passes=passes)
    with server.fake:
        conn.send(server.fake.base_url)
        while conn.recv() == "stats":
            conn.send((list(server.fake.request_times), list(server.done), server.peak))
            server.fake.request_times.clear()
            server.done.clear()
            server.peak = 0


class Server:
    """The loopback server in a child process."""

    def __init__(self, delay_s: float, passes: int) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_serve, args=(child, delay_s, passes), daemon=True)
        self._process.start()
        self.base_url: str = self._conn.recv()

    def stats(self) -> tuple[list[float], list[float], int]:
        """(request arrival times, response times, peak in flight) since the last call."""
        self._conn.send("stats")
        times, done, peak = self._conn.recv()
        return times, done, peak

    def close(self) -> None:
        self._conn.send("stop")
        self._process.join(10)


def _thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds of each live thread of this process, by native id, with its name (Linux)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float]] = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat", encoding="ascii") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:  # the thread ended meanwhile
                continue
            out[int(tid)] = (names.get(int(tid), "?"), (int(fields[11]) + int(fields[12])) / tick)
    return out


def _cpu_by_part(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
                 ) -> dict[str, float]:
    """CPU seconds of the work loop's thread and DBOS's pool between two `_thread_cpu` readings.

    Only threads alive at the second reading count: DBOS's queue threads end with their queue.
    """
    parts = {"loop": 0.0, "pool": 0.0}
    for tid, (name, seconds) in after.items():
        part = ("loop" if name == "rubric-work-loop"
                else "pool" if name.startswith("dbos-executor") else None)
        if part is not None:
            parts[part] += seconds - before.get(tid, (name, 0.0))[1]
    return parts


def _loop(server: Server, rows: int, concurrency: int) -> float:
    """Wall seconds of creating and running the experiment through the rubric loop."""
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "bench.sqlite3").open()
        try:
            backoff = SharedBackoff()
            models = experiment_models(backoff, api_key="bench-key")
            data = "prompt\n" + "".join(f"question {i}\n" for i in range(rows))
            config = ExperimentConfig(worker_model="openai-compatible:w",
                                      grader_model="openai-compatible:g",
                                      rubric=f"- {CRITERION}", max_iterations=8,
                                      base_url=server.base_url)
            threads = _thread_cpu()
            started = time.monotonic()
            exp = create_experiment(store, parse_dataset(data, name="bench"), [config],
                                    models=models)
            events = list(run_experiment(store, exp.experiment_id, concurrency=concurrency,
                                         backoff=backoff, models=models))
            wall = time.monotonic() - started
            THREAD_CPU.append(_cpu_by_part(threads, _thread_cpu()))
            ENGINE_GAPS.append(_slot_gap(store, exp.experiment_id, concurrency))
        finally:
            shutdown_engine()  # the next run has a database of its own
            store.close()
    statuses = [e["status"] for e in events if e["type"] == "cell_finished"]
    if len(statuses) != rows or set(statuses) != {"satisfied"}:
        msg = f"expected {rows} satisfied cells, got {statuses}"
        raise SystemExit(msg)
    return wall


def _plain(server: Server, rows: int, concurrency: int, passes: int) -> float:
    """Wall seconds of the same calls from plain asyncio and one ChatOpenAI."""
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_openai import ChatOpenAI

    async def main() -> None:
        import httpx

        # A client of this event loop: ChatOpenAI's shared default belongs to the first loop.
        async with httpx.AsyncClient() as client:
            model = ChatOpenAI(model="w", base_url=server.base_url,  # type: ignore[call-arg]
                               api_key="bench-key", max_retries=0,  # type: ignore[arg-type]
                               http_async_client=client)
            grader = model.bind_tools([GRADER_TOOL])
            limit = asyncio.Semaphore(concurrency)

            async def row(i: int) -> None:
                async with limit:
                    messages: list[Any] = [HumanMessage(f"question {i}")]
                    for _ in range(passes):
                        answer = await model.ainvoke(messages)
                        messages.append(AIMessage(answer.content))
                        await grader.ainvoke([HumanMessage(f"Grade: {answer.content}")])
                        messages.append(HumanMessage("revise"))

            await asyncio.gather(*(row(i) for i in range(rows)))

    started = time.monotonic()
    asyncio.run(main())
    return time.monotonic() - started


ENGINE_GAPS: list[float] = []
"""Per `_loop` run: the median slot gap in ms (`_slot_gap`)."""

THREAD_CPU: list[dict[str, float]] = []
"""Per `_loop` run: CPU seconds of the work loop's thread and DBOS's pool (`_cpu_by_part`)."""


def _slot_gap(store: Store, experiment_id: str, concurrency: int) -> float:
    """The median time in ms from a cell's run ending to the next run starting in its slot.

    Every cell is queued at the start, so the k-th run to start waited for the (k - C)-th to
    end. The gap is what the engine and a cell's start add between two cells of a slot: the
    workflow's outcome written, the queue's next poll, the dequeue, the workflow's start and
    the cell's admission and run creation. Read from our runs (DBOS's SQLite rows keep whole
    seconds).
    """
    runs = [c.run for c in store.experiment_cells(experiment_id) if c.run is not None]
    ends = sorted(datetime.fromisoformat(r.updated_at).timestamp() for r in runs)
    starts = sorted(datetime.fromisoformat(r.created_at).timestamp() for r in runs)
    gaps = [starts[k] - ends[k - concurrency] for k in range(concurrency, len(starts))]
    return 1000 * statistics.median(gaps) if gaps else float("nan")


def _measured(server: Server, run: Any, concurrency: int, delay_s: float, rows: int
              ) -> dict[str, float]:
    cpu = time.process_time()
    wall = run()
    cpu = time.process_time() - cpu
    times, done, peak = server.stats()
    ideal = len(times) * delay_s / concurrency
    out = {"calls": len(times), "span_eff": ideal / (max(done) - min(times)),
           "wall_eff": ideal / wall, "peak": peak, "cpu_ms": 1000 * cpu / rows}
    if THREAD_CPU:  # a loop run: its CPU split by thread
        parts = THREAD_CPU.pop()
        out["loop_ms"] = 1000 * parts["loop"] / rows
        out["pool_ms"] = 1000 * parts["pool"] / rows
        out["rest_ms"] = out["cpu_ms"] - out["loop_ms"] - out["pool_ms"]
    return out


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the runs (the peak: the highest)."""
    out = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    out["peak"] = max(run["peak"] for run in runs)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--delay-ms", type=float, default=200.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of loop and plain per C, in turn; medians are reported")
    args = parser.parse_args()
    delay = args.delay_ms / 1000
    print(f"{args.rows} rows x {2 * args.passes} calls ({args.passes} passes), "
          f"{args.delay_ms:g} ms per call on the loopback server (own process)"
          + (f", medians of {args.repeat} runs" if args.repeat > 1 else ""))
    print(f"{'C':>3} {'calls':>6} {'loop span':>10} {'loop wall':>10} {'plain span':>11} "
          f"{'plain wall':>11} {'loop/plain':>11} {'peak':>5} {'loop cpu':>8} {'plain cpu':>9}")
    server = Server(delay, args.passes)
    failed = False
    try:
        for c in args.concurrency:
            loops, plains = [], []
            ENGINE_GAPS.clear()
            for _ in range(max(1, args.repeat)):
                loops.append(_measured(server, functools.partial(
                    _loop, server, args.rows, c), c, delay, args.rows))
                plains.append(_measured(server, functools.partial(
                    _plain, server, args.rows, c, args.passes), c, delay, args.rows))
            loop, plain = _median(loops), _median(plains)
            print(f"{c:>3} {loop['calls']:>6.0f} {loop['span_eff']:>10.2f} "
                  f"{loop['wall_eff']:>10.2f} {plain['span_eff']:>11.2f} "
                  f"{plain['wall_eff']:>11.2f} {loop['span_eff'] / plain['span_eff']:>11.2f} "
                  f"{loop['peak']:>5.0f} {loop['cpu_ms']:>8.1f} {plain['cpu_ms']:>9.1f}")
            print(f"    slot gap {statistics.median(ENGINE_GAPS):.0f} ms per cell (a cell's run "
                  "ended to the next run started in its slot: the engine's cost per cell)")
            if "loop_ms" in loop:
                print(f"    loop cpu by thread: event loop {loop['loop_ms']:.1f}, DBOS's pool "
                      f"{loop['pool_ms']:.1f}, the rest {loop['rest_ms']:.1f} ms a row (the "
                      "rest: DBOS's queue threads, the main thread)")
            if loop["peak"] > c:
                print(f"FAIL: {loop['peak']:.0f} requests in flight with C = {c}")
                failed = True
    finally:
        server.close()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
