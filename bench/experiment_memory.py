"""Memory of a 1,000-row experiment against a 50-row twin: running it, and exporting it.

Each measurement runs in a fresh child process, which records its peak RSS (``ru_maxrss``)
after a warm-up and reports how much the peak grew:

- ``run``: `create_experiment` + `run_experiment` (default concurrency) over N rows of the
  bundled offline dataset, cycled with fresh ids, with ``demo`` + ``rules`` (no server, no
  network). The warm-up is a 4-row experiment in the same process (imports, the compiled
  agent, the database's first pages), so the growth is what the rows add.
- ``export``: the streamed experiment export of that experiment, as the CLI's ``--csv``
  writes it (`export_experiment_rows` → `write_csv` into a file), after exporting the
  warm-up experiment once.

Memory is flat in rows when the 1,000-row growth is about the 50-row growth; the table prints
both, their difference and that difference per extra row (what each row adds to a process's
peak). The export child reads the database its ``run`` child left: what a real experiment
stores. The export necessarily holds the dataset (about 1.3 KB a row here); what it writes
is streamed.

Run from the repository root (temporary SQLite files, removed afterwards; about 90 seconds):

    .venv/bin/python bench/experiment_memory.py
    .venv/bin/python bench/experiment_memory.py --rows 2000 --small 50
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import dataclasses, gc, json, os, resource, sys, tempfile, time
from rubric_core.datasets import Dataset
from rubric_core.experiments import (
    create_experiment, export_columns, export_experiment_rows, run_experiment)
from rubric_core.export import write_csv
from rubric_core.offline.demo_dataset import demo_dataset
from rubric_core.settings import ExperimentConfig
from rubric_core.store import Store


def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def dataset(name, n):
    base = demo_dataset()
    rows = [dataclasses.replace(r, id=f"{r.id}-{i // len(base.rows)}")
            for i, r in enumerate(base.rows * (n // len(base.rows) + 1))][:n]
    return Dataset(name, base.columns, tuple(rows))


def run(store, name, n):
    exp = create_experiment(store, dataset(name, n), [ExperimentConfig()])
    ended = [e for e in run_experiment(store, exp.experiment_id)
             if e["type"] == "experiment_finished"]
    assert ended and ended[0]["status"] == "finished", ended
    return exp.experiment_id


def export(store, experiment_id):
    with tempfile.TemporaryFile("w+", encoding="utf-8", newline="") as handle:
        count = write_csv(export_experiment_rows(store, experiment_id), handle,
                          export_columns(store, experiment_id))
        return count, handle.tell()


mode, db, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with Store(db) as store:
    if mode == "run":
        warm = run(store, "warm-up", 4)
        gc.collect()
        before = peak_mb()
        start = time.perf_counter()
        exp_id = run(store, f"rows-{n}", n)
        out = {"experiment_id": exp_id, "warm_id": warm, "seconds": time.perf_counter() - start,
               "growth_mb": peak_mb() - before}
        statuses = {c.status for c in store.cell_outcomes(exp_id)}  # after the measurement
        assert statuses == {"satisfied"}, statuses
    else:
        warm_id, exp_id = sys.argv[4], sys.argv[5]
        export(store, warm_id)
        gc.collect()
        before = peak_mb()
        start = time.perf_counter()
        rows, size = export(store, exp_id)
        out = {"rows": rows, "csv_mb": size / 1024 / 1024,
               "seconds": time.perf_counter() - start, "growth_mb": peak_mb() - before}
    out["base_mb"] = before
print(json.dumps(out))
"""


def _child(*args: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=1800, check=False)
    if done.returncode != 0:
        msg = f"child {args[0]} failed:\n{done.stderr[-3000:]}"
        raise SystemExit(msg)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--small", type=int, default=50)
    args = parser.parse_args()
    sizes = (args.small, args.rows)
    table: dict[str, dict[int, dict[str, object]]] = {"run": {}, "export": {}}
    with tempfile.TemporaryDirectory(prefix="rubric-bench-") as tmp:
        for n in sizes:
            db = str(Path(tmp) / f"rows-{n}.sqlite3")
            ran = _child("run", db, str(n))
            table["run"][n] = ran
            table["export"][n] = _child("export", db, str(n), str(ran["warm_id"]),
                                        str(ran["experiment_id"]))
    small, big = sizes
    print("demo + rules, one configuration; peak RSS growth after a warm-up, each in a "
          "fresh process")
    print(f"{'way':<22}{f'{small} rows MB':>14}{f'{big} rows MB':>14}{'difference':>12}"
          f"{'KB/row':>9}{'s':>8}")
    for way, label in (("run", "run experiment"), ("export", "export --csv (stream)")):
        a, b = (float(table[way][n]["growth_mb"]) for n in sizes)  # type: ignore[arg-type]
        per_row = (b - a) * 1024 / (big - small)
        seconds = float(table[way][big]["seconds"])  # type: ignore[arg-type]
        print(f"{label:<22}{a:>14.1f}{b:>14.1f}{b - a:>12.1f}{per_row:>9.2f}{seconds:>8.1f}")
    rows, mb = table["export"][big]["rows"], float(table["export"][big]["csv_mb"])  # type: ignore[arg-type]
    print(f"the {big}-row export: {rows:,} CSV rows, {mb:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
