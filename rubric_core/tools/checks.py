"""Deterministic checks of an answer's text: substrings, patterns, length limits and JSON.

A grader asks one question per call (``check`` plus ``value``) and gets ``{"ok", "detail"}``
back; the detail says what was found so the grader can quote it. Matching is case-insensitive
where noted. JSON checks strip a ```` ```json ```` fence that wraps the whole text; JSON embedded
in prose is not valid JSON. Regular expressions run with a time limit when the ``regex`` package
is installed (it is a dependency of ``tiktoken``), so a catastrophic pattern cannot hang the
grading run.

`json_schema_tool` builds a one-argument evidence tool that validates against a fixed schema the
record an answer carries (`embedded_json`: its first fenced block, even inside prose, else the
whole text).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import regex as _regex
from jsonschema import SchemaError
from jsonschema.validators import Draft202012Validator, validator_for
from langchain_core.tools import StructuredTool
from pydantic import BaseModel, Field

from rubric_core.tools import fences
from rubric_core.tools._common import validation_handler
from rubric_core.tools.text import count_words

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from langchain_core.tools import BaseTool

CheckResult = dict[str, Any]
"""``{"ok": bool, "detail": str}``: whether the text passes, and what was found or why the check
could not be run."""

# `regex` (a runtime requirement) can stop a search after a timeout, which `re` cannot: a
# model-written pattern may backtrack catastrophically.
REGEX_TIMEOUT_S = 1.0
"""Longest a ``regex`` check may search."""

MAX_SCHEMA_ERRORS = 3
"""How many JSON Schema violations are spelled out in a detail."""

_SNIPPET = 40


class _BadValue(ValueError):
    """The check's value has the wrong type or shape."""


def _outcome(ok: bool, detail: str) -> CheckResult:
    return {"ok": ok, "detail": detail}


def _quote(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _around(text: str, start: int, end: int) -> str:
    left = max(0, start - _SNIPPET)
    right = min(len(text), end + _SNIPPET)
    return ("..." if left else "") + text[left:right] + ("..." if right < len(text) else "")


def _strings(value: Any) -> list[str]:
    """The value as a non-empty list of non-empty strings."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        msg = f"expected a string or a non-empty list of strings, got {value!r}"
        raise _BadValue(msg)
    if not all(isinstance(item, str) and item for item in items):
        msg = f"expected only non-empty strings, got {value!r}"
        raise _BadValue(msg)
    return items


def _limit(value: Any) -> int:
    """The value as a non-negative int (digit strings and whole floats accepted)."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        msg = f"expected a non-negative integer, got {value!r}"
        raise _BadValue(msg)
    return value


def _text_value(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        msg = f"expected {what}, got {value!r}"
        raise _BadValue(msg)
    return value


def _contains(text: str, value: Any) -> CheckResult:
    needles = _strings(value)
    haystack = text.casefold()
    missing = [needle for needle in needles if needle.casefold() not in haystack]
    if missing:
        found = len(needles) - len(missing)
        listed = ", ".join(_quote(m) for m in missing)
        return _outcome(
            False, f"missing {listed} ({found} of {len(needles)} found; case-insensitive)"
        )
    return _outcome(True, f"contains {', '.join(_quote(n) for n in needles)} (case-insensitive)")


def _not_contains(text: str, value: Any) -> CheckResult:
    needles = _strings(value)
    haystack = text.casefold()
    found = []
    for needle in needles:
        at = haystack.find(needle.casefold())
        if at >= 0:
            context = _around(text, at, at + len(needle))
            found.append(f"{_quote(needle)} at character {at}: {context!r}")
    if found:
        return _outcome(False, "found " + "; ".join(found))
    listed = ", ".join(_quote(n) for n in needles)
    return _outcome(True, f"contains none of {listed} (case-insensitive)")


def _regex_check(text: str, value: Any) -> CheckResult:
    pattern = _text_value(value, "a regular expression string")
    try:
        match = _regex.compile(pattern).search(text, timeout=REGEX_TIMEOUT_S)
    except TimeoutError:
        return _outcome(
            False,
            f"the pattern took longer than {REGEX_TIMEOUT_S:g} s on this text "
            "(catastrophic backtracking?); simplify it",
        )
    except Exception as exc:  # re.error, or regex.error (not a re.error subclass)
        return _outcome(False, f"invalid regular expression {_quote(pattern)}: {exc}")
    if match is None:
        return _outcome(False, f"no match for {_quote(pattern)} (re.search semantics)")
    return _outcome(True, f"matched {_quote(match.group(0))} at character {match.start()}")


def _edge(text: str, value: Any, *, start: bool) -> CheckResult:
    body, wanted = text.strip(), _text_value(value, "a non-empty string").strip()
    edge = body[: len(wanted)] if start else body[-len(wanted) :]
    ok = edge.casefold() == wanted.casefold()
    verb = "starts" if start else "ends"
    if ok:
        return _outcome(True, f"{verb} with {_quote(wanted)} (case-insensitive)")
    shown = body[:_SNIPPET] if start else body[-_SNIPPET:]
    return _outcome(False, f"the text {verb} with {_quote(shown)}, not {_quote(wanted)}")


def _length(text: str, value: Any, *, unit: str, most: bool) -> CheckResult:
    limit = _limit(value)
    size = count_words(text) if unit == "words" else len(text.strip())
    ok = size <= limit if most else size >= limit
    bound = "max" if most else "min"
    return _outcome(ok, f"{size} {unit} ({bound} {limit})")


def _json_payload(text: str) -> tuple[str, str]:
    """The JSON text to parse (inside a fence that wraps the whole text) and a hint for errors."""
    stripped = text.strip()
    fenced = fences.whole_block(stripped)
    if fenced:
        return fenced.body, ""
    if fences.blocks(stripped):
        return stripped, (
            " (the text has a fenced block with other text around it; only a fence that wraps "
            "the whole text is stripped)"
        )
    return stripped, ""


def _reject_constant(name: str) -> Any:
    msg = f"{name} is not valid JSON"
    raise ValueError(msg)


def _parse_json(text: str) -> tuple[Any, str | None]:
    """(value, error): error is None when the text is valid JSON."""
    payload, hint = _json_payload(text)
    if not payload.strip():
        return None, "the text is empty"
    try:
        return json.loads(payload, parse_constant=_reject_constant), None
    except json.JSONDecodeError as exc:
        return None, f"{exc.msg} (line {exc.lineno}, column {exc.colno}){hint}"
    except ValueError as exc:
        return None, f"{exc}{hint}"


def _describe_json(value: Any) -> str:
    if isinstance(value, dict):
        return f"an object with {len(value)} key(s)"
    if isinstance(value, list):
        return f"an array of {len(value)} item(s)"
    return f"a {type(value).__name__ if value is not None else 'null'} value"


def _valid_json(text: str, _value: Any) -> CheckResult:
    parsed, error = _parse_json(text)
    if error is not None:
        return _outcome(False, f"invalid JSON: {error}")
    return _outcome(True, f"valid JSON: {_describe_json(parsed)}")


def _json_schema(text: str, value: Any) -> CheckResult:
    schema = value
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            msg = f"expected a JSON Schema, got text that is not JSON ({exc})"
            raise _BadValue(msg) from exc
    if not isinstance(schema, dict | bool):
        msg = f"expected a JSON Schema object (or its JSON text), got {value!r}"
        raise _BadValue(msg)
    try:
        validator_cls = validator_for(schema, default=Draft202012Validator)
        validator_cls.check_schema(schema)
    except SchemaError as exc:
        return _outcome(False, f"invalid JSON Schema: {exc.message[:300]}")
    parsed, error = _parse_json(text)
    if error is not None:
        return _outcome(False, f"invalid JSON: {error}")
    validator = validator_cls(schema, format_checker=validator_cls.FORMAT_CHECKER)
    try:
        errors = []
        for found in validator.iter_errors(parsed):
            errors.append(found)
            if len(errors) > 50:
                break
    except Exception as exc:  # e.g. a $ref that cannot be resolved (nothing is fetched)
        return _outcome(False, f"could not validate: {type(exc).__name__}: {exc}")
    if not errors:
        return _outcome(True, f"matches the schema: {_describe_json(parsed)}")
    errors.sort(key=lambda e: (len(e.absolute_path), e.json_path))
    shown = "; ".join(f"{e.json_path}: {e.message[:200]}" for e in errors[:MAX_SCHEMA_ERRORS])
    more = len(errors) - MAX_SCHEMA_ERRORS
    extra = f" (and {more}{'+' if len(errors) > 50 else ''} more)" if more > 0 else ""
    count = f"{len(errors)}{'+' if len(errors) > 50 else ''}"
    return _outcome(False, f"{count} schema violation(s): {shown}{extra}")


_CHECKS: dict[str, Callable[[str, Any], CheckResult]] = {
    "contains": _contains,
    "not_contains": _not_contains,
    "regex": _regex_check,
    "starts_with": lambda text, value: _edge(text, value, start=True),
    "ends_with": lambda text, value: _edge(text, value, start=False),
    "max_words": lambda text, value: _length(text, value, unit="words", most=True),
    "min_words": lambda text, value: _length(text, value, unit="words", most=False),
    "max_chars": lambda text, value: _length(text, value, unit="characters", most=True),
    "min_chars": lambda text, value: _length(text, value, unit="characters", most=False),
    "valid_json": _valid_json,
    "json_schema": _json_schema,
}

CHECKS: tuple[str, ...] = tuple(_CHECKS)
"""The check names `run_check` understands."""


def run_check(text: str, check: str, value: Any = None) -> CheckResult:
    """Run one deterministic check on a text.

    Args:
        text: The text to check (usually the answer being graded).
        check: One of `CHECKS`: ``contains`` / ``not_contains`` (value: a string or list of
            strings, all must hold, case-insensitive), ``regex`` (value: a pattern for
            ``re.search``), ``starts_with`` / ``ends_with`` (value: a string; case-insensitive,
            whitespace-stripped), ``max_words`` / ``min_words`` / ``max_chars`` / ``min_chars``
            (value: an int; characters exclude leading/trailing whitespace), ``valid_json`` (no
            value) and ``json_schema`` (value: a JSON Schema dict or its JSON text).
        value: The check's argument, as above.

    Returns:
        ``{"ok", "detail"}``. An unknown check or a bad value gives ``ok=False`` with a detail
        that explains it; this function does not raise for bad arguments.

    """
    name = ""
    if isinstance(check, str):
        name = check.strip().lower().replace("-", "_").replace(" ", "_")
    runner = _CHECKS.get(name)
    if runner is None:
        return _outcome(False, f"unknown check {check!r}; valid checks: {', '.join(CHECKS)}")
    if not isinstance(text, str):
        return _outcome(False, f"text must be a string, not {type(text).__name__}")
    try:
        return runner(text, value)
    except _BadValue as exc:
        return _outcome(False, f"bad value for {name}: {exc}")
    except Exception as exc:  # the grader must get an answer, not a dead run
        return _outcome(False, f"the {name} check failed: {type(exc).__name__}: {exc}")


class _CheckTextArgs(BaseModel):
    text: str = Field(description="The text to check, exactly as written in the answer.")
    check: str = Field(description=f"The check to run, one of: {', '.join(CHECKS)}.")
    value: Any = Field(
        default=None,
        description="The check's argument: a string or list of strings (contains, "
        "not_contains), a pattern (regex), a string (starts_with, ends_with), an integer "
        "(max_words, min_words, max_chars, min_chars), a JSON Schema object (json_schema), or "
        "nothing (valid_json).",
    )


def _check_text(text: str, check: str, value: Any = None) -> CheckResult:
    return run_check(text, check, value)


check_text: StructuredTool = StructuredTool.from_function(
    func=_check_text,
    name="check_text",
    description=(
        "Run one exact check on a text and get {ok, detail}: contains / not_contains "
        "(case-insensitive), regex (re.search), starts_with / ends_with, max_words / min_words "
        "/ max_chars / min_chars, valid_json, json_schema. Use it for criteria that can be "
        "checked mechanically instead of judging by eye."
    ),
    args_schema=_CheckTextArgs,
    handle_validation_error=validation_handler("check_text"),
)
"""Tool: run one check on a text (args: text, check, value)."""


def embedded_json(answer: str) -> str:
    """The record an answer carries: its first fenced block if it has one, else the answer.

    Schema checks (`json_schema_tool`, the rules grader's schema criteria) grade the record, so
    prose around a fenced record does not hide the record's own problems (``valid_json`` is
    the check that judges the answer as a whole).
    """
    m = re.search(r"```[\w-]*\n(.*?)\n?```", answer, re.DOTALL)
    return m.group(1) if m else answer.strip()


def json_schema_tool(name: str, schema: Mapping[str, Any], *, description: str | None = None
                     ) -> BaseTool:
    """An evidence tool that validates JSON text against `schema`.

    The tool takes one argument, ``text`` (the JSON, or a fenced block holding it), and returns
    ``{"ok": bool, "detail": str}``. LLM graders may call it; the rules grader calls it for
    "validates against the JSON schema in <name>".
    """
    frozen = json.loads(json.dumps(schema))

    def validate(text: str) -> dict[str, Any]:
        return dict(run_check(embedded_json(text), "json_schema", frozen))

    return StructuredTool.from_function(
        validate,
        name=name,
        description=description
        or f"Validate JSON text against this JSON Schema: {json.dumps(frozen)}",
    )
