"""RubricMiddleware's public contract hook by hook, without an agent graph where none is needed.

Constructor checks, ``before_agent``'s grading runs, ``after_agent``'s verdicts and what each
one updates, ``GraderResponse`` validation, and the cap as every surface reports it (state,
events, callback; sync and async). These are the behaviours deepagents' own tests check of its
middleware, pinned here for ours (README, "Parity with deepagents' tests").
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import ValidationError
from scripted import ScriptedChatModel, verdict

from rubric_core import GraderResponse, RubricMiddleware
from rubric_core.types import REVISION_SOURCE, TERMINAL_STATUSES

RUBRIC = "- The report has a title"
CRITERION = "The report has a title"
PASS = verdict("satisfied", "titled", [CRITERION])
FAIL = verdict("needs_revision", "no title yet", [(CRITERION, "add a title")])


def runtime(events: list[dict[str, Any]] | None = None) -> Any:
    """What the hooks use of LangGraph's runtime: its stream writer."""
    sink: list[dict[str, Any]] = [] if events is None else events
    return SimpleNamespace(stream_writer=sink.append)


def graded_state(**overrides: Any) -> dict[str, Any]:
    """State as after_agent sees it: a request, an answer and a grading run in progress."""
    base: dict[str, Any] = {
        "messages": [HumanMessage("Write the report"), AIMessage("Q3 numbers are up.")],
        "rubric": RUBRIC,
        "_active_rubric": RUBRIC,
        "_current_grading_run_id": "run-a",
        "_rubric_iterations": 0,
    }
    return {**base, **overrides}


def middleware(*replies: Any, **kwargs: Any) -> tuple[RubricMiddleware, ScriptedChatModel]:
    grader = ScriptedChatModel(replies=list(replies))
    kwargs.setdefault("retry_backoff_s", 0)
    return RubricMiddleware(model=grader, **kwargs), grader


# --------------------------------------------------------------------------- construction


def test_model_is_a_required_keyword() -> None:
    with pytest.raises(TypeError):
        RubricMiddleware()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        RubricMiddleware("openai:gpt-4.1")  # type: ignore[misc]


@pytest.mark.parametrize("cap", [1, 3, 21, 50])
def test_any_cap_from_one_to_the_ceiling_is_kept(cap: int) -> None:
    assert RubricMiddleware(model="x:y", max_iterations=cap).max_iterations == cap


@pytest.mark.parametrize(
    ("cap", "error"),
    [
        pytest.param(0, ValueError, id="zero"),
        pytest.param(-1, ValueError, id="negative"),
        pytest.param(51, ValueError, id="over_the_ceiling"),
        pytest.param(True, TypeError, id="bool_is_not_a_count"),
        pytest.param("3", TypeError, id="numeric_string"),
        pytest.param(3.0, TypeError, id="float"),
    ],
)
def test_a_bad_cap_is_refused_by_name(cap: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="max_iterations"):
        RubricMiddleware(model="x:y", max_iterations=cap)


# --------------------------------------------------------------------------- before_agent


@pytest.mark.parametrize("rubric", [None, ""])
def test_without_a_rubric_before_agent_changes_nothing(rubric: str | None) -> None:
    state: dict[str, Any] = {"messages": []}
    if rubric is not None:
        state["rubric"] = rubric
    assert RubricMiddleware(model="x:y").before_agent(state, runtime()) is None  # type: ignore[arg-type]


def test_a_first_rubric_starts_a_grading_run() -> None:
    update = RubricMiddleware(model="x:y").before_agent(
        {"messages": [], "rubric": RUBRIC}, runtime())  # type: ignore[arg-type]
    assert update is not None
    assert (update["_rubric_iterations"], update["_rubric_status"]) == (0, None)
    assert update["_active_rubric"] == RUBRIC
    assert isinstance(update["_current_grading_run_id"], str) and update["_current_grading_run_id"]


@pytest.mark.parametrize("status", [None, "needs_revision"])
def test_the_same_rubric_mid_run_continues_that_run(status: str | None) -> None:
    state = graded_state(_rubric_iterations=2, _rubric_status=status)
    assert RubricMiddleware(model="x:y").before_agent(state, runtime()) is None  # type: ignore[arg-type]


def test_a_changed_rubric_starts_a_new_run_mid_loop() -> None:
    state = graded_state(rubric="- The report has a chart", _rubric_iterations=2,
                         _rubric_status="needs_revision")
    update = RubricMiddleware(model="x:y").before_agent(state, runtime())  # type: ignore[arg-type]
    assert update is not None
    assert update["_active_rubric"] == "- The report has a chart"
    assert update["_current_grading_run_id"] != "run-a"
    assert (update["_rubric_iterations"], update["_rubric_status"]) == (0, None)


@pytest.mark.parametrize("status", sorted(TERMINAL_STATUSES))
def test_the_same_rubric_after_a_finished_run_gets_a_fresh_budget(status: str) -> None:
    state = graded_state(_rubric_iterations=3, _rubric_status=status)
    update = RubricMiddleware(model="x:y").before_agent(state, runtime())  # type: ignore[arg-type]
    assert update is not None
    assert update["_current_grading_run_id"] != "run-a"
    assert (update["_rubric_iterations"], update["_rubric_status"]) == (0, None)
    assert update["_active_rubric"] == RUBRIC


def test_abefore_agent_answers_as_before_agent_does() -> None:
    mw = RubricMiddleware(model="x:y")
    update = asyncio.run(mw.abefore_agent({"messages": [], "rubric": RUBRIC}, runtime()))  # type: ignore[arg-type]
    assert update is not None and update["_active_rubric"] == RUBRIC
    assert asyncio.run(mw.abefore_agent(graded_state(), runtime())) is None  # type: ignore[arg-type]


# --------------------------------------------------------------------------- after_agent


def test_a_passing_verdict_ends_the_run_on_every_surface() -> None:
    events: list[dict[str, Any]] = []
    seen: list[dict[str, Any]] = []
    mw, grader = middleware(PASS, on_evaluation=seen.append)
    update = mw.after_agent(graded_state(), runtime(events))  # type: ignore[arg-type]
    assert update is not None and "jump_to" not in update and "messages" not in update
    assert update["_rubric_status"] == "satisfied" and update["_rubric_iterations"] == 1
    assert [e["type"] for e in events] == ["rubric_evaluation_start", "rubric_evaluation_end"]
    assert (events[0]["grading_run_id"], events[0]["iteration"]) == ("run-a", 0)
    assert events[1]["result"] == "satisfied"
    assert [e["result"] for e in seen] == ["satisfied"] and len(grader.calls) == 1


def test_a_satisfied_that_answers_no_criterion_is_not_accepted() -> None:
    # Ours differs from the reference here: criteria come from the rubric, and a pass that
    # verifies none of them is unverified and goes back for revision.
    empty = verdict("satisfied", "looks fine", [])
    mw, grader = middleware(empty, empty)
    update = mw.after_agent(graded_state(), runtime())  # type: ignore[arg-type]
    assert update is not None and update["jump_to"] == "model"
    [ev] = update["_rubric_evaluations"]
    assert (ev["result"], ev["unverified"]) == ("needs_revision", True)
    assert len(grader.calls) == 2  # the first reply, then one request for the missing criterion


def test_failed_is_terminal_and_does_not_loop() -> None:
    mw, _ = middleware(verdict("failed", "The rubric contradicts itself.", [CRITERION]))
    update = mw.after_agent(graded_state(), runtime())  # type: ignore[arg-type]
    assert update is not None
    assert update["_rubric_status"] == "failed" and "jump_to" not in update


def test_needs_revision_below_the_cap_sends_a_feedback_turn_back() -> None:
    events: list[dict[str, Any]] = []
    mw, _ = middleware(FAIL, max_iterations=2)
    update = mw.after_agent(graded_state(), runtime(events))  # type: ignore[arg-type]
    assert update is not None
    assert (update["_rubric_status"], update["_rubric_iterations"]) == ("needs_revision", 1)
    assert update["jump_to"] == "model"
    [turn] = update["messages"]
    assert isinstance(turn, HumanMessage)
    assert turn.name == REVISION_SOURCE
    assert turn.additional_kwargs["lc_source"] == REVISION_SOURCE
    assert "no title yet" in turn.content and "add a title" in turn.content
    assert events[-1]["result"] == "needs_revision" == events[-1]["status"]


class Overloaded(RuntimeError):
    """A provider error carrying an HTTP status, as SDK errors do."""

    status_code = 529


@pytest.mark.parametrize(
    ("error", "explanation"),
    [
        pytest.param(RuntimeError("grader exploded"), "RuntimeError: grader exploded",
                     id="plain"),
        pytest.param(Overloaded("API overloaded"), "HTTP 529", id="with_http_status"),
    ],
)
def test_a_grader_that_raises_ends_the_run_as_grader_error(
    error: Exception, explanation: str
) -> None:
    mw, _ = middleware(error, max_retries=0)
    update = mw.after_agent(graded_state(), runtime())  # type: ignore[arg-type]
    assert update is not None and "jump_to" not in update
    assert update["_rubric_status"] == "grader_error"
    [ev] = update["_rubric_evaluations"]
    assert ev["result"] == "grader_error" and explanation in ev["explanation"]
    assert str(error) in ev["explanation"]


@pytest.mark.parametrize("stop", [KeyboardInterrupt, asyncio.CancelledError])
def test_interrupts_are_never_swallowed_into_an_evaluation(stop: type[BaseException]) -> None:
    mw, _ = middleware(stop())
    with pytest.raises(stop):
        mw.after_agent(graded_state(), runtime())  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the cap


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_cap_is_reported_on_every_surface_with_the_grader_s_own_result(mode: str) -> None:
    events: list[dict[str, Any]] = []
    seen: list[dict[str, Any]] = []
    mw, _ = middleware(FAIL, max_iterations=2, on_evaluation=seen.append)
    state = graded_state(_rubric_iterations=1)
    update = (mw.after_agent(state, runtime(events)) if mode == "sync"  # type: ignore[arg-type]
              else asyncio.run(mw.aafter_agent(state, runtime(events))))  # type: ignore[arg-type]
    assert update is not None and "jump_to" not in update and "messages" not in update
    assert update["_rubric_status"] == "max_iterations_reached"
    assert update["_rubric_iterations"] == 2
    [ev] = update["_rubric_evaluations"]
    # The seed keeps the grader's verdict as the result and reports the cap as the status.
    assert (ev["result"], ev["status"]) == ("needs_revision", "max_iterations_reached")
    assert events[-1]["type"] == "rubric_evaluation_end"
    assert (events[-1]["result"], events[-1]["status"]) == ("needs_revision",
                                                            "max_iterations_reached")
    assert [(e["result"], e["status"]) for e in seen] == [("needs_revision",
                                                           "max_iterations_reached")]


# --------------------------------------------------------------------------- across invocations


def test_a_rubric_stays_in_force_and_each_invocation_is_a_new_run() -> None:
    worker = ScriptedChatModel(replies=["first", "second", "third"])
    grader = ScriptedChatModel(replies=[PASS, PASS, verdict("satisfied", "ok", ["Short"])])
    agent = create_agent(model=worker, middleware=[RubricMiddleware(model=grader)],
                         checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "report"}}
    agent.invoke({"messages": [HumanMessage("write it")], "rubric": RUBRIC}, config)
    agent.invoke({"messages": [HumanMessage("again")]}, config)  # no rubric: the last one holds
    agent.invoke({"messages": [HumanMessage("shorter")], "rubric": "- Short"}, config)
    evaluations = agent.get_state(config).values["_rubric_evaluations"]
    assert len(evaluations) == 3  # every run's evaluations are kept
    assert len({e["grading_run_id"] for e in evaluations}) == 3
    assert [e["iteration"] for e in evaluations] == [0, 0, 0]
    assert [e["answer"] for e in evaluations] == ["first", "second", "third"]
    assert len(grader.calls) == 3


# --------------------------------------------------------------------------- GraderResponse


def _response(result: str, *criteria: dict[str, Any]) -> dict[str, Any]:
    return {"result": result, "explanation": "e", "criteria": list(criteria)}


@pytest.mark.parametrize(
    ("data", "match"),
    [
        pytest.param(_response("needs_revision", {"name": "x", "passed": False}), "gap",
                     id="failure_without_a_gap"),
        pytest.param(_response("satisfied", {"name": "x", "passed": False, "gap": "wrong"}),
                     "satisfied", id="satisfied_with_a_failure"),
        pytest.param(_response("needs_revision", {"name": "x", "passed": True}),
                     "needs_revision", id="needs_revision_with_none_failing"),
    ],
)
def test_an_inconsistent_verdict_does_not_validate(data: dict[str, Any], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        GraderResponse.model_validate(data)


@pytest.mark.parametrize("result", ["needs_revision", "satisfied", "failed"])
def test_a_verdict_without_criteria_validates(result: str) -> None:
    assert GraderResponse.model_validate(_response(result)).result == result


def test_a_pass_s_stray_gap_is_dropped_and_the_rest_kept() -> None:
    parsed = GraderResponse.model_validate(
        _response("satisfied", {"name": "x", "passed": True, "gap": "none really"}))
    assert parsed.criteria == [{"name": "x", "passed": True}]
