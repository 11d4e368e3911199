"""Loop analytics and grader-vs-people agreement, computed from stored evaluations.

Everything here is a pure function of evaluations (and labels), so the app, the CLI and
exports share one definition; `scoped_analytics` alone reads a store, to pick the runs of a
scope (a run, an experiment, every run of a rubric, every run). Per criterion, over the grading
runs given:

- ``grading_runs``: grading runs in which the criterion was graded;
- ``first_pass_fail_rate``: share of them whose first pass failed it;
- ``mean_passes_to_fix``: for grading runs where it failed and later passed, the mean number of
  passes from its first failure to its first pass after that (1 = fixed by the next pass);
- ``oscillations``: grading runs in which it went pass → fail → pass;
- ``feedback_efficacy``: share of its gaps (a failing verdict followed by another pass) after
  which it passed on the very next pass; empty when it never had such a gap;
- ``revision_tokens``: grader tokens of the passes its gaps forced, split evenly among the
  criteria that failed on the pass before (a revision forced by three criteria counts a third
  to each);
- ``instability``: with ``grader_repeats > 1``, the mean share of repeats that disagreed with the
  consensus (0 = every repeat always agreed); empty without repeats.

Agreement between the grader and people is percent agreement and Cohen's κ over the verdict
pairs (grader, person) of the labelled criteria, with n. κ = (pₒ − pₑ) / (1 − pₑ); it is
undefined (None) when both raters gave one and the same verdict throughout (pₑ = 1), where
percent agreement alone is meaningful.

Its interval (`kappa_interval`) is the Wald interval κ ± z·SE with the large-sample standard
error of Fleiss, Cohen and Everitt (1969), the delta-method variance of κ when the n items are
a random sample (not the variance under "no agreement", which is for testing κ = 0). With the
2 × 2 table's cell shares pᵢⱼ (grader i, person j; 1 = pass), margins pᵢ. and p.ⱼ:

    A = Σᵢ pᵢᵢ · (1 − (pᵢ. + p.ᵢ)(1 − κ))²
    B = (1 − κ)² · Σᵢ≠ⱼ pᵢⱼ · (p.ᵢ + pⱼ.)²
    C = (κ − pₑ(1 − κ))²
    SE = √((A + B − C) / n) / (1 − pₑ)

clipped to [−1, 1]. It is an approximation for large n: with a few dozen items read it as a
rough range, and where every pair agrees (κ = 1, SE = 0) the interval has no width at all,
which says nothing about how a larger sample would fare; n is always shown beside it.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import pandas as pd

from rubric_core.ids import unique_id
from rubric_core.rubric import normalize_name
from rubric_core.usage import token_sum

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from rubric_core.store import RunRecord, Store

ANALYTICS_COLUMNS: tuple[str, ...] = (
    "criterion", "grading_runs", "first_pass_fail_rate", "mean_passes_to_fix", "oscillations",
    "feedback_efficacy", "revision_tokens", "instability",
)
"""Columns of `loop_analytics`, in order."""

SCOPES: tuple[str, ...] = ("run", "experiment", "rubric", "all")
"""What `scoped_analytics` can cover: one run, an experiment's cells, every run of a rubric,
every run in the store."""


@dataclasses.dataclass(frozen=True)
class Agreement:
    """How often two raters gave the same pass/fail verdict."""

    n: int
    """Verdict pairs compared."""
    percent: float | None
    """Share of pairs that agree, 0–100 (None when n is 0)."""
    kappa: float | None
    """Cohen's κ (None when n is 0 or κ is undefined)."""


def cohen_kappa(pairs: Iterable[tuple[bool, bool]]) -> Agreement:
    """Percent agreement and Cohen's κ of two raters' boolean verdicts on the same items."""
    items = [(bool(a), bool(b)) for a, b in pairs]
    n = len(items)
    if n == 0:
        return Agreement(0, None, None)
    observed = sum(1 for a, b in items if a == b) / n
    a_yes = sum(1 for a, _ in items if a) / n
    b_yes = sum(1 for _, b in items if b) / n
    expected = a_yes * b_yes + (1 - a_yes) * (1 - b_yes)
    kappa = None if expected >= 1.0 else (observed - expected) / (1 - expected)
    return Agreement(n, round(observed * 100, 2), None if kappa is None else round(kappa, 4))


@dataclasses.dataclass(frozen=True)
class KappaInterval:
    """Cohen's κ with its large-sample standard error and a two-sided interval."""

    n: int
    """Verdict pairs compared."""
    kappa: float | None
    """Cohen's κ (None when n is 0 or κ is undefined)."""
    se: float | None
    """Fleiss–Cohen–Everitt standard error of κ (None when κ is)."""
    low: float | None
    """Lower end of the interval, at least −1 (None when κ is)."""
    high: float | None
    """Upper end of the interval, at most 1 (None when κ is)."""
    confidence: float
    """The interval's nominal coverage (0.95 by default)."""


def kappa_interval(pairs: Iterable[tuple[bool, bool]], confidence: float = 0.95) -> KappaInterval:
    """Cohen's κ of two raters' boolean verdicts with its Wald interval (see the module text).

    Args:
        pairs: (rater A, rater B) verdicts on the same items.
        confidence: Two-sided coverage, strictly between 0 and 1.

    Raises:
        ValueError: A confidence outside (0, 1).

    """
    if not 0.0 < confidence < 1.0:
        msg = f"confidence must be between 0 and 1 (exclusive), got {confidence!r}"
        raise ValueError(msg)
    items = [(bool(a), bool(b)) for a, b in pairs]
    n = len(items)
    if n == 0:
        return KappaInterval(0, None, None, None, None, confidence)
    # cells[i][j]: share of pairs with A = i and B = j (1 = pass).
    cells = [[sum(1 for a, b in items if (a, b) == (bool(i), bool(j))) / n for j in (0, 1)]
             for i in (0, 1)]
    rows = [cells[i][0] + cells[i][1] for i in (0, 1)]
    cols = [cells[0][j] + cells[1][j] for j in (0, 1)]
    observed = cells[0][0] + cells[1][1]
    expected = rows[0] * cols[0] + rows[1] * cols[1]
    if expected >= 1.0:
        return KappaInterval(n, None, None, None, None, confidence)
    kappa = (observed - expected) / (1 - expected)
    a = sum(cells[i][i] * (1 - (rows[i] + cols[i]) * (1 - kappa)) ** 2 for i in (0, 1))
    b = (1 - kappa) ** 2 * sum(cells[i][j] * (cols[i] + rows[j]) ** 2
                               for i in (0, 1) for j in (0, 1) if i != j)
    c = (kappa - expected * (1 - kappa)) ** 2
    se = max(a + b - c, 0.0) ** 0.5 / ((1 - expected) * n ** 0.5)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    return KappaInterval(n, round(kappa, 4), round(se, 4), round(max(-1.0, kappa - z * se), 4),
                         round(min(1.0, kappa + z * se), 4), confidence)


def grading_runs(
    evaluations: Iterable[Mapping[str, Any]],
) -> list[list[Mapping[str, Any]]]:
    """Evaluations grouped into grading runs (by ``grading_run_id``), each ordered by pass."""
    runs: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for ev in evaluations:
        runs[str(ev.get("grading_run_id") or "")].append(ev)
    return [sorted(run, key=lambda ev: int(ev.get("iteration") or 0)) for run in runs.values()]


@dataclasses.dataclass
class _Tally:
    name: str
    runs: int = 0
    first_fail: int = 0
    fix_lengths: list[int] = dataclasses.field(default_factory=list)
    oscillations: int = 0
    gaps: int = 0
    gaps_fixed: int = 0
    tokens: float = 0.0
    disagreement: list[float] = dataclasses.field(default_factory=list)


def _tokens(ev: Mapping[str, Any]) -> int:
    return int(token_sum(ev.get("input_tokens"), ev.get("output_tokens")) or 0)


def loop_analytics(evaluations: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Per-criterion loop statistics (see the module docstring), one row per criterion.

    Args:
        evaluations: Evaluations of any number of runs; criteria are matched across runs by
            `rubric.normalize_name` and shown as first written.

    Returns:
        A DataFrame with :data:`ANALYTICS_COLUMNS`, in order of first appearance.

    """
    tallies: dict[str, _Tally] = {}
    for run in grading_runs(evaluations):
        series: dict[str, list[bool | None]] = {}
        for index, ev in enumerate(run):
            criteria = ev.get("criteria") or []
            for c in criteria:
                key = normalize_name(str(c.get("name", "")))
                tally = tallies.setdefault(key, _Tally(str(c.get("name", ""))))
                series.setdefault(key, [None] * len(run))[index] = bool(c.get("passed"))
                if "agreement" in c:
                    tally.disagreement.append(1.0 - float(c["agreement"]))
            if index + 1 < len(run):
                failing = [normalize_name(str(c.get("name", ""))) for c in criteria
                           if not c.get("passed")]
                for key in failing:
                    tallies[key].tokens += _tokens(run[index + 1]) / len(failing)
        for key, verdicts in series.items():
            _tally_series(tallies[key], verdicts)
    rows = []
    for t in tallies.values():
        rows.append((
            t.name, t.runs, round(t.first_fail / t.runs, 4) if t.runs else None,
            round(sum(t.fix_lengths) / len(t.fix_lengths), 4) if t.fix_lengths else None,
            t.oscillations, round(t.gaps_fixed / t.gaps, 4) if t.gaps else None,
            round(t.tokens, 2),
            round(sum(t.disagreement) / len(t.disagreement), 4) if t.disagreement else None,
        ))
    return pd.DataFrame.from_records(rows, columns=list(ANALYTICS_COLUMNS))


def _tally_series(tally: _Tally, verdicts: Sequence[bool | None]) -> None:
    graded = [(i, v) for i, v in enumerate(verdicts) if v is not None]
    if not graded:
        return
    tally.runs += 1
    if graded[0][0] == 0 and graded[0][1] is False:
        tally.first_fail += 1
    first_fail = next((i for i, v in graded if v is False), None)
    if first_fail is not None:
        fixed = next((i for i, v in graded if i > first_fail and v), None)
        if fixed is not None:
            tally.fix_lengths.append(fixed - first_fail)
    seen_pass = seen_fail_after_pass = False
    for _, v in graded:
        if v and seen_fail_after_pass:
            tally.oscillations += 1
            break
        if v:
            seen_pass = True
        elif seen_pass:
            seen_fail_after_pass = True
    for i in range(len(verdicts) - 1):
        if verdicts[i] is False and verdicts[i + 1] is not None:
            tally.gaps += 1
            tally.gaps_fixed += 1 if verdicts[i + 1] else 0


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Two configurations on the same rows: what flipped and how sure to be about it."""

    n: int
    """Rows graded under both configurations."""
    both_pass: int
    """Rows satisfied under both."""
    both_fail: int
    """Rows satisfied under neither."""
    fixed: list[str]
    """Row ids that fail under A and pass under B (fail → pass)."""
    broken: list[str]
    """Row ids that pass under A and fail under B (pass → fail)."""
    p_value: float
    """McNemar's exact (two-sided binomial) test on the flips: the chance of flips at least
    this lopsided if A and B were equally good. Small samples are exactly what it is for."""


def mcnemar_exact(broken: int, fixed: int) -> float:
    """Two-sided exact McNemar p-value for ``broken`` (A✓B✗) and ``fixed`` (A✗B✓) flips.

    p = min(1, 2 · Σ_{i ≤ min(b, c)} C(b + c, i) / 2^(b + c)); 1.0 when nothing flipped.
    Never rounded: a very lopsided split has a tiny p, never exactly 0.
    """
    from math import comb

    n = broken + fixed
    if n == 0:
        return 1.0
    tail = sum(comb(n, i) for i in range(min(broken, fixed) + 1)) / 2**n
    return min(1.0, 2 * tail)


def compare_outcomes(a: Mapping[str, bool], b: Mapping[str, bool]) -> Comparison:
    """Compare two configurations' final verdicts (row id → satisfied) on their shared rows."""
    shared = [row for row in a if row in b]
    fixed = [row for row in shared if not a[row] and b[row]]
    broken = [row for row in shared if a[row] and not b[row]]
    return Comparison(
        n=len(shared),
        both_pass=sum(1 for row in shared if a[row] and b[row]),
        both_fail=sum(1 for row in shared if not a[row] and not b[row]),
        fixed=fixed, broken=broken, p_value=mcnemar_exact(len(broken), len(fixed)),
    )


@dataclasses.dataclass(frozen=True)
class ScopedAnalytics:
    """`loop_analytics` over the runs of a scope, and what it covered."""

    table: pd.DataFrame
    """One row per criterion (:data:`ANALYTICS_COLUMNS`)."""
    runs: list[RunRecord]
    """The runs covered, newest first (an experiment's in cell order)."""
    passes: int
    """Grading passes (evaluations) read."""


def scope_runs(store: Store, scope: str, key: str = "") -> list[RunRecord]:
    """The runs a scope covers.

    Args:
        store: The database to read.
        scope: One of :data:`SCOPES`.
        key: For ``run`` and ``experiment``, the id or a unique prefix of it; for ``rubric``,
            the rubric text (spaces around it ignored); unused for ``all``.

    Raises:
        ValueError: An unknown scope, or a key that names no run or experiment, or several.

    """
    if scope == "run":
        run = store.get_run(key)
        if run is None:
            known = (r.run_id for r in store.list_runs(limit=None))
            run = store.get_run(unique_id("run", key, known))
        return [run] if run is not None else []
    if scope == "experiment":
        experiment_id = key if store.get_experiment(key) is not None else unique_id(
            "experiment", key, (e.experiment_id for e in store.list_experiments(limit=None)))
        return [cell.run for cell in store.experiment_cells(experiment_id)
                if cell.run is not None]
    if scope == "rubric":
        return store.runs_for_rubric(key)
    if scope == "all":
        return store.list_runs(limit=None)
    msg = f"unknown analytics scope {scope!r}; expected one of {SCOPES}"
    raise ValueError(msg)


def scoped_analytics(store: Store, scope: str, key: str = "") -> ScopedAnalytics:
    """`loop_analytics` over the runs of a scope (`scope_runs`); the app and the CLI use it.

    Raises:
        ValueError: As `scope_runs`.

    """
    runs = scope_runs(store, scope, key)
    by_run = store.evaluations_for_runs(r.run_id for r in runs)
    evaluations = [ev for r in runs for ev in by_run.get(r.run_id, [])]
    return ScopedAnalytics(loop_analytics(evaluations), runs, len(evaluations))
