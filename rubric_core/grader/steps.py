"""One grader pass, written once as a generator of steps, and the two tiny drivers that run it.

The pass yields *steps* (call the model, call a tool, sleep) and is sent back each step's
result; `drive_sync` and `drive_async` perform the steps, so the sync and async hooks share
every decision. Within the pass, each model call is its own sub-generator (`yield from`) that
retries transient errors, and the pass itself reads: verdict → coverage → evidence tools. The
drivers send each model call with its provider's prompt-cache hint
(`rubric_core.grader.cache.cache_hints`); the pass never sees it.

What the pass trusts, and what it does not:

- A verdict is read as `verdict_args` reads it, and checked against the ``GraderResponse``
  schema; a malformed one is sent back once with what is wrong.
- Its criteria are matched to the rubric by name only (`match_criteria`); a verdict that leaves
  criteria out is sent back once, and if that correction fails, the first verdict stands with
  those criteria unverified.
- A pass that fails raises an exception carrying a `GraderFailure` (`grader_failure`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.errors import GraphBubbleUp
from pydantic import ValidationError

from rubric_core.grader.cache import cache_hints
from rubric_core.grader.criteria import (
    bound_response,
    coverage_problem,
    match_criteria,
    recompute_result,
)
from rubric_core.grader.failure import (
    RAW_REPLY_CHAR_LIMIT,
    GraderOutputError,
    describe_failure,
    grader_failure,
    model_label,
)
from rubric_core.grader.reply import VERDICT_TOOL, raw_reply_text, verdict_args
from rubric_core.grader.transcript import shorten
from rubric_core.http_retry import exception_retry_after_s, http_status, is_transient
from rubric_core.types import GRADER_ATTEMPT_KEY, GraderResponse
from rubric_core.usage import usage_counts

if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Sequence

    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import BaseMessage
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool

    from rubric_core.grader.criteria import CriteriaMatch
    from rubric_core.types import CriterionVerdict

logger = logging.getLogger(__name__)

MAX_TOOL_ROUNDS = 8
"""Evidence-tool rounds a grader may take in one pass before it must give a verdict."""


@dataclass(frozen=True)
class CallModel:
    """Step: call the grader model with these messages."""

    messages: list[BaseMessage]
    attempt: int = 0
    """0 for a first try; n for the n-th retry of the same request after a transient error."""


@dataclass(frozen=True)
class CallTool:
    """Step: run one evidence tool call and return its ToolMessage."""

    tool: BaseTool
    call: dict[str, Any]


@dataclass(frozen=True)
class Sleep:
    """Step: wait before retrying a transient failure."""

    seconds: float


Step: TypeAlias = CallModel | CallTool | Sleep


@dataclass
class GradeOutcome:
    """What a finished pass hands back to the middleware."""

    response: GraderResponse
    """The verdict; its result recomputed from the rubric's criteria (see `grade_steps`)."""
    criteria: list[CriterionVerdict]
    """Verdicts of the answered criteria, in rubric order, named as in the rubric."""
    missing: list[str]
    """Rubric criteria still unanswered after the coverage correction: not verified."""
    input_tokens: int | None = None
    """Grader input tokens over the pass, where the provider reports usage."""
    output_tokens: int | None = None
    """Grader output tokens over the pass, where the provider reports usage."""
    cached_input_tokens: int | None = None
    """Of the input tokens, those read from the provider's prompt cache (None: no usage)."""
    model_calls: int = 0
    """Grader model calls that returned a reply."""
    tool_calls: list[str] = field(default_factory=list)
    """Evidence tools the grader called, in order."""
    unknown_criteria: list[str] = field(default_factory=list)
    """Names in the accepted verdict that match no rubric criterion; never counted."""
    retries: int = 0
    """Retries made after transient errors during the pass."""


# --------------------------------------------------------------------------- the pass


@dataclass
class _Tally:
    """What a pass has spent so far; written into whichever outcome it returns."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None
    model_calls: int = 0
    retries: int = 0
    tool_calls: list[str] = field(default_factory=list)

    def count_reply(self, reply: AIMessage) -> None:
        """Count one reply and the tokens it reports (usage stays None until one reports)."""
        self.model_calls += 1
        if not reply.usage_metadata:
            return
        counts = usage_counts(reply.usage_metadata)
        self.input_tokens = (self.input_tokens or 0) + (counts.input_tokens or 0)
        self.output_tokens = (self.output_tokens or 0) + (counts.output_tokens or 0)
        self.cached_input_tokens = ((self.cached_input_tokens or 0)
                                    + (counts.cached_input_tokens or 0))

    def outcome(self, response: GraderResponse, match: CriteriaMatch) -> GradeOutcome:
        """The outcome of `response` as matched, counts not yet written (see `settle`).

        Its tool list is the tally's own, so a kept first verdict also lists the tools called
        during its coverage correction.
        """
        return GradeOutcome(
            response=recompute_result(response, match), criteria=match.verdicts,
            missing=match.missing, tool_calls=self.tool_calls, unknown_criteria=match.unknown,
        )

    def settle(self, outcome: GradeOutcome) -> GradeOutcome:
        """`outcome` with the pass's totals written into it, as it is returned."""
        outcome.input_tokens, outcome.output_tokens = self.input_tokens, self.output_tokens
        outcome.cached_input_tokens = self.cached_input_tokens
        outcome.model_calls, outcome.retries = self.model_calls, self.retries
        return outcome


def _first_stands(first: GradeOutcome, tally: _Tally, exc: BaseException) -> GradeOutcome:
    """The verdict that left criteria out, returned when its coverage correction failed."""
    logger.warning("the grader's coverage correction failed (%s: %s); keeping its first "
                   "verdict, unverified", type(exc).__name__, exc)
    return tally.settle(first)


def _call_model(
    convo: list[BaseMessage], tally: _Tally, max_retries: int, backoff_s: float
) -> Generator[Step, Any, AIMessage | Exception]:
    """One model call, transient errors retried: the reply, or the error that ended the tries.

    The error is returned, not raised, because the pass decides what it means (a pending
    verdict may stand). A reply that is not JSON is the exception: it always ends the pass.
    """
    attempt = 0
    while True:
        try:
            reply = yield CallModel(convo, attempt)
        except GraphBubbleUp:
            raise
        except Exception as exc:
            if attempt >= max_retries or not is_transient(exc):
                if isinstance(exc, json.JSONDecodeError):
                    msg = (
                        "the grader's server sent a reply that is not valid JSON "
                        f"({attempt + 1} attempt(s), last: {exc}); check that its base URL "
                        "points at an OpenAI-compatible API"
                    )
                    err = GraderOutputError(msg)
                    body = shorten(str(exc.doc), RAW_REPLY_CHAR_LIMIT)
                    raise describe_failure(err, retries=tally.retries, raw_reply=body) from exc
                return exc
            delay = exception_retry_after_s(exc) or backoff_s * (2**attempt)
            logger.warning("grader call failed (%s); retry %d in %.1fs",
                           type(exc).__name__, attempt + 1, delay)
            attempt += 1
            tally.retries += 1
            yield Sleep(delay)
            continue
        if not isinstance(reply, AIMessage):
            reply = AIMessage(content=str(getattr(reply, "content", reply)))
        tally.count_reply(reply)
        return reply


def _read_verdict(reply: AIMessage, broken: list[Any]) -> GraderResponse:
    """The verdict `reply` carries, bounded; raises what the grader must be told is wrong."""
    raw = verdict_args(reply)
    if raw is None and broken:
        problem = ("Your GraderResponse arguments are not valid JSON: "
                   f"{broken[0].get('error') or broken[0].get('args')}")
        raise GraderOutputError(problem)
    if raw is None:
        problem = "No verdict: you must call the GraderResponse tool."
        raise GraderOutputError(problem)
    return bound_response(GraderResponse.model_validate(raw))


def _run_tools(
    evidence: list[Any], by_name: dict[str, BaseTool], tally: _Tally
) -> Generator[Step, Any, list[ToolMessage]]:
    """Run one round of evidence tool calls; every call gets an answer, errors included."""
    results: list[ToolMessage] = []
    for call in evidence:
        tally.tool_calls.append(call["name"])
        tool = by_name.get(call["name"])
        if tool is None:
            known = ", ".join(sorted(by_name)) or "none"
            results.append(_tool_error(call, f"Unknown tool {call['name']!r}. Tools: {known}."))
            continue
        try:
            result = yield CallTool(tool, dict(call))
        except Exception as exc:  # a tool that raises must not end the pass
            results.append(_tool_error(call, f"Tool raised {type(exc).__name__}: {exc}"))
            continue
        results.append(result if isinstance(result, ToolMessage) else _tool_result(call, result))
    return results


def grade_steps(
    messages: list[BaseMessage],
    criteria: Sequence[str],
    tools: Sequence[BaseTool],
    *,
    max_retries: int = 2,
    backoff_s: float = 0.5,
) -> Generator[Step, Any, GradeOutcome]:
    """One grader pass as a sequence of steps; the driver performs each and sends back the result.

    A transient model error is retried up to `max_retries` times, after the server's
    Retry-After (`retry_after_s`) when it gives a positive one, else after `backoff_s`
    doubling per retry. A verdict that fails validation, or one that leaves out rubric
    criteria, is sent back once with what is wrong. The accepted verdict's criteria are
    matched by name (`match_criteria`) and its result recomputed from them: ``failed`` stays,
    otherwise ``satisfied`` exactly when every answered rubric criterion passes (criteria left
    out are the middleware's to mark unverified).

    Raises:
        GraderOutputError: The grader's verdict stayed malformed after one correction, its
            server's replies were not JSON, or it called tools for too many rounds.
        Exception: A non-transient model error, or a transient one after `max_retries`.
        Every one of these carries a `GraderFailure` (`grader_failure`) and names it.

    """
    convo = list(messages)
    by_name = {t.name: t for t in tools}
    tally = _Tally()
    corrected_format = False
    tool_rounds = 0
    # The verdict that left criteria out, kept while its coverage correction is pending: if the
    # correction itself fails, this verdict stands, unverified, instead of a grader_error.
    first: GradeOutcome | None = None

    while True:
        reply = yield from _call_model(convo, tally, max_retries, backoff_s)
        if isinstance(reply, Exception):
            if first is not None:
                return _first_stands(first, tally, reply)
            raise describe_failure(reply, status=http_status(reply),
                                   retryable=is_transient(reply), retries=tally.retries)
        verdicts = [c for c in reply.tool_calls if c["name"] == VERDICT_TOOL]
        evidence = [c for c in reply.tool_calls if c["name"] != VERDICT_TOOL]
        broken = [c for c in reply.invalid_tool_calls if c.get("name") == VERDICT_TOOL]

        if verdicts or broken or not evidence:
            # The verdict: well formed, or sent back once with what is wrong.
            try:
                response = _read_verdict(reply, broken)
            except (ValidationError, GraderOutputError) as exc:
                if first is not None:
                    return _first_stands(first, tally, exc)
                if corrected_format:
                    msg = f"grader returned an unusable verdict twice: {_short_error(exc)}"
                    err = GraderOutputError(msg)
                    raise describe_failure(err, retries=tally.retries,
                                           raw_reply=raw_reply_text(reply)) from exc
                corrected_format = True
                problem = (
                    f"Your verdict was rejected: {_short_error(exc)}. Call GraderResponse again."
                )
                convo += _correction(reply, verdicts, evidence, problem)
                continue
            # Its coverage: criteria left out are asked for once.
            match = match_criteria(criteria, response)
            if match.missing and first is None and response.result != "failed":
                first = tally.outcome(response, match)
                convo += _correction(reply, verdicts, evidence, coverage_problem(criteria, match))
                continue
            return tally.settle(tally.outcome(response, match))

        # Evidence tools, for a bounded number of rounds.
        tool_rounds += 1
        if tool_rounds > MAX_TOOL_ROUNDS:
            msg = f"grader called tools {MAX_TOOL_ROUNDS} rounds without giving a verdict"
            if first is not None:
                return _first_stands(first, tally, GraderOutputError(msg))
            raise describe_failure(GraderOutputError(msg), retries=tally.retries,
                                   raw_reply=raw_reply_text(reply))
        convo.append(reply)
        convo += yield from _run_tools(evidence, by_name, tally)


def _short_error(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'verdict'}: {e['msg']}" for e in exc.errors()
        )[:1500]
    return str(exc)[:1500]


def _tool_error(call: Any, text: str) -> ToolMessage:
    return ToolMessage(text, tool_call_id=call.get("id") or "", name=call.get("name") or "tool",
                       status="error")


def _tool_result(call: Any, result: Any) -> ToolMessage:
    text = result if isinstance(result, str) else json.dumps(result, default=str)
    return ToolMessage(text, tool_call_id=call.get("id") or "", name=call["name"])


def _correction(
    reply: AIMessage, verdicts: list[Any], evidence: list[Any], problem: str
) -> list[BaseMessage]:
    """Messages that answer every tool call of `reply` (valid or not) and carry the correction."""
    invalid = list(reply.invalid_tool_calls)
    if not reply.tool_calls and not invalid:
        return [reply, HumanMessage(problem)]
    out: list[BaseMessage] = [reply]
    out += [_tool_error(c, problem) for c in verdicts]
    out += [_tool_error(c, "Not run: the verdict was rejected.") for c in evidence]
    # Providers send invalid calls back as calls; each needs its answer, the first the problem.
    out += [_tool_error(c, problem if not verdicts and i == 0 else "Not run: invalid arguments.")
            for i, c in enumerate(invalid)]
    return out


# --------------------------------------------------------------------------- drivers


def bind_grader(model: BaseChatModel, tools: Sequence[BaseTool]) -> Any:
    """The grader model with the evidence tools and the verdict tool bound."""
    return model.bind_tools([*tools, GraderResponse])


def _call_config(config: RunnableConfig | None, step: CallModel) -> RunnableConfig | None:
    """The config of a grader call: a retry says which attempt it is (`GRADER_ATTEMPT_KEY`)."""
    if not step.attempt:
        return config
    metadata = {**((config or {}).get("metadata") or {}), GRADER_ATTEMPT_KEY: step.attempt}
    return {**(config or {}), "metadata": metadata}


def _advance(
    steps: Generator[Step, Any, GradeOutcome], send: Any, error: BaseException | None, bound: Any
) -> Step | GradeOutcome:
    """The pass's next step, or its outcome; a failure leaves it naming the grader model."""
    try:
        return steps.throw(error) if error is not None else steps.send(send)
    except StopIteration as stop:
        outcome: GradeOutcome = stop.value
        return outcome
    except Exception as exc:
        if grader_failure(exc) is not None:
            describe_failure(exc, model=model_label(bound))
        raise


def drive_sync(
    steps: Generator[Step, Any, GradeOutcome],
    bound: Any,
    config: RunnableConfig | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> GradeOutcome:
    """Run a pass synchronously."""
    send: Any = None
    error: BaseException | None = None
    while not isinstance(step := _advance(steps, send, error, bound), GradeOutcome):
        send, error = None, None
        try:
            if isinstance(step, CallModel):
                messages, options = cache_hints(bound, step.messages)
                send = bound.invoke(messages, _call_config(config, step), **options)
            elif isinstance(step, CallTool):
                send = step.tool.invoke({**step.call, "type": "tool_call"}, config)
            else:
                sleep(step.seconds)
        except Exception as exc:
            error = exc
    return step


async def drive_async(
    steps: Generator[Step, Any, GradeOutcome],
    bound: Any,
    config: RunnableConfig | None = None,
) -> GradeOutcome:
    """Run a pass asynchronously (same steps, awaited)."""
    send: Any = None
    error: BaseException | None = None
    while not isinstance(step := _advance(steps, send, error, bound), GradeOutcome):
        send, error = None, None
        try:
            if isinstance(step, CallModel):
                messages, options = cache_hints(bound, step.messages)
                send = await bound.ainvoke(messages, _call_config(config, step), **options)
            elif isinstance(step, CallTool):
                send = await step.tool.ainvoke({**step.call, "type": "tool_call"}, config)
            else:
                await asyncio.sleep(step.seconds)
        except Exception as exc:
            error = exc
    return step
