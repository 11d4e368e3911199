"""Reading a grader's reply: the verdict it carries, and its text kept for the record.

A verdict is read from the ``GraderResponse`` tool call, or else from a JSON object in the
reply's text (`verdict_args`); offline graders that rewrite verdicts read it the same way, so
no verdict reaches the grading pass without passing through them. A verdict in the per-rubric
shape (`rubric_core.grader.verdict`: one property per criterion) is read into the list shape of
``GraderResponse``. `forced_reply` says whether a reply obeyed a forced call, and `was_cut`
whether it stopped at its output token limit.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import TYPE_CHECKING, Any

from rubric_core.grader.failure import RAW_REPLY_CHAR_LIMIT
from rubric_core.grader.transcript import message_text, shorten
from rubric_core.types import GraderResponse

if TYPE_CHECKING:
    from langchain_core.messages import AIMessage, BaseMessage

    from rubric_core.grader.verdict import VerdictMode

VERDICT_TOOL = GraderResponse.__name__
"""The name of the tool a grader calls to give its verdict."""

CUT_FINISH_REASONS = frozenset({"length", "max_tokens", "MAX_TOKENS"})
"""Why a reply stopped, when it stopped at its output token limit (OpenAI and compatible
servers: ``finish_reason: length``; Anthropic: ``stop_reason: max_tokens``; Gemini:
``MAX_TOKENS``)."""


def was_cut(message: BaseMessage) -> bool:
    """Whether a model's reply stopped at its output token limit, before it was complete."""
    meta = getattr(message, "response_metadata", None) or {}
    return any(meta.get(key) in CUT_FINISH_REASONS for key in ("finish_reason", "stop_reason"))


CANNOT_JUDGE = "rubric_cannot_be_judged"
"""How the per-rubric schema spells the ``failed`` result (`rubric_core.grader.verdict`)."""


def keyed_verdict(args: Any) -> Any:
    """A verdict with one property per criterion, read into ``GraderResponse``'s list shape.

    ``{"criteria": {"<name>": {"passed": …, "gap": …}}, …}`` becomes
    ``{"criteria": [{"name": "<name>", "passed": …, "gap": …}], …}``; its result
    ``rubric_cannot_be_judged`` (`CANNOT_JUDGE`) is ``failed``, and any other is what the
    criteria say (``satisfied`` exactly when every one passes): in
    this shape the criteria are the verdict. Anything else is returned unchanged.
    """
    if not isinstance(args, dict) or not isinstance(args.get("criteria"), dict):
        return args
    items = [{"name": name, **value} if isinstance(value, dict) else {"name": name}
             for name, value in args["criteria"].items()]
    out = {**args, "criteria": items}
    if out.get("result") == CANNOT_JUDGE:
        out["result"] = "failed"
    if out.get("result") != "failed":
        passed = all(isinstance(i, dict) and i.get("passed") is True for i in items)
        out["result"] = "satisfied" if passed else "needs_revision"
    return out


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
            return keyed_verdict(call["args"])
    if reply.tool_calls:
        return None
    return keyed_verdict(parse_text_verdict(message_text(reply)))


def forced_reply(reply: AIMessage, force: str, mode: VerdictMode) -> AIMessage | None:
    """The reply to a call forced to call ``force``, as that call; None when it was ignored.

    A call to ``force`` (valid or not) obeys. In ``json_schema`` mode the reply's text is the
    call: a JSON object becomes a call to ``force`` with it as arguments, and text that starts
    one but does not parse (cut short, say) an invalid call to it. Anything else ignored the
    constraint.
    """
    if any(c["name"] == force for c in reply.tool_calls) or any(
            c.get("name") == force for c in reply.invalid_tool_calls):
        return reply
    if mode != "json_schema":
        return None
    text = message_text(reply).strip()
    if not text.startswith("{"):
        return None
    call_id = f"call_{uuid.uuid4().hex[:24]}"
    error: str | None = None
    try:
        args = json.loads(text)
    except json.JSONDecodeError as exc:
        args, error = None, f"not valid JSON: {exc}"
    if error is None and not isinstance(args, dict):
        error = "not a JSON object"
    if error is not None:
        bad = {"name": force, "args": text, "id": call_id, "error": error,
               "type": "invalid_tool_call"}
        return reply.model_copy(update={"invalid_tool_calls": [bad]})
    call = {"name": force, "args": args, "id": call_id, "type": "tool_call"}
    return reply.model_copy(update={"tool_calls": [call]})


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
