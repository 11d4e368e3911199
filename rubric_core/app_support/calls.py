"""The Calls view (Run and Review): a run's model calls as a table, and one call readable.

What a page draws from a run's call traces (`rubric_core.store.Store.calls`): one row per call
(pass, role, model, tokens in / cached / out, latency, retries), a one-line total, and for a
selected call its messages as sent and its reply, each with its role. Also the grader's tokens
of a run with the cached ones (`tokens_caption`). The records arrive scrubbed and bounded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from rubric_core.usage import token_sum

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from rubric_core.store import RunRecord
    from rubric_core.types import CallMessage, ModelCallRecord

CALL_COLUMNS = ("pass", "role", "model", "status", "tokens_in", "cached", "tokens_out",
                "latency_s", "retries", "messages")
"""Columns of `calls_frame`, in order."""

CALL_HEADERS = {"pass": "Pass", "role": "Role", "model": "Model", "status": "Status",
                "tokens_in": "Tokens in", "cached": "Cached in", "tokens_out": "Tokens out",
                "latency_s": "Latency (s)", "retries": "Retries", "messages": "Messages"}
"""How the Calls view heads `calls_frame`'s columns for people."""

_ROLE_NAMES = {"system": "System", "human": "User", "ai": "Assistant", "tool": "Tool result",
               "marker": "…"}


def _retries(call: Mapping[str, Any]) -> str:
    parts = []
    if call.get("attempt"):
        parts.append(f"grader retry {call['attempt']}")
    if call.get("http_retries"):
        parts.append(f"{call['http_retries']} HTTP")
    return ", ".join(parts)


def calls_frame(calls: Sequence[ModelCallRecord]) -> pd.DataFrame:
    """One row per call (`CALL_COLUMNS`); passes counted from 1, as the app counts them."""
    rows = [{
        "pass": int(c["iteration"]) + 1, "role": c["role"], "model": c["model"],
        "status": c["status"], "tokens_in": c.get("input_tokens"),
        "cached": c.get("cached_input_tokens"), "tokens_out": c.get("output_tokens"),
        "latency_s": c.get("latency_s"), "retries": _retries(c),
        "messages": int(c.get("messages_total") or 0),
    } for c in calls]
    frame = pd.DataFrame(rows, columns=list(CALL_COLUMNS))
    return frame.astype({"pass": "int64", "tokens_in": "Int64", "cached": "Int64",
                         "tokens_out": "Int64", "messages": "int64"})


def calls_summary(calls: Sequence[ModelCallRecord]) -> str:
    """One line: how many calls of each role, and their tokens (cached ones included)."""
    if not calls:
        return "No model calls were recorded for this run."
    roles = {r: sum(1 for c in calls if c["role"] == r) for r in ("worker", "grader")}
    errors = sum(1 for c in calls if c["status"] == "error")
    line = (f"{len(calls)} call(s): {roles['worker']} worker, {roles['grader']} grader"
            + (f", {errors} failed" if errors else ""))
    tokens_in = token_sum(*(c.get("input_tokens") for c in calls))
    if tokens_in is None:
        return line + " · no token usage reported"
    cached = token_sum(*(c.get("cached_input_tokens") for c in calls)) or 0
    out = token_sum(*(c.get("output_tokens") for c in calls)) or 0
    return f"{line} · tokens in {tokens_in:,} ({cached:,} cached), out {out:,}"


def call_label(calls: Sequence[ModelCallRecord], index: int) -> str:
    """How the call picker names call ``index``."""
    c = calls[index]
    failed = " · error" if c["status"] == "error" else ""
    return f"#{index + 1} · pass {int(c['iteration']) + 1} · {c['role']} · {c['model']}{failed}"


@dataclass(frozen=True)
class ShownMessage:
    """One message of a call, ready to draw."""

    heading: str
    """Who said it (and the tool calls it made, by name)."""
    text: str
    """Its text, and its tool calls' arguments, as kept."""


@dataclass(frozen=True)
class CallDetail:
    """A call, readable: what was sent, what came back, and what the trace left out."""

    facts: str
    """One line: model, status, tokens, latency, retries."""
    messages: list[ShownMessage]
    """The messages as sent (a ``…`` line stands for those left out)."""
    reply: ShownMessage | None
    """The reply (None for a call that ended on an error)."""
    notes: list[str]
    """What the reader should know: the error, messages left out, text not kept."""


def _shown(message: CallMessage) -> ShownMessage:
    role = _ROLE_NAMES.get(message.get("role", ""), message.get("role", ""))
    name = f" ({message['name']})" if message.get("name") else ""
    calls = message.get("tool_calls") or []
    heading = f"{role}{name}" + (f" — calls {', '.join(c['name'] for c in calls)}"
                                 if calls else "")
    text = message.get("text") or ""
    for call in calls:
        text += f"\n\n→ {call['name']}({call['args']})"
    return ShownMessage(heading, text.strip() or "(empty)")


def call_detail(call: ModelCallRecord) -> CallDetail:
    """What the Calls view shows of one call."""
    tokens = ("no usage reported" if call.get("input_tokens") is None else
              f"tokens in {call['input_tokens']:,} ({call.get('cached_input_tokens') or 0:,} "
              f"cached, {call.get('cache_creation_tokens') or 0:,} written to the cache), "
              f"out {call.get('output_tokens') or 0:,}")
    first = (f", first token {call['first_token_s']:.3f} s"
             if call.get("first_token_s") is not None else "")
    retries = _retries(call)
    facts = (f"{call['role']} · {call['model']}"
             + (f" ({call['provider']})" if call.get("provider") else "")
             + f" · {call['status']} · {tokens} · {call.get('latency_s') or 0:.3f} s{first}"
             + (f" · {retries}" if retries else ""))
    notes: list[str] = []
    if call.get("error"):
        notes.append(f"Error: {call['error']}")
    if not call.get("content_kept", True):
        notes.append("The run's trace budget was spent: this call's messages and reply were "
                     "not kept, only its numbers.")
    kept = [m for m in call.get("messages") or [] if m.get("role") != "marker"]
    total = int(call.get("messages_total") or 0)
    if call.get("content_kept", True) and total > len(kept):
        notes.append(f"{len(kept)} of {total} messages kept: the first and the last ones.")
    reply = call.get("reply")
    return CallDetail(facts, [_shown(m) for m in call.get("messages") or []],
                      _shown(reply) if reply else None, notes)


def tokens_caption(record: RunRecord) -> str:
    """The grader's tokens over a run, the cached ones named: ``""`` when none were reported."""
    if record.input_tokens is None and record.output_tokens is None:
        return ""
    return (f"Grader tokens: {record.input_tokens or 0:,} in "
            f"({record.cached_input_tokens or 0:,} read from the provider's prompt cache), "
            f"{record.output_tokens or 0:,} out.")


__all__ = [
    "CALL_COLUMNS",
    "CallDetail",
    "ShownMessage",
    "call_detail",
    "call_label",
    "calls_frame",
    "calls_summary",
    "tokens_caption",
]
