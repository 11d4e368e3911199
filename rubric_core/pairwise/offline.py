"""The offline rules grader, judging pairwise: a passing answer beats a failing one, else tie.

`RulesPairwiseGrader` is a chat model that never calls an LLM: it reads the pairwise request
(`rubric_core.pairwise.prompt.parse_pairwise_payload`), checks each criterion on both answers
with the rules grader's own checks (`rubric_core.offline.check_criterion`), and answers with
one ``PairwiseVerdict`` tool call. A criterion the rules cannot check is never guessed: it is
left out of the verdict and named in the reply's text, so the judge records it as not judged,
with that text. Being a chat model, its calls are traced and costed like any grader call's
(at $0). `pairwise_grader` turns the ``rules`` grader into this one, a ``hybrid:`` grader into
its LLM, and leaves any other model as it is.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool  # noqa: TC002 (pydantic reads the field type)
from pydantic import ConfigDict, Field
from typing_extensions import override

from rubric_core.grader import message_text
from rubric_core.offline import HybridGrader, RulesGrader, check_criterion
from rubric_core.offline.graders import UNRECOGNISED_GAP
from rubric_core.pairwise.prompt import PAIRWISE_TOOL, parse_pairwise_payload

if TYPE_CHECKING:
    from collections.abc import Sequence

    from langchain_core.callbacks import CallbackManagerForLLMRun
    from langchain_core.messages import BaseMessage

    from rubric_core.pairwise.prompt import PairwisePayload


def _entry(criterion: str, payload: PairwisePayload,
           tools: dict[str, BaseTool]) -> dict[str, str] | None:
    first = check_criterion(criterion, payload.first, tools)
    second = check_criterion(criterion, payload.second, tools)
    if first is None or second is None:
        return None
    if first["passed"] == second["passed"]:
        both = "pass" if first["passed"] else "fail"
        return {"criterion": criterion, "winner": "tie",
                "reason": f"Both answers {both} the rule check."}
    winner, shown, loser = ("a", "first", second) if first["passed"] else ("b", "second", first)
    return {"criterion": criterion, "winner": winner,
            "reason": f"Only the answer shown {shown} passes the rule check; the other: "
                      f"{loser.get('gap', '')}"}


def rules_verdict(payload: PairwisePayload, tools: dict[str, BaseTool]) -> AIMessage:
    """The rules' pairwise verdict on a request (criteria they cannot check left out)."""
    verdicts: dict[str, dict[str, str]] = {}
    unchecked: list[str] = []
    for i, criterion in enumerate(payload.criteria, 1):
        entry = _entry(criterion, payload, tools)
        if entry is None:
            unchecked.append(criterion)
        else:
            verdicts[f"criterion_{i}"] = entry
    text = ""
    if unchecked:
        listed = "; ".join(repr(c) for c in unchecked)
        text = f"Not judged: {listed}. {UNRECOGNISED_GAP}"
    call = {"name": PAIRWISE_TOOL, "args": {"verdicts": verdicts},
            "id": f"call_{uuid.uuid4().hex[:12]}", "type": "tool_call"}
    return AIMessage(content=text, tool_calls=[call])


class RulesPairwiseGrader(BaseChatModel):
    """The ``rules`` grader for pairwise calls (see the module docstring); no LLM, no network."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    tools: list[BaseTool] = Field(default_factory=list, exclude=True)
    """Evidence tools the rules' tool criteria call (the rules grader's own)."""
    pause_s: float = Field(default=0.0, ge=0.0, le=10.0)
    """Seconds each verdict waits (the app's paced demo; 0 everywhere else)."""

    @property
    def _llm_type(self) -> str:
        return "rules-pairwise-grader"

    @property
    def grader_label(self) -> str:
        """The name messages use for this grader (`rubric_core.grader.model_label`)."""
        return "rules"

    @override
    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> RulesPairwiseGrader:
        """Itself: the verdict tool is the only one a pairwise call binds, and it answers it."""
        return self

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
        payload = next((p for m in messages if isinstance(m, HumanMessage)
                        if (p := parse_pairwise_payload(message_text(m))) is not None), None)
        reply = (AIMessage("The rules grader found no pairwise request (criteria and two "
                           "answers) to judge.") if payload is None
                 else rules_verdict(payload, {t.name: t for t in self.tools}))
        return ChatResult(generations=[ChatGeneration(message=reply)])


def pairwise_grader(model: BaseChatModel) -> BaseChatModel:
    """The model a pairwise call is sent to.

    `RulesPairwiseGrader` for ``rules``; a ``hybrid:`` grader's LLM, which judges every
    criterion (its rules merge into single-answer verdicts only); any other model as it is.
    """
    if isinstance(model, RulesGrader):
        return RulesPairwiseGrader(tools=list(model.tools), pause_s=model.pause_s)
    if isinstance(model, HybridGrader):
        return model.llm
    return model


__all__ = ["RulesPairwiseGrader", "pairwise_grader", "rules_verdict"]
