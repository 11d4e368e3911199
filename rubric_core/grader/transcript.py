"""Reading an agent's conversation: message text, revision turns, the latest attempt.

The grader sees the original request and the latest attempt (every message since the last
revision turn, tool calls and results included) — never the whole history — so its input stays
about the same size however many iterations a run takes. `shorten` is the one way text is cut
to a limit anywhere in a pass: head and tail kept around a visible marker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage

from rubric_core.types import REVISION_SOURCE

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence


def message_text(message: BaseMessage) -> str:
    """Plain text of a message, whatever the shape of its content."""
    content = message.content
    if isinstance(content, str):
        return content
    return message.text


def is_revision_turn(message: BaseMessage) -> bool:
    """True for the feedback turn the middleware injects between attempts."""
    return isinstance(message, HumanMessage) and (
        message.additional_kwargs.get("lc_source") == REVISION_SOURCE
    )


def shorten(text: str, limit: int) -> str:
    """Cut `text` to about `limit` characters, keeping head and tail around a visible marker."""
    if len(text) <= limit:
        return text
    keep = limit - 80
    head, tail = text[: keep * 3 // 4], text[-(keep // 4) :]
    omitted = len(text) - len(head) - len(tail)
    return f"{head}\n[… {omitted:,} characters omitted by Rubric Studio …]\n{tail}"


@dataclass(frozen=True)
class Attempt:
    """The parts of a conversation a grader needs."""

    request: str
    """The latest user request (revision turns excluded)."""
    work: list[AnyMessage]
    """Messages of the latest attempt before its final answer (tool calls and results)."""
    answer: str
    """Text of the attempt's final assistant message (empty when there is none)."""


def latest_attempt(messages: Sequence[AnyMessage]) -> Attempt:
    """Split a conversation into the original request and the latest attempt."""
    last_human = -1
    request = ""
    for i, msg in enumerate(messages):
        if isinstance(msg, HumanMessage):
            last_human = i
            if not is_revision_turn(msg):
                request = message_text(msg)
    attempt = list(messages[last_human + 1 :])
    answer = ""
    last = attempt[-1] if attempt else None
    # Only a final reply is the answer; a message still asking for tools stays in the work.
    if isinstance(last, AIMessage) and not last.tool_calls:
        answer = message_text(last)
        attempt = attempt[:-1]
    return Attempt(request=request, work=attempt, answer=answer)


def prepared_transcript(
    messages: Sequence[AnyMessage],
    rewrite: Callable[[list[AnyMessage]], list[AnyMessage]] | None,
) -> list[AnyMessage]:
    """The conversation the grader is shown: ``messages``, or what ``rewrite`` makes of them.

    ``rewrite`` (``prepare_messages_for_grader``) gets deep copies, so editing them in place
    cannot edit the agent's state.

    Raises:
        TypeError: ``rewrite`` returned anything but a list of LangChain messages.

    """
    if rewrite is None:
        return list(messages)
    prepared = rewrite([m.model_copy(deep=True) for m in messages])
    if not isinstance(prepared, list | tuple):
        got = type(prepared).__name__
    else:
        bad = next((m for m in prepared if not isinstance(m, BaseMessage)), None)
        if bad is None:
            return list(prepared)
        got = f"a list holding {type(bad).__name__}"
    msg = f"prepare_messages_for_grader must return a list of LangChain messages, got {got}"
    raise TypeError(msg)
