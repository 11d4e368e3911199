"""Dollars of recorded work: each call, each pass, each run, each experiment configuration.

Costs are computed when they are read, from the tokens recorded with every model call
(``model_calls``, `rubric_core.store.CallUsage`) and the prices in force (`rubric_core.prices`):
nothing in dollars is stored, so a price set or overridden now applies to past runs too.

Rules, defined once here:

- **Which price.** A call is priced as the model string configured for its role (the run's
  ``worker_model`` or ``grader_model``; an experiment cell's configuration's), not the name
  the provider's reply gives (often a dated snapshot the price table may not list). A run
  resumed with another model keeps only its latest models in its settings, so all of its calls
  are priced at those.
- **Unknown is never 0.** A call whose model has no known price, or whose provider reported no
  usage, is unknown (None); any sum with an unknown part is unknown (`rubric_core.prices.total`),
  shown as "unknown". The offline models (``demo``, ``rules``) cost 0. A call that failed and
  reported no usage costs 0 when its model's price is known (a refused request, a 429, is not
  billed), unknown otherwise.
- **What is counted.** The recorded calls: a pass that a Stop cut short has no recorded calls,
  so its spend is not counted. A run with no recorded calls costs 0 when it made no pass, and
  is unknown when it did (it was recorded before call traces existed).
- **A pass** is the worker call whose answer it judged and its grader calls (repeats, retries,
  corrections); worker and grader shares are kept apart.
- **Per criterion.** A pass's grader cost is split evenly over the rubric's criteria (every
  grader call asks about all of them); the worker's cost is not attributed to criteria.
- **Per 100 rows** (experiments): a configuration's cost over the cells that ran, divided by
  the dataset rows those cells cover, times 100 (with repeats, a row's cost is all its repeats).
- **Every run an experiment paid for.** A configuration's cost is its cells' runs and the
  runs a retry replaced (``--retry-errors``, `rubric_core.experiments.retry_cell`: the cell
  starts a new run on a fresh thread, and the old run was paid for); the estimate per ended
  cell reads the cells' current runs only.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol

from rubric_core.prices import Prices, Usage, total
from rubric_core.rubric import parse_criteria
from rubric_core.types import ENDED_STATUSES
from rubric_core.usage import token_sum

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from rubric_core.settings import RunSettings
    from rubric_core.store import CallUsage, CellOutcome, ExperimentRecord, RegradeJob, Store
    from rubric_core.types import ModelCallRecord

HUNDRED = Decimal(100)


def call_cost(prices: Prices, model: str, call: CallUsage) -> Decimal | None:
    """The dollars of one recorded call of ``model`` (a model string), or None when unknown."""
    usage = Usage(call.input_tokens, call.cached_input_tokens, call.cache_creation_tokens,
                  call.output_tokens)
    at = _when(call.started_at)
    if call.status != "ok" and call.input_tokens is None and call.output_tokens is None:
        return Decimal(0) if prices.known(model) else None
    return prices.cost(model, usage, at=at)


def _when(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(text) if text else None
    except ValueError:
        return None


def _sum(costs: Iterable[Decimal | None]) -> Decimal | None:
    """A sum that is 0 for no parts and unknown when any part is."""
    out = Decimal(0)
    for cost in costs:
        if cost is None:
            return None
        out += cost
    return out


@dataclasses.dataclass(frozen=True)
class PassCost:
    """One grading pass's cost: the worker call it judged and its grader calls."""

    iteration: int
    """0-based pass (the export's ``iteration``)."""
    worker: Decimal | None
    """The worker's calls of the pass (None: unknown)."""
    grader: Decimal | None
    """The grader's calls of the pass (None: unknown)."""

    @property
    def total(self) -> Decimal | None:
        """Worker and grader together (None when either is unknown)."""
        return total([self.worker, self.grader])


@dataclasses.dataclass(frozen=True)
class RunCost:
    """A run's cost, with its worker and grader shares, per pass and per criterion."""

    worker: Decimal | None
    """Every worker call (None: unknown)."""
    grader: Decimal | None
    """Every grader call (None: unknown)."""
    passes: tuple[PassCost, ...]
    """Per pass, in pass order."""
    criteria: dict[str, Decimal | None]
    """Per criterion of the rubric: its even share of each pass's grader cost."""
    calls: tuple[Decimal | None, ...] = ()
    """Per recorded call, in record order."""

    @property
    def total(self) -> Decimal | None:
        """Worker and grader together (None when either is unknown)."""
        return total([self.worker, self.grader])

    def pass_cost(self, iteration: int) -> PassCost | None:
        """The cost of pass ``iteration`` (0-based), or None when it recorded no calls."""
        return next((p for p in self.passes if p.iteration == iteration), None)


UNKNOWN_RUN = RunCost(None, None, (), {})
"""The cost of a run that made passes but recorded no calls (recorded before call traces)."""


def run_cost(prices: Prices, settings: RunSettings, calls: Sequence[CallUsage], *,
             iterations: int = 0) -> RunCost:
    """Price a run's recorded calls (see the module docstring for the rules).

    Args:
        prices: The prices (with the person's overrides).
        settings: The run's settings: its models and rubric.
        calls: The run's calls (`Store.call_usage_for_runs`), in record order.
        iterations: The passes the run recorded (a run with passes and no calls is unknown).

    """
    if not calls:
        return UNKNOWN_RUN if iterations else RunCost(Decimal(0), Decimal(0), (), {})
    models = {"worker": settings.worker_model, "grader": settings.grader_model}
    costs = tuple(call_cost(prices, models.get(c.role, settings.grader_model), c)
                  for c in calls)
    by_pass: dict[int, dict[str, list[Decimal | None]]] = {}
    for call, cost in zip(calls, costs, strict=True):
        role = "worker" if call.role == "worker" else "grader"
        by_pass.setdefault(call.iteration, {"worker": [], "grader": []})[role].append(cost)
    passes = tuple(PassCost(i, _sum(p["worker"]), _sum(p["grader"]))
                   for i, p in sorted(by_pass.items()))
    names = parse_criteria(settings.rubric)
    criteria: dict[str, Decimal | None] = dict.fromkeys(names, Decimal(0))
    for p in passes:
        for name in names:
            share = None if p.grader is None else p.grader / len(names)
            criteria[name] = total([criteria[name], share])
    return RunCost(_sum(p.worker for p in passes), _sum(p.grader for p in passes), passes,
                   criteria, costs)


@dataclasses.dataclass
class RunningCost:
    """A run's cost so far, added to as each model call ends (the Run page's live figure).

    The same rules as `run_cost` (each call priced once, at its role's configured model), kept
    as running sums so a call costs one price lookup however long the run. Its `total` is what
    `run_cost` gives once the run's calls are recorded, except for the calls of a pass a Stop
    cut short: they were spent, so they count here, but are never recorded.
    """

    prices: Prices
    """The prices (with the person's overrides)."""
    worker_model: str
    """The model string a worker call is priced as."""
    grader_model: str
    """The model string a grader call is priced as."""
    worker: Decimal | None = Decimal(0)
    """The worker's calls so far (None: unknown)."""
    grader: Decimal | None = Decimal(0)
    """The grader's calls so far (None: unknown)."""
    calls: int = 0
    """Calls counted."""
    input_tokens: int | None = None
    """Their input tokens, cached ones included (None: none reported)."""
    cached_input_tokens: int | None = None
    """Of those, read from the provider's prompt cache."""
    output_tokens: int | None = None
    """Their output tokens (None: none reported)."""

    @classmethod
    def of_run(cls, prices: Prices, settings: RunSettings, earlier: Iterable[CallUsage] = (),
               *, iterations: int = 0) -> RunningCost:
        """A run's running cost, starting from the calls it recorded before (a resume).

        Args:
            prices: The prices.
            settings: The run's settings (its models as they are now).
            earlier: Its calls already recorded.
            iterations: Its passes already recorded (passes without calls: unknown).

        """
        running = cls(prices, settings.worker_model, settings.grader_model)
        listed = list(earlier)
        if iterations and not listed:  # recorded before call traces: `UNKNOWN_RUN`
            running.worker = running.grader = None
        for call in listed:
            running.add(call)
        return running

    def add(self, call: CallUsage) -> None:
        """Count one call that ended."""
        if not self.calls:  # a run is priced from its calls once it has any, as `run_cost` does
            self.worker = self.grader = Decimal(0)
        worker = call.role == "worker"
        cost = call_cost(self.prices, self.worker_model if worker else self.grader_model, call)
        if worker:
            self.worker = total([self.worker, cost])
        else:
            self.grader = total([self.grader, cost])
        self.calls += 1
        self.input_tokens = token_sum(self.input_tokens, call.input_tokens)
        self.cached_input_tokens = token_sum(self.cached_input_tokens, call.cached_input_tokens)
        self.output_tokens = token_sum(self.output_tokens, call.output_tokens)

    @property
    def total(self) -> Decimal | None:
        """Worker and grader together (None when either is unknown)."""
        return total([self.worker, self.grader])


class RunLike(Protocol):
    """What `run_costs` reads of a run (a `rubric_core.store.RunRecord` has it)."""

    @property
    def run_id(self) -> str:
        """The run's id."""

    @property
    def settings(self) -> RunSettings:
        """Its settings: models and rubric."""

    @property
    def iterations(self) -> int:
        """The passes it recorded."""


def run_costs(store: Store, prices: Prices, runs: Iterable[RunLike]) -> dict[str, RunCost]:
    """The costs of many runs (records with ``run_id``, ``settings``, ``iterations``).

    One lean read of their calls (`Store.call_usage_for_runs`); no messages are read.
    """
    records = list(runs)
    calls = store.call_usage_for_runs(r.run_id for r in records)
    return {r.run_id: run_cost(prices, r.settings, calls[r.run_id], iterations=r.iterations)
            for r in records}


@dataclasses.dataclass(frozen=True)
class ConfigCost:
    """One experiment configuration's cost: its cells' runs and the runs retries replaced."""

    config_index: int
    """The configuration."""
    worker: Decimal | None
    """Its cells' worker calls."""
    grader: Decimal | None
    """Its cells' grader calls."""
    cells: int
    """Cells that ran (have a run)."""
    rows: int
    """Dataset rows those cells cover."""
    ended: int
    """Of those cells, the ones that ended."""
    ended_total: Decimal | None
    """The cost of the cells that ended (the budget's running estimate per cell)."""
    earlier_runs: int = 0
    """Runs of its cells that a retry replaced; their cost is in `worker` and `grader`."""

    @property
    def total(self) -> Decimal | None:
        """Worker and grader together (None when either is unknown)."""
        return total([self.worker, self.grader])

    @property
    def per_100_rows(self) -> Decimal | None:
        """Cost per 100 dataset rows (None when unknown or nothing ran)."""
        cost = self.total
        return None if cost is None or not self.rows else cost * HUNDRED / self.rows

    @property
    def mean_ended_cell(self) -> Decimal | None:
        """The mean cost of a cell that ended (None when none ended or unknown)."""
        if not self.ended or self.ended_total is None:
            return None
        return self.ended_total / self.ended


@dataclasses.dataclass(frozen=True)
class ExperimentCost:
    """An experiment's cost, per configuration and in all."""

    configs: tuple[ConfigCost, ...]
    """Per configuration, in order."""
    runs: dict[str, Decimal | None]
    """Per cell run id: its cost."""
    earlier: dict[str, Decimal | None] = dataclasses.field(default_factory=dict)
    """Per run a retry replaced (`rubric_core.store.EarlierRun`): its cost."""

    @property
    def total(self) -> Decimal | None:
        """Every configuration's cost (None when any is unknown)."""
        return _sum(c.total for c in self.configs)


def experiment_cost(store: Store, prices: Prices, experiment: ExperimentRecord, *,
                    outcomes: Sequence[CellOutcome] | None = None) -> ExperimentCost:
    """Price every run an experiment paid for, per configuration (three lean reads).

    Each cell's run, and each earlier run of a retried cell (a retry starts a new run and the
    old one was paid for), priced with its configuration's models. The earlier runs count in
    the configuration's cost (so in its cost per 100 rows and the experiment's total, and in
    what a budget has spent), not in its cells' count or the estimate per ended cell, which
    are the cells' current runs'. ``outcomes``: the experiment's cells, when already read.
    """
    if outcomes is None:
        outcomes = store.cell_outcomes(experiment.experiment_id)
    calls = store.experiment_call_usage(experiment.experiment_id)
    earlier_runs = store.earlier_cell_runs(experiment.experiment_id)
    configs = experiment.configurations
    parts: list[dict[str, list[Decimal | None]]] = [
        {"worker": [], "grader": [], "ended": []} for _ in configs]
    rows: list[set[str]] = [set() for _ in configs]
    cells = [0] * len(configs)
    runs: dict[str, Decimal | None] = {}
    for cell in outcomes:
        if cell.run_id is None:
            continue
        config = configs[cell.config_index]
        cost = cell_cost(prices, config.worker_model, config.grader_model,
                         calls.get(cell.run_id, ()), cell.iterations)
        runs[cell.run_id] = cost.total
        part = parts[cell.config_index]
        part["worker"].append(cost.worker)
        part["grader"].append(cost.grader)
        if cell.status in ENDED_STATUSES:
            part["ended"].append(cost.total)
        rows[cell.config_index].add(cell.row_id)
        cells[cell.config_index] += 1
    earlier: dict[str, Decimal | None] = {}
    replaced = [0] * len(configs)
    for run in earlier_runs:
        config = configs[run.config_index]
        cost = cell_cost(prices, config.worker_model, config.grader_model,
                         calls.get(run.run_id, ()), run.iterations)
        earlier[run.run_id] = cost.total
        parts[run.config_index]["worker"].append(cost.worker)
        parts[run.config_index]["grader"].append(cost.grader)
        replaced[run.config_index] += 1
    return ExperimentCost(tuple(
        ConfigCost(i, _sum(p["worker"]), _sum(p["grader"]), cells[i], len(rows[i]),
                   len(p["ended"]), _sum(p["ended"]), replaced[i])
        for i, p in enumerate(parts)), runs, earlier)


def cell_cost(prices: Prices, worker_model: str, grader_model: str,
              calls: Iterable[CallUsage], iterations: int) -> PassCost:
    """A cell run's worker and grader cost (as a `PassCost` whose iteration is -1).

    Cheaper than `run_cost`: no per-pass or per-criterion split.
    """
    listed = list(calls)
    if not listed:
        zero = None if iterations else Decimal(0)
        return PassCost(-1, zero, zero)
    worker = _sum(call_cost(prices, worker_model, c) for c in listed if c.role == "worker")
    grader = _sum(call_cost(prices, grader_model, c) for c in listed if c.role != "worker")
    return PassCost(-1, worker, grader)


def store_costs(store: Store, prices: Prices) -> Callable[[Any], RunCost | None]:
    """A run → its cost, reading its calls' numbers from ``store`` (for exports).

    The run is a `rubric_core.store.RunRecord` (or anything with ``run_id``, ``settings``
    and ``iterations``); anything else (a mapping without settings) gives None.
    """

    def lookup(run: Any) -> RunCost | None:
        settings = getattr(run, "settings", None)
        run_id = getattr(run, "run_id", None)
        if settings is None or not run_id:
            return None
        calls = store.call_usage_for_runs([run_id])[run_id]
        return run_cost(prices, settings, calls, iterations=int(run.iterations or 0))

    return lookup


def usage_of(run_id: str, calls: Iterable[ModelCallRecord]) -> list[CallUsage]:
    """Call traces (`rubric_core.types.ModelCallRecord`, as events carry them) as numbers."""
    from rubric_core.store import CallUsage

    return [CallUsage(run_id, c["role"], c["iteration"], c["status"], c["started_at"],
                      c["input_tokens"], c["cached_input_tokens"], c["cache_creation_tokens"],
                      c["output_tokens"]) for c in calls]


@dataclasses.dataclass(frozen=True)
class RegradeConfigCost:
    """One re-grade configuration's gradings: their cost and tokens."""

    cost: Decimal | None
    """What its recorded gradings cost (None: unknown)."""
    input_tokens: int | None
    """Their input tokens, cached ones included (None: none reported)."""
    cached_input_tokens: int | None
    """Of those, read from the provider's prompt cache (None: none reported)."""
    output_tokens: int | None
    """Their output tokens (None: none reported)."""
    uncached_gradings: int = 0
    """Gradings recorded before cached tokens were kept, priced as uncached (an upper bound)."""


def regrade_cost(store: Store, prices: Prices, job: RegradeJob) -> list[RegradeConfigCost]:
    """Per grader configuration of a re-grade: what its gradings cost, and their tokens.

    Each grading's cached input tokens are priced at the cached price; one recorded before
    they were kept (schema 12) is priced as if nothing was read from a cache (at most what it
    cost) and counted in `RegradeConfigCost.uncached_gradings`. A grading that failed without
    usage costs 0 when its model's price is known.
    """
    parts: list[list[Decimal | None]] = [[] for _ in job.configurations]
    tokens: list[list[tuple[int | None, int | None, int | None]]] = [
        [] for _ in job.configurations]
    before = [0] * len(job.configurations)
    for result in store.regrade_results(job.job_id):
        index = result.config_index
        model = job.configurations[index].grader_model
        if result.input_tokens is None and result.output_tokens is None and result.error:
            parts[index].append(Decimal(0) if prices.known(model) else None)
            continue
        cached = result.cached_input_tokens
        if cached is None and result.input_tokens is not None:
            before[index] += 1
        tokens[index].append((result.input_tokens, cached, result.output_tokens))
        parts[index].append(prices.cost(model, Usage(
            result.input_tokens, cached or 0, 0, result.output_tokens)))
    return [RegradeConfigCost(_sum(p), token_sum(*(t[0] for t in counts)),
                              token_sum(*(t[1] for t in counts)),
                              token_sum(*(t[2] for t in counts)), uncached_gradings=n)
            for p, counts, n in zip(parts, tokens, before, strict=True)]


def cost_difference(a: ConfigCost, b: ConfigCost) -> Decimal | None:
    """How much more ``b`` costs than ``a`` per 100 rows (None when either is unknown)."""
    pa, pb = a.per_100_rows, b.per_100_rows
    return None if pa is None or pb is None else pb - pa


def costs_by_run(costs: Mapping[str, RunCost]) -> dict[str, Decimal | None]:
    """Run id → total cost, for tables."""
    return {rid: c.total for rid, c in costs.items()}


__all__ = [
    "UNKNOWN_RUN", "ConfigCost", "ExperimentCost", "PassCost", "RegradeConfigCost", "RunCost",
    "RunLike", "RunningCost", "call_cost",
    "cell_cost", "cost_difference", "costs_by_run", "experiment_cost", "regrade_cost", "run_cost",
    "run_costs",
    "store_costs", "usage_of",
]
