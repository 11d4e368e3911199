"""What the pages show of costs: the session's prices, a run's cost, an experiment's.

The person's prices are typed in the sidebar's *Cost* expander, one ``MODEL=IN,CACHED,OUT`` a
line (dollars per million tokens), and kept in the browser session only (not a secret, not
stored). Every cost is computed when drawn, from the recorded calls' tokens
(`rubric_core.costs`), so a price typed now applies to past runs too. An unknown price shows
"unknown", never $0.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pandas as pd

from rubric_core.costs import (
    ExperimentCost,
    RunCost,
    RunningCost,
    cost_difference,
    experiment_cost,
    regrade_cost,
    run_costs,
    usage_of,
)
from rubric_core.prices import PriceError, PriceOverride, Prices, Usage, format_dollars

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from rubric_core.experiments import Budget, ExperimentResults
    from rubric_core.settings import ExperimentConfig, RunSettings
    from rubric_core.store import ExperimentRecord, RegradeJob, RunRecord, Store
    from rubric_core.types import ModelCallRecord

PRICES_KEY = "price_overrides"
"""Session-state key of the sidebar's price text."""

PRICES_HELP = ("One model a line: MODEL=IN,CACHED,OUT in US dollars per million input, "
               "cached input and output tokens (e.g. openai-compatible:llama3.1=0.2,0.1,0.6). "
               "Wins over the bundled price table, for every run shown (costs are computed from "
               "recorded tokens). Kept in this browser session only.")
"""The price box's help text."""

_MILLION = 1_000_000


@dataclasses.dataclass(frozen=True)
class SessionPrices:
    """The prices the session's pages use, and the lines that could not be read."""

    prices: Prices
    """The bundled table with the lines that could be read."""
    problems: tuple[str, ...] = ()
    """One message per line that could not be read (it is ignored)."""


def session_prices(state: Mapping[str, Any]) -> SessionPrices:
    """The prices typed in the sidebar (`PRICES_KEY`), each bad line named and ignored."""
    overrides: list[PriceOverride] = []
    problems: list[str] = []
    for number, line in enumerate(str(state.get(PRICES_KEY) or "").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            overrides.append(PriceOverride.parse(line.strip()))
        except PriceError as exc:
            problems.append(f"line {number}: {exc}")
    return SessionPrices(Prices(overrides), tuple(problems))


def price_caption(prices: Prices, model: str) -> str:
    """``model: $0.40 in · $0.10 cached · $1.60 out per million tokens``, or says unknown."""
    per_m = [prices.cost(model, Usage(*u)) for u in (
        (_MILLION, 0, 0, 0), (_MILLION, _MILLION, 0, 0), (0, 0, 0, _MILLION))]
    if any(p is None for p in per_m):
        return f"`{model}`: price unknown (costs show \"unknown\"): set it below"
    fresh, cached, out = (format_dollars(p) for p in per_m)
    return f"`{model}`: {fresh} in · {cached} cached · {out} out per million tokens"


def run_cost_of(store: Store, prices: Prices, record: RunRecord) -> RunCost:
    """One run's cost (one lean read of its calls)."""
    return run_costs(store, prices, [record])[record.run_id]


def cost_caption(cost: RunCost) -> str:
    """The run's cost with its worker and grader shares, as one caption."""
    return (f"Cost: {format_dollars(cost.total)} (worker {format_dollars(cost.worker)} · "
            f"grader {format_dollars(cost.grader)}), priced from the recorded tokens at the "
            "session's prices.")


def running_cost(store: Store, prices: Prices, run_id: str, settings: RunSettings
                 ) -> RunningCost:
    """A run's cost so far, for the Run page to add each call to as it ends.

    A resumed run starts from what it recorded before (one lean read of its calls), so the
    figure at the end is the run's whole cost, as the result below it shows.
    """
    record = store.get_run(run_id)
    earlier = store.call_usage_for_runs([run_id])[run_id]
    return RunningCost.of_run(prices, settings, earlier,
                              iterations=record.iterations if record is not None else 0)


def add_call(running: RunningCost, run_id: str, call: ModelCallRecord) -> None:
    """Count a ``call_finished`` event's call (`rubric_core.runner.CallFinished`)."""
    running.add(usage_of(run_id, [call])[0])


def live_cost_caption(running: RunningCost, *, ended: bool = False) -> str:
    """The Run page's running cost: dollars with worker and grader shares, and the tokens.

    "unknown" (never $0) for a model without a known price, with where to give one. Headed
    "Cost so far" while the run goes on, "Cost" once it ``ended``.
    """
    head = "Cost" if ended else "Cost so far"
    if not running.calls:
        return f"{head}: no model call has ended yet."
    text = (f"{head}: {format_dollars(running.total)} (worker "
            f"{format_dollars(running.worker)} · grader {format_dollars(running.grader)}) · "
            f"{running.calls:,} model call{'s' if running.calls != 1 else ''}")
    if running.input_tokens is None and running.output_tokens is None:
        text += ", no token usage reported"
    else:
        text += (f": {running.input_tokens or 0:,} tokens in ({running.cached_input_tokens or 0:,}"
                 f" read from the provider's prompt cache), {running.output_tokens or 0:,} out")
    if running.total is None:
        text += ". A model's price is unknown: set it in the sidebar's Cost."
    return text + "."


def pass_costs_frame(cost: RunCost) -> pd.DataFrame:
    """Per pass (``pass #``, counted from 1): worker, grader and total dollars as text."""
    return pd.DataFrame(
        [{"pass #": p.iteration + 1, "worker": format_dollars(p.worker),
          "grader": format_dollars(p.grader), "total": format_dollars(p.total)}
         for p in cost.passes], columns=["pass #", "worker", "grader", "total"])


def run_list_costs(store: Store, prices: Prices, records: Sequence[RunRecord]) -> list[str]:
    """The cost column of a page of the run list (one lean read for the page)."""
    costs = run_costs(store, prices, records)
    return [format_dollars(costs[r.run_id].total) for r in records]


def experiment_costs(store: Store, prices: Prices, experiment: ExperimentRecord
                     ) -> ExperimentCost:
    """An experiment's costs per configuration (two lean reads)."""
    return experiment_cost(store, prices, experiment)


def shown_summary(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary table as drawn: dollars as text, "unknown" where a price is unknown."""
    shown = summary.copy()
    for column in ("cost_usd", "cost_per_100_rows_usd"):
        if column in shown:
            shown[column] = [format_dollars(v) for v in summary[column]]
    return shown


def compare_sentence(results: ExperimentResults, costs: ExperimentCost, a: int, b: int) -> str:
    """"B passes 4 more rows and costs $0.31 more per 100 rows" (signs and unknowns said)."""
    configs = results.experiment.configurations
    name_a, name_b = configs[a].display_label(), configs[b].display_label()
    passed_a = sum(results.outcomes(a).values())
    passed_b = sum(results.outcomes(b).values())
    diff = passed_b - passed_a
    rows = (f"passes {abs(diff)} {'more' if diff > 0 else 'fewer'} row"
            f"{'s' if abs(diff) != 1 else ''}" if diff else "passes as many rows")
    money = cost_difference(costs.configs[a], costs.configs[b])
    if money is None:
        spend = "its cost per 100 rows against it is unknown (a price is unknown)"
    elif money == 0:
        spend = "costs the same per 100 rows"
    else:
        spend = (f"costs {format_dollars(abs(money))} {'more' if money > 0 else 'less'} "
                 "per 100 rows")
    return f"{name_b} {rows} than {name_a} and {spend}."


def budget_amount(value: object) -> Decimal | None:
    """The Experiments page's budget field (0 or empty: no budget)."""
    if value in (None, "") or not isinstance(value, (int, float, str, Decimal)):
        return None
    amount = Decimal(str(value))
    return amount if amount > 0 else None


@dataclasses.dataclass(frozen=True)
class BudgetView:
    """What the page says about a budget before Start or Resume."""

    estimate: str
    """``Estimate: about $X for N cells``."""
    budget: Budget | None
    """The budget to run under (None: none, or the one kept with the experiment)."""
    problem: str | None = None
    """Why Start must wait (a model of unknown price under a budget), or None."""


def budget_view(prices: Prices, amount: object, allow_unknown: bool, *,
                configs: Sequence[ExperimentConfig], rows: int = 0, repeats: int = 1,
                store: Store | None = None, experiment: ExperimentRecord | None = None
                ) -> BudgetView:
    """The estimate shown before Start (or Resume), and the budget to run under.

    For a new experiment: ``configs`` × ``rows`` × ``repeats``; with ``store`` and
    ``experiment``: the cells it has left.

    Args:
        prices: The session's prices.
        amount: The budget field (0 or empty: no budget).
        allow_unknown: The "allow unknown prices" box.
        configs: The configurations.
        rows: The dataset's rows (a new experiment).
        repeats: Its repeats (a new experiment).
        store: The database (an existing experiment).
        experiment: The experiment to resume.

    """
    from rubric_core.experiments.budget import (
        Budget,
        BudgetError,
        check_budget,
        estimate_experiment,
        estimate_new,
    )

    if store is not None and experiment is not None:
        estimate = estimate_experiment(store, experiment, prices)
    else:
        estimate = estimate_new(configs, rows, repeats, prices)
    text = f"Estimate: {estimate.text()}"
    if estimate.cost is None:
        text += " (a model's price is unknown: set it in the sidebar's Cost)"
    value = budget_amount(amount)
    if value is None:
        return BudgetView(text, None)
    try:
        budget = Budget(value, tuple(prices.overrides.values()), allow_unknown)
        check_budget(configs, budget)
    except BudgetError as exc:
        return BudgetView(text, None, str(exc).replace("--price ", "the sidebar's Cost: "))
    return BudgetView(f"{text}; budget {format_dollars(value)}", budget)


__all__ = [
    "PRICES_HELP",
    "PRICES_KEY",
    "BudgetView",
    "SessionPrices",
    "add_call",
    "budget_amount",
    "budget_view",
    "compare_sentence",
    "cost_caption",
    "experiment_costs",
    "live_cost_caption",
    "pass_costs_frame",
    "price_caption",
    "run_cost_of",
    "run_list_costs",
    "running_cost",
    "session_prices",
    "shown_summary",
]


def regrade_cost_frame(store: Store, prices: Prices, job: RegradeJob) -> pd.DataFrame:
    """Per configuration of a re-grade: its gradings' cost and tokens (the Rubric lab page).

    Cached input is priced at the cached price; gradings recorded before cached tokens were
    kept are priced as uncached (at most what they cost) and counted in a column of their own.
    A model without a known price costs "unknown", never $0.
    """
    costs = regrade_cost(store, prices, job)
    return pd.DataFrame(
        [{"configuration": f"{i + 1}. {config.display_label()}",
          "cost": format_dollars(cost.cost),
          "tokens in": cost.input_tokens, "cached in": cost.cached_input_tokens,
          "tokens out": cost.output_tokens, "priced as uncached": cost.uncached_gradings}
         for i, (config, cost) in enumerate(zip(job.configurations, costs, strict=True))],
        columns=["configuration", "cost", "tokens in", "cached in", "tokens out",
                 "priced as uncached"],
    ).astype({"tokens in": "Int64", "cached in": "Int64", "tokens out": "Int64"})
