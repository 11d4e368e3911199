"""scripts/deepagents_parity.py: finding deepagents' test file, rewriting it, judging outcomes.

deepagents' own test file is not in this repository, so these tests drive the script's
machinery with a small stand-in written here, in the same shape (two import lines to rewrite,
test names the tables know). The real run is a developer's command (README, "Parity with
deepagents' tests"); the behaviours it checks are pinned by our own tests in
tests/test_middleware_contract.py and tests/test_middleware.py.
"""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING, Any

import pytest
from conftest import ROOT
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from scripted import ScriptedChatModel, verdict

import rubric_core
from rubric_core.types import REVISION_SOURCE

if TYPE_CHECKING:
    from pathlib import Path
    from types import ModuleType

STAND_IN = '''\
"""A stand-in for deepagents' test file: its import lines, and one test of each kind."""

from types import SimpleNamespace

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from deepagents.middleware.rubric import (
    GraderResponse,
    RubricMiddleware,
)
from tests.unit_tests.chat_model import GenericFakeChatModel


def _state():
    return {"messages": [HumanMessage("q"), AIMessage("a")], "rubric": "- c",
            "_active_rubric": "- c", "_current_grading_run_id": "g", "_rubric_iterations": 0}


class TestConstruction:
    def test_defaults(self):
        raise AssertionError("in tables.EXCLUDED: never runs")

    def test_missing_model_raises(self):
        with pytest.raises(TypeError):
            RubricMiddleware()


class TestBeforeAgent:
    async def test_abefore_agent_matches_sync(self):
        mw = RubricMiddleware(model="stub:test")
        update = await mw.abefore_agent({"messages": [], "rubric": "- c"}, SimpleNamespace())
        assert update["_active_rubric"] == "- c"


class TestAfterAgentDirect:
    def test_on_evaluation_callback_fires(self, monkeypatch):
        mw = RubricMiddleware(model="stub:test", max_iterations=3)
        reply = GraderResponse(result="satisfied", explanation="ok", criteria=[])
        monkeypatch.setattr(mw, "_grade", lambda state, iteration: reply)
        update = mw.after_agent(_state(), SimpleNamespace(stream_writer=lambda event: None))
        assert update["_rubric_evaluations"][0]["result"] == "satisfied"
'''


@pytest.fixture
def parity(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The script, imported as a module (``scripts/`` holds it and its ``parity`` package)."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import deepagents_parity

    return deepagents_parity


# --------------------------------------------------------------------------- reading the file


def test_rewrite_changes_only_the_two_import_lines(parity: ModuleType) -> None:
    rewritten = parity.rewrite_imports(STAND_IN)
    assert "from parity.shim import (\n" in rewritten
    assert "from parity.shim import GenericFakeChatModel\n" in rewritten
    assert "deepagents.middleware" not in rewritten and "tests.unit_tests" not in rewritten
    before, after = STAND_IN.splitlines(), rewritten.splitlines()
    assert len(before) == len(after)
    assert sum(a != b for a, b in zip(before, after, strict=True)) == 2


def test_a_file_whose_imports_changed_is_refused(parity: ModuleType) -> None:
    changed = STAND_IN.replace("from deepagents.middleware.rubric import (",
                               "from deepagents.middleware.rubric_v2 import (")
    with pytest.raises(parity.ParityError, match="no longer has the line"):
        parity.rewrite_imports(changed)


def _checkout(root: Path) -> Path:
    path = root / "libs" / "deepagents" / "tests" / "unit_tests" / "middleware"
    path.mkdir(parents=True)
    (path / "test_rubric_middleware.py").write_text(STAND_IN, encoding="utf-8")
    return root


def test_the_file_is_found_in_a_checkout_its_package_dir_or_given_itself(
    parity: ModuleType, tmp_path: Path
) -> None:
    root = _checkout(tmp_path / "deepagents")
    for where in (root, root / "libs" / "deepagents",
                  root / "libs/deepagents/tests/unit_tests/middleware/test_rubric_middleware.py"):
        text, origin = parity.read_upstream(where)
        assert text == STAND_IN and origin.endswith("test_rubric_middleware.py")


def test_the_file_is_read_from_a_git_dir_at_a_commit(parity: ModuleType, tmp_path: Path) -> None:
    root = _checkout(tmp_path / "deepagents")

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "one")
    commit = git("rev-parse", "HEAD")
    (root / "libs/deepagents/tests/unit_tests/middleware/test_rubric_middleware.py").write_text(
        "changed since", encoding="utf-8")
    text, origin = parity.read_upstream(root / ".git", commit)
    assert text == STAND_IN and origin.endswith(f"at {commit}")
    assert parity.read_upstream(root / ".git")[0] == STAND_IN  # HEAD by default
    assert parity.git_blob_id(STAND_IN) == git("rev-parse", f"{commit}:" + "libs/deepagents/"
                                               "tests/unit_tests/middleware/"
                                               "test_rubric_middleware.py")
    with pytest.raises(parity.ParityError, match="git cannot show"):
        parity.read_upstream(root, "no-such-commit")


@pytest.mark.parametrize("where", ["missing", "empty_dir"])
def test_a_path_without_the_file_is_bad_input(parity: ModuleType, tmp_path: Path,
                                              where: str) -> None:
    path = tmp_path / where
    if where == "empty_dir":
        path.mkdir()
    with pytest.raises(parity.ParityError):
        parity.read_upstream(path)
    assert parity.main(["--upstream", str(path)]) == 2


# --------------------------------------------------------------------------- running and judging


def test_the_stand_in_runs_with_the_tables_applied(parity: ModuleType) -> None:
    report = parity.run_suite(STAND_IN)
    assert report["outcomes"] == {
        "deselected": ["TestConstruction::test_defaults"],
        "passed": ["TestBeforeAgent::test_abefore_agent_matches_sync",
                   "TestConstruction::test_missing_model_raises"],
        "xfailed": ["TestAfterAgentDirect::test_on_evaluation_callback_fires"],
    }, report["output"][-3000:]
    assert report["returncode"] == 0
    # Our grader does not accept a 'satisfied' that answers no criterion: the documented
    # difference, seen through the shim's stub seam.
    text = report["xfail_text"]["TestAfterAgentDirect::test_on_evaluation_callback_fires"]
    assert "assert 'needs_revision' == 'satisfied'" in text
    found = parity.problems(report)
    assert any("counts" in p for p in found)  # a stand-in is not the whole upstream file
    assert not any("expected to pass" in p or "not on the documented" in p for p in found)


def _full_report(parity: ModuleType) -> dict[str, Any]:
    tables = parity.tables
    passing = [f"TestPublic::test_{i}" for i in range(tables.PASSED)]
    differing = sorted(tables.DIFFERS)
    left_out = sorted(tables.EXCLUDED)
    left_out += [f"{left_out[0]}[p{i}]" for i in range(tables.LEFT_OUT - len(left_out))]
    return {
        "outcomes": {"passed": passing, "xfailed": differing, "deselected": left_out},
        "xfail_text": {name: f"... {tables.DIFFERS[name][1]} ..." for name in differing},
        "returncode": 0,
    }


def test_a_report_matching_the_tables_has_no_problems(parity: ModuleType) -> None:
    assert parity.problems(_full_report(parity)) == []


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        pytest.param(lambda r: r["outcomes"]["passed"].pop(), "counts", id="a_test_vanished"),
        pytest.param(lambda r: r["outcomes"].setdefault("failed", []).append(
            r["outcomes"]["passed"].pop()), "failed: TestPublic", id="a_public_test_fails"),
        pytest.param(lambda r: r["outcomes"]["passed"].append(r["outcomes"]["xfailed"].pop()),
                     "did not fail as expected", id="a_difference_closed"),
        pytest.param(lambda r: r["xfail_text"].update(
            {k: "another failure" for k in r["xfail_text"]}), "not on the documented",
            id="fails_for_another_reason"),
        pytest.param(lambda r: r.update(returncode=1), "exited 1", id="child_failed"),
    ],
)
def test_every_departure_from_the_tables_is_named(parity: ModuleType, change: Any,
                                                  problem: str) -> None:
    report = _full_report(parity)
    change(report)
    assert any(problem in p for p in parity.problems(report))


def test_the_readme_states_the_pinned_counts_and_the_command(parity: ModuleType) -> None:
    tables = parity.tables
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    total = tables.PASSED + tables.DIFFERING + tables.LEFT_OUT
    assert (f"{tables.PASSED} passed, {tables.DIFFERING} differ on purpose (strict xfail), "
            f"{tables.LEFT_OUT} left out, of {total} upstream tests") in readme
    assert "python scripts/deepagents_parity.py --upstream" in readme
    assert not (ROOT / "tests" / "deepagents_parity").exists()  # nothing of theirs is shipped


def test_the_shim_is_ours_when_no_test_stubs_the_grader(parity: ModuleType) -> None:
    from parity import shim

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


# --------------------------------------------------------------------------- the constructor


def test_every_constructor_parameter_of_the_installed_deepagents_is_ours(
    parity: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert parity.installed_constructor_problems() == []
    assert {"grader_middleware", "grader_context_schema", "grader_state_schema",
            "build_grader_state"} <= parity.parameters(rubric_core.RubricMiddleware)
    assert parity.main(["--api-only"]) == 0  # no checkout needed
    assert "ours adds consensus, force_tools" in capsys.readouterr().out


class _Theirs:
    def __init__(self, *, model: Any, grader_middleware: Any = None, new_hook: Any = None,
                 max_retries: int = 0) -> None:
        pass


class _Ours:
    def __init__(self, *, model: Any, grader_middleware: Any = None, grader_repeats: int = 1,
                 consensus: str = "majority", return_best: bool = False,
                 force_tools: bool = False, retry_backoff_s: float = 0.5,
                 extra_knob: int = 0) -> None:
        pass


def test_every_departure_of_the_constructor_is_named(parity: ModuleType) -> None:
    assert parity.constructor_problems(_Theirs, _Ours) == [
        "constructor: deepagents takes 'max_retries', ours does not",
        "constructor: deepagents takes 'new_hook', ours does not",
        "constructor: ours takes 'extra_knob', not in tables.API_OURS_ONLY",
        "constructor: tables.API_OURS_ONLY names 'max_retries', which deepagents now takes too",
    ]


def test_without_upstream_or_api_only_the_command_is_a_usage_error(parity: ModuleType) -> None:
    with pytest.raises(SystemExit) as caught:
        parity.main([])
    assert caught.value.code == 2
