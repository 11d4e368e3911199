"""Judging pairs: each pair in both orders, the two verdicts combined per criterion.

`judge_pairs` judges every pair against its rubric (its own, else the judgement's): one grader
call with A shown first and one with B shown first (`rubric_core.pairwise.steps`), each with
the per-rubric verdict tool forced (``tool_choice`` naming it,
`rubric_core.pairwise.schema.verdict_tool`). Per criterion the two winners, mapped back to the
pair's terms, combine into their common winner or ``inconsistent`` (`combine`); a criterion an
order could not judge has no combined winner and says why (``error``): never a guess.

Every call is traced as the grader's calls are (`rubric_core.calls`: the process's one call
tracer on the grader model, a log opened per order under a thread id of its own), so each
`PairJudgement` carries its call records: tokens, latency, retries, messages and reply, which
the store keeps and costs price (`rubric_core.pairwise.results.judgement_cost`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from rubric_core.calls import attach, close_log, open_log
from rubric_core.pairwise.offline import pairwise_grader
from rubric_core.pairwise.prompt import PAIRWISE_TOOL, build_pairwise_messages
from rubric_core.pairwise.schema import verdict_tool
from rubric_core.pairwise.steps import drive, order_steps
from rubric_core.pairwise.types import (
    INCONSISTENT,
    ORDERS,
    CriterionJudgement,
    OrderVerdict,
    Pair,
    PairJudgement,
)
from rubric_core.redact import error_text
from rubric_core.rubric import RubricError, parse_criteria, validate_rubric
from rubric_core.types import DEFAULT_CONCURRENCY, PASS_ITERATION_KEY

if TYPE_CHECKING:
    from collections.abc import Sequence

    from langchain_core.language_models import BaseChatModel

    from rubric_core.pairwise.types import Order, Outcome, Winner

_SHOWN = {"a_first": "A shown first", "b_first": "B shown first"}

OnJudged = Callable[[int, PairJudgement], Awaitable[None] | None]
"""Told of each pair as it is judged: its index among the pairs, and its judgement."""


def combine(a_first: Winner | None, b_first: Winner | None) -> Outcome | None:
    """Both orders' winners (pair terms) as one outcome; None when either is missing."""
    if a_first is None or b_first is None:
        return None
    return a_first if a_first == b_first else INCONSISTENT


def criterion_judgements(criteria: Sequence[str], a_first: OrderVerdict,
                         b_first: OrderVerdict) -> list[CriterionJudgement]:
    """Per criterion, both orders' winners and reasons side by side, and their outcome."""
    out: list[CriterionJudgement] = []
    for index, name in enumerate(criteria):
        shown = {v.order: v.winners.get(index) for v in (a_first, b_first)}
        why = {v.order: v.error or v.missing.get(index) for v in (a_first, b_first)
               if shown[v.order] is None}
        if len(why) == len(ORDERS) and len(set(why.values())) == 1:
            errors = [f"both orders: {why['a_first']}"]
        else:
            errors = [f"{_SHOWN[order]}: {text}" for order, text in why.items() if text]
        first, second = shown["a_first"], shown["b_first"]
        out.append({
            "criterion": name,
            "winner_a_first": first[0] if first else None,
            "winner_b_first": second[0] if second else None,
            "winner": combine(first[0] if first else None, second[0] if second else None),
            "reason_a_first": first[1] if first else "",
            "reason_b_first": second[1] if second else "",
            "error": "; ".join(errors) or None,
        })
    return out


def _bind(grader: BaseChatModel, criteria: Sequence[str]) -> tuple[Any, Any]:
    """The grader with the verdict tool forced by name, and forced as ``"required"``.

    The second only for models on the OpenAI client, whose OpenAI-compatible servers may read
    only ``"required"`` (`rubric_core.pairwise.steps.Correction`); None for other models.
    """
    tool = verdict_tool(criteria)
    named = grader.bind_tools([tool], tool_choice=PAIRWISE_TOOL)
    if "BaseChatOpenAI" not in {cls.__name__ for cls in type(grader).__mro__}:
        return named, None
    return named, grader.bind_tools([tool], tool_choice="required")


async def _order(bound: tuple[Any, Any], pair: Pair, criteria: list[str], order: Order, *,
                 max_retries: int, backoff_s: float) -> OrderVerdict:
    first, second = (pair.a, pair.b) if order == "a_first" else (pair.b, pair.a)
    messages = build_pairwise_messages(pair.prompt, criteria, first, second)
    thread = f"pairwise-{uuid.uuid4().hex}"
    log = open_log(thread)
    config: Any = {"metadata": {"thread_id": thread, PASS_ITERATION_KEY: ORDERS.index(order)},
                   "run_name": f"pairwise {order}"}
    try:
        verdict = await drive(order_steps(messages, criteria, order, max_retries=max_retries,
                                          backoff_s=backoff_s), bound[0], config,
                              required=bound[1])
    finally:
        calls = log.drain()
        close_log(thread, log)
    return OrderVerdict(verdict.order, verdict.winners, verdict.error, verdict.missing,
                        verdict.unknown, calls)


def pair_criteria(pair: Pair, rubric: str) -> list[str]:
    """The criteria a pair is judged on: its own rubric's, else `rubric`'s.

    Raises:
        RubricError: The rubric is too large or has too many criteria.

    """
    return parse_criteria(validate_rubric(pair.rubric.strip() or rubric))


async def judge_pair(grader: BaseChatModel, pair: Pair, rubric: str, *,
                     max_retries: int = 2, backoff_s: float = 0.5,
                     gate: asyncio.Semaphore | None = None) -> PairJudgement:
    """One pair in both orders (see the module docstring); problems are recorded, not raised.

    Args:
        grader: The grader model (``rules`` judges with `RulesPairwiseGrader`).
        pair: The pair.
        rubric: The rubric for a pair without its own.
        max_retries: Retries of a call after a transient error.
        backoff_s: The first retry's wait without a Retry-After (doubling per retry).
        gate: Bounds the calls under way at once, over every pair judged with it.

    """
    started = time.perf_counter()
    used = pair.rubric.strip() or rubric
    try:
        criteria = pair_criteria(pair, rubric)
    except RubricError as exc:
        return PairJudgement(pair, used, [], error=f"the rubric cannot be used: {exc}")
    if not criteria:
        return PairJudgement(pair, used, [], error="the rubric has no criteria: give at least "
                                                   "one criterion, one per line")
    model = pairwise_grader(grader)
    attach(model)
    try:
        bound = _bind(model, criteria)
    except Exception as exc:  # a chat model without tool calling: said, not raised
        return PairJudgement(pair, used, [], error="the grader cannot be given the verdict "
                                                   f"tool: {error_text(exc)}")
    gate = gate or asyncio.Semaphore(len(ORDERS))

    async def one(order: Order) -> OrderVerdict:
        async with gate:
            return await _order(bound, pair, criteria, order, max_retries=max_retries,
                                backoff_s=backoff_s)

    a_first, b_first = await asyncio.gather(*(one(order) for order in ORDERS))
    return PairJudgement(
        pair, used, criterion_judgements(criteria, a_first, b_first),
        duration_s=round(time.perf_counter() - started, 6),
        calls=[*a_first.calls, *b_first.calls],
        unknown=list(dict.fromkeys([*a_first.unknown, *b_first.unknown])))


async def judge_pairs(grader: BaseChatModel, pairs: Sequence[Pair], rubric: str, *,
                      concurrency: int = DEFAULT_CONCURRENCY, on_judged: OnJudged | None = None,
                      max_retries: int = 2, backoff_s: float = 0.5) -> list[PairJudgement]:
    """Judge every pair (see the module docstring), at most `concurrency` calls at once.

    Args:
        grader: The grader model.
        pairs: The pairs, in order.
        rubric: The rubric for pairs without their own.
        concurrency: Grader calls under way at once, over all pairs (1 or more).
        on_judged: Told of each pair as it is judged (awaited when it returns an awaitable):
            the store records each pair as it ends, so an interrupted judgement keeps them.
        max_retries: Retries of a call after a transient error.
        backoff_s: The first retry's wait without a Retry-After.

    Returns:
        The judgements, in the order of `pairs`.

    Raises:
        ValueError: `concurrency` below 1.

    """
    if concurrency < 1:
        msg = f"concurrency must be 1 or more, got {concurrency}"
        raise ValueError(msg)
    gate = asyncio.Semaphore(concurrency)

    async def one(index: int, pair: Pair) -> PairJudgement:
        judged = await judge_pair(grader, pair, rubric, max_retries=max_retries,
                                  backoff_s=backoff_s, gate=gate)
        if on_judged is not None and (pending := on_judged(index, judged)) is not None:
            await pending
        return judged

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(pairs))))


__all__ = ["OnJudged", "combine", "criterion_judgements", "judge_pair", "judge_pairs",
           "pair_criteria"]
