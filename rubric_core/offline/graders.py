"""Offline graders as chat models: deterministic rules alone, or rules plus an LLM.

`RulesGrader` is a chat model that never calls an LLM. It reads the grader request built by
`rubric_core.grader.build_grader_messages`, checks every criterion it recognises with the
evidence tools' pure functions, and answers with one ``GraderResponse`` tool call. A criterion
it does not recognise is never guessed: the verdict is ``failed`` and names it. The recognised
phrasings are listed in `rubric_core.offline.rules`.

`HybridGrader` sends the criteria the rules cannot check to an LLM, with the rule results as
evidence it may not contradict (`RULE_EVIDENCE_PROMPT`); its docstring says exactly what it sends
and how the two verdicts are merged. The rule results are final whichever way the LLM answers:
it reads the LLM's verdict with `rubric_core.grader.verdict_args`, the grading pass's own
reading, so a verdict given as JSON text is merged just like a tool call.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import TYPE_CHECKING, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool
from pydantic import ConfigDict, Field, ValidationError
from typing_extensions import override

from rubric_core.grader import (
    VERDICT_TOOL,
    assign_answers,
    message_text,
    model_label,
    parse_grader_payload,
    verdict_args,
)
from rubric_core.offline.rules import check_criterion
from rubric_core.types import CriterionVerdict, GradedCriterion, GraderResponse

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

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

_EVIDENCE_TAG = re.compile(r"<(\\*/?rule_evidence)", re.IGNORECASE)

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


def _verdict_call(args: dict[str, Any]) -> dict[str, Any]:
    return {"name": VERDICT_TOOL, "args": args, "id": f"call_{uuid.uuid4().hex[:12]}",
            "type": "tool_call"}


def _verdict_message(args: dict[str, Any]) -> AIMessage:
    return AIMessage(content="", tool_calls=[_verdict_call(args)])


def _tool_list(tools: Sequence[Any]) -> list[BaseTool]:
    return [t for t in tools if isinstance(t, BaseTool) and t.name != VERDICT_TOOL]


def _passed(item: dict[str, Any]) -> bool:
    """An LLM item's verdict as the schema reads it; an item it rejects counts as failing."""
    try:
        return GradedCriterion.model_validate(item).passed
    except ValidationError:
        return False


OVERRIDE_NOTE = "Rule checks replaced the LLM's verdict on: "
"""How a hybrid verdict's explanation starts its list of criteria where the rules overrode the
LLM (names as Python string literals, joined by ``"; "``); read back by `overridden_criteria`."""


def overridden_criteria(explanation: str) -> list[str]:
    """The criteria a hybrid verdict's explanation says the rules overrode (`OVERRIDE_NOTE`).

    On each of them the LLM gave the opposite verdict to the one recorded.
    """
    import ast

    at = explanation.rfind("(" + OVERRIDE_NOTE)
    if at < 0 or not explanation.endswith(".)"):
        return []
    names = []
    for part in explanation[at + 1 + len(OVERRIDE_NOTE): -2].split("; "):
        try:
            name = ast.literal_eval(part)
        except (ValueError, SyntaxError):
            return []
        if isinstance(name, str):
            names.append(name)
    return names


def _merge(
    reply: BaseMessage, verdicts: list[CriterionVerdict | None], criteria: list[str]
) -> BaseMessage:
    """The LLM's verdict (tool call or JSON text) with every rule criterion set by the rules."""
    if not isinstance(reply, AIMessage) or not criteria:
        return reply
    args = verdict_args(reply)
    graded = args.get("criteria") if isinstance(args, dict) else None
    if not isinstance(args, dict) or not isinstance(graded, list) or not all(
        isinstance(g, dict) for g in graded
    ):
        return reply  # no verdict, or not a verdict's shape: the grading pass rejects it as is
    answers, unknown = assign_answers(criteria, [str(g.get("name", "")) for g in graded])
    merged: list[dict[str, Any]] = []
    overridden: list[str] = []
    passed_on: set[int] = set()
    for i, name in enumerate(criteria):
        rule, positions = verdicts[i], answers.get(i, [])
        if rule is not None:
            if any(_passed(graded[pos]) != rule["passed"] for pos in positions):
                overridden.append(name)
            merged.append(dict(rule))
            continue
        # Passed on as given (repeats too): the grading pass matches and checks them.
        merged.extend(graded[pos] for pos in positions if pos not in passed_on)
        passed_on.update(positions)
    # Names matching no criterion go on as well, so the pass records them (and ignores them).
    # Criteria the LLM left out are not invented here: the grading loop's coverage check asks
    # for them again, and records the pass as unverified if they stay missing.
    merged.extend(graded[pos] for pos in unknown)
    if args.get("result") == "failed":
        result = "failed"
    else:
        result = "satisfied" if all(_passed(m) for m in merged) else "needs_revision"
    explanation = str(args.get("explanation", "")).strip()
    if overridden:
        listed = "; ".join(repr(n) for n in overridden)
        explanation = f"{explanation} ({OVERRIDE_NOTE}{listed}.)"
    new_args = {**args, "result": result, "explanation": explanation, "criteria": merged}
    calls = [c for c in reply.tool_calls if c["name"] == VERDICT_TOOL]
    if calls:
        tool_calls = [{**c, "args": new_args} if c is calls[0] else c for c in reply.tool_calls]
    else:  # a verdict written as text becomes the tool call it should have been
        tool_calls = [*reply.tool_calls, _verdict_call(new_args)]
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
    pause_s: float = Field(default=0.0, ge=0.0, le=10.0)
    """Seconds each verdict waits before it is given: the app's paced demo, so a newcomer
    can follow each pass (0, the default, everywhere else)."""

    @property
    def _llm_type(self) -> str:
        return "rules-grader"

    @property
    def grader_label(self) -> str:
        """The name messages use for this grader (`rubric_core.grader.model_label`)."""
        return "rules"

    @override
    def bind_tools(
        self, tools: Sequence[Any], **kwargs: Any
    ) -> RulesGrader:
        """A copy that remembers the evidence tools (by name); other arguments are ignored."""
        return self.model_copy(update={"tools": _tool_list(tools)})

    @override
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.pause_s:
            time.sleep(self.pause_s)
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
    4. reads the LLM's verdict the way the grading pass does (`verdict_args`: the
       ``GraderResponse`` call, else a JSON verdict in the text when no evidence tool is
       called) and returns a reply without one (evidence-tool calls, or other text)
       unchanged, so the grading loop runs the tools or corrects it and calls back;
    5. otherwise merges that verdict into one ``GraderResponse`` call (a text verdict becomes
       a tool call, its text kept): criteria in rubric order, each recognised criterion
       replaced by its rule result, the others as the LLM gave them, matched by name only
       (`rubric_core.grader.criterion_key`, never by position); ones the LLM left out stay
       out, so the grading loop's coverage check asks again, and names that match no
       criterion are passed on for the loop to record and ignore. ``result`` stays
       ``failed`` if the LLM said so, else it is ``satisfied`` exactly when every criterion
       given passes. A verdict whose arguments are not a verdict's shape is returned
       unchanged, for the loop's correction.

    Every call, retries and corrections included, goes through these steps, so the rule
    results are final on every path; an LLM error propagates unchanged (the pass retries it
    or ends as ``grader_error``; no verdict is invented).

    Args:
        llm: The chat model that judges the criteria the rules cannot check.

    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    llm: BaseChatModel
    """The LLM grader for unrecognised criteria."""
    tools: list[BaseTool] = Field(default_factory=list, exclude=True)
    """Evidence tools bound with `bind_tools`; also bound on the LLM."""
    llm_binding: Any = Field(default=None, exclude=True)
    """How the LLM is bound for a call (`with_llm_binding`); None: the tools and the generic
    ``GraderResponse``, nothing forced."""

    @property
    def _llm_type(self) -> str:
        return "hybrid-grader"

    @property
    def grader_label(self) -> str:
        """``hybrid:<LLM name>``, the name messages use for this grader."""
        return f"hybrid:{model_label(self.llm) or type(self.llm).__name__}"

    @override
    def bind_tools(
        self, tools: Sequence[Any], **kwargs: Any
    ) -> HybridGrader:
        """A copy that remembers the evidence tools; the LLM is bound at call time."""
        return self.model_copy(update={"tools": _tool_list(tools), "llm_binding": None})

    def with_llm_binding(
        self, tools: Sequence[Any],
        bind: Callable[[BaseChatModel, Sequence[str]], Runnable[Any, BaseMessage]],
    ) -> HybridGrader:
        """A copy whose LLM is bound by ``bind(llm, criteria)`` for each call.

        The grading pass binds it to a verdict tool of the criteria the rules cannot check,
        forced as the pass asks (`rubric_core.grader.verdict`).
        """
        return self.model_copy(update={"tools": _tool_list(tools), "llm_binding": bind})

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
                # One line each: a gap may quote the graded code's own error message.
                lines.append(" ".join(f"- [{status}] {i}. {v['name']}{gap}".split()))
        # ...which must neither close this block nor open another (in any letter case).
        text = _EVIDENCE_TAG.sub(r"<\\\1", "\n".join(lines))
        evidence = HumanMessage(RULE_EVIDENCE_PROMPT.format(lines=text))
        convo = [*messages[: index + 1], evidence, *messages[index + 1 :]]
        return None, convo, verdicts, payload.criteria

    def _bound_llm(self, criteria: Sequence[str], verdicts: Sequence[CriterionVerdict | None]
                   ) -> Runnable[Any, BaseMessage]:
        if self.llm_binding is not None:
            # The verdict tool asks only for what the rules cannot check: theirs are final.
            left = [c for c, v in zip(criteria, verdicts, strict=True) if v is None]
            bound: Runnable[Any, BaseMessage] = self.llm_binding(self.llm, left)
            return bound
        return self.llm.bind_tools([*self.tools, GraderResponse])

    def _result(self, message: BaseMessage) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=message)])

    @override
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
        reply = self._bound_llm(criteria, verdicts).invoke(convo)
        return self._result(_merge(reply, verdicts, criteria))

    @override
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
        reply = await self._bound_llm(criteria, verdicts).ainvoke(convo)
        return self._result(_merge(reply, verdicts, criteria))
