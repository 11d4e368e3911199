"""Offline graders as chat models: deterministic rules alone, or rules plus an LLM.

`RulesGrader` is a chat model that never calls an LLM. It reads the grader request built by
`rubric_core.grader.build_grader_messages`, checks every criterion it recognises with the
evidence tools' pure functions, and answers with one ``GraderResponse`` tool call. A criterion
it does not recognise is never guessed: the verdict is ``failed`` and names it. The recognised
phrasings are listed in `rubric_core.offline.rules`.

`HybridGrader` sends the criteria the rules cannot check to an LLM, with the rule results as
evidence it may not contradict (`RULE_EVIDENCE_PROMPT`); its docstring says exactly what it sends
and how the two verdicts are merged.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool
from pydantic import ConfigDict, Field

from rubric_core.grader import message_text, parse_grader_payload
from rubric_core.offline.rules import check_criterion
from rubric_core.rubric import normalize_name
from rubric_core.types import CriterionVerdict, GraderResponse

if TYPE_CHECKING:
    from langchain_core.callbacks import (
        AsyncCallbackManagerForLLMRun,
        CallbackManagerForLLMRun,
    )
    from langchain_core.runnables import Runnable

    from rubric_core.grader import GraderPayload

LLM_GRADER_SUGGESTION = "hybrid:openai:gpt-4.1-mini"
"""The grader the rules grader suggests for criteria it cannot check."""

UNRECOGNISED_GAP = (
    "The rules grader cannot check this criterion; an LLM grader is needed "
    f"(for example {LLM_GRADER_SUGGESTION!r})."
)
"""The gap recorded for a criterion the rules do not recognise."""

RULE_EVIDENCE_PROMPT = """\
<rule_evidence>
Deterministic checks (text statistics, exact matching, executed tests) already graded the \
criteria below. Their results are final: report each of them unchanged in GraderResponse and \
judge only the remaining criteria yourself.
{lines}
</rule_evidence>"""
"""The message `HybridGrader` adds after the grader request; {lines} lists the rule results."""

# --------------------------------------------------------------------------- helpers


def _rules_verdict(
    payload: GraderPayload, tools: Mapping[str, BaseTool]
) -> tuple[list[CriterionVerdict | None], dict[str, Any]]:
    """Per-criterion rule verdicts (None = unrecognised) and the GraderResponse args."""
    verdicts = [check_criterion(c, payload.answer, tools) for c in payload.criteria]
    unknown = [c for c, v in zip(payload.criteria, verdicts, strict=True) if v is None]
    failing = [v["name"] for v in verdicts if v is not None and not v["passed"]]
    criteria = [v or {"name": c, "passed": False, "gap": UNRECOGNISED_GAP}
                for c, v in zip(payload.criteria, verdicts, strict=True)]
    if unknown:
        listed = "; ".join(repr(c) for c in unknown)
        result = "failed"
        explanation = (
            f"The rules grader cannot check {len(unknown)} of {len(criteria)} criteria: {listed}. "
            f"An LLM grader is needed for these; choose e.g. {LLM_GRADER_SUGGESTION!r}."
        )
    elif failing:
        result = "needs_revision"
        explanation = (f"{len(criteria) - len(failing)} of {len(criteria)} criteria pass; "
                       f"failing: {'; '.join(failing)}.")
    else:
        result = "satisfied"
        explanation = f"All {len(criteria)} criteria pass the rule checks."
    return verdicts, {"result": result, "explanation": explanation, "criteria": criteria}


def _find_payload(messages: Sequence[BaseMessage]) -> tuple[int, GraderPayload | None]:
    for i, msg in enumerate(messages):
        if isinstance(msg, HumanMessage) and (payload := parse_grader_payload(message_text(msg))):
            return i, payload
    return -1, None


def _verdict_message(args: dict[str, Any]) -> AIMessage:
    call = {"name": GraderResponse.__name__, "args": args, "id": f"call_{uuid.uuid4().hex[:12]}",
            "type": "tool_call"}
    return AIMessage(content="", tool_calls=[call])


def _tool_list(tools: Sequence[Any]) -> list[BaseTool]:
    return [t for t in tools if isinstance(t, BaseTool) and t.name != GraderResponse.__name__]


def _merge(
    reply: BaseMessage, verdicts: list[CriterionVerdict | None], criteria: list[str]
) -> BaseMessage:
    """The LLM's reply with its GraderResponse call overridden by the rule verdicts."""
    if not isinstance(reply, AIMessage) or not criteria:
        return reply
    calls = [c for c in reply.tool_calls if c["name"] == GraderResponse.__name__]
    if not calls:
        return reply
    args = calls[0]["args"]
    graded = args.get("criteria") if isinstance(args, dict) else None
    if not isinstance(graded, list) or not all(isinstance(g, dict) for g in graded):
        return reply
    keys = [normalize_name(c) for c in criteria]
    llm_items: dict[int, dict[str, Any]] = {}
    for pos, item in enumerate(graded):
        key = normalize_name(str(item.get("name", "")))
        index = keys.index(key) if key in keys else (pos if len(graded) == len(criteria) else None)
        if index is not None:
            llm_items.setdefault(index, item)
    merged: list[dict[str, Any]] = []
    overridden: list[str] = []
    for i, name in enumerate(criteria):
        rule, llm_item = verdicts[i], llm_items.get(i)
        if rule is not None:
            if llm_item is not None and bool(llm_item.get("passed")) != rule["passed"]:
                overridden.append(name)
            merged.append(dict(rule))
        elif llm_item is not None:
            merged.append({**llm_item, "name": name})
    # Criteria the LLM left out are not invented here: the grading loop's coverage check asks
    # for them again, and records the pass as unverified if they stay missing.
    if args.get("result") == "failed":
        result = "failed"
    else:
        result = "satisfied" if all(m.get("passed") for m in merged) else "needs_revision"
    explanation = str(args.get("explanation", "")).strip()
    if overridden:
        listed = "; ".join(repr(n) for n in overridden)
        explanation = f"{explanation} (Rule checks replaced the LLM's verdict on: {listed}.)"
    new_args = {**args, "result": result, "explanation": explanation, "criteria": merged}
    tool_calls = [{**c, "args": new_args} if c is calls[0] else c for c in reply.tool_calls]
    return reply.model_copy(update={"tool_calls": tool_calls})


# --------------------------------------------------------------------------- chat models


class RulesGrader(BaseChatModel):
    """A grader that checks countable criteria with deterministic rules; no LLM, no network.

    Use it as ``RubricMiddleware(model=RulesGrader(), tools=[...])``. It answers every grader
    request with one ``GraderResponse`` tool call: each criterion it recognises (see
    `rubric_core.offline.rules`) is checked, a failing one with a concrete gap; when any
    criterion is not recognised the result is ``failed`` and the explanation names those
    criteria.

    A bound tool that raises, or returns something other than a dict with ``ok``, makes the
    call raise (the middleware records a ``grader_error``) rather than yield a made-up verdict.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    tools: list[BaseTool] = Field(default_factory=list, exclude=True)
    """Evidence tools bound with `bind_tools` (the GraderResponse schema itself is dropped)."""

    @property
    def _llm_type(self) -> str:
        return "rules-grader"

    def bind_tools(
        self, tools: Sequence[Any], **kwargs: Any
    ) -> RulesGrader:
        """A copy that remembers the evidence tools (by name); other arguments are ignored."""
        return self.model_copy(update={"tools": _tool_list(tools)})

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        _, payload = _find_payload(messages)
        if payload is None:
            args = {"result": "failed", "criteria": [], "explanation": (
                "The rules grader found no grader request (criteria and answer) to check.")}
        else:
            _, args = _rules_verdict(payload, {t.name: t for t in self.tools})
        return ChatResult(generations=[ChatGeneration(message=_verdict_message(args))])


class HybridGrader(BaseChatModel):
    """Rules for the criteria they recognise, an LLM for the rest, one verdict.

    For each grader call it:

    1. reads the grader request (`parse_grader_payload` on the first human message) and runs
       the rules on every criterion they recognise (tool criteria call the bound tools);
    2. if every criterion is recognised, answers from the rules alone without calling the LLM;
    3. otherwise calls ``llm.bind_tools([*tools, GraderResponse])`` with the messages it was
       given plus one `HumanMessage` inserted right after the grader request (so tool calls
       and their results stay adjacent on later rounds), `RULE_EVIDENCE_PROMPT` with one line
       per recognised criterion: ``- [PASS] 2. <criterion>`` or
       ``- [FAIL] 2. <criterion> — <gap>``;
    4. returns an LLM reply without a ``GraderResponse`` call (evidence-tool calls, or text)
       unchanged, so the grading loop runs the tools and calls back;
    5. otherwise merges the ``GraderResponse`` call: criteria in rubric order, each recognised
       criterion replaced by its rule result, the others taken from the LLM (matched by name,
       else by position when the counts agree; ones the LLM left out stay out, so the
       grading loop's coverage check asks again); ``result`` stays ``failed`` if the LLM said
       so, else it is ``satisfied`` exactly when every criterion given passes. A reply whose
       arguments are not a verdict shape is returned unchanged, for the loop's correction.

    Args:
        llm: The chat model that judges the criteria the rules cannot check.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    llm: BaseChatModel
    """The LLM grader for unrecognised criteria."""
    tools: list[BaseTool] = Field(default_factory=list, exclude=True)
    """Evidence tools bound with `bind_tools`; also bound on the LLM."""

    @property
    def _llm_type(self) -> str:
        return "hybrid-grader"

    def bind_tools(
        self, tools: Sequence[Any], **kwargs: Any
    ) -> HybridGrader:
        """A copy that remembers the evidence tools; the LLM is bound at call time."""
        return self.model_copy(update={"tools": _tool_list(tools)})

    def _prepare(
        self, messages: list[BaseMessage]
    ) -> tuple[AIMessage | None, list[BaseMessage], list[CriterionVerdict | None], list[str]]:
        """Either the rules' own answer, or the messages for the LLM and the rule verdicts."""
        index, payload = _find_payload(messages)
        if payload is None:
            return None, list(messages), [], []
        verdicts, args = _rules_verdict(payload, {t.name: t for t in self.tools})
        if all(v is not None for v in verdicts):
            return _verdict_message(args), [], verdicts, payload.criteria
        lines = []
        for i, v in enumerate(verdicts, 1):
            if v is not None:
                status = "PASS" if v["passed"] else "FAIL"
                gap = f" — {v['gap']}" if not v["passed"] else ""
                lines.append(f"- [{status}] {i}. {v['name']}{gap}")
        text = "\n".join(lines).replace("</rule_evidence", "<\\/rule_evidence")
        evidence = HumanMessage(RULE_EVIDENCE_PROMPT.format(lines=text))
        convo = [*messages[: index + 1], evidence, *messages[index + 1 :]]
        return None, convo, verdicts, payload.criteria

    def _bound_llm(self) -> Runnable[Any, BaseMessage]:
        return self.llm.bind_tools([*self.tools, GraderResponse])

    def _result(self, message: BaseMessage) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        own, convo, verdicts, criteria = self._prepare(messages)
        if own is not None:
            return self._result(own)
        # No explicit config: the ambient one (the grading step's callbacks and tags) applies.
        reply = self._bound_llm().invoke(convo)
        return self._result(_merge(reply, verdicts, criteria))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        own, convo, verdicts, criteria = self._prepare(messages)
        if own is not None:
            return self._result(own)
        reply = await self._bound_llm().ainvoke(convo)
        return self._result(_merge(reply, verdicts, criteria))
