"""The Python test sandbox: case and source tests, argument checks, hostile candidate code, the
LangChain tools built on it, and the names the sandbox module keeps exporting."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest
from langchain_core.messages import ToolMessage

import rubric_core.tools as tools_pkg
from rubric_core.tools import python_tests, sandbox, testspec
from rubric_core.tools.fences import extract_python_code
from rubric_core.tools.python_tests import python_tests_tool, run_python_tests, run_tests

HOSTILE_TIMEOUT_S = 1.5
# For code that ends at once by itself (an exit, a signal): a timeout it never comes near, also
# when a loaded machine starts the sandbox slowly.
QUICK_END_TIMEOUT_S = 10.0
# A run that must be stopped by its timeout or a limit ends within this much past the timeout:
# a bound far from both (a second on a quiet machine; the code's own 30 s sleeps if not killed).
SLACK_S = 15.0

FIND_DUPLICATES_CASES: list[dict[str, Any]] = [
    {"name": "basic", "args": [[1, 2, 2, 3, 1]], "expected": [2, 1]},
    {"name": "empty", "args": [[]], "expected": []},
    {"name": "no_duplicates", "args": [[1, 2, 3]], "expected": []},
    {"name": "unhashable", "args": [[[1], [1], 2]], "expected": [[1]]},
]
FIND_DUPLICATES_OK = """
def find_duplicates(items):
    seen, dupes = [], []
    for item in items:
        if item in seen and item not in dupes:
            dupes.append(item)
        seen.append(item)
    return dupes
"""
FIND_DUPLICATES_SET_DRAFT = """
def find_duplicates(items):
    seen = set()
    dupes = []
    for item in items:
        if item in seen and item not in dupes:
            dupes.append(item)
        seen.add(item)
    return dupes
"""


def _failure(result: dict[str, Any], name: str) -> str:
    reasons = [f["reason"] for f in result["failures"] if f["name"] == name]
    assert reasons, f"no failure named {name!r} in {result}"
    return reasons[0]


# --------------------------------------------------------------------------- find_duplicates


def test_correct_find_duplicates_passes_every_case() -> None:
    result = run_tests(FIND_DUPLICATES_OK, FIND_DUPLICATES_CASES, function="find_duplicates")
    assert result == {
        "ok": True,
        "passed": ["basic", "empty", "no_duplicates", "unhashable"],
        "failures": [],
        "error": None,
        "stdout": "",
        "stderr": "",
        "sandbox": "bwrap",
    }


def test_set_based_draft_fails_only_unhashable_with_a_type_error() -> None:
    result = run_tests(
        FIND_DUPLICATES_SET_DRAFT, FIND_DUPLICATES_CASES, function="find_duplicates"
    )
    assert result["ok"] is False and result["error"] is None
    assert result["passed"] == ["basic", "empty", "no_duplicates"]
    [failure] = result["failures"]
    assert failure["name"] == "unhashable"
    assert failure["reason"].startswith("TypeError: unhashable type: 'list'")
    assert "<solution> line" in failure["reason"]  # points at the candidate's line


# --------------------------------------------------------------------------- test specs


@pytest.mark.parametrize(
    ("code", "tests", "function", "passed", "failed"),
    [
        pytest.param(
            "def add(a, b):\n    return a + b\n",
            [{"name": "call", "call": "add(2, 3)", "expected": 5}],
            None, ["call"], {}, id="call_expression",
        ),
        pytest.param(
            "def pair(a, b=0):\n    return (a, b)\n",
            [{"name": "kw", "args": [1], "kwargs": {"b": 2}, "expected": [1, 2]}],
            "pair", ["kw"], {}, id="args_kwargs_and_tuple_equals_json_list",
        ),
        pytest.param(
            "def f():\n    return {1: (2, 3)}\n",
            [{"name": "keys", "call": "f()", "expected": {"1": [2, 3]}}],
            None, ["keys"], {}, id="values_compared_after_json_normalising",
        ),
        pytest.param(
            "def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x\n",
            [{"name": "neg", "args": [-1], "raises": "ValueError"},
             {"name": "pos", "args": [1], "raises": "ValueError"}],
            "f", ["neg"], {"pos": "expected ValueError to be raised"}, id="raises",
        ),
        pytest.param(
            "def f():\n    return [1, 2]\n",
            [{"name": "order", "call": "f()", "expected": [2, 1]}],
            None, [], {"order": "expected [2, 1], got [1, 2]"}, id="mismatch_shows_both",
        ),
        pytest.param(
            "def f():\n    return {1, 2}\n",
            [{"name": "set", "call": "f()", "expected": [1, 2]}],
            None, [], {"set": "not JSON-comparable"}, id="set_is_not_a_json_list",
        ),
        pytest.param(
            "def other():\n    pass\n",
            [{"name": "missing", "args": [], "expected": 1}],
            "solve", [], {"missing": "does not define 'solve'"}, id="function_not_defined",
        ),
        pytest.param(
            "x = 1\n",
            [{"name": "syntax", "call": "x +", "expected": 1}],
            None, [], {"syntax": "does not compile"}, id="bad_call_expression",
        ),
        pytest.param(
            "def f(x):\n    return x * 2\n",
            '[{"name": "json_text", "call": "f(2)", "expected": 4}]',
            None, ["json_text"], {}, id="json_list_string_read_as_cases",
        ),
        pytest.param(
            "def f(x):\n    return x * 2\n",
            "def test_ok():\n    assert f(2) == 4\n\n"
            "def test_bad():\n    assert f(2) == 5\n\n"
            "def test_msg():\n    assert f(1) == 3, 'f(1) should be 3'\n\n"
            "class TestGroup:\n    def test_import(self):\n"
            "        from solution import f as g\n        assert g(0) == 0\n\n"
            "def test_fixture(tmp_path):\n    pass\n\n"
            "async def test_async():\n    assert f(3) == 6\n",
            None,
            ["test_ok", "TestGroup.test_import", "test_async"],
            {
                "test_bad": "assertion failed (at <tests> line 5: assert f(2) == 5)",
                "test_msg": "AssertionError: f(1) should be 3",
                "test_fixture": "fixtures are not supported",
            },
            id="pytest_style_source",
        ),
    ],
)
def test_specs(
    code: str, tests: Any, function: str | None, passed: list[str], failed: dict[str, str]
) -> None:
    result = run_tests(code, tests, function=function, timeout_s=5)
    assert result["error"] is None, result
    assert result["passed"] == passed
    assert {f["name"] for f in result["failures"]} == set(failed)
    for name, reason in failed.items():
        assert reason in _failure(result, name)
    assert result["ok"] is (not failed)


def test_source_without_tests_is_an_error() -> None:
    result = run_tests("x = 1", "def helper():\n    pass\n")
    assert result["ok"] is False
    assert "defines no test functions" in str(result["error"])


def test_candidate_that_does_not_compile_reports_the_line() -> None:
    result = run_tests("def f(:\n    pass", [{"name": "a", "call": "1", "expected": 1}])
    assert result["ok"] is False
    assert str(result["error"]).startswith("the candidate code does not compile: SyntaxError")
    assert result["failures"] == [{"name": "a", "reason": "not run (see error)"}]


def test_sys_exit_while_loading_is_reported() -> None:
    result = run_tests("import sys\nsys.exit(0)", [{"name": "a", "call": "1", "expected": 1}])
    assert result["ok"] is False
    assert "called sys.exit(0)" in str(result["error"])


def test_output_is_returned_capped() -> None:
    result = run_tests(
        "print('hello from the candidate')\nimport sys\nprint('oops', file=sys.stderr)",
        [{"name": "a", "call": "1", "expected": 1}],
    )
    assert result["ok"] is True
    assert result["stdout"] == "hello from the candidate\n"
    assert result["stderr"] == "oops\n"


# --------------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"code": ""}, "code must be a non-empty string", id="empty_code"),
        pytest.param({"code": None}, "code must be a non-empty string", id="code_not_str"),
        pytest.param({"code": "x" * 200_001}, "code is too long", id="code_too_long"),
        pytest.param({"tests": None}, "tests must be a list of cases", id="tests_none"),
        pytest.param({"tests": 5}, "tests must be a list of cases", id="tests_int"),
        pytest.param({"tests": []}, "empty list", id="no_cases"),
        pytest.param({"tests": "   "}, "tests is empty", id="blank_source"),
        pytest.param({"tests": [1]}, "is a int, not an object", id="case_not_dict"),
        pytest.param({"tests": [{"name": "a", "call": "1"}]}, "give 'expected'", id="no_expected"),
        pytest.param(
            {"tests": [{"name": "a", "args": [1], "expected": 1}]},
            "'function' must name the function", id="args_without_function",
        ),
        pytest.param(
            {"tests": [{"name": "a", "call": "1", "args": [], "expected": 1}]},
            "exactly one of 'call'", id="call_and_args",
        ),
        pytest.param(
            {"tests": [{"name": "a", "call": "1", "expected": 1}] * 2},
            "duplicate test name 'a'", id="duplicate_names",
        ),
        pytest.param(
            {"tests": [{"name": "a", "call": "1", "expected": {1, 2}}]},
            "not plain JSON data", id="expected_not_json",
        ),
        pytest.param(
            {"tests": [{"name": "a", "args": [], "raises": "not a name"}], "function": "f"},
            "'raises' must be an exception class", id="bad_raises",
        ),
        pytest.param(
            {"tests": [{"name": "a", "args": [], "raises": "NoSuchError"}], "function": "f"},
            "'NoSuchError' is not a built-in exception", id="unknown_builtin_raises",
        ),
        pytest.param({"cpu_s": 0}, "cpu_s must be", id="zero_cpu"),
        pytest.param(
            {"tests": [{"name": "a", "args": [], "raises": "print"}], "function": "f"},
            "'print' is not a built-in exception", id="raises_not_an_exception",
        ),
        pytest.param({"function": "f()"}, "function must be a Python name", id="bad_function"),
        pytest.param({"timeout_s": 0}, "timeout_s must be", id="zero_timeout"),
        pytest.param({"timeout_s": float("nan")}, "timeout_s must be", id="nan_timeout"),
        pytest.param({"timeout_s": True}, "timeout_s must be", id="bool_timeout"),
        pytest.param({"timeout_s": "10"}, "timeout_s must be", id="str_timeout"),
        pytest.param({"timeout_s": 10_000}, "timeout_s must be", id="huge_timeout"),
        pytest.param({"memory_mb": 8}, "memory_mb must be", id="tiny_memory"),
        pytest.param({"memory_mb": 512.0}, "memory_mb must be", id="float_memory"),
    ],
)
def test_bad_arguments_come_back_as_errors(kwargs: dict[str, Any], message: str) -> None:
    call: dict[str, Any] = {"code": "x = 1", "tests": [{"name": "a", "call": "x", "expected": 1}]}
    call.update(kwargs)
    code, tests = call.pop("code"), call.pop("tests")
    result = run_tests(code, tests, **call)
    assert result["ok"] is False and result["passed"] == [] and result["failures"] == []
    assert message in str(result["error"])


# --------------------------------------------------------------------------- hostile code

ONE_CASE = [{"name": "probe", "call": "probe()", "expected": True}]


@pytest.mark.parametrize(
    ("code", "timeout_s", "error", "reason"),
    [
        pytest.param(
            "while True:\n    pass\n", HOSTILE_TIMEOUT_S,
            "timed out after 1.5 s", None, id="infinite_loop_at_import",
        ),
        pytest.param(
            "def probe():\n    while True:\n        pass\n", HOSTILE_TIMEOUT_S,
            "timed out after 1.5 s", "timed out after 1.5 s", id="infinite_loop_in_a_test",
        ),
        pytest.param(
            "blob = bytearray(64 * 1024 ** 3)\n", 5,
            "memory limit exceeded (128 MB)", None, id="memory_bomb_bytearray",
        ),
        pytest.param(
            "def probe():\n    hog = []\n    while True:\n        hog.append(' ' * 10**6)\n", 5,
            None, "memory limit exceeded (128 MB)", id="memory_bomb_list_growth",
        ),
        pytest.param(
            "import os\nos._exit(3)\n", QUICK_END_TIMEOUT_S,
            "process exited with code 3 before reporting results", None, id="os_exit_3",
        ),
        pytest.param(
            "def probe():\n    import os\n    os._exit(0)\n", QUICK_END_TIMEOUT_S,
            "process exited with code 0 before reporting results",
            "process exited with code 0", id="os_exit_0_mid_test",
        ),
        pytest.param(
            "import ctypes\nctypes.string_at(0)\n", QUICK_END_TIMEOUT_S,
            "killed by signal SIGSEGV", None, id="segfault_via_ctypes",
        ),
        pytest.param(
            "import os\nos.abort()\n", QUICK_END_TIMEOUT_S,
            "killed by signal SIGABRT", None, id="abort_signal",
        ),
        pytest.param(
            "def probe():\n    while True:\n        print('x' * 10**6)\n", 5,
            None, "output/file size limit exceeded", id="output_flood",
        ),
        pytest.param(
            "def probe():\n    with open('big.bin', 'wb') as f:\n        f.write(b'x' * 10**7)\n",
            5, None, "output/file size limit exceeded", id="file_size_limit",
        ),
        pytest.param(
            "import resource\ndef probe():\n"
            "    resource.setrlimit(resource.RLIMIT_AS, (-1, -1))\n",
            QUICK_END_TIMEOUT_S, None, "not allowed to raise maximum limit", id="raise_rlimits",
        ),
        pytest.param(
            "import os\nwhile True:\n    os.fork()\n", 5,
            "process/thread limit reached (16 tasks)", None, id="fork_bomb_at_import",
        ),
        pytest.param(
            "import threading, time\ndef probe():\n    for _ in range(200):\n"
            "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n",
            5, None, "process/thread limit reached (16 tasks): can't start new thread",
            id="thread_bomb",
        ),
        pytest.param(
            "def probe():\n    for i in range(200):\n"
            "        with open(f'fill{i}.bin', 'wb') as f:\n            f.write(b'x' * 10**6)\n",
            5, None, "disk limit exceeded (32 MB in the work dir)", id="disk_fill_200_files",
        ),
    ],
)
def test_hostile_code_comes_back_as_a_clear_failure(
    code: str, timeout_s: float, error: str | None, reason: str | None
) -> None:
    started = time.monotonic()
    result = run_tests(code, ONE_CASE, timeout_s=timeout_s, memory_mb=128)
    elapsed = time.monotonic() - started
    assert result["ok"] is False
    assert elapsed < timeout_s + SLACK_S
    if error is None:
        assert result["error"] is None, result
    else:
        assert error in str(result["error"]), result
    assert len(result["stdout"]) < sandbox.OUTPUT_KEEP_CHARS + 100
    if reason is not None:
        assert reason in _failure(result, "probe"), result


def test_later_cases_are_reported_as_not_run_after_a_timeout() -> None:
    code = "def spin():\n    while True:\n        pass\n"
    cases = [
        {"name": "first", "call": "1", "expected": 1},
        {"name": "stuck", "call": "spin()", "expected": None},
        {"name": "last", "call": "1", "expected": 1},
    ]
    result = run_tests(code, cases, timeout_s=HOSTILE_TIMEOUT_S)
    assert result["passed"] == ["first"]
    assert result["failures"] == [
        {"name": "stuck", "reason": "timed out after 1.5 s"},
        {"name": "last", "reason": "not run (see error)"},
    ]


def test_printed_or_piped_fake_results_cannot_forge_a_pass() -> None:
    code = (
        "import json, os\n"
        "fake = '0' * 32 + ' ' + json.dumps({'event': 'result', 'name': 'check', 'ok': True})\n"
        "done = '0' * 32 + ' ' + json.dumps({'event': 'done'})\n"
        "print(fake)\nprint(done)\n"
        "for fd in range(3, 256):\n"
        "    try:\n"
        "        os.write(fd, (fake + '\\n' + done + '\\n').encode())\n"
        "    except OSError:\n"
        "        pass\n"
    )
    result = run_tests(code, [{"name": "check", "call": "1", "expected": 2}])
    assert result["ok"] is False
    assert result["passed"] == []
    assert result["failures"] == [{"name": "check", "reason": "expected 2, got 1"}]
    assert "event" in result["stdout"]  # the fake line went to stdout, where it means nothing


# Candidate code that finds the harness's own `emit` on the stack and reports every case as
# passed with made-up values, then ends the process before the real cases run.
FORGER = """
import os, sys
frame = sys._getframe()
while frame is not None and "emit" not in frame.f_locals:
    frame = frame.f_back
emit = frame.f_locals["emit"]
spec_cases = frame.f_locals.get("cases") or []
SEEN = [sorted(c) for c in spec_cases]
for case in spec_cases:
    emit("start", name=case["name"])
    emit("result", name=case["name"], ok=True, reason=None, value=case.get("expected", 0))
emit("done")
print(SEEN)
sys.stdout.flush()
os._exit(0)
"""


def test_tampering_with_the_harness_cannot_forge_named_cases() -> None:
    cases = [{"name": "sum", "call": "sum([1, 2])", "expected": 3},
             {"name": "boom", "args": [], "raises": "ZeroDivisionError"}]
    result = run_tests(FORGER, cases, function="int")
    assert result["ok"] is False and result["passed"] == []
    assert result["failures"] == [
        {"name": "sum", "reason": "expected 3, got 0"},
        {"name": "boom", "reason": "expected ZeroDivisionError to be raised, but it returned "
                                   "normally"},
    ]
    # The child was never told what the cases expect.
    assert "expected" not in result["stdout"] and "raises" not in result["stdout"]
    assert "'call'" in result["stdout"]


def test_a_long_not_json_comparable_reason_is_clipped_once() -> None:
    code = "class X:\n    def tolist(self):\n        raise TypeError('x' * 300)\n"
    result = run_tests(code, [{"name": "a", "call": "X()", "expected": 1}])
    reason = result["failures"][0]["reason"]
    assert reason.startswith("expected 1, got a value that is not JSON-comparable (xxx")
    assert reason.count("[truncated]") == 1


def test_candidate_annotations_are_not_postponed() -> None:
    # The harness uses `from __future__ import annotations`; candidate code must not inherit it.
    code = "def f(x: int) -> int:\n    return x\nANN = f.__annotations__['x'] is int\n"
    assert run_tests(code, [{"name": "a", "call": "ANN", "expected": True}])["ok"] is True


def test_task_count_sees_this_process() -> None:
    assert sandbox._user_task_count(os.geteuid()) >= 1


# --------------------------------------------------------------------------- extract_python_code


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("x = 1\n", "x = 1\n", id="plain_code_unchanged"),
        pytest.param("Here:\n```python\nx = 1\n```\nDone.", "x = 1\n", id="python_fence"),
        pytest.param(
            "```py\nsmall = 1\n```\n```python\ndef big():\n    return 2\n```\n",
            "def big():\n    return 2\n", id="largest_python_block",
        ),
        pytest.param(
            "```python\na = 1\n```\n```python\nb = 2\n```", "b = 2\n", id="last_of_equal_size"
        ),
        pytest.param(
            "```text\nnot code at all\n```\n```python\nx = 1\n```", "x = 1\n",
            id="python_preferred_over_larger_other",
        ),
        pytest.param("```\ny = 2\n```", "y = 2\n", id="any_fence_without_python"),
        pytest.param("Answer:\n```python\nz = 3\n", "z = 3\n", id="unclosed_final_fence"),
        pytest.param("~~~python\nw = 4\n~~~", "w = 4\n", id="tilde_fence"),
    ],
)
def test_extract_python_code(text: str, expected: str) -> None:
    assert extract_python_code(text) == expected


# --------------------------------------------------------------------------- tools


def test_run_python_tests_tool_runs_and_accepts_markdown() -> None:
    assert run_python_tests.name == "run_python_tests"
    assert set(run_python_tests.args) == {"code", "tests", "function", "timeout_s"}
    result = run_python_tests.invoke(
        {
            "code": "My answer:\n```python\n" + FIND_DUPLICATES_OK + "```",
            "tests": FIND_DUPLICATES_CASES,
            "function": "find_duplicates",
        }
    )
    assert result["ok"] is True and len(result["passed"]) == 4


def test_run_python_tests_tool_clamps_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_run_tests(code: str, tests: Any, **kwargs: Any) -> dict[str, Any]:
        seen.update(kwargs)
        return testspec.run_result(ok=True)

    monkeypatch.setattr(python_tests, "run_tests", fake_run_tests)
    run_python_tests.invoke({"code": "x=1", "tests": "def test_a(): pass", "timeout_s": 999})
    assert seen["timeout_s"] == python_tests.TOOL_MAX_TIMEOUT_S


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param({"code": "x", "tests": 5}, "tests: Input should be a valid list", id="tests"),
        pytest.param({"tests": []}, "code: Field required", id="missing_code"),
        pytest.param({"code": 3, "tests": []}, "code: Input should be a valid string", id="code"),
    ],
)
def test_run_python_tests_tool_reports_invalid_arguments(
    args: dict[str, Any], message: str
) -> None:
    out = run_python_tests.invoke(args)
    assert isinstance(out, str) and out.startswith("Invalid arguments for run_python_tests: ")
    assert message in out


def test_run_python_tests_tool_answers_a_tool_call_with_a_message() -> None:
    call = {"name": "run_python_tests", "args": {"code": 3}, "id": "c1", "type": "tool_call"}
    message = run_python_tests.invoke(call)
    assert isinstance(message, ToolMessage) and message.status == "error"
    assert "Invalid arguments" in str(message.content)
    call["args"] = {"code": "x = 2", "tests": [{"name": "x", "call": "x", "expected": 2}]}
    message = run_python_tests.invoke(call)
    assert isinstance(message, ToolMessage) and '"ok": true' in str(message.content)


def test_python_tests_tool_binds_the_spec() -> None:
    tool = python_tests_tool(
        "run_find_duplicates_tests", FIND_DUPLICATES_CASES, function="find_duplicates"
    )
    assert tool.name == "run_find_duplicates_tests"
    assert list(tool.args) == ["code"]
    assert "basic, empty, no_duplicates, unhashable" in tool.description
    result = tool.invoke({"code": "```python\n" + FIND_DUPLICATES_SET_DRAFT + "```"})
    assert result["passed"] == ["basic", "empty", "no_duplicates"]
    assert [f["name"] for f in result["failures"]] == ["unhashable"]
    assert tool.invoke({"code": ""})["error"] == "code must be a non-empty string of Python source"
    assert "Invalid arguments" in tool.invoke({"source": "x"})


def test_python_tests_tool_with_source_and_custom_description() -> None:
    tool = python_tests_tool(
        "adder_tests",
        "def test_add():\n    assert add(1, 2) == 3\n",
        description="Run the adder tests.",
        timeout_s=5,
    )
    assert tool.description == "Run the adder tests."
    assert tool.invoke({"code": "def add(a, b):\n    return a + b"})["ok"] is True


@pytest.mark.parametrize(
    ("name", "tests", "kwargs", "message"),
    [
        pytest.param("bad name", "def test_a(): pass", {}, "tool name must match", id="name"),
        pytest.param("t", [], {}, "empty list", id="no_cases"),
        pytest.param("t", [{"name": "a", "args": [], "expected": 1}], {}, "'function'",
                     id="args_without_function"),
        pytest.param("t", "def test_a(): pass", {"timeout_s": -1}, "timeout_s", id="timeout"),
    ],
)
def test_python_tests_tool_rejects_a_bad_spec_at_once(
    name: str, tests: Any, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        python_tests_tool(name, tests, **kwargs)


def test_package_exports() -> None:
    assert tools_pkg.__all__ == sorted(tools_pkg.__all__)
    assert set(tools_pkg.DEFAULT_TOOLS) == {"run_python_tests", "text_stats", "check_text"}
    for name, tool in tools_pkg.DEFAULT_TOOLS.items():
        assert tool.name == name
    for name in tools_pkg.__all__:
        assert getattr(tools_pkg, name) is not None


def test_the_boundary_never_hands_the_child_the_answers() -> None:
    # The candidate walks up into the harness's frames and reads the cases it was given.
    code = (
        "import sys\n"
        "def keys():\n"
        "    frame = sys._getframe()\n"
        "    while frame is not None:\n"
        "        if isinstance(frame.f_locals.get('cases'), list):\n"
        "            return [sorted(case) for case in frame.f_locals['cases']]\n"
        "        frame = frame.f_back\n"
    )
    cases = [{"name": "peek", "call": "keys()", "expected": "SECRET"},
             {"name": "other", "call": "keys()", "raises": "builtins.ValueError"}]
    run = sandbox.run_child(
        code, cases=cases, source=None, function=None, seconds=10, memory_mb=256, cpu=11
    )
    values = [e["value"] for e in run.events if e.get("event") == "result"]
    assert values == [[["call", "name"], ["call", "name"]]] * 2, run
    assert "SECRET" not in json.dumps(run.events) + run.stdout + run.stderr
