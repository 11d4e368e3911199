"""Re-grading: every answer of a set graded under every configuration, the worker never run.

`run_regrade` grades what a re-grade has not recorded yet and yields progress
(`rubric_core.lab.types.RegradeEvent`):

- One grading is one grader pass over one answer, exactly the middleware's: the grader
  messages (`rubric_core.grader.build_grader_messages`: the request and the answer, the answer
  delimited and escaped as untrusted text) and `grade_steps` driven by `drive_async` on the
  grader model (`rubric_core.models.model_resolver`, shared per model string), with the
  configuration's evidence tools and custom prompt, and Align's few-shot examples from the
  set's labels when asked (`rubric_core.align.aligned_prompt`; never an answer's own). Each
  repeat of ``grader_repeats`` is its own grading; `rubric_core.lab.results` combines them as
  the middleware does (`rubric_core.consensus.combine`).
- Scheduling is the experiments' idea on a smaller unit: ``concurrency`` slots on the one
  background loop the experiments use too (`rubric_core.background.work_loop`), each taking the
  next grading from a bounded queue that a producer fills a page of answers at a time, so memory
  does not grow with the set. A grading is a grader pass (one request at a time), so never more
  than ``concurrency`` requests are in flight. A 429 or 5xx slows every grading down through the
  shared backoff (`rubric_core.http_retry.SharedBackoff`) instead of failing one.
- Each grading is recorded once, in one transaction, under its key (configuration, item,
  repeat) with a unique constraint (`Store.record_regrade_result`): a resume skips what is
  recorded (a graded answer is never graded again). One process grades a re-grade at a time:
  it holds the re-grade in the database (`Store.hold_regrade`, renewed every
  `rubric_core.session.HEARTBEAT_S`), and another process asked to run it meanwhile is refused
  (`RegradeBusy`) rather than paying for the same gradings again; a killed holder's hold is
  taken over at once on its machine, after `rubric_core.session.STALE_AFTER_S` from another
  one. A holder that finds its hold lost (paused past it) stops. A grading that fails is recorded
  ``grader_error`` with its error; ``retry_errors`` (or `rubric_core.lab.retry_errors`) grades
  those again. A lost database stops the re-grade (what is recorded stays).
- Stop (closing the iterator, or setting ``stop``) cancels the gradings in flight (nothing of
  them is recorded) and leaves the re-grade ``stopped``; so does Ctrl-C or ``kill -9`` (the
  status then still says ``running``). Calling `run_regrade` again continues it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage, HumanMessage

from rubric_core.align import MAX_EXAMPLES, Example, aligned_prompt
from rubric_core.background import drive
from rubric_core.experiments import check_limits
from rubric_core.grader import bind_grader, build_grader_messages, drive_async, grade_steps
from rubric_core.http_retry import SharedBackoff
from rubric_core.models import model_resolver
from rubric_core.redact import error_text
from rubric_core.registry import describe_owner, new_owner
from rubric_core.rubric import normalize_name
from rubric_core.session import HEARTBEAT_S, STALE_AFTER_S, build_grader_tools
from rubric_core.store import RegradeResult, StoreError, is_unavailable
from rubric_core.types import DEFAULT_CONCURRENCY

if TYPE_CHECKING:
    from collections.abc import Generator

    from langchain_core.tools import BaseTool

    from rubric_core.lab.config import GraderConfig
    from rubric_core.lab.types import RegradeEvent, RegradeFinished, RegradeProgress
    from rubric_core.store import AnswerItem, ItemLabel, RegradeJob, Store
    from rubric_core.types import ModelResolver

PAGE_ITEMS = 200
"""Answers read from the database at a time while the queue is filled."""

_STOP_POLL_S = 0.05


class RegradeBusy(RuntimeError):
    """Another live process is grading this re-grade now (see the module docstring)."""


def regrade_models(backoff: SharedBackoff, *, api_key: str | None = None) -> ModelResolver:
    """Grader models for a re-grade: the shared backoff, one model per string, no streaming."""
    return model_resolver(api_key=api_key, backoff=backoff, share=True, streaming=False)


def run_regrade(
    store: Store,
    job_id: str,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    models: ModelResolver | None = None,
    backoff: SharedBackoff | None = None,
    retry_errors: bool = False,
    stop: threading.Event | None = None,
) -> Generator[RegradeEvent, None, None]:
    """Grade (or continue grading) a re-grade's answers, yielding progress as gradings end.

    Closing the iterator early is Stop (see the module docstring); calling this again
    continues.

    Args:
        store: The database.
        job_id: The re-grade (`rubric_core.lab.create_regrade`).
        concurrency: Gradings (requests) at once, 1 to `rubric_core.types.MAX_CONCURRENCY`.
        models: Builds the grader models (`regrade_models(backoff)` when omitted).
        backoff: The shared backoff (a new `SharedBackoff` when omitted).
        retry_errors: First forget the gradings that ended ``grader_error``, to grade them
            again.
        stop: Set it (from any thread) to stop, like closing the iterator.

    Yields:
        ``regrade_progress`` for every configuration at the start and after each grading,
        ``item_graded``, ``regrade_backoff``, and one ``regrade_finished`` at the end.

    Raises:
        KeyError: No such re-grade.
        ValueError: A bad concurrency, or a grader tool that does not exist.
        ModelConfigError: A grader model cannot be built.
        RegradeBusy: Another live process is grading it now.

    """
    job = store.get_regrade_job(job_id)
    if job is None:
        msg = f"no re-grade {job_id!r} in {store.location}"
        raise KeyError(msg)
    check_limits(concurrency)
    backoff = backoff or SharedBackoff()
    models = models or regrade_models(backoff)
    owner = new_owner()
    holder = store.hold_regrade(job_id, owner, hold_s=STALE_AFTER_S)
    if holder is not None:
        msg = (f"re-grade {job_id[:8]} is being graded by another process "
               f"({describe_owner(holder)}); wait for it to end, stop it, or try again "
               f"in {STALE_AFTER_S:.0f} s if it died")
        raise RegradeBusy(msg)
    try:
        if retry_errors:
            store.delete_regrade_errors(job_id)
        configs = [_prepare(config, models) for config in job.configurations]
        stop = stop or threading.Event()
        events: queue.Queue[RegradeEvent | None] = queue.Queue()
        driver = _Driver(store, job, configs, stop, events, concurrency, owner)
        yield from drive(driver, events, stop, backoff, "regrade_backoff")
    finally:
        with contextlib.suppress(Exception):  # a lost database: the hold runs out by itself
            store.release_regrade(job_id, owner)


@dataclasses.dataclass
class _Prepared:
    """A configuration ready to grade with: its criteria, bound grader, tools and prompt."""

    config: GraderConfig
    criteria: list[str]
    bound: Any
    tools: list[BaseTool]
    examples: list[Example] = dataclasses.field(default_factory=list)
    shared_prompt: str | None = None

    def system_prompt(self, item_id: str) -> str | None:
        """The grader prompt for one answer: never with that answer's own labels."""
        if not self.config.few_shot:
            return self.config.grader_system_prompt or None
        if all(e.key[0] != item_id for e in self.examples):
            return self.shared_prompt
        others = [e for e in self.examples if e.key[0] != item_id]
        return aligned_prompt(others, self.config.grader_system_prompt or None)


def _prepare(config: GraderConfig, models: ModelResolver) -> _Prepared:
    tools = build_grader_tools(config.grader_tools)
    model = models(config.grader_model, "grader", config.base_url)
    return _Prepared(config, config.criteria, bind_grader(model, tools), tools)


def few_shot_examples(config: GraderConfig, labels: list[ItemLabel],
                      answers: dict[str, str]) -> list[Example]:
    """Up to ``MAX_EXAMPLES + 1`` labelled examples for a configuration's few-shot prompt.

    Only verdicts every labeller of an answer agrees on; each criterion in turn (failing
    verdicts first, since they teach the most), so leaving one answer out still leaves
    `rubric_core.align.MAX_EXAMPLES`.
    """
    by_key: dict[tuple[str, str], set[bool]] = {}
    for lb in labels:
        by_key.setdefault((lb.item_id, lb.criterion), set()).add(lb.passed)
    per_criterion: list[list[Example]] = []
    for criterion in config.criteria:
        wanted = config.labelled_as(criterion)
        found = [Example((item_id, 0), criterion, answers[item_id], verdicts.pop(), "")
                 for (item_id, labelled), verdicts in by_key.items()
                 if len(verdicts) == 1 and item_id in answers
                 and normalize_name(labelled) == wanted]
        found.sort(key=lambda e: e.passed)  # stable: failing verdicts first
        per_criterion.append(found)
    chosen: list[Example] = []
    while len(chosen) < MAX_EXAMPLES + 1 and any(per_criterion):
        for found in per_criterion:
            if found and len(chosen) < MAX_EXAMPLES + 1:
                chosen.append(found.pop(0))
    return chosen


class _Driver:
    """One session of a re-grade, as a coroutine on `rubric_core.background.work_loop`."""

    def __init__(self, store: Store, job: RegradeJob, configs: list[_Prepared],
                 stop: threading.Event, events: queue.Queue[RegradeEvent | None],
                 concurrency: int, owner: str) -> None:
        self.store, self.job, self.configs, self.stop = store, job, configs, stop
        self.events, self.concurrency = events, concurrency
        self.owner = owner
        """This process's name on the re-grade's hold (`Store.hold_regrade`)."""
        self.lost = False
        """Whether the hold was found lost (another process took the re-grade over)."""
        self.failure: BaseException | None = None
        """What ended the session with an exception, raised again on the consumer's thread."""
        self.started = time.monotonic()
        self.done = [0] * len(configs)
        self.errors = [0] * len(configs)
        self.totals = [0] * len(configs)
        self.remaining = 0
        self.finished_here = 0

    async def run(self) -> None:
        """The whole session; it never raises (a failure is kept for the consumer's thread)."""
        status = "stopped"
        try:
            status = await self._main()
        except BaseException as exc:  # handed to the consumer's thread
            self.failure = exc
        finally:
            if not self.lost:  # else its new holder says where it stands
                with contextlib.suppress(Exception):
                    await self.store.acall(self.store.set_regrade_status, self.job.job_id,
                                           status)
            finished: RegradeFinished = {
                "type": "regrade_finished", "job_id": self.job.job_id,
                "status": "finished" if status == "finished" else "stopped",
                "duration_s": round(time.monotonic() - self.started, 3)}
            self.events.put(finished)
            self.events.put(None)

    async def _load(self) -> None:
        store, job = self.store, self.job
        await store.acall(store.set_regrade_status, job.job_id, "running")
        info = await store.acall(store.answer_set_info, job.set_name, job.set_version)
        counts = await store.acall(store.regrade_counts, job.job_id)
        for index, prepared in enumerate(self.configs):
            self.totals[index] = info.item_count * prepared.config.grader_repeats
            self.done[index], self.errors[index] = counts.get(index, (0, 0))
        self.remaining = sum(self.totals) - sum(self.done)
        if any(c.config.few_shot for c in self.configs):
            labels = await store.acall(store.answer_labels, job.set_name, job.set_version)
            ids = list(dict.fromkeys(lb.item_id for lb in labels))
            items = await store.acall(store.answer_items, job.set_name, job.set_version,
                                      ids=ids)
            answers = {it.id: it.answer for it in items}
            for prepared in self.configs:
                if prepared.config.few_shot:
                    prepared.examples = few_shot_examples(prepared.config, labels, answers)
                    prepared.shared_prompt = aligned_prompt(
                        prepared.examples[:MAX_EXAMPLES],
                        prepared.config.grader_system_prompt or None)

    async def _main(self) -> str:
        await self._load()
        for index in range(len(self.configs)):
            self.events.put(self._progress(index))
        if self.remaining <= 0:
            return "finished"
        work: asyncio.Queue[tuple[int, AnswerItem, int] | None] = asyncio.Queue(
            maxsize=2 * self.concurrency)
        slots = [asyncio.create_task(self._slot(work)) for _ in range(self.concurrency)]
        producer = asyncio.create_task(self._produce(work, len(slots)))
        helpers = [asyncio.create_task(self._watch_stop([*slots, producer])),
                   asyncio.create_task(self._keep_hold())]
        try:
            await asyncio.gather(*slots, producer, return_exceptions=True)
        finally:
            for helper in helpers:
                helper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await helper
        for task in [*slots, producer]:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        if self.stop.is_set():
            return "stopped"
        counts = await self.store.acall(self.store.regrade_counts, self.job.job_id)
        recorded = sum(n for n, _ in counts.values())
        return "finished" if recorded >= sum(self.totals) else "stopped"

    async def _keep_hold(self) -> None:
        """Renew this process's hold on the re-grade; a hold found lost stops the grading."""
        store, job_id = self.store, self.job.job_id
        while not self.stop.is_set():
            await asyncio.sleep(HEARTBEAT_S)
            with contextlib.suppress(StoreError):  # a busy database: the next round retries
                if not await store.acall(store.renew_regrade_hold, job_id, self.owner,
                                         hold_s=STALE_AFTER_S):
                    self.lost = True
                    self.stop.set()

    async def _watch_stop(self, tasks: list[asyncio.Task[None]]) -> None:
        """On Stop, cancel the gradings in flight (nothing of them is recorded) and the rest."""
        while not self.stop.is_set():
            await asyncio.sleep(_STOP_POLL_S)
        for task in tasks:
            task.cancel()

    async def _produce(self, work: asyncio.Queue[tuple[int, AnswerItem, int] | None],
                       slots: int) -> None:
        """Queue every grading not recorded yet, a page of answers at a time."""
        store, job = self.store, self.job
        offset = 0
        while True:
            page = await store.acall(store.answer_items, job.set_name, job.set_version,
                                     offset=offset, limit=PAGE_ITEMS)
            if not page:
                break
            graded = await store.acall(store.graded_keys, job.job_id, [i.id for i in page])
            for item in page:
                for index, prepared in enumerate(self.configs):
                    for repeat in range(prepared.config.grader_repeats):
                        if (index, item.id, repeat) not in graded:
                            await work.put((index, item, repeat))
            offset += len(page)
        for _ in range(slots):
            await work.put(None)

    async def _slot(self, work: asyncio.Queue[tuple[int, AnswerItem, int] | None]) -> None:
        """Take the next grading, grade it, record it; until the queue says none is left."""
        while (unit := await work.get()) is not None:
            index, item, repeat = unit
            try:
                result = await self._grade(index, item, repeat)
                written = await self.store.acall(self.store.record_regrade_result,
                                                 self.job.job_id, result)
            except BaseException:
                self.stop.set()  # a lost database: the other slots stop too
                raise
            self.done[index] += 1
            self.remaining -= 1
            if written:
                self.finished_here += 1
                self.errors[index] += result.result == "grader_error"
                self.events.put({"type": "item_graded", "job_id": self.job.job_id,
                                 "config_index": index, "item_id": item.id,
                                 "repeat_index": repeat, "result": result.result,
                                 "error": result.error})
            self.events.put(self._progress(index))

    async def _grade(self, index: int, item: AnswerItem, repeat: int) -> RegradeResult:
        """One grader pass over one answer (see the module docstring); errors are results."""
        prepared = self.configs[index]
        started = time.perf_counter()
        try:
            messages = build_grader_messages(
                [HumanMessage(item.request), AIMessage(item.answer)], prepared.criteria,
                system_prompt=prepared.system_prompt(item.id))
            outcome = await drive_async(
                grade_steps(messages, prepared.criteria, prepared.tools), prepared.bound)
        except Exception as exc:
            if is_unavailable(exc):
                raise
            error = error_text(exc)
            return RegradeResult(index, item.id, repeat, "grader_error", error, [], [], error,
                                 None, None, round(time.perf_counter() - started, 6))
        result = outcome.response.result
        if outcome.missing and result != "failed":
            result = "needs_revision"  # unverified, as the middleware records it
        return RegradeResult(index, item.id, repeat, result, outcome.response.explanation,
                             list(outcome.criteria), list(outcome.missing), None,
                             outcome.input_tokens, outcome.output_tokens,
                             round(time.perf_counter() - started, 6),
                             outcome.cached_input_tokens)

    def _progress(self, index: int) -> RegradeProgress:
        elapsed = time.monotonic() - self.started
        eta = (round(self.remaining * elapsed / self.finished_here, 1)
               if self.finished_here else None)
        return {"type": "regrade_progress", "job_id": self.job.job_id, "config_index": index,
                "label": self.configs[index].config.display_label(), "done": self.done[index],
                "total": self.totals[index], "errors": self.errors[index],
                "eta_s": max(0.0, eta) if eta is not None else None}
