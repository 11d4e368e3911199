r"""`RubricMiddleware`: grade the agent's answer against a rubric and loop until it passes.

Used as ``create_agent(model=..., middleware=[RubricMiddleware(model=...)], checkpointer=...)``
and invoked with ``{"messages": [...], "rubric": "- criterion\\n- criterion"}``.

After the agent finishes (``after_agent``), a separate grader model checks every criterion.
While one fails, the grader's per-criterion feedback is injected as a revision turn and the
agent runs again (``jump_to="model"``), until the grader is satisfied, judges the rubric
unusable (``failed``), raises (``grader_error``) or the cap is hit (``max_iterations_reached``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from langchain.agents.middleware.types import AgentMiddleware, hook_config
from langchain_core.messages import AIMessage, AnyMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.errors import GraphBubbleUp
from typing_extensions import override

from rubric_core.consensus import (
    CONSENSUS_MODES,
    MAX_GRADER_REPEATS,
    REPEATS_IN_SEQUENCE,
    Combined,
    Consensus,
    combine,
)
from rubric_core.grader import (
    GradeOutcome,
    GraderBinding,
    bind_grader,
    build_grader_messages,
    drive_async,
    drive_sync,
    grade_steps,
    grader_failure,
    latest_attempt,
    prepared_transcript,
    was_cut,
)
from rubric_core.grader.hooks import GraderHooks
from rubric_core.redact import redact_data
from rubric_core.revision import ANSWER_CUT_NOTE as ANSWER_CUT_NOTE  # re-exported
from rubric_core.revision import (
    BEST_ATTEMPT_NAME,
    best_iteration,
    merge_missing,
    normalised,
    revision_message,
)
from rubric_core.revision import NOT_ASSESSED_GAP as NOT_ASSESSED_GAP  # re-exported
from rubric_core.rubric import parse_criteria, validate_rubric
from rubric_core.state import RubricState
from rubric_core.types import MAX_ITERATIONS as MAX_ITERATIONS  # re-exported
from rubric_core.types import (
    PASS_GRADING_RUN_KEY,
    PASS_ITERATION_KEY,
    REVISION_SOURCE,
    TERMINAL_STATUSES,
    CriterionVerdict,
    EvaluationEndEvent,
    EvaluationStartEvent,
    RubricEvaluation,
    RubricResult,
    RubricStatus,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from langchain.agents.middleware.types import AgentState
    from langchain_core.language_models import BaseChatModel
    from langchain_core.runnables import RunnableConfig
    from langgraph.runtime import Runtime

    from rubric_core.grader import VerdictMode

logger = logging.getLogger(__name__)


def _status_after(result: RubricResult, iteration: int, max_iterations: int) -> RubricStatus:
    if result != "needs_revision":
        return result
    return "max_iterations_reached" if iteration + 1 >= max_iterations else "needs_revision"


def _as_tool(candidate: object) -> BaseTool:
    if isinstance(candidate, BaseTool):
        return candidate
    if callable(candidate):
        return StructuredTool.from_function(candidate)
    msg = f"tools must be LangChain tools or functions, got {type(candidate).__name__}"
    raise TypeError(msg)


@dataclass(frozen=True)
class _Pass:
    """A grader pass that has emitted its start event and awaits the grader call."""

    criteria: list[str]
    payload: dict[str, Any]
    started: float
    config: RunnableConfig
    """The grading runnable's config: the pass's iteration and grading run as run metadata
    (`PASS_ITERATION_KEY`), which its grader calls inherit (call traces read them)."""
    state: RubricState
    """The agent's state the pass grades (``build_grader_state`` reads it)."""
    runtime: Any
    """The agent's runtime: the grader's runtime context is its context."""


class RubricMiddleware(AgentMiddleware[RubricState, Any]):
    """Grade the agent's answer against the caller's rubric and loop on per-criterion feedback.

    Args:
        model: The grader: a ``"provider:model-id"`` string (resolved on the first grading
            pass, so constructing needs no credentials) or a chat model instance. Besides
            LangChain providers, ``"rules"`` and ``"hybrid:<model>"`` name offline graders.
        system_prompt: Replaces the built-in grader instructions. It is sent before the
            grading request's stable start, so a provider can cache it with that start. A
            ``NONCE`` in it is still filled per call, as before
            (`rubric_core.grader.grader_system_prompt` says how), but a prompt holding this
            call's nonce differs on every call and nothing of the grader's prompt can be
            cached: leave ``NONCE`` out (the built-in prompt has none).
        tools: Evidence tools the grader may call before its verdict (never given to the agent).
        grader_middleware: Agent middleware run around every grader model and tool call,
            as deepagents runs it on its grader agent (`rubric_core.grader.hooks` says how);
            the pass itself stays bounded.
        grader_context_schema: The type of the grader runtime's context, which is the agent
            runtime's context (a dict made this dataclass or pydantic model).
        grader_state_schema: The grader's state: a TypedDict extending ``AgentState``.
        build_grader_state: ``(state, iteration) -> mapping`` of fields added to the grader's
            state, once per pass (``messages`` as the grader is shown them). Requires
            ``grader_state_schema``. A result that is not a mapping, or sets ``messages`` or
            an undeclared field, ends the pass as ``grader_error``.
        max_iterations: Grader passes per grading run, from 1 to `MAX_ITERATIONS` (50).
        on_evaluation: Called with each `RubricEvaluation`; exceptions are logged and
            suppressed, except a LangGraph interrupt, which propagates.
        max_retries: Retries of a grader call after a transient error (timeout, rate limit,
            5xx, dropped connection) before the pass ends as ``grader_error``.
        retry_backoff_s: First retry delay; doubles per retry (a server's Retry-After wins).
        grader_repeats: Grade each answer this many times (1 to 9; concurrently under
            async) and take the per-criterion consensus (`rubric_core.consensus`). Each
            criterion then records its ``agreement`` and the evaluation lists ``unstable``
            criteria; tokens and time count every repeat. A repeat that raises ends the pass
            as ``grader_error``, as a single call would. 1 (the default) is one call.
        consensus: ``"majority"`` (a tie fails) or ``"unanimous"`` (every answering repeat
            must pass the criterion).
        return_best: When a run ends ``max_iterations_reached`` and an earlier pass's answer
            passed more criteria than the last (``_rubric_best_iteration``), append a copy of
            that answer as a final ``AIMessage`` named ``rubric_best_attempt`` (its
            ``response_metadata`` holds ``rubric_best_iteration``), so the agent's final
            message is the best attempt. The transcript before it is unchanged. Off by
            default: the seed returns the last attempt.
        prepare_messages_for_grader: Rewrites the conversation the grader sees, e.g. to
            redact tool output or drop messages. Called once per pass with deep copies of
            the agent's messages; it returns a list of messages, from which the grader takes
            the request and the latest attempt as usual. The agent's state is not changed. A
            rewrite that raises, or returns anything but a list of messages, ends the pass
            as ``grader_error``, its explanation naming the exception.
        force_tools: Each pass calls every evidence tool once, each call forced, before the
            verdict (for small models that never choose a tool). Off by default: the grader
            chooses. Either way the verdict call is forced once the evidence is in
            (`rubric_core.grader.verdict`).

    The grader's verdict tool is built per rubric, with every criterion by name, and the
    verdict call is forced where the provider allows it; the way that worked is kept for the
    grader's later passes (`rubric_core.grader.verdict.VerdictMode`).

    """

    state_schema = RubricState

    def __init__(
        self,
        *,
        model: str | BaseChatModel,
        system_prompt: str | None = None,
        tools: Sequence[BaseTool | Callable[..., Any]] | None = None,
        grader_middleware: Sequence[AgentMiddleware[Any, Any, Any]] | None = None,
        grader_context_schema: type[Any] | None = None,
        grader_state_schema: type[AgentState[Any]] | None = None,
        build_grader_state: Callable[[RubricState, int], Mapping[str, Any]] | None = None,
        max_iterations: int = 3,
        on_evaluation: Callable[[RubricEvaluation], object] | None = None,
        max_retries: int = 2,
        retry_backoff_s: float = 0.5,
        grader_repeats: int = 1,
        consensus: Consensus = "majority",
        return_best: bool = False,
        prepare_messages_for_grader: Callable[[list[AnyMessage]], list[AnyMessage]]
        | None = None,
        force_tools: bool = False,
    ) -> None:
        super().__init__()
        if not model:
            msg = "`model` is required: a 'provider:model-id' string or a chat model instance"
            raise ValueError(msg)
        if isinstance(max_iterations, bool) or not isinstance(max_iterations, int):
            msg = f"max_iterations must be an int, got {type(max_iterations).__name__}"
            raise TypeError(msg)
        if not 1 <= max_iterations <= MAX_ITERATIONS:
            msg = (f"max_iterations must be between 1 and {MAX_ITERATIONS}, got "
                   f"{max_iterations}: a loop that needs more passes needs a better rubric")
            raise ValueError(msg)
        if on_evaluation is not None and not callable(on_evaluation):
            msg = "on_evaluation must be callable"
            raise TypeError(msg)
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            msg = f"max_retries must be an int >= 0, got {max_retries!r}"
            raise ValueError(msg)
        if retry_backoff_s < 0:
            msg = f"retry_backoff_s must be >= 0, got {retry_backoff_s!r}"
            raise ValueError(msg)
        if system_prompt is not None and not isinstance(system_prompt, str):
            msg = "system_prompt must be a string"
            raise TypeError(msg)
        if (isinstance(grader_repeats, bool) or not isinstance(grader_repeats, int)
                or not 1 <= grader_repeats <= MAX_GRADER_REPEATS):
            msg = (f"grader_repeats must be an int from 1 to {MAX_GRADER_REPEATS}, got "
                   f"{grader_repeats!r}")
            raise ValueError(msg)
        if consensus not in CONSENSUS_MODES:
            msg = f"consensus must be one of {CONSENSUS_MODES}, got {consensus!r}"
            raise ValueError(msg)
        if not isinstance(return_best, bool):
            msg = "return_best must be True or False"
            raise TypeError(msg)
        if prepare_messages_for_grader is not None and not callable(prepare_messages_for_grader):
            msg = "prepare_messages_for_grader must be callable"
            raise TypeError(msg)
        if not isinstance(force_tools, bool):
            msg = "force_tools must be True or False"
            raise TypeError(msg)
        self.force_tools = force_tools
        self._hooks = GraderHooks.create(
            middleware=grader_middleware, context_schema=grader_context_schema,
            state_schema=grader_state_schema, build_state=build_grader_state)
        self._prepare_messages = prepare_messages_for_grader
        self.grader_repeats = grader_repeats
        self.consensus: Consensus = consensus
        self.return_best = return_best
        self._model_spec = model
        self._system_prompt = system_prompt
        self._grader_tools = [_as_tool(t) for t in tools or ()]
        self.max_iterations = max_iterations
        self._on_evaluation = on_evaluation
        self._max_retries = max_retries
        self._retry_backoff_s = retry_backoff_s
        self._grader: BaseChatModel | None = None
        # How the verdict call was forced on the last pass: where the next one starts.
        self._verdict_mode: VerdictMode | None = None
        # Verdicts whose on_evaluation raised an interrupt: replayed when the node re-runs on
        # resume, so a person reviewing a verdict does not cause a second grader call.
        self._awaiting_review: dict[tuple[str, int], RubricEvaluation] = {}

    # ------------------------------------------------------------------ run bookkeeping

    @override
    def before_agent(self, state: RubricState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Start a new grading run when the rubric changed or the last run ended."""
        rubric = state.get("rubric")
        if rubric is None or rubric == "":
            return None
        validate_rubric(rubric)
        status = state.get("_rubric_status")
        if (
            rubric == state.get("_active_rubric")
            and state.get("_current_grading_run_id")
            and status not in TERMINAL_STATUSES
        ):
            return None  # an interrupted run continues
        return {
            "_active_rubric": rubric,
            "_current_grading_run_id": uuid.uuid4().hex,
            "_rubric_iterations": 0,
            "_rubric_status": None,
            # The last run's best pass is not this run's: nothing until this run's first pass.
            "_rubric_best_iteration": None,
        }

    async def abefore_agent(
        self, state: RubricState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Async twin of `before_agent` (no I/O, same code)."""
        return self.before_agent(state, runtime)

    # ------------------------------------------------------------------ grading

    def _should_grade(self, state: RubricState) -> bool:
        rubric = state.get("rubric")
        return bool(rubric) and rubric == state.get("_active_rubric") and (
            state.get("_rubric_status") not in TERMINAL_STATUSES
        )

    def _grader_model(self) -> BaseChatModel:
        if self._grader is None:
            model = self._model_spec
            if isinstance(model, str):
                from rubric_core.models import resolve_model  # lazy: providers import slowly

                model = resolve_model(model)
            self._grader = model
        return self._grader

    def _steps(self, transcript: list[AnyMessage], criteria: list[str],
               binding: GraderBinding) -> Any:
        messages = build_grader_messages(transcript, criteria, system_prompt=self._system_prompt)
        return grade_steps(
            messages,
            criteria,
            self._grader_tools,
            max_retries=self._max_retries,
            backoff_s=self._retry_backoff_s,
            modes=binding.ladder(self._verdict_mode),
            force_tools=self.force_tools,
        )

    def _graded(self, outcomes: list[GradeOutcome], criteria: list[str]
                ) -> GradeOutcome | Combined:
        self._verdict_mode = outcomes[-1].mode
        return outcomes[0] if len(outcomes) == 1 else combine(outcomes, criteria, self.consensus)

    def _grading(self, work: _Pass) -> Any:
        """The pass's grading runnable (traced under our name; the agent never sees it)."""
        return RunnableLambda(
            partial(self._grade_sync, work=work), afunc=partial(self._grade_async, work=work),
            name=REVISION_SOURCE,
        ).with_config(run_name=REVISION_SOURCE, tags=["nostream", REVISION_SOURCE])

    def _setup(self, payload: dict[str, Any], work: _Pass
               ) -> tuple[list[AnyMessage], list[str], GraderBinding, list[Any]]:
        """What the grader is shown, the criteria, the bound grader and each repeat's run."""
        transcript = prepared_transcript(payload["messages"], self._prepare_messages)
        criteria = payload["criteria"]
        binding = bind_grader(self._grader_model(), self._grader_tools, criteria)
        # Each repeat's grader run through the grader middleware (Nones without any).
        runs = self._hooks.runs({**work.state, "messages": transcript},
                                work.state.get("_rubric_iterations") or 0, work.runtime,
                                self._grader_tools, self.grader_repeats)
        return transcript, criteria, binding, runs

    def _grade_sync(self, payload: dict[str, Any], *, work: _Pass) -> GradeOutcome | Combined:
        transcript, criteria, binding, runs = self._setup(payload, work)
        outcomes = [drive_sync(self._steps(transcript, criteria, binding), binding, run=run)
                    for run in runs]
        return self._graded(outcomes, criteria)

    async def _grade_async(self, payload: dict[str, Any], *, work: _Pass
                           ) -> GradeOutcome | Combined:
        transcript, criteria, binding, runs = self._setup(payload, work)
        if self.grader_repeats == 1 or REPEATS_IN_SEQUENCE.get():
            outcomes = [await drive_async(self._steps(transcript, criteria, binding), binding,
                                          run=run) for run in runs]
            return self._graded(outcomes, criteria)
        outcomes = await asyncio.gather(*(
            drive_async(self._steps(transcript, criteria, binding), binding, run=run)
            for run in runs
        ))
        return self._graded(list(outcomes), criteria)

    def _evaluation(
        self,
        state: RubricState,
        criteria: list[str],
        graded: GradeOutcome | Combined | BaseException | None,
        started: float,
    ) -> RubricEvaluation:
        iteration = state.get("_rubric_iterations") or 0
        combined: Combined | None = None
        outcome: GradeOutcome | BaseException | None
        if isinstance(graded, Combined):
            combined, outcome = graded, graded.outcome
        else:
            outcome = graded
        unverified = False
        unknown: list[str] = []
        tokens: tuple[int | None, int | None, int | None] = (None, None, None)
        if outcome is None:
            result: RubricResult = "failed"
            explanation = "The rubric has no usable criteria: write one criterion per line."
            verdicts: list[CriterionVerdict] = []
        elif isinstance(outcome, BaseException):
            result = "grader_error"
            explanation = f"{type(outcome).__name__}: {outcome}"
            verdicts = []
            if (failure := grader_failure(outcome)) is not None:  # what its calls cost
                tokens = (failure.input_tokens, failure.output_tokens,
                          failure.cached_input_tokens)
        else:
            result = outcome.response.result
            explanation = outcome.response.explanation
            verdicts = outcome.criteria
            unknown = list(outcome.unknown_criteria or [])
            tokens = (outcome.input_tokens, outcome.output_tokens, outcome.cached_input_tokens)
            if outcome.missing and result != "failed":
                unverified = True
                verdicts = merge_missing(criteria, verdicts)
                result = "needs_revision"
                explanation = (
                    f"{explanation} (Unverified: the grader left out {len(outcome.missing)} "
                    "criteria even after a correction.)"
                )
        # Redacted before it is stored anywhere: a provider error body may echo the request's
        # Authorization header, and this dict lands in checkpoints, events and exports.
        evaluation: RubricEvaluation = {
            "grading_run_id": state.get("_current_grading_run_id") or "",
            "iteration": iteration,
            "result": result,
            "explanation": explanation,
            "criteria": verdicts,
            "status": _status_after(result, iteration, self.max_iterations),
            "unverified": unverified,
            "duration_s": round(time.perf_counter() - started, 6),
            "input_tokens": tokens[0],
            "output_tokens": tokens[1],
            "answer": latest_attempt(state["messages"]).answer,
            "cached_input_tokens": tokens[2],
        }
        if unknown:
            evaluation["unknown_criteria"] = unknown
        if isinstance(outcome, GradeOutcome):
            evaluation["verdict_mode"] = outcome.mode
        final = state["messages"][-1] if state["messages"] else None
        if isinstance(final, AIMessage) and was_cut(final):
            evaluation["answer_cut"] = True
        if combined is not None:
            for verdict in verdicts:
                if verdict["name"] in combined.agreement:
                    verdict["agreement"] = combined.agreement[verdict["name"]]
            evaluation["repeats"] = self.grader_repeats
            evaluation["unstable"] = list(combined.unstable)
        previous = self._previous(state)
        if previous is not None:
            before = {c["name"] for c in previous["criteria"] if c["passed"]}
            evaluation["regressed"] = [c["name"] for c in verdicts
                                       if not c["passed"] and c["name"] in before]
            evaluation["stalled"] = (
                normalised(previous["answer"]) == normalised(evaluation["answer"]))
        return redact_data(evaluation)

    @staticmethod
    def _previous(state: RubricState) -> RubricEvaluation | None:
        """The previous pass of the current grading run, if any."""
        run_id = state.get("_current_grading_run_id") or ""
        iteration = state.get("_rubric_iterations") or 0
        for ev in reversed(state.get("_rubric_evaluations") or []):
            if ev["grading_run_id"] == run_id and ev["iteration"] == iteration - 1:
                return ev
        return None

    def _prepare(self, state: RubricState, runtime: Runtime[Any]) -> tuple[list[str], Any]:
        rubric = state.get("rubric") or ""
        criteria = parse_criteria(rubric)
        start: EvaluationStartEvent = {
            "type": "rubric_evaluation_start",
            "grading_run_id": state.get("_current_grading_run_id") or "",
            "iteration": state.get("_rubric_iterations") or 0,
        }
        self._emit(runtime, start)
        return criteria, {"messages": state["messages"], "criteria": criteria}

    def _finish(
        self, state: RubricState, runtime: Runtime[Any], evaluation: RubricEvaluation
    ) -> dict[str, Any]:
        end: EvaluationEndEvent = {
            "type": "rubric_evaluation_end",
            "grading_run_id": evaluation["grading_run_id"],
            "iteration": evaluation["iteration"],
            "result": evaluation["result"],
            "explanation": evaluation["explanation"],
            "criteria": evaluation["criteria"],
            "status": evaluation["status"],
            "evaluation": evaluation,
        }
        self._emit(runtime, end)
        self._notify(evaluation)
        evaluations = [*(state.get("_rubric_evaluations") or []), evaluation]
        this_run = [ev for ev in evaluations
                    if ev["grading_run_id"] == evaluation["grading_run_id"]]
        best = best_iteration(this_run)
        update: dict[str, Any] = {
            "_rubric_evaluations": evaluations,
            "_rubric_iterations": evaluation["iteration"] + 1,
            "_rubric_status": evaluation["status"],
            "_rubric_best_iteration": best,
        }
        if evaluation["status"] == "needs_revision":
            update["messages"] = [revision_message(evaluation)]
            update["jump_to"] = "model"
        elif (evaluation["status"] == "max_iterations_reached" and self.return_best
              and best is not None and best != evaluation["iteration"]):
            chosen = next(ev for ev in this_run if ev["iteration"] == best)
            update["messages"] = [AIMessage(
                chosen["answer"], name=BEST_ATTEMPT_NAME,
                response_metadata={"rubric_best_iteration": best},
            )]
        return update

    def _begin(
        self, state: RubricState, runtime: Runtime[Any]
    ) -> tuple[dict[str, Any] | None, _Pass | None]:
        """Either a finished hook result, or a pass that still needs its grader call."""
        if not self._should_grade(state):
            return None, None
        if (replay := self._replay(state)) is not None:
            return self._finish(state, runtime, replay), None
        started = time.perf_counter()
        criteria, payload = self._prepare(state, runtime)
        metadata = {PASS_ITERATION_KEY: state.get("_rubric_iterations") or 0,
                    PASS_GRADING_RUN_KEY: state.get("_current_grading_run_id") or ""}
        return None, _Pass(criteria, payload, started, {"metadata": metadata}, state, runtime)

    def _end(
        self, state: RubricState, runtime: Runtime[Any], work: _Pass,
        outcome: GradeOutcome | Combined | BaseException | None,
    ) -> dict[str, Any]:
        if isinstance(outcome, BaseException):
            logger.warning("grader raised %s: %s", type(outcome).__name__, outcome)
        evaluation = self._evaluation(state, work.criteria, outcome, work.started)
        return self._finish(state, runtime, evaluation)

    @hook_config(can_jump_to=["model"])
    def after_agent(self, state: RubricState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Grade the answer; on `needs_revision` inject feedback and jump back to the model."""
        done, work = self._begin(state, runtime)
        if work is None:
            return done
        outcome: GradeOutcome | Combined | BaseException | None = None
        if work.criteria:
            try:
                outcome = self._grading(work).invoke(work.payload, work.config)
            except GraphBubbleUp:
                raise
            except Exception as exc:
                outcome = exc
        return self._end(state, runtime, work, outcome)

    @hook_config(can_jump_to=["model"])
    async def aafter_agent(
        self, state: RubricState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Async `after_agent`: the same helpers, with the grader awaited."""
        done, work = self._begin(state, runtime)
        if work is None:
            return done
        outcome: GradeOutcome | Combined | BaseException | None = None
        if work.criteria:
            try:
                outcome = await self._grading(work).ainvoke(work.payload, work.config)
            except GraphBubbleUp:
                raise
            except Exception as exc:
                outcome = exc
        return self._end(state, runtime, work, outcome)

    # ------------------------------------------------------------------ callbacks and events

    def _replay(self, state: RubricState) -> RubricEvaluation | None:
        key = (state.get("_current_grading_run_id") or "", state.get("_rubric_iterations") or 0)
        return self._awaiting_review.get(key)

    def _notify(self, evaluation: RubricEvaluation) -> None:
        key = (evaluation["grading_run_id"], evaluation["iteration"])
        if self._on_evaluation is None:
            return
        try:
            self._on_evaluation(evaluation)
        except GraphBubbleUp:
            self._awaiting_review[key] = evaluation
            raise
        except Exception:
            logger.exception("on_evaluation raised; the grading loop continues")
        self._awaiting_review.pop(key, None)

    @staticmethod
    def _emit(runtime: Runtime[Any], event: EvaluationStartEvent | EvaluationEndEvent) -> None:
        writer = getattr(runtime, "stream_writer", None)
        if writer is None:
            return
        try:
            writer(event)
        except Exception:
            logger.debug("stream writer raised; event dropped", exc_info=True)
