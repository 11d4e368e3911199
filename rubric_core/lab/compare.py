"""Two configurations of a re-grade on the same answers: what flipped, per criterion.

Criteria are matched between configuration A and B by what people's verdicts judge them
against (`GraderConfig.labelled_as`: the same name, or a rewording or split mapped to the
original), then, for what is left, by position when both sides have as many left. A criterion
of A split into several in B is compared with their conjunction (B passes it when every part
passes), which is what the original asked. Per matched criterion, over the answers both graded:
the verdicts that flipped (each with its answer and both gaps side by side, and people's
verdicts), pass rates, κ with people (both sides against the same verdicts), stability, their
deltas and McNemar's exact p on the flips (`rubric_core.analytics.mcnemar_exact`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pandas as pd

from rubric_core.analytics import cohen_kappa, mcnemar_exact
from rubric_core.lab.results import read_job

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from rubric_core.lab.config import GraderConfig
    from rubric_core.lab.results import ItemVerdict, JobView
    from rubric_core.store import Store

COMPARE_COLUMNS: tuple[str, ...] = (
    "criterion_a", "criterion_b", "n", "pass_rate_a", "pass_rate_b", "pass_rate_delta",
    "kappa_a", "kappa_b", "kappa_delta", "people_n", "stability_a", "stability_b", "flips",
    "p_value",
)
"""Columns of `RubricComparison.table` (the before/after table), in order."""


@dataclasses.dataclass(frozen=True)
class Flip:
    """One answer whose verdict on a criterion differs between A and B."""

    item_id: str
    """The answer's id."""
    request: str
    """What it was written for."""
    answer: str
    """The answer."""
    passed_a: bool
    """A's verdict."""
    passed_b: bool
    """B's verdict (the conjunction of a split's parts)."""
    gap_a: str
    """A's gap (``""`` when it passed)."""
    gap_b: str
    """B's gaps (``""`` when it passed; a split's failing parts' gaps joined)."""
    people: dict[str, bool]
    """People's verdicts on it, by labeller."""


@dataclasses.dataclass(frozen=True)
class CriterionComparison:
    """One criterion of A against what judges the same in B."""

    criterion_a: str
    """A's criterion."""
    criteria_b: tuple[str, ...]
    """B's criterion, or the parts it was split into."""
    n: int
    """Answers graded on it by both."""
    pass_rate_a: float | None
    """A's pass rate over those answers."""
    pass_rate_b: float | None
    """B's pass rate over those answers."""
    kappa_a: float | None
    """A's κ with people's verdicts on those answers."""
    kappa_b: float | None
    """B's κ with the same verdicts."""
    people_n: int
    """(answer, labeller) pairs behind each κ."""
    stability_a: float | None
    """Share of answers whose repeats were unanimous under A (None with one repeat)."""
    stability_b: float | None
    """The same under B."""
    flips: list[Flip]
    """The answers whose verdict flipped, in set order."""
    p_value: float
    """McNemar's exact p on the flips (1.0 when nothing flipped)."""

    @property
    def pass_rate_delta(self) -> float | None:
        """B's pass rate minus A's."""
        if self.pass_rate_a is None or self.pass_rate_b is None:
            return None
        return round(self.pass_rate_b - self.pass_rate_a, 4)

    @property
    def kappa_delta(self) -> float | None:
        """B's κ minus A's (None when either is undefined)."""
        if self.kappa_a is None or self.kappa_b is None:
            return None
        return round(self.kappa_b - self.kappa_a, 4)


@dataclasses.dataclass(frozen=True)
class RubricComparison:
    """Configuration A against configuration B of one re-grade."""

    job_id: str
    """The re-grade."""
    a: int
    """A's configuration index."""
    b: int
    """B's configuration index."""
    criteria: list[CriterionComparison]
    """Matched criteria, in A's rubric order."""
    only_a: list[str]
    """A's criteria with no counterpart in B (dropped)."""
    only_b: list[str]
    """B's criteria with no counterpart in A (added)."""

    def table(self) -> pd.DataFrame:
        """The before/after table, one row per matched criterion (:data:`COMPARE_COLUMNS`)."""
        rows = [(c.criterion_a, " + ".join(c.criteria_b), c.n, c.pass_rate_a, c.pass_rate_b,
                 c.pass_rate_delta, c.kappa_a, c.kappa_b, c.kappa_delta, c.people_n,
                 c.stability_a, c.stability_b, len(c.flips), round(c.p_value, 4))
                for c in self.criteria]
        return pd.DataFrame.from_records(rows, columns=list(COMPARE_COLUMNS))


def match_criteria(a: GraderConfig, b: GraderConfig) -> list[tuple[str, tuple[str, ...]]]:
    """A's criteria with the B criteria that judge the same (see the module docstring)."""
    b_left = list(b.criteria)
    matched: list[tuple[str, tuple[str, ...]]] = []
    a_left: list[str] = []
    for name in a.criteria:
        key = a.labelled_as(name)
        same = tuple(x for x in b_left if b.labelled_as(x) == key)
        if same:
            matched.append((name, same))
            b_left = [x for x in b_left if x not in same]
        else:
            a_left.append(name)
    if a_left and len(a_left) == len(b_left):
        matched += [(x, (y,)) for x, y in zip(a_left, b_left, strict=True)]
    order = {name: i for i, name in enumerate(a.criteria)}
    return sorted(matched, key=lambda pair: order[pair[0]])


def _side(verdict: ItemVerdict | None, names: Sequence[str]) -> tuple[bool, str, bool] | None:
    """(passed, gap, unanimous) of one side on an answer; None when not graded on all."""
    if verdict is None or any(n not in verdict.criteria for n in names):
        return None
    parts = [verdict.criteria[n] for n in names]
    gaps = "; ".join(str(p.get("gap") or "") for p in parts if not p["passed"])
    unanimous = all(verdict.agreement.get(n, 1.0) >= 1.0 for n in names)
    return all(bool(p["passed"]) for p in parts), gaps, unanimous


def _rate(values: Sequence[bool]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def compare_view(view: JobView, a: int, b: int,
                 answers: Mapping[str, tuple[str, str]] | None = None) -> RubricComparison:
    """Compare two configurations of a re-grade already read (`read_job`).

    Args:
        view: The re-grade, read.
        a: A's configuration index.
        b: B's configuration index.
        answers: item id → (request, answer) for the flips (empty text without it).

    Raises:
        IndexError: No such configuration.

    """
    configs = view.job.configurations
    for index in (a, b):
        if not 0 <= index < len(configs):
            msg = f"no configuration {index} in re-grade {view.job.job_id[:8]} ({len(configs)})"
            raise IndexError(msg)
    ca, cb = configs[a], configs[b]
    pairs = match_criteria(ca, cb)
    out: list[CriterionComparison] = []
    for name_a, names_b in pairs:
        people = view.people.get(ca.labelled_as(name_a), {})
        rows = []
        for item_id in view.item_ids:
            side_a = _side(view.verdicts[a].get(item_id), (name_a,))
            side_b = _side(view.verdicts[b].get(item_id), names_b)
            if side_a is not None and side_b is not None:
                rows.append((item_id, side_a, side_b))
        kappa_pairs_a = [(sa[0], p) for i, sa, _ in rows for p in people.get(i, {}).values()]
        kappa_pairs_b = [(sb[0], p) for i, _, sb in rows for p in people.get(i, {}).values()]
        flips = []
        for item_id, sa, sb in rows:
            if sa[0] != sb[0]:
                request, answer = (answers or {}).get(item_id, ("", ""))
                flips.append(Flip(item_id, request, answer, sa[0], sb[0], sa[1], sb[1],
                                  dict(people.get(item_id, {}))))
        repeated_a = ca.grader_repeats > 1
        repeated_b = cb.grader_repeats > 1
        out.append(CriterionComparison(
            name_a, names_b, len(rows), _rate([sa[0] for _, sa, _ in rows]),
            _rate([sb[0] for _, _, sb in rows]), cohen_kappa(kappa_pairs_a).kappa,
            cohen_kappa(kappa_pairs_b).kappa, len(kappa_pairs_a),
            _rate([sa[2] for _, sa, _ in rows]) if repeated_a else None,
            _rate([sb[2] for _, _, sb in rows]) if repeated_b else None, flips,
            mcnemar_exact(sum(1 for f in flips if f.passed_a),
                          sum(1 for f in flips if f.passed_b))))
    used_b = {n for _, names in pairs for n in names}
    return RubricComparison(view.job.job_id, a, b, out,
                            [n for n in ca.criteria if n not in {x for x, _ in pairs}],
                            [n for n in cb.criteria if n not in used_b])


def compare_configs(store: Store, job_id: str, a: int, b: int) -> RubricComparison:
    """Compare configurations ``a`` and ``b`` of a re-grade, flips with their answers.

    Only the flipped answers' text is read.

    Raises:
        KeyError: No such re-grade.
        IndexError: No such configuration.

    """
    view = read_job(store, job_id)
    first = compare_view(view, a, b)
    flipped = [f.item_id for c in first.criteria for f in c.flips]
    if not flipped:
        return first
    items = store.answer_items(view.job.set_name, view.job.set_version, ids=flipped)
    return compare_view(view, a, b, {it.id: (it.request, it.answer) for it in items})
