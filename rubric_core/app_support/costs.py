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
    cost_difference,
    experiment_cost,
    run_costs,
)
from rubric_core.prices import PriceError, PriceOverride, Prices, Usage, format_dollars

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from rubric_core.experiments import Budget, ExperimentResults
    from rubric_core.settings import ExperimentConfig
    from rubric_core.store import ExperimentRecord, RunRecord, Store

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
    "budget_amount",
    "budget_view",
    "compare_sentence",
    "cost_caption",
    "experiment_costs",
    "pass_costs_frame",
    "price_caption",
    "run_cost_of",
    "run_list_costs",
    "session_prices",
    "shown_summary",
]
