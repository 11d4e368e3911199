"""Experiment results: the cells' outcomes read once, and the tables drawn from them.

`experiment_results` reads every cell's run totals and last grading run back in one query
(`Store.cell_outcomes`); `ExperimentResults` turns them into the grid, the per-configuration
summary, the per-criterion table and pairwise comparisons, each in one pass over the cells.
`Tally` counts cells by how they ended; the scheduler's live progress uses the same rule.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import pandas as pd

from rubric_core.analytics import Comparison, compare_outcomes
from rubric_core.experiments.create import require_experiment
from rubric_core.rubric import normalize_name
from rubric_core.types import ENDED_STATUSES, ERROR_STATUSES
from rubric_core.usage import token_sum

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rubric_core.costs import ExperimentCost
    from rubric_core.store import CellOutcome, ExperimentRecord, PassVerdicts, Store
    from rubric_core.types import ExperimentProgress

SUMMARY_COLUMNS: tuple[str, ...] = (
    "config_index", "configuration", "worker_model", "grader_model", "cells", "done",
    "satisfied_pct", "first_pass_satisfied_pct", "mean_passes", "errors", "input_tokens",
    "output_tokens", "mean_duration_s", "cached_input_tokens", "cost_usd",
    "cost_per_100_rows_usd",
)
"""Columns of `ExperimentResults.summary`, in order (``cached_input_tokens``, the grader's
input tokens read from a prompt cache, came after the others were published, and the costs
after it: `rubric_core.costs`, empty when unknown or read without prices)."""

CRITERIA_COLUMNS: tuple[str, ...] = (
    "config_index", "criterion", "cells", "first_pass_rate", "final_pass_rate",
    "mean_passes_to_fix",
)
"""Columns of `ExperimentResults.criteria`, in order."""


@dataclasses.dataclass
class Tally:
    """Cells of one configuration by how they ended (live progress; summary rows extend it)."""

    total: int = 0
    """Cells of the configuration."""
    done: int = 0
    """Cells that ended (`ENDED_STATUSES`)."""
    satisfied: int = 0
    """Cells that ended ``satisfied``."""
    errors: int = 0
    """Cells that ended in an error (`ERROR_STATUSES`)."""

    def add(self, status: str) -> None:
        """Count an ending (a status that is not one is ignored)."""
        if status in ENDED_STATUSES:
            self.done += 1
            self.satisfied += status == "satisfied"
            self.errors += status in ERROR_STATUSES


def needs_run(cell: CellOutcome, retry_errors: bool) -> bool:
    """Whether a run of the experiment runs this cell (it has not ended, or is retried)."""
    return cell.status not in ENDED_STATUSES or (retry_errors and cell.status in ERROR_STATUSES)


def progress_event(experiment: ExperimentRecord, index: int, tally: Tally, *, started: float,
                   remaining: int, finished_here: int) -> ExperimentProgress:
    """A configuration's ``experiment_progress`` event, with an ETA from this session's pace.

    Args:
        experiment: The experiment.
        index: The configuration.
        tally: Its cells by how they ended.
        started: When this session started (``time.monotonic()``).
        remaining: Cells not ended yet, over all configurations.
        finished_here: Cells this session ended.

    """
    elapsed = time.monotonic() - started
    eta = round(remaining * elapsed / finished_here, 1) if finished_here else None
    return {"type": "experiment_progress", "experiment_id": experiment.experiment_id,
            "config_index": index, "label": experiment.configurations[index].display_label(),
            "done": tally.done, "total": tally.total, "satisfied": tally.satisfied,
            "errors": tally.errors,
            "satisfied_rate": round(tally.satisfied / tally.done, 4) if tally.done else None,
            "eta_s": eta}


@dataclasses.dataclass(frozen=True)
class ExperimentResults:
    """An experiment's cells with their runs' totals and last grading runs, and their tables.

    Read in one query (`Store.cell_outcomes`), without run settings or answers; each table is
    one pass over the cells, so a results page of thousands of cells stays quick.
    """

    experiment: ExperimentRecord
    """The experiment."""
    cells: list[CellOutcome]
    """Every cell, in run order (with the passes of its run's last grading run when
    `verdicts`)."""
    verdicts: bool = True
    """Whether the cells' passes were read: `summary` and `criteria` need them."""

    def grid(self) -> pd.DataFrame:
        """One row per cell: row, configuration, repeat, status, passes, tokens, time, run id."""
        labels = [c.display_label() for c in self.experiment.configurations]
        cells = self.cells
        return pd.DataFrame({
            "row_id": [c.row_id for c in cells],
            "config_index": [c.config_index for c in cells],
            "configuration": [labels[c.config_index] for c in cells],
            "repeat_index": [c.repeat_index for c in cells],
            "status": [c.status for c in cells],
            "passes": [c.iterations for c in cells],
            "tokens": [token_sum(c.input_tokens, c.output_tokens) for c in cells],
            "duration_s": [c.duration_s for c in cells],
            "run_id": [c.run_id for c in cells],
        }, columns=["row_id", "config_index", "configuration", "repeat_index", "status",
                    "passes", "tokens", "duration_s", "run_id"])

    def ended(self) -> int:
        """Cells whose run ended (in `ENDED_STATUSES`)."""
        return sum(c.status in ENDED_STATUSES for c in self.cells)

    def summary(self, costs: ExperimentCost | None = None) -> pd.DataFrame:
        """Per configuration (`SUMMARY_COLUMNS`); percentages over the cells that ended.

        Args:
            costs: The experiment's costs (`rubric_core.costs.experiment_cost`), for the
                ``cost_usd`` and ``cost_per_100_rows_usd`` columns (Decimal, None when
                unknown); empty without.

        Raises:
            ValueError: The results were read without their verdicts.

        """
        self._need_verdicts()
        tallies = [_ConfigTally() for _ in self.experiment.configurations]
        for c in self.cells:
            tallies[c.config_index].add_cell(c)
        records = [{
            "config_index": index, "configuration": config.display_label(),
            "worker_model": config.worker_model, "grader_model": config.grader_model,
            "cells": t.total, "done": t.done,
            "satisfied_pct": _pct(t.satisfied, t.done),
            "first_pass_satisfied_pct": _pct(t.first_ok, t.done),
            "mean_passes": round(t.passes / t.done, 3) if t.done else None,
            "errors": t.errors, "input_tokens": t.input_tokens, "output_tokens": t.output_tokens,
            "mean_duration_s": (round(sum(t.durations) / len(t.durations), 3)
                                if t.durations else None),
            "cached_input_tokens": t.cached_input_tokens,
            "cost_usd": None if costs is None else costs.configs[index].total,
            "cost_per_100_rows_usd": None if costs is None else costs.configs[index].per_100_rows,
        } for (index, config), t in zip(enumerate(self.experiment.configurations), tallies,
                                        strict=True)]
        return pd.DataFrame.from_records(records, columns=list(SUMMARY_COLUMNS))

    def criteria(self) -> pd.DataFrame:
        """Per configuration and criterion (`CRITERIA_COLUMNS`), in order of first appearance.

        Over each cell's last grading run: the pass rate at its first pass and at its last
        graded pass, and the mean passes needed to fix the criterion as
        `rubric_core.analytics.loop_analytics` defines it (from the first pass that fails it
        to the first later pass that passes it; cells where it never failed, or never got
        fixed, do not count). Criteria are matched by `rubric.normalize_name`. One pass over
        the cells: `loop_analytics` over every pass would cost several times more.

        Raises:
            ValueError: The results were read without their verdicts.

        """
        self._need_verdicts()
        keys: dict[str, str] = {}  # criterion name → normalized name, each computed once
        records: list[tuple[Any, ...]] = []
        for index in range(len(self.experiment.configurations)):
            tallies: dict[str, _CriterionTally] = {}
            for cell in self.cells:
                if cell.config_index == index and cell.passes and cell.passes[0][1]:
                    _tally_cell(cell.passes, tallies, keys)
            records += [t.row(index) for t in tallies.values()]
        return pd.DataFrame.from_records(records, columns=list(CRITERIA_COLUMNS))

    def outcomes(self, config_index: int) -> dict[str, bool]:
        """``row_id`` (``row_id#repeat`` with repeats) → satisfied, for the cells that ended."""
        out = {}
        for c in self.cells:
            if c.config_index == config_index and c.status in ENDED_STATUSES:
                key = c.row_id if self.experiment.repeats == 1 else f"{c.row_id}#{c.repeat_index}"
                out[key] = c.status == "satisfied"
        return out

    def compare(self, a: int, b: int) -> Comparison:
        """Configuration ``a`` against ``b`` on the rows both ended: flips and McNemar's p."""
        return compare_outcomes(self.outcomes(a), self.outcomes(b))

    def _need_verdicts(self) -> None:
        if not self.verdicts:
            msg = "these results were read without verdicts: use experiment_results(verdicts=True)"
            raise ValueError(msg)


@dataclasses.dataclass
class _ConfigTally(Tally):
    """One configuration's row of `ExperimentResults.summary`, added up cell by cell."""

    first_ok: int = 0
    passes: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    durations: list[float] = dataclasses.field(default_factory=list)

    def add_cell(self, cell: CellOutcome) -> None:
        self.total += 1
        self.add(cell.status)
        if cell.status not in ENDED_STATUSES:
            return
        self.first_ok += bool(cell.passes) and cell.passes[0][0] == "satisfied"
        self.passes += len(cell.passes)
        self.input_tokens += cell.input_tokens or 0
        self.output_tokens += cell.output_tokens or 0
        self.cached_input_tokens += cell.cached_input_tokens or 0
        if cell.duration_s is not None:
            self.durations.append(cell.duration_s)


def _pct(part: int, whole: int) -> float | None:
    return round(100 * part / whole, 2) if whole else None


@dataclasses.dataclass
class _CriterionTally:
    """One criterion's row of `ExperimentResults.criteria` within a configuration."""

    name: str
    cells: int = 0
    first_graded: int = 0
    first_passed: int = 0
    last_graded: int = 0
    last_passed: int = 0
    fixes: list[int] = dataclasses.field(default_factory=list)

    def row(self, config_index: int) -> tuple[Any, ...]:
        return (config_index, self.name, self.cells, _share(self.first_passed, self.first_graded),
                _share(self.last_passed, self.last_graded),
                round(sum(self.fixes) / len(self.fixes), 4) if self.fixes else None)


def _tally_cell(passes: Sequence[PassVerdicts], tallies: dict[str, _CriterionTally],
                keys: dict[str, str]) -> None:
    """Add one cell's last grading run (its first pass has verdicts) to ``tallies``."""
    seen: set[str] = set()
    first_fail: dict[str, int] = {}
    fixed: set[str] = set()
    for i, (_, verdicts) in enumerate(passes):
        for c in verdicts:
            key = _criterion_key(c["name"], keys)
            tally = tallies.get(key)
            if tally is None:
                tally = tallies[key] = _CriterionTally(c["name"])
            if key not in seen:
                seen.add(key)
                tally.cells += 1
            if i == 0:
                tally.first_graded += 1
                tally.first_passed += bool(c["passed"])
            if not c["passed"]:
                first_fail.setdefault(key, i)
            elif key in first_fail and key not in fixed:
                fixed.add(key)
                tally.fixes.append(i - first_fail[key])
    for c in next(v for _, v in reversed(passes) if v):
        tally = tallies[_criterion_key(c["name"], keys)]
        tally.last_graded += 1
        tally.last_passed += bool(c["passed"])


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _criterion_key(name: str, keys: dict[str, str]) -> str:
    """`normalize_name`, remembered: an experiment repeats the same few names many times."""
    key = keys.get(name)
    if key is None:
        key = keys[name] = normalize_name(name)
    return key


def experiment_results(store: Store, experiment_id: str, *,
                       verdicts: bool = True) -> ExperimentResults:
    """The experiment's cells with their last grading runs, read once, for the result tables.

    Args:
        store: The database.
        experiment_id: The experiment.
        verdicts: Also read every cell's last grading run, which `ExperimentResults.summary`
            and `ExperimentResults.criteria` need; the grid, `compare` and the counts do not
            (without, the read costs about a third).

    Raises:
        KeyError: No such experiment.

    """
    experiment = require_experiment(store, experiment_id)
    cells = store.cell_outcomes(experiment_id, verdicts=verdicts)
    return ExperimentResults(experiment, cells, verdicts)


__all__ = [
    "CRITERIA_COLUMNS", "SUMMARY_COLUMNS", "ExperimentResults", "Tally", "experiment_results",
    "needs_run", "progress_event",
]
