"""One order of one pair, written once as a generator of steps, and the driver that runs it.

The shape of the grading pass (`rubric_core.grader.steps`): `order_steps` yields the grader's
own steps (`CallModel`, `Sleep`) and is sent back each step's result; `drive` performs them.
What it trusts, and what it does not:

- a transient model error (timeout, 429, 5xx) is retried up to ``max_retries`` times, after the
  server's Retry-After when it gives one, else after ``backoff_s`` doubling per retry
  (`rubric_core.http_retry`); any other error ends the order as a recorded failure;
- the reply is read by name against the rubric (`rubric_core.pairwise.schema.read_reply`); a
  reply with no usable verdict, or one that leaves criteria out, is asked once more, with what
  was wrong, in a fresh call (the bad reply is not sent back: a server that takes only plain
  text messages accepts the correction; after a reply that called no tool, with
  ``tool_choice="required"`` where the model takes it: `Correction`). What the first reply
  judged stands; the correction fills in only the criteria it lacked, and what is still
  missing is recorded as missing, with the reason, never guessed.

Verdicts come back in the pair's own terms: with B shown first, the grader's ``a`` is the
pair's ``b``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.errors import GraphBubbleUp

from rubric_core.grader import CallModel, Sleep, message_text, raw_reply_text, shorten
from rubric_core.http_retry import exception_retry_after_s, http_status, is_transient
from rubric_core.pairwise.schema import Reading, correction, read_reply
from rubric_core.pairwise.types import OrderVerdict
from rubric_core.redact import error_text
from rubric_core.types import GRADER_ATTEMPT_KEY

if TYPE_CHECKING:
    from collections.abc import Generator, Sequence

    from langchain_core.messages import BaseMessage
    from langchain_core.runnables import RunnableConfig

    from rubric_core.grader import Step
    from rubric_core.pairwise.types import Order, Winner

ERROR_CHAR_LIMIT = 4_000
"""A failed order's error text (with the unusable reply) is kept up to this size."""

_SWAP: dict[Winner, Winner] = {"a": "b", "b": "a", "tie": "tie"}


@dataclass(frozen=True)
class Correction(CallModel):
    """Step: the one correction call of an order.

    ``required`` after a reply that called no tool at all: a server may ignore a
    ``tool_choice`` naming the tool (llama.cpp's ``llama-server`` takes only the strings
    ``auto``, ``none`` and ``required`` there, and reads anything else as ``auto``), so the
    driver sends this call with ``tool_choice="required"`` where the model takes it (one tool
    is bound: it forces the same call).
    """

    required: bool = False


def in_pair_terms(order: Order, winner: Winner) -> Winner:
    """A winner as the grader named it in `order` (``a``: shown first), in the pair's terms."""
    return winner if order == "a_first" else _SWAP[winner]


def _call(messages: list[BaseMessage], max_retries: int, backoff_s: float,
          retries: list[int], *, correction: bool = False, required: bool = False,
          ) -> Generator[Step, Any, AIMessage | Exception]:
    """One model call, transient errors retried: the reply, or the error that ended the tries."""
    attempt = 0
    while True:
        try:
            reply = yield (Correction(messages, attempt=attempt, required=required) if correction
                           else CallModel(messages, attempt=attempt))
        except GraphBubbleUp:
            raise
        except Exception as exc:
            if attempt >= max_retries or not is_transient(exc):
                return exc
            delay = exception_retry_after_s(exc) or backoff_s * (2**attempt)
            attempt += 1
            retries[0] += 1
            yield Sleep(delay)
            continue
        if not isinstance(reply, AIMessage):
            reply = AIMessage(content=str(getattr(reply, "content", reply)))
        return reply


def _failure(exc: Exception, retries: int) -> str:
    facts = [f"HTTP {status}"] if (status := http_status(exc)) is not None else []
    facts.append(f"{retries} {'retry' if retries == 1 else 'retries'} made")
    return shorten(f"the grader call failed: {error_text(exc)} ({', '.join(facts)})",
                   ERROR_CHAR_LIMIT)


def _unusable(reading: Reading, reply: AIMessage) -> str:
    return shorten(f"the grader gave no usable verdict after one correction: {reading.error}."
                   f"\nGrader reply as received:\n{raw_reply_text(reply)}", ERROR_CHAR_LIMIT)


def _left_out(why: str, reply: AIMessage) -> str:
    text = message_text(reply).strip()  # a grader's own note on what it did not judge
    said = f" (the grader's note: {shorten(text, 600)})" if text else ""
    return f"{why}, also after one correction{said}"


def order_steps(
    messages: list[BaseMessage], criteria: Sequence[str], order: Order, *,
    max_retries: int = 2, backoff_s: float = 0.5,
) -> Generator[Step, Any, OrderVerdict]:
    """One order's call, its retries and its one correction, as steps (see the module text)."""
    retries = [0]
    reply = yield from _call(messages, max_retries, backoff_s, retries)
    if isinstance(reply, Exception):
        return OrderVerdict(order, {}, error=_failure(reply, retries[0]))
    first = read_reply(reply, criteria)
    reading = first
    if first.error is not None or first.problems:
        asked = [*messages, HumanMessage(correction(criteria, first))]
        no_call = not reply.tool_calls and not reply.invalid_tool_calls
        again = yield from _call(asked, max_retries, backoff_s, retries, correction=True,
                                 required=no_call)
        if isinstance(again, Exception):
            if first.error is not None:
                return OrderVerdict(order, {}, error=_failure(again, retries[0]))
            why = f"the correction call failed: {_failure(again, retries[0])}"
            return _verdict(order, first, dict.fromkeys(first.problems, why))
        second = read_reply(again, criteria)
        if first.error is not None and second.error is not None:
            return OrderVerdict(order, {}, error=_unusable(second, again))
        if first.error is not None:
            reading = second
        else:  # what the first reply judged stands; the correction fills in the rest
            filled = {i: w for i, w in second.winners.items() if i in first.problems}
            reading = Reading({**first.winners, **filled}, unknown=first.unknown + second.unknown,
                              problems={i: why for i, why in first.problems.items()
                                        if i not in filled})
        why_missing = {i: _left_out(second.problems.get(i, why), again)
                       for i, why in reading.problems.items()}
        return _verdict(order, reading, why_missing)
    return _verdict(order, reading, {})


def _verdict(order: Order, reading: Reading, missing: dict[int, str]) -> OrderVerdict:
    winners = {i: (in_pair_terms(order, w), reason) for i, (w, reason) in reading.winners.items()}
    return OrderVerdict(order, winners, missing=missing, unknown=list(reading.unknown))


def _config(config: RunnableConfig | None, step: CallModel) -> RunnableConfig | None:
    """A retry's call says which attempt it is (`GRADER_ATTEMPT_KEY`), as the grader's do."""
    if not step.attempt:
        return config
    metadata = {**((config or {}).get("metadata") or {}), GRADER_ATTEMPT_KEY: step.attempt}
    return {**(config or {}), "metadata": metadata}


async def drive(steps: Generator[Step, Any, OrderVerdict], bound: Any,
                config: RunnableConfig | None = None, *, required: Any = None) -> OrderVerdict:
    """Run one order's steps on `bound` (the grader with the verdict tool bound).

    `required`, when given, is the grader bound with ``tool_choice="required"``: it takes a
    `Correction` that asks for it.
    """
    send: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.throw(error) if error is not None else steps.send(send)
        except StopIteration as stop:
            verdict: OrderVerdict = stop.value
            return verdict
        send, error = None, None
        try:
            if isinstance(step, CallModel):
                target = (required if isinstance(step, Correction) and step.required
                          and required is not None else bound)
                send = await target.ainvoke(step.messages, _config(config, step))
            elif isinstance(step, Sleep):
                await asyncio.sleep(step.seconds)
        except Exception as exc:
            error = exc


__all__ = ["ERROR_CHAR_LIMIT", "Correction", "drive", "in_pair_terms", "order_steps"]
