"""Experiment exports: every pass of every cell as rows, and the summary as rows.

`export_experiment_rows` reads cells, runs and evaluations a page at a time, so memory stays
flat in the rows written; `rubric_core.export.write_csv` (formula-safe) or ``write_json`` write
them with `export_columns`. `summary_rows` gives `ExperimentResults.summary` the same way.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from rubric_core.costs import store_costs
from rubric_core.experiments.create import experiment_and_dataset
from rubric_core.export import EXPORT_COLUMNS, export_rows
from rubric_core.prices import Prices
from rubric_core.redact import redact

if TYPE_CHECKING:
    from collections.abc import Iterator

    from rubric_core.costs import ExperimentCost
    from rubric_core.datasets import Dataset
    from rubric_core.experiments.results import ExperimentResults
    from rubric_core.store import Store

_CELL_COLUMNS = ("experiment_id", "configuration", "config_index", "repeat_index")
_RUNS_PER_READ = 100




def export_columns(store: Store, experiment_id: str) -> tuple[str, ...]:
    """Columns of `export_experiment_rows`.

    The cell's columns, ``row_<column>`` for each dataset column (``row_id``, ``row_prompt``,
    ...), then `rubric_core.export.EXPORT_COLUMNS`.

    Raises:
        KeyError: No such experiment.

    """
    _, dataset = experiment_and_dataset(store, experiment_id)
    return (*_CELL_COLUMNS, *_data_columns(dataset), *EXPORT_COLUMNS)


def _data_columns(dataset: Dataset) -> list[str]:
    names = ["id", "prompt", "rubric", *(c for c in dataset.columns
                                         if c not in ("id", "prompt", "rubric"))]
    return [f"row_{name}" for name in names]


def export_experiment_rows(store: Store, experiment_id: str, *,
                           prices: Prices | None = None) -> Iterator[tuple[Any, ...]]:
    """One row per dataset row × configuration × repeat × pass × criterion, produced lazily.

    Cells, their runs and evaluations are read from the store a hundred at a time, so memory
    stays flat in the rows written. Pass the rows to `rubric_core.export.write_csv`
    (formula-safe) or ``write_json`` with `export_columns`. Text cells are scrubbed of secrets.
    The cost columns are priced with ``prices`` (the price table alone when None).

    Raises:
        KeyError: No such experiment.

    """
    experiment, dataset = experiment_and_dataset(store, experiment_id)
    names = [c.removeprefix("row_") for c in _data_columns(dataset)]
    rows = {r.id: r for r in dataset.rows}
    labels = [c.display_label() for c in experiment.configurations]
    costs = store_costs(store, prices or Prices())
    for start in itertools.count(0, _RUNS_PER_READ):
        # A page of cells at a time too: each record carries its run's whole settings.
        page = store.experiment_cells(experiment_id, offset=start, limit=_RUNS_PER_READ)
        if not page:
            return
        chunk = [c for c in page if c.run is not None]
        by_run = store.evaluations_for_runs(c.run.run_id for c in chunk if c.run)
        for cell in chunk:
            assert cell.run is not None
            row = rows.get(cell.row_id)
            record = ({} if row is None else
                      {"id": row.id, "prompt": row.prompt, "rubric": row.rubric, **row.variables})
            head = (experiment.experiment_id, labels[cell.config_index], cell.config_index,
                    cell.repeat_index, *(_text(record.get(n)) for n in names))
            for line in export_rows([(cell.run, by_run[cell.run.run_id])], costs=costs):
                yield (*head, *line)


def summary_rows(results: ExperimentResults,
                 costs: ExperimentCost | None = None) -> Iterator[tuple[Any, ...]]:
    """`ExperimentResults.summary` as rows in `SUMMARY_COLUMNS` order, for ``write_csv``."""
    frame = results.summary(costs).astype(object).where(lambda f: f.notna(), None)
    for values in frame.itertuples(index=False, name=None):
        yield tuple(_text(v) for v in values)


def _text(value: Any) -> Any:
    return redact(value) if isinstance(value, str) else value


__all__ = ["export_columns", "export_experiment_rows", "summary_rows"]
