"""The rubric lab: improve a rubric against fixed answers and people's verdicts.

A rubric is written in a loop: see how its criteria judge real answers, find the ones that
judge badly, reword them, check the rewording is better. Here the answers stay fixed while the
rubric changes, and only the grader runs. The package's modules, one concept each; their
public names are re-exported here:

- `rubric_core.lab.answers`: answer sets from an upload (CSV/JSONL with people's verdicts as
  ``label:<criterion>`` columns), stored runs or an experiment's cells (`parse_answers`,
  `read_answers_file`, `answers_from_runs`, `answers_from_experiment`, `AnswerSet`);
- `rubric_core.lab.labelling`: a person's verdict on one criterion of one answer, recorded in
  a stored set (`label_answer`);
- `rubric_core.lab.bundled`: the bundled labelled set that runs the whole loop offline;
- `rubric_core.lab.config`: `GraderConfig`, one grader configuration of a re-grade;
- `rubric_core.lab.jobs`: store a re-grade (`create_regrade`), add a configuration
  (`add_config`), retry failed gradings (`retry_errors`), where it stands
  (`job_progress`);
- `rubric_core.lab.regrade`: grade them (`run_regrade`: one event loop, bounded concurrency,
  shared backoff, Stop and Resume, progress events of `rubric_core.lab.types`);
- `rubric_core.lab.results`: the results read once, repeats combined (`read_job`);
- `rubric_core.lab.health`: criterion health and its flags (`criterion_health`);
- `rubric_core.lab.compare`: two configurations on the same answers (`compare_configs`);
- `rubric_core.lab.refine`: suggest rewrites of a weak criterion and accept one
  (`find_disagreements`, `suggest_rewrites`, `accept_rewrite`; `DemoRefiner` offline);
- `rubric_core.lab.export`: every grading as rows (`regrade_rows`, `REGRADE_COLUMNS`).
"""

from __future__ import annotations

from rubric_core.lab.answers import (
    MAX_ANSWER_ITEMS,
    UPLOAD_LABELLER,
    AnswerSet,
    AnswerSetError,
    answers_from_experiment,
    answers_from_runs,
    label_columns,
    parse_answers,
    read_answers_file,
)
from rubric_core.lab.bundled import (
    BUNDLED_NAME,
    BUNDLED_RUBRIC,
    BUNDLED_RUBRIC_NAME,
    bundled_answer_set,
)
from rubric_core.lab.compare import (
    COMPARE_COLUMNS,
    CriterionComparison,
    Flip,
    RubricComparison,
    compare_configs,
    compare_view,
)
from rubric_core.lab.config import GraderConfig
from rubric_core.lab.demo_refiner import DemoRefiner, resolve_refiner
from rubric_core.lab.export import REGRADE_COLUMNS, regrade_rows
from rubric_core.lab.grading import regrade_models
from rubric_core.lab.health import (
    DEFAULT_MIN_KAPPA,
    DEFAULT_MIN_STABILITY,
    HEALTH_COLUMNS,
    HEALTH_FLAGS,
    CriterionHealth,
    HealthReport,
    criterion_health,
    health_of,
)
from rubric_core.lab.jobs import (
    MAX_CONFIGS,
    add_config,
    create_regrade,
    job_progress,
    retry_errors,
)
from rubric_core.lab.labelling import label_answer
from rubric_core.lab.refine import (
    Disagreement,
    RefineError,
    Rewrite,
    accept_rewrite,
    find_disagreements,
    rewrite_rubric,
    suggest_rewrites,
)
from rubric_core.lab.regrade import run_regrade
from rubric_core.lab.results import ItemVerdict, JobView, read_job
from rubric_core.lab.types import (
    ItemGraded,
    RegradeBackoff,
    RegradeEvent,
    RegradeFinished,
    RegradeProgress,
)
from rubric_core.store import AnswerItem, AnswerSetInfo, ItemLabel, RegradeJob, RegradeResult

__all__ = [
    "BUNDLED_NAME",
    "BUNDLED_RUBRIC",
    "BUNDLED_RUBRIC_NAME",
    "COMPARE_COLUMNS",
    "DEFAULT_MIN_KAPPA",
    "DEFAULT_MIN_STABILITY",
    "HEALTH_COLUMNS",
    "HEALTH_FLAGS",
    "MAX_ANSWER_ITEMS",
    "MAX_CONFIGS",
    "REGRADE_COLUMNS",
    "UPLOAD_LABELLER",
    "AnswerItem",
    "AnswerSet",
    "AnswerSetError",
    "AnswerSetInfo",
    "CriterionComparison",
    "CriterionHealth",
    "DemoRefiner",
    "Disagreement",
    "Flip",
    "GraderConfig",
    "HealthReport",
    "ItemGraded",
    "ItemLabel",
    "ItemVerdict",
    "JobView",
    "RefineError",
    "RegradeBackoff",
    "RegradeEvent",
    "RegradeFinished",
    "RegradeJob",
    "RegradeProgress",
    "RegradeResult",
    "Rewrite",
    "RubricComparison",
    "accept_rewrite",
    "add_config",
    "answers_from_experiment",
    "answers_from_runs",
    "bundled_answer_set",
    "compare_configs",
    "compare_view",
    "create_regrade",
    "criterion_health",
    "find_disagreements",
    "health_of",
    "job_progress",
    "label_answer",
    "label_columns",
    "parse_answers",
    "read_answers_file",
    "read_job",
    "regrade_models",
    "regrade_rows",
    "resolve_refiner",
    "retry_errors",
    "rewrite_rubric",
    "run_regrade",
    "suggest_rewrites",
]
