"""A re-grade's results read once: each answer's verdict per configuration, and people's.

A re-grade stores one row per (configuration, item, repeat) (`Store.regrade_results`). Here
the repeats of an item are combined into one verdict per criterion exactly as the middleware
combines a pass's repeats (`rubric_core.consensus.combine`, with the configuration's
``consensus``): a repeat that ended ``grader_error`` does not vote; an item whose every repeat
errored has no verdict. People's verdicts are read per labelled criterion
(`rubric_core.rubric.normalize_name`), item and labeller. Health (`rubric_core.lab.health`),
comparison (`rubric_core.lab.compare`) and refine (`rubric_core.lab.refine`) read both from
`read_job`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from rubric_core.consensus import combine
from rubric_core.grader import GradeOutcome
from rubric_core.rubric import normalize_name
from rubric_core.types import GraderResponse

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from rubric_core.lab.config import GraderConfig
    from rubric_core.store import ItemLabel, RegradeJob, RegradeResult, Store
    from rubric_core.types import CriterionVerdict, RubricResult

People = dict[str, dict[str, dict[str, bool]]]
"""People's verdicts: labelled criterion (normalised) → item id → labeller → pass."""


@dataclasses.dataclass(frozen=True)
class ItemVerdict:
    """One answer's verdict under one configuration, its repeats combined."""

    item_id: str
    """The answer."""
    result: RubricResult
    """The combined verdict, or ``grader_error`` when every repeat errored."""
    criteria: dict[str, CriterionVerdict]
    """Per criterion (named as in the rubric): the consensus verdict, with its gap."""
    agreement: dict[str, float]
    """Per criterion: share of the repeats agreeing with the consensus (1.0 with one repeat)."""
    repeats: int
    """Repeats that gave a verdict."""
    errors: int
    """Repeats that ended ``grader_error``."""
    error: str | None = None
    """The last repeat's error, when every repeat errored."""


@dataclasses.dataclass(frozen=True)
class JobView:
    """A re-grade read once: its record, each configuration's item verdicts, people's."""

    job: RegradeJob
    """The re-grade."""
    verdicts: list[dict[str, ItemVerdict]]
    """Per configuration index: item id → its verdict (items not graded yet are absent)."""
    people: People
    """People's verdicts of the set's answers."""
    item_ids: list[str]
    """Every item of the set, in set order."""


def _outcome(result: RegradeResult) -> GradeOutcome:
    response = GraderResponse.model_construct(result=result.result,
                                              explanation=result.explanation, criteria=[])
    return GradeOutcome(response=response, criteria=list(result.criteria),
                        missing=list(result.missing), input_tokens=result.input_tokens,
                        output_tokens=result.output_tokens,
                        cached_input_tokens=result.cached_input_tokens)


def combine_repeats(results: Sequence[RegradeResult], config: GraderConfig) -> ItemVerdict:
    """One item's repeats under one configuration as one verdict (see the module docstring)."""
    item_id = results[0].item_id
    graded = [r for r in results if r.result != "grader_error"]
    errors = len(results) - len(graded)
    if not graded:
        return ItemVerdict(item_id, "grader_error", {}, {}, 0, errors, results[-1].error)
    combined = combine([_outcome(r) for r in graded], config.criteria,
                       "unanimous" if config.consensus == "unanimous" else "majority")
    verdicts = {v["name"]: v for v in combined.outcome.criteria}
    agreement = {name: combined.agreement.get(name, 1.0) for name in verdicts}
    return ItemVerdict(item_id, combined.outcome.response.result, verdicts, agreement,
                       len(graded), errors)


def people_verdicts(labels: Iterable[ItemLabel]) -> People:
    """People's verdicts by labelled criterion (normalised), item and labeller."""
    out: People = {}
    for lb in labels:
        out.setdefault(normalize_name(lb.criterion), {}).setdefault(lb.item_id, {})[
            lb.labeller] = lb.passed
    return out


def read_job(store: Store, job_id: str) -> JobView:
    """Read a re-grade's results and its set's labels once (no answer text is read).

    Raises:
        KeyError: No such re-grade.

    """
    job = store.get_regrade_job(job_id)
    if job is None:
        msg = f"no re-grade {job_id!r} in this database: see `rubric-studio regrade --help`"
        raise KeyError(msg)
    verdicts: list[dict[str, ItemVerdict]] = [{} for _ in job.configurations]
    group: list[RegradeResult] = []
    for result in [*store.regrade_results(job_id), None]:
        if group and (result is None or result.key[:2] != group[0].key[:2]):
            config_index = group[0].config_index
            if config_index < len(verdicts):
                verdicts[config_index][group[0].item_id] = combine_repeats(
                    group, job.configurations[config_index])
            group = []
        if result is not None:
            group.append(result)
    item_ids = [it.id for it in store.answer_items(job.set_name, job.set_version)]
    people = people_verdicts(store.answer_labels(job.set_name, job.set_version))
    return JobView(job, verdicts, people, item_ids)
