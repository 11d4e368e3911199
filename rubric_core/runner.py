"""Run one rubric loop and yield typed events as they happen; shared by the app and the CLI.

`run_rubric` builds ``create_agent(model=worker, middleware=[RubricMiddleware(...)])``, runs it
with LangGraph's ``stream_events(version="v3")`` and turns what streams out — worker tokens and
the middleware's custom ``rubric_evaluation_*`` events — into the events below. Closing the
generator (a Stop button, Ctrl-C) aborts the graph; the thread's checkpoints stay, and
``run_rubric(..., resume=True)`` continues the same grading run.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NotRequired

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.stream import CustomTransformer
from typing_extensions import TypedDict

from rubric_core.calls import attach, close_log, open_log
from rubric_core.grader import message_text
from rubric_core.middleware import RubricMiddleware
from rubric_core.models import limit_output, resolve_model
from rubric_core.redact import error_text, redact, redact_data
from rubric_core.settings import validate_judging, validate_run_text
from rubric_core.store import is_unavailable
from rubric_core.types import (
    DEFAULT_GRADER_MAX_TOKENS,
    DEFAULT_WORKER_MAX_TOKENS,
    MAX_ITERATIONS,
    TERMINAL_STATUSES,
    ModelCallRecord,
    RubricEvaluation,
)

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable, Generator, Iterator, Mapping, Sequence

    from langchain_core.language_models import BaseChatModel
    from langchain_core.tools import BaseTool
    from langgraph.checkpoint.base import BaseCheckpointSaver

    from rubric_core.calls import CallLog
    from rubric_core.consensus import Consensus


class WorkerStarted(TypedDict):
    """The worker began an answer (iteration = the grader pass that will judge it)."""

    type: Literal["worker_started"]
    iteration: int


class WorkerToken(TypedDict):
    """A streamed piece of the worker's answer, as the model sent it.

    Not scrubbed: a key may span pieces, so whoever shows tokens scrubs what it has gathered.
    """

    type: Literal["worker_token"]
    iteration: int
    text: str


class WorkerMessage(TypedDict):
    """The worker's complete message, scrubbed of secrets (`rubric_core.redact`)."""

    type: Literal["worker_message"]
    iteration: int
    text: str


class EvaluationStarted(TypedDict):
    """A grader pass began."""

    type: Literal["evaluation_started"]
    grading_run_id: str
    iteration: int


class EvaluationFinished(TypedDict):
    """A grader pass ended; `evaluation["status"]` says whether the loop goes on."""

    type: Literal["evaluation_finished"]
    evaluation: RubricEvaluation
    calls: NotRequired[list[ModelCallRecord]]
    """The model calls that ended since the last event that carried calls: the worker's answer
    for this pass and this pass's grader calls (`rubric_core.calls`), each filed by its own
    ``iteration``."""


class RunFinished(TypedDict):
    """The run ended: terminal status, or `interrupted`/`error` with the reason."""

    type: Literal["run_finished"]
    thread_id: str
    status: str
    answer: str
    evaluations: list[RubricEvaluation]
    duration_s: float
    error: str | None
    calls: NotRequired[list[ModelCallRecord]]
    """The model calls that ended since the last `EvaluationFinished` (a worker call that
    raised, say)."""


class CallFinished(TypedDict):
    """A model call of the run ended (only from a watched session, `rubric_core.stopping`).

    Sent as the call ends, before the event that carries its record for recording
    (`EvaluationFinished.calls`): for figures that grow during a pass (the Run page's live
    cost). Nothing is recorded from it.
    """

    type: Literal["call_finished"]
    call: ModelCallRecord
    """The call's record (shared with the later event that carries it: do not change it)."""


RunEvent = WorkerStarted | WorkerToken | WorkerMessage | EvaluationStarted | EvaluationFinished | (
    RunFinished | CallFinished
)


@dataclass
class RunSpec:
    """What the runner executes: a run's settings with live objects (chat models, tools, key).

    `rubric_core.session` builds it from a `rubric_core.settings.RunSettings`; scripts and
    tests may build one directly. Model fields take a model string or a chat model.
    """

    prompt: str
    rubric: str
    worker: str | BaseChatModel = "demo"
    grader: str | BaseChatModel = "rules"
    worker_system_prompt: str | None = None
    grader_system_prompt: str | None = None
    grader_tools: Sequence[BaseTool] = field(default_factory=list)
    max_iterations: int = 3
    base_url: str | None = None
    api_key: str | None = None
    token_delay_s: float = 0.0
    max_retries: int = 2
    grader_repeats: int = 1
    consensus: Consensus = "majority"
    return_best: bool = False
    worker_max_tokens: int | None = None
    """The worker's output token limit (`rubric_core.models.limit_output`; None: the default
    for the model)."""
    grader_max_tokens: int | None = None
    """The grader's output token limit, likewise."""
    force_grader_tools: bool = False
    """The grader calls each evidence tool once, forced, before its verdict
    (`RubricMiddleware` ``force_tools``)."""
    watch_worker: bool = True
    """Stream the worker's answers as `WorkerToken` / `WorkerMessage` events (LangGraph's v3
    event stream). False, for runs nobody watches (experiment cells): only the graph's custom
    events are streamed (``stream_mode="custom"``), which costs less CPU per call; evaluations
    and the final `RunFinished` are the same."""

    def validate(self) -> None:
        """Reject a spec that cannot run, before any model is built or called.

        Raises:
            ValueError: Empty prompt or rubric, rubric too large, bad iteration cap, bad grader
                repeats or consensus mode.

        """
        validate_run_text(self.prompt, self.rubric, self.max_iterations)
        validate_judging(self.grader_repeats, self.consensus)


DURABILITY: Literal["sync"] = "sync"
"""LangGraph's durability for every run: a step's checkpoint is stored before the next starts.

With ``"async"`` the next step (a model call) would run while the last one is being saved, and
a save refused by the run's fence (`rubric_core.store.Fence`: another process took the run
over) would surface only when the graph ends, after every remaining model call. ``"sync"``
ends the graph at the first refused save. A save is a fraction of a millisecond on SQLite and
one round trip on PostgreSQL, against seconds per model call."""

MAX_ITERATIONS_CAP = MAX_ITERATIONS
"""The highest iteration cap the runner accepts (the middleware's ceiling)."""


def _model(spec: str | BaseChatModel, run: RunSpec) -> BaseChatModel:
    if isinstance(spec, str):
        return resolve_model(
            spec, base_url=run.base_url, api_key=run.api_key, token_delay_s=run.token_delay_s
        )
    return spec


_AGENT_CACHE_SIZE = 32
_agents: OrderedDict[tuple[Any, ...], tuple[Any, tuple[Any, ...]]] = OrderedDict()
_agents_lock = threading.Lock()


def _agent_key(run: RunSpec, checkpointer: BaseCheckpointSaver[Any]) -> tuple[Any, ...]:
    """What a compiled agent depends on, live objects by identity.

    The prompt and the rubric travel in the graph's input, not in the agent.
    """
    return (id(run.worker), id(run.grader), run.worker_system_prompt,
            run.grader_system_prompt, tuple(id(t) for t in run.grader_tools),
            run.max_iterations, run.max_retries, run.base_url, run.api_key, run.token_delay_s,
            run.grader_repeats, run.consensus, run.return_best, run.worker_max_tokens,
            run.grader_max_tokens, run.force_grader_tools, id(checkpointer))


def build_agent(run: RunSpec, checkpointer: BaseCheckpointSaver[Any]) -> Any:
    """The agent for a run: the worker with `RubricMiddleware` around it.

    Compiled agents are kept (the last `_AGENT_CACHE_SIZE`) and reused by runs with the same
    model objects, tools, prompts, cap and checkpointer; model strings are resolved afresh each
    time. A compiled LangGraph graph serves concurrent threads, and compiling one (with the
    grader's tool schemas) was about a quarter of an experiment cell's CPU. An entry holds the
    objects its key names by identity, so no id is reused while it is cached.
    """
    if isinstance(run.worker, str) or isinstance(run.grader, str):
        return _compile_agent(run, checkpointer)  # a model string may resolve differently later
    key = _agent_key(run, checkpointer)
    with _agents_lock:
        if key in _agents:
            _agents.move_to_end(key)
            return _agents[key][0]
    agent = _compile_agent(run, checkpointer)
    with _agents_lock:
        _agents[key] = (agent, (run.worker, run.grader, tuple(run.grader_tools), checkpointer))
        while len(_agents) > _AGENT_CACHE_SIZE:
            _agents.popitem(last=False)
    return agent


def _compile_agent(run: RunSpec, checkpointer: BaseCheckpointSaver[Any]) -> Any:
    grader = limit_output(_model(run.grader, run), run.grader_max_tokens,
                          default=DEFAULT_GRADER_MAX_TOKENS)
    worker = limit_output(_model(run.worker, run), run.worker_max_tokens,
                          default=DEFAULT_WORKER_MAX_TOKENS)
    for model in (worker, grader):
        attach(model)  # call traces (rubric_core.calls): records only on traced threads
    middleware = RubricMiddleware(
        model=grader,
        system_prompt=run.grader_system_prompt,
        tools=list(run.grader_tools),
        max_iterations=run.max_iterations,
        max_retries=run.max_retries,
        grader_repeats=run.grader_repeats,
        consensus=run.consensus,
        return_best=run.return_best,
        force_tools=run.force_grader_tools,
    )
    return create_agent(
        model=worker,
        system_prompt=run.worker_system_prompt,
        middleware=[middleware],
        checkpointer=checkpointer,
    )


def _run_evaluations(values: dict[str, Any]) -> list[RubricEvaluation]:
    run_id = values.get("_current_grading_run_id")
    return [e for e in values.get("_rubric_evaluations") or [] if e["grading_run_id"] == run_id]


def _last_answer(values: dict[str, Any]) -> str:
    for msg in reversed(values.get("messages") or []):
        if isinstance(msg, AIMessage):
            return message_text(msg)
    return ""


def _custom_event(item: Any, calls: CallLog) -> RunEvent | None:
    """The runner's event for one of the middleware's custom stream items, if it is one."""
    if isinstance(item, dict) and item.get("type") == "rubric_evaluation_start":
        return {"type": "evaluation_started", "iteration": item["iteration"],
                "grading_run_id": item["grading_run_id"]}
    if isinstance(item, dict) and item.get("type") == "rubric_evaluation_end":
        # The pass's grader calls have ended: the middleware reports a pass after them.
        return {"type": "evaluation_finished", "evaluation": item["evaluation"],
                "calls": calls.drain()}
    return None


def _watched(agent: Any, payload: dict[str, Any] | None, config: dict[str, Any],
             iteration: int, calls: CallLog) -> Iterator[RunEvent]:
    """The run through LangGraph's v3 event stream: the worker's tokens, then custom events."""
    with warnings.catch_warnings():
        # The v3 event protocol is marked beta; we rely on it knowingly (see README).
        warnings.filterwarnings("ignore", message=".*v3 streaming protocol.*")
        stream = agent.stream_events(
            payload, config, version="v3", transformers=[CustomTransformer],
            durability=DURABILITY,
        )
    with stream:
        for name, item in stream.interleave("messages", "custom"):
            if name == "messages":
                if item.node != "model":
                    continue
                yield {"type": "worker_started", "iteration": iteration}
                parts: list[str] = []
                for delta in item.text:
                    parts.append(delta)
                    yield {"type": "worker_token", "iteration": iteration, "text": delta}
                # The whole answer, scrubbed of keys it echoes (a key split over tokens is
                # whole here); consumers that draw tokens as they come scrub what they show.
                yield {"type": "worker_message", "iteration": iteration,
                       "text": redact("".join(parts))}
                continue
            event = _custom_event(item, calls)
            if event is not None:
                if event["type"] == "evaluation_finished":
                    iteration = event["evaluation"]["iteration"] + 1
                yield event


class _Run:
    """What `run_rubric` and `arun_rubric` share: the agent, its config and the first input."""

    def __init__(self, run: RunSpec, checkpointer: BaseCheckpointSaver[Any] | None,
                 thread_id: str | None, configurable: Mapping[str, Any] | None,
                 call_listener: Callable[[ModelCallRecord], None] | None = None) -> None:
        run.validate()
        self.thread_id = thread_id or uuid.uuid4().hex
        self.config: dict[str, Any] = {
            "configurable": {**(configurable or {}), "thread_id": self.thread_id},
            "recursion_limit": 10_000}
        self.agent = build_agent(run, checkpointer or InMemorySaver())
        self.started = time.perf_counter()
        self.rubric = run.rubric
        self.payload: dict[str, Any] | None = {
            "messages": [HumanMessage(run.prompt)],
            "rubric": run.rubric,
        }
        self.iteration = 0
        self.calls = open_log(self.thread_id, listener=call_listener)
        """This run's model calls (`rubric_core.calls`), until `close`."""

    def close(self) -> None:
        """Stop tracing the run's model calls."""
        close_log(self.thread_id, self.calls)

    def resume_from(self, snapshot: Any) -> RunFinished | None:
        """Set the input that continues the stored thread; its result if it had ended."""
        values = snapshot.values or {}
        if values.get("messages"):
            self.iteration = values.get("_rubric_iterations") or 0
            self.calls.worker_iteration = self.iteration
            if snapshot.next or snapshot.tasks:
                # Finish the step that was cut off. `next` can be empty while a finished node's
                # writes wait uncommitted (get_state shows them applied); new input would
                # discard them, losing the answer or verdict they hold.
                self.payload = None
            elif values.get("_rubric_status") in TERMINAL_STATUSES:
                return self.finished(values, values["_rubric_status"], None)
            else:
                self.payload = {"messages": [], "rubric": self.rubric}
        return None

    def finished(self, values: dict[str, Any], status: str, error: str | None) -> RunFinished:
        """The closing event, from the thread's final state."""
        if not status:
            status = values.get("_rubric_status") or "interrupted"
        finished = _finished(self.thread_id, values, self.started, status, error)
        finished["calls"] = self.calls.drain()
        return finished


def run_rubric(
    run: RunSpec,
    *,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
    thread_id: str | None = None,
    resume: bool = False,
    configurable: Mapping[str, Any] | None = None,
    call_listener: Callable[[ModelCallRecord], None] | None = None,
) -> Generator[RunEvent, None, None]:
    """Run the rubric loop, yielding events as they happen.

    Args:
        run: What to run.
        checkpointer: Where the thread is saved (in memory when omitted).
        thread_id: The thread to run on (new when omitted).
        resume: Continue an interrupted thread instead of sending the prompt again.
        configurable: More of the graph's ``config["configurable"]``, seen by the
            checkpointer: `rubric_core.store.Fence.configurable` fences the run's writes.
        call_listener: Told of each model call's record as the call ends, on the call's
            thread (`rubric_core.calls.CallLog`); the events still carry every record.

    Yields:
        Worker tokens and messages, evaluation start/finish, and one final `RunFinished`.

    Raises:
        ValueError: The spec is invalid (nothing is run).
        ModelConfigError: A model string cannot be resolved (nothing is run).

    """
    state = _Run(run, checkpointer, thread_id, configurable, call_listener)
    try:
        yield from _run_sync(run, state, resume=resume)
    finally:
        state.close()


def _run_sync(run: RunSpec, state: _Run, *, resume: bool) -> Iterator[RunEvent]:
    agent, config = state.agent, state.config
    if resume and (done := state.resume_from(agent.get_state(config))) is not None:
        yield done
        return
    status, error = "interrupted", None
    try:
        if run.watch_worker:
            yield from _watched(agent, state.payload, config, state.iteration, state.calls)
        else:
            # Closed with the runner (a Stop), which aborts the graph as the v3 stream does.
            with contextlib.closing(agent.stream(state.payload, config, stream_mode="custom",
                                                 durability=DURABILITY)) as items:
                for item in items:
                    event = _custom_event(item, state.calls)
                    if event is not None:
                        yield event
        status = ""
    except Exception as exc:
        status, error = _failed_status(exc), error_text(exc)
    yield state.finished(agent.get_state(config).values or {}, status, error)


async def arun_rubric(
    run: RunSpec,
    *,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
    thread_id: str | None = None,
    resume: bool = False,
    stop: Callable[[], bool] | None = None,
    configurable: Mapping[str, Any] | None = None,
) -> AsyncGenerator[RunEvent, None]:
    """`run_rubric` on the caller's event loop, for runs nobody watches (experiment cells).

    The graph runs as coroutines (``astream``), so many runs share one thread: no thread per
    run, no thread switch per step. It streams the graph's custom events only, as `run_rubric`
    does when `RunSpec.watch_worker` is False: evaluations and the final `RunFinished`, never
    worker tokens. The checkpointer must implement LangGraph's async methods (the store's
    savers do).

    Stopping: ``stop`` is asked after every step of the graph; once it answers True the run
    ends there, without a `RunFinished`, and ``resume=True`` continues it from that step. That
    is the way to stop a run that must resume exactly: a node cancelled halfway (cancelling
    the consuming task, or closing this generator while a node runs) loses what it did, and
    a grader pass whose verdict was already reported would be graded again.

    ``configurable`` as for `run_rubric`.

    Raises:
        ValueError: The spec is invalid, or asks for the worker's tokens (nothing is run).
        ModelConfigError: A model string cannot be resolved (nothing is run).

    """
    if run.watch_worker:
        msg = "arun_rubric streams no worker tokens: set RunSpec.watch_worker = False"
        raise ValueError(msg)
    state = _Run(run, checkpointer, thread_id, configurable)
    try:
        async with contextlib.aclosing(_run_async(state, resume=resume, stop=stop)) as events:
            async for event in events:
                yield event
    finally:
        state.close()


async def _run_async(state: _Run, *, resume: bool, stop: Callable[[], bool] | None
                     ) -> AsyncGenerator[RunEvent, None]:
    agent, config = state.agent, state.config
    if resume and (done := state.resume_from(await agent.aget_state(config))) is not None:
        yield done
        return
    status, error = "interrupted", None
    try:
        # "updates" marks the end of each step: its writes are on their way to the saver.
        async with contextlib.aclosing(agent.astream(
                state.payload, config, stream_mode=["custom", "updates"],
                durability=DURABILITY)) as items:
            async for mode, item in items:
                if mode == "updates":
                    if stop is not None and stop():
                        return  # at a step's end: closing the stream keeps that step
                    continue
                event = _custom_event(item, state.calls)
                if event is not None:
                    yield event
        status = ""
    except Exception as exc:
        status, error = _failed_status(exc), error_text(exc)
    yield state.finished((await agent.aget_state(config)).values or {}, status, error)


def _failed_status(exc: BaseException) -> str:
    """How a graph that raised ends: ``interrupted`` when its database went away, else ``error``.

    A checkpoint write cut by a lost server is no failure of the run: Resume continues it.
    """
    return "interrupted" if is_unavailable(exc) else "error"


def _finished(
    thread_id: str, values: dict[str, Any], started: float, status: str, error: str | None
) -> RunFinished:
    return {
        "type": "run_finished",
        "thread_id": thread_id,
        "status": status,
        "answer": redact(_last_answer(values)),
        "evaluations": redact_data(_run_evaluations(values)),
        "duration_s": round(time.perf_counter() - started, 3),
        "error": error,
    }
