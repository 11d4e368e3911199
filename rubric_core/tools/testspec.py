"""Test specs for candidate Python: checking them before a run, judging outcomes after it.

Pure functions, no processes. `check_spec` normalises what a caller or a grader wrote (named
cases, or pytest-style test source) or says what is wrong with it; `assemble` turns the events
the sandboxed child reported (`rubric_core.tools.sandbox.run_child`) into a `TestRunResult`.
For named cases every verdict is made here, outside the sandbox: the child only said what each
call returned or raised, and never saw what it should have (`_judge`). For a test source the
child's own verdicts are taken, so they are only as trustworthy as the candidate is cooperative.
`rubric_core.tools.python_tests.run_tests` puts the three steps together.
"""

from __future__ import annotations

import builtins
import json
import re
from typing import Any

MAX_TIMEOUT_S = 300.0
"""The largest timeout `run_tests` accepts."""

MAX_SOURCE_CHARS = 200_000
"""Longest candidate code or test source accepted."""

MAX_CASES = 200
"""Most test cases one run accepts."""

_DOTTED_NAME = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")

TestRunResult = dict[str, Any]
"""``{"ok", "passed", "failures", "error", "stdout", "stderr", "sandbox"}``: ``ok`` is true only
when every test ran and passed; ``passed`` lists test names in run order; ``failures`` holds
``{"name", "reason"}`` for tests that failed or never ran; ``error`` describes a problem with the
run as a whole (bad arguments, no sandbox, timeout, crash, code that does not load) or is None;
``stdout`` and ``stderr`` hold the head and tail of the candidate's output (capped);
``sandbox`` is the mode the code ran in (``bwrap`` or ``unsafe-process``), or None when nothing
ran."""


def run_result(
    *,
    ok: bool = False,
    passed: list[str] | None = None,
    failures: list[dict[str, str]] | None = None,
    error: str | None = None,
    stdout: str = "",
    stderr: str = "",
    sandbox: str | None = None,
) -> TestRunResult:
    """Build a `TestRunResult` with every key present.

    Args:
        ok: Whether every test ran and passed.
        passed: Names of the tests that passed, in run order.
        failures: ``{"name", "reason"}`` for tests that failed or never ran.
        error: What went wrong with the run as a whole, or None.
        stdout: The head of the candidate's standard output.
        stderr: The tail of the candidate's standard error.
        sandbox: The mode the code ran in, or None when nothing ran.

    Returns:
        The result dict.

    """
    return {
        "ok": ok,
        "passed": passed or [],
        "failures": failures or [],
        "error": error,
        "stdout": stdout,
        "stderr": stderr,
        "sandbox": sandbox,
    }


def _check_cases(cases: list[Any], function: str | None) -> tuple[list[dict[str, Any]], str]:
    """Normalise test cases, or explain the first problem (empty string when none)."""
    if not cases:
        return [], "tests is an empty list: give at least one case"
    if len(cases) > MAX_CASES:
        return [], f"too many test cases ({len(cases)}; at most {MAX_CASES})"
    normal: list[dict[str, Any]] = []
    seen: set[str] = set()
    for index, case in enumerate(cases, start=1):
        where = f"test case {index}"
        if not isinstance(case, dict):
            return [], f"{where} is a {type(case).__name__}, not an object"
        name = case.get("name", f"case_{index}")
        if not isinstance(name, str) or not name.strip():
            return [], f"{where}: 'name' must be a non-empty string"
        name = name.strip()
        if name in seen:
            return [], f"{where}: duplicate test name {name!r}"
        seen.add(name)
        where = f"test case {name!r}"
        item: dict[str, Any] = {"name": name}
        if ("call" in case) == ("args" in case):
            return [], f"{where}: give exactly one of 'call' (an expression) or 'args' (a list)"
        if "call" in case:
            if not isinstance(case["call"], str) or not case["call"].strip():
                return [], f"{where}: 'call' must be a non-empty expression string"
            item["call"] = case["call"].strip()
        else:
            if not isinstance(case["args"], list):
                return [], f"{where}: 'args' must be a list of positional arguments"
            if function is None:
                return [], f"{where} uses 'args', so 'function' must name the function to call"
            item["args"] = case["args"]
            kwargs = case.get("kwargs", {})
            if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
                return [], f"{where}: 'kwargs' must be an object of keyword arguments"
            item["kwargs"] = kwargs
        if "raises" in case:
            wanted, problem = _exception_path(case["raises"])
            if problem:
                return [], f"{where}: {problem}"
            item["raises"] = wanted
        elif "expected" in case:
            item["expected"] = case["expected"]
        else:
            return [], f"{where}: give 'expected' (the JSON value the call should return)"
        try:
            json.dumps(item, allow_nan=False)
        except (TypeError, ValueError) as exc:
            return [], f"{where} is not plain JSON data: {exc}"
        normal.append(item)
    return normal, ""


def _exception_path(raises: object) -> tuple[str, str]:
    """The dotted path an expected exception is matched by: (path, problem)."""
    if not isinstance(raises, str) or not _DOTTED_NAME.match(raises.strip()):
        return "", ("'raises' must be an exception class: a builtin name like 'ValueError' or a "
                    "module path like 'json.JSONDecodeError'")
    path = raises.strip().removeprefix("builtins.")
    if "." in path:
        return path, ""
    builtin = getattr(builtins, path, None)
    if not (isinstance(builtin, type) and issubclass(builtin, BaseException)):
        return "", (f"'raises': {path!r} is not a built-in exception; name another class by its "
                    "module path, like 'json.JSONDecodeError' or 'solution.MyError'")
    return "builtins." + path, ""


def check_spec(
    tests: object, function: object, timeout_s: object
) -> tuple[list[dict[str, Any]] | None, str | None, str]:
    """Validate a test spec before anything runs.

    Args:
        tests: A list of cases, pytest-style test source, or a string holding a JSON list of
            cases (see `rubric_core.tools.python_tests.run_tests`).
        function: The function ``args`` cases call, or None.
        timeout_s: The wall-clock limit asked for, in seconds.

    Returns:
        ``(cases, source, problem)``: without a problem exactly one of ``cases`` (normalised:
        names stripped, ``raises`` as a dotted path) and ``source`` is set; otherwise
        ``problem`` says what to fix.

    """
    if function is not None and (not isinstance(function, str) or not _DOTTED_NAME.match(function)):
        return None, None, f"function must be a Python name like 'solve', not {function!r}"
    if (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, int | float)
        or not 0 < timeout_s <= MAX_TIMEOUT_S  # also false for NaN
    ):
        return None, None, f"timeout_s must be a number of seconds in (0, {MAX_TIMEOUT_S:g}]"
    if isinstance(tests, str):
        text = tests.strip()
        if not text:
            return None, None, "tests is empty: give test cases or pytest-style test source"
        if len(text) > MAX_SOURCE_CHARS:
            return None, None, f"the test source is too long (over {MAX_SOURCE_CHARS} characters)"
        if text.startswith("["):
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = None
            if isinstance(parsed, list):
                tests = parsed
        if isinstance(tests, str):
            return None, tests, ""
    if not isinstance(tests, list):
        return None, None, (
            "tests must be a list of cases ({'name', 'call' or 'args', 'expected'}) or a string "
            f"of pytest-style test functions, not {type(tests).__name__}"
        )
    cases, problem = _check_cases(tests, function if isinstance(function, str) else None)
    return (cases or None), None, problem


def _clip(text: object, limit: int) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "... [truncated]"


def _shown(path: str) -> str:
    return path.removeprefix("builtins.")


def _same_json(actual: object, expected: object) -> bool:
    """JSON equality where ``true``/``false`` are not the numbers 1 and 0 (as Python's are).

    Otherwise a candidate returning ``True`` would pass a case expecting ``1``, and ``[1, 0]``
    one expecting ``[true, false]``. Integers and floats of equal value stay equal.
    """
    if isinstance(actual, bool) or isinstance(expected, bool):
        return type(actual) is type(expected) and actual == expected
    if isinstance(actual, list) and isinstance(expected, list):
        return len(actual) == len(expected) and all(
            _same_json(a, e) for a, e in zip(actual, expected, strict=True))
    if isinstance(actual, dict) and isinstance(expected, dict):
        return actual.keys() == expected.keys() and all(
            _same_json(actual[key], expected[key]) for key in expected)
    return actual == expected


def _judge(case: dict[str, Any], report: dict[str, Any]) -> tuple[bool, str]:
    """Compare what the child says one case did with what the case expects."""
    raised = report.get("raised")
    if isinstance(raised, list):
        wanted = case.get("raises")
        error = str(report.get("error") or "raised an exception")
        if wanted and wanted in raised:
            return True, ""
        if wanted:
            reason = f"expected {_shown(wanted)} to be raised, got {error}"
            first = raised[0] if raised and isinstance(raised[0], str) else None
            if first is None or first.rpartition(".")[2] == wanted.rpartition(".")[2]:
                where = f"it is {first}" if first else "it has no importable path"
                reason += f" (a different class that only shares the name: {where})"
            return False, reason
        return False, error
    if "error" in report:
        return False, str(report["error"])
    if "raises" in case:
        return False, f"expected {_shown(case['raises'])} to be raised, but it returned normally"
    expected = json.dumps(case["expected"])
    if "unjsonable" in report:
        return False, (f"expected {_clip(expected, 200)}, got a value that is not "
                       f"JSON-comparable ({report['unjsonable']})")
    if "value" not in report:
        return False, "the sandbox reported no outcome for this case"
    if _same_json(report["value"], json.loads(expected)):
        return True, ""
    return False, f"expected {_clip(expected, 200)}, got {_clip(json.dumps(report['value']), 200)}"


def assemble(
    events: list[dict[str, Any]],
    run_error: str | None,
    stdout: str,
    stderr: str,
    cases: list[dict[str, Any]] | None = None,
) -> TestRunResult:
    """Turn child events (and a run-level error, if the child never finished) into a result.

    With named ``cases`` the case list and every verdict come from this process; the child
    only says what each call returned or raised. For a test source, its verdicts are taken.

    Args:
        events: What the child reported, in order (``collected``, ``start``, ``result``,
            ``fatal``, ``done``).
        run_error: Why the run as a whole failed (a timeout, a broken limit, a crash), or None.
        stdout: The head of the child's standard output.
        stderr: The tail of the child's standard error.
        cases: The checked cases, answers included, or None for a test source.

    Returns:
        A `TestRunResult` whose ``sandbox`` is None; the caller fills in the mode.

    """
    by_name = {case["name"]: case for case in cases or []}
    names: list[str] = list(by_name)
    outcomes: dict[str, tuple[bool, str]] = {}
    running: str | None = None
    error = run_error
    done = False
    for event in events:
        kind = event.get("event")
        if kind == "collected" and cases is None and isinstance(event.get("names"), list):
            names = [str(name) for name in event["names"]]
        elif kind == "start":
            running = str(event.get("name"))
        elif kind == "result":
            name = str(event.get("name"))
            if cases is None:
                outcomes[name] = (event.get("ok") is True, str(event.get("reason") or "failed"))
            elif name in by_name and name not in outcomes:
                outcomes[name] = _judge(by_name[name], event)
            running = None
        elif kind == "fatal":
            error = str(event.get("error"))
        elif kind == "done":
            done = True
    if not done and error is None:
        error = "the sandbox stopped without reporting results"
    passed = [name for name, (ok, _) in outcomes.items() if ok]
    failures = [
        {"name": name, "reason": reason} for name, (ok, reason) in outcomes.items() if not ok
    ]
    if running is not None and running not in outcomes and (cases is None or running in by_name):
        failures.append({"name": running, "reason": error or "did not finish"})
    for name in names:
        if name not in outcomes and name != running:
            failures.append({"name": name, "reason": "not run (see error)"})
    return run_result(
        ok=error is None and not failures and bool(passed),
        passed=passed,
        failures=failures,
        error=error,
        stdout=stdout,
        stderr=stderr,
    )
