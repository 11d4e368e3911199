"""deepagents' own RubricMiddleware tests, run against ours: the outcome of every one is pinned.

``tests/deepagents_parity/`` holds their test file (vendored under its MIT license, imports
pointed at ``deepagents_parity.shim``), the tables of tests that differ on purpose or are left
out, and the conftest that applies them. This module runs that suite in a child pytest and
checks the result against the tables and the counts the README states.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from deepagents_parity import shim, tables
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from scripted import ScriptedChatModel, verdict

import rubric_core
from rubric_core.types import REVISION_SOURCE

ROOT = Path(__file__).resolve().parents[1]
PARITY = ROOT / "tests" / "deepagents_parity"


PASSED = 25
"""Upstream tests (parametrizations counted) that pass against ours, as the README says."""
DIFFERING = 9
"""Upstream tests that fail where ours differs on purpose (strict xfail)."""
LEFT_OUT = 30
"""Upstream tests of private internals with no counterpart here (deselected)."""


def _name(test_id: str) -> str:
    return test_id.split("[", 1)[0]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("parity") / "report.json"
    env = {**os.environ, tables.REPORT_ENV: str(path)}
    # The child must grade with the rubric_core this session imports, wherever that lives.
    here = str(Path(rubric_core.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(PARITY / tables.VENDORED)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False,
    )
    assert path.exists(), f"the parity suite wrote no report:\n{proc.stdout[-3000:]}{proc.stderr}"
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    data["returncode"], data["output"] = proc.returncode, proc.stdout
    return data


def test_the_parity_suite_ends_green(report: dict[str, Any]) -> None:
    # Strict xfail: a differing test that starts to pass fails the child run, and so this.
    assert report["returncode"] == 0, report["output"][-6000:]
    assert set(report["outcomes"]) == {"passed", "xfailed", "deselected"}


def test_the_counts_are_the_readme_s(report: dict[str, Any]) -> None:
    counts = {outcome: len(ids) for outcome, ids in report["outcomes"].items()}
    assert counts == {"passed": PASSED, "xfailed": DIFFERING, "deselected": LEFT_OUT}
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert (f"{PASSED} of the {PASSED + DIFFERING} upstream tests that exercise public "
            f"behaviour pass") in readme
    assert f"{LEFT_OUT} tests of private internals" in readme
    assert f"Of its {PASSED + DIFFERING + LEFT_OUT} tests" in readme


def test_every_test_not_in_a_table_passes(report: dict[str, Any]) -> None:
    seen = {test for ids in report["outcomes"].values() for test in ids}
    expected = {t for t in seen if _name(t) not in tables.EXCLUDED | tables.DIFFERS.keys()}
    assert set(report["outcomes"]["passed"]) == expected


def test_exactly_the_differing_tests_fail_and_on_the_difference(report: dict[str, Any]) -> None:
    xfailed = report["outcomes"]["xfailed"]
    assert {_name(t) for t in xfailed} == set(tables.DIFFERS)
    for test in xfailed:
        _reason, evidence = tables.DIFFERS[_name(test)]
        assert evidence in report["xfail_text"][test], (test, report["xfail_text"][test][-2000:])


def test_exactly_the_excluded_tests_are_left_out(report: dict[str, Any]) -> None:
    assert {_name(t) for t in report["outcomes"]["deselected"]} == set(tables.EXCLUDED)
    assert not set(tables.EXCLUDED) & set(tables.DIFFERS)


def test_the_vendored_file_is_upstream_s_but_for_its_imports() -> None:
    text = (PARITY / tables.VENDORED).read_bytes().decode("utf-8")
    header, body = text.split(tables.HEADER_END, 1)
    assert "MIT License" in header and tables.UPSTREAM[2] in header
    lines = body.splitlines(keepends=True)
    assert sorted(line for line in lines if line in tables.IMPORTS) == sorted(tables.IMPORTS)
    restored = "".join(tables.IMPORTS.get(line, line) for line in lines).encode("utf-8")
    blob = hashlib.sha1(b"blob %d\0" % len(restored) + restored, usedforsecurity=False)
    assert blob.hexdigest() == tables.UPSTREAM_BLOB
    license_text = (PARITY / "LICENSE-deepagents").read_text(encoding="utf-8")
    assert license_text.startswith("MIT License") and "LangChain, Inc." in license_text


def test_the_shim_is_ours_when_no_test_stubs_the_grader() -> None:
    assert issubclass(shim.RubricMiddleware, rubric_core.RubricMiddleware)
    assert shim.GraderResponse is rubric_core.GraderResponse
    assert shim.RUBRIC_GRADER_MESSAGE_SOURCE == REVISION_SOURCE == "rubric_grader"
    grader = ScriptedChatModel(replies=[verdict("needs_revision", "no", [("c1", "add it")]),
                                        verdict("satisfied", "ok", ["c1"])])
    worker = ScriptedChatModel(replies=["draft", "fixed"])
    agent = create_agent(model=worker, middleware=[shim.RubricMiddleware(model=grader)],
                         checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "shim"}}
    agent.invoke({"messages": [HumanMessage("go")], "rubric": "- c1"}, config)
    values = agent.get_state(config).values
    assert [e["result"] for e in values["_rubric_evaluations"]] == ["needs_revision", "satisfied"]
    assert len(grader.calls) == 2  # the configured model graded, not a stub
