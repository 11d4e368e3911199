"""Experiment throughput against the tests' loopback OpenAI-compatible server.

One configuration (worker and grader both ``openai-compatible``, served by the tests'
`FakeOpenAI` after a fixed delay per call) over N rows, at several concurrency limits C. Each
row is one worker call and one grader call (the grader is satisfied at once). Reported per C:

- span efficiency: ideal / (last response - first request), ideal = calls × delay / C;
- wall efficiency: ideal / wall time of ``run_experiment`` (creation and start-up included);
- the most requests the server saw in flight (must never exceed C).

Run from the repository root:

    .venv/bin/python bench/experiment.py                       # 64 rows, 200 ms, C = 1 4 16 32
    .venv/bin/python bench/experiment.py --rows 32 --concurrency 1 16
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from rubric_core.datasets import parse_dataset
from rubric_core.experiments import (
    SharedBackoff,
    create_experiment,
    experiment_models,
    run_experiment,
)
from rubric_core.settings import ExperimentConfig
from rubric_core.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the test server
from openai_server import DelayedServer, verdict


def _one(rows: int, concurrency: int, delay_s: float) -> dict[str, float]:
    server = DelayedServer(
        delay_s, grader_reply=verdict("satisfied", (), ("answers the question",)))
    with server.fake, tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "bench.sqlite3").open()
        try:
            backoff = SharedBackoff()
            models = experiment_models(backoff, api_key="bench-key")
            data = "prompt\n" + "".join(f"question {i}\n" for i in range(rows))
            config = ExperimentConfig(worker_model="openai-compatible:w",
                                      grader_model="openai-compatible:g",
                                      rubric="- answers the question",
                                      base_url=server.fake.base_url)
            started = time.monotonic()
            exp = create_experiment(store, parse_dataset(data, name="bench"), [config],
                                    models=models)
            events = list(run_experiment(store, exp.experiment_id, concurrency=concurrency,
                                         backoff=backoff, models=models))
            wall = time.monotonic() - started
        finally:
            store.close()
    finished = [e for e in events if e["type"] == "cell_finished"]
    if len(finished) != rows or any(e["status"] != "satisfied" for e in finished):
        msg = f"expected {rows} satisfied cells, got {[e['status'] for e in finished]}"
        raise SystemExit(msg)
    calls = len(server.fake.request_times)
    ideal = calls * delay_s / concurrency
    span = max(server.done) - min(server.fake.request_times)
    return {"calls": calls, "span": span, "wall": wall, "span_eff": ideal / span,
            "wall_eff": ideal / wall, "peak": server.peak}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--delay-ms", type=float, default=200.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    args = parser.parse_args()
    delay = args.delay_ms / 1000
    print(f"{args.rows} rows x 2 calls, {args.delay_ms:g} ms per call on the loopback server")
    print(f"{'C':>3} {'calls':>6} {'span s':>8} {'wall s':>8} {'span eff':>9} {'wall eff':>9}"
          f" {'peak in flight':>15}")
    for c in args.concurrency:
        r = _one(args.rows, c, delay)
        print(f"{c:>3} {r['calls']:>6.0f} {r['span']:>8.2f} {r['wall']:>8.2f} "
              f"{r['span_eff']:>9.2f} {r['wall_eff']:>9.2f} {r['peak']:>15.0f}")
        if r["peak"] > c:
            print(f"FAIL: {r['peak']:.0f} requests in flight with C = {c}")
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
