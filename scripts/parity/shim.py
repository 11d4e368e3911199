"""The names deepagents' RubricMiddleware tests import, mapped onto rubric_core's.

Their test file, as ``scripts/deepagents_parity.py`` rewrites it, imports from here instead of
``deepagents.middleware.rubric`` and ``tests.unit_tests.chat_model``. Each name is ours:

- ``RubricMiddleware``: ours, plus the one seam their tests stub, ``_grade(state, iteration)``
  (and ``_agrade``) returning a ``GraderResponse``. Theirs is the whole grader call; ours is
  the grader chat model. So when a test stubs ``_grade`` on an instance, that instance's grader
  model becomes `StubbedGrader`, which asks the stub for each reply and answers with the
  response as a ``GraderResponse`` tool call: the stub's verdict goes through our whole pass
  (validation, name matching, coverage correction, retries). Without a stub it is ours, unchanged.
- ``GraderResponse``, ``RubricEvaluation``: ours (``rubric_core``).
- ``RUBRIC_GRADER_MESSAGE_SOURCE``: our ``REVISION_SOURCE`` (both ``"rubric_grader"``).
- ``GenericFakeChatModel``: LangChain's own. deepagents' subclass adds ``bind_tools`` and a call
  history; the suite uses it only as the agent's model with no tools, which never binds any.
- ``_build_grader_transcript``, ``_sanitize_for_payload``: no counterpart. Our grader sees
  request, work and answer sections, not a rendered transcript, and escapes only its own section
  tags. The tests that call them are left out (``tables.EXCLUDED``); these raise if called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import ConfigDict

from rubric_core import GraderResponse, RubricEvaluation
from rubric_core import RubricMiddleware as _RubricMiddleware
from rubric_core.types import REVISION_SOURCE as RUBRIC_GRADER_MESSAGE_SOURCE

if TYPE_CHECKING:
    from collections.abc import Sequence

    from langchain_core.messages import BaseMessage

__all__ = [
    "RUBRIC_GRADER_MESSAGE_SOURCE",
    "GenericFakeChatModel",
    "GraderResponse",
    "RubricEvaluation",
    "RubricMiddleware",
    "_build_grader_transcript",
    "_sanitize_for_payload",
]


def _as_reply(response: GraderResponse) -> AIMessage:
    args = response.model_dump(mode="json", exclude_none=True)
    return AIMessage("", tool_calls=[{"name": "GraderResponse", "args": args, "id": "stub"}])


class StubbedGrader(BaseChatModel):
    """A grader chat model whose every reply is the owner's stubbed ``_grade``/``_agrade``."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    owner: Any

    @property
    def _llm_type(self) -> str:
        return "deepagents-parity-stub"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> StubbedGrader:  # type: ignore[override]
        return self

    def _generate(self, messages: list[BaseMessage], stop: Any = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        state, iteration = self.owner.graded
        return ChatResult(generations=[
            ChatGeneration(message=_as_reply(self.owner._grade(state, iteration)))])

    async def _agenerate(self, messages: list[BaseMessage], stop: Any = None,
                         run_manager: Any = None, **kwargs: Any) -> ChatResult:
        state, iteration = self.owner.graded
        return ChatResult(generations=[
            ChatGeneration(message=_as_reply(await self.owner._agrade(state, iteration)))])


class RubricMiddleware(_RubricMiddleware):
    """Ours, with deepagents' stubbing seam (see the module docstring)."""

    graded: tuple[Any, int] = ({}, 0)
    """The state and iteration of the pass being graded, handed to the stub."""

    def _grade(self, state: Any, iteration: int) -> GraderResponse:
        msg = "only a test's stub grades through _grade; unstubbed, the configured model grades"
        raise NotImplementedError(msg)

    async def _agrade(self, state: Any, iteration: int) -> GraderResponse:
        return self._grade(state, iteration)

    def _stubbed(self) -> bool:
        return "_grade" in vars(self) or "_agrade" in vars(self)

    def _prepare(self, state: Any, runtime: Any) -> tuple[list[str], Any]:
        self.graded = (state, state.get("_rubric_iterations") or 0)
        return super()._prepare(state, runtime)

    def _grader_model(self) -> Any:
        return StubbedGrader(owner=self) if self._stubbed() else super()._grader_model()


def _build_grader_transcript(messages: Any) -> str:
    msg = ("rubric_core has no transcript renderer: its grader sees the request, the latest "
           "attempt's work and its answer as separate sections (grader.build_grader_messages)")
    raise NotImplementedError(msg)


def _sanitize_for_payload(text: str) -> str:
    msg = ("rubric_core escapes only its own section tags (request, criteria, work, answer) "
           "inside build_grader_messages; there is no <rubric>/<transcript> sanitizer")
    raise NotImplementedError(msg)
