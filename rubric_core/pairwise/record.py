"""Judging pairs into the store, and a stored judgement read back as tallies and rows.

`judge_and_record` is the one library call the CLI, the app and the bench make: it starts a
stored judgement (`Store.create_pairwise`), judges the pairs (`judge_pairs`) and records each
pair with its calls as it is judged, so a judgement cut short keeps what it judged.
`StoredJudgement` reads one back: its pairs, per-criterion tallies and flip rate, the CSV rows
and its cost.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from rubric_core.pairwise.judge import judge_pairs
from rubric_core.pairwise.results import csv_rows, judgement_cost, tallies
from rubric_core.types import DEFAULT_CONCURRENCY

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from decimal import Decimal

    from langchain_core.language_models import BaseChatModel

    from rubric_core.pairwise.judge import OnJudged
    from rubric_core.pairwise.results import Tally
    from rubric_core.pairwise.types import CriterionJudgement, Pair, PairJudgement, Source
    from rubric_core.prices import Prices
    from rubric_core.store import PairwiseItem, PairwiseRecord, Store


@dataclass(frozen=True)
class JudgementSpec:
    """What a judgement is, besides its pairs: how it is shown, stored and judged."""

    name: str
    """Short human label."""
    source: Source
    """Where it was started."""
    grader_model: str
    """The grader's model string (for the record and for pricing its calls)."""
    rubric: str = ""
    """The rubric of pairs without their own."""
    base_url: str | None = None
    """The grader's OpenAI-compatible base URL, if any (for the record)."""
    label_a: str = "a"
    """What answer A is."""
    label_b: str = "b"
    """What answer B is."""


async def ajudge_and_record(store: Store, grader: BaseChatModel, pairs: Sequence[Pair],
                            spec: JudgementSpec, *, concurrency: int = DEFAULT_CONCURRENCY,
                            on_judged: OnJudged | None = None) -> PairwiseRecord:
    """Judge `pairs` with `grader` and record them in `store` (see the module docstring).

    Args:
        store: The database.
        grader: The grader model (built from ``spec.grader_model``).
        pairs: The pairs, in order.
        spec: The judgement's label, source, model string and rubric.
        concurrency: Grader calls under way at once.
        on_judged: Also told of each pair once it is recorded.

    Returns:
        The stored judgement.

    """
    record = await store.acall(
        store.create_pairwise, name=spec.name, source=spec.source,
        grader_model=spec.grader_model, base_url=spec.base_url, rubric=spec.rubric,
        label_a=spec.label_a, label_b=spec.label_b)

    async def keep(index: int, judged: PairJudgement) -> None:
        await store.acall(
            store.add_pairwise_pair, record.judgement_id, index, pair_id=judged.pair.pair_id,
            prompt=judged.pair.prompt, answer_a=judged.pair.a, answer_b=judged.pair.b,
            rubric=judged.rubric, criteria=cast("list[dict[str, Any]]", judged.criteria),
            error=judged.error, duration_s=judged.duration_s, calls=judged.calls)
        if on_judged is not None and (pending := on_judged(index, judged)) is not None:
            await pending

    await judge_pairs(grader, pairs, spec.rubric, concurrency=concurrency, on_judged=keep)
    return store.get_pairwise(record.judgement_id) or record


def judge_and_record(store: Store, grader: BaseChatModel, pairs: Sequence[Pair],
                     spec: JudgementSpec, *, concurrency: int = DEFAULT_CONCURRENCY
                     ) -> PairwiseRecord:
    """`ajudge_and_record` from synchronous code (the CLI, a page's script run)."""
    return asyncio.run(ajudge_and_record(store, grader, pairs, spec, concurrency=concurrency))


@dataclass(frozen=True)
class StoredJudgement:
    """A stored judgement with its pairs, read once."""

    record: PairwiseRecord
    """The judgement."""
    items: list[PairwiseItem]
    """Its pairs, in order."""

    @classmethod
    def read(cls, store: Store, judgement_id: str) -> StoredJudgement:
        """Read a judgement and its pairs.

        Raises:
            KeyError: No such judgement.

        """
        record = store.get_pairwise(judgement_id)
        if record is None:
            msg = f"no pairwise judgement {judgement_id!r}"
            raise KeyError(msg)
        return cls(record, store.pairwise_items(judgement_id))

    def criteria(self) -> list[list[CriterionJudgement]]:
        """Each pair's criterion judgements."""
        return [cast("list[CriterionJudgement]", item.criteria) for item in self.items]

    def tallies(self) -> list[Tally]:
        """Per criterion, then over every criterion (`rubric_core.pairwise.results.tallies`)."""
        return tallies(self.criteria())

    def csv_rows(self) -> Iterator[tuple[Any, ...]]:
        """One row per (pair, criterion), in `CSV_COLUMNS` order."""
        return csv_rows((item.pair_id, crit, item.error)
                        for item, crit in zip(self.items, self.criteria(), strict=True))

    def failed_pairs(self) -> list[PairwiseItem]:
        """Pairs that could not be judged at all (their rubric had no criteria)."""
        return [item for item in self.items if item.error]

    def cost(self, store: Store, prices: Prices) -> Decimal | None:
        """What its calls cost at its grader's price (None: unknown)."""
        return judgement_cost(prices, self.record.grader_model,
                              store.pairwise_call_usage(self.record.judgement_id))


__all__ = ["JudgementSpec", "StoredJudgement", "ajudge_and_record", "judge_and_record"]
