"""Reading a grader's reply: the verdict it carries, and its text kept for the record.

A verdict is read from the ``GraderResponse`` tool call, or else from a JSON object in the
reply's text (`verdict_args`); offline graders that rewrite verdicts read it the same way, so
no verdict reaches the grading pass without passing through them.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from rubric_core.grader.failure import RAW_REPLY_CHAR_LIMIT
from rubric_core.grader.transcript import message_text, shorten
from rubric_core.types import GraderResponse

if TYPE_CHECKING:
    from langchain_core.messages import AIMessage

VERDICT_TOOL = GraderResponse.__name__
"""The name of the tool a grader calls to give its verdict."""


def parse_text_verdict(text: str) -> dict[str, Any] | None:
    """Some models answer with JSON text instead of a tool call; accept a JSON object."""
    match = re.search(r"\{.*\}", text, re.DOTALL)
    if not match:
        return None
    try:
        data = json.loads(match.group(0))
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) and "result" in data else None


def verdict_args(reply: AIMessage) -> Any | None:
    """The verdict a grader reply carries, read exactly as the grading pass reads it.

    The arguments of the first ``GraderResponse`` tool call; else, when the reply asks for no
    evidence tool, a JSON object with a ``result`` key in its text (`parse_text_verdict`);
    else None. Graders that rewrite verdicts (`HybridGrader`) use this same reading, so no
    verdict can reach the pass without passing through them.
    """
    for call in reply.tool_calls:
        if call["name"] == VERDICT_TOOL:
            return call["args"]
    if reply.tool_calls:
        return None
    return parse_text_verdict(message_text(reply))


def raw_reply_text(reply: AIMessage) -> str:
    """A reply as received, for the record: its text, then each tool call, capped."""
    text = message_text(reply)
    parts = [text] if text else []
    for call in reply.tool_calls:
        args = json.dumps(call.get("args"), ensure_ascii=False, default=str)
        parts.append(f"[tool call {call['name']}] {args}")
    for bad in reply.invalid_tool_calls:
        parts.append(f"[invalid tool call {bad.get('name')}] {bad.get('args')}"
                     f" ({bad.get('error') or 'arguments are not valid JSON'})")
    return shorten("\n".join(parts) or "(empty reply)", RAW_REPLY_CHAR_LIMIT)
