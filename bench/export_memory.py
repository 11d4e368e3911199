"""Memory of exporting one big run: a 2 MB answer × 20 criteria × 3 passes.

Each way of exporting runs in a fresh child process, which builds the evaluations, records its
peak RSS (``ru_maxrss``), exports, and reports how much the peak grew. Side by side in one run:

- ``app download``: what the Review page hands to ``st.download_button`` (CSV and JSON bytes
  from the streamed rows, ``rubric_core.app_support.export_bytes``);
- ``cli --csv``: what the CLI does (``write_csv`` straight to a file);
- ``answer on every row``: the old layout, for comparison: the same rows with the answer
  repeated on each criterion's row, through a DataFrame and ``to_csv`` (what the export did
  before the answer moved to one row per pass).

Run from the repository root:

    .venv/bin/python bench/export_memory.py           # print the table
    .venv/bin/python bench/export_memory.py --check   # also exit 1 if a streamed way > 100 MB
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_MB = 100.0

CHILD = r"""
import io, json, os, resource, sys, tempfile
from rubric_core.export import export_rows, evaluations_frame, to_csv, write_csv
from rubric_core.app_support import export_bytes

def evaluations():
    answer_base = "word " * (2 * 1024 * 1024 // 5)
    out = []
    for it in range(3):
        answer = f"pass {it}: " + answer_base  # a distinct 2 MB string per pass
        criteria = [{"name": f"criterion {c}", "passed": c % 3 != 0,
                     "gap": f"criterion {c} is not met yet" if c % 3 == 0 else None}
                    for c in range(20)]
        out.append({"grading_run_id": "g", "iteration": it, "result": "needs_revision",
                    "status": "needs_revision", "explanation": "Some criteria fail. " * 20,
                    "criteria": criteria, "unverified": False, "duration_s": 1.0,
                    "input_tokens": 1000, "output_tokens": 100, "answer": answer})
    return out

def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

evs = evaluations()
run = {"run_id": "r1", "title": "big run", "worker_model": "w", "grader_model": "g",
       "status": "needs_revision"}
before = peak_mb()
way = sys.argv[1]
if way == "app":
    csv_bytes, json_bytes = export_bytes(export_rows([(run, evs)]))
    size = len(csv_bytes)
elif way == "cli":
    with tempfile.TemporaryFile("w+", encoding="utf-8", newline="") as handle:
        write_csv(export_rows([(run, evs)]), handle)
        size = handle.tell()
else:
    frame = evaluations_frame(evs, run=run)
    repeated = frame.assign(answer=[evs[i]["answer"] for i in frame["iteration"]])
    text = to_csv(repeated)
    data = text.encode("utf-8")
    size = len(data)
print(json.dumps({"growth_mb": peak_mb() - before, "csv_mb": size / 1024 / 1024}))
"""

WAYS = (("app download", "app"), ("cli --csv", "cli"), ("answer on every row", "old"))


def _measure(way: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", CHILD, way], capture_output=True,
                          text=True, check=True, timeout=600)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 if a streamed way grows RSS by more than {TARGET_MB:g} MB")
    args = parser.parse_args()
    results = {label: _measure(way) for label, way in WAYS}
    old = results["answer on every row"]["growth_mb"]
    print("one run: 2 MB answer x 20 criteria x 3 passes; peak RSS growth while exporting")
    print(f"{'way':<22}{'CSV MB':>8}{'RSS growth MB':>15}{'vs old':>8}")
    worst = 0.0
    for label, _ in WAYS:
        r = results[label]
        ratio = r["growth_mb"] / old if old > 0 else float("nan")
        print(f"{label:<22}{r['csv_mb']:>8.1f}{r['growth_mb']:>15.1f}{ratio:>7.2f}x")
        if label != "answer on every row":
            worst = max(worst, r["growth_mb"])
    if args.check and worst > TARGET_MB:
        print(f"FAIL: {worst:.1f} MB is over the {TARGET_MB:g} MB target")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
