"""Experiments: the bundled dataset end to end, concurrency and shared backoff over real HTTP,
Stop and Resume, retries, results and the streamed export."""

from __future__ import annotations

import csv
import inspect
import io
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
from openai_server import DelayedServer, error, verdict

from rubric_core.datasets import Dataset, DatasetRow, parse_dataset
from rubric_core.experiments import (
    SharedBackoff,
    create_experiment,
    experiment_models,
    experiment_results,
    export_columns,
    export_experiment_rows,
    retry_cell,
    run_experiment,
)
from rubric_core.export import write_csv
from rubric_core.offline.demo_dataset import demo_dataset
from rubric_core.settings import ExperimentConfig
from rubric_core.store import CellOutcome, Store

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

RUBRIC = "- c1\n- c2"


def runs_per_thread(db: Store | Path | str, experiment_id: str) -> list[int]:
    """How many runs each cell's thread holds (exactly one when nothing ran twice)."""
    store = db if isinstance(db, Store) else Store(db)
    try:
        counts = Counter(run.thread_id for run in store.list_runs(limit=None))
        return [counts[cell.thread_id] for cell in store.experiment_cells(experiment_id)]
    finally:
        if store is not db:
            store.close()


# The `store` fixture (tests/conftest.py) runs each test on SQLite and on PostgreSQL.


def test_bundled_dataset_runs_end_to_end(store: Store) -> None:
    exp = create_experiment(store, demo_dataset(), [ExperimentConfig()])
    events = list(run_experiment(store, exp.experiment_id))
    assert events[-1]["type"] == "experiment_finished" and events[-1]["status"] == "finished"
    progress = [e for e in events if e["type"] == "experiment_progress"]
    assert progress[0]["done"] == 0 and progress[-1]["done"] == progress[-1]["total"] == 24
    assert progress[-1]["satisfied_rate"] == 1.0
    results = experiment_results(store, exp.experiment_id)
    assert {c.status for c in results.cells} == {"satisfied"}
    [summary] = results.summary().to_dict("records")
    assert summary["satisfied_pct"] == 100.0 and summary["done"] == 24
    assert 1 < summary["mean_passes"] <= 3
    criteria = results.criteria()
    assert set(criteria["final_pass_rate"]) == {1.0}
    assert (criteria["first_pass_rate"] < 1).any()
    assert runs_per_thread(store, exp.experiment_id) == [1] * 24
    # Each cell is an ordinary run, recorded with its dataset row, listed for Review.
    cell = store.experiment_cells(exp.experiment_id)[0]
    run = cell.run
    assert run is not None and run.settings.dataset_row is not None
    assert run.settings.dataset_row["id"] == cell.row_id == results.cells[0].row_id
    assert run.run_id == results.cells[0].run_id
    assert store.count_runs() == 24
    assert store.get_experiment(exp.experiment_id).status == "finished"  # type: ignore[union-attr]


def test_compare_two_configurations(store: Store) -> None:
    rows = demo_dataset().rows[:6]
    ds = Dataset("six", ("id", "prompt", "rubric", "kind", "topic"), rows)
    exp = create_experiment(store, ds, [ExperimentConfig(),
                                        ExperimentConfig(max_iterations=1, label="one pass")])
    list(run_experiment(store, exp.experiment_id))
    comparison = experiment_results(store, exp.experiment_id).compare(0, 1)
    assert comparison.n == 6 and len(comparison.broken) == 6 and not comparison.fixed
    assert comparison.p_value == pytest.approx(2 / 2**6)


def test_stop_then_resume_runs_every_cell_once(store: Store) -> None:
    exp = create_experiment(store, demo_dataset(), [ExperimentConfig()])
    events = run_experiment(store, exp.experiment_id, concurrency=2)
    ended = 0
    for event in events:
        ended += event["type"] == "cell_finished"
        if ended == 3:
            break
    events.close()  # Stop
    assert store.get_experiment(exp.experiment_id).status == "stopped"  # type: ignore[union-attr]
    statuses = [c.status for c in store.experiment_cells(exp.experiment_id)]
    assert statuses.count("pending") > 0 and statuses.count("satisfied") >= 3
    finished = [e for e in run_experiment(store, exp.experiment_id) if e["type"] == "cell_finished"]
    assert len(finished) == 24 - statuses.count("satisfied")  # ended cells are not run again
    assert {c.status for c in store.experiment_cells(exp.experiment_id)} == {"satisfied"}
    assert runs_per_thread(store, exp.experiment_id) == [1] * 24


def test_row_that_cannot_run_stores_nothing(store: Store) -> None:
    ds = parse_dataset("id,prompt\na,hello\n", name="norubric")
    with pytest.raises(ValueError, match="row 'a' has no 'rubric'"):
        create_experiment(store, ds, [ExperimentConfig()])
    assert store.list_datasets() == [] and store.list_experiments() == []


# -- over HTTP --------------------------------------------------------------------------------




@pytest.fixture
def server() -> Iterator[DelayedServer]:
    s = DelayedServer(delay_s=0.1)
    with s.fake:
        yield s


def _http_experiment(store: Store, server: DelayedServer, rows: int, backoff: SharedBackoff) -> str:
    ds = parse_dataset("prompt\n" + "".join(f"question {i}\n" for i in range(rows)), name="q")
    config = ExperimentConfig(worker_model="openai-compatible:w",
                              grader_model="openai-compatible:g", rubric=RUBRIC,
                              base_url=server.fake.base_url)
    exp = create_experiment(store, ds, [config],
                            models=experiment_models(backoff, api_key="test-key"))
    return exp.experiment_id


def _run(store: Store, experiment_id: str, backoff: SharedBackoff, **kwargs: Any
         ) -> list[Any]:
    return list(run_experiment(store, experiment_id, backoff=backoff,
                               models=experiment_models(backoff, api_key="test-key"), **kwargs))


def test_concurrency_is_bounded_and_used(tmp_path: Path, server: DelayedServer) -> None:
    # Speed is bench/experiment.py's to measure (shared machines are noisy); this pins the
    # behaviour: never more than C requests in flight, and more than one when C allows it.
    peaks = {}
    for concurrency in (1, 4):
        with Store(tmp_path / f"c{concurrency}.sqlite3") as store:
            backoff = SharedBackoff()
            exp_id = _http_experiment(store, server, 12, backoff)
            server.peak = 0
            _run(store, exp_id, backoff, concurrency=concurrency)
            peaks[concurrency] = server.peak
            cells = store.experiment_cells(exp_id)
            assert {c.status for c in cells} == {"satisfied"}
    assert peaks[1] == 1
    assert 1 < peaks[4] <= 4, peaks


def test_per_model_limit_holds(store: Store, server: DelayedServer) -> None:
    backoff = SharedBackoff()
    exp_id = _http_experiment(store, server, 6, backoff)
    _run(store, exp_id, backoff, concurrency=6, per_model={"openai-compatible:w": 2})
    assert server.peak <= 2


def test_a_429_burst_slows_the_experiment_but_fails_no_row(
    store: Store, server: DelayedServer
) -> None:
    backoff = SharedBackoff(base_s=0.05, max_s=1.0)
    exp_id = _http_experiment(store, server, 8, backoff)
    server.fake.enqueue(*[error(429, "slow down")] * 5, error(503, "busy"))
    started = time.perf_counter()
    events = _run(store, exp_id, backoff, concurrency=4)
    elapsed = time.perf_counter() - started
    backoffs = [e for e in events if e["type"] == "experiment_backoff"]
    assert [e["hits"] for e in backoffs] == [1, 2, 3, 4, 5, 6]
    assert {e["status_code"] for e in backoffs} == {429, 503}
    assert {c.status for c in store.experiment_cells(exp_id)} == {"satisfied"}
    # Six consecutive waits starting at 0.05 s cannot all overlap: at least the first one's.
    assert elapsed >= 0.05 + 8 * 2 * 0.1 / 4


def test_grader_error_cell_is_recorded_and_retried_alone(
    store: Store, server: DelayedServer
) -> None:
    backoff = SharedBackoff()
    exp_id = _http_experiment(store, server, 3, backoff)
    server.grader_reply = error(400, "bad request")  # not retryable: grader_error
    _run(store, exp_id, backoff)
    cells = store.experiment_cells(exp_id)
    assert {c.status for c in cells} == {"grader_error"}
    assert store.get_experiment(exp_id).status == "finished"  # type: ignore[union-attr]
    _run(store, exp_id, backoff)  # ended cells are not run again by themselves
    assert {c.status for c in store.experiment_cells(exp_id)} == {"grader_error"}
    server.grader_reply = verdict("satisfied")
    retry_cell(store, exp_id, cells[0].key)
    events = _run(store, exp_id, backoff)
    assert [e["row_id"] for e in events if e["type"] == "cell_finished"] == [cells[0].row_id]
    assert [c.status for c in store.experiment_cells(exp_id)] == [
        "satisfied", "grader_error", "grader_error"]
    _run(store, exp_id, backoff, retry_errors=True)
    assert {c.status for c in store.experiment_cells(exp_id)} == {"satisfied"}
    assert store.count_runs() == 6  # the failed runs stay in the index


def test_a_worker_that_read_no_run_before_another_started_the_cell_starts_no_second(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker reads "no run on the thread" and pauses; another starts the cell and finishes
    it; the first wakes up with its old read: it reports that run and starts none (the
    thread keeps one run and one checkpoint lineage)."""
    import asyncio

    from rubric_core.experiments.cell import cell_settings, run_cell
    from rubric_core.models import model_resolver
    from rubric_core.store import ThreadTaken

    exp = create_experiment(store, parse_dataset("prompt\nq\n", name="q"),
                            [ExperimentConfig(rubric="- c")])
    list(run_experiment(store, exp.experiment_id))  # the other worker: started and finished
    (cell,) = store.experiment_cells(exp.experiment_id)
    assert cell.run is not None and cell.status != "running"
    checkpoints = len(list(store.saver().list({"configurable": {"thread_id": cell.thread_id}})))
    latest, reads = store.latest_run_for_thread, []

    def old_read_first(thread_id: str) -> Any:
        reads.append(thread_id)
        return None if len(reads) == 1 else latest(thread_id)

    monkeypatch.setattr(store, "latest_run_for_thread", old_read_first)
    row = store.load_dataset(exp.dataset_name, exp.dataset_version)[0].rows[0]
    outcome = asyncio.run(run_cell(
        store, experiment_id=exp.experiment_id, key=cell.key, thread_id=cell.thread_id,
        settings=cell_settings(exp, row, cell.key), models=model_resolver(),
        retry_errors=False, stop=lambda: False))
    assert outcome[:2] == (cell.status, cell.run.run_id)
    assert len(reads) == 2  # the old read, then the thread's run once the start was refused
    assert runs_per_thread(store, exp.experiment_id) == [1]
    assert len(list(store.saver().list({"configurable": {"thread_id": cell.thread_id}}))) == (
        checkpoints)
    with pytest.raises(ThreadTaken, match="already has a run"):
        store.create_run(cell_settings(exp, row, cell.key), thread_id=cell.thread_id,
                         fresh_thread=True)


# -- export -----------------------------------------------------------------------------------


def test_export_is_streamed_formula_safe_and_carries_the_dataset_columns(store: Store) -> None:
    base = demo_dataset().rows[:2]
    rows = tuple(DatasetRow(r.id, r.prompt, r.rubric, {"note": "=HYPERLINK(\"x\")",
                                                       "kind": r.variables["kind"]}) for r in base)
    ds = Dataset("risky", ("id", "prompt", "rubric", "note", "kind"), rows)
    exp = create_experiment(store, ds, [ExperimentConfig()], repeats=2)
    list(run_experiment(store, exp.experiment_id))
    columns = export_columns(store, exp.experiment_id)
    assert columns[:9] == ("experiment_id", "configuration", "config_index", "repeat_index",
                           "row_id", "row_prompt", "row_rubric", "row_note", "row_kind")
    produced = export_experiment_rows(store, exp.experiment_id)
    assert inspect.isgenerator(produced)
    out = io.StringIO(newline="")
    count = write_csv(produced, out, columns)
    records = list(csv.DictReader(io.StringIO(out.getvalue(), newline="")))
    assert len(records) == count
    evaluations = store.evaluations_for_runs(
        c.run.run_id for c in store.experiment_cells(exp.experiment_id) if c.run)
    assert count == sum(len(ev["criteria"]) for evs in evaluations.values() for ev in evs)
    assert {r["row_note"] for r in records} == {"'=HYPERLINK(\"x\")"}
    assert {(r["row_id"], r["repeat_index"]) for r in records} == {
        (r.id, str(i)) for r in rows for i in (0, 1)}


def test_export_reads_its_cells_a_page_at_a_time(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rubric_core.experiments.export as experiments_export

    rows = demo_dataset().rows[:5]
    ds = Dataset("five", ("id", "prompt", "rubric", "kind", "topic"), rows)
    exp = create_experiment(store, ds, [ExperimentConfig()])
    list(run_experiment(store, exp.experiment_id))
    whole = list(export_experiment_rows(store, exp.experiment_id))
    monkeypatch.setattr(experiments_export, "_RUNS_PER_READ", 2)  # pages of 2, 2 and 1 cells
    reads: list[tuple[int, int | None]] = []
    real = store.experiment_cells

    def paged(experiment_id: str, *, offset: int = 0, limit: int | None = None) -> Any:
        reads.append((offset, limit))
        return real(experiment_id, offset=offset, limit=limit)

    monkeypatch.setattr(store, "experiment_cells", paged)
    assert list(export_experiment_rows(store, exp.experiment_id)) == whole
    assert reads == [(0, 2), (2, 2), (4, 2), (6, 2)]
    assert {r[4] for r in whole} == {r.id for r in rows}


def _cell(index: int, row: str, status: str, *passes: dict[str, bool]) -> CellOutcome:
    return CellOutcome(
        row_id=row, config_index=index, repeat_index=0, run_id=f"run-{index}-{row}",
        status=status, iterations=len(passes), input_tokens=10 * len(passes),
        output_tokens=len(passes), duration_s=1.0,
        passes=tuple(("satisfied" if all(p.values()) else "needs_revision",
                      [{"name": n, "passed": v} for n, v in p.items()]) for p in passes))


def test_criteria_and_summary_agree_with_loop_analytics() -> None:
    from rubric_core.analytics import loop_analytics
    from rubric_core.experiments import ExperimentResults
    from rubric_core.store import ExperimentRecord

    cells = [
        # fixed after one pass; fixed after two (c2); never failed (c1)
        _cell(0, "a", "satisfied", {"C1": True, "c2": False}, {"c1": True, "c2": True}),
        _cell(0, "b", "satisfied", {"c1": True, "C2.": False}, {"c1": True, "c2": False},
              {"c1": True, "c2": True}),
        # never fixed; a criterion graded only from the second pass on (c3)
        _cell(0, "c", "max_iterations_reached", {"c1": False, "c2": False},
              {"c1": False, "c2": True, "c3": False}),
        # fails, passes, fails again: fixed once, after one pass
        _cell(0, "d", "satisfied", {"c1": False}, {"c1": True}, {"c1": False}, {"c1": True}),
        _cell(1, "a", "satisfied", {"c1": True, "c2": True}),
        _cell(1, "b", "pending"),
    ]
    experiment = ExperimentRecord(
        experiment_id="e", name="e", dataset_name="d", dataset_version=1,
        configurations=(ExperimentConfig(rubric=RUBRIC), ExperimentConfig(rubric=RUBRIC)),
        repeats=1, status="finished", created_at="", updated_at="")
    results = ExperimentResults(experiment, cells)
    criteria = results.criteria()
    for index in (0, 1):
        evaluations = [{"grading_run_id": c.row_id, "iteration": i, "criteria": verdicts}
                       for c in cells if c.config_index == index
                       for i, (_, verdicts) in enumerate(c.passes)]
        expected = loop_analytics(evaluations)
        mine = criteria[criteria["config_index"] == index].reset_index(drop=True)
        assert mine["criterion"].tolist() == expected["criterion"].tolist()
        assert mine["cells"].tolist() == expected["grading_runs"].tolist()
        assert mine["mean_passes_to_fix"].fillna(-1).tolist() == (
            expected["mean_passes_to_fix"].astype(float).fillna(-1).tolist())
    first = criteria[criteria["config_index"] == 0].set_index("criterion")
    assert first["first_pass_rate"].fillna(-1).to_dict() == {"C1": 0.5, "c2": 0.0, "c3": -1}
    assert first["final_pass_rate"].to_dict() == {"C1": 0.75, "c2": 1.0, "c3": 0.0}
    assert first.loc["c2", "mean_passes_to_fix"] == round(4 / 3, 4)
    summary = results.summary().set_index("config_index")
    assert summary.loc[0, "first_pass_satisfied_pct"] == 0.0
    assert summary.loc[0, "mean_passes"] == pytest.approx(11 / 4)
    assert summary.loc[1, ["cells", "done", "satisfied_pct"]].tolist() == [2, 1, 100.0]
    lean = ExperimentResults(experiment, cells, verdicts=False)
    assert lean.ended() == 5 and lean.compare(0, 1).n == 1
    with pytest.raises(ValueError, match="without verdicts"):
        lean.summary()
    with pytest.raises(ValueError, match="without verdicts"):
        lean.criteria()


def test_limits_are_refused_before_anything_is_stored_or_run(store: Store) -> None:
    from rubric_core.experiments import MAX_CELLS, MAX_CONCURRENCY, MAX_REPEATS

    dataset = demo_dataset()
    with pytest.raises(ValueError, match=f"repeats must be a whole number from 1 to {MAX_REPEATS}"):
        create_experiment(store, dataset, [ExperimentConfig()], repeats=MAX_REPEATS + 1)
    many = [ExperimentConfig(label=str(i)) for i in range(MAX_CELLS // len(dataset.rows) + 1)]
    with pytest.raises(ValueError, match="an experiment holds at most 100,000"):
        create_experiment(store, dataset, many)
    assert store.list_experiments() == [] and store.list_datasets() == []
    exp = create_experiment(store, dataset, [ExperimentConfig()])
    for bad in ({"concurrency": MAX_CONCURRENCY + 1}, {"concurrency": 0},
                {"per_model": {"demo": MAX_CONCURRENCY + 1}}):
        with pytest.raises(ValueError, match=f"from 1 to {MAX_CONCURRENCY}"):
            list(run_experiment(store, exp.experiment_id, **bad))
    assert {c.status for c in store.experiment_cells(exp.experiment_id)} == {"pending"}
