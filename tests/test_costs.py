"""Costs (`rubric_core.costs`) and budgets (`rubric_core.experiments.budget`), end to end.

Model traffic goes to the loopback server that reports cached prompt tokens as OpenAI does
(`openai_server.CachingOpenAI`); the models are ``openai-compatible:`` ones, whose price is
unknown until a person gives it, so both "unknown" and an override are exercised. Every dollar
figure is checked against the recorded calls' tokens priced by hand.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from openai_server import CachingOpenAI, Reply, error, text, verdict

from rubric_core import session
from rubric_core.costs import RunningCost, experiment_cost, run_cost, run_costs, usage_of
from rubric_core.datasets import parse_dataset
from rubric_core.experiments import Budget, BudgetError, create_experiment, run_experiment
from rubric_core.experiments.budget import estimate_experiment, first_estimate
from rubric_core.models import model_resolver
from rubric_core.prices import PriceOverride, Prices, Usage
from rubric_core.settings import ExperimentConfig, RunSettings
from rubric_core.store import Store

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[1]
RUBRIC = "- c1\n- c2"
PROMPT = "Write a short note. " + "Context that stays the same on every call. " * 40
W, G = "openai-compatible:w", "openai-compatible:g"
W_PRICE, G_PRICE = f"{W}=1000,500,2000", f"{G}=800,100,4000"
"""Dollars per million tokens (absurdly high, so that a cell costs about a dollar)."""
PER_M = {"worker": (Decimal(1000), Decimal(500), Decimal(2000)),
         "grader": (Decimal(800), Decimal(100), Decimal(4000))}


def by_hand(calls: list[dict[str, Any]]) -> Decimal:
    """What recorded calls cost at the test's prices, computed apart from the library."""
    out = Decimal(0)
    for c in calls:
        if c["input_tokens"] is None and c["status"] == "error":
            continue  # a refused request reported no usage and is not billed
        fresh, cached, output = PER_M[c["role"]]
        out += ((c["input_tokens"] - c["cached_input_tokens"]) * fresh
                + c["cached_input_tokens"] * cached + c["output_tokens"] * output) / 10**6
    return out


def respond(body: dict[str, Any]) -> Reply:
    names = [t.get("function", {}).get("name") for t in body.get("tools") or []]
    if "GraderResponse" in names:
        return verdict("satisfied")
    return text("answer " * 50)


@pytest.fixture
def server() -> Iterator[CachingOpenAI]:
    with CachingOpenAI(default=respond) as s:
        yield s


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_API_KEY") and k != "RUBRIC_STUDIO_BASE_URL"
           and not k.startswith(("LANGSMITH_", "LANGCHAIN_"))}
    return subprocess.run([sys.executable, "-m", "rubric_core", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180, check=False)


# --------------------------------------------------------------------------- library


def test_a_run_is_priced_per_call_pass_role_and_criterion(store: Store,
                                                          server: CachingOpenAI) -> None:
    grader = [verdict("needs_revision", ("c2",)), verdict("satisfied")]

    def scripted(body: dict[str, Any]) -> Reply:
        names = [t.get("function", {}).get("name") for t in body.get("tools") or []]
        return grader.pop(0) if "GraderResponse" in names else text("draft")

    server.default = scripted
    settings = RunSettings(prompt=PROMPT, rubric=RUBRIC, worker_model=W, grader_model=G,
                           base_url=server.base_url)
    run = session.start(store, settings, models=model_resolver(api_key="test-key"))
    for _ in run:
        pass
    calls = store.calls(run.run_id)
    assert sum(c["cached_input_tokens"] for c in calls) > 0  # the cache is exercised
    usage = store.call_usage_for_runs([run.run_id])[run.run_id]

    unknown = run_cost(Prices(), settings, usage, iterations=2)
    assert unknown.total is None and unknown.worker is None and unknown.grader is None
    assert all(v is None for v in unknown.criteria.values())

    prices = Prices([PriceOverride.parse(W_PRICE), PriceOverride.parse(G_PRICE)])
    cost = run_cost(prices, settings, usage, iterations=2)
    assert cost.total == by_hand(calls)
    assert cost.worker == by_hand([c for c in calls if c["role"] == "worker"])
    assert cost.grader == by_hand([c for c in calls if c["role"] == "grader"])
    assert [p.iteration for p in cost.passes] == [0, 1]
    assert sum((p.total for p in cost.passes if p.total), Decimal(0)) == cost.total
    # Per criterion: each pass's grader cost split evenly; the worker's is not attributed.
    assert set(cost.criteria) == {"c1", "c2"}
    assert cost.criteria["c1"] == cost.criteria["c2"] == cost.grader / 2
    [record] = store.list_runs()
    assert run_costs(store, prices, [record])[record.run_id].total == cost.total


def test_a_watched_run_says_each_call_as_it_ends_and_its_running_cost_adds_up(
        store: Store, server: CachingOpenAI) -> None:
    grader = [verdict("needs_revision", ("c2",)), verdict("satisfied")]

    def scripted(body: dict[str, Any]) -> Reply:
        names = [t.get("function", {}).get("name") for t in body.get("tools") or []]
        return grader.pop(0) if "GraderResponse" in names else text("draft")

    server.default = scripted
    settings = RunSettings(prompt=PROMPT, rubric=RUBRIC, worker_model=W, grader_model=G,
                           base_url=server.base_url)
    prices = Prices([PriceOverride.parse(W_PRICE), PriceOverride.parse(G_PRICE)])
    run = session.start(store, settings, models=model_resolver(api_key="test-key"))
    running = RunningCost.of_run(prices, run.settings)
    unpriced = RunningCost.of_run(Prices(), run.settings)
    announced: list[str] = []
    totals: list[Decimal | None] = []
    for event in run:
        if event["type"] == "call_finished":
            announced.append(event["call"]["call_id"])
            for each in (running, unpriced):
                each.add(usage_of(run.run_id, [event["call"]])[0])
            totals.append(running.total)
        elif event["type"] in ("evaluation_finished", "run_finished"):
            # Every call an event hands over for recording was announced as it ended, before.
            assert {c["call_id"] for c in event.get("calls") or []} <= set(announced)
    calls = store.calls(run.run_id)
    assert announced == [c["call_id"] for c in calls]
    # One figure per call, growing with each, ending at the recorded run's cost.
    assert totals == [by_hand(calls[:i + 1]) for i in range(len(calls))]
    usage = store.call_usage_for_runs([run.run_id])[run.run_id]
    assert running.total == run_cost(prices, settings, usage, iterations=2).total
    assert running.worker == by_hand([c for c in calls if c["role"] == "worker"])
    assert running.cached_input_tokens == sum(c["cached_input_tokens"] for c in calls) > 0
    assert running.calls == len(calls) == 4
    # Without a price: unknown, never $0.
    assert unpriced.total is None and unpriced.worker is None and unpriced.grader is None
    # A resumed run's figure starts from the calls it recorded before.
    again = RunningCost.of_run(prices, settings, usage, iterations=2)
    assert again.total == running.total and again.calls == 4
    # Passes recorded before call traces: unknown, until calls are counted (as run_cost reads).
    old = RunningCost.of_run(prices, settings, [], iterations=2)
    assert old.total is None
    old.add(usage[0])
    assert old.total == run_cost(prices, settings, usage[:1], iterations=2).total is not None


def test_offline_runs_cost_nothing_and_a_run_without_calls_is_zero_or_unknown(
        store: Store) -> None:
    run = session.start(store, RunSettings(prompt="p", rubric=RUBRIC))  # demo × rules
    for _ in run:
        pass
    [record] = store.list_runs()
    assert run_costs(store, Prices(), [record])[record.run_id].total == 0
    settings = RunSettings(prompt="p", rubric=RUBRIC, worker_model=W, grader_model=G)
    assert run_cost(Prices(), settings, [], iterations=0).total == 0  # never made a pass
    assert run_cost(Prices(), settings, [], iterations=2).total is None  # before call traces


def _experiment(store: Store, server: CachingOpenAI, rows: int) -> str:
    dataset = parse_dataset(
        "id,prompt\n" + "".join(f"r{i},{PROMPT} Row {i}.\n" for i in range(rows)),
        name="rows", fmt="csv")
    config = ExperimentConfig(worker_model=W, grader_model=G, rubric=RUBRIC, max_iterations=1,
                              base_url=server.base_url)
    return create_experiment(store, dataset, [config]).experiment_id


def _spent(store: Store, experiment_id: str) -> Decimal:
    runs = [c.run_id for c in store.cell_outcomes(experiment_id) if c.run_id]
    return by_hand([c for r in runs for c in store.calls(r)])


def test_a_retried_cells_earlier_runs_still_count_in_the_experiments_cost(
        store: Store, server: CachingOpenAI) -> None:
    from rubric_core.experiments import retry_cell
    from rubric_core.experiments.budget import BudgetGuard

    graders_fail = [True]

    def scripted(body: dict[str, Any]) -> Reply:
        names = [t.get("function", {}).get("name") for t in body.get("tools") or []]
        if "GraderResponse" not in names:
            return text("answer " * 50)
        return error(400, "bad request") if graders_fail[0] else verdict("satisfied")

    server.default = scripted
    exp_id = _experiment(store, server, rows=2)
    experiment = store.get_experiment(exp_id)
    assert experiment is not None
    overrides = (PriceOverride.parse(W_PRICE), PriceOverride.parse(G_PRICE))
    prices = Prices(overrides)
    list(run_experiment(store, exp_id))
    failed = store.cell_outcomes(exp_id)
    assert {c.status for c in failed} == {"grader_error"}
    paid_first = by_hand([c for cell in failed for c in store.calls(cell.run_id or "")])
    assert paid_first > 0  # the worker's answers were paid for; the refused gradings not
    assert experiment_cost(store, prices, experiment).total == paid_first

    graders_fail[0] = False
    retry_cell(store, exp_id, failed[0].key)  # one cell by hand ...
    list(run_experiment(store, exp_id))
    list(run_experiment(store, exp_id, retry_errors=True))  # ... the other by --retry-errors
    now = store.cell_outcomes(exp_id)
    assert {c.status for c in now} == {"satisfied"}
    assert not {c.run_id for c in now} & {c.run_id for c in failed}
    every_call = [c for r in store.list_runs() for c in store.calls(r.run_id)]
    assert len(store.list_runs()) == 4
    cost = experiment_cost(store, prices, experiment)
    # Every run the experiment paid for: the two it retried, and the two that replaced them.
    assert cost.total == by_hand(every_call) == paid_first + _spent(store, exp_id)
    assert set(cost.earlier) == {c.run_id for c in failed}
    [config] = cost.configs
    assert config.earlier_runs == 2 and config.cells == 2 and config.rows == 2
    assert config.per_100_rows == cost.total * 100 / 2
    # The per-cell estimate is the cells' current runs'; what was spent is everything.
    assert config.mean_ended_cell == _spent(store, exp_id) / 2
    assert estimate_experiment(store, experiment, prices).spent == cost.total
    assert BudgetGuard(store, experiment, Budget(Decimal(100), overrides)).spent == cost.total


def test_a_budget_stops_before_a_cell_would_spend_past_it_and_resume_keeps_it(
        store: Store, server: CachingOpenAI) -> None:
    exp_id = _experiment(store, server, rows=20)
    experiment = store.get_experiment(exp_id)
    assert experiment is not None
    overrides = (PriceOverride.parse(W_PRICE), PriceOverride.parse(G_PRICE))
    # No known price: the budget cannot be enforced, and nothing runs.
    with pytest.raises(BudgetError, match="no known price for openai-compatible:w"):
        list(run_experiment(store, exp_id, budget=Budget(Decimal(5))))
    assert all(c.run_id is None for c in store.cell_outcomes(exp_id))

    first = first_estimate(experiment.configurations[0], Prices(overrides))
    assert first is not None
    limit = first + Decimal("0.5")  # the first estimate lets one cell in; the mean, a few more
    estimate = estimate_experiment(store, experiment, Prices(overrides))
    assert estimate.cells == 20 and estimate.cost == 20 * first
    models = model_resolver(api_key="test-key")
    events = list(run_experiment(store, exp_id, concurrency=1, models=models,
                                 budget=Budget(limit, overrides)))
    finished = events[-1]
    assert finished["type"] == "experiment_finished" and finished["status"] == "stopped"
    assert finished.get("budget_reached") is True
    cells = store.cell_outcomes(exp_id)
    ran = [c for c in cells if c.run_id is not None]
    assert 1 < len(ran) < 20  # stopped part way, by the budget
    assert {c.status for c in ran} == {"satisfied"}  # nothing failed or half run
    spent = _spent(store, exp_id)
    assert spent <= limit  # within the budget (+ one cell's estimate at most)
    costs = experiment_cost(store, Prices(overrides), experiment)
    assert costs.total == spent == Decimal(finished["spent_usd"])
    mean = costs.configs[0].mean_ended_cell
    assert mean is not None and spent + mean > limit  # the next cell would have passed it
    # The budget is kept: a Resume without one continues under it, and stops at once.
    kept = store.get_experiment(exp_id)
    assert kept is not None and kept.budget is not None
    assert Decimal(kept.budget["max_usd"]) == limit
    again = list(run_experiment(store, exp_id, concurrency=1, models=models))
    assert again[-1].get("budget_reached") is True
    assert len([c for c in store.cell_outcomes(exp_id) if c.run_id]) == len(ran)
    # A new budget at Resume runs the rest.
    done = list(run_experiment(store, exp_id, concurrency=1, models=models,
                               budget=Budget(Decimal(100), overrides)))
    assert done[-1]["status"] == "finished" and done[-1].get("budget_reached") is False
    assert {c.status for c in store.cell_outcomes(exp_id)} == {"satisfied"}


# --------------------------------------------------------------------------- command line


def test_cli_run_prices_cached_tokens_with_price_and_says_unknown_without(
        server: CachingOpenAI, tmp_path: Path) -> None:
    grader = [verdict("needs_revision", ("c2",)), verdict("satisfied")]

    def scripted(body: dict[str, Any]) -> Reply:
        names = [t.get("function", {}).get("name") for t in body.get("tools") or []]
        return grader.pop(0) if "GraderResponse" in names else text("draft")

    server.default = scripted
    db, out = tmp_path / "runs.sqlite3", tmp_path / "run.csv"
    base = ("run", "--model", W, "--grader", G, "--base-url", server.base_url, "--prompt",
            PROMPT, "--rubric", RUBRIC, "--db", str(db))
    proc = _cli(*base, "--price", W_PRICE, "--price", G_PRICE, "--csv", str(out))
    assert proc.returncode == 0, proc.stderr
    with Store(db) as store:
        [record] = store.list_runs()
        calls = store.calls(record.run_id)
    assert calls[3]["cached_input_tokens"] > 0
    total = by_hand(calls)
    worker = by_hand([c for c in calls if c["role"] == "worker"])
    from rubric_core.prices import format_dollars

    assert (f"cost: {format_dollars(total)} (worker {format_dollars(worker)}, grader "
            f"{format_dollars(total - worker)};") in proc.stdout
    assert f"per pass: 1 {format_dollars(by_hand(calls[:2]))}, 2 " in proc.stdout
    rows = list(csv.DictReader(out.open(encoding="utf-8")))
    assert list(rows[0])[-2:] == ["pass_cost_usd", "criterion_cost_usd"]
    assert sum(Decimal(r["pass_cost_usd"]) for r in rows if r["pass_cost_usd"]) == total
    assert Decimal(rows[0]["criterion_cost_usd"]) == by_hand([calls[1]]) / 2

    # The same run without prices: unknown, never $0.
    grader[:] = [verdict("satisfied")]
    plain = _cli(*base)
    assert plain.returncode == 0, plain.stderr
    assert "cost: unknown (worker unknown, grader unknown;" in plain.stdout
    assert "$0" not in plain.stdout


@pytest.mark.parametrize("value", [
    pytest.param("gpt-4.1=1,2", id="two_prices"),
    pytest.param("gpt-4.1=1,-2,3", id="negative"),
    pytest.param("=1,2,3", id="no_model"),
])
def test_cli_run_refuses_a_bad_price_before_any_call(value: str) -> None:
    proc = _cli("run", "--example", "haiku", "--no-db", "--price", value)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("error: --price: price") and "Traceback" not in proc.stderr
    assert "MODEL=IN,CACHED,OUT" in proc.stderr or "dollars per million" in proc.stderr
    assert "grading pass" not in proc.stdout  # refused before the run


def test_cli_eval_and_regrade_refuse_a_bad_price(tmp_path: Path) -> None:
    for command in (("eval", "--dataset", "bundled", "--db", str(tmp_path / "e.sqlite3")),
                    ("regrade", "--answers", "bundled", "--db", str(tmp_path / "l.sqlite3"))):
        proc = _cli(*command, "--price", "gpt-4.1=1,2")
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        assert "--price: price 'gpt-4.1=1,2' is not MODEL=IN,CACHED,OUT" in proc.stderr


def test_cli_eval_budget_stops_resumes_and_exports_costs(server: CachingOpenAI,
                                                         tmp_path: Path) -> None:
    rows = tmp_path / "rows.csv"
    rows.write_text("id,prompt\n" + "".join(f"r{i},{PROMPT} Row {i}.\n" for i in range(20)),
                    encoding="utf-8")
    db = tmp_path / "runs.sqlite3"
    config = f"worker={W},grader={G},cap=1,base_url={server.base_url}"
    base = ("eval", "--dataset", str(rows), "--rubric", RUBRIC, "--db", str(db), "--config",
            config, "--concurrency", "1")
    refused = _cli(*base, "--max-cost", "5")
    assert refused.returncode == 2
    assert "no known price for openai-compatible:w" in refused.stderr
    assert "--price" in refused.stderr
    assert _cli(*base, "--max-cost", "nothing").returncode == 2

    config_obj = ExperimentConfig(worker_model=W, grader_model=G, max_iterations=1)
    prices = Prices([PriceOverride.parse(W_PRICE), PriceOverride.parse(G_PRICE)])
    first = first_estimate(config_obj, prices)
    assert first is not None
    limit = first + Decimal("0.5")
    proc = _cli(*base, "--price", W_PRICE, "--price", G_PRICE, "--max-cost", str(limit))
    assert proc.returncode == 1, proc.stdout + proc.stderr  # not every cell ended
    from rubric_core.prices import format_dollars

    assert f"estimate: about {format_dollars(20 * first)} for 20 cells" in proc.stdout
    assert "budget reached:" in proc.stdout
    with Store(db) as store:
        [experiment] = store.list_experiments()
        cells = store.cell_outcomes(experiment.experiment_id)
        spent = _spent(store, experiment.experiment_id)
    ran = [c for c in cells if c.run_id]
    assert 1 < len(ran) < 20 and {c.status for c in ran} == {"satisfied"}
    assert spent <= limit
    assert sum(c["cached_input_tokens"] for c in _all_calls(db)) > 0

    summary = tmp_path / "summary.csv"
    export = tmp_path / "cells.json"
    resumed = _cli("eval", "--resume", experiment.experiment_id, "--db", str(db),
                   "--price", W_PRICE, "--price", G_PRICE, "--max-cost", "100",
                   "--summary-csv", str(summary), "--csv", str(tmp_path / "cells.csv"))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    with Store(db) as store:
        total = _spent(store, experiment.experiment_id)
    [row] = list(csv.DictReader(summary.open(encoding="utf-8")))
    assert list(row)[-2:] == ["cost_usd", "cost_per_100_rows_usd"]
    assert Decimal(row["cost_usd"]) == total
    assert Decimal(row["cost_per_100_rows_usd"]) == total * 100 / 20
    assert f"cost: {format_dollars(total)}" in resumed.stdout
    cells_csv = list(csv.DictReader((tmp_path / "cells.csv").open(encoding="utf-8")))
    assert sum(Decimal(r["pass_cost_usd"]) for r in cells_csv if r["pass_cost_usd"]) == total
    del export


def _all_calls(db: Path) -> list[dict[str, Any]]:
    with Store(db) as store:
        return [c for r in store.list_runs() for c in store.calls(r.run_id)]


def test_a_json_export_writes_dollars_as_numbers() -> None:
    from io import StringIO

    from rubric_core.export import EXPORT_COLUMNS, write_json

    out = StringIO()
    row = [None] * len(EXPORT_COLUMNS)
    row[-2] = Decimal("0.0125")
    write_json([row], out)
    assert json.loads(out.getvalue())[0]["pass_cost_usd"] == 0.0125


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("1,000.50", "1000.50", id="thousands_in_groups_of_three"),
    pytest.param("$2.50", "2.50", id="a_dollar_sign"),
])
def test_a_budget_reads_dollars(text: str, expected: str) -> None:
    from decimal import Decimal

    from rubric_core.experiments.budget import Budget

    assert Budget.parse(text).max_usd == Decimal(expected)


@pytest.mark.parametrize("text", ["5,00", "12,34,567", "1,0000"])
def test_an_ambiguous_comma_in_a_budget_is_refused_not_read_as_hundreds(text: str) -> None:
    # Attack: --max-cost 5,00 (five dollars in much of the world) ran with a $500 budget.
    from rubric_core.experiments.budget import Budget, BudgetError

    with pytest.raises(BudgetError, match="write cents after a point"):
        Budget.parse(text)


# --------------------------------------------------------------------------- the lab


def _lab_by_hand(results: list[Any]) -> Decimal:
    fresh, cached, output = PER_M["grader"]
    return sum((((r.input_tokens - (r.cached_input_tokens or 0)) * fresh
                 + (r.cached_input_tokens or 0) * cached + r.output_tokens * output) / 10**6
                for r in results), Decimal(0))


def test_a_regrade_records_cached_tokens_and_prices_them_at_the_cached_price(
        store: Store) -> None:
    from rubric_core.cli.lab import regrade_cost_line
    from rubric_core.costs import regrade_cost
    from rubric_core.lab import (
        REGRADE_COLUMNS,
        GraderConfig,
        create_regrade,
        parse_answers,
        regrade_rows,
        run_regrade,
    )
    from rubric_core.prices import format_dollars

    answers = parse_answers("id,request,answer\n" + "".join(
        f"q{i},{PROMPT},reply {i}\n" for i in range(4)), name="qa")
    with CachingOpenAI(default=verdict("satisfied")) as server:
        job = create_regrade(store, answers, [GraderConfig(
            rubric=RUBRIC, grader_model=G, base_url=server.base_url)])
        events = list(run_regrade(store, job.job_id, concurrency=1))
    assert events[-1]["type"] == "regrade_finished" and events[-1]["status"] == "finished"
    results = store.regrade_results(job.job_id)
    # What the server reported as read from its cache is what each grading recorded.
    assert sorted(r.cached_input_tokens or 0 for r in results) == sorted(server.cached)
    cached = sum(server.cached)
    assert cached > 0 and all(r.cached_input_tokens is not None for r in results)

    prices = Prices([PriceOverride.parse(G_PRICE)])
    [cost] = regrade_cost(store, prices, job)
    assert cost.cost == _lab_by_hand(results)
    assert cost.cached_input_tokens == cached and cost.uncached_gradings == 0
    assert cost.input_tokens == sum(r.input_tokens or 0 for r in results)
    assert cost.output_tokens == sum(r.output_tokens or 0 for r in results)
    uncached = prices.cost(G, Usage(cost.input_tokens, 0, 0, cost.output_tokens))
    assert uncached is not None and cost.cost is not None and cost.cost < uncached
    assert regrade_cost(store, Prices(), job)[0].cost is None  # unknown, never $0
    line = regrade_cost_line([cost])
    assert line.startswith(f"cost: [0] {format_dollars(cost.cost)} ({cost.input_tokens:,} "
                           f"tokens in, {cached:,} cached, {cost.output_tokens:,} out)")
    assert "priced as uncached" not in line
    # The export appends the column; each row of a grading carries its cached tokens.
    assert REGRADE_COLUMNS[-1] == "cached_input_tokens"
    by_item = {r.item_id: r.cached_input_tokens for r in results}
    rows = list(regrade_rows(store, job.job_id))
    item = REGRADE_COLUMNS.index("item_id")
    assert rows and all(row[-1] == by_item[row[item]] for row in rows)


def test_a_schema_11_regrade_is_upgraded_in_place_its_old_gradings_priced_as_uncached(
        db_location: str | Path) -> None:
    from pg_support import scalar
    from test_store import _execute

    from rubric_core.cli.lab import regrade_cost_line
    from rubric_core.costs import regrade_cost
    from rubric_core.lab import GraderConfig, create_regrade, parse_answers
    from rubric_core.store import SCHEMA_VERSION, RegradeResult

    answers = parse_answers("id,request,answer\nq0,r,a\nq1,r,a\n", name="qa")
    graded = RegradeResult(0, "q0", 0, "satisfied", "ok", [{"name": "c1", "passed": True}], [],
                           None, 1000, 100, 0.1, 600)
    with Store(db_location) as store:
        job = create_regrade(store, answers, [GraderConfig(rubric=RUBRIC, grader_model=G)])
        store.record_regrade_result(job.job_id, graded)
    _execute(db_location, "ALTER TABLE regrade_results DROP COLUMN cached_input_tokens",
             "DROP TABLE retired_cell_threads",
             "UPDATE meta SET value = '11' WHERE key = 'schema_version'")
    with Store(db_location) as store:
        [old] = store.regrade_results(job.job_id)
        assert old.cached_input_tokens is None and old.input_tokens == 1000  # kept, upgraded
        store.record_regrade_result(job.job_id, graded._replace(item_id="q1"))
        [cost] = regrade_cost(store, Prices([PriceOverride.parse(G_PRICE)]), job)
    assert scalar(db_location, "SELECT value FROM meta WHERE key = 'schema_version'") == str(
        SCHEMA_VERSION)
    assert scalar(db_location, "SELECT COUNT(*) FROM retired_cell_threads") == 0  # created
    fresh, cached, output = PER_M["grader"]
    assert cost.cost == ((1000 * fresh + 100 * output)                     # as uncached
                         + (400 * fresh + 600 * cached + 100 * output)) / 10**6
    assert cost.uncached_gradings == 1 and cost.cached_input_tokens == 600
    assert ("1 grading(s) recorded before cached tokens were kept are priced as uncached"
            in regrade_cost_line([cost]))
