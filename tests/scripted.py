"""Scripted chat models: queued replies, no network, for driving the loop in tests."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field, PrivateAttr

if TYPE_CHECKING:
    from langchain_core.callbacks import CallbackManagerForLLMRun

_ids = itertools.count()

Reply = AIMessage | BaseException | Callable[[list[BaseMessage]], AIMessage]


def verdict(result: str, explanation: str = "ok", criteria: Sequence[Any] = ()) -> AIMessage:
    """An AIMessage carrying a GraderResponse tool call.

    `criteria` items are names (passing) or (name, gap) pairs (failing).
    """
    items = []
    for c in criteria:
        if isinstance(c, tuple):
            items.append({"name": c[0], "passed": False, "gap": c[1]})
        else:
            items.append({"name": c, "passed": True})
    args = {"result": result, "explanation": explanation, "criteria": items}
    return tool_call("GraderResponse", args)


def tool_call(name: str, args: dict[str, Any]) -> AIMessage:
    """An AIMessage asking for one tool call."""
    return AIMessage(
        content="", tool_calls=[{"name": name, "args": args, "id": f"call_{next(_ids)}"}]
    )


class ScriptedChatModel(BaseChatModel):
    """Answers each call with the next queued reply (a message, an exception or a function).

    When the queue is empty, `default` answers (if set), else the model raises.
    """

    replies: list[Any] = Field(default_factory=list)
    default: Any = None
    _calls: list[list[BaseMessage]] = PrivateAttr(default_factory=list)
    _bound_tools: list[Any] = PrivateAttr(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    @property
    def calls(self) -> list[list[BaseMessage]]:
        """The messages of every call, in order."""
        return self._calls

    @property
    def bound_tools(self) -> list[Any]:
        """The tools of the last bind_tools call."""
        return self._bound_tools

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:  # type: ignore[override]
        self._bound_tools = list(tools)
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self._calls.append(list(messages))
        reply = self.replies.pop(0) if self.replies else self.default
        if reply is None:
            msg = "ScriptedChatModel has no reply queued"
            raise AssertionError(msg)
        if isinstance(reply, BaseException):
            raise reply
        if callable(reply) and not isinstance(reply, BaseMessage):
            reply = reply(messages)
        if isinstance(reply, str):
            reply = AIMessage(reply)
        return ChatResult(generations=[ChatGeneration(message=reply.model_copy())])
