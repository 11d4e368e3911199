"""Experiments page: datasets, the configuration form, live runs with Stop, results and exports.

Creating, running and reading experiments is `rubric_core.experiments`'s; this module turns
the page's widgets into `ExperimentConfig` values, keeps the registry of experiments this
process is running (so a rerun of the page knows what it may stop, like
`rubric_core.session.is_active` for runs) and shapes results for the page's tables.
"""

from __future__ import annotations

import functools
import io
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

import pandas as pd

from rubric_core.app_support._common import FORM_DEFAULTS, UiMessage
from rubric_core.app_support.settings import (
    check_judging,
    check_max_iterations,
    judging_from_widgets,
    max_tokens_from_widgets,
    model_problem,
)
from rubric_core.costs import experiment_cost
from rubric_core.datasets import Dataset, DatasetError, parse_dataset, preview
from rubric_core.experiments import (
    SUMMARY_COLUMNS,
    ExperimentLimits,
    create_experiment,
    experiment_results,
    export_columns,
    export_experiment_rows,
    run_experiment,
    summary_rows,
)
from rubric_core.export import write_csv, write_json
from rubric_core.models import ModelConfigError
from rubric_core.offline.demo_dataset import demo_dataset
from rubric_core.prices import Prices
from rubric_core.registry import ActiveRegistry
from rubric_core.session import stale_before
from rubric_core.settings import ExperimentConfig
from rubric_core.types import DEFAULT_CONCURRENCY, ERROR_STATUSES, MAX_CONCURRENCY, MAX_REPEATS
from rubric_core.usage import token_sum

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence

    from rubric_core.experiments import Budget, ExperimentResults
    from rubric_core.http_retry import SharedBackoff
    from rubric_core.store import CellOutcome, DatasetInfo, ExperimentRecord, Store
    from rubric_core.types import ExperimentEvent, ExperimentProgress, ModelResolver

MAX_CONFIGS = 6
"""Configuration blocks the form offers."""


_CONFIG_FIELDS: dict[str, Any] = {
    "worker": "demo", "grader": "rules", "system": "", "tools": [], "label": "",
    "limit": 0, "rate": 0,
}
"""A configuration block's fields and first values; ``limit`` (cells at once) and ``rate``
(cells started per minute) are its limits, 0 for none (`limits_from_state`)."""



# -- datasets -------------------------------------------------------------------------------------


def dataset_name_for(file_name: str | None) -> str:
    """A dataset name from an uploaded file's name (its stem), or ``""``."""
    return PurePath(file_name).stem.strip() if file_name else ""


def import_dataset(store: Store, data: bytes | str, *, name: str) -> UiMessage:
    """Check a whole uploaded or pasted dataset and store it as a new version.

    Nothing is stored when any row is bad: the message is `DatasetError`'s, naming the row
    and the column.
    """
    name = name.strip()
    # The rows first: what is wrong with them matters more than a missing name.
    try:
        dataset = parse_dataset(data, name=name or "dataset")
    except DatasetError as exc:
        return UiMessage("error", f"Nothing was stored: {str(exc).rstrip('.')}.")
    if not name:
        return UiMessage("error", "Give the dataset a name, then store it again.")
    before = {i.version for i in store.dataset_versions(name)}
    version = store.save_dataset(dataset)
    if version in before:
        return UiMessage("info", f"Dataset {name!r} is unchanged: still version {version} "
                                 f"({len(dataset.rows)} rows).")
    return UiMessage("success", f"Stored dataset {name!r} version {version} "
                                f"({len(dataset.rows)} rows).")


def import_demo_dataset(store: Store) -> UiMessage:
    """Store the bundled offline dataset (it runs end to end with ``demo`` + ``rules``)."""
    dataset = demo_dataset()
    version = store.save_dataset(dataset)
    return UiMessage("success", f"Bundled dataset {dataset.name!r} is stored as version "
                                f"{version} ({len(dataset.rows)} rows, each with its own "
                                "rubric): start an experiment with it below.")


def datasets_frame(infos: Sequence[DatasetInfo]) -> pd.DataFrame:
    """The stored datasets (latest versions) as a table."""
    return pd.DataFrame(
        [{"name": i.name, "version": i.version, "rows": i.row_count,
          "columns": ", ".join(i.columns), "stored": i.created_at[:19].replace("T", " ")}
         for i in infos], columns=["name", "version", "rows", "columns", "stored"])


@dataclass(frozen=True)
class StoredDataset:
    """A stored dataset version as the Experiments page uses it (see `stored_dataset`)."""

    dataset: Dataset
    """The rows."""

    @functools.cached_property
    def unknown_to_demo(self) -> int:
        """Rows whose prompt the offline ``demo`` worker does not know (`demo_knows`)."""
        from rubric_core.offline.demo import demo_knows

        return sum(1 for row in self.dataset.rows if not demo_knows(row.prompt))


_DATASETS: OrderedDict[tuple[str, str, int, str], StoredDataset] = OrderedDict()
_DATASETS_LOCK = threading.Lock()
_DATASETS_KEPT = 4


def stored_dataset(store: Store, name: str, version: int | None = None) -> StoredDataset:
    """A stored dataset version, parsed once per process while it is among the last few used.

    Streamlit runs the page again on every click, and parsing a 10,000-row dataset each time
    would cost more than the rest of the page. A stored version never changes; one deleted
    and stored again is told apart by when it was stored (to the microsecond).

    Raises:
        KeyError: No such dataset or version.

    """
    infos = [i for i in store.dataset_versions(name) if version in (None, i.version)]
    if not infos:
        which = "" if version is None else f" version {version}"
        msg = f"no stored dataset {name!r}{which}"
        raise KeyError(msg)
    info = infos[-1]
    key = (store.location, info.name, info.version, info.created_at)
    with _DATASETS_LOCK:
        if key in _DATASETS:
            _DATASETS.move_to_end(key)
            return _DATASETS[key]
    dataset, _ = store.load_dataset(info.name, info.version)
    entry = StoredDataset(dataset)
    with _DATASETS_LOCK:
        _DATASETS[key] = entry
        while len(_DATASETS) > _DATASETS_KEPT:
            _DATASETS.popitem(last=False)
    return entry


def dataset_preview(store: Store, name: str, version: int | None, limit: int = 20
                    ) -> pd.DataFrame:
    """The first ``limit`` rows of a stored dataset version."""
    return pd.DataFrame(preview(stored_dataset(store, name, version).dataset, limit))


def delete_dataset(store: Store, name: str) -> UiMessage:
    """Delete every version of a dataset, unless an experiment uses it."""
    try:
        count = store.delete_dataset(name)
    except ValueError as exc:
        return UiMessage("error", f"Not deleted: {exc}.")
    return UiMessage("success", f"Deleted dataset {name!r} ({count} version(s)).")


# -- the configuration form -----------------------------------------------------------------------


def config_key(index: int, field: str) -> str:
    """The widget key of one field of configuration block ``index``."""
    return f"exp_cfg_{index}_{field}"


def form_defaults(state: Mapping[str, Any]) -> dict[str, Any]:
    """The Experiments form's widget keys with their first values.

    One configuration (``demo`` + ``rules``, the sidebar's cap and verdict-stability options)
    and the Author page's rubric.
    """
    out: dict[str, Any] = {
        "exp_config_count": 1, "exp_repeats": 1, "exp_concurrency": DEFAULT_CONCURRENCY,
        "exp_name": "", "exp_rubric": state.get("rubric_text") or "",
        "exp_rate_cells": 0, "exp_rate_per": "minute",
    }
    sidebar = {"cap": state.get("max_iterations", FORM_DEFAULTS["max_iterations"]),
               **{field: state.get(key, FORM_DEFAULTS[key]) for field, key in (
                   ("repeats", "grader_repeats"), ("consensus", "consensus"),
                   ("best", "return_best"))}}
    for index in range(MAX_CONFIGS):
        for field, value in {**_CONFIG_FIELDS, **sidebar}.items():
            out[config_key(index, field)] = value
    return out


def keep_form(state: MutableMapping[str, Any]) -> None:
    """Give the form its defaults and keep its values while another page is shown.

    Streamlit drops the state of widgets not drawn in a run; re-assigning keeps it.
    """
    for key, value in form_defaults(state).items():
        state[key] = state.get(key, value)


def configs_from_state(state: Mapping[str, Any]) -> list[ExperimentConfig]:
    """The configuration blocks as `ExperimentConfig` values.

    Each takes the sidebar's base URL and output token limits.
    """
    count = int(state.get("exp_config_count") or 1)
    base_url = str(state.get("base_url") or "").strip() or None
    limits = max_tokens_from_widgets(state.get("worker_max_tokens"),
                                     state.get("grader_max_tokens"))
    rubric = str(state.get("exp_rubric") or "")
    out = []
    for index in range(min(max(count, 1), MAX_CONFIGS)):
        def get(field: str, i: int = index) -> Any:
            return state.get(config_key(i, field), _CONFIG_FIELDS.get(field))

        out.append(ExperimentConfig(
            worker_model=str(get("worker") or "demo").strip(),
            grader_model=str(get("grader") or "rules").strip(),
            rubric=rubric, worker_system_prompt=str(get("system") or ""),
            grader_tools=tuple(get("tools") or ()),
            max_iterations=get("cap") or FORM_DEFAULTS["max_iterations"],
            base_url=base_url, label=str(get("label") or ""), **limits,
            **judging_from_widgets(get("repeats"), get("consensus"), get("best"))))
    return out


def check_configs(
    configs: Sequence[ExperimentConfig], *, secrets: Mapping[str, Any],
    session_key: str | None = None, dataset: StoredDataset | None = None,
) -> list[UiMessage]:
    """What stops the experiment (errors) or deserves a look (warnings); nothing is called.

    Args:
        configs: The configurations.
        secrets: The app's secrets.
        session_key: The key typed in the sidebar.
        dataset: The dataset (for the ``demo`` worker's notice).

    Returns:
        Messages, errors first.

    """
    from rubric_core.session import build_grader_tools

    out: list[UiMessage] = []
    for number, config in enumerate(configs, start=1):
        where = f"Configuration {number}"
        for role, model in (("worker", config.worker_model), ("grader", config.grader_model)):
            reason = model_problem(model, base_url=config.base_url, secrets=secrets,
                                   session_key=session_key)
            if reason:
                out.append(UiMessage("error", f"{where}, {role} model: {reason}"))
        _, problem = check_max_iterations(config.max_iterations)
        if problem:
            out.append(UiMessage("error", f"{where}: {problem}"))
        if problem := check_judging(config.grader_repeats, config.consensus):
            out.append(UiMessage("error", f"{where}: {problem}"))
        try:
            build_grader_tools(config.grader_tools, None)
        except ValueError as exc:
            out.append(UiMessage("error", f"{where}: {exc}"))
        if config.worker_model == "demo" and dataset is not None and dataset.unknown_to_demo:
            out.append(UiMessage(
                "warning", f"{where}: the offline `demo` worker knows only the bundled "
                f"examples and dataset; {dataset.unknown_to_demo} of {len(dataset.dataset.rows)} "
                "rows will get the reply \"I can only answer the bundled examples\". Choose a "
                "real worker model for your own prompts."))
    return sorted(out, key=lambda m: m.level != "error")


def new_experiment(
    store: Store, dataset_name: str, version: int | None, configs: Sequence[ExperimentConfig],
    *, repeats: int, name: str, models: ModelResolver,
) -> tuple[ExperimentRecord | None, UiMessage | None]:
    """Create the experiment (nothing runs yet); or None and why it was refused."""
    try:
        record = create_experiment(store, dataset_name, configs, repeats=repeats,
                                   name=name.strip(), dataset_version=version, models=models)
    except (ValueError, KeyError, ModelConfigError) as exc:
        return None, UiMessage("error", f"The experiment was not created: {exc}")
    return record, None


# -- running: the registry of this process's experiments ------------------------------------------

ACTIVE_EXPERIMENTS: ActiveRegistry[threading.Event] = ActiveRegistry("Experiment")
"""The experiments this process runs right now, each with its stop event: Streamlit reruns a
page on a click while the old script thread still runs the experiment, and the new run finds
the stop event here."""


def experiment_active(experiment_id: str) -> bool:
    """Whether this process is running the experiment right now (running or stopping)."""
    return experiment_id in ACTIVE_EXPERIMENTS


def stop_experiment(experiment_id: str) -> bool:
    """Ask this process's run of the experiment to stop; False when none is running."""
    stop = ACTIVE_EXPERIMENTS.get(experiment_id)
    if stop is None:
        return False
    stop.set()
    return True


def wait_experiment_inactive(experiment_id: str, timeout_s: float) -> bool:
    """Wait for a stopping experiment to unwind; True when it is no longer active."""
    return ACTIVE_EXPERIMENTS.wait_until_inactive(experiment_id, timeout_s)


def live_experiment(
    store: Store, experiment_id: str, *, models: ModelResolver, backoff: SharedBackoff,
    concurrency: int = DEFAULT_CONCURRENCY, retry_errors: bool = False,
    budget: Budget | None = None, rate_limit: tuple[int, float] | None = None,
    per_model: Mapping[str, int] | None = None,
    model_rates: Mapping[str, tuple[int, float]] | None = None,
    per_config: Mapping[int, int] | None = None,
    config_rates: Mapping[int, tuple[int, float]] | None = None,
) -> Iterator[ExperimentEvent]:
    """`run_experiment`, registered so that `stop_experiment` from another rerun stops it.

    Closing the iterator is Stop too (the experiment's queued and running cells are
    cancelled). ``budget`` (None: the one kept with the experiment, if any) stops it before a
    cell would spend past it; ``rate_limit`` and the per-model and per-configuration limits
    (`limits_from_state` gives them) are `run_experiment`'s.

    Raises:
        RuntimeError: This process is already running (or stopping) the experiment.
        BudgetError: The budget cannot be enforced (a model of unknown price).
        ValueError: A limit `run_experiment` refuses (a model or configuration the experiment
            does not have, a number out of range).

    """
    with ACTIVE_EXPERIMENTS.hold(experiment_id, threading.Event()) as stop:
        limits = ExperimentLimits(
            concurrency=concurrency, rate=rate_limit, per_model=dict(per_model or {}),
            model_rates=dict(model_rates or {}), per_config=dict(per_config or {}),
            config_rates=dict(config_rates or {}))
        yield from run_experiment(store, experiment_id, limits=limits, models=models,
                                  backoff=backoff, retry_errors=retry_errors, stop=stop,
                                  budget=budget)


# -- the queue engine ------------------------------------------------------------------------------

RATE_PERIODS = {"second": 1.0, "minute": 60.0, "hour": 3600.0}
"""The rate limit's periods, in seconds."""

MAX_RATE_CELLS = 1_000_000
"""Most cells the rate limit field allows per period."""


def rate_limit_from_state(state: Mapping[str, Any]) -> tuple[int, float] | None:
    """The rate limit fields as `run_experiment`'s ``(cells, seconds)``; None for none (0)."""
    cells = int(state.get("exp_rate_cells") or 0)
    if cells < 1:
        return None
    return min(cells, MAX_RATE_CELLS), RATE_PERIODS.get(str(state.get("exp_rate_per")), 60.0)


# -- per-model and per-configuration limits --------------------------------------------------------

MODEL_LIMITS_KEY = "exp_model_limits"
"""Session state: the Limits per model table's values by model string,
``{model: {"limit": cells at once, "rate": cells started per minute}}`` (0: none). Kept by
model, not by row, so a value survives reruns and a change of the configurations."""

MODEL_LIMIT_COLUMNS = ("Model", "Cells at once", "Cells started per minute")
"""The Limits per model table's columns."""

_LIMIT_FIELDS = {"Cells at once": "limit", "Cells started per minute": "rate"}
_PER_MINUTE_S = 60.0


def form_models(configs: Sequence[ExperimentConfig]) -> list[str]:
    """The distinct models the configurations use (worker and grader), first use first."""
    return list(dict.fromkeys(m for c in configs for m in (c.worker_model, c.grader_model)))


def _lenient_whole(value: Any, most: int) -> int:
    """A table cell's value as 0 … ``most``: empty, negative or not a number is 0."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0
    if number != number or number < 1:  # NaN (a cleared cell) or nothing
        return 0
    return int(min(number, most))


def model_limits_frame(state: Mapping[str, Any], models: Sequence[str]) -> pd.DataFrame:
    """The Limits per model table: one row per model, its kept values (0 for none)."""
    kept = state.get(MODEL_LIMITS_KEY) or {}
    rows = []
    for model in models:
        entry = kept.get(model) or {}
        rows.append({"Model": model,
                     "Cells at once": _lenient_whole(entry.get("limit"), MAX_CONCURRENCY),
                     "Cells started per minute": _lenient_whole(entry.get("rate"),
                                                                MAX_RATE_CELLS)})
    return pd.DataFrame(rows, columns=list(MODEL_LIMIT_COLUMNS)).astype(
        {"Model": str, "Cells at once": "int64", "Cells started per minute": "int64"})


def model_limits_editor_key(models: Sequence[str]) -> str:
    """The table's widget key, tied to its models.

    Another list of models is a new table (drawn from the values kept by model), so an edit
    never lands on another model's row.
    """
    import hashlib

    return "exp_model_limits_" + hashlib.sha1("\n".join(models).encode()).hexdigest()[:12]


def keep_model_limit_edits(state: MutableMapping[str, Any], key: str,
                           models: Sequence[str]) -> None:
    """Data-editor callback: keep the table's edited values by model (`MODEL_LIMITS_KEY`).

    ``models`` are the table's rows as drawn. Edits are whole values, so applying all of
    them again on each change is harmless; a cleared or bad cell counts 0 (none).
    """
    edits = state.get(key) or {}
    kept = {m: dict(v) for m, v in (state.get(MODEL_LIMITS_KEY) or {}).items()}
    for index, change in (edits.get("edited_rows") or {}).items():
        try:
            model = models[int(index)]
        except (IndexError, TypeError, ValueError):
            continue
        entry = kept.setdefault(model, {"limit": 0, "rate": 0})
        for column, field in _LIMIT_FIELDS.items():
            if column in change:
                most = MAX_CONCURRENCY if field == "limit" else MAX_RATE_CELLS
                entry[field] = _lenient_whole(change[column], most)
    state[MODEL_LIMITS_KEY] = kept


def _whole(value: Any, what: str, most: int) -> int:
    """A limit from session state: 0 (none) up to ``most`` (larger is ``most``).

    Raises:
        ValueError: Not a whole number of cells, or negative, named with ``what``.

    """
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            isinstance(value, float) and not value.is_integer()) or value < 0:
        msg = (f"{what} must be a whole number of cells from 0 (no limit) to {most}, "
               f"got {value!r}")
        raise ValueError(msg)
    return min(int(value), most)


def limits_from_state(state: Mapping[str, Any],
                      configurations: Sequence[ExperimentConfig]) -> dict[str, Any]:
    """The form's per-model and per-configuration limits for an experiment's run.

    Args:
        state: Session state: the Limits per model table's values (`MODEL_LIMITS_KEY`) and
            each configuration block's ``limit`` and ``rate`` (`config_key`).
        configurations: The configurations of the experiment about to run.

    Returns:
        `run_experiment`'s ``per_model``, ``model_rates``, ``per_config`` and
        ``config_rates`` (rates per minute: ``(n, 60.0)``); each None when empty. Zeros
        are dropped, and so are models the experiment does not use. The configuration
        blocks' limits are given by index only when ``configurations`` are exactly the
        form's, in its order (an experiment started from the form): an experiment whose
        configurations differ (a Resume of another one) gets none of them.

    Raises:
        ValueError: A limit that is not a whole number from 0, named (larger than the field
            allows is cut to its most).

    """
    used = set(form_models(configurations))
    per_model: dict[str, int] = {}
    model_rates: dict[str, tuple[int, float]] = {}
    for model, entry in (state.get(MODEL_LIMITS_KEY) or {}).items():
        if model not in used or not isinstance(entry, dict):
            continue
        if limit := _whole(entry.get("limit"), f"Cells at once for model {model}",
                           MAX_CONCURRENCY):
            per_model[model] = limit
        if rate := _whole(entry.get("rate"), f"Cells started per minute for model {model}",
                          MAX_RATE_CELLS):
            model_rates[model] = (rate, _PER_MINUTE_S)
    per_config: dict[int, int] = {}
    config_rates: dict[int, tuple[int, float]] = {}
    if list(configurations) == configs_from_state(state):
        for index in range(len(configurations)):
            where = f"configuration {index + 1}"
            if limit := _whole(state.get(config_key(index, "limit")),
                               f"Cells at once of {where}", MAX_CONCURRENCY):
                per_config[index] = limit
            if rate := _whole(state.get(config_key(index, "rate")),
                              f"Cells started per minute of {where}", MAX_RATE_CELLS):
                config_rates[index] = (rate, _PER_MINUTE_S)
    return {"per_model": per_model or None, "model_rates": model_rates or None,
            "per_config": per_config or None, "config_rates": config_rates or None}


def limits_text(limits: Mapping[str, Any],
                configurations: Sequence[ExperimentConfig]) -> str:
    """The limits of `limits_from_state` in one line (``""`` for none), for a caption."""
    parts: list[str] = []
    per_model, model_rates = limits.get("per_model") or {}, limits.get("model_rates") or {}
    for model in dict.fromkeys([*per_model, *model_rates]):
        parts.append(f"model {model} " + _limit_words(per_model.get(model),
                                                      model_rates.get(model)))
    per_config, config_rates = limits.get("per_config") or {}, limits.get("config_rates") or {}
    for index in sorted({*per_config, *config_rates}):
        name = f"configuration {index + 1} ({configurations[index].display_label()})"
        parts.append(f"{name} " + _limit_words(per_config.get(index), config_rates.get(index)))
    return "; ".join(parts)


def _limit_words(limit: int | None, rate: tuple[int, float] | None) -> str:
    words = [f"{limit} cell(s) at once"] if limit else []
    if rate:
        words.append(f"{rate[0]} started a minute")
    return ", ".join(words)


@dataclass(frozen=True)
class QueueView:
    """An experiment's queue state on the engine, as the page draws it."""

    headline: str
    """Counts (queued, running, done, cancelled), or why there are none."""
    workers: pd.DataFrame
    """Running cells per worker: ``worker`` (``pid N on HOST`` only) and ``running``."""
    active: bool
    """Whether a cell is queued or running."""


def queue_view(store: Store, experiment_id: str) -> QueueView:
    """The experiment's queue state read from the engine's tables (`queue_state`)."""
    from rubric_core.engine.status import NoEngineTables, queue_state

    empty = pd.DataFrame(columns=["worker", "running"])
    try:
        state = queue_state(store, experiment_id)
    except NoEngineTables:
        return QueueView("No experiment has run on the DBOS queues in this database yet.",
                         empty, active=False)
    except Exception as exc:  # a busy or lost database: the page still draws
        return QueueView(f"The queue state cannot be read now ({type(exc).__name__}); it is "
                         "read again as cells end, or on the next click.", empty, active=False)
    if not state.total:
        return QueueView("This experiment has not been queued on the DBOS queues.", empty,
                         active=False)
    headline = (f"{state.queued} queued · {state.running_total} running · {state.done} done · "
                f"{state.cancelled} cancelled")
    if state.failed:
        headline += f" · {state.failed} failed in the engine"
    workers = pd.DataFrame(
        [{"worker": w.worker + (" (this app)" if w.here else "")
          + (" (stopped: its cells are re-queued)" if w.gone else ""), "running": w.cells}
         for w in state.running], columns=["worker", "running"])
    return QueueView(headline, workers, active=state.active)


def stop_on_engine(store: Store, experiment_id: str) -> UiMessage:
    """Stop an experiment that another process drives on the engine (`stop_cells`).

    The experiment this app drives is stopped through `stop_experiment` instead, which also
    ends its driver here.
    """
    from rubric_core.engine.status import NoEngineTables, stop_cells

    try:
        count = stop_cells(store, experiment_id)
    except NoEngineTables:
        count = 0
    if not count:
        return UiMessage("info", "Nothing to stop: no cell of this experiment is queued or "
                                 "running on the DBOS queues.")
    return UiMessage("success", f"Stopped on the DBOS queues: {count} queued or running "
                                "cell(s) cancelled. Running cells end after their step; the "
                                "process driving the experiment records it stopped. Resume "
                                "queues them again.")


def progress_text(event: ExperimentProgress) -> tuple[float, str]:
    """Progress bar value and text for one configuration's progress event."""
    done, total = event["done"], max(event["total"], 1)
    parts = [f"{event['label']}: {done}/{event['total']} cells"]
    if event["satisfied_rate"] is not None:
        parts.append(f"{100 * event['satisfied_rate']:.0f}% satisfied")
    if event["errors"]:
        parts.append(f"{event['errors']} error(s)")
    if event["eta_s"] is not None and done < event["total"]:
        parts.append(f"ETA {event['eta_s']:.0f} s")
    return min(done / total, 1.0), " · ".join(parts)


def lost_database_message(progress: Mapping[int, ExperimentProgress]) -> UiMessage:
    """What the page says when the database went away during the experiment (``lost_database``).

    Args:
        progress: Each configuration's latest progress event of the session.

    """
    from rubric_core.engine.outage import experiment_cut_short

    left = sum(p["total"] - p["done"] for p in progress.values())
    if not left:
        return UiMessage("info", "The database went away for a moment during the experiment; "
                                 "every cell ended all the same.")
    total = sum(p["total"] for p in progress.values())
    return UiMessage("warning", experiment_cut_short(
        left, total, "Once the database is back, press Resume to continue them."))


def experiment_label(record: ExperimentRecord) -> str:
    """One line for the experiment picker.

    No status in it: the picker is drawn before a run on the page ends, so a status here would
    still say ``running`` afterwards; the caption under the results gives the status instead.
    """
    return (f"{record.name} · {record.dataset_name} v{record.dataset_version} · "
            f"{len(record.configurations)} config(s) · "
            f"{record.created_at[:16].replace('T', ' ')} · {record.experiment_id[:8]}")


def can_resume(record: ExperimentRecord) -> bool:
    """Whether Resume is offered: not finished and not being run by this process."""
    return record.status != "finished" and not experiment_active(record.experiment_id)


def delete_experiment(store: Store, record: ExperimentRecord) -> UiMessage:
    """Delete an experiment and its cells, unless it is running here or on another worker.

    Its runs stay in the run index, so Review still opens them.
    """
    if experiment_active(record.experiment_id):
        return UiMessage("error", "Not deleted: this experiment is running in this app. Stop it "
                                  "first.")
    try:
        deleted = store.delete_experiment(record.experiment_id,
                                          stale_before=stale_before(store.now()))
    except ValueError as exc:
        return UiMessage("error", f"Not deleted: {exc}.")
    if not deleted:
        return UiMessage("warning", "That experiment was already deleted (by another session?).")
    return UiMessage("success", f"Deleted experiment {record.name!r} "
                                f"({record.experiment_id[:8]}); its runs stay in Review.")


def failed_cells(results: ExperimentResults) -> list[tuple[str, int, int]]:
    """Keys of the cells that ended ``error`` or ``grader_error`` (each retryable alone)."""
    return [c.key for c in results.cells if c.status in ERROR_STATUSES]


def cell_label(results: ExperimentResults, key: tuple[str, int, int]) -> str:
    """One line for a cell: row, configuration, repeat."""
    row_id, index, repeat = key
    text = f"row {row_id} · {config_column(results, index)}"
    return text + (f" · repeat {repeat + 1}" if results.experiment.repeats > 1 else "")


# -- results --------------------------------------------------------------------------------------


def config_column(results: ExperimentResults, index: int) -> str:
    """A configuration's column name: numbered, since two labels may be equal."""
    return f"{index + 1}. {results.experiment.configurations[index].display_label()}"


def _cell_text(cell: CellOutcome) -> str:
    parts = [cell.status]
    if cell.run_id is not None:
        parts.append(f"{cell.iterations} pass{'es' if cell.iterations != 1 else ''}")
        if (tokens := token_sum(cell.input_tokens, cell.output_tokens)) is not None:
            parts.append(f"{tokens} tok")
        if cell.duration_s is not None:
            parts.append(f"{cell.duration_s:.1f} s")
    return " · ".join(parts)


@dataclass(frozen=True)
class ResultsGrid:
    """Dataset rows × configurations: what each cell shows and which run it opens."""

    table: pd.DataFrame
    """Cell texts: status, passes, tokens and duration, one column per configuration."""
    run_ids: pd.DataFrame
    """The same shape: each cell's run id (None before it ran)."""


def results_grid(results: ExperimentResults) -> ResultsGrid:
    """The results grid, rows in dataset order (a ``row`` column; ``repeat`` with repeats)."""
    columns = [config_column(results, i) for i in range(len(results.experiment.configurations))]
    repeats = results.experiment.repeats > 1
    # One pass over the cells straight into columns: no per-cell pandas work, few objects.
    position: dict[tuple[str, int], int] = {}
    texts: list[list[str | None]] = [[] for _ in columns]
    runs: list[list[str | None]] = [[] for _ in columns]
    for cell in results.cells:
        key = (cell.row_id, cell.repeat_index if repeats else 0)
        at = position.get(key)
        if at is None:
            at = position[key] = len(position)
            for column in (*texts, *runs):
                column.append(None)
        texts[cell.config_index][at] = _cell_text(cell)
        runs[cell.config_index][at] = cell.run_id
    heads: dict[str, list[Any]] = {"row": [row for row, _ in position]}
    if repeats:
        heads["repeat"] = [repeat + 1 for _, repeat in position]
    table = pd.DataFrame({**heads, **dict(zip(columns, texts, strict=True))})
    run_ids = pd.DataFrame({**heads, **dict(zip(columns, runs, strict=True))})
    return ResultsGrid(table, run_ids)


def picked_cell(selection: Any, grid: ResultsGrid) -> str | None:
    """The run id of the cell selected in a single-cell ``st.dataframe`` selection, or None."""
    try:
        row, column = selection["selection"]["cells"][0]
        value = grid.run_ids.iloc[int(row)][str(column)]
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return value if isinstance(value, str) and value else None


@dataclass(frozen=True)
class ComparisonView:
    """Two configurations compared on the rows both ended."""

    flips: pd.DataFrame
    """One row per flipped row: ``row`` and ``change`` (pass → fail or fail → pass)."""
    headline: str
    """Counts and McNemar's exact p in one line."""
    meaning: str
    """What the p-value means, in one line."""


def comparison_view(results: ExperimentResults, a: int, b: int) -> ComparisonView:
    """Rows that flipped between configurations ``a`` and ``b``, and McNemar's exact p."""
    cmp = results.compare(a, b)
    flips = pd.DataFrame(
        [{"row": r, "change": "pass → fail"} for r in cmp.broken]
        + [{"row": r, "change": "fail → pass"} for r in cmp.fixed], columns=["row", "change"])
    headline = (f"{cmp.n} row(s) ended under both: {cmp.both_pass} pass under both, "
                f"{cmp.both_fail} fail under both, {len(cmp.broken)} pass → fail, "
                f"{len(cmp.fixed)} fail → pass. McNemar's exact p = {cmp.p_value:.3g}.")
    meaning = ("p is the chance of flips at least this lopsided if the two configurations were "
               "equally good: small (say < 0.05) means the difference is unlikely to be luck; "
               "large means these rows cannot tell them apart.")
    return ComparisonView(flips, headline, meaning)


# -- downloads ------------------------------------------------------------------------------------


def export_data(store: Store, experiment_id: str, fmt: str,
                prices: Prices | None = None) -> Callable[[], bytes]:
    """A callable for ``st.download_button(data=...)``: the full experiment as CSV or JSON.

    Called only when the button is pressed, on Streamlit's download thread. Rows are streamed
    (`export_experiment_rows`) into a temporary file that spills to disk past 8 MB; Streamlit
    then holds the finished file's bytes to serve them.
    """

    def build() -> bytes:
        columns = export_columns(store, experiment_id)
        writer = write_csv if fmt == "csv" else write_json
        with tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024, mode="w+b") as out:
            text = io.TextIOWrapper(out, encoding="utf-8", newline="")
            writer(export_experiment_rows(store, experiment_id, prices=prices), text, columns)
            text.flush()
            text.detach()
            out.seek(0)
            return out.read()

    return build


def summary_csv(store: Store, experiment_id: str,
                prices: Prices | None = None) -> Callable[[], str]:
    """A callable for ``st.download_button(data=...)``: the summary as formula-safe CSV.

    Like `export_data`, read only when the button is pressed.
    """

    def build() -> str:
        buf = io.StringIO(newline="")
        results = experiment_results(store, experiment_id)
        costs = experiment_cost(store, prices or Prices(), results.experiment)
        write_csv(summary_rows(results, costs), buf, SUMMARY_COLUMNS)
        return buf.getvalue()

    return build


__all__ = [
    "MAX_CONCURRENCY", "MAX_CONFIGS", "MAX_RATE_CELLS", "MAX_REPEATS", "MODEL_LIMITS_KEY",
    "MODEL_LIMIT_COLUMNS", "RATE_PERIODS", "ComparisonView", "QueueView", "ResultsGrid",
    "StoredDataset", "can_resume", "cell_label", "check_configs", "comparison_view",
    "config_column", "config_key", "configs_from_state", "dataset_name_for", "dataset_preview",
    "datasets_frame", "delete_dataset", "experiment_active", "experiment_label", "export_data",
    "failed_cells", "form_defaults", "form_models", "import_dataset", "import_demo_dataset",
    "keep_form", "keep_model_limit_edits", "limits_from_state", "limits_text",
    "live_experiment", "lost_database_message", "model_limits_editor_key",
    "model_limits_frame", "new_experiment", "picked_cell", "progress_text", "queue_view",
    "rate_limit_from_state", "results_grid",
    "stop_experiment", "stop_on_engine", "stored_dataset", "summary_csv",
    "wait_experiment_inactive",
]
