"""Test specs without a sandbox: checking them, and judging here what a child reports."""

from __future__ import annotations

from typing import Any

import pytest

from rubric_core.tools.testspec import assemble, check_spec, run_result

CASES = [
    {"name": "one", "call": "f()", "expected": 1},
    {"name": "boom", "call": "g()", "raises": "builtins.ValueError"},
]


def _events(*reports: dict[str, Any], done: bool = True) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for report in reports:
        events += [{"event": "start", "name": report["name"]}, {"event": "result", **report}]
    return events + ([{"event": "done"}] if done else [])


def test_named_cases_are_judged_here_not_by_the_child() -> None:
    # A child that says "ok" for a wrong value and a wrong exception gets no pass from it.
    events = _events(
        {"name": "one", "ok": True, "value": 2},
        {"name": "boom", "ok": True, "raised": ["builtins.KeyError"], "error": "KeyError: x"},
    )
    result = assemble(events, None, "", "", CASES)
    assert result["ok"] is False and result["passed"] == []
    assert result["failures"] == [
        {"name": "one", "reason": "expected 1, got 2"},
        {"name": "boom", "reason": "expected ValueError to be raised, got KeyError: x"},
    ]


@pytest.mark.parametrize(
    ("value", "passes"),
    [
        pytest.param(1, True, id="int"),
        pytest.param(1.0, True, id="equal_float"),
        pytest.param(True, False, id="bool_is_not_one"),
    ],
)
def test_true_is_not_the_number_one(value: object, passes: bool) -> None:
    result = assemble(_events({"name": "one", "value": value}), None, "", "", CASES[:1])
    assert result["ok"] is passes


def test_a_class_that_only_borrows_the_name_does_not_match() -> None:
    report = {"name": "boom", "raised": ["solution.ValueError"], "error": "ValueError: no"}
    result = assemble(_events(report), None, "", "", CASES[1:])
    assert "only shares the name: it is solution.ValueError" in result["failures"][0]["reason"]


def test_cases_the_child_never_reached_are_reported_as_not_run() -> None:
    events = [*_events({"name": "one", "value": 1}, done=False), {"event": "start", "name": "boom"}]
    result = assemble(events, "timed out after 1.0 s", "out", "err", CASES)
    assert result == run_result(
        passed=["one"],
        failures=[{"name": "boom", "reason": "timed out after 1.0 s"}],
        error="timed out after 1.0 s",
        stdout="out",
        stderr="err",
    )
    silent = assemble([], None, "", "", CASES)
    assert silent["error"] == "the sandbox stopped without reporting results"
    assert [f["reason"] for f in silent["failures"]] == ["not run (see error)"] * 2


def test_a_name_the_parent_never_sent_is_ignored() -> None:
    events = _events({"name": "one", "value": 1}, {"name": "forged", "ok": True, "value": 1})
    result = assemble(events, None, "", "", CASES[:1])
    assert result["passed"] == ["one"] and result["failures"] == []


@pytest.mark.parametrize(
    ("tests", "function", "want"),
    [
        pytest.param('[{"call": "f()", "raises": "ValueError"}]', None,
                     ([{"name": "case_1", "call": "f()", "raises": "builtins.ValueError"}], None,
                      ""), id="json_list_string_is_cases"),
        pytest.param("def test_a(): pass", None, (None, "def test_a(): pass", ""),
                     id="source"),
        pytest.param([{"args": [1], "expected": 1}], None,
                     (None, None, "test case 'case_1' uses 'args', so 'function' must name the "
                      "function to call"), id="args_without_function"),
        pytest.param([{"call": "f()", "raises": "NotAnError"}], None,
                     (None, None, "test case 'case_1': 'raises': 'NotAnError' is not a built-in "
                      "exception; name another class by its module path, like "
                      "'json.JSONDecodeError' or 'solution.MyError'"), id="unknown_builtin"),
    ],
)
def test_check_spec(tests: object, function: str | None, want: tuple[Any, ...]) -> None:
    assert check_spec(tests, function, 10) == want
