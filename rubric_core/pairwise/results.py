"""What judged pairs add up to: per criterion the wins, ties, inconsistencies and flip rate.

The **position flip rate** of a criterion is the share of its judgements (pairs where both
orders named a winner) whose two orders disagree, i.e. whose outcome is ``inconsistent``: 0
for a judge that order never sways, 1.0 for one that always prefers the same position.
Judgements an order could not make (``failed``) are counted apart and are in no rate.

`csv_rows` gives one row per (pair, criterion) in `CSV_COLUMNS`' order, scrubbed of secrets;
`rubric_core.export.write_csv` writes them formula-safe. `judgement_cost` prices a stored
judgement's calls as the runs' calls are priced (`rubric_core.costs.call_cost`).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from rubric_core.costs import call_cost
from rubric_core.pairwise.types import INCONSISTENT
from rubric_core.redact import redact, secret_values

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

    from rubric_core.pairwise.types import CriterionJudgement
    from rubric_core.prices import Prices
    from rubric_core.store import CallUsage

CSV_COLUMNS: tuple[str, ...] = (
    "pair_id", "criterion", "winner_a_first", "winner_b_first", "winner", "reason_a_first",
    "reason_b_first", "error",
)
"""The export's columns: the five the issue names first, then the reasons and any error."""

TALLY_COLUMNS: tuple[str, ...] = (
    "criterion", "a_wins", "b_wins", "ties", "inconsistent", "failed", "judged", "flip_rate",
)
"""Columns of `tally_rows`."""

OVERALL = "(all criteria)"
"""The name of the tally over every criterion."""


@dataclass
class Tally:
    """One criterion's outcomes over the pairs (or every criterion's, for `OVERALL`)."""

    criterion: str
    a_wins: int = 0
    """Pairs where A wins in both orders."""
    b_wins: int = 0
    """Pairs where B wins in both orders."""
    ties: int = 0
    """Pairs judged a tie in both orders."""
    inconsistent: int = 0
    """Pairs whose two orders named different winners."""
    failed: int = 0
    """Pairs where an order could not judge the criterion (in no rate)."""

    @property
    def judged(self) -> int:
        """Pairs both orders judged: the flip rate's denominator."""
        return self.a_wins + self.b_wins + self.ties + self.inconsistent

    @property
    def flip_rate(self) -> float | None:
        """Share of judged pairs whose orders disagree; None when none was judged."""
        return self.inconsistent / self.judged if self.judged else None

    def add(self, judgement: CriterionJudgement) -> None:
        """Count one criterion judgement."""
        winner = judgement["winner"]
        if winner is None:
            self.failed += 1
        elif winner == INCONSISTENT:
            self.inconsistent += 1
        elif winner == "tie":
            self.ties += 1
        elif winner == "a":
            self.a_wins += 1
        else:
            self.b_wins += 1

    def row(self) -> tuple[Any, ...]:
        """The tally in `TALLY_COLUMNS` order."""
        return (self.criterion, self.a_wins, self.b_wins, self.ties, self.inconsistent,
                self.failed, self.judged, self.flip_rate)


def tallies(criteria_of_pairs: Iterable[Sequence[CriterionJudgement]]) -> list[Tally]:
    """Per criterion (first-seen order) and, last, over all of them (`OVERALL`)."""
    by_name: dict[str, Tally] = {}
    overall = Tally(OVERALL)
    for criteria in criteria_of_pairs:
        for judgement in criteria:
            name = judgement["criterion"]
            by_name.setdefault(name, Tally(name)).add(judgement)
            overall.add(judgement)
    return [*by_name.values(), overall]


def flip_rate_text(overall: Tally) -> str:
    """The overall flip rate as a sentence, e.g. "flip rate 0.25 (3 of 12 judgements)"."""
    if overall.flip_rate is None:
        return "flip rate: none (no criterion was judged in both orders)"
    return (f"flip rate {overall.flip_rate:.2f} ({overall.inconsistent} of {overall.judged} "
            "criterion judgements changed with the order)")


def csv_rows(pairs: Iterable[tuple[str, Sequence[CriterionJudgement], str | None]]
             ) -> Iterator[tuple[Any, ...]]:
    """One row per (pair, criterion) in `CSV_COLUMNS` order, scrubbed of secrets.

    Args:
        pairs: ``(pair_id, criteria, pair error)``; a pair that could not be judged at all
            gives one row with an empty criterion and its error.

    """
    known = secret_values()

    def text(value: str | None) -> str:
        return redact(value, secrets=known) if value else ""

    for pair_id, criteria, error in pairs:
        if not criteria:
            yield (text(pair_id), "", "", "", "", "", "", text(error))
        for c in criteria:
            yield (text(pair_id), text(c["criterion"]), c["winner_a_first"] or "",
                   c["winner_b_first"] or "", c["winner"] or "", text(c["reason_a_first"]),
                   text(c["reason_b_first"]), text(c["error"]))


def judgement_cost(prices: Prices, grader_model: str, calls: Iterable[CallUsage]
                   ) -> Decimal | None:
    """What a judgement's calls cost at ``grader_model``'s price (None: unknown)."""
    total = Decimal(0)
    for call in calls:
        cost = call_cost(prices, grader_model, call)
        if cost is None:
            return None
        total += cost
    return total


__all__ = ["CSV_COLUMNS", "OVERALL", "TALLY_COLUMNS", "Tally", "csv_rows", "flip_rate_text",
           "judgement_cost", "tallies"]
