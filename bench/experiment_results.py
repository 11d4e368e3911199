"""How the Experiments page's results scale: 1,000 rows × 3 configurations against 10 × 3.

Two experiments are built for real first: the bundled offline dataset's rows, cycled with fresh
ids to 10 and to 1,000 rows, under three configurations (``demo`` + ``rules`` with 3, 2 and 1
grader passes, so that rows flip between them), each run to the end by `run_experiment` into its
own SQLite file: the runs, evaluations and cells are what a real experiment leaves (about
3 minutes for the big one; ``--db-dir`` keeps the files for the next time).

Then, side by side, alternating which goes first, median of ``--rounds``:

- the library calls behind each results tab: the grid (`experiment_results` without verdicts
  + `results_grid`), the summary and the per-criterion table (`experiment_results` +
  `ExperimentResults.summary` / `.criteria`), compare (`comparison_view` of configurations 1
  and 3);
- the real page with Streamlit's AppTest, app.py routing as the server does, one render per
  tab (only the open tab is drawn). AppTest compiles app.py and the page again on every run,
  which the server does once; the bench shares one script cache across runs so that the
  measured render is the server's, not that fixed cost.

The issue's target: the grid for 1,000 rows × 3 configurations renders in ≤ 3x the time of
the 10-row case (the "Grid page" line; ``--check`` exits 1 when it is over).

Run from the repository root (no network):

    .venv/bin/python bench/experiment_results.py
    .venv/bin/python bench/experiment_results.py --db-dir /tmp/exp-bench --rounds 9 --check
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rubric_core import app_support as sup
from rubric_core.datasets import Dataset
from rubric_core.experiments import create_experiment, experiment_results, run_experiment
from rubric_core.offline.demo_dataset import demo_dataset
from rubric_core.settings import ExperimentConfig
from rubric_core.store import Store

if TYPE_CHECKING:
    from collections.abc import Callable

ROOT = Path(__file__).resolve().parents[1]
TARGET = 3.0
"""Most the 1,000-row grid may take, as a multiple of the 10-row grid."""
SMALL_ROWS, BIG_ROWS = 10, 1_000
CAPS = (3, 2, 1)
"""Grader passes of the three configurations."""
TABS = ("Grid", "Summary", "Per criterion", "Compare")


def _dataset(rows: int) -> Dataset:
    base = demo_dataset()
    cycled = [dataclasses.replace(r, id=f"{r.id}-{i // len(base.rows)}")
              for i, r in enumerate(base.rows * (rows // len(base.rows) + 1))][:rows]
    return Dataset(f"rows-{rows}", base.columns, tuple(cycled))


def _build(path: Path, rows: int, concurrency: int) -> str:
    """The experiment in ``path`` (run to the end now unless the file already holds it)."""
    with Store(path) as store:
        done = [e for e in store.list_experiments() if e.status == "finished"]
        if done:
            return done[0].experiment_id
        configs = [ExperimentConfig(max_iterations=cap, label=f"{cap} pass(es)") for cap in CAPS]
        exp = create_experiment(store, _dataset(rows), configs)
        start = time.perf_counter()
        ended = [e for e in run_experiment(store, exp.experiment_id, concurrency=concurrency)
                 if e["type"] == "experiment_finished"]
        assert ended and ended[0]["status"] == "finished", ended
        print(f"built {rows} rows x {len(CAPS)} configurations in "
              f"{time.perf_counter() - start:.0f} s")
        return exp.experiment_id


def _check(store: Store, exp_id: str, rows: int) -> None:
    """The experiment is whole: every cell ended, and the one-pass configuration lost rows."""
    results = experiment_results(store, exp_id)
    assert len(results.cells) == rows * len(CAPS), len(results.cells)
    assert results.ended() == len(results.cells)
    assert results.compare(0, 2).broken, "no row flipped between 3 passes and 1"


def _median_pair(small: Callable[[], object], big: Callable[[], object], rounds: int
                 ) -> tuple[float, float]:
    """Median ms of ``small`` and ``big``, alternating which goes first, after a warm-up."""
    times: dict[int, list[float]] = {0: [], 1: []}
    pair = (small, big)
    for fn in pair:
        fn()
    for i in range(rounds):
        for which in ((0, 1) if i % 2 == 0 else (1, 0)):
            gc.collect()
            start = time.perf_counter()
            pair[which]()
            times[which].append((time.perf_counter() - start) * 1_000)
    return statistics.median(times[0]), statistics.median(times[1])


def _library(store: Store, exp_id: str) -> dict[str, Callable[[], object]]:
    """What each results tab computes, without drawing."""
    return {
        "Grid": lambda: sup.results_grid(experiment_results(store, exp_id, verdicts=False)),
        "Summary": lambda: experiment_results(store, exp_id).summary(),
        "Per criterion": lambda: experiment_results(store, exp_id).criteria(),
        "Compare": lambda: sup.comparison_view(
            experiment_results(store, exp_id, verdicts=False), 0, 2),
    }


def _apptest() -> Any:
    """AppTest, routed through app.py's st.navigation and with one shared script cache."""
    import streamlit.testing.v1.app_test as app_test
    import streamlit.testing.v1.local_script_runner as local_runner
    from streamlit.runtime.pages_manager import PagesManager
    from streamlit.runtime.scriptrunner.script_cache import ScriptCache

    # As tests/test_app.py does: AppTest resets this flag before each run, and with pages/
    # next to app.py it would run a page alone (no app.py); the server keeps it False.
    class _Pages(PagesManager):
        pass

    PagesManager.uses_pages_directory = False
    app_test.PagesManager = _Pages  # type: ignore[misc]
    cache = ScriptCache()
    app_test.ScriptCache = lambda: cache  # type: ignore[assignment,misc]
    local_runner.ScriptCache = lambda: cache  # type: ignore[assignment,misc]
    logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").addFilter(
        lambda record: "missing ScriptRunContext" not in record.getMessage())
    return app_test.AppTest


def _page(app_test: Any, db: Path, tab: str, rows: int) -> Callable[[], object]:
    """A render of the Experiments page with ``tab`` open, checked once."""
    at = app_test.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.session_state["db_path"] = str(db)
    at.run()
    at.switch_page("pages/experiments.py")
    at.session_state["exp_tab"] = tab
    at.run()
    assert not at.exception, at.exception
    expected = {"Grid": ("row", rows), "Summary": ("satisfied_pct", len(CAPS)),
                "Compare": ("change", None), "Per criterion": ("final_pass_rate", None)}[tab]
    frames = [d.value for d in at.dataframe if expected[0] in d.value.columns]
    assert frames, f"{tab}: no table with {expected[0]!r}"
    assert expected[1] is None or len(frames[0]) == expected[1], (tab, len(frames[0]))

    def render() -> object:
        at.run()
        if at.exception:
            raise RuntimeError(at.exception[0].message)
        return at

    return render


def main(argv: list[str] | None = None) -> int:
    """Build (or reuse) the two experiments, measure, print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--db-dir", type=Path, default=None,
                        help="keep the two databases here and reuse them next time")
    parser.add_argument("--concurrency", type=int, default=2,
                        help="cells at once while building (CPU-bound offline models)")
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 if the grid page's ratio is over {TARGET:g}x")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rubric-bench-") as tmp:
        where = args.db_dir or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        dbs = {n: where / f"experiment-{n}-rows.sqlite3" for n in (SMALL_ROWS, BIG_ROWS)}
        ids = {n: _build(db, n, args.concurrency) for n, db in dbs.items()}
        table: list[tuple[str, float, float]] = []
        with Store(dbs[SMALL_ROWS]) as small, Store(dbs[BIG_ROWS]) as big:
            for n, store in ((SMALL_ROWS, small), (BIG_ROWS, big)):
                _check(store, ids[n], n)
            calls = (_library(small, ids[SMALL_ROWS]), _library(big, ids[BIG_ROWS]))
            for tab in TABS:
                a, b = _median_pair(calls[0][tab], calls[1][tab], args.rounds)
                table.append((f"{tab}: library calls", a, b))
        app_test = _apptest()
        for tab in TABS:
            a, b = _median_pair(_page(app_test, dbs[SMALL_ROWS], tab, SMALL_ROWS),
                                _page(app_test, dbs[BIG_ROWS], tab, BIG_ROWS), args.rounds)
            table.append((f"{tab} page (AppTest)", a, b))
    print(f"\nExperiments results, {SMALL_ROWS} vs {BIG_ROWS:,} rows x {len(CAPS)} "
          f"configurations; median of {args.rounds} alternating rounds")
    print(f"{'case':<28}{f'{SMALL_ROWS} rows ms':>12}{f'{BIG_ROWS:,} rows ms':>14}{'ratio':>8}")
    for label, a, b in table:
        print(f"{label:<28}{a:>12.1f}{b:>14.1f}{b / a:>7.2f}x")
    grid = next(b / a for label, a, b in table if label.startswith("Grid page"))
    verdict = "within" if grid <= TARGET else "OVER"
    print(f"\nGrid page: {grid:.2f}x the {SMALL_ROWS}-row render ({verdict} the target "
          f"<= {TARGET:g}x)")
    return 1 if args.check and grid > TARGET else 0


if __name__ == "__main__":
    raise SystemExit(main())
