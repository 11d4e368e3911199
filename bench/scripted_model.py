"""A zero-latency chat model that answers from a script, for overhead benchmarks.

`ScriptedChatModel` returns its next reply at once and keeps only cheap counters: how many calls
it served, the seconds spent inside `_generate` (so a benchmark can subtract model time from wall
time), and the characters of text each call was sent. It never keeps the messages themselves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import PrivateAttr
from typing_extensions import override

if TYPE_CHECKING:
    from langchain_core.callbacks import CallbackManagerForLLMRun
    from langchain_core.runnables import Runnable
    from langchain_core.tools import BaseTool

Script = Callable[[int], AIMessage]
"""Maps the 0-based call index to the reply for that call."""


def message_chars(messages: Sequence[BaseMessage]) -> int:
    """Characters of text (content and tool-call arguments) across ``messages``."""
    total = 0
    for message in messages:
        total += len(message.text)
        if isinstance(message, AIMessage):
            total += sum(len(str(call["args"])) for call in message.tool_calls)
    return total


class ScriptedChatModel(BaseChatModel):
    """A chat model whose replies come from ``script(call_index)``, with no latency.

    `bind_tools` returns the model itself: the script decides whether a reply is text or a tool
    call, so the tools offered do not matter, and binding must not create copies that would split
    the counters.
    """

    script: Script
    """Produces the reply for each call."""
    model_name: str = "scripted-zero-latency"
    """Reported identifier; matches no provider, so LangChain picks its tool-calling fallbacks."""

    _calls: int = PrivateAttr(default=0)
    _model_seconds: float = PrivateAttr(default=0.0)
    _input_chars: list[int] = PrivateAttr(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    @property
    def calls(self) -> int:
        """Calls served so far."""
        return self._calls

    @property
    def model_seconds(self) -> float:
        """Seconds spent inside `_generate`, summed over all calls."""
        return self._model_seconds

    @property
    def input_chars(self) -> list[int]:
        """Characters of message text each call was sent, in call order."""
        return self._input_chars

    @override
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        started = time.perf_counter()
        self._input_chars.append(message_chars(messages))
        reply = self.script(self._calls)
        self._calls += 1
        result = ChatResult(generations=[ChatGeneration(message=reply)])
        self._model_seconds += time.perf_counter() - started
        return result

    @override
    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[Any, AIMessage]:
        """Return this model unchanged; the script already knows what to answer."""
        return self
