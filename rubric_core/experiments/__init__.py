"""Experiments: one dataset × configurations × repeats, each cell a recorded rubric-loop run.

The package's modules, one concept each; their public names are re-exported here:

- `rubric_core.experiments.create`: check and store an experiment with its cells
  (`create_experiment`), make one ended cell run again (`retry_cell`);
- `rubric_core.experiments.scheduler`: run the cells on the queue engine (`run_experiment`,
  `rubric_core.engine`: several processes and machines share an experiment), with the models
  every experiment gets (`experiment_models`: a shared 429/5xx backoff, no streaming, one
  model per model string);
- `rubric_core.experiments.results`: the cells' outcomes read once, and the grid, summary,
  per-criterion and comparison tables (`experiment_results`, `ExperimentResults`);
- `rubric_core.experiments.export`: every pass of every cell as rows, streamed
  (`export_experiment_rows`, `export_columns`, `summary_rows`).

Limits (`MAX_CONCURRENCY`, `MAX_REPEATS`, `MAX_CELLS`, `DEFAULT_CONCURRENCY`) and the cell
status sets (`ENDED_STATUSES`, `ERROR_STATUSES`) are `rubric_core.types`'s.
"""

from __future__ import annotations

from rubric_core.experiments.budget import (
    Budget,
    BudgetError,
    estimate_experiment,
    estimate_new,
)
from rubric_core.experiments.create import create_experiment, retry_cell
from rubric_core.experiments.export import export_columns, export_experiment_rows, summary_rows
from rubric_core.experiments.limits import ExperimentLimits
from rubric_core.experiments.results import (
    CRITERIA_COLUMNS,
    SUMMARY_COLUMNS,
    ExperimentResults,
    experiment_results,
)
from rubric_core.experiments.scheduler import check_limits, experiment_models, run_experiment
from rubric_core.http_retry import RETRY_STATUS_CODES, SharedBackoff
from rubric_core.types import (
    DEFAULT_CONCURRENCY,
    ENDED_STATUSES,
    ERROR_STATUSES,
    MAX_CELLS,
    MAX_CONCURRENCY,
    MAX_REPEATS,
)

__all__ = [
    "CRITERIA_COLUMNS",
    "DEFAULT_CONCURRENCY",
    "ENDED_STATUSES",
    "ERROR_STATUSES",
    "MAX_CELLS",
    "MAX_CONCURRENCY",
    "MAX_REPEATS",
    "RETRY_STATUS_CODES",
    "SUMMARY_COLUMNS",
    "Budget",
    "BudgetError",
    "ExperimentLimits",
    "ExperimentResults",
    "SharedBackoff",
    "check_limits",
    "create_experiment",
    "estimate_experiment",
    "estimate_new",
    "experiment_models",
    "experiment_results",
    "export_columns",
    "export_experiment_rows",
    "retry_cell",
    "run_experiment",
    "summary_rows",
]
