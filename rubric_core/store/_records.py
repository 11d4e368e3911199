"""What the store's reads return, and the mappers between them and rows, by column name.

One frozen record per thing the store keeps (`RunRecord`, `DatasetInfo`, `ExperimentRecord`,
`CellRecord`, `CellOutcome` for the lean result tables and `EarlierRun`; for the lab `AnswerItem`,
`ItemLabel`, `AnswerSetInfo`, `RegradeJob` and `RegradeResult`), and one mapper per row shape. Rows
are read by column name (``sqlite3.Row`` and the PostgreSQL backend's rows both allow it), so a
query may select its columns in any order, and a join names the columns it would otherwise
share (``cell_thread_id``). Evaluations and labels travel as the TypedDicts of
`rubric_core.types`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from rubric_core.grader_settings import GraderConfig
from rubric_core.settings import ExperimentConfig, RunSettings
from rubric_core.types import CELL_PENDING

if TYPE_CHECKING:
    from rubric_core.types import CriterionLabel, CriterionVerdict, RubricEvaluation

__all__ = [
    "CALL_USAGE_COLUMNS",
    "EVALUATION_COLUMNS",
    "RUN_COLUMNS",
    "AnswerItem",
    "AnswerSetInfo",
    "CallUsage",
    "CellOutcome",
    "CellRecord",
    "DatasetInfo",
    "EarlierRun",
    "ExperimentRecord",
    "ItemLabel",
    "PassVerdicts",
    "RegradeJob",
    "RegradeResult",
    "RunRecord",
    "answer_item_from_row",
    "answer_set_info_from_row",
    "cell_from_row",
    "dataset_info_from_row",
    "evaluation_from_row",
    "experiment_from_row",
    "item_label_from_row",
    "label_from_row",
    "named_rows",
    "outcome_from_row",
    "regrade_job_from_row",
    "regrade_result_from_row",
    "run_from_row",
    "run_to_row",
]

_PROMPT_COLUMNS = ("worker_system_prompt", "grader_system_prompt", "grader_tools")
"""Run columns added in schema 2: NULL in rows stored before, which did not record them."""

RUN_COLUMNS = ("run_id", "thread_id", "title", "prompt", "rubric", "worker_model",
               "grader_model", "max_iterations", "status", "created_at", "updated_at",
               "duration_s", "iterations", "input_tokens", "output_tokens", "error",
               *_PROMPT_COLUMNS, "settings_json", "owner", "cached_input_tokens")
"""The ``runs`` columns a `RunRecord` is read from and written to (not ``search_text``)."""

EVALUATION_COLUMNS = frozenset({
    "grading_run_id", "iteration", "result", "explanation", "criteria", "status", "unverified",
    "duration_s", "input_tokens", "output_tokens", "answer"})
"""Evaluation keys with a column of their own; every other key is kept in ``extra_json``."""


@dataclasses.dataclass(frozen=True, slots=True, init=False)
class RunRecord:
    """One row of the run index: the run's lifecycle and its settings.

    :attr:`settings` is the run's description; ``title``, ``prompt``, ``rubric``, the models,
    ``max_iterations``, the system prompts and ``grader_tools`` are read from it (the index
    keeps copies of them as columns, for Review's filters).

    Built keyword-only, from ``settings`` or, instead, from those columns by name
    (``title=..., prompt=..., ...``; `RunSettings.from_columns` derives the settings).
    """

    run_id: str
    """Unique id of the run (uuid4 hex)."""
    thread_id: str
    """LangGraph thread whose checkpoints hold the run's state."""
    settings: RunSettings
    """The run's whole description; for rows stored before schema 3 (and records built from
    columns), derived from the columns (`RunSettings.from_columns`)."""
    status: str
    """One of `rubric_core.types.RUN_STATUSES`."""
    created_at: str
    """ISO 8601 UTC timestamp of creation."""
    updated_at: str
    """ISO 8601 UTC timestamp of the last change."""
    duration_s: float | None
    """Wall-clock seconds of the whole run, once finished."""
    iterations: int
    """Evaluations recorded so far."""
    input_tokens: int | None
    """Grader input tokens summed over evaluations (None when never reported)."""
    output_tokens: int | None
    """Grader output tokens summed over evaluations (None when never reported)."""
    error: str | None
    """Error message for runs that ended in ``error``."""
    owner: str | None = None
    """Who records the run now (``host:pid:id`` of a session); None for runs stored before
    schema 7 or by scripts. Only the owner's heartbeat, evaluations and ending are written."""
    cached_input_tokens: int | None = None
    """Of `input_tokens`, those the grader's provider read from its prompt cache, summed over
    evaluations (None when never reported, and for runs stored before schema 9)."""
    prompts_recorded: bool = True
    """False for runs stored before schema 2, which did not record their system prompts and
    grader tools: `settings` holds defaults derived for them, and `worker_system_prompt`,
    `grader_system_prompt` and `grader_tools` are None."""
    observed_at: str | None = dataclasses.field(default=None, compare=False)
    """When the store read this record, by the database's clock (`Store.now`); not a column.
    With `updated_at` it tells how long ago the run's owner last beat."""

    def __init__(self, *, run_id: str, thread_id: str, status: str, created_at: str,
                 updated_at: str, duration_s: float | None, iterations: int,
                 input_tokens: int | None, output_tokens: int | None, error: str | None,
                 settings: RunSettings | None = None, owner: str | None = None,
                 prompts_recorded: bool | None = None, observed_at: str | None = None,
                 cached_input_tokens: int | None = None, **columns: Any) -> None:
        if settings is None:
            recorded = any(columns.get(name) is not None for name in _PROMPT_COLUMNS)
            settings = RunSettings.from_columns(**{**dict.fromkeys(_PROMPT_COLUMNS), **columns})
        elif columns:
            msg = f"give a run record settings or its columns, not both (got {sorted(columns)})"
            raise TypeError(msg)
        else:
            recorded = True if prompts_recorded is None else prompts_recorded
        values = {"run_id": run_id, "thread_id": thread_id, "settings": settings,
                  "status": status, "created_at": created_at, "updated_at": updated_at,
                  "duration_s": duration_s, "iterations": iterations,
                  "input_tokens": input_tokens, "output_tokens": output_tokens, "error": error,
                  "owner": owner, "prompts_recorded": recorded, "observed_at": observed_at,
                  "cached_input_tokens": cached_input_tokens}
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @property
    def title(self) -> str:
        """Short human label."""
        return self.settings.title

    @property
    def prompt(self) -> str:
        """What the worker was asked."""
        return self.settings.prompt

    @property
    def rubric(self) -> str:
        """The rubric text the run was graded against."""
        return self.settings.rubric

    @property
    def worker_model(self) -> str:
        """``provider:model`` of the worker agent."""
        return self.settings.worker_model

    @property
    def grader_model(self) -> str:
        """``provider:model`` of the grader."""
        return self.settings.grader_model

    @property
    def max_iterations(self) -> int:
        """Cap on grader passes."""
        return self.settings.max_iterations

    @property
    def worker_system_prompt(self) -> str | None:
        """The worker's system prompt (``""`` for none); None for runs stored before it was kept."""
        return self.settings.worker_system_prompt if self.prompts_recorded else None

    @property
    def grader_system_prompt(self) -> str | None:
        """A custom grader prompt (``""`` for the built-in one); None when not recorded."""
        return self.settings.grader_system_prompt if self.prompts_recorded else None

    @property
    def grader_tools(self) -> tuple[str, ...] | None:
        """Names of the evidence tools the grader was given; None when not recorded."""
        return self.settings.grader_tools if self.prompts_recorded else None


@dataclasses.dataclass(frozen=True, slots=True)
class DatasetInfo:
    """One stored version of a dataset (without its rows)."""

    name: str
    """The dataset's name."""
    version: int
    """1 for the first version stored under the name."""
    row_count: int
    """Rows in this version."""
    columns: tuple[str, ...]
    """The columns as read, in order."""
    created_at: str
    """ISO 8601 UTC timestamp of when the version was stored."""


@dataclasses.dataclass(frozen=True, slots=True)
class ExperimentRecord:
    """An experiment: a stored dataset version × configurations × repeats."""

    experiment_id: str
    """Unique id (uuid4 hex)."""
    name: str
    """Short human label."""
    dataset_name: str
    """The dataset's name."""
    dataset_version: int
    """The dataset version its cells run."""
    configurations: tuple[ExperimentConfig, ...]
    """The configurations, in order; a cell's ``config_index`` points here."""
    repeats: int
    """Runs of each row under each configuration."""
    status: str
    """One of `rubric_core.types.EXPERIMENT_STATUSES`."""
    created_at: str
    """ISO 8601 UTC timestamp of creation."""
    updated_at: str
    """ISO 8601 UTC timestamp of the last status change."""
    budget: dict[str, Any] | None = None
    """The budget its last Start or Resume gave (`rubric_core.experiments.budget.Budget`'s
    JSON form), or None."""


@dataclasses.dataclass(frozen=True, slots=True)
class CellRecord:
    """One cell of an experiment: a dataset row under one configuration, one repeat."""

    experiment_id: str
    """The experiment."""
    row_id: str
    """The dataset row's id."""
    config_index: int
    """0-based index into `ExperimentRecord.configurations`."""
    repeat_index: int
    """0-based repeat."""
    thread_id: str
    """The LangGraph thread the cell's run uses (fixed when the experiment is created)."""
    run: RunRecord | None
    """The cell's run (the latest on its thread), or None before it started."""

    @property
    def status(self) -> str:
        """The run's stored status, or ``pending`` (`rubric_core.types.CELL_PENDING`)."""
        return self.run.status if self.run is not None else CELL_PENDING

    @property
    def key(self) -> tuple[str, int, int]:
        """``(row_id, config_index, repeat_index)``: the cell's identity in its experiment."""
        return self.row_id, self.config_index, self.repeat_index


PassVerdicts = tuple[str, list["CriterionVerdict"]]
"""One grader pass as the result tables read it: its result and its criterion verdicts."""


class EarlierRun(NamedTuple):
    """A run an experiment paid for that is no longer a cell's run (a retry replaced it)."""

    run_id: str
    """The run."""
    row_id: str
    """Its cell's dataset row."""
    config_index: int
    """Its cell's configuration."""
    repeat_index: int
    """Its cell's repeat."""
    iterations: int
    """Evaluations it recorded (a run with some and no recorded calls costs "unknown")."""


class CellOutcome(NamedTuple):
    """A cell as the result tables read it: its run's totals and its last grading run's passes.

    What `Store.cell_outcomes` returns: unlike `CellRecord`, no `RunSettings` is decoded and
    no answer or explanation is read (most of what a cell costs to read), so an experiment of
    thousands of cells is read in one query. A named tuple, not a dataclass: a read builds
    thousands, and a tuple is built in a third of the time.
    """

    row_id: str
    """The dataset row's id."""
    config_index: int
    """0-based index into `ExperimentRecord.configurations`."""
    repeat_index: int
    """0-based repeat."""
    run_id: str | None
    """The cell's run (the latest on its thread), or None before it started."""
    status: str
    """The run's status, or ``pending`` (`rubric_core.types.CELL_PENDING`)."""
    iterations: int
    """Evaluations the run recorded, over all its grading runs (0 before it started)."""
    input_tokens: int | None
    """The run's grader input tokens (None when never reported)."""
    output_tokens: int | None
    """The run's grader output tokens (None when never reported)."""
    duration_s: float | None
    """Wall-clock seconds of the run, once finished."""
    passes: tuple[PassVerdicts, ...] = ()
    """With ``verdicts=True``: the passes of the run's last grading run, in order (empty before
    it graded anything, and without ``verdicts``)."""
    cached_input_tokens: int | None = None
    """Of the run's grader input tokens, those read from a prompt cache (None: not reported)."""

    @property
    def key(self) -> tuple[str, int, int]:
        """``(row_id, config_index, repeat_index)``: the cell's identity in its experiment."""
        return self.row_id, self.config_index, self.repeat_index


# -- rows -> records ------------------------------------------------------------------------------


class CallUsage(NamedTuple):
    """A model call's numbers only, as costs read them (`Store.call_usage_for_runs`).

    No messages or reply are read: pricing the calls of a thousand runs reads a few columns.
    """

    run_id: str
    """The run the call was made for."""
    role: str
    """``worker`` or ``grader`` (`rubric_core.types.CallRole`)."""
    iteration: int
    """0-based grader pass the call belongs to."""
    status: str
    """``ok`` or ``error``."""
    started_at: str
    """ISO 8601 UTC time the call started (prices change over time)."""
    input_tokens: int | None
    """Input tokens, cached ones included (None when not reported)."""
    cached_input_tokens: int | None
    """Of those, read from the provider's prompt cache."""
    cache_creation_tokens: int | None
    """Of those, written to the provider's prompt cache."""
    output_tokens: int | None
    """Output tokens (None when not reported)."""


CALL_USAGE_COLUMNS = CallUsage._fields
"""`CallUsage`'s columns of ``model_calls``, in field order."""


def named_rows(cursor: Any) -> list[dict[str, Any]]:
    """A cursor's remaining rows as dicts by column name, for reads of many rows.

    A ``sqlite3.Row`` finds a name by scanning its columns: read by name, a result of thousands
    of rows costs several times what one dict per row does.
    """
    names = [column[0] for column in cursor.description or ()]
    return [dict(zip(names, row, strict=True)) for row in cursor]


def run_from_row(row: Any, observed_at: str | None = None) -> RunRecord:
    """A ``runs`` row (at least the `RUN_COLUMNS`) as a record read at ``observed_at``."""
    lifecycle = {
        "run_id": row["run_id"], "thread_id": row["thread_id"], "status": row["status"],
        "created_at": row["created_at"], "updated_at": row["updated_at"],
        "duration_s": row["duration_s"], "iterations": row["iterations"],
        "input_tokens": row["input_tokens"], "output_tokens": row["output_tokens"],
        "error": row["error"], "owner": row["owner"], "observed_at": observed_at,
        "cached_input_tokens": row["cached_input_tokens"],
    }
    if row["settings_json"] is not None:
        return RunRecord(**lifecycle, settings=RunSettings.from_json(row["settings_json"]))
    tools = row["grader_tools"]
    return RunRecord(  # a row stored before schema 3: settings from its columns
        **lifecycle, title=row["title"], prompt=row["prompt"], rubric=row["rubric"],
        worker_model=row["worker_model"], grader_model=row["grader_model"],
        max_iterations=row["max_iterations"], worker_system_prompt=row["worker_system_prompt"],
        grader_system_prompt=row["grader_system_prompt"],
        grader_tools=None if tools is None else tuple(json.loads(tools)),
    )


def run_to_row(record: RunRecord) -> dict[str, Any]:
    """A record as the values of its ``runs`` row, by column (the inverse of `run_from_row`)."""
    settings = record.settings
    tools = record.grader_tools
    return {
        "run_id": record.run_id, "thread_id": record.thread_id, "title": settings.title,
        "prompt": settings.prompt, "rubric": settings.rubric,
        "worker_model": settings.worker_model, "grader_model": settings.grader_model,
        "max_iterations": settings.max_iterations, "status": record.status,
        "created_at": record.created_at, "updated_at": record.updated_at,
        "duration_s": record.duration_s, "iterations": record.iterations,
        "input_tokens": record.input_tokens, "output_tokens": record.output_tokens,
        "error": record.error, "worker_system_prompt": record.worker_system_prompt,
        "grader_system_prompt": record.grader_system_prompt,
        "grader_tools": None if tools is None else json.dumps(list(tools), ensure_ascii=False),
        "settings_json": settings.to_json(), "owner": record.owner,
        "cached_input_tokens": record.cached_input_tokens,
    }


def evaluation_from_row(row: Any) -> RubricEvaluation:
    """An ``evaluations`` row as the evaluation the middleware recorded."""
    extra = json.loads(row["extra_json"]) if row["extra_json"] else {}
    return cast(
        "RubricEvaluation",
        {
            **{k: v for k, v in extra.items() if k not in EVALUATION_COLUMNS},
            "grading_run_id": row["grading_run_id"],
            "iteration": row["iteration"],
            "result": row["result"],
            "explanation": row["explanation"],
            "criteria": json.loads(row["criteria_json"]),
            "status": row["status"],
            "unverified": bool(row["unverified"]),
            "duration_s": row["duration_s"],
            "input_tokens": row["input_tokens"],
            "output_tokens": row["output_tokens"],
            "answer": row["answer"],
        },
    )


def label_from_row(row: Any) -> CriterionLabel:
    """A ``labels`` row as a label."""
    return cast(
        "CriterionLabel",
        {
            "run_id": row["run_id"], "seq": int(row["seq"]), "criterion": row["criterion"],
            "labeller": row["labeller"], "agree": bool(row["agree"]),
            "correct": None if row["correct"] is None else bool(row["correct"]),
            "note": row["note"], "created_at": row["created_at"],
            "updated_at": row["updated_at"],
        },
    )


def dataset_info_from_row(row: Any) -> DatasetInfo:
    """A ``datasets`` row (without its ``jsonl``) as a version's description."""
    return DatasetInfo(name=row["name"], version=int(row["version"]),
                       row_count=int(row["row_count"]),
                       columns=tuple(json.loads(row["columns_json"])),
                       created_at=row["created_at"])


def experiment_from_row(row: Any) -> ExperimentRecord:
    """An ``experiments`` row as a record."""
    configs = tuple(ExperimentConfig.from_dict(c) for c in json.loads(row["configs_json"]))
    return ExperimentRecord(
        experiment_id=row["experiment_id"], name=row["name"], dataset_name=row["dataset_name"],
        dataset_version=int(row["dataset_version"]), configurations=configs,
        repeats=int(row["repeats"]), status=row["status"], created_at=row["created_at"],
        updated_at=row["updated_at"],
        budget=json.loads(row["budget_json"]) if _has(row, "budget_json") else None,
    )


def _has(row: Any, column: str) -> bool:
    """Whether ``row`` has a non-NULL ``column`` (a row read before it existed has none)."""
    try:
        return row[column] is not None
    except (IndexError, KeyError):
        return False


def cell_from_row(row: Any, experiment_id: str, observed_at: str | None = None) -> CellRecord:
    """A cell joined with its run's `RUN_COLUMNS` (NULL before it started) as a record.

    The cell's own thread is read as ``cell_thread_id``: the run's is ``thread_id``.
    """
    run = run_from_row(row, observed_at) if row["run_id"] is not None else None
    return CellRecord(experiment_id=experiment_id, row_id=row["row_id"],
                      config_index=row["config_index"], repeat_index=row["repeat_index"],
                      thread_id=row["cell_thread_id"], run=run)


def outcome_from_row(row: Any, passes: tuple[PassVerdicts, ...] = ()) -> CellOutcome:
    """A cell joined with its run's totals (NULL before it started) as an outcome."""
    started = row["run_id"] is not None
    return CellOutcome(row["row_id"], row["config_index"], row["repeat_index"], row["run_id"],
                       row["status"] if started else CELL_PENDING, row["iterations"] or 0,
                       row["input_tokens"], row["output_tokens"], row["duration_s"], passes,
                       row["cached_input_tokens"])


# -- the rubric lab (schema 8): answer sets and re-grades ----------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class AnswerItem:
    """One fixed answer of an answer set: what was asked, what was answered, where it came from."""

    id: str
    """Unique within its set (an upload's ``id`` column, a run id, a cell and pass)."""
    request: str
    """What the answer was written for (the grader's ``<request>``)."""
    answer: str
    """The answer to grade (the grader's ``<answer>``)."""
    rubric: str | None = None
    """The rubric the answer was first graded with, when it came from a run; not used to grade."""
    origin: str = "upload"
    """Where it came from: ``upload``, ``bundled``, ``run:<run id>`` or
    ``experiment:<id>:<row>:<config>:<repeat>[:pass <n>]``."""


@dataclasses.dataclass(frozen=True, slots=True)
class ItemLabel:
    """A person's verdict on one criterion of one answer of a set."""

    item_id: str
    """The answer's id in its set."""
    criterion: str
    """The criterion as the person labelled it."""
    labeller: str
    """Who labelled it."""
    passed: bool
    """The person's verdict (True: the answer meets the criterion)."""
    note: str = ""
    """The person's reason, if any."""


@dataclasses.dataclass(frozen=True, slots=True)
class AnswerSetInfo:
    """One stored version of an answer set (without its items)."""

    name: str
    """The set's name."""
    version: int
    """1 for the first version stored under the name."""
    source: str
    """How it was made (``upload``, ``bundled``, ``runs``, ``experiment <id>``)."""
    item_count: int
    """Answers in this version."""
    label_count: int
    """People's verdicts in this version."""
    created_at: str
    """ISO 8601 UTC timestamp of when the version was stored."""


@dataclasses.dataclass(frozen=True, slots=True)
class RegradeJob:
    """A re-grade: a stored answer set version × grader configurations."""

    job_id: str
    """Unique id (uuid4 hex)."""
    name: str
    """Short human label."""
    set_name: str
    """The answer set's name."""
    set_version: int
    """The answer set version it grades."""
    configurations: tuple[Any, ...]
    """The grader configurations (`rubric_core.lab.GraderConfig`), in order; a result's
    ``config_index`` points here. Configurations are only ever appended."""
    status: str
    """One of `rubric_core.types.EXPERIMENT_STATUSES` (the same lifecycle as an experiment)."""
    created_at: str
    """ISO 8601 UTC timestamp of creation."""
    updated_at: str
    """ISO 8601 UTC timestamp of the last status change."""


class RegradeResult(NamedTuple):
    """One grading of one answer under one configuration (one repeat), as stored once.

    A named tuple: a health table reads thousands. The answer's text is not in it (read the
    items for that).
    """

    config_index: int
    """0-based index into `RegradeJob.configurations`."""
    item_id: str
    """The answer's id in its set."""
    repeat_index: int
    """0-based repeat (``GraderConfig.grader_repeats`` of them per item)."""
    result: str
    """The grader's verdict (``satisfied``, ``needs_revision``, ``failed``) or
    ``grader_error``."""
    explanation: str
    """The grader's summary, or the error."""
    criteria: list[CriterionVerdict]
    """Per-criterion verdicts in rubric order (empty for ``grader_error``)."""
    missing: list[str]
    """Criteria the grader left out even after a correction (not verified)."""
    error: str | None
    """The error of a ``grader_error`` (retryable)."""
    input_tokens: int | None
    """Grader input tokens, where the provider reports usage."""
    output_tokens: int | None
    """Grader output tokens, where the provider reports usage."""
    duration_s: float | None
    """Wall-clock seconds of the grading pass."""
    cached_input_tokens: int | None = None
    """Of `input_tokens`, those read from the provider's prompt cache (0 when usage came
    without it); None when no usage was reported, and for gradings recorded before schema 12
    (they are priced as uncached)."""

    @property
    def key(self) -> tuple[int, str, int]:
        """``(config_index, item_id, repeat_index)``: its identity in its job."""
        return self.config_index, self.item_id, self.repeat_index


def answer_item_from_row(row: Any) -> AnswerItem:
    """An ``answer_items`` row as an item."""
    return AnswerItem(id=row["item_id"], request=row["request"], answer=row["answer"],
                      rubric=row["rubric"], origin=row["origin"])


def item_label_from_row(row: Any) -> ItemLabel:
    """An ``answer_labels`` row as a label."""
    return ItemLabel(item_id=row["item_id"], criterion=row["criterion"],
                     labeller=row["labeller"], passed=bool(row["passed"]), note=row["note"])


def answer_set_info_from_row(row: Any) -> AnswerSetInfo:
    """An ``answer_sets`` row as a version's description."""
    return AnswerSetInfo(name=row["name"], version=int(row["version"]), source=row["source"],
                         item_count=int(row["item_count"]),
                         label_count=int(row["label_count"]), created_at=row["created_at"])


def regrade_job_from_row(row: Any) -> RegradeJob:
    """A ``regrade_jobs`` row as a record."""
    configs = tuple(GraderConfig.from_dict(c) for c in json.loads(row["configs_json"]))
    return RegradeJob(job_id=row["job_id"], name=row["name"], set_name=row["set_name"],
                      set_version=int(row["set_version"]), configurations=configs,
                      status=row["status"], created_at=row["created_at"],
                      updated_at=row["updated_at"])


def regrade_result_from_row(row: Any) -> RegradeResult:
    """A ``regrade_results`` row as a result."""
    return RegradeResult(int(row["config_index"]), row["item_id"], int(row["repeat_index"]),
                         row["result"], row["explanation"], json.loads(row["criteria_json"]),
                         json.loads(row["missing_json"]), row["error"], row["input_tokens"],
                         row["output_tokens"], row["duration_s"], row["cached_input_tokens"])
