"""`RubricMiddleware`: grade the agent's answer against a rubric and loop until it passes.

Used as ``create_agent(model=..., middleware=[RubricMiddleware(model=...)], checkpointer=...)``
and invoked with ``{"messages": [...], "rubric": "- criterion\\n- criterion"}``.

After the agent finishes (``after_agent``), a separate grader model checks every criterion.
While one fails, the grader's per-criterion feedback is injected as a revision turn and the
agent runs again (``jump_to="model"``), until the grader is satisfied, judges the rubric
unusable (``failed``), raises (``grader_error``) or the cap is hit (``max_iterations_reached``).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain.agents.middleware.types import AgentMiddleware, hook_config
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.errors import GraphBubbleUp

from rubric_core.grader import (
    GradeOutcome,
    bind_grader,
    build_grader_messages,
    drive_async,
    drive_sync,
    grade_steps,
    latest_attempt,
)
from rubric_core.redact import redact_data
from rubric_core.rubric import parse_criteria, validate_rubric
from rubric_core.types import (
    REVISION_SOURCE,
    TERMINAL_STATUSES,
    CriterionVerdict,
    EvaluationEndEvent,
    EvaluationStartEvent,
    RubricEvaluation,
    RubricResult,
    RubricState,
    RubricStatus,
)

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langgraph.runtime import Runtime

logger = logging.getLogger(__name__)

NOT_ASSESSED_GAP = "The grader did not assess this criterion; it is checked again next pass."


MAX_ITERATIONS = 50
"""The hard ceiling on ``max_iterations``: a grader that never passes still stops."""


def revision_message(evaluation: RubricEvaluation) -> HumanMessage:
    """The feedback turn that sends a failing evaluation back to the agent."""
    failing = [c for c in evaluation["criteria"] if not c["passed"]]
    passing = [c for c in evaluation["criteria"] if c["passed"]]
    parts = [
        "The grader checked your last answer against the rubric and it needs revision.",
        f"Grader's summary: {evaluation['explanation']}",
        "Failing criteria:\n" + "\n".join(f"- {c['name']}: {c.get('gap', '')}" for c in failing),
    ]
    if passing:
        parts.append(
            "Passing criteria (keep these):\n" + "\n".join(f"- {c['name']}" for c in passing)
        )
    parts.append(
        "Revise your answer so that every failing criterion passes and the passing ones still "
        "hold. Reply with the complete revised answer."
    )
    return HumanMessage(
        "\n\n".join(parts),
        name=REVISION_SOURCE,
        additional_kwargs={"lc_source": REVISION_SOURCE},
    )


def _status_after(result: RubricResult, iteration: int, max_iterations: int) -> RubricStatus:
    if result != "needs_revision":
        return result
    return "max_iterations_reached" if iteration + 1 >= max_iterations else "needs_revision"


def _merge_missing(
    criteria: Sequence[str], answered: list[CriterionVerdict], missing: list[str]
) -> list[CriterionVerdict]:
    by_name = {c["name"]: c for c in answered}
    merged: list[CriterionVerdict] = []
    for name in criteria:
        merged.append(by_name.get(name) or {"name": name, "passed": False, "gap": NOT_ASSESSED_GAP})
    return merged


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


class RubricMiddleware(AgentMiddleware[RubricState, Any]):
    """Grade the agent's answer against the caller's rubric and loop on per-criterion feedback.

    Args:
        model: The grader: a ``"provider:model-id"`` string (resolved on the first grading
            pass, so constructing needs no credentials) or a chat model instance. Besides
            LangChain providers, ``"rules"`` and ``"hybrid:<model>"`` name offline graders.
        system_prompt: Replaces the built-in grader instructions.
        tools: Evidence tools the grader may call before its verdict (never given to the agent).
        max_iterations: Grader passes per grading run, from 1 to `MAX_ITERATIONS` (50).
        on_evaluation: Called with each `RubricEvaluation`; exceptions are logged and
            suppressed, except a LangGraph interrupt, which propagates.
        max_retries: Retries of a grader call after a transient error (timeout, rate limit,
            5xx, dropped connection) before the pass ends as ``grader_error``.
        retry_backoff_s: First retry delay; doubles per retry (a server's Retry-After wins).
    """

    state_schema = RubricState

    def __init__(
        self,
        *,
        model: str | BaseChatModel,
        system_prompt: str | None = None,
        tools: Sequence[BaseTool | Callable[..., Any]] | None = None,
        max_iterations: int = 3,
        on_evaluation: Callable[[RubricEvaluation], object] | None = None,
        max_retries: int = 2,
        retry_backoff_s: float = 0.5,
    ) -> None:
        super().__init__()
        if not model:
            msg = "model is required: a 'provider:model-id' string or a chat model instance"
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
        self._model_spec = model
        self._system_prompt = system_prompt
        self._grader_tools = [_as_tool(t) for t in tools or ()]
        self.max_iterations = max_iterations
        self._on_evaluation = on_evaluation
        self._max_retries = max_retries
        self._retry_backoff_s = retry_backoff_s
        self._bound: Any = None
        # Verdicts whose on_evaluation raised an interrupt: replayed when the node re-runs on
        # resume, so a person reviewing a verdict does not cause a second grader call.
        self._awaiting_review: dict[tuple[str, int], RubricEvaluation] = {}
        self._runnable = RunnableLambda(
            self._grade_sync, afunc=self._grade_async, name=REVISION_SOURCE
        ).with_config(run_name=REVISION_SOURCE, tags=["nostream", REVISION_SOURCE])

    # ------------------------------------------------------------------ run bookkeeping

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

    def _bound_grader(self) -> Any:
        if self._bound is None:
            model = self._model_spec
            if isinstance(model, str):
                from rubric_core.models import resolve_model  # lazy: providers import slowly

                model = resolve_model(model)
            self._bound = bind_grader(model, self._grader_tools)
        return self._bound

    def _steps(self, payload: dict[str, Any]) -> Any:
        messages = build_grader_messages(
            payload["messages"], payload["criteria"], system_prompt=self._system_prompt
        )
        return grade_steps(
            messages,
            payload["criteria"],
            self._grader_tools,
            max_retries=self._max_retries,
            backoff_s=self._retry_backoff_s,
        )

    def _grade_sync(self, payload: dict[str, Any]) -> GradeOutcome:
        return drive_sync(self._steps(payload), self._bound_grader())

    async def _grade_async(self, payload: dict[str, Any]) -> GradeOutcome:
        return await drive_async(self._steps(payload), self._bound_grader())

    def _evaluation(
        self,
        state: RubricState,
        criteria: list[str],
        outcome: GradeOutcome | BaseException | None,
        started: float,
    ) -> RubricEvaluation:
        iteration = state.get("_rubric_iterations") or 0
        unverified = False
        unknown: list[str] = []
        tokens: tuple[int | None, int | None] = (None, None)
        if outcome is None:
            result: RubricResult = "failed"
            explanation = "The rubric has no usable criteria: write one criterion per line."
            verdicts: list[CriterionVerdict] = []
        elif isinstance(outcome, BaseException):
            result = "grader_error"
            explanation = f"{type(outcome).__name__}: {outcome}"
            verdicts = []
        else:
            result = outcome.response.result
            explanation = outcome.response.explanation
            verdicts = outcome.criteria
            unknown = list(outcome.unknown_criteria or [])
            tokens = (outcome.input_tokens, outcome.output_tokens)
            if outcome.missing and result != "failed":
                unverified = True
                verdicts = _merge_missing(criteria, verdicts, outcome.missing)
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
        }
        if unknown:
            evaluation["unknown_criteria"] = unknown
        return redact_data(evaluation)

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
        update: dict[str, Any] = {
            "_rubric_evaluations": [*(state.get("_rubric_evaluations") or []), evaluation],
            "_rubric_iterations": evaluation["iteration"] + 1,
            "_rubric_status": evaluation["status"],
        }
        if evaluation["status"] == "needs_revision":
            update["messages"] = [revision_message(evaluation)]
            update["jump_to"] = "model"
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
        return None, _Pass(criteria, payload, started)

    def _end(
        self, state: RubricState, runtime: Runtime[Any], work: _Pass,
        outcome: GradeOutcome | BaseException | None,
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
        outcome: GradeOutcome | BaseException | None = None
        if work.criteria:
            try:
                outcome = self._runnable.invoke(work.payload)
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
        outcome: GradeOutcome | BaseException | None = None
        if work.criteria:
            try:
                outcome = await self._runnable.ainvoke(work.payload)
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
