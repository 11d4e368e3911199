"""The per-rubric verdict tool of a pairwise call, and reading a reply against it.

`verdict_tool` builds the ``PairwiseVerdict`` tool for one rubric: ``verdicts`` holds one
required entry per criterion (keys ``criterion_1``, ``criterion_2``, … — providers such as
Anthropic refuse property names with spaces, so the criterion's exact text is the entry's
``criterion``, an enum of that one name), each with ``winner`` (``a``, ``b`` or ``tie``) and
``reason``; nothing else is allowed. The judge binds it with ``tool_choice`` naming it, so a
server that constrains output to the schema returns every criterion by construction.

`read_reply` reads a reply the way the grader reads verdicts (`rubric_core.grader`): the
tool call's arguments, or a JSON object in the text when the reply calls no tool; entries are
matched to the rubric by name only (`rubric_core.grader.criterion_key`, never by the key or
the position), names not in the rubric are kept aside and ignored, and a criterion answered
twice with different winners counts as unanswered. A reply is untrusted, so a reason is kept
up to `REASON_CHAR_LIMIT` characters.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rubric_core.grader import assign_answers, message_text, shorten
from rubric_core.pairwise.prompt import PAIRWISE_TOOL
from rubric_core.pairwise.types import WINNERS

if TYPE_CHECKING:
    from collections.abc import Sequence

    from langchain_core.messages import AIMessage

    from rubric_core.pairwise.types import Winner

REASON_CHAR_LIMIT = 2_000
"""A criterion's reason is kept up to this size (head and tail, marked)."""


def verdict_tool(criteria: Sequence[str]) -> dict[str, Any]:
    """The ``PairwiseVerdict`` tool for these criteria, in OpenAI's function format."""
    entries = {
        f"criterion_{i}": {
            "type": "object",
            "description": f"Criterion {i}: {name}",
            "properties": {
                "criterion": {"type": "string", "enum": [name],
                              "description": "The criterion, copied exactly."},
                "winner": {"type": "string", "enum": list(WINNERS),
                           "description": "a: answer A meets it better; b: answer B does; "
                                          "tie: equally well, or both fail it equally."},
                "reason": {"type": "string",
                           "description": "One sentence: what one answer does that the "
                                          "other does not."},
            },
            "required": ["criterion", "winner", "reason"],
            "additionalProperties": False,
        }
        for i, name in enumerate(criteria, 1)
    }
    return {"type": "function", "function": {
        "name": PAIRWISE_TOOL,
        "description": "Give the verdict on every criterion: which answer meets it better.",
        "parameters": {
            "type": "object",
            "properties": {"verdicts": {
                "type": "object", "description": "One entry for every numbered criterion.",
                "properties": entries, "required": list(entries),
                "additionalProperties": False}},
            "required": ["verdicts"],
            "additionalProperties": False,
        },
    }}


@dataclass(frozen=True)
class Reading:
    """One reply read against the rubric, in the terms of the order it was shown in."""

    winners: dict[int, tuple[Winner, str]]
    """Rubric index → (winner as shown: ``a`` is the answer shown first, reason)."""
    problems: dict[int, str] = field(default_factory=dict)
    """Rubric index → why the reply gave that criterion no usable winner."""
    unknown: list[str] = field(default_factory=list)
    """Names the reply answered that match no criterion (ignored; at most 50, each cut)."""
    error: str | None = None
    """Why the reply carries no verdict at all (no tool call, arguments not JSON, no
    ``verdicts``), or None."""


def _arguments(reply: AIMessage) -> tuple[Any | None, str | None]:
    """The verdict's arguments, or why there are none."""
    for call in reply.tool_calls:
        if call["name"] == PAIRWISE_TOOL:
            return call["args"], None
    for bad in reply.invalid_tool_calls:
        if bad.get("name") == PAIRWISE_TOOL:
            return None, (f"the {PAIRWISE_TOOL} arguments are not valid JSON: "
                          f"{shorten(str(bad.get('error') or bad.get('args')), 300)}")
    if reply.tool_calls:
        names = ", ".join(sorted({c["name"] for c in reply.tool_calls}))
        return None, f"the reply calls {names}, not {PAIRWISE_TOOL}"
    match = re.search(r"\{.*\}", message_text(reply), re.DOTALL)
    if match:  # some models answer with the JSON as text instead of a tool call
        try:
            data = json.loads(match.group(0))
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict) and "verdicts" in data:
            return data, None
    return None, f"no verdict: the reply does not call {PAIRWISE_TOOL}"


def _entries(verdicts: Any) -> list[Any] | None:
    if isinstance(verdicts, dict):
        return list(verdicts.values())
    if isinstance(verdicts, list):
        return verdicts
    return None


def _winner(value: Any) -> Winner | None:
    text = value.strip().casefold() if isinstance(value, str) else None
    return next((w for w in WINNERS if w == text), None)


def read_reply(reply: AIMessage, criteria: Sequence[str]) -> Reading:
    """Read one pairwise reply against the rubric's criteria (see the module docstring)."""
    args, error = _arguments(reply)
    if error is not None:
        return Reading({}, error=error)
    entries = _entries(args.get("verdicts") if isinstance(args, dict) else None)
    if entries is None:
        return Reading({}, error="the verdict has no 'verdicts' object of criteria")
    named = [e for e in entries if isinstance(e, dict) and isinstance(e.get("criterion"), str)]
    answers, unknown = assign_answers(criteria, [e["criterion"] for e in named])
    winners: dict[int, tuple[Winner, str]] = {}
    problems: dict[int, str] = {}
    for index in range(len(criteria)):
        given = [named[pos] for pos in answers.get(index, [])]
        found = [_winner(e.get("winner")) for e in given]
        bad = [e.get("winner") for e, w in zip(given, found, strict=True) if w is None]
        if not given:
            problems[index] = "the reply leaves this criterion out"
        elif bad:
            problems[index] = (f"winner {shorten(str(bad[0]), 80)!r} is not one of "
                               f"{', '.join(WINNERS)}")
        elif len(set(found)) > 1:
            problems[index] = "the reply answers this criterion twice with different winners"
        elif (winner := found[0]) is not None:
            reason = given[0].get("reason")
            winners[index] = (winner, shorten(reason if isinstance(reason, str) else "",
                                              REASON_CHAR_LIMIT))
    names = [shorten(named[pos]["criterion"], 300) for pos in unknown[:50]]
    return Reading(winners, problems, names)


def correction(criteria: Sequence[str], reading: Reading) -> str:
    """The message sent once to a grader whose reply was unusable or left criteria out."""
    if reading.error is not None:
        head = f"Your reply was rejected: {reading.error}."
    else:
        listed = "\n".join(f"- {criteria[i]}: {why}" for i, why in reading.problems.items())
        head = (f"Your verdict has no usable winner for {len(reading.problems)} of the "
                f"{len(criteria)} criteria:\n{listed}")
    return (f"{head}\nCall {PAIRWISE_TOOL} again with one entry for every numbered criterion, "
            "copying each criterion's text exactly, winner \"a\", \"b\" or \"tie\", and a "
            "reason.")


__all__ = ["REASON_CHAR_LIMIT", "Reading", "correction", "read_reply", "verdict_tool"]
