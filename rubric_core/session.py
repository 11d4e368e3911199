"""Start and resume runs: one session layer for the app and the CLI.

`start` and `resume` take a `RunSettings` (or a stored run's id), build the runner's spec,
record the run in the index while its events stream past, and keep the active-run registry.
The Run page and the CLI only turn their inputs into settings and draw the events.

Keys: models are built by a `ModelResolver` the caller passes at start or resume time (the app's
applies its rule that a stored key goes only to the endpoint it was configured for); the
settings, and so the store, never hold a key.

Lifecycle (statuses in `rubric_core.types.RunStatus`): a run is ``running`` while its owner
records it, and the owner touches the row every `HEARTBEAT_S` seconds. A ``running`` run that
this process is not recording and whose row was not touched for `STALE_AFTER_S` seconds lost its
owner (a killed server or CLI): it is shown as ``interrupted`` (`reconcile` writes that) and
offered for Resume, like runs stopped (``interrupted``) or ended on an error (``error``).

Several processes (app servers, CLIs) may share one database: what another process is doing
is read from the rows alone (status, owner and heartbeat, all timed by the database's clock,
`Store.now`), and a resume takes the run with one conditional update (`Store.claim_run`) that
makes the resumer its owner, so two processes never record the same run at once: a former
owner that was only paused (not dead) finds its heartbeat, passes, ending and checkpoints
refused (the graph runs with the run's `rubric_core.store.Fence`), and stops with
`rubric_core.store.RunTakenOver`. The registry below only answers for this process's own
script threads.

Why one module of over 600 lines: starting, resuming and recording a run are one ownership
protocol (who holds a run, when it is stale, who may write its passes and its ending), and its
rules read best side by side; the graph itself is `rubric_core.runner`'s, the rows the store's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from rubric_core.models import model_resolver
from rubric_core.redact import error_text, redact, redact_data
from rubric_core.registry import (
    HEARTBEAT_S,
    STALE_AFTER_S,
    ActiveRegistry,
    new_owner,
    owner_is_gone,
)
from rubric_core.runner import RunSpec, arun_rubric
from rubric_core.stopping import VERDICT_CHANNEL, RunPump
from rubric_core.store import Fence, RunTakenOver, StoreError, is_unavailable
from rubric_core.types import RESUMABLE_STATUSES
from rubric_core.types import ModelResolver as ModelResolver  # re-exported
from rubric_core.types import Role as Role  # re-exported

if TYPE_CHECKING:
    from collections.abc import (
        AsyncGenerator,
        AsyncIterator,
        Callable,
        Generator,
        Iterable,
        Iterator,
        Mapping,
        Sequence,
    )

    from langchain_core.tools import BaseTool

    from rubric_core.consensus import Consensus
    from rubric_core.runner import RunEvent
    from rubric_core.settings import RunSettings
    from rubric_core.store import RunRecord, Store
    from rubric_core.types import ModelCallRecord, RubricEvaluation




def default_models(*, token_delay_s: float = 0.0) -> ModelResolver:
    """Models resolved from the environment's keys (`rubric_core.models.model_resolver`).

    Args:
        token_delay_s: Seconds between the offline demo worker's chunks.

    """
    return model_resolver(token_delay_s=token_delay_s)


def build_grader_tools(names: Iterable[str], example_name: str | None = None) -> list[BaseTool]:
    """Fresh grader tool instances by name: the general tools and the example's own.

    Raises:
        ValueError: A name is neither a general tool nor one of the example's.

    """
    from rubric_core.examples import get_example
    from rubric_core.tools import DEFAULT_TOOLS

    available: dict[str, BaseTool] = dict(DEFAULT_TOOLS)
    if example_name:
        with contextlib.suppress(KeyError):
            available.update({t.name: t for t in get_example(example_name).grader_tools()})
    tools: list[BaseTool] = []
    for name in dict.fromkeys(names):
        if name not in available:
            msg = (f"Grader tool {name!r} is not available: load the example that provides it "
                   "or remove it from the grader tools.")
            raise ValueError(msg)
        tools.append(available[name])
    return tools


def build_spec(settings: RunSettings, models: ModelResolver | None = None) -> RunSpec:
    """The runner's spec for settings: models and tools built, everything checked.

    Raises:
        ValueError: The settings cannot run, or a grader tool is unknown.
        ModelConfigError: A model cannot be built.

    """
    settings.validate()
    models = models or default_models()
    spec = RunSpec(
        prompt=settings.prompt, rubric=settings.rubric,
        worker=models(settings.worker_model, "worker", settings.base_url),
        grader=models(settings.grader_model, "grader", settings.base_url),
        worker_system_prompt=settings.worker_system_prompt or None,
        grader_system_prompt=settings.grader_system_prompt or None,
        grader_tools=build_grader_tools(settings.grader_tools, settings.example_name),
        max_iterations=settings.max_iterations, base_url=settings.base_url,
        grader_repeats=settings.grader_repeats,
        consensus=cast("Consensus", settings.consensus),  # checked by settings.validate()
        return_best=settings.return_best, worker_max_tokens=settings.worker_max_tokens,
        grader_max_tokens=settings.grader_max_tokens,
        force_grader_tools=settings.force_grader_tools,
    )
    spec.validate()
    return spec


# -- the active-run registry ----------------------------------------------------------------------

ACTIVE_RUNS: ActiveRegistry[threading.Event | None] = ActiveRegistry("Run")
"""The runs this process is recording right now (running or stopping), each with its stop
signal (`request_stop`); None for runs on an event loop, which stop through their own."""


def request_stop(run_id: str | None) -> bool:
    """Stop a run this process records, from any thread (a Stop button's callback).

    The run stops within `rubric_core.stopping.POLL_S` and is recorded ``interrupted``; a
    model call in progress is abandoned, never recorded (`rubric_core.stopping`).

    Returns:
        True when the run was active here and is now stopping.

    """
    stop = ACTIVE_RUNS.get(run_id) if run_id else None
    if stop is None:
        return False
    stop.set()
    return True


def is_active(run_id: str) -> bool:
    """Whether this process is recording the run right now (running or stopping)."""
    return run_id in ACTIVE_RUNS


def wait_until_inactive(run_id: str, timeout_s: float) -> bool:
    """Wait for a stopping run to finish unwinding; True when it is no longer active."""
    return ACTIVE_RUNS.wait_until_inactive(run_id, timeout_s)


# -- lifecycle ------------------------------------------------------------------------------------


def stale_before(now: str | None = None) -> str:
    """The heartbeat time before which a ``running`` run lost its owner.

    That is ``now`` (ISO 8601, by the database's clock: `Store.now`) less `STALE_AFTER_S`.
    """
    moment = datetime.fromisoformat(now) if now else datetime.now(UTC)
    return (moment - timedelta(seconds=STALE_AFTER_S)).isoformat(timespec="microseconds")


def is_stale(record: RunRecord) -> bool:
    """Whether a ``running`` run lost its owner (see the module docstring).

    Stale at once when its owner was a process of this host that has exited
    (`rubric_core.registry.owner_is_gone`); else when its heartbeat aged past `STALE_AFTER_S`,
    judged at the moment the store read the record, by the database's clock
    (`RunRecord.observed_at`), so machines whose clocks disagree agree on it.
    """
    return (record.status == "running" and not is_active(record.run_id)
            and (record.updated_at < stale_before(record.observed_at)
                 or owner_is_gone(record.owner)))


def run_status(record: RunRecord) -> str:
    """The status to show: ``interrupted`` for a run whose owner died, else the stored one."""
    return "interrupted" if is_stale(record) else record.status


def is_resumable(record: RunRecord) -> bool:
    """Whether Resume can continue the run now (stopped, ended on an error, or owner dead)."""
    if is_active(record.run_id):
        return False
    return record.status in RESUMABLE_STATUSES or is_stale(record)


def reconcile(store: Store) -> int:
    """Mark ``interrupted`` the running runs whose owner died; returns how many."""
    keep = ACTIVE_RUNS.keys()
    count = store.interrupt_stale_runs(updated_before=stale_before(store.now()), keep=keep)
    for record in store.list_runs(status="running", limit=None):
        if record.run_id not in keep and owner_is_gone(record.owner):
            with contextlib.suppress(StoreError, KeyError):  # RunTakenOver: resumed meanwhile
                if store.finish_run(record.run_id, "interrupted", owner=record.owner,
                                    only_running=True):
                    count += 1
    return count


def resumable_runs(store: Store, *, limit: int = 20) -> list[RunRecord]:
    """Runs Resume can continue, most recent first (after `reconcile`)."""
    reconcile(store)
    runs = store.list_runs(status=sorted(RESUMABLE_STATUSES), limit=limit)
    return [r for r in runs if not is_active(r.run_id)]


# -- start and resume -----------------------------------------------------------------------------


class _SessionBase:
    """What `Session` and `AsyncSession` hold: the store, the run's record and its owner."""

    def __init__(self, store: Store, record: RunRecord, owner: str) -> None:
        self.store = store
        self.record = record
        self.settings = record.settings
        self.owner = owner
        """This session's name on the run's row (`RunRecord.owner`)."""

    @property
    def run_id(self) -> str:
        """The run's id in the index."""
        return self.record.run_id


class Session(_SessionBase):
    """One run being recorded: iterate it for the runner's events; close it to stop the run.

    Closing (a Stop button, a rerun, Ctrl-C) aborts the graph and marks the run
    ``interrupted``; its thread stays in the database for :func:`resume`.
    """

    def __init__(self, store: Store, record: RunRecord, spec: RunSpec, *, resume: bool,
                 owner: str, changed: bool = False) -> None:
        super().__init__(store, record, owner)
        self._events = _recorded(store, record, spec, resume=resume, owner=owner,
                                 changed=changed)

    def __iter__(self) -> Iterator[RunEvent]:
        return self._events

    def __next__(self) -> RunEvent:
        return next(self._events)

    def close(self) -> None:
        """Stop the run (if it is still going) and finish recording it."""
        self._events.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncSession(_SessionBase):
    """A `Session` whose run goes on the caller's event loop (`rubric_core.runner.arun_rubric`).

    For runs nobody watches (experiment cells): only evaluations and the final event stream.
    Iterate it with ``async for``. To stop it, make its ``stop`` callable answer True: the run
    ends after the step in progress and is marked ``interrupted``, resumable from there
    (`rubric_core.runner.arun_rubric`). ``await aclose()``, or cancelling the consuming task,
    stops it at once, losing the step in progress. The store is written through `Store.acall`
    (on the loop for SQLite, from worker threads for a database server).
    """

    def __init__(self, store: Store, record: RunRecord, spec: RunSpec, *, resume: bool,
                 owner: str, stop: Callable[[], bool] | None) -> None:
        super().__init__(store, record, owner)
        self._events = _arecorded(store, record, spec, resume=resume, owner=owner, stop=stop)

    def __aiter__(self) -> AsyncIterator[RunEvent]:
        return self._events

    async def __anext__(self) -> RunEvent:
        return await anext(self._events)

    async def aclose(self) -> None:
        """Stop the run (if it is still going) and finish recording it."""
        await self._events.aclose()


def _new_run(settings: RunSettings, models: ModelResolver | None, *, watch: bool
             ) -> tuple[RunSettings, RunSpec, str]:
    """A new run's titled settings, spec (models built) and owner name; nothing stored yet."""
    settings = settings.titled()
    spec = dataclasses.replace(build_spec(settings, models), watch_worker=watch)
    return settings, spec, new_owner()


def start(
    store: Store,
    settings: RunSettings,
    *,
    models: ModelResolver | None = None,
    thread_id: str | None = None,
    watch: bool = True,
) -> Session:
    """Record a new run and prepare its events (nothing is called until they are iterated).

    The settings get their title (`RunSettings.titled`) and are stored scrubbed of secrets.

    Args:
        store: The database.
        settings: What to run.
        models: Builds the chat models, with their keys (`default_models()` when omitted).
        thread_id: The LangGraph thread (the new run's id when omitted).
        watch: Stream the worker's answers as events (`RunSpec.watch_worker`); False for runs
            nobody watches, which records the same evaluations for less CPU.

    Raises:
        ValueError: The settings cannot run (nothing is stored).
        ModelConfigError: A model cannot be built (nothing is stored).

    """
    settings, spec, owner = _new_run(settings, models, watch=watch)
    record = store.create_run(settings.redacted(), thread_id=thread_id, owner=owner)
    return Session(store, record, spec, resume=False, owner=owner)


async def astart(
    store: Store,
    settings: RunSettings,
    *,
    models: ModelResolver | None = None,
    thread_id: str | None = None,
    stop: Callable[[], bool] | None = None,
    fresh_thread: bool = False,
) -> AsyncSession:
    """`start` for a run on the caller's event loop (`AsyncSession`); never watched.

    ``stop`` is asked after every step; True ends the run there (see `AsyncSession`).
    ``fresh_thread``: raise `rubric_core.store.ThreadTaken` when ``thread_id`` has a run
    already (`Store.create_run`).

    The models are built on the loop (an experiment's clients belong to it); the run's row is
    written by `Store.acall`.
    """
    settings, spec, owner = _new_run(settings, models, watch=False)
    record = await store.acall(store.create_run, settings.redacted(), thread_id=thread_id,
                               owner=owner, fresh_thread=fresh_thread)
    return AsyncSession(store, record, spec, resume=False, owner=owner, stop=stop)


def _resumable(store: Store, run_id: str, record: RunRecord | None) -> RunRecord:
    """The stored run if it may be resumed now; see `resume` for the errors."""
    if record is None:
        msg = f"no run with id {run_id!r} in {store.path}"
        raise KeyError(msg)
    if is_active(run_id) or (record.status == "running" and not is_stale(record)):
        msg = (f"Run {run_id[:8]} is still running (in this server, another tab or another "
               f"process); wait for it to end, or try again in {STALE_AFTER_S:.0f} s if its "
               "process died.")
        raise RuntimeError(msg)
    return record


def resumed_settings(
    settings: RunSettings,
    *,
    base_url: str | None = None,
    worker_model: str | None = None,
    grader_model: str | None = None,
    worker_max_tokens: int | None = None,
    grader_max_tokens: int | None = None,
) -> RunSettings | None:
    """A stored run's settings with the endpoint or models a resume changes; None: unchanged.

    A run that ended on "Connection error" can only be finished against another server, and
    one whose replies were cut at their output token limit with a higher one: a resume may
    change where it is sent, by which models and how long their replies may be, never what it
    asks or how it is judged. None keeps a value; an empty ``base_url`` means the provider's
    own endpoint.

    Raises:
        ValueError: The changed settings cannot run (a blank model, a URL with a password, a
            token limit out of range).

    """
    changes: dict[str, Any] = {}
    if base_url is not None and (base_url.strip() or None) != settings.base_url:
        changes["base_url"] = base_url.strip() or None
    for field, value in (("worker_model", worker_model), ("grader_model", grader_model)):
        if value is not None and value.strip() != getattr(settings, field):
            changes[field] = value.strip()
    for field, limit in (("worker_max_tokens", worker_max_tokens),
                         ("grader_max_tokens", grader_max_tokens)):
        if limit is not None and limit != getattr(settings, field):
            changes[field] = limit
    if not changes:
        return None
    changed = settings.replace(**changes)
    changed.validate()
    return changed


def _resumed(record: RunRecord, models: ModelResolver | None, changed: RunSettings | None,
             *, watch: bool) -> tuple[RunRecord, RunSpec]:
    """The record as it will be resumed (changed settings scrubbed) and its spec."""
    settings = changed or record.settings
    spec = dataclasses.replace(build_spec(settings, models), watch_worker=watch)
    if changed is not None:
        record = dataclasses.replace(record, settings=changed.redacted())
    return record, spec


def resume(
    store: Store,
    run_id: str,
    *,
    models: ModelResolver | None = None,
    base_url: str | None = None,
    worker_model: str | None = None,
    grader_model: str | None = None,
    watch: bool = True,
    worker_max_tokens: int | None = None,
    grader_max_tokens: int | None = None,
) -> Session:
    """Continue a stored run on its thread with the settings it was started with.

    The endpoint, the models and their output token limits may change (`resumed_settings`):
    the change is recorded in
    the run's settings when the resume takes the run, so Review, export and a later Resume
    see where it was finished. Keys are never stored: ``models`` carries them.

    A run that already ended reports its result without calling a model.

    Args:
        store: The database.
        run_id: The run.
        models: Builds the chat models, with their keys (`default_models()` when omitted).
        base_url: Send the run to this server from now on (``""``: the provider's own).
        worker_model: Continue with this worker model.
        grader_model: Continue with this grader model.
        watch: As for `start`.
        worker_max_tokens: Continue with this output token limit for the worker.
        grader_max_tokens: Continue with this output token limit for the grader.

    Raises:
        KeyError: No such run.
        RuntimeError: The run is being recorded now (here, or by a live process elsewhere).
        ValueError: The settings (as changed) cannot run.
        ModelConfigError: A model cannot be built.

    """
    record = _resumable(store, run_id, store.get_run(run_id))
    changed = resumed_settings(record.settings, base_url=base_url, worker_model=worker_model,
                               grader_model=grader_model, worker_max_tokens=worker_max_tokens,
                               grader_max_tokens=grader_max_tokens)
    record, spec = _resumed(record, models, changed, watch=watch)
    return Session(store, record, spec, resume=True, owner=new_owner(),
                   changed=changed is not None)


async def aresume(store: Store, run_id: str, *, models: ModelResolver | None = None,
                  stop: Callable[[], bool] | None = None) -> AsyncSession:
    """`resume` for a run on the caller's event loop (`AsyncSession`); errors as `resume`'s.

    ``stop`` as for `astart`.
    """
    record = _resumable(store, run_id, await store.acall(store.get_run, run_id))
    _, spec = _resumed(record, models, None, watch=False)  # models built on the loop
    return AsyncSession(store, record, spec, resume=True, owner=new_owner(), stop=stop)


# -- recording ------------------------------------------------------------------------------------


class _Heartbeat:
    """Touches a running run's row every `HEARTBEAT_S` seconds, with the duration so far.

    From a thread of its own (`start_thread`, for a `Session`) or a task on the event loop
    (`start_task`, for an `AsyncSession`: a hundred cells are not a hundred threads). `lost`
    is set when a touch finds the run held by another owner (it was taken over).
    """

    def __init__(self, store: Store, run_id: str, owner: str,
                 elapsed: Callable[[], float]) -> None:
        self._store, self._run_id, self._owner, self._elapsed = store, run_id, owner, elapsed
        self._stop = threading.Event()
        self.lost = threading.Event()
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None

    def touch(self) -> None:
        with contextlib.suppress(StoreError, KeyError):
            held = self._store.touch_run(self._run_id, owner=self._owner,
                                         duration_s=round(self._elapsed(), 3))
            if not held and not self._stop.is_set():
                self.lost.set()

    def start_thread(self) -> None:
        def beat() -> None:
            while not self._stop.wait(HEARTBEAT_S):
                self.touch()

        self._thread = threading.Thread(target=beat, name=f"heartbeat-{self._run_id[:8]}",
                                        daemon=True)
        self._thread.start()

    def start_task(self) -> None:
        async def beat() -> None:
            while True:
                await asyncio.sleep(HEARTBEAT_S)
                await self._store.acall(self.touch)

        self._task = asyncio.get_running_loop().create_task(beat())

    def stop(self) -> None:
        """Stop beating (called from the thread or loop that started it).

        A touch that lands after the run ended changes nothing (`Store.touch_run` leaves
        ended runs alone).
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._task is not None:
            self._task.cancel()


class _Recording:
    """How a session writes its run: one hold on the run, each evaluation once, one ending.

    Shared by `Session` (events from a generator) and `AsyncSession` (from an async one, which
    calls the methods that write through `Store.acall`).
    """

    def __init__(self, store: Store, record: RunRecord, *, resume: bool, owner: str,
                 changed: bool = False) -> None:
        self.store, self.run_id, self.owner = store, record.run_id, owner
        self.resume = resume
        # A resume that changes the endpoint or models records them with its claim.
        self.new_settings = record.settings if changed else None
        self.seen_status = record.status
        """The status the resumer read: a run that ended since is not claimed (`claim_run`)."""
        # A local owner that has exited holds the run no more, however fresh its heartbeat.
        self.gone_owner = record.owner if owner_is_gone(record.owner) else None
        self.prior = (record.duration_s or 0.0) if resume else 0.0
        self.started = time.perf_counter()
        self.heartbeat = _Heartbeat(store, record.run_id, owner, self.elapsed)
        self.seen: set[tuple[str, int]] = set()
        self.finished = self.taken = self.registered = False
        self.stop: threading.Event | None = None
        self.unrecorded: dict[str, ModelCallRecord] = {}
        """Calls announced as they ended (``call_finished``) that no pass has recorded yet: a
        Stop or a failure mid-pass records them with the ending, as they were paid for."""

    def begin(self, stop: threading.Event | None = None, *, thread_id: str = "") -> None:
        """Register the run as this process's and take it over when resuming.

        The caller then starts the heartbeat (on a thread or the event loop).

        Args:
            stop: The run's stop signal, for `request_stop` (None on an event loop).
            thread_id: The run's thread, whose held passes a resume records first.

        Raises:
            RuntimeError: This process records it already, or another one took it first.

        """
        run_id = self.run_id
        ACTIVE_RUNS.add(run_id, stop)
        self.registered = True
        try:
            if self.resume and not self.store.claim_run(
                    run_id, stale_before=stale_before(self.store.now()), owner=self.owner,
                    settings=self.new_settings, gone_owner=self.gone_owner,
                    seen_status=self.seen_status):
                # Another server or process resumed it between our check and now.
                msg = (f"Run {run_id[:8]} was just resumed by another server or process; it "
                       "is running there now.")
                raise RuntimeError(msg)
            self.started = time.perf_counter()
            if self.resume:  # a new run has no evaluations yet
                self.seen = {_eval_key(e) for e in self.store.evaluations(run_id)}
                self._record_held(thread_id)
        except BaseException:
            self.end()
            raise

    def _record_held(self, thread_id: str) -> None:
        """Record, in their order, the passes the thread holds that the run's record lacks.

        A former owner stopped (or killed) between a pass's verdict and its recording leaves
        that pass only in the thread; recorded here, before the run goes on, it keeps its place
        before the passes this resume adds (instead of arriving with the ending, last).
        """
        saved = self.store.saver().get_tuple(
            {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
        if saved is None:
            return
        held = list(saved.checkpoint.get("channel_values", {}).get(VERDICT_CHANNEL) or [])
        for _task, channel, value in saved.pending_writes or ():
            if channel == VERDICT_CHANNEL and isinstance(value, list):
                held += value  # a finished pass whose step was cut before it was applied
        for evaluation in held:
            if isinstance(evaluation, dict) and "grading_run_id" in evaluation:
                self._add(cast("RubricEvaluation", evaluation))

    def elapsed(self) -> float:
        return self.prior + time.perf_counter() - self.started

    def check(self) -> None:
        """Raise `RunTakenOver` when another process took the run (its heartbeat was refused)."""
        if self.heartbeat.lost.is_set():
            self.taken = True  # the new owner records the run: write nothing more
            raise RunTakenOver(self.run_id)

    def record(self, event: RunEvent) -> None:
        """Write what an event says: an evaluation (once) and its calls, or the run's ending.

        The calls (`rubric_core.calls`) come scrubbed and cut to size; the store keeps a run's
        calls within its bounds and each call once.
        """
        try:
            if event["type"] == "call_finished":
                self.unrecorded[event["call"]["call_id"]] = event["call"]
            elif event["type"] == "evaluation_finished":
                self._add(event["evaluation"])
                if calls := event.get("calls"):
                    self._add_calls(calls)
            elif event["type"] == "run_finished":
                for evaluation in event["evaluations"]:
                    self._add(evaluation)
                if calls := event.get("calls"):
                    self._add_calls(calls)
                # A graph that failed or was stopped after its last pass recorded the run's
                # verdict (a lost connection to the last checkpoint's write, a Stop) does not
                # replace that verdict: interrupted and error are written only while running.
                self.store.finish_run(self.run_id, event["status"],
                                      error=redact(event["error"] or "") or None,
                                      duration_s=round(self.elapsed(), 3), owner=self.owner,
                                      only_running=event["status"] in RESUMABLE_STATUSES)
                self.finished = True
        except RunTakenOver:
            self.taken = True
            raise

    def _add_calls(self, calls: Sequence[ModelCallRecord]) -> None:
        self.store.add_calls(self.run_id, calls, owner=self.owner)
        for call in calls:
            self.unrecorded.pop(call["call_id"], None)

    def _record_cut_calls(self) -> None:
        """Record the calls of a pass that a Stop or a failure cut (they were paid for)."""
        if self.unrecorded and not self.taken:
            with contextlib.suppress(StoreError, KeyError, RunTakenOver):
                self._add_calls(list(self.unrecorded.values()))

    def _add(self, evaluation: RubricEvaluation) -> None:
        key = _eval_key(evaluation)
        if key not in self.seen:  # a resumed node may repeat a pass that was already recorded
            self.store.add_evaluation(self.run_id, redact_data(evaluation), owner=self.owner)
            self.seen.add(key)

    def failed(self, exc: BaseException) -> None:
        """The run raised: record ``error`` (unless it ended, or another process has it).

        A lost database is no failure of the run: it is recorded ``interrupted`` (with the
        reason), so a plain Resume continues its thread, as after a killed process.
        """
        if not self.finished and not self.taken and isinstance(exc, Exception):
            self.finished = True
            self._record_cut_calls()
            status = "interrupted" if is_unavailable(exc) else "error"
            _finish_quietly(self.store, self.run_id, status,
                            error_text(exc), self.elapsed(), self.owner)

    def stopped(self) -> None:
        """The consumer stopped early: record ``interrupted`` (unless ended or taken)."""
        if not self.finished and not self.taken:
            self.finished = True
            self._record_cut_calls()
            _finish_quietly(self.store, self.run_id, "interrupted", None, self.elapsed(),
                            self.owner)

    def end(self) -> None:
        """Stop beating and leave the active-run registry (once; later calls do nothing)."""
        self.heartbeat.stop()
        if self.registered:
            self.registered = False
            ACTIVE_RUNS.discard(self.run_id)


def _recorded(store: Store, record: RunRecord, spec: RunSpec, *, resume: bool, owner: str,
              changed: bool = False) -> Generator[RunEvent, None, None]:
    """Pass the runner's events through, recording each evaluation once and the final status.

    The graph runs on a thread of its own (`rubric_core.stopping.RunPump`). When the consumer
    stops early (closes this generator) or `request_stop` is called, the graph is abandoned at
    once, a model call in progress included, and the run is marked ``interrupted``; an
    exception marks it ``error``. When another process has taken the run over (its heartbeat
    or a write was refused), the graph is abandoned, nothing more is written, and
    `RunTakenOver` is raised.
    """
    recording = _Recording(store, record, resume=resume, owner=owner, changed=changed)
    stop = threading.Event()
    recording.begin(stop, thread_id=record.thread_id)
    recording.heartbeat.start_thread()
    pump = RunPump(spec, store.saver(), record.thread_id, resume=resume,
                   configurable=_fence(recording))
    try:
        for event in pump.events(stop, check=recording.check):
            recording.check()
            recording.record(event)
            yield event
    except Exception as exc:
        recording.failed(exc)
        raise
    finally:
        if not recording.finished:
            pump.abandon()  # the graph writes nothing more; its thread ends on its own
        recording.stopped()
        recording.end()


async def _arecorded(store: Store, record: RunRecord, spec: RunSpec, *, resume: bool,
                     owner: str, stop: Callable[[], bool] | None
                     ) -> AsyncGenerator[RunEvent, None]:
    """`_recorded` for `arun_rubric`: the graph on this loop, the writes by `Store.acall`."""
    recording = _Recording(store, record, resume=resume, owner=owner)
    try:
        await store.acall(recording.begin, thread_id=record.thread_id)
        recording.heartbeat.start_task()
        events = arun_rubric(spec, checkpointer=store.saver(), thread_id=record.thread_id,
                             resume=resume, stop=stop, configurable=_fence(recording))
        try:
            async for event in events:
                recording.check()
                if event["type"] in ("evaluation_finished", "run_finished"):
                    await store.acall(recording.record, event)
                yield event
        except Exception as exc:
            await store.acall(recording.failed, exc)
            raise
        finally:
            if not recording.finished:
                await events.aclose()  # aborts the graph
            await store.acall(recording.stopped)
    finally:
        recording.end()  # on the loop: it cancels the heartbeat's task


def _fence(recording: _Recording) -> dict[str, Any]:
    """The graph config that stores the run's checkpoints only while this session owns it.

    A refused write is a takeover like a refused heartbeat: it sets the same ``lost`` flag,
    so `_Recording.check` stops the session with `RunTakenOver` and writes nothing more.
    """
    return Fence(recording.run_id, recording.owner, lost=recording.heartbeat.lost).configurable()


def _eval_key(ev: Mapping[str, Any]) -> tuple[str, int]:
    return str(ev.get("grading_run_id")), int(ev.get("iteration") or 0)


def _finish_quietly(
    store: Store, run_id: str, status: str, error: str | None, duration_s: float, owner: str
) -> None:
    # On failure the record stays 'running'; without a heartbeat it goes stale and is offered
    # for Resume. A run taken over by another process is left to it (RunTakenOver), and one
    # whose ending was recorded already keeps it (only_running).
    with contextlib.suppress(StoreError, KeyError):
        store.finish_run(run_id, status, error=error, duration_s=round(duration_s, 3),
                         owner=owner, only_running=True)
