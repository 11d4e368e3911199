"""An experiment's budget: stop before starting a cell that would spend past it.

`Budget` is a dollar limit with the price overrides it is checked with. Before a cell starts,
on whichever process dequeued it, `admit_cell` (through `rubric_core.engine.holds`) admits it only
when what the experiment has spent (the recorded calls of its cells' runs and of the runs their
retries replaced, priced now: `rubric_core.costs`, read by `BudgetGuard`), plus the estimates
of the cells in flight on every process, plus this cell's estimate, stays within the limit.
Otherwise no further cell starts, the cells in flight finish, and the experiment ends
``stopped`` (as Stop leaves it: resumable, its cells not failed); a Resume continues under the
same budget (kept with the experiment) or a new one.

The estimate of a cell is the mean cost of the cells of its configuration that ended; before
any ended, a conservative guess: the configuration's cap of passes, each one worker call and
``grader_repeats`` grader calls of a typical size (`TYPICAL_WORKER_CALL`,
`TYPICAL_GRADER_CALL`, nothing cached), at its models' prices. So what an experiment spends
stays within the budget plus the amount by which the cells in flight overrun their estimates
(at concurrency 1: one cell's overrun).

A budget needs prices: a configuration whose worker or grader has no known price (a local
server, a model the price table does not list) is refused with what to do (give its price,
``--price MODEL=IN,CACHED,OUT``), unless the person allows unknown prices; then the calls of
unknown price count $0 toward the budget, and the budget holds only for the priced ones.
"""

from __future__ import annotations

import dataclasses
import re
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from rubric_core.costs import experiment_cost
from rubric_core.prices import PriceOverride, Prices, Usage, format_dollars

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from rubric_core.settings import ExperimentConfig
    from rubric_core.store import ExperimentRecord, Store

TYPICAL_WORKER_CALL = Usage(input_tokens=2_000, cached_input_tokens=0, cache_creation_tokens=0,
                            output_tokens=1_000)
"""A worker call as the first estimate counts it: a prompt and a revision request in, an
answer out (larger than most of the bundled examples' calls)."""

TYPICAL_GRADER_CALL = Usage(input_tokens=4_000, cached_input_tokens=0, cache_creation_tokens=0,
                            output_tokens=500)
"""A grader call as the first estimate counts it: instructions, criteria, request and answer
in, a verdict per criterion out; nothing read from a prompt cache."""

_MAX_BUDGET = Decimal(1_000_000)


_THOUSANDS = re.compile(r"\d{1,3}(,\d{3})+(\.\d+)?")


class BudgetError(ValueError):
    """A budget that cannot be kept (unknown prices) or read, with what to do."""


@dataclasses.dataclass(frozen=True)
class Budget:
    """At most ``max_usd`` US dollars for an experiment, priced with ``overrides``."""

    max_usd: Decimal
    """The limit, in US dollars."""
    overrides: tuple[PriceOverride, ...] = ()
    """The person's prices, which win over the price table."""
    allow_unknown: bool = False
    """Run even when a model's price is unknown (its calls then count $0 toward the limit)."""

    def __post_init__(self) -> None:
        if not self.max_usd.is_finite() or not 0 < self.max_usd <= _MAX_BUDGET:
            msg = (f"a budget must be more than $0 and at most ${_MAX_BUDGET:,}, "
                   f"got {self.max_usd}")
            raise BudgetError(msg)

    @classmethod
    def parse(cls, text: str, overrides: Iterable[PriceOverride] = (), *,
              allow_unknown: bool = False) -> Budget:
        """``--max-cost USD`` (``2.50``, ``$2.50``).

        Raises:
            BudgetError: Not a number of dollars above 0.

        """
        number = str(text).strip().removeprefix("$")
        if "," in number and not _THOUSANDS.fullmatch(number):
            # "5,00" is five dollars to some and five hundred to others: say which it is.
            msg = (f"--max-cost {text!r}: write cents after a point (5.00) and thousands with "
                   "commas only in groups of three (1,000.00), or no commas at all")
            raise BudgetError(msg)
        try:
            value = Decimal(number.replace(",", ""))
        except InvalidOperation:
            value = Decimal("NaN")
        if not value.is_finite():
            msg = f"--max-cost {text!r} is not a number of US dollars (e.g. 2.50)"
            raise BudgetError(msg)
        return cls(value, tuple(overrides), allow_unknown)

    @property
    def prices(self) -> Prices:
        """The prices the budget is checked with."""
        return Prices(self.overrides)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form kept with the experiment (`Store.set_experiment_budget`)."""
        return {"max_usd": str(self.max_usd), "allow_unknown": self.allow_unknown,
                "prices": [_override_text(o) for o in self.overrides]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Budget:
        """Read `to_dict`'s form back."""
        return cls(Decimal(str(data["max_usd"])),
                   tuple(PriceOverride.parse(p) for p in data.get("prices") or ()),
                   bool(data.get("allow_unknown")))

    def with_overrides(self, overrides: Iterable[PriceOverride]) -> Budget:
        """This budget with more overrides (a later one for a model wins)."""
        return dataclasses.replace(self, overrides=(*self.overrides, *overrides))


def _override_text(o: PriceOverride) -> str:
    return f"{o.model}={o.input_per_m},{o.cached_per_m},{o.output_per_m}"


def first_estimate(config: ExperimentConfig, prices: Prices) -> Decimal | None:
    """The conservative estimate of one cell before any of its configuration's ended.

    ``max_iterations`` passes of one `TYPICAL_WORKER_CALL` and ``grader_repeats``
    `TYPICAL_GRADER_CALL` s, at today's prices; None when either model's price is unknown.
    """
    worker = prices.cost(config.worker_model, TYPICAL_WORKER_CALL)
    grader = prices.cost(config.grader_model, TYPICAL_GRADER_CALL)
    if worker is None or grader is None:
        return None
    return config.max_iterations * (worker + config.grader_repeats * grader)


def unknown_models(configs: Iterable[ExperimentConfig], prices: Prices) -> list[str]:
    """The worker and grader models of ``configs`` with no known price, each once, in order."""
    out: list[str] = []
    for config in configs:
        for model in (config.worker_model, config.grader_model):
            if not prices.known(model) and model not in out:
                out.append(model)
    return out


def check_budget(configs: Iterable[ExperimentConfig], budget: Budget) -> None:
    """Refuse a budget that cannot be enforced for these configurations (before anything runs).

    Raises:
        BudgetError: A model's price is unknown and unknown prices are not allowed; the
            message names the models and says how to give their prices.

    """
    unknown = unknown_models(configs, budget.prices)
    if unknown and not budget.allow_unknown:
        shown = ", ".join(unknown)
        msg = (f"the budget cannot be enforced: no known price for {shown}. Give each its price "
               f"(--price {unknown[0]}=IN,CACHED,OUT in dollars per million tokens, or the "
               "app's Cost prices), or allow unknown prices (their calls then count $0)")
        raise BudgetError(msg)


@dataclasses.dataclass(frozen=True)
class Estimate:
    """What the cells left to run are expected to cost (shown before Start)."""

    cells: int
    """Cells left to run."""
    cost: Decimal | None
    """Their expected cost (None when a price is unknown)."""
    spent: Decimal | None
    """What the experiment's cells already spent (None when unknown)."""

    def text(self) -> str:
        """``about $1.20 for 24 cells`` (``$0.30 spent so far`` when anything was)."""
        spent = (f" ({format_dollars(self.spent)} spent so far)"
                 if self.spent is None or self.spent > 0 else "")
        return f"about {format_dollars(self.cost)} for {self.cells} cells{spent}"


class BudgetGuard:
    """What an experiment spent, read once, and each configuration's estimate per cell.

    One query over the experiment's calls. Built per admission (`admit_cell`), and by
    `run_experiment` first, so that a budget with
    models of unknown price is refused before anything is queued.
    """

    def __init__(self, store: Store, experiment: ExperimentRecord, budget: Budget) -> None:
        check_budget(experiment.configurations, budget)
        self.experiment, self.budget = experiment, budget
        self.prices = budget.prices
        n = len(experiment.configurations)
        self.ended_cost = [Decimal(0)] * n
        self.ended = [0] * n
        self.reached = False
        """Whether a cell was refused (set by the driver from the engine's outcome)."""
        outcomes = store.cell_outcomes(experiment.experiment_id)
        costs = experiment_cost(store, self.prices, experiment, outcomes=outcomes)
        self.run_spent = {cell.key: costs.runs.get(cell.run_id) or Decimal(0)
                          for cell in outcomes if cell.run_id is not None}
        """What each started cell's current run has spent (in `spent` too). A retry starts on
        a new thread, so a retried cell has no current run until its new one starts."""
        for config in costs.configs:
            self.ended[config.config_index] = config.ended
            self.ended_cost[config.config_index] = config.ended_total or Decimal(0)
        # Every run the experiment paid for: its cells' runs and the runs retries replaced.
        self.spent = sum((cost or Decimal(0) for cost in (*costs.runs.values(),
                                                         *costs.earlier.values())), Decimal(0))
        """What the experiment's calls cost, priced now."""

    def estimate(self, config_index: int) -> Decimal:
        """The expected cost of one more cell of this configuration (see the module doc)."""
        if self.ended[config_index]:
            return self.ended_cost[config_index] / self.ended[config_index]
        config = self.experiment.configurations[config_index]
        return first_estimate(config, self.prices) or Decimal(0)


LOCK_PREFIX = "rubric-budget:"
"""The store lock an experiment's admissions take turns on: this prefix and the experiment id."""


async def admit_cell(store: Store, experiment_id: str, key: tuple[str, int, int],
                     workflow_id: str) -> bool:
    """Whether a cell may start now under its experiment's budget, over every process.

    Always True without a budget. It fits when what was spent plus what the cells in flight
    hold plus its own estimate stays within the budget (`rubric_core.engine.holds.admit`). A
    cell in flight holds its estimate less what its run has spent so far (that is in what was
    spent already), never less than nothing.
    """
    from rubric_core.engine.holds import admit
    from rubric_core.engine.queues import cell_key_of, id_prefix

    experiment = await store.acall(store.get_experiment, experiment_id)
    if experiment is None or experiment.budget is None:
        return True
    budget = Budget.from_dict(experiment.budget)
    # The checkpoint tables exist before the lock is taken: their first creation on PostgreSQL
    # (CREATE INDEX CONCURRENTLY) waits for every open transaction, ours included.
    await store.acall(store.saver)

    def fits(holds: Mapping[str, Decimal]) -> Decimal | None:
        try:
            guard = BudgetGuard(store, experiment, budget)
        except BudgetError:  # a price gone unknown since the experiment started: start nothing
            return None
        held = Decimal(0)
        for workflow, hold in holds.items():
            cell = cell_key_of(workflow, experiment_id)
            spent = guard.run_spent.get(cell, Decimal(0)) if cell is not None else Decimal(0)
            held += max(hold - spent, Decimal(0))
        estimate = guard.estimate(key[1])
        return estimate if guard.spent + held + estimate <= budget.max_usd else None

    return await admit(store, id_prefix(experiment_id), workflow_id,
                       LOCK_PREFIX + experiment_id, fits)


def estimate_experiment(store: Store, experiment: ExperimentRecord, prices: Prices, *,
                        retry_errors: bool = False) -> Estimate:
    """What the cells left to run would cost, by the budget's estimate (shown before Start)."""
    from rubric_core.experiments.results import needs_run

    costs = experiment_cost(store, prices, experiment)
    left = [0] * len(experiment.configurations)
    for cell in store.cell_outcomes(experiment.experiment_id):
        if needs_run(cell, retry_errors):
            left[cell.config_index] += 1
    parts: list[Decimal | None] = []
    for config, part, n in zip(experiment.configurations, costs.configs, left, strict=True):
        each = part.mean_ended_cell if part.ended else first_estimate(config, prices)
        parts.append(None if each is None else each * n)
    cost = None if any(p is None for p in parts) else sum((p for p in parts if p), Decimal(0))
    return Estimate(sum(left), cost, costs.total)


def estimate_new(configs: Iterable[ExperimentConfig], rows: int, repeats: int,
                 prices: Prices) -> Estimate:
    """What a new experiment would cost by the first estimate (before it is created)."""
    parts = [first_estimate(c, prices) for c in configs]
    cells = len(parts) * rows * repeats
    cost = (None if any(p is None for p in parts)
            else sum((p or Decimal(0) for p in parts), Decimal(0)) * rows * repeats)
    return Estimate(cells, cost, Decimal(0))


__all__ = [
    "LOCK_PREFIX", "TYPICAL_GRADER_CALL", "TYPICAL_WORKER_CALL", "Budget", "BudgetError",
    "BudgetGuard", "Estimate", "admit_cell", "check_budget", "estimate_experiment",
    "estimate_new", "first_estimate", "unknown_models",
]
