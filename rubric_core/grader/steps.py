"""One grader pass, written once as a generator of steps, and the two tiny drivers that run it.

The pass yields *steps* (call the model, call a tool, sleep) and is sent back each step's
result; `drive_sync` and `drive_async` perform the steps, so the sync and async hooks share
every decision. Within the pass, each model call is its own sub-generator (`yield from`) that
retries transient errors, and the pass itself reads: evidence tools → verdict → coverage. The
drivers send each model call with its provider's prompt-cache hint
(`rubric_core.grader.cache.cache_hints`), bound as the step asks (`GraderBinding.runnable`)
and, given a `GraderRun`, through the grader middleware's hooks
(`rubric_core.grader.hook_run`); the pass never sees any of it.

Forcing (`rubric_core.grader.verdict`): given the modes to try (``modes``), once the evidence
rounds are done (the model stops calling evidence tools, or `MAX_TOOL_ROUNDS` is reached, or
there are no tools) the verdict call is forced; with ``force_tools`` each evidence tool is
called once first, each call forced. A forced call the server refuses (`refused`) or ignores
(`rubric_core.grader.reply.forced_reply`) is made again in the next mode; an ignored reply is
not kept, except that in the last mode, ``prompt``, it is read as every reply is read there.

What the pass trusts, and what it does not:

- A verdict is read as `verdict_args` reads it, and checked against the ``GraderResponse``
  schema; a malformed one is sent back once with what is wrong.
- Its criteria are matched to the rubric by name only (`match_criteria`); a verdict that leaves
  criteria out is sent back once, and if that correction fails, the first verdict stands with
  those criteria unverified.
- A reply cut at its output token limit (`rubric_core.grader.reply.was_cut`) whose verdict is
  unusable is sent back once, asked to be shorter; cut twice, the pass fails saying so.
- A pass that fails raises an exception carrying a `GraderFailure` (`grader_failure`), with
  the tokens its calls used.
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
from rubric_core.grader.reply import (
    VERDICT_TOOL,
    forced_reply,
    raw_reply_text,
    verdict_args,
    was_cut,
)
from rubric_core.grader.transcript import shorten
from rubric_core.grader.verdict import GraderBinding
from rubric_core.http_retry import exception_retry_after_s, http_status, is_transient
from rubric_core.types import GRADER_ATTEMPT_KEY, GraderResponse
from rubric_core.usage import usage_counts

if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Sequence

    from langchain_core.messages import BaseMessage
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool

    from rubric_core.grader.criteria import CriteriaMatch
    from rubric_core.grader.hook_run import GraderRun
    from rubric_core.grader.verdict import VerdictMode
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
    force: str | None = None
    """The tool the call must call (the verdict or an evidence tool); None: the model chooses."""
    mode: VerdictMode = "prompt"
    """How ``force`` is made to happen (`rubric_core.grader.verdict`)."""


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
    mode: VerdictMode = "prompt"
    """How the verdict was asked for at the end of the pass: the mode to start the next
    pass of this model in (`rubric_core.grader.verdict`)."""


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

    def settle(self, outcome: GradeOutcome, mode: VerdictMode) -> GradeOutcome:
        """`outcome` with the pass's totals written into it, as it is returned."""
        outcome.input_tokens, outcome.output_tokens = self.input_tokens, self.output_tokens
        outcome.cached_input_tokens = self.cached_input_tokens
        outcome.model_calls, outcome.retries = self.model_calls, self.retries
        outcome.mode = mode
        return outcome

    def fail(self, exc: BaseException, **facts: Any) -> BaseException:
        """`exc` described as the pass's failure, with the tokens its calls used."""
        return describe_failure(exc, retries=self.retries, input_tokens=self.input_tokens,
                                output_tokens=self.output_tokens,
                                cached_input_tokens=self.cached_input_tokens, **facts)


def _first_stands(first: GradeOutcome, tally: _Tally, exc: BaseException,
                  mode: VerdictMode) -> GradeOutcome:
    """The verdict that left criteria out, returned when its coverage correction failed."""
    logger.warning("the grader's coverage correction failed (%s: %s); keeping its first "
                   "verdict, unverified", type(exc).__name__, exc)
    return tally.settle(first, mode)


@dataclass(frozen=True)
class _Refused:
    """A forced call the server refused: its error."""

    error: Exception


_PARAMETERS: dict[str, tuple[str, ...]] = {
    "tool_choice": ("tool", "function"),
    "json_schema": ("response_format", "json_schema", "schema", "format"),
}


def refused(exc: BaseException, mode: VerdictMode) -> bool:
    """Whether a forced call's error says the server does not take that way of forcing.

    An HTTP error (not a bad key, 401 or 403, nor a retryable 408, 409 or 429) whose message
    names what the mode sends: ``tool``/``function`` for ``tool_choice`` (Ollama: "does not
    support tools"), ``response_format``/``schema``/``format`` for ``json_schema``
    (llama.cpp's Python server answers 500 naming ``response_format``). Any other error is
    the call's own: a context overflow is not a reason to call again another way.
    """
    status = http_status(exc)
    if status is None or mode == "prompt" or status in (401, 403, 408, 409, 429):
        return False
    text = str(exc).lower()
    return status >= 400 and any(name in text for name in _PARAMETERS[mode])


def _call_model(
    convo: list[BaseMessage], tally: _Tally, max_retries: int, backoff_s: float,
    force: str | None = None, mode: VerdictMode = "prompt",
) -> Generator[Step, Any, AIMessage | Exception | _Refused]:
    """One model call, transient errors retried: the reply, or the error that ended the tries.

    The error is returned, not raised, because the pass decides what it means (a pending
    verdict may stand; a forced call the server refused is made another way). A reply that is
    not JSON is the exception: it always ends the pass.
    """
    attempt = 0
    while True:
        try:
            reply = yield CallModel(convo, attempt, force, mode)
        except GraphBubbleUp:
            raise
        except Exception as exc:
            if force is not None and refused(exc, mode):
                return _Refused(exc)
            if attempt >= max_retries or not is_transient(exc):
                if isinstance(exc, json.JSONDecodeError):
                    msg = (
                        "the grader's server sent a reply that is not valid JSON "
                        f"({attempt + 1} attempt(s), last: {exc}); check that its base URL "
                        "points at an OpenAI-compatible API"
                    )
                    err = GraderOutputError(msg)
                    body = shorten(str(exc.doc), RAW_REPLY_CHAR_LIMIT)
                    raise tally.fail(err, raw_reply=body) from exc
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
        except GraphBubbleUp:  # an interrupt (a tool hook asking a person) pauses the run
            raise
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
    modes: Sequence[VerdictMode] = ("prompt",),
    force_tools: bool = False,
) -> Generator[Step, Any, GradeOutcome]:
    """One grader pass as a sequence of steps; the driver performs each and sends back the result.

    A transient model error is retried up to `max_retries` times, after the server's
    Retry-After (`retry_after_s`) when it gives a positive one, else after `backoff_s`
    doubling per retry. A verdict that fails validation, or one that leaves out rubric
    criteria, is sent back once with what is wrong. The accepted verdict's criteria are
    matched by name (`match_criteria`) and its result recomputed from them: ``failed`` stays,
    otherwise ``satisfied`` exactly when every answered rubric criterion passes (criteria left
    out are the middleware's to mark unverified).

    Args:
        messages: The grader's messages (`rubric_core.grader.build_grader_messages`).
        criteria: The rubric's criteria.
        tools: The evidence tools.
        max_retries: Retries of a call after a transient error.
        backoff_s: The first retry's delay.
        modes: The ways to force calls to try, in order (`GraderBinding.ladder`); the
            default, ``("prompt",)``, forces nothing (for a model bound by hand).
        force_tools: Call each evidence tool once, each call forced, before the verdict
            (for models that never choose a tool); not possible in ``prompt`` mode.

    Raises:
        GraderOutputError: The grader's verdict stayed malformed after one correction (or was
            cut at its output token limit twice), its server's replies were not JSON, or it
            called tools for too many rounds.
        Exception: A non-transient model error, or a transient one after `max_retries`.
        Every one of these carries a `GraderFailure` (`grader_failure`) and names it.

    """
    convo = list(messages)
    by_name = {t.name: t for t in tools}
    tally = _Tally()
    ladder: list[VerdictMode] = [*modes] if modes else ["prompt"]
    if ladder[-1] != "prompt":
        ladder.append("prompt")
    corrected_format = False
    tool_rounds = 0
    to_force = [t.name for t in tools] if force_tools else []
    free = bool(tools)  # while the model may still choose evidence tools in a forced mode
    # The verdict that left criteria out, kept while its coverage correction is pending: if the
    # correction itself fails, this verdict stands, unverified, instead of a grader_error.
    first: GradeOutcome | None = None

    while True:
        mode = ladder[0]
        force: str | None = None
        if mode != "prompt":
            force = to_force[0] if to_force else (None if free and mode == "tool_choice"
                                                  else VERDICT_TOOL)
        answer = yield from _call_model(convo, tally, max_retries, backoff_s, force, mode)
        if force is not None and not isinstance(answer, Exception):
            obeyed = None if isinstance(answer, _Refused) else forced_reply(answer, force, mode)
            if obeyed is None:
                why = (f"refused it ({type(answer.error).__name__}: {answer.error})"
                       if isinstance(answer, _Refused) else "ignored it")
                ladder.pop(0)
                logger.info("grader call forced by %s: the server %s; next: %s", mode, why,
                            ladder[0])
                if ladder[0] != "prompt" or isinstance(answer, _Refused):
                    continue  # made again in the next mode; an ignored reply is not kept
                to_force = []  # read below as every reply is read in prompt mode
            else:
                answer = obeyed
        if isinstance(answer, _Refused):
            answer = answer.error
        if isinstance(answer, Exception):
            if first is not None:
                return _first_stands(first, tally, answer, ladder[0])
            raise tally.fail(answer, status=http_status(answer), retryable=is_transient(answer))
        reply = answer
        mode = ladder[0]
        verdicts = [c for c in reply.tool_calls if c["name"] == VERDICT_TOOL]
        evidence = [c for c in reply.tool_calls if c["name"] != VERDICT_TOOL]
        broken = [c for c in reply.invalid_tool_calls if c.get("name") == VERDICT_TOOL]

        if force is not None and force != VERDICT_TOOL and mode != "prompt":
            # A forced evidence call: run it (and whatever else it asked for), then the next;
            # after the last one the verdict is forced.
            to_force.pop(0)
            free = False
            convo.append(reply)
            convo += yield from _run_tools(evidence, by_name, tally)
            convo += [_tool_error(c, "Not taken: give the verdict once the evidence is in.")
                      for c in verdicts]
            convo += [_tool_error(c, f"Not run: {c.get('error') or 'invalid arguments'}.")
                      for c in reply.invalid_tool_calls]
            continue

        if mode != "prompt" and evidence and not (verdicts or broken):
            # Evidence the model chose: run it; past the round limit, the verdict is forced.
            tool_rounds += 1
            convo.append(reply)
            convo += yield from _run_tools(evidence, by_name, tally)
            free = free and tool_rounds < MAX_TOOL_ROUNDS
            continue
        if mode != "prompt" and not (verdicts or broken):
            free = False  # prose instead of a call: the verdict is forced next, on this convo
            continue

        if verdicts or broken or not evidence:
            free = False
            # The verdict: well formed, or sent back once with what is wrong.
            try:
                response = _read_verdict(reply, broken)
            except (ValidationError, GraderOutputError) as exc:
                if first is not None:
                    return _first_stands(first, tally, exc, mode)
                cut = was_cut(reply)
                if corrected_format:
                    msg = (CUT_TWICE if cut else
                           f"grader returned an unusable verdict twice: {_short_error(exc)}")
                    err = GraderOutputError(msg)
                    raise tally.fail(err, raw_reply=raw_reply_text(reply)) from exc
                corrected_format = True
                problem = CUT_PROBLEM if cut else (
                    f"Your verdict was rejected: {_short_error(exc)}. Call GraderResponse again.")
                convo += _correction(reply, verdicts, evidence, problem)
                continue
            # Its coverage: criteria left out are asked for once.
            match = match_criteria(criteria, response)
            if match.missing and first is None and response.result != "failed":
                first = tally.outcome(response, match)
                convo += _correction(reply, verdicts, evidence, coverage_problem(criteria, match))
                continue
            return tally.settle(tally.outcome(response, match), mode)

        # Evidence tools, for a bounded number of rounds.
        tool_rounds += 1
        if tool_rounds > MAX_TOOL_ROUNDS:
            msg = f"grader called tools {MAX_TOOL_ROUNDS} rounds without giving a verdict"
            if first is not None:
                return _first_stands(first, tally, GraderOutputError(msg), mode)
            raise tally.fail(GraderOutputError(msg), raw_reply=raw_reply_text(reply))
        convo.append(reply)
        convo += yield from _run_tools(evidence, by_name, tally)


CUT_PROBLEM = (
    "Your reply was cut off at the output token limit before the verdict was complete. Call "
    "GraderResponse again, with a one-sentence explanation and short gaps.")
"""The correction sent for a verdict cut at the grader's output token limit."""
CUT_TWICE = (
    "the grader's reply was cut off at its output token limit (finish_reason: length) before "
    "its verdict was complete, twice: raise the grader's max_tokens, or use a grader that "
    "answers more briefly")
"""How a pass whose verdict was cut twice fails."""


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
            model = bound.model if isinstance(bound, GraderBinding) else bound
            describe_failure(exc, model=model_label(model))
        raise


def model_runnable(bound: Any, step: CallModel) -> Any:
    """What a model step calls: the binding's runnable for it, or a model bound by hand."""
    return bound.runnable(step.force, step.mode) if isinstance(bound, GraderBinding) else bound


def call_args(
    runnable: Any, messages: Sequence[BaseMessage], config: RunnableConfig | None,
    step: CallModel,
) -> tuple[list[BaseMessage], RunnableConfig | None, dict[str, Any]]:
    """The messages, config and options a model step sends ``runnable`` (cache hints added)."""
    sent, options = cache_hints(runnable, messages)
    return sent, _call_config(config, step), options


def drive_sync(
    steps: Generator[Step, Any, GradeOutcome],
    bound: Any,
    config: RunnableConfig | None = None,
    sleep: Callable[[float], None] = time.sleep,
    run: GraderRun | None = None,
) -> GradeOutcome:
    """Run a pass synchronously on ``bound``: a `GraderBinding`, or a model bound by hand.

    With ``run`` (`rubric_core.grader.hooks.GraderRun`), every model and tool call goes through
    the grader middleware's hooks.
    """
    if run is not None:
        run.before_agent()
    send: Any = None
    error: BaseException | None = None
    while not isinstance(step := _advance(steps, send, error, bound), GradeOutcome):
        send, error = None, None
        try:
            if isinstance(step, CallModel) and run is not None:
                send = run.call_model(step, bound, config)
            elif isinstance(step, CallModel):
                runnable = model_runnable(bound, step)
                messages, call_config, options = call_args(runnable, step.messages, config, step)
                send = runnable.invoke(messages, call_config, **options)
            elif isinstance(step, CallTool) and run is not None:
                send = run.call_tool(step, config)
            elif isinstance(step, CallTool):
                send = step.tool.invoke({**step.call, "type": "tool_call"}, config)
            else:
                sleep(step.seconds)
        except Exception as exc:
            error = exc
    if run is not None:
        run.after_agent()
    return step


async def drive_async(
    steps: Generator[Step, Any, GradeOutcome],
    bound: Any,
    config: RunnableConfig | None = None,
    run: GraderRun | None = None,
) -> GradeOutcome:
    """Run a pass asynchronously (same steps, awaited; ``run``'s async hooks)."""
    if run is not None:
        await run.abefore_agent()
    send: Any = None
    error: BaseException | None = None
    while not isinstance(step := _advance(steps, send, error, bound), GradeOutcome):
        send, error = None, None
        try:
            if isinstance(step, CallModel) and run is not None:
                send = await run.acall_model(step, bound, config)
            elif isinstance(step, CallModel):
                runnable = model_runnable(bound, step)
                messages, call_config, options = call_args(runnable, step.messages, config, step)
                send = await runnable.ainvoke(messages, call_config, **options)
            elif isinstance(step, CallTool) and run is not None:
                send = await run.acall_tool(step, config)
            elif isinstance(step, CallTool):
                send = await step.tool.ainvoke({**step.call, "type": "tool_call"}, config)
            else:
                await asyncio.sleep(step.seconds)
        except Exception as exc:
            error = exc
    if run is not None:
        await run.aafter_agent()
    return step
