"""Criterion health: which criterion of a rubric judges badly, per grader configuration.

For each configuration of a re-grade and each of its criteria, over the answers graded
(each answer's repeats combined, `rubric_core.lab.results`):

- ``pass_rate``: share of the graded answers that pass it;
- agreement with people: every (answer, labeller) verdict on the criterion's labelled
  criterion (`GraderConfig.labelled_as`) is a pair (grader, person); ``percent`` and Cohen's κ
  with n and its large-sample interval (`rubric_core.analytics.kappa_interval`);
- ``stability``: with repeats, the share of answers whose repeats were unanimous on it (None
  with one repeat);
- people vs people, where two or more people labelled the same answers: κ over every pair of
  labellers' verdicts on the same answer (pooled), the honest ceiling for a judge;
- flags (`HEALTH_FLAGS`): ``never_fails`` and ``always_fails`` (it does not discriminate), with
  at least `MIN_ANSWERS` graded; ``disagrees`` (κ with people below ``min_kappa``, or, where κ
  is undefined, under 80% agreement), with at least `MIN_ANSWERS` pairs; ``unstable``
  (``stability`` below ``min_stability``); ``redundant``: the same verdict as another
  criterion on every answer both were graded on (at least `MIN_ANSWERS`, and not a constant).
"""

from __future__ import annotations

import dataclasses
from itertools import combinations
from typing import TYPE_CHECKING, Any

import pandas as pd

from rubric_core.analytics import cohen_kappa, kappa_interval
from rubric_core.lab.results import read_job

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rubric_core.lab.config import GraderConfig
    from rubric_core.lab.results import ItemVerdict, JobView
    from rubric_core.store import Store

HEALTH_FLAGS = ("never_fails", "always_fails", "disagrees", "unstable", "redundant")
"""Every flag a criterion can carry, in the order they are shown."""

MIN_ANSWERS = 5
"""Fewest answers (or verdict pairs) before a flag is raised: below it, nothing is said."""

DEFAULT_MIN_KAPPA = 0.6
"""κ with people below this flags ``disagrees`` (0.6 is where "substantial" begins in Landis
and Koch's reading of κ)."""

DEFAULT_MIN_STABILITY = 0.9
"""Share of unanimous answers below this flags ``unstable``."""

HEALTH_COLUMNS: tuple[str, ...] = (
    "config", "criterion", "graded", "pass_rate", "people_n", "agree_pct", "kappa",
    "kappa_low", "kappa_high", "stability", "people_vs_people_kappa", "people_pairs", "flags",
)
"""Columns of `HealthReport.table`, in order."""


@dataclasses.dataclass(frozen=True)
class CriterionHealth:
    """How one criterion judged under one configuration."""

    config_index: int
    """0-based configuration index."""
    config_label: str
    """The configuration's label."""
    criterion: str
    """The criterion as the rubric writes it."""
    graded: int
    """Answers with a verdict on it."""
    pass_rate: float | None
    """Share of those that pass it (None when none)."""
    people_n: int
    """(answer, labeller) verdict pairs compared with people."""
    agree_pct: float | None
    """Percent agreement with people (None without pairs)."""
    kappa: float | None
    """Cohen's κ with people (None without pairs, or undefined)."""
    kappa_low: float | None
    """Lower end of κ's 95% interval."""
    kappa_high: float | None
    """Upper end of κ's 95% interval."""
    stability: float | None
    """Share of answers whose repeats agreed unanimously (None with one repeat)."""
    people_kappa: float | None
    """κ between people on the same answers (pooled over pairs of labellers; None when
    fewer than two people labelled an answer)."""
    people_pairs: int
    """Verdict pairs between people."""
    flags: tuple[str, ...]
    """The flags raised (`HEALTH_FLAGS`)."""
    redundant_with: str | None = None
    """The criterion it always agrees with, when flagged ``redundant``."""


@dataclasses.dataclass(frozen=True)
class HealthReport:
    """Criterion health of every configuration of a re-grade."""

    job_id: str
    """The re-grade."""
    criteria: list[CriterionHealth]
    """Per configuration, per criterion in rubric order."""

    def table(self) -> pd.DataFrame:
        """One row per configuration × criterion (:data:`HEALTH_COLUMNS`)."""
        rows = [(h.config_label, h.criterion, h.graded, h.pass_rate, h.people_n, h.agree_pct,
                 h.kappa, h.kappa_low, h.kappa_high, h.stability, h.people_kappa,
                 h.people_pairs,
                 ", ".join(f"{f} ({h.redundant_with})" if f == "redundant" else f
                           for f in h.flags))
                for h in self.criteria]
        return pd.DataFrame.from_records(rows, columns=list(HEALTH_COLUMNS))

    def flagged(self, flag: str | None = None) -> list[CriterionHealth]:
        """The criteria carrying ``flag`` (any flag when None)."""
        return [h for h in self.criteria if (h.flags if flag is None else flag in h.flags)]

    def for_config(self, config_index: int) -> list[CriterionHealth]:
        """The criteria of one configuration."""
        return [h for h in self.criteria if h.config_index == config_index]


def people_pairs(by_item: Mapping[str, Mapping[str, bool]]) -> list[tuple[bool, bool]]:
    """Every pair of two labellers' verdicts on the same answer (labellers in name order)."""
    pairs: list[tuple[bool, bool]] = []
    for verdicts in by_item.values():
        for a, b in combinations(sorted(verdicts), 2):
            pairs.append((verdicts[a], verdicts[b]))
    return pairs


def _pairs(items: Mapping[str, ItemVerdict], criterion: str,
           people: Mapping[str, Mapping[str, bool]]) -> list[tuple[bool, bool]]:
    pairs: list[tuple[bool, bool]] = []
    for item_id, by_person in people.items():
        verdict = items.get(item_id)
        if verdict is None or criterion not in verdict.criteria:
            continue
        grader = bool(verdict.criteria[criterion]["passed"])
        pairs += [(grader, person) for _, person in sorted(by_person.items())]
    return pairs


def _config_health(index: int, config: GraderConfig, items: Mapping[str, ItemVerdict],
                   view: JobView, min_kappa: float,
                   min_stability: float) -> list[CriterionHealth]:
    criteria = config.criteria
    series: dict[str, dict[str, bool]] = {c: {} for c in criteria}
    for item_id, verdict in items.items():
        for name, v in verdict.criteria.items():
            if name in series:
                series[name][item_id] = bool(v["passed"])
    out: list[CriterionHealth] = []
    for name in criteria:
        verdicts = series[name]
        graded = len(verdicts)
        passes = sum(verdicts.values())
        rate = round(passes / graded, 4) if graded else None
        people = view.people.get(config.labelled_as(name), {})
        pairs = _pairs(items, name, people)
        agreement = cohen_kappa(pairs)
        interval = kappa_interval(pairs)
        between = people_pairs(people)
        ceiling = cohen_kappa(between)
        repeated = [v.agreement.get(name, 1.0) for v in items.values()
                    if v.repeats > 1 and name in v.criteria]
        stability = (round(sum(1 for a in repeated if a >= 1.0) / len(repeated), 4)
                     if repeated else None)
        flags: list[str] = []
        if graded >= MIN_ANSWERS and passes == graded:
            flags.append("never_fails")
        if graded >= MIN_ANSWERS and passes == 0:
            flags.append("always_fails")
        if agreement.n >= MIN_ANSWERS and (
                (agreement.kappa is not None and agreement.kappa < min_kappa)
                or (agreement.kappa is None and (agreement.percent or 0.0) < 80.0)):
            flags.append("disagrees")
        if stability is not None and stability < min_stability:
            flags.append("unstable")
        twin = _twin(name, series, criteria) if 0 < passes < graded else None
        if twin is not None:
            flags.append("redundant")
        out.append(CriterionHealth(
            index, config.display_label(), name, graded, rate, agreement.n, agreement.percent,
            agreement.kappa, interval.low, interval.high, stability, ceiling.kappa, ceiling.n,
            tuple(flags), twin))
    return out


def _twin(name: str, series: Mapping[str, Mapping[str, bool]],
          criteria: list[str]) -> str | None:
    """Another criterion with the same verdict on every answer both were graded on."""
    mine = series[name]
    for other in criteria:
        if other == name:
            continue
        shared = [i for i in mine if i in series[other]]
        if len(shared) >= MIN_ANSWERS and all(mine[i] == series[other][i] for i in shared):
            return other
    return None


def health_of(view: JobView, *, min_kappa: float = DEFAULT_MIN_KAPPA,
              min_stability: float = DEFAULT_MIN_STABILITY) -> HealthReport:
    """Criterion health of a re-grade already read (`rubric_core.lab.results.read_job`)."""
    rows: list[CriterionHealth] = []
    for index, config in enumerate(view.job.configurations):
        rows += _config_health(index, config, view.verdicts[index], view, min_kappa,
                               min_stability)
    return HealthReport(view.job.job_id, rows)


def criterion_health(store: Store, job_id: str, **thresholds: Any) -> HealthReport:
    """Criterion health of every configuration of a re-grade (see the module docstring).

    Args:
        store: The database.
        job_id: The re-grade.
        **thresholds: ``min_kappa`` and ``min_stability`` (`health_of`).

    Raises:
        KeyError: No such re-grade.

    """
    return health_of(read_job(store, job_id), **thresholds)
