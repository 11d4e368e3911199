"""Deterministic text checks and the check_text tool."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from rubric_core.tools import checks
from rubric_core.tools.checks import CHECKS, check_text, run_check

PRODUCT_SCHEMA = {
    "type": "object",
    "required": ["name", "price", "tags"],
    "properties": {
        "name": {"type": "string"},
        "price": {"type": "number", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
}


@pytest.mark.parametrize(
    ("text", "check", "value", "ok", "detail"),
    [
        # contains / not_contains
        pytest.param("Hello World", "contains", "world", True, "contains 'world'", id="contains"),
        pytest.param("Hello World", "contains", ["hello", "WORLD"], True, "contains",
                     id="contains_all_of_a_list"),
        pytest.param("Hello World", "contains", ["hello", "moon"], False,
                     "missing 'moon' (1 of 2 found", id="contains_reports_missing"),
        pytest.param("Hello World", "not_contains", ["moon", "sun"], True, "contains none of",
                     id="not_contains"),
        pytest.param("Hello World", "not_contains", "WORLD", False, "'WORLD' at character 6",
                     id="not_contains_reports_position"),
        # regex
        pytest.param("order #1234 shipped", "regex", r"#\d+", True, "matched '#1234' at "
                     "character 6", id="regex_match"),
        pytest.param("no digits", "regex", r"\d", False, "no match", id="regex_no_match"),
        pytest.param("x", "regex", "(unclosed", False, "invalid regular expression",
                     id="regex_bad_pattern"),
        # starts_with / ends_with
        pytest.param("  Dear Sir,\nbody\nRegards  ", "starts_with", "dear sir", True, "starts",
                     id="starts_with_stripped_and_case_insensitive"),
        pytest.param("Hi there", "starts_with", "Hello", False, "starts with 'Hi there'",
                     id="starts_with_shows_actual_start"),
        pytest.param("Thanks.\nKind regards\n", "ends_with", " KIND REGARDS ", True, "ends",
                     id="ends_with"),
        pytest.param("Thanks.", "ends_with", "bye", False, "not 'bye'", id="ends_with_fails"),
        # lengths
        pytest.param("one two three", "max_words", 3, True, "3 words (max 3)", id="max_words_edge"),
        pytest.param("one two three", "max_words", 2, False, "3 words (max 2)", id="max_words"),
        pytest.param("one two three", "min_words", "3", True, "3 words (min 3)",
                     id="min_words_digit_string"),
        pytest.param("  abc  ", "max_chars", 3, True, "3 characters (max 3)",
                     id="max_chars_ignores_outer_whitespace"),
        pytest.param("abc", "min_chars", 4.0, False, "3 characters (min 4)",
                     id="min_chars_whole_float"),
        # JSON
        pytest.param('{"a": 1}', "valid_json", None, True, "an object with 1 key(s)",
                     id="valid_json"),
        pytest.param('```json\n[1, 2]\n```', "valid_json", None, True, "an array of 2 item(s)",
                     id="valid_json_fenced"),
        pytest.param("Sure!\n```json\n{}\n```\n", "valid_json", None, False,
                     "fenced block with other text around it", id="prose_around_fence"),
        pytest.param('{"a": NaN}', "valid_json", None, False, "NaN is not valid JSON",
                     id="nan_rejected"),
        pytest.param('{"a": 1,}', "valid_json", None, False, "(line 1, column 9)",
                     id="invalid_json_position"),
        pytest.param("   ", "valid_json", None, False, "the text is empty", id="empty_json"),
    ],
)
def test_checks(text: str, check: str, value: Any, ok: bool, detail: str) -> None:
    result = run_check(text, check, value)
    assert result["ok"] is ok, result
    assert detail in result["detail"], result


@pytest.mark.parametrize(
    ("text", "schema", "ok", "details"),
    [
        pytest.param('{"name": "Bottle", "price": 12.5, "tags": ["steel"]}', PRODUCT_SCHEMA,
                     True, ["matches the schema"], id="valid"),
        pytest.param('```json\n{"name": "B", "price": 1, "tags": []}\n```', PRODUCT_SCHEMA,
                     True, ["matches the schema"], id="fenced"),
        pytest.param('{"name": "B", "price": 1, "tags": []}', json.dumps(PRODUCT_SCHEMA),
                     True, ["matches the schema"], id="schema_as_json_text"),
        pytest.param('{"name": 3, "price": -1, "tags": ["a", 2]}', PRODUCT_SCHEMA, False,
                     ["3 schema violation(s)", "$.name: 3 is not of type 'string'",
                      "$.price: -1 is less than the minimum of 0", "$.tags[1]: 2 is not of type"],
                     id="violations_with_json_paths"),
        pytest.param("{}", PRODUCT_SCHEMA | {"properties": {}, "required": list("abcde")}, False,
                     ["5 schema violation(s)", "(and 2 more)"], id="first_few_only"),
        pytest.param("not json", PRODUCT_SCHEMA, False, ["invalid JSON"], id="text_not_json"),
        pytest.param("{}", {"type": "nonsense"}, False, ["invalid JSON Schema"],
                     id="invalid_schema"),
        pytest.param("{}", {"$ref": "https://example.invalid/schema.json"}, False,
                     ["could not validate", "Unresolvable"], id="remote_ref_not_fetched"),
    ],
)
def test_json_schema(text: str, schema: Any, ok: bool, details: list[str]) -> None:
    result = run_check(text, "json_schema", schema)
    assert result["ok"] is ok, result
    for detail in details:
        assert detail in result["detail"], result


@pytest.mark.parametrize(
    ("check", "value", "detail"),
    [
        pytest.param("contains", None, "bad value for contains: expected a string or a",
                     id="contains_none"),
        pytest.param("contains", [], "bad value for contains", id="contains_empty_list"),
        pytest.param("not_contains", ["a", 1], "expected only non-empty strings",
                     id="not_contains_mixed"),
        pytest.param("regex", "", "bad value for regex", id="regex_empty"),
        pytest.param("starts_with", 5, "bad value for starts_with", id="starts_with_int"),
        pytest.param("max_words", -1, "expected a non-negative integer", id="negative"),
        pytest.param("max_words", True, "expected a non-negative integer", id="bool"),
        pytest.param("min_chars", "many", "expected a non-negative integer", id="word"),
        pytest.param("json_schema", "{not json", "got text that is not JSON", id="schema_text"),
        pytest.param("json_schema", [1], "expected a JSON Schema object", id="schema_list"),
    ],
)
def test_bad_values_are_explained(check: str, value: Any, detail: str) -> None:
    result = run_check("some text", check, value)
    assert result["ok"] is False
    assert detail in result["detail"], result


@pytest.mark.parametrize(
    "check",
    [pytest.param("spellcheck", id="unknown"), pytest.param(None, id="not_a_string")],
)
def test_unknown_check_lists_the_valid_ones(check: Any) -> None:
    result = run_check("text", check)
    assert result["ok"] is False
    assert "valid checks: " + ", ".join(CHECKS) in result["detail"]


def test_check_names_are_normalised() -> None:
    assert run_check("abc", " Not-Contains ", "z")["ok"] is True
    assert run_check("abc", "MAX WORDS", 1)["ok"] is True


def test_text_must_be_a_string() -> None:
    result = run_check(None, "contains", "a")  # type: ignore[arg-type]
    assert result == {"ok": False, "detail": "text must be a string, not NoneType"}


def test_catastrophic_regex_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checks, "REGEX_TIMEOUT_S", 0.2)
    started = time.monotonic()
    result = run_check("a" * 80 + "b", "regex", r"(a|aa)+$")  # unbounded: ages
    assert time.monotonic() - started < 30
    assert result["ok"] is False
    assert "took longer than 0.2 s" in result["detail"]


def test_check_text_tool() -> None:
    assert check_text.name == "check_text"
    assert list(check_text.args) == ["text", "check", "value"]
    assert check_text.invoke({"text": "a b c", "check": "max_words", "value": 3}) == {
        "ok": True,
        "detail": "3 words (max 3)",
    }
    assert check_text.invoke({"text": "{}", "check": "valid_json"})["ok"] is True
    schema_result = check_text.invoke(
        {"text": '{"name": "x"}', "check": "json_schema", "value": PRODUCT_SCHEMA}
    )
    assert "'price' is a required property" in schema_result["detail"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param({"check": "contains"}, "text: Field required", id="missing_text"),
        pytest.param({"text": "x", "check": 5}, "check: Input should be a valid string",
                     id="check_not_string"),
    ],
)
def test_check_text_tool_reports_invalid_arguments(args: dict[str, Any], message: str) -> None:
    out = check_text.invoke(args)
    assert isinstance(out, str) and out.startswith("Invalid arguments for check_text: ")
    assert message in out


# --------------------------------------------------------------------------- json_schema_tool


@pytest.mark.parametrize(
    ("answer", "record"),
    [
        pytest.param('  {"a": 1}\n', '{"a": 1}', id="bare"),
        pytest.param('Here it is:\n```json\n{"a": 1}\n```\nDone.', '{"a": 1}',
                     id="fenced_in_prose"),
        pytest.param('```\n[1]\n```\n```json\n{"b": 2}\n```', "[1]", id="first_fence_wins"),
    ],
)
def test_embedded_json_takes_the_first_fenced_block(answer: str, record: str) -> None:
    assert checks.embedded_json(answer) == record


def test_json_schema_tool_validates_the_record_it_is_given() -> None:
    tool = checks.json_schema_tool("validate_product", PRODUCT_SCHEMA)
    assert tool.name == "validate_product"
    assert '"price"' in tool.description  # the grader can read the schema it checks against
    good = 'The record:\n```json\n{"name": "Mug", "price": 9.5, "tags": ["kitchen"]}\n```'
    assert tool.invoke({"text": good})["ok"] is True
    bad = tool.invoke({"text": '{"name": "Mug", "price": -1, "tags": []}'})
    assert bad["ok"] is False and "price" in bad["detail"]
    broken = tool.invoke({"text": "{not json"})
    assert broken["ok"] is False and broken["detail"]


def test_json_schema_tool_is_not_changed_by_later_edits_to_the_schema() -> None:
    schema: dict[str, Any] = {"type": "object", "required": ["a"]}
    tool = checks.json_schema_tool("t", schema, description="Check the record.")
    schema["required"] = ["b"]
    assert tool.description == "Check the record."
    assert tool.invoke({"text": '{"a": 1}'})["ok"] is True
