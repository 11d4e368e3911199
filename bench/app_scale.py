"""How the app's data work scales: Review and History page data, and the CSV export.

Each case is measured side by side with its small twin in one run, alternating over several
rounds, and reported as a ratio (median of the rounds):

(a) Review page data for a run of 50 iterations x 20 criteria against a 1 x 1 run:
    ``store.evaluations`` + ``export.evaluations_frame`` + ``heatmap_frame`` +
    ``criteria_changes`` (first against last evaluation).
(b) History listing with 1,000 stored runs against 1 run: ``store.count_runs`` +
    ``list_runs(limit=50)``, without and with a text filter.
(c) CSV export of 100,000 rows: ``export.to_csv(evaluations_frame(...))`` against plain
    ``DataFrame.to_csv`` of the same frame (the cost of formula neutralisation).

When the app's pages exist, the real Review page (History listing plus the latest run) is
also rendered with Streamlit's AppTest for (a) and (b); ``--no-apptest`` skips that.

Run from the repository root (temporary SQLite files are used and removed; no network):

    .venv/bin/python bench/app_scale.py
    .venv/bin/python bench/app_scale.py --rounds 3     # quicker, noisier
"""

from __future__ import annotations

import argparse
import gc
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rubric_core.export import (
    criteria_changes,
    evaluations_frame,
    heatmap_frame,
    to_csv,
)
from rubric_core.store import Store

if TYPE_CHECKING:
    from collections.abc import Callable

ROOT = Path(__file__).resolve().parents[1]

DEFAULT_ROUNDS = 7
"""Alternating rounds per case; the median is reported."""
BIG_ITERATIONS, BIG_CRITERIA = 50, 20
HISTORY_RUNS = 1_000
CSV_ROWS = 100_000
_ANSWER = (
    "Spring rain on the roof; the old cat sleeps through it, dreaming of warm stones. "
    "Blossoms drift past the window and the kettle begins to sing. "
)


def _criteria(n: int) -> list[str]:
    return [f"Criterion {i + 1}: the answer covers aspect number {i + 1}" for i in range(n)]


def _evaluation(grading_run_id: str, iteration: int, criteria: list[str], last: bool,
                answer_chars: int = 1_500) -> dict[str, Any]:
    verdicts: list[dict[str, Any]] = []
    for j, name in enumerate(criteria):
        # Criteria turn green one after another as the iterations go by.
        passed = last or (j + iteration) % 3 == 0
        gap = f"- add detail {j} (try {iteration})"  # a leading '-' gets the CSV escape
        verdicts.append({"name": name, "passed": True} if passed else
                        {"name": name, "passed": False, "gap": gap})
    answer = (f"Draft {iteration}. " + _ANSWER * (answer_chars // len(_ANSWER) + 1))[:answer_chars]
    return {
        "grading_run_id": grading_run_id, "iteration": iteration,
        "result": "satisfied" if last else "needs_revision",
        "explanation": "=All criteria met." if last else "Some criteria still fail.",
        "criteria": verdicts, "status": "satisfied" if last else "needs_revision",
        "unverified": False, "duration_s": 0.8, "input_tokens": 1_200, "output_tokens": 150,
        "answer": answer,
    }


def _add_run(store: Store, iterations: int, n_criteria: int, title: str) -> tuple[str, str]:
    criteria = _criteria(n_criteria)
    rubric = "\n".join(f"- {c}" for c in criteria)
    run = store.create_run(title=title, prompt=f"Write about {title}", rubric=rubric,
                           worker_model="openai:gpt-4.1-mini", grader_model="rules",
                           max_iterations=max(iterations, 1))
    for i in range(iterations):
        ev = _evaluation("g-" + run.run_id, i, criteria, last=i == iterations - 1)
        store.add_evaluation(run.run_id, ev)  # type: ignore[arg-type]
    store.finish_run(run.run_id, "satisfied", duration_s=1.0)
    return run.run_id, rubric


def _time_ms(fn: Callable[[], object], out: list[float], prepared: bool) -> None:
    if prepared:  # fn does its setup and returns what to time
        fn = fn()  # type: ignore[assignment]
    gc.collect()
    start = time.perf_counter()
    fn()
    out.append((time.perf_counter() - start) * 1_000)


def _side_by_side(small: Callable[[], Any], large: Callable[[], Any], rounds: int, *,
                  prepared: bool = False) -> tuple[float, float]:
    """Median ms of `small` and `large`, alternating which goes first, after a warm-up."""
    for fn in (small, large):  # warm caches and imports outside the measurement
        _time_ms(fn, [], prepared)
    a: list[float] = []
    b: list[float] = []
    for i in range(rounds):
        for fn, out in ((small, a), (large, b)) if i % 2 == 0 else ((large, b), (small, a)):
            _time_ms(fn, out, prepared)
    return statistics.median(a), statistics.median(b)


def review_data(store: Store, run_id: str, rubric: str) -> tuple[Any, ...]:
    """What the Review page computes for one run (no drawing)."""
    evs = store.evaluations(run_id)
    frame = evaluations_frame(evs, run=store.get_run(run_id))
    heat = heatmap_frame(evs, rubric=rubric)
    changes = criteria_changes(evs[0], evs[-1])
    return frame, heat, changes


def history_data(store: Store) -> tuple[Any, ...]:
    """What the History listing asks the store: totals and the first page, then filtered."""
    total = store.count_runs()
    page = store.list_runs(limit=50)
    hits = store.count_runs(text="SPRING")
    filtered = store.list_runs(limit=50, text="SPRING")
    return total, page, hits, filtered


def _csv_frame(rows: int) -> Any:
    criteria = _criteria(BIG_CRITERIA)
    n_evals = rows // BIG_CRITERIA
    evs = [_evaluation("g-csv", i, criteria, last=i == n_evals - 1, answer_chars=300)
           for i in range(n_evals)]
    frame = evaluations_frame(evs, run={"run_id": "r", "title": "=csv", "worker_model": "w",
                                        "grader_model": "g", "status": "satisfied"})
    assert len(frame) == rows, len(frame)
    return frame


def _apptest_review(db: Path) -> Callable[[], Callable[[], object]] | None:
    """A Review page render with Streamlit's AppTest: setup returns the timed run."""
    try:
        from streamlit.testing.v1 import AppTest
    except ImportError:
        return None
    # Bare-mode chatter, one line per render otherwise; a filter survives Streamlit resetting
    # its loggers' levels when it loads its config.
    logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").addFilter(
        lambda record: "missing ScriptRunContext" not in record.getMessage())
    if not (ROOT / "app.py").exists() or not (ROOT / "pages" / "review.py").exists():
        return None

    def prepare() -> Callable[[], object]:
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
        at.session_state["db_path"] = str(db)
        at.run()  # the default page, outside the measurement
        at.switch_page("pages/review.py")

        def render() -> object:
            at.run()
            if at.exception:
                raise RuntimeError(at.exception[0].message)
            return at

        return render

    return prepare


def main(argv: list[str] | None = None) -> int:
    """Build the data, measure, print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--no-apptest", action="store_true",
                        help="skip rendering the Review page with Streamlit's AppTest")
    args = parser.parse_args(argv)
    few = max(3, args.rounds // 2)
    rows: list[tuple[str, str, str, float, float]] = []
    big_label = f"{BIG_ITERATIONS} it x {BIG_CRITERIA} crit"
    with tempfile.TemporaryDirectory(prefix="rubric-bench-") as tmp:
        dbs = {name: Path(tmp) / f"{name}.sqlite3" for name in ("big", "small", "one", "many")}
        # One run per file, so the Review page (which opens the latest run) shows that run.
        with Store(dbs["big"]) as big_store, Store(dbs["small"]) as small_store, \
                Store(dbs["one"]) as one, Store(dbs["many"]) as many:
            big_id, big_rubric = _add_run(big_store, BIG_ITERATIONS, BIG_CRITERIA, "big review")
            small_id, small_rubric = _add_run(small_store, 1, 1, "small review")
            small, big = _side_by_side(
                lambda: review_data(small_store, small_id, small_rubric),
                lambda: review_data(big_store, big_id, big_rubric), args.rounds)
            rows.append(("(a) Review page data", "1 it x 1 crit", big_label, small, big))

            for i in range(HISTORY_RUNS):
                _add_run(many, 1, 3, "spring haiku" if i % 10 == 0 else f"summary {i}")
            _add_run(one, 1, 3, "spring haiku")
            small, big = _side_by_side(lambda: history_data(one), lambda: history_data(many),
                                       args.rounds)
            rows.append(("(b) History listing data", "1 run", f"{HISTORY_RUNS:,} runs",
                         small, big))

        pages = {name: _apptest_review(db) for name, db in dbs.items()}
        if args.no_apptest:
            pass
        elif all(pages.values()):
            small, big = _side_by_side(pages["small"], pages["big"], few,  # type: ignore[arg-type]
                                       prepared=True)
            rows.append(("(a') Review page, AppTest", "1 it x 1 crit", big_label, small, big))
            small, big = _side_by_side(pages["one"], pages["many"], few,  # type: ignore[arg-type]
                                       prepared=True)
            rows.append(("(b') Review+History, AppTest", "1 run", f"{HISTORY_RUNS:,} runs",
                         small, big))
        else:
            print("AppTest: app.py or pages/review.py is missing; page renders skipped.\n")

    frame = _csv_frame(CSV_ROWS)
    small, big = _side_by_side(lambda: frame.to_csv(index=False, lineterminator="\r\n"),
                               lambda: to_csv(frame), few)
    rows.append(("(c) CSV export", "DataFrame.to_csv", f"to_csv, {CSV_ROWS:,} rows", small, big))

    header = ("case", "baseline", "measured", "baseline ms", "measured ms", "ratio")
    table = [header] + [(c, b, m, f"{s:.1f}", f"{g:.1f}", f"{g / s:.2f}x")
                        for c, b, m, s, g in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for n, r in enumerate(table):
        print("  ".join(cell.ljust(w) if i < 3 else cell.rjust(w)
                        for i, (cell, w) in enumerate(zip(r, widths, strict=True))))
        if n == 0:
            print("  ".join("-" * w for w in widths))
    print(f"\nmedian of {args.rounds} alternating rounds ({few} for AppTest and CSV); ratios "
          "compare like with like, absolute times depend on the machine.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
