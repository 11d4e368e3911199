"""Re-grade throughput and memory against the tests' loopback OpenAI-compatible server.

N answers × one grader configuration (``openai-compatible``, one criterion) at concurrency C,
against the tests' `DelayedServer` (a fixed delay per call) in its own process, so its CPU is
not charged to the client's GIL. Each answer is one grader call. Measured side by side in one
run:

- ``regrade``: `rubric_core.lab.run_regrade` — the answer set stored in a SQLite file, every
  grading a grader pass (`grade_steps` driven by `drive_async`) recorded in its own
  transaction;
- ``plain``: the same grader calls (the same grader messages, the verdict tool bound) from
  plain asyncio with one ``ChatOpenAI`` (``ainvoke``), bounded by a semaphore: the floor for
  any client in Python.

Reported: span efficiency = ideal / (last response − first request) and wall efficiency =
ideal / wall time (storing the set included), ideal = calls × delay / C; regrade's span
efficiency over plain's; the most requests the server saw in flight (must never exceed C);
the client's CPU milliseconds per call. Targets (issue #26): span efficiency ≥ 0.9 and
regrade/plain ≥ 0.95 at 1,000 answers, C = 16, 200 ms.

Memory: each size runs in a fresh child process (against the same server, with a short delay)
that records its peak RSS after a warm-up re-grade of 8 answers, then re-grades N answers; the
growth of the peak for ``--rows`` answers against ``--small`` answers says whether memory is
flat in answers (the answers are read from the database a page at a time).

Run from the repository root (temporary SQLite files, removed afterwards):

    .venv/bin/python bench/regrade.py                         # 1,000 answers, C = 16, 200 ms
    .venv/bin/python bench/regrade.py --repeat 3              # medians of 3 runs, in turn
    .venv/bin/python bench/regrade.py --rows 200 --concurrency 4 16 --no-memory
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import multiprocessing as mp
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rubric_core.http_retry import SharedBackoff
from rubric_core.lab import GraderConfig, create_regrade, parse_answers, regrade_models, run_regrade
from rubric_core.store import Store

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
CRITERION = "answers the question"


def _serve(conn: Any, delay_s: float) -> None:
    """The child process: a DelayedServer answering until told to stop; stats on request."""
    sys.path.insert(0, str(TESTS))
    from openai_server import DelayedServer, verdict

    server = DelayedServer(delay_s, grader_reply=verdict("satisfied", (), (CRITERION,)))
    with server.fake:
        conn.send(server.fake.base_url)
        while (command := conn.recv()) != "stop":
            if isinstance(command, float):
                server.delay_s = command
                continue
            conn.send((list(server.fake.request_times), list(server.done), server.peak))
            server.fake.request_times.clear()
            server.done.clear()
            server.peak = 0


class Server:
    """The loopback server in a child process."""

    def __init__(self, delay_s: float) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_serve, args=(child, delay_s), daemon=True)
        self._process.start()
        self.base_url: str = self._conn.recv()

    def set_delay(self, delay_s: float) -> None:
        """Answer every later call after ``delay_s``."""
        self._conn.send(float(delay_s))

    def stats(self) -> tuple[list[float], list[float], int]:
        """(request arrival times, response times, peak in flight) since the last call."""
        self._conn.send("stats")
        times, done, peak = self._conn.recv()
        return times, done, peak

    def close(self) -> None:
        self._conn.send("stop")
        self._process.join(10)


def _answers(rows: int, name: str = "bench") -> Any:
    return parse_answers("id,request,answer\n" + "".join(
        f"q{i},question {i},reply {i}\n" for i in range(rows)), name=name)


def _config(base_url: str) -> GraderConfig:
    return GraderConfig(rubric=f"- {CRITERION}", grader_model="openai-compatible:g",
                        base_url=base_url)


def _regrade(server: Server, rows: int, concurrency: int) -> float:
    """Wall seconds of storing the set and re-grading it."""
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "bench.sqlite3") as store:
        backoff = SharedBackoff()
        models = regrade_models(backoff, api_key="bench-key")
        started = time.monotonic()
        job = create_regrade(store, _answers(rows), [_config(server.base_url)])
        events = list(run_regrade(store, job.job_id, concurrency=concurrency, models=models,
                                  backoff=backoff))
        wall = time.monotonic() - started
        counts = store.regrade_counts(job.job_id)
    if events[-1].get("status") != "finished" or counts != {0: (rows, 0)}:
        msg = f"expected {rows} gradings without errors, got {counts} ({events[-1]})"
        raise SystemExit(msg)
    return wall


def _plain(server: Server, rows: int, concurrency: int) -> float:
    """Wall seconds of the same grader calls from plain asyncio and one ChatOpenAI."""
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_openai import ChatOpenAI

    from rubric_core.grader import build_grader_messages
    from rubric_core.types import GraderResponse

    async def main() -> None:
        import httpx

        async with httpx.AsyncClient() as client:
            model = ChatOpenAI(model="g", base_url=server.base_url,  # type: ignore[call-arg]
                               api_key="bench-key", max_retries=0,  # type: ignore[arg-type]
                               http_async_client=client)
            grader = model.bind_tools([GraderResponse])
            limit = asyncio.Semaphore(concurrency)

            async def one(i: int) -> None:
                async with limit:
                    messages = build_grader_messages(
                        [HumanMessage(f"question {i}"), AIMessage(f"reply {i}")], [CRITERION])
                    await grader.ainvoke(messages)

            await asyncio.gather(*(one(i) for i in range(rows)))

    started = time.monotonic()
    asyncio.run(main())
    return time.monotonic() - started


def _measured(server: Server, run: Any, concurrency: int, delay_s: float) -> dict[str, float]:
    cpu = time.process_time()
    wall = run()
    cpu = time.process_time() - cpu
    times, done, peak = server.stats()
    ideal = len(times) * delay_s / concurrency
    return {"calls": len(times), "span_eff": ideal / (max(done) - min(times)),
            "wall_eff": ideal / wall, "peak": peak, "cpu_ms": 1000 * cpu / max(1, len(times))}


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    out = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    out["peak"] = max(run["peak"] for run in runs)
    return out


MEMORY_CHILD = r"""
import json, resource, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from bench_regrade import _answers, _config
from rubric_core.http_retry import SharedBackoff
from rubric_core.lab import create_regrade, regrade_models, run_regrade
from rubric_core.store import Store

base_url, rows = sys.argv[1], int(sys.argv[2])
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
def rss():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "m.sqlite3") as store:
    backoff = SharedBackoff()
    models = regrade_models(backoff, api_key="bench-key")
    def once(name, n):
        job = create_regrade(store, _answers(n, name), [_config(base_url)])
        events = list(run_regrade(store, job.job_id, concurrency=16, models=models,
                                  backoff=backoff))
        assert events[-1]["status"] == "finished", events[-1]
    once("warm-up", 8)
    before, held = peak(), rss()
    once("measured", rows)
    print(json.dumps({"before_mb": before, "growth_mb": peak() - before,
                      "held_mb": rss() - held}))
"""


def _memory(server: Server, rows: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        # The child imports this file's helpers under a module name it can import.
        (Path(tmp) / "bench_regrade.py").write_text(Path(__file__).read_text(encoding="utf-8"),
                                                    encoding="utf-8")
        proc = subprocess.run([sys.executable, "-c", MEMORY_CHILD, server.base_url, str(rows),
                               tmp], capture_output=True, text=True, check=False, cwd=ROOT)
    if proc.returncode != 0:
        msg = f"memory child failed:\n{proc.stderr[-3000:]}"
        raise SystemExit(msg)
    server.stats()  # drop its calls from the next throughput figures
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--small", type=int, default=50, help="the memory comparison's twin")
    parser.add_argument("--delay-ms", type=float, default=200.0)
    parser.add_argument("--memory-delay-ms", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16])
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of regrade and plain per C, in turn; medians are reported")
    parser.add_argument("--no-memory", action="store_true")
    args = parser.parse_args()
    delay = args.delay_ms / 1000
    print(f"{args.rows} answers x 1 configuration (1 call each), {args.delay_ms:g} ms per call "
          "on the loopback server (own process)"
          + (f", medians of {args.repeat} runs" if args.repeat > 1 else ""))
    print(f"{'C':>3} {'calls':>6} {'regrade span':>13} {'regrade wall':>13} {'plain span':>11} "
          f"{'plain wall':>11} {'regrade/plain':>14} {'peak':>5} {'cpu/call':>9} "
          f"{'plain cpu':>10}")
    server = Server(delay)
    failed = False
    try:
        for c in args.concurrency:
            ours, plains = [], []
            for _ in range(max(1, args.repeat)):
                ours.append(_measured(server, functools.partial(_regrade, server, args.rows, c),
                                      c, delay))
                plains.append(_measured(server, functools.partial(_plain, server, args.rows, c),
                                        c, delay))
            mine, plain = _median(ours), _median(plains)
            print(f"{c:>3} {mine['calls']:>6.0f} {mine['span_eff']:>13.2f} "
                  f"{mine['wall_eff']:>13.2f} {plain['span_eff']:>11.2f} "
                  f"{plain['wall_eff']:>11.2f} {mine['span_eff'] / plain['span_eff']:>14.2f} "
                  f"{mine['peak']:>5.0f} {mine['cpu_ms']:>7.2f}ms {plain['cpu_ms']:>8.2f}ms")
            if mine["peak"] > c:
                print(f"FAIL: {mine['peak']:.0f} requests in flight with C = {c}")
                failed = True
        if not args.no_memory:
            server.set_delay(args.memory_delay_ms / 1000)
            small = _memory(server, args.small)
            large = _memory(server, args.rows)
            extra = large["growth_mb"] - small["growth_mb"]
            print(f"memory (fresh process each, after a warm-up, {args.memory_delay_ms:g} ms a "
                  f"call): peak RSS growth {args.small} answers {small['growth_mb']:.1f} MB, "
                  f"{args.rows} answers {large['growth_mb']:.1f} MB (difference {extra:.1f} MB, "
                  f"{1024 * extra / (args.rows - args.small):.2f} KB per extra answer); RSS "
                  f"held after: {small['held_mb']:+.1f} MB and {large['held_mb']:+.1f} MB")
    finally:
        server.close()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
