"""Pairwise judging's records: a pair, one order's verdict, and the two orders combined.

The vocabulary is defined here once: a verdict names a `Winner` (``a``, ``b`` or ``tie``), in
the pair's own terms once it is mapped back from the order it was shown in; the two orders
combine into an `Outcome` (a `Winner`, or ``inconsistent`` when they disagree). They live beside
the package, as the lab's events do, and are re-exported from `rubric_core.pairwise`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

from typing_extensions import TypedDict

if TYPE_CHECKING:
    from rubric_core.types import ModelCallRecord

Winner = Literal["a", "b", "tie"]
"""Which answer meets a criterion better: ``a``, ``b``, or ``tie`` when neither does."""

WINNERS: tuple[Winner, ...] = get_args(Winner)
"""Every `Winner`, in the order the verdict schema offers them."""

Outcome = Literal["a", "b", "tie", "inconsistent"]
"""The two orders combined: their common winner, or ``inconsistent`` when they disagree."""

OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
"""Every `Outcome`, in the order tables count them."""

INCONSISTENT: Outcome = "inconsistent"
"""The outcome of a criterion whose two orders named different winners."""

Order = Literal["a_first", "b_first"]
"""Which answer a grader call showed first."""

ORDERS: tuple[Order, ...] = get_args(Order)
"""Both orders, in the order they are judged."""

Source = Literal["cli", "review", "experiment", "bench"]
"""Where a stored judgement was started."""


@dataclass(frozen=True)
class Pair:
    """Two answers to one request, to be judged against a rubric."""

    pair_id: str
    """The pair's id (a file's ``id`` column, a dataset row's id, a pass number)."""
    prompt: str
    """The request both answers answer."""
    a: str
    """Answer A."""
    b: str
    """Answer B."""
    rubric: str = ""
    """The pair's own rubric; empty: the judgement's rubric."""


class CriterionJudgement(TypedDict):
    """One criterion of one pair, judged in both orders (stored as JSON with its pair)."""

    criterion: str
    """The criterion, as written in the rubric."""
    winner_a_first: Winner | None
    """The winner with A shown first, in the pair's terms (None: that order failed)."""
    winner_b_first: Winner | None
    """The winner with B shown first, in the pair's terms (None: that order failed)."""
    winner: Outcome | None
    """Both orders combined; None when either order has no winner (see `error`)."""
    reason_a_first: str
    """The grader's reason with A shown first (``""`` when none)."""
    reason_b_first: str
    """The grader's reason with B shown first (``""`` when none)."""
    error: str | None
    """Why an order has no winner (the grader failed, replied with garbage, left the criterion
    out), scrubbed and bounded; None when both orders judged it."""


@dataclass(frozen=True)
class OrderVerdict:
    """What one order's grader call (with its correction and retries) came to."""

    order: Order
    """Which answer was shown first."""
    winners: dict[int, tuple[Winner, str]]
    """Rubric index → (winner, reason), in the pair's own terms."""
    error: str | None = None
    """Why the call gave nothing usable (the whole order failed), or None."""
    missing: dict[int, str] = field(default_factory=dict)
    """Rubric index → why that criterion has no winner in a reply that judged others."""
    unknown: list[str] = field(default_factory=list)
    """Criterion names the reply gave that are not in the rubric (ignored)."""
    calls: list[ModelCallRecord] = field(default_factory=list)
    """The order's model calls as call traces record them (`rubric_core.calls`)."""


@dataclass(frozen=True)
class PairJudgement:
    """A pair judged in both orders: every criterion's outcome, and the calls it took."""

    pair: Pair
    """The pair."""
    rubric: str
    """The rubric it was judged against."""
    criteria: list[CriterionJudgement]
    """Per criterion, in rubric order (empty when `error` is set)."""
    error: str | None = None
    """Why the pair could not be judged at all (a rubric with no criteria), or None."""
    duration_s: float = 0.0
    """Wall-clock seconds both orders took."""
    calls: list[ModelCallRecord] = field(default_factory=list)
    """Every model call of both orders, A-first's first."""
    unknown: list[str] = field(default_factory=list)
    """Names the grader answered that are not in the rubric, over both orders (ignored)."""


__all__ = [
    "INCONSISTENT",
    "ORDERS",
    "OUTCOMES",
    "WINNERS",
    "CriterionJudgement",
    "Order",
    "OrderVerdict",
    "Outcome",
    "Pair",
    "PairJudgement",
    "Source",
    "Winner",
]
