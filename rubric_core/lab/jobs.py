"""Creating re-grades: an answer set × grader configurations, checked and stored; nothing runs.

`create_regrade` stores the answer set (when given one) and the re-grade; `add_config` appends
a configuration to a re-grade (a new rubric version graded on the same answers);
`retry_errors` makes the gradings that ended ``grader_error`` run again; `job_progress` is where
a stored re-grade stands, read lean (counts only), for a page that is not running it. `run_regrade`
(`rubric_core.lab.regrade`) does the grading.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rubric_core.lab.answers import AnswerSet
from rubric_core.session import build_grader_tools
from rubric_core.types import MAX_CELLS

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rubric_core.lab.config import GraderConfig
    from rubric_core.lab.types import RegradeProgress
    from rubric_core.store import RegradeJob, Store
    from rubric_core.types import ModelResolver

MAX_CONFIGS = 20
"""Most grader configurations one re-grade holds."""


def check_config(config: GraderConfig, models: ModelResolver | None = None) -> None:
    """Refuse a configuration that cannot grade: bad values, unknown tools, an unbuildable model.

    Args:
        config: The configuration.
        models: Builds the grader to check it (nothing is called); skipped when None.

    Raises:
        ValueError: A bad value or an unknown grader tool.
        ModelConfigError: The grader model cannot be built.

    """
    config.validate()
    build_grader_tools(config.grader_tools)
    if models is not None:
        models(config.grader_model, "grader", config.base_url)


def create_regrade(
    store: Store,
    answers: AnswerSet | str,
    configurations: Sequence[GraderConfig],
    *,
    name: str = "",
    set_version: int | None = None,
    models: ModelResolver | None = None,
) -> RegradeJob:
    """Check and store a re-grade of an answer set under grader configurations.

    Args:
        store: The database.
        answers: A checked answer set (stored as a new version unless unchanged) or a stored
            set's name.
        configurations: One to `MAX_CONFIGS` grader configurations.
        name: A label (the set's name when empty).
        set_version: With a stored name: that version (the latest when None).
        models: Builds each grader to check it (`rubric_core.models.model_resolver` builds
            them); skipped when None.

    Raises:
        ValueError: No or too many configurations, a configuration that cannot grade, more
            than `rubric_core.types.MAX_CELLS` gradings. Nothing is stored.
        KeyError: No such stored answer set.
        ModelConfigError: A grader cannot be built. Nothing is stored.

    """
    if not configurations or len(configurations) > MAX_CONFIGS:
        msg = (f"a re-grade needs 1 to {MAX_CONFIGS} grader configurations, got "
               f"{len(configurations)}")
        raise ValueError(msg)
    for config in configurations:
        check_config(config, models)
    if isinstance(answers, AnswerSet):
        count = len(answers.items)
        gradings = count * sum(c.grader_repeats for c in configurations)
        if gradings > MAX_CELLS:
            raise _too_many(gradings)
        set_name = answers.name
        set_version = store.save_answer_set(answers)
    else:
        set_name = answers
        info = store.answer_set_info(answers, set_version)
        set_version = info.version
        gradings = info.item_count * sum(c.grader_repeats for c in configurations)
        if gradings > MAX_CELLS:
            raise _too_many(gradings)
    return store.create_regrade_job(name=name, set_name=set_name, set_version=set_version,
                                    configurations=configurations)


def _too_many(gradings: int) -> ValueError:
    return ValueError(f"the re-grade would make {gradings:,} gradings; the limit is "
                      f"{MAX_CELLS:,}: use fewer answers, configurations or repeats")


def add_config(store: Store, job_id: str, config: GraderConfig,
               models: ModelResolver | None = None) -> int:
    """Append a configuration to a re-grade, to grade the same answers under it.

    Returns:
        The new configuration's index.

    Raises:
        KeyError: No such re-grade.
        ValueError: The configuration cannot grade, or the re-grade holds `MAX_CONFIGS`.

    """
    job = store.get_regrade_job(job_id)
    if job is None:
        msg = f"no re-grade {job_id!r} in this database"
        raise KeyError(msg)
    if len(job.configurations) >= MAX_CONFIGS:
        msg = f"re-grade {job_id[:8]} already holds {MAX_CONFIGS} configurations: start another"
        raise ValueError(msg)
    check_config(config, models)
    return store.add_regrade_config(job_id, config)


def retry_errors(store: Store, job_id: str, *, config_index: int | None = None,
                 item_id: str | None = None) -> int:
    """Forget the gradings that ended ``grader_error`` so the next `run_regrade` grades them.

    Args:
        store: The database.
        job_id: The re-grade.
        config_index: Only this configuration's.
        item_id: Only this answer's.

    Returns:
        How many gradings will run again.

    """
    return store.delete_regrade_errors(job_id, config_index=config_index, item_id=item_id)


def job_progress(store: Store, job_id: str) -> list[RegradeProgress]:
    """Where each configuration of a re-grade stands, from two counting queries.

    The same events `run_regrade` sends, with no ETA: for a page showing a re-grade it is not
    running (or one another process runs).

    Raises:
        KeyError: No such re-grade.

    """
    job = store.get_regrade_job(job_id)
    if job is None:
        msg = f"no re-grade {job_id!r} in this database"
        raise KeyError(msg)
    items = store.answer_set_info(job.set_name, job.set_version).item_count
    counts = store.regrade_counts(job_id)
    return [{"type": "regrade_progress", "job_id": job_id, "config_index": index,
             "label": config.display_label(), "done": counts.get(index, (0, 0))[0],
             "total": items * config.grader_repeats, "errors": counts.get(index, (0, 0))[1],
             "eta_s": None} for index, config in enumerate(job.configurations)]
