"""One re-grade grading: one grader pass over one answer under one configuration.

`ItemBody` is what the queue engine runs for a re-grade's item (`rubric_core.engine.body`,
registered at import), on whichever process dequeues it: the answer's repeats under one
configuration not recorded yet, one after another, each recorded at once
(`rubric_core.store.Store.record_regrade_result`: once per key, so a recovered item skips what
is recorded). Its batch (`RegradeBatch`) is the driver's (its models, its listener), or one
built from the stored re-grade (a worker's). One grading is the grader messages
(`rubric_core.grader.build_grader_messages`: the request and the answer, the answer
delimited and escaped as untrusted text) and `grade_steps` driven by `drive_async` on the
grader model (`rubric_core.models.model_resolver`, shared per model string), with the
configuration's evidence tools and custom prompt, and Align's few-shot examples from the set's
labels when asked (`rubric_core.align.aligned_prompt`; never an answer's own). Each repeat
of ``grader_repeats`` is its own grading; `rubric_core.lab.results` combines them as the
middleware does (`rubric_core.consensus.combine`).

A grading that fails is a result (``grader_error`` with its error), except a lost database,
which is raised: what cannot be recorded must not be reported graded.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage, HumanMessage

from rubric_core.align import MAX_EXAMPLES, Example, aligned_prompt
from rubric_core.engine.body import ITEM, Batch, register
from rubric_core.grader import (
    GraderBinding,
    GraderFailure,
    bind_grader,
    build_grader_messages,
    drive_async,
    grade_steps,
    grader_failure,
)
from rubric_core.http_retry import SharedBackoff
from rubric_core.models import limit_output, model_resolver
from rubric_core.redact import error_text
from rubric_core.rubric import normalize_name
from rubric_core.session import build_grader_tools
from rubric_core.store import RegradeResult, is_unavailable
from rubric_core.types import DEFAULT_GRADER_MAX_TOKENS

if TYPE_CHECKING:
    from collections.abc import Callable

    from langchain_core.tools import BaseTool

    from rubric_core.engine.body import Unit
    from rubric_core.grader import VerdictMode
    from rubric_core.lab.config import GraderConfig
    from rubric_core.store import AnswerItem, ItemLabel, RegradeJob, Store
    from rubric_core.types import ModelResolver


def regrade_models(backoff: SharedBackoff, *, api_key: str | None = None) -> ModelResolver:
    """Grader models for a re-grade: the shared backoff, one model per string, no streaming."""
    return model_resolver(api_key=api_key, backoff=backoff, share=True, streaming=False)


@dataclasses.dataclass
class PreparedConfig:
    """A configuration ready to grade with: its criteria, bound grader, tools and prompt."""

    config: GraderConfig
    """The configuration as stored."""
    criteria: list[str]
    """Its criteria."""
    bound: GraderBinding
    """Its grader model, bound to its tools and its rubric's verdict tool."""
    tools: list[BaseTool]
    """Its evidence tools."""
    examples: list[Example] = dataclasses.field(default_factory=list)
    """Few-shot examples (`few_shot_examples`), when the configuration asks for them."""
    shared_prompt: str | None = None
    """The few-shot prompt for an answer that is none of the examples."""
    verdict_mode: VerdictMode | None = None
    """How the last grading's verdict call was forced: where the next one starts."""

    def system_prompt(self, item_id: str) -> str | None:
        """The grader prompt for one answer: never with that answer's own labels."""
        if not self.config.few_shot:
            return self.config.grader_system_prompt or None
        if all(e.key[0] != item_id for e in self.examples):
            return self.shared_prompt
        others = [e for e in self.examples if e.key[0] != item_id]
        return aligned_prompt(others, self.config.grader_system_prompt or None)


def prepare(config: GraderConfig, models: ModelResolver) -> PreparedConfig:
    """A configuration's grader and tools (raises as `check_config` does for a bad one)."""
    tools = build_grader_tools(config.grader_tools)
    model = limit_output(models(config.grader_model, "grader", config.base_url),
                         config.max_tokens, default=DEFAULT_GRADER_MAX_TOKENS)
    return PreparedConfig(config, config.criteria, bind_grader(model, tools, config.criteria),
                          tools)


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


async def load_examples(store: Store, job: RegradeJob,
                        configs: list[PreparedConfig]) -> None:
    """Give the few-shot configurations of a re-grade their examples from the set's labels."""
    if not any(c.config.few_shot for c in configs):
        return
    labels = await store.acall(store.answer_labels, job.set_name, job.set_version)
    ids = list(dict.fromkeys(lb.item_id for lb in labels))
    items = await store.acall(store.answer_items, job.set_name, job.set_version, ids=ids)
    answers = {it.id: it.answer for it in items}
    for prepared in configs:
        if prepared.config.few_shot:
            prepared.examples = few_shot_examples(prepared.config, labels, answers)
            prepared.shared_prompt = aligned_prompt(
                prepared.examples[:MAX_EXAMPLES], prepared.config.grader_system_prompt or None)


async def grade(prepared: PreparedConfig, index: int, item: AnswerItem,
                repeat: int) -> RegradeResult:
    """One grader pass over one answer (see the module docstring); errors are results."""
    started = time.perf_counter()
    try:
        messages = build_grader_messages(
            [HumanMessage(item.request), AIMessage(item.answer)], prepared.criteria,
            system_prompt=prepared.system_prompt(item.id))
        modes = prepared.bound.ladder(prepared.verdict_mode)
        outcome = await drive_async(
            grade_steps(messages, prepared.criteria, prepared.tools, modes=modes),
            prepared.bound)
    except Exception as exc:
        if is_unavailable(exc):
            raise
        error = error_text(exc)
        # The calls made before the failure were spent too: their usage is counted.
        failure = grader_failure(exc) or GraderFailure(message=error)
        return RegradeResult(index, item.id, repeat, "grader_error", error, [], [], error,
                             failure.input_tokens, failure.output_tokens,
                             round(time.perf_counter() - started, 6),
                             failure.cached_input_tokens)
    prepared.verdict_mode = outcome.mode
    result = outcome.response.result
    if outcome.missing and result != "failed":
        result = "needs_revision"  # unverified, as the middleware records it
    return RegradeResult(index, item.id, repeat, result, outcome.response.explanation,
                         list(outcome.criteria), list(outcome.missing), None,
                         outcome.input_tokens, outcome.output_tokens,
                         round(time.perf_counter() - started, 6),
                         outcome.cached_input_tokens)


@dataclasses.dataclass(eq=False)
class RegradeBatch(Batch):
    """What this process needs to grade a re-grade's items."""

    job: RegradeJob
    """The re-grade."""
    configs: list[PreparedConfig]
    """Its configurations, ready to grade with."""
    on_graded: Callable[[RegradeResult, bool], None] | None = None
    """Called (on the loop) with each grading done here and whether it was recorded (False: that
    key was recorded already)."""
    on_failure: Callable[[BaseException], None] | None = None
    """Called (on the loop) when an item here failed for want of the database."""

    def failed(self, exc: BaseException) -> None:
        """An item here lost the database: say so to the driver."""
        if self.on_failure is not None:
            self.on_failure(exc)


class ItemBody:
    """The engine's body for re-grade items (`rubric_core.engine.body.Body`)."""

    halted: dict[str, Any] = {"graded": 0, "stopped": True}  # noqa: RUF012 - read only
    """A Stop cancels an item's grading in flight: nothing of it is recorded."""

    async def load(self, store: Store, batch_id: str) -> RegradeBatch:
        """A batch built from the stored re-grade, with grader models of this process's keys."""
        job = await store.acall(store.get_regrade_job, batch_id)
        if job is None:
            msg = f"no re-grade {batch_id!r}: deleted while queued?"
            raise KeyError(msg)
        models = regrade_models(SharedBackoff())
        configs = [prepare(config, models) for config in job.configurations]
        await load_examples(store, job, configs)
        return RegradeBatch(batch_id, job=job, configs=configs)

    async def run(self, unit: Unit) -> dict[str, Any]:
        """Grade the item's repeats not recorded yet, recording each."""
        if unit.stopping():
            return dict(self.halted)
        batch, store = unit.batch, unit.store
        assert isinstance(batch, RegradeBatch)
        config_index, item_id = int(unit.args[0]), unit.args[1]
        job, prepared = batch.job, batch.configs[config_index]
        [item] = await store.acall(store.answer_items, job.set_name, job.set_version,
                                   ids=[item_id])
        recorded = await store.acall(store.graded_keys, job.job_id, [item_id])
        graded = 0
        for repeat in range(prepared.config.grader_repeats):
            if (config_index, item_id, repeat) in recorded:
                continue
            result = await grade(prepared, config_index, item, repeat)
            written = await store.acall(store.record_regrade_result, job.job_id, result)
            graded += 1
            if batch.on_graded is not None:
                batch.on_graded(result, written)
        return {"graded": graded, "stopped": unit.stop.is_set()}

    def lost(self, batch_id: str, exc: BaseException) -> dict[str, Any] | None:  # noqa: ARG002
        """None: an item whose re-grade cannot be read fails (its driver says why)."""
        return None

    async def beat(self, store: Store, batch_id: str) -> None:
        """Touch the re-grade: another machine's recovery reads it as alive."""
        await store.acall(store.touch_regrade, batch_id)


register(ITEM, ItemBody())

__all__ = ["ItemBody", "PreparedConfig", "RegradeBatch", "few_shot_examples", "grade",
           "load_examples", "prepare", "regrade_models"]
