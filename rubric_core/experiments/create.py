"""Creating experiments: checking a dataset × configurations, storing them with their cells.

`create_experiment` stores the dataset (when given one) and the experiment with all its cells;
each cell gets its own LangGraph thread up front. Nothing runs here: `run_experiment`
(`rubric_core.experiments.scheduler`) runs the cells, and `retry_cell` makes one ended cell
run again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rubric_core import session
from rubric_core.types import MAX_CELLS, MAX_REPEATS

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rubric_core.datasets import Dataset
    from rubric_core.settings import ExperimentConfig
    from rubric_core.store import ExperimentRecord, Store
    from rubric_core.types import ModelResolver


def require_experiment(store: Store, experiment_id: str) -> ExperimentRecord:
    """The experiment.

    Raises:
        KeyError: No such experiment (the message names the id and the database).

    """
    experiment = store.get_experiment(experiment_id)
    if experiment is None:
        msg = f"no experiment with id {experiment_id!r} in {store.path}"
        raise KeyError(msg)
    return experiment


def experiment_and_dataset(store: Store, experiment_id: str) -> tuple[ExperimentRecord, Dataset]:
    """The experiment and the dataset version it runs over.

    Raises:
        KeyError: No such experiment.

    """
    experiment = require_experiment(store, experiment_id)
    dataset, _ = store.load_dataset(experiment.dataset_name, experiment.dataset_version)
    return experiment, dataset


def create_experiment(
    store: Store,
    dataset: Dataset | str,
    configurations: Sequence[ExperimentConfig],
    *,
    repeats: int = 1,
    name: str = "",
    dataset_version: int | None = None,
    models: ModelResolver | None = None,
) -> ExperimentRecord:
    """Check and store an experiment with all its cells; nothing runs yet.

    Args:
        store: The database.
        dataset: A parsed dataset (stored as a new version unless unchanged) or a stored
            dataset's name.
        configurations: One or more configurations.
        repeats: Runs of every row under every configuration (1 to `MAX_REPEATS`).
        name: A label (the dataset's name when empty).
        dataset_version: With a stored name: that version (the latest when None).
        models: Builds the chat models to check them (`session.default_models()` if omitted).

    Raises:
        ValueError: No configurations, a row that cannot run under a configuration (the
            message names the row), a bad repeat count, more than `MAX_CELLS` cells. Nothing
            is stored.
        KeyError: No such stored dataset.
        ModelConfigError: A configuration's model cannot be built. Nothing is stored.

    """
    if not configurations:
        msg = "an experiment needs at least one configuration (worker, grader, rubric)"
        raise ValueError(msg)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not (
            1 <= repeats <= MAX_REPEATS):
        msg = f"repeats must be a whole number from 1 to {MAX_REPEATS}"
        raise ValueError(msg)
    if isinstance(dataset, str):
        dataset, version = store.load_dataset(dataset, dataset_version)
    else:
        version = None
    cells = len(dataset.rows) * len(configurations) * repeats
    if cells > MAX_CELLS:
        msg = (f"{len(dataset.rows)} rows × {len(configurations)} configuration(s) × {repeats} "
               f"repeat(s) is {cells:,} cells; an experiment holds at most {MAX_CELLS:,}: "
               "split the dataset or run fewer configurations")
        raise ValueError(msg)
    for config in configurations:
        for row in dataset.rows:
            config.settings_for(row).validate()
        session.build_spec(config.settings_for(dataset.rows[0]), models)
    if version is None:
        version = store.save_dataset(dataset)
    return store.create_experiment(
        name=name or dataset.name, dataset_name=dataset.name, dataset_version=version,
        configurations=configurations, repeats=repeats, row_ids=[r.id for r in dataset.rows],
    )


def retry_cell(store: Store, experiment_id: str, key: tuple[str, int, int]) -> str:
    """Make one ended cell run again from the start on a fresh thread (its old run stays).

    The next `run_experiment` runs it. Returns the new thread id.

    Raises:
        KeyError: No such cell.

    """
    return store.renew_cell_thread(experiment_id, key)


__all__ = ["create_experiment", "experiment_and_dataset", "require_experiment", "retry_cell"]
