"""Loop analytics and Cohen's κ, checked against hand-computed cases."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from rubric_core.analytics import ANALYTICS_COLUMNS, cohen_kappa, grading_runs, loop_analytics


def _ev(run: str, iteration: int, verdicts: dict[str, bool], tokens: int = 0,
        agreement: dict[str, float] | None = None) -> dict[str, Any]:
    criteria = []
    for name, passed in verdicts.items():
        c: dict[str, Any] = {"name": name, "passed": passed}
        if agreement and name in agreement:
            c["agreement"] = agreement[name]
        criteria.append(c)
    return {"grading_run_id": run, "iteration": iteration, "criteria": criteria,
            "input_tokens": tokens, "output_tokens": 0}


# --------------------------------------------------------------------------- κ


@pytest.mark.parametrize(
    ("table", "percent", "kappa"),
    [
        # (yes,yes), (yes,no), (no,yes), (no,no) counts
        pytest.param((20, 5, 10, 15), 70.0, 0.4, id="textbook_0_4"),
        pytest.param((10, 0, 0, 10), 100.0, 1.0, id="perfect"),
        pytest.param((0, 10, 10, 0), 0.0, -1.0, id="perfect_disagreement"),
        pytest.param((25, 25, 25, 25), 50.0, 0.0, id="chance"),
        pytest.param((45, 15, 25, 15), 60.0, 0.1304, id="skewed"),
    ],
)
def test_cohen_kappa_matches_hand_computed_values(
    table: tuple[int, int, int, int], percent: float, kappa: float
) -> None:
    yy, yn, ny, nn = table
    pairs = [(True, True)] * yy + [(True, False)] * yn + [(False, True)] * ny
    pairs += [(False, False)] * nn
    result = cohen_kappa(pairs)
    assert result.n == sum(table) and result.percent == percent
    assert result.kappa == pytest.approx(kappa, abs=1e-4)


def test_kappa_is_undefined_when_both_raters_never_vary() -> None:
    result = cohen_kappa([(True, True)] * 5)
    assert (result.n, result.percent, result.kappa) == (5, 100.0, None)
    assert cohen_kappa([]).percent is None


# --------------------------------------------------------------------------- loop analytics


def test_loop_analytics_by_hand() -> None:
    evaluations = [
        # run A: c1 fails, fails, passes (fixed after 2 passes); c2 passes, fails, passes
        _ev("A", 0, {"c1": False, "c2": True}, tokens=100),
        _ev("A", 1, {"c1": False, "c2": False}, tokens=60),
        _ev("A", 2, {"c1": True, "c2": True}, tokens=40),
        # run B: c1 fails then passes at once; c2 always passes
        _ev("B", 0, {"c1": False, "c2": True}, tokens=10),
        _ev("B", 1, {"c1": True, "c2": True}, tokens=30),
    ]
    frame = loop_analytics(evaluations).set_index("criterion")
    assert list(frame.reset_index().columns) == list(ANALYTICS_COLUMNS)
    c1, c2 = frame.loc["c1"], frame.loc["c2"]
    assert c1["grading_runs"] == 2 and c1["first_pass_fail_rate"] == 1.0
    assert c1["mean_passes_to_fix"] == 1.5  # (2 + 1) / 2
    assert c1["oscillations"] == 0
    assert c1["feedback_efficacy"] == pytest.approx(2 / 3, abs=1e-4)  # 3 gaps, 2 fixed next
    # A pass0 -> pass1 forced by c1 alone: 60; A pass1 -> pass2 by c1 and c2: 40/2 each;
    # B pass0 -> pass1 by c1: 30
    assert c1["revision_tokens"] == 60 + 20 + 30
    assert c2["revision_tokens"] == 20
    assert c2["first_pass_fail_rate"] == 0.0 and c2["oscillations"] == 1
    assert c2["mean_passes_to_fix"] == 1.0 and c2["feedback_efficacy"] == 1.0
    assert pd.isna(c1["instability"])  # no repeats, no figure


def test_instability_from_repeats_and_names_matched_loosely() -> None:
    evaluations = [
        _ev("A", 0, {"The poem has three lines": True},
            agreement={"The poem has three lines": 1.0}),
        _ev("B", 0, {"the poem has  three lines": True},
            agreement={"the poem has  three lines": 0.6}),
    ]
    frame = loop_analytics(evaluations)
    assert len(frame) == 1 and frame.loc[0, "criterion"] == "The poem has three lines"
    assert frame.loc[0, "instability"] == 0.2  # mean of 0.0 and 0.4
    assert frame.loc[0, "grading_runs"] == 2


def test_grading_runs_are_grouped_and_ordered() -> None:
    runs = grading_runs([_ev("A", 1, {}), _ev("B", 0, {}), _ev("A", 0, {})])
    assert [[e["iteration"] for e in run] for run in runs] == [[0, 1], [0]]


# --------------------------------------------------------------------------- comparisons


@pytest.mark.parametrize(
    ("broken", "fixed", "p"),
    [
        pytest.param(0, 0, 1.0, id="nothing_flipped"),
        pytest.param(1, 9, 0.021484, id="one_vs_nine"),  # 2 * (1 + 10) / 1024
        pytest.param(0, 5, 0.0625, id="zero_vs_five"),  # 2 / 32
        pytest.param(3, 3, 1.0, id="balanced"),
        pytest.param(2, 8, 0.109375, id="two_vs_eight"),  # 2 * (1 + 10 + 45) / 1024
        pytest.param(24, 0, 2 / 2**24, id="all_24_broken"),  # tiny, never shown as 0
    ],
)
def test_mcnemar_exact_matches_hand_computed_values(broken: int, fixed: int, p: float) -> None:
    from rubric_core.analytics import mcnemar_exact

    assert mcnemar_exact(broken, fixed) == pytest.approx(p, rel=1e-5, abs=1e-6 if p > 1e-3 else 0)


def test_compare_outcomes_counts_flips_on_shared_rows() -> None:
    from rubric_core.analytics import compare_outcomes

    a = {"r1": True, "r2": False, "r3": False, "r4": True, "only_a": True}
    b = {"r1": True, "r2": True, "r3": False, "r4": False, "only_b": False}
    result = compare_outcomes(a, b)
    assert (result.n, result.both_pass, result.both_fail) == (4, 1, 1)
    assert result.fixed == ["r2"] and result.broken == ["r4"]
    assert result.p_value == 1.0


# --------------------------------------------------------------------------- scopes


def _graded_run(store: Any, rubric: str, verdicts: list[dict[str, bool]],
                thread_id: str | None = None) -> str:
    run = store.create_run(prompt="p", rubric=rubric, title="t", thread_id=thread_id)
    for i, passes in enumerate(verdicts):
        store.add_evaluation(run.run_id, {
            "grading_run_id": f"g-{run.run_id}", "iteration": i,
            "result": "satisfied" if all(passes.values()) else "needs_revision",
            "explanation": "", "status": "needs_revision", "unverified": False,
            "duration_s": 0.1, "input_tokens": None, "output_tokens": None, "answer": str(i),
            "criteria": [{"name": n, "passed": v, **({} if v else {"gap": "x"})}
                         for n, v in passes.items()]})
    return str(run.run_id)


@pytest.fixture
def scoped_store(tmp_path: Any) -> Any:
    """Two runs of rubric A (one an experiment cell), one of rubric B; a cell never run."""
    from rubric_core.offline.demo_dataset import demo_dataset
    from rubric_core.settings import ExperimentConfig
    from rubric_core.store import Store

    store = Store(tmp_path / "db.sqlite3")
    dataset = demo_dataset()
    version = store.save_dataset(dataset)
    exp = store.create_experiment(name="e", dataset_name=dataset.name, dataset_version=version,
                                  configurations=[ExperimentConfig()], repeats=1,
                                  row_ids=[r.id for r in dataset.rows[:2]])
    cell = store.experiment_cells(exp.experiment_id)[0]
    ids = {
        "cell": _graded_run(store, "- a", [{"a": False}, {"a": True}], cell.thread_id),
        "solo": _graded_run(store, "- a\n", [{"a": True}]),
        "other": _graded_run(store, "- b", [{"b": False}]),
        "experiment": exp.experiment_id,
    }
    yield store, ids
    store.close()


@pytest.mark.parametrize(
    ("scope", "key", "runs", "first_fail"),
    [
        pytest.param("run", "cell", ["cell"], {"a": 1.0}, id="one_run"),
        pytest.param("run", "cell[:8]", ["cell"], {"a": 1.0}, id="run_by_prefix"),
        pytest.param("experiment", "experiment", ["cell"], {"a": 1.0}, id="experiment_cells"),
        pytest.param("experiment", "experiment[:6]", ["cell"], {"a": 1.0},
                     id="experiment_by_prefix"),
        pytest.param("rubric", "- a", ["solo", "cell"], {"a": 0.5}, id="every_run_of_a_rubric"),
        pytest.param("all", "", ["other", "solo", "cell"], {"a": 0.5, "b": 1.0}, id="all"),
    ],
)
def test_scoped_analytics_covers_the_runs_of_its_scope(
    scoped_store: Any, scope: str, key: str, runs: list[str], first_fail: dict[str, float]
) -> None:
    from rubric_core.analytics import scoped_analytics

    store, ids = scoped_store
    if key and key != "- a":
        name, _, cut = key.partition("[:")
        key = ids[name][: int(cut.rstrip("]"))] if cut else ids[name]
    scoped = scoped_analytics(store, scope, key)
    assert [r.run_id for r in scoped.runs] == [ids[n] for n in runs]
    table = scoped.table.set_index("criterion")
    assert table["first_pass_fail_rate"].to_dict() == first_fail
    assert scoped.passes == sum(len(store.evaluations(ids[n])) for n in runs)


@pytest.mark.parametrize(
    ("scope", "key", "message"),
    [
        pytest.param("run", "nope", "no run 'nope'", id="unknown_run"),
        pytest.param("run", "", "no run ''", id="empty_run_id"),
        pytest.param("experiment", "nope", "no experiment 'nope'", id="unknown_experiment"),
        pytest.param("dataset", "", "unknown analytics scope", id="unknown_scope"),
    ],
)
def test_a_scope_that_names_nothing_is_refused(scoped_store: Any, scope: str, key: str,
                                               message: str) -> None:
    from rubric_core.analytics import scoped_analytics

    with pytest.raises(ValueError, match=message):
        scoped_analytics(scoped_store[0], scope, key)
