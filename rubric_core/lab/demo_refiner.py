"""`DemoRefiner`: an offline refiner model that knows the bundled answer set's criteria.

As the demo worker knows the bundled prompts (`rubric_core.offline.demo`), it knows what to
propose for the bundled rubric's weak criteria (`rubric_core.lab.bundled.DEMO_REWRITES`), so
the whole lab loop runs with no key. It reads the criterion from the refiner message
(`rubric_core.lab.refine.read_refiner_request`) and answers with one ``RefinerResponse`` call;
for any other criterion it says, in plain text, that it only knows the bundled set (the caller
then reports that it got no proposal: it never makes one up). It reads only the trusted
``<criterion>`` section, never the disagreements.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from typing_extensions import override

from rubric_core.grader import message_text
from rubric_core.lab.bundled import DEMO_REWRITES
from rubric_core.lab.refine import REFINER_TOOL, read_refiner_request
from rubric_core.models import resolve_model
from rubric_core.rubric import normalize_name

if TYPE_CHECKING:
    from collections.abc import Sequence

    from langchain_core.callbacks import CallbackManagerForLLMRun
    from langchain_core.messages import BaseMessage

UNKNOWN_REPLY = ("The demo refiner knows only the bundled answer set's criteria; choose an LLM "
                 "refiner (for example openai:gpt-4.1-mini) for this one.")
"""What it answers for a criterion it does not know."""

_KNOWN = {normalize_name(criterion): rewrites for criterion, rewrites in DEMO_REWRITES.items()}


class DemoRefiner(BaseChatModel):
    """An offline refiner for the bundled set (see the module docstring)."""

    @property
    def _llm_type(self) -> str:
        return "demo-refiner"

    @override
    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> DemoRefiner:
        """Itself: it always answers with the ``RefinerResponse`` call."""
        return self

    @override
    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        request = next((read_refiner_request(message_text(m)) for m in messages
                        if isinstance(m, HumanMessage)
                        and read_refiner_request(message_text(m)) is not None), None)
        known = None if request is None else _KNOWN.get(normalize_name(request.criterion))
        if known is None:
            reply = AIMessage(content=UNKNOWN_REPLY)
        else:
            args = {"rewrites": [{"kind": kind, "criteria": list(criteria), "rationale": why}
                                 for kind, criteria, why in known]}
            reply = AIMessage(content="", tool_calls=[{
                "name": REFINER_TOOL, "args": args, "id": f"call_{uuid.uuid4().hex[:12]}",
                "type": "tool_call"}])
        return ChatResult(generations=[ChatGeneration(message=reply)])


def resolve_refiner(spec: str, *, base_url: str | None = None) -> BaseChatModel:
    """The refiner model for a model string: ``demo`` is the offline demo refiner.

    Raises:
        ModelConfigError: The model string cannot be built (`rubric_core.models`).

    """
    if spec.strip() == "demo":
        return DemoRefiner()
    return resolve_model(spec, base_url=base_url)
