"""Shared data types: grader verdicts, evaluations and events.

The middleware's agent state is `rubric_core.state`'s.

Everything that travels between the middleware, the runner, the store, the exporters and the
app is defined here, so that one import tells a reader the whole contract.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, NotRequired, get_args

from pydantic import BaseModel, Field, model_serializer, model_validator
from typing_extensions import TypedDict

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from pydantic import SerializerFunctionWrapHandler

GraderVerdict = Literal["satisfied", "needs_revision", "failed"]
"""What a grader may answer for one pass."""

RubricResult = Literal["satisfied", "needs_revision", "failed", "grader_error"]
"""What an evaluation records: a grader verdict, or `grader_error` when the grader raised."""

RubricStatus = Literal[
    "satisfied", "needs_revision", "failed", "grader_error", "max_iterations_reached"
]
"""The status of a grading run after a pass (`needs_revision` while it still loops)."""

TERMINAL_STATUSES: frozenset[str] = frozenset(
    {"satisfied", "failed", "grader_error", "max_iterations_reached"}
)
"""Statuses that end a grading run; invoking the same rubric again starts a new one."""

RunStatus = Literal[
    "running", "satisfied", "needs_revision", "failed", "max_iterations_reached", "grader_error",
    "interrupted", "error",
]
"""The status of a run in the run index: its lifecycle, defined once for store, pages and CLI.

A run starts ``running``; it ends on a terminal verdict (`TERMINAL_STATUSES`), ``interrupted``
(stopped, or its owner died: see `rubric_core.session.STALE_AFTER_S`) or ``error`` (the worker
or the recording raised). ``interrupted`` and ``error`` runs can be resumed
(`RESUMABLE_STATUSES`); resuming sets ``running`` again. ``needs_revision`` is the middleware's
status between passes; a run in the index is never left in it (files from before schema 3 that
hold it are upgraded to ``interrupted``).
"""

RUN_STATUSES: frozenset[str] = frozenset(get_args(RunStatus))
"""Every status a run may have in the index."""

RunOrigin = Literal["single", "experiment"]
"""Where a run came from: started alone (the Run page, ``run``), or a cell of an experiment."""

RUN_ORIGINS: tuple[str, ...] = get_args(RunOrigin)
"""Every `RunOrigin`, for filters."""

RESUMABLE_STATUSES: frozenset[str] = frozenset({"interrupted", "error"})
"""Statuses offered for Resume; a ``running`` run whose owner died is shown and resumed as
``interrupted`` (`rubric_core.session.is_stale`)."""

ExperimentStatus = Literal["running", "stopped", "finished"]
"""An experiment's lifecycle: ``running`` while a process drives its cells (or until that
process is found dead), ``stopped`` after Stop, ``finished`` when every cell has ended. Each
cell's own status is its run's (`RunStatus`), or ``pending`` before its run starts."""

EXPERIMENT_STATUSES: frozenset[str] = frozenset(get_args(ExperimentStatus))
"""Every status an experiment may have."""

CELL_PENDING = "pending"
"""The status of an experiment cell whose run has not started."""

ENDED_STATUSES: frozenset[str] = TERMINAL_STATUSES | {"error"}
"""Experiment cell statuses that count as done: a cell in one of them is not run again by
itself."""

ERROR_STATUSES: frozenset[str] = frozenset({"error", "grader_error"})
"""Experiment cell statuses that are recorded as ended but can be retried alone."""

REVISION_SOURCE = "rubric_grader"
"""`name` and `additional_kwargs["lc_source"]` of the revision turn the middleware injects."""

PASS_ITERATION_KEY = "rubric_iteration"
"""Run metadata of a grading pass's runnable (and so of its grader calls): the pass's 0-based
``iteration``. Call traces (`rubric_core.calls`) file each call under it."""

PASS_GRADING_RUN_KEY = "rubric_grading_run_id"
"""Run metadata of a grading pass's runnable: its ``grading_run_id``."""

GRADER_ATTEMPT_KEY = "rubric_grader_attempt"
"""Run metadata of a grader call that retries a request after a transient error: which retry
it is (`rubric_core.grader.steps.CallModel.attempt`). A first try carries none."""

# -- limits: the bounds every entry point (middleware, settings, app, CLI) checks against --------

MAX_ITERATIONS = 50
"""The hard ceiling on ``max_iterations``: a grader that never passes still stops."""

DEFAULT_WORKER_MAX_TOKENS = 2_048
"""The worker's output token limit for a model on a base URL (a local server), when a run
sets none: a small model may never stop (one rambled past 3,800 tokens into a timeout). Models
of hosted providers keep the provider's own limit unless one is set (`rubric_core.models.
limit_output`): reasoning models spend thousands of tokens before they answer."""

DEFAULT_GRADER_MAX_TOKENS = 2_048
"""The grader's output token limit for a model on a base URL, when none is set (its verdict
strings are bounded there too: `rubric_core.grader.verdict`)."""

MAX_OUTPUT_TOKENS = 1_000_000
"""The largest output token limit accepted for a worker or a grader."""

LABEL_NOTE_CHAR_LIMIT = 2_000
"""The most characters a label's note may hold: the app refuses a longer one before the store,
and the store refuses it too (Align also cuts what it sends of each note)."""

LABELLER_CHAR_LIMIT = 100
"""The most characters a labeller's name ("Your name") may hold."""

Consensus = Literal["majority", "unanimous"]
"""How repeats' verdicts on one criterion are combined (`rubric_core.consensus`)."""

CONSENSUS_MODES: tuple[Consensus, ...] = ("majority", "unanimous")
"""Every `Consensus` mode, in the order the app offers them."""

MAX_GRADER_REPEATS = 9
"""The largest ``grader_repeats`` accepted."""

DEFAULT_CONCURRENCY = 4
"""Experiment cells run at once unless the caller says otherwise."""

MAX_CONCURRENCY = 64
"""Most experiment cells at once: each running cell holds an HTTP connection and a database
row."""

MAX_REPEATS = 20
"""Most runs of one dataset row under one experiment configuration."""

MAX_CELLS = 100_000
"""Most cells (rows × configurations × repeats) in one experiment."""

# -- call traces: what one model call leaves behind (`rubric_core.calls`) -------------------------

CALL_MESSAGE_CHAR_LIMIT = 4_000
"""Characters of one message's text kept in a call trace (head and tail around a marker)."""

CALL_MESSAGES_KEPT = 12
"""Messages of one call kept in its trace: the first `CALL_HEAD_MESSAGES` (the system prompt
and the request: the call's stable start) and the last ones, around a marker message."""

CALL_HEAD_MESSAGES = 2
"""Of `CALL_MESSAGES_KEPT`, how many are taken from the start of the call's messages."""

CALL_REPLY_CHAR_LIMIT = 8_000
"""Characters of a reply's text kept in a call trace."""

CALL_TOOL_CALLS_KEPT = 16
"""Tool calls kept per message (and per reply) in a call trace."""

CALL_TOOL_ARGS_CHAR_LIMIT = 2_000
"""Characters of one tool call's JSON arguments kept in a call trace."""

CALL_CONTENT_BUDGET_CHARS = 2_000_000
"""Characters of messages and replies one run's call traces may hold in the database; later
calls keep their numbers (tokens, latency, retries) but not their text."""

MAX_CALLS_PER_RUN = 2_000
"""Call traces one run keeps at most (a 50-pass run with 9 grader repeats and evidence tools
could make several thousand calls); the evaluations still count every call's tokens."""

CallRole = Literal["worker", "grader"]
"""Who made a model call: the agent (``worker``) or the rubric's grader."""

CallStatus = Literal["ok", "error"]
"""How a model call ended: a reply, or an exception (its text in `ModelCallRecord.error`)."""


class CallToolCall(TypedDict):
    """A tool call as a call trace keeps it."""

    name: str
    """The tool's name."""
    args: str
    """Its arguments as JSON text, cut to `CALL_TOOL_ARGS_CHAR_LIMIT` with a marker."""
    id: NotRequired[str]
    """The provider's id for the call."""


class CallMessage(TypedDict):
    """One message sent to (or the reply of) a model call, as a call trace keeps it."""

    role: str
    """LangChain's message type: ``system``, ``human``, ``ai``, ``tool`` (or ``marker`` for
    the line that stands for messages left out)."""
    text: str
    """The message's text, scrubbed of secrets and cut with a visible marker."""
    name: NotRequired[str]
    """The message's ``name`` (a tool's name, the revision turn's source)."""
    tool_calls: NotRequired[list[CallToolCall]]
    """Tool calls an assistant message asked for."""
    tool_call_id: NotRequired[str]
    """For a tool result: the call it answers."""


class ModelCallRecord(TypedDict):
    """One model call of a run, worker or grader: what LangSmith shows for an LLM run.

    Usage is kept as the provider reported it, so that a price table can cost each call
    (`model` as the provider names it, and the four token counts).
    """

    call_id: str
    """LangChain's run id of the call (unique within the run)."""
    role: CallRole
    """The worker or the grader."""
    iteration: int
    """0-based grader pass the call belongs to: the worker's answer judged by that pass, or
    one of that pass's grader calls."""
    grading_run_id: str | None
    """The grading run of that pass (None for a worker call before the first pass)."""
    attempt: int
    """For the grader: its bounded retry of this request (0 the first try, 1 the first retry
    after a transient error, ...); 0 for the worker."""
    provider: str | None
    """LangChain's provider name (``openai``, ``anthropic``, ...) where the model says it."""
    model: str
    """The model as the provider's reply names it (e.g. a dated snapshot), else as requested."""
    status: CallStatus
    """``ok`` or ``error``."""
    error: str | None
    """``Type: message`` of the exception that ended the call, scrubbed; None when ok."""
    started_at: str
    """ISO 8601 UTC time the call started."""
    latency_s: float
    """Wall-clock seconds from the call's start to its reply or error."""
    first_token_s: float | None
    """Seconds to the first streamed token (None when the reply was not streamed)."""
    input_tokens: int | None
    """Input tokens the provider reported (None when it reported no usage)."""
    cached_input_tokens: int | None
    """Of those, read from the provider's prompt cache (``cache_read``)."""
    cache_creation_tokens: int | None
    """Of those, written to the provider's prompt cache (``cache_creation``)."""
    output_tokens: int | None
    """Output tokens the provider reported."""
    http_retries: int
    """Requests sent again after a 429 or 5xx inside this call (the shared backoff's HTTP
    client, `rubric_core.http_retry.SharedBackoff`); 0 for other clients."""
    messages: list[CallMessage]
    """The messages as sent, bounded (`CALL_MESSAGES_KEPT`, `CALL_MESSAGE_CHAR_LIMIT`)."""
    messages_total: int
    """How many messages were sent (more than `messages` holds when some were left out)."""
    reply: CallMessage | None
    """The reply with its tool calls (None for an error)."""
    tools: list[str]
    """Names of the tools the call offered the model."""
    content_kept: bool
    """False when the run's trace budget (`CALL_CONTENT_BUDGET_CHARS`) was spent: the
    messages and reply were not stored, the numbers were."""


# -- models ---------------------------------------------------------------------------------------

Role = Literal["worker", "grader"]
"""Which model of a run is being built."""

ModelResolver = Callable[[str, Role, str | None], "BaseChatModel"]
"""Builds a chat model from ``(model string, role, base URL)``, with whatever key it holds
(`rubric_core.models.model_resolver` builds every one the app and the CLI use)."""


class CriterionVerdict(TypedDict):
    """One criterion's verdict inside an evaluation."""

    name: str
    """The criterion, as written in the rubric (bullets and numbering stripped)."""
    passed: bool
    """Whether the answer meets the criterion."""
    gap: NotRequired[str]
    """What is missing or wrong; present exactly when `passed` is false."""
    agreement: NotRequired[float]
    """With ``grader_repeats > 1``: the share of repeats whose verdict on this criterion agrees
    with the consensus (1.0 when every repeat agreed)."""


class RubricEvaluation(TypedDict):
    """The record of one grader pass, appended to `_rubric_evaluations`."""

    grading_run_id: str
    """Shared by every pass of one rubric attempt."""
    iteration: int
    """0-based index of this pass within its grading run."""
    result: RubricResult
    """The grader's own verdict for this pass, or `grader_error`."""
    explanation: str
    """The grader's summary; for `grader_error`, the exception type and message."""
    criteria: list[CriterionVerdict]
    """Per-criterion verdicts in rubric order (empty for `grader_error`)."""
    status: RubricStatus
    """The run's status after this pass (`max_iterations_reached` when the cap ends it)."""
    unverified: bool
    """True when the grader left criteria unanswered even after a correction."""
    duration_s: float
    """Wall-clock seconds the pass took, retries and evidence tool calls included."""
    input_tokens: int | None
    """Grader input tokens over the pass, where the provider reports usage."""
    output_tokens: int | None
    """Grader output tokens over the pass, where the provider reports usage."""
    answer: str
    """The text that was graded (the agent's latest answer)."""
    cached_input_tokens: NotRequired[int | None]
    """Of `input_tokens`, those the provider read from its prompt cache (LangChain's
    ``input_token_details["cache_read"]``; 0 when usage came without it); None when no usage
    was reported. Absent from evaluations recorded before it was kept."""
    unknown_criteria: NotRequired[list[str]]
    """Verdict names that match no rubric criterion (`grader.criterion_key`); never counted."""
    repeats: NotRequired[int]
    """With ``grader_repeats > 1``: how many times this answer was graded."""
    unstable: NotRequired[list[str]]
    """With ``grader_repeats > 1``: criteria whose repeats did not all agree."""
    regressed: NotRequired[list[str]]
    """Criteria that passed on the previous pass of this grading run and fail now."""
    stalled: NotRequired[bool]
    """True when the answer is the previous attempt's, unchanged (whitespace aside)."""
    verdict_mode: NotRequired[str]
    """How the grader was made to give its verdict (`rubric_core.grader.VerdictMode`:
    ``tool_choice``, ``json_schema`` or ``prompt``); absent after a ``grader_error`` and from
    evaluations recorded before it was kept."""
    answer_cut: NotRequired[bool]
    """True when the graded answer stopped at the worker's output token limit
    (``finish_reason: length``): it is incomplete, and the revision turn says so."""


class EvaluationStartEvent(TypedDict):
    """Emitted on the stream writer before a grader pass."""

    type: Literal["rubric_evaluation_start"]
    """Event tag."""
    grading_run_id: str
    """The grading run this pass belongs to."""
    iteration: int
    """0-based index of the pass within its run."""


class EvaluationEndEvent(TypedDict):
    """Emitted on the stream writer after a grader pass (also after a grader exception)."""

    type: Literal["rubric_evaluation_end"]
    """Event tag."""
    grading_run_id: str
    """The grading run this pass belongs to."""
    iteration: int
    """0-based index of the pass within its run."""
    result: RubricResult
    """The grader's verdict for this pass."""
    explanation: str
    """The grader's summary."""
    criteria: list[CriterionVerdict]
    """Per-criterion verdicts."""
    status: RubricStatus
    """The run's status after this pass."""
    evaluation: RubricEvaluation
    """The full evaluation record (timings, tokens, graded answer)."""


class GradedCriterion(BaseModel):
    """One criterion as the grader answers it."""

    name: str = Field(description="The criterion exactly as listed in the rubric.")
    passed: bool = Field(description="True when the answer fully meets the criterion.")
    gap: str | None = Field(
        default=None,
        description=(
            "Required when passed is false: what is missing or wrong, concrete enough for the "
            "author to fix it without asking. Omit when passed is true."
        ),
    )

    @model_validator(mode="after")
    def _no_gap_when_passed(self) -> GradedCriterion:
        # A passing criterion has nothing missing: a stray gap would read as a defect.
        if self.passed and self.gap is not None:
            self.gap = None
        return self

    @model_serializer(mode="wrap")
    def _pass_has_no_gap(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Dumped, a pass is {name, passed} (as deepagents' verdicts are): no gap key at all.
        data: dict[str, Any] = handler(self)
        if self.passed:
            data.pop("gap", None)
        return data

    def __eq__(self, other: object) -> bool:
        """Equal to another verdict, or to a mapping equal to this verdict's `model_dump`."""
        if isinstance(other, Mapping):
            return self.model_dump() == dict(other)
        return super().__eq__(other)



class GraderResponse(BaseModel):
    """The grader's structured verdict for one pass."""

    result: GraderVerdict = Field(
        description=(
            "'satisfied' only when every criterion passes; 'needs_revision' when at least one "
            "fails; 'failed' when the rubric cannot be judged against this transcript."
        )
    )
    explanation: str = Field(description="One or two sentences summarising the verdict.")
    criteria: list[GradedCriterion] = Field(
        description="One entry for every numbered criterion, in rubric order, none left out."
    )

    @model_validator(mode="after")
    def _consistent(self) -> GraderResponse:
        failing = [c for c in self.criteria if not c.passed]
        if self.result == "satisfied" and failing:
            names = ", ".join(repr(c.name) for c in failing)
            msg = f"result is 'satisfied' but these criteria fail: {names}"
            raise ValueError(msg)
        if self.result == "needs_revision" and self.criteria and not failing:
            msg = "result is 'needs_revision' but every criterion passes"
            raise ValueError(msg)
        for c in failing:
            if not (c.gap or "").strip():
                msg = f"criterion {c.name!r} fails without a gap saying what to fix"
                raise ValueError(msg)
        return self


class CriterionLabel(TypedDict):
    """A person's label of one criterion verdict of one evaluation (`Store.set_label`)."""

    run_id: str
    """The run whose evaluation was labelled."""
    seq: int
    """0-based position of the evaluation within the run (`Store.evaluations` order)."""
    criterion: str
    """The criterion's name as the evaluation records it."""
    labeller: str
    """The person's local name."""
    agree: bool
    """Whether the person agrees with the grader's verdict."""
    correct: bool | None
    """The verdict the person says is right (True: pass); None when not given."""
    note: str
    """The person's note (``""`` for none)."""
    created_at: str
    """ISO 8601 UTC timestamp of the first label."""
    updated_at: str
    """ISO 8601 UTC timestamp of the last change."""


class ExperimentProgress(TypedDict):
    """Where one configuration of an experiment stands; sent after every cell that ends."""

    type: Literal["experiment_progress"]
    """Event tag."""
    experiment_id: str
    """The experiment."""
    config_index: int
    """0-based index of the configuration."""
    label: str
    """The configuration's label."""
    done: int
    """Cells of this configuration that have ended (any final status, errors included)."""
    total: int
    """Cells of this configuration (rows × repeats)."""
    satisfied: int
    """Ended cells whose run was satisfied."""
    errors: int
    """Ended cells whose run ended ``error`` or ``grader_error`` (retryable alone)."""
    satisfied_rate: float | None
    """``satisfied / done`` (None while nothing has ended)."""
    eta_s: float | None
    """Seconds until the whole experiment ends, at this session's pace (None at first)."""


class CellFinished(TypedDict):
    """One cell's run ended (or was stopped) in this session."""

    type: Literal["cell_finished"]
    """Event tag."""
    experiment_id: str
    """The experiment."""
    row_id: str
    """The dataset row."""
    config_index: int
    """0-based index of the configuration."""
    repeat_index: int
    """0-based repeat."""
    run_id: str | None
    """The cell's run in the run index (open it in Review)."""
    status: str
    """The run's status (`RunStatus`)."""
    error: str | None
    """The error of a run that ended ``error``."""
    lost_database: NotRequired[bool]
    """True when the database went away under the cell: it ended ``interrupted`` where it
    stood, and a Resume continues it (`rubric_core.engine.outage`)."""


class ExperimentBackoff(TypedDict):
    """A model server answered 429 or 5xx: every cell's next request waits (shared backoff)."""

    type: Literal["experiment_backoff"]
    """Event tag."""
    status_code: int
    """The HTTP status that caused it."""
    wait_s: float
    """How long new requests wait."""
    hits: int
    """Rate-limit or server errors absorbed so far in this session."""


class ExperimentFinished(TypedDict):
    """The session ended: every cell ended (``finished``) or it was stopped (``stopped``)."""

    type: Literal["experiment_finished"]
    """Event tag."""
    experiment_id: str
    """The experiment."""
    status: ExperimentStatus
    """The experiment's status now."""
    duration_s: float
    """Wall-clock seconds of this session."""
    budget_reached: NotRequired[bool]
    """With a budget: whether it stopped the session (a cell would have spent past it)."""
    spent_usd: NotRequired[str]
    """With a budget: the dollars its cells' recorded calls cost, as a decimal string."""
    lost_database: NotRequired[str]
    """When the database went away during the session (cells were cut, or the session's own
    reads failed): what the store said then. Cells it cut are ``interrupted`` unless they ended
    since; a Resume continues them (`rubric_core.engine.outage`)."""


ExperimentEvent = ExperimentProgress | CellFinished | ExperimentBackoff | ExperimentFinished
"""What `rubric_core.experiments.run_experiment` yields."""
