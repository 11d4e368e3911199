"""Verdicts you can trust: grader repeats and consensus, the best attempt, regressions, stalls
and verification gaps, on scripted models."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from scripted import ScriptedChatModel, verdict

from rubric_core import RubricMiddleware
from rubric_core.consensus import combine
from rubric_core.grader import GradeOutcome
from rubric_core.middleware import BEST_ATTEMPT_NAME, NOT_ASSESSED_GAP, best_iteration
from rubric_core.types import GraderResponse

RUBRIC = "- c1\n- c2\n- c3"
ALL = verdict("satisfied", "all good", ["c1", "c2", "c3"])


def _v(*failing: str) -> AIMessage:
    crits = [(c, f"fix {c}") if c in failing else c for c in ("c1", "c2", "c3")]
    return verdict("needs_revision" if failing else "satisfied", "ok", crits)


def _make(workers: list[str], graders: list[Any], **kwargs: Any) -> tuple[Any, Any, Any]:
    worker = ScriptedChatModel(replies=list(workers), default="another draft")
    grader = ScriptedChatModel(replies=list(graders))
    kwargs.setdefault("retry_backoff_s", 0)
    agent = create_agent(model=worker, middleware=[RubricMiddleware(model=grader, **kwargs)],
                         checkpointer=InMemorySaver())
    return agent, worker, grader


def _run(agent: Any, thread: str = "t") -> dict[str, Any]:
    config = {"configurable": {"thread_id": thread}}
    agent.invoke({"messages": [HumanMessage("write it")], "rubric": RUBRIC}, config)
    return agent.get_state(config).values


# --------------------------------------------------------------------------- consensus


def _outcome(passes: dict[str, bool], result: str | None = None) -> GradeOutcome:
    crits = [{"name": n, "passed": p, **({} if p else {"gap": f"gap {n}"})}
             for n, p in passes.items()]
    result = result or ("satisfied" if all(passes.values()) else "needs_revision")
    response = GraderResponse.model_construct(result=result, explanation=result, criteria=[])
    return GradeOutcome(response=response, criteria=crits, missing=[], input_tokens=10,
                        output_tokens=2, retries=1)


@pytest.mark.parametrize(
    ("votes", "mode", "passed", "agreement"),
    [
        pytest.param([True, True, False], "majority", True, 0.6667, id="two_of_three_pass"),
        pytest.param([True, False, False], "majority", False, 0.6667, id="two_of_three_fail"),
        pytest.param([True, False], "majority", False, 0.5, id="tie_fails"),
        pytest.param([True, True, False], "unanimous", False, 0.3333, id="unanimous_one_fail"),
        pytest.param([True, True, True], "unanimous", True, 1.0, id="unanimous_all_pass"),
    ],
)
def test_per_criterion_consensus(votes: list[bool], mode: Any, passed: bool,
                                 agreement: float) -> None:
    outcomes = [_outcome({"c1": v, "c2": True}) for v in votes]
    combined = combine(outcomes, ["c1", "c2"], mode)
    c1 = combined.outcome.criteria[0]
    assert c1["passed"] is passed and combined.agreement["c1"] == agreement
    assert combined.agreement["c2"] == 1.0
    assert combined.unstable == ([] if agreement == 1.0 else ["c1"])
    assert combined.outcome.response.result == ("satisfied" if passed else "needs_revision")
    assert combined.outcome.input_tokens == 10 * len(votes)
    assert combined.outcome.retries == len(votes)
    if not passed:
        assert c1["gap"] == "gap c1"


def test_consensus_failed_needs_a_majority_and_missing_stays_missing() -> None:
    outcomes = [_outcome({"c1": True}, "failed"), _outcome({"c1": True}),
                _outcome({"c1": True}, "failed")]
    assert combine(outcomes, ["c1", "c2"]).outcome.response.result == "failed"
    outcomes = [_outcome({"c1": True}), _outcome({"c1": True}, "failed")]
    combined = combine(outcomes, ["c1", "c2"])
    assert combined.outcome.response.result == "satisfied"
    assert combined.outcome.missing == ["c2"]  # the middleware makes this unverified


def test_repeats_grade_each_pass_k_times_and_record_agreement() -> None:
    agent, worker, grader = _make(["draft"], [ALL, _v("c2"), ALL], grader_repeats=3)
    values = _run(agent)
    [ev] = values["_rubric_evaluations"]
    assert len(grader.calls) == 3 and len(worker.calls) == 1
    assert ev["result"] == "satisfied" and ev["repeats"] == 3
    assert ev["unstable"] == ["c2"]
    assert [c["agreement"] for c in ev["criteria"]] == [1.0, 0.6667, 1.0]
    assert "3 repeats, majority; not unanimous on: c2" in ev["explanation"]


def test_unanimous_consensus_sends_a_disputed_criterion_back() -> None:
    agent, _, _ = _make(["draft", "draft 2"], [ALL, _v("c2"), ALL, ALL, ALL, ALL],
                        grader_repeats=3, consensus="unanimous")
    values = _run(agent)
    first, second = values["_rubric_evaluations"]
    assert first["result"] == "needs_revision" and first["unstable"] == ["c2"]
    assert second["result"] == "satisfied" and second["unstable"] == []


def test_async_repeats_run_concurrently() -> None:
    started: list[float] = []

    class Slow(ScriptedChatModel):
        async def _agenerate(self, *args: Any, **kwargs: Any) -> Any:
            started.append(asyncio.get_running_loop().time())
            await asyncio.sleep(0.3)
            return await super()._agenerate(*args, **kwargs)

    grader = Slow(replies=[ALL, ALL, ALL])
    worker = ScriptedChatModel(replies=["draft"])
    agent = create_agent(model=worker, middleware=[RubricMiddleware(model=grader,
                                                                    grader_repeats=3)],
                         checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "a"}}
    asyncio.run(agent.ainvoke({"messages": [HumanMessage("x")], "rubric": RUBRIC}, config))
    assert len(started) == 3 and max(started) - min(started) < 0.25  # not one after another
    [ev] = agent.get_state(config).values["_rubric_evaluations"]
    assert ev["repeats"] == 3 and ev["result"] == "satisfied"


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        pytest.param({"grader_repeats": 0}, ValueError, id="zero_repeats"),
        pytest.param({"grader_repeats": 10}, ValueError, id="too_many_repeats"),
        pytest.param({"grader_repeats": True}, ValueError, id="bool_repeats"),
        pytest.param({"consensus": "mean"}, ValueError, id="bad_consensus"),
        pytest.param({"return_best": "yes"}, TypeError, id="bad_return_best"),
    ],
)
def test_bad_stability_options_are_refused(kwargs: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        RubricMiddleware(model="x:y", **kwargs)


def test_one_repeat_changes_nothing() -> None:
    agent, _, grader = _make(["draft"], [ALL])
    [ev] = _run(agent)["_rubric_evaluations"]
    assert len(grader.calls) == 1
    assert "repeats" not in ev and "unstable" not in ev and "agreement" not in ev["criteria"][0]
    assert "regressed" not in ev and "stalled" not in ev  # a first pass has no previous one


# --------------------------------------------------------------------------- best attempt


def test_best_attempt_is_tracked_and_returned_at_the_cap() -> None:
    # pass 0: 2 of 3 pass; pass 1: 1 of 3 (c1 regressed); pass 2: 1 of 3
    graders = [_v("c3"), _v("c1", "c3"), _v("c2", "c3")]
    agent, _, _ = _make(["best draft", "worse", "also worse"], graders, max_iterations=3,
                        return_best=True)
    values = _run(agent)
    evs = values["_rubric_evaluations"]
    assert values["_rubric_status"] == "max_iterations_reached"
    assert values["_rubric_best_iteration"] == 0
    assert evs[1]["regressed"] == ["c1"] and evs[2]["regressed"] == ["c2"]
    last = values["messages"][-1]
    assert isinstance(last, AIMessage) and last.name == BEST_ATTEMPT_NAME
    assert last.content == "best draft"
    assert last.response_metadata["rubric_best_iteration"] == 0


def test_without_return_best_the_last_attempt_stays_final() -> None:
    graders = [_v("c3"), _v("c1", "c3")]
    agent, _, _ = _make(["best draft", "worse"], graders, max_iterations=2)
    values = _run(agent)
    assert values["_rubric_best_iteration"] == 0
    assert values["messages"][-1].content == "worse"


def test_best_iteration_ties_go_to_the_later_pass() -> None:
    evs: list[Any] = [
        {"iteration": 0, "criteria": [{"name": "a", "passed": True}]},
        {"iteration": 1, "criteria": [{"name": "a", "passed": False}]},
        {"iteration": 2, "criteria": [{"name": "a", "passed": True}]},
    ]
    assert best_iteration(evs) == 2
    assert best_iteration([]) is None


def test_the_revision_message_names_what_the_last_revision_broke() -> None:
    agent, worker, _ = _make(["d1", "d2", "d3"], [_v("c3"), _v("c1", "c3"), ALL],
                             max_iterations=3)
    _run(agent)
    feedback = worker.calls[2][-1].content
    assert "c1: fix c1 (it passed before your last revision: you broke it)" in feedback


# --------------------------------------------------------------------------- stalls, gaps


def test_an_unchanged_answer_is_marked_stalled_and_told_so() -> None:
    agent, worker, _ = _make(["same  answer", "same answer\n", "new"],
                             [_v("c2"), _v("c2"), ALL], max_iterations=3)
    values = _run(agent)
    _, second, third = values["_rubric_evaluations"]
    assert second["stalled"] is True and third["stalled"] is False
    assert "did not change from the previous attempt" in worker.calls[2][-1].content
    assert "did not change" not in worker.calls[1][-1].content


def test_an_unverified_pass_is_a_verification_gap_not_a_defect() -> None:
    partial = verdict("satisfied", "ok", ["c1", "c2"])  # c3 left out, twice
    agent, worker, _ = _make(["d1", "d2"], [partial, partial, ALL], max_iterations=2)
    values = _run(agent)
    first = values["_rubric_evaluations"][0]
    assert first["unverified"] is True
    assert first["criteria"][2] == {"name": "c3", "passed": False, "gap": NOT_ASSESSED_GAP}
    feedback = worker.calls[1][-1].content
    assert "verification gap in the grading, not a defect" in feedback
    assert "Failing criteria" not in feedback
    assert "Criteria the grader verified as passing (keep these):\n- c1\n- c2" in feedback


# --------------------------------------------------------------------------- deepagents parity


def test_a_missing_model_names_the_argument() -> None:
    with pytest.raises(ValueError, match="`model` is required"):
        RubricMiddleware(model="")


def test_a_passing_criterion_s_stray_gap_is_dropped_when_parsed() -> None:
    response = GraderResponse.model_validate({
        "result": "satisfied", "explanation": "ok",
        "criteria": [{"name": "c1", "passed": True, "gap": "nothing really"}],
    })
    assert response.criteria[0].gap is None


def test_prepare_messages_for_grader_rewrites_what_the_grader_sees() -> None:
    seen: list[int] = []

    def only_last(messages: list[Any]) -> list[Any]:
        seen.append(len(messages))
        return [HumanMessage("SECRET-FREE request"), messages[-1]]

    agent, _, grader = _make(["draft"], [ALL], prepare_messages_for_grader=only_last)
    values = _run(agent)
    assert seen == [2] and values["_rubric_status"] == "satisfied"
    sent = "\n".join(str(m.content) for m in grader.calls[0])
    assert "SECRET-FREE request" in sent and "write it" not in sent
    assert values["messages"][0].content == "write it"  # the agent's own state is unchanged
    with pytest.raises(TypeError):
        RubricMiddleware(model="x:y", prepare_messages_for_grader="nope")  # type: ignore[arg-type]


class _Boom(Exception):
    """A non-transient grader failure."""


def test_a_failing_coverage_correction_keeps_the_first_verdict_unverified() -> None:
    partial = verdict("satisfied", "ok", ["c1", "c2"])  # leaves c3 out
    agent, worker, _ = _make(["d1", "d2"], [partial, _Boom("server went away"), ALL],
                             max_iterations=2)
    values = _run(agent)
    first = values["_rubric_evaluations"][0]
    assert first["result"] == "needs_revision" and first["unverified"] is True
    assert [c["passed"] for c in first["criteria"]] == [True, True, False]
    assert values["_rubric_status"] == "satisfied"  # the loop went on instead of grader_error
    assert len(worker.calls) == 2


# --------------------------------------------------------------------------- defaults and the seed


def _seed_view(kwargs: dict[str, Any]) -> dict[str, Any]:
    """What the seed specifies of a capped three-pass run whose first answer was the best."""
    from langgraph.stream import CustomTransformer

    seen: list[dict[str, Any]] = []
    agent, worker, grader = _make(["best draft", "worse", "also worse"],
                                  [_v("c3"), _v("c1", "c3"), _v("c2", "c3")],
                                  max_iterations=3, on_evaluation=seen.append, **kwargs)
    config = {"configurable": {"thread_id": "seed"}}
    stream = agent.stream_events({"messages": [HumanMessage("write it")], "rubric": RUBRIC},
                                 config, version="v3", transformers=[CustomTransformer])
    events = list(stream.custom)
    values = agent.get_state(config).values
    seed_fields = ("iteration", "result", "explanation", "criteria")  # and grading_run_id:
    ids = {values["_current_grading_run_id"]} | {e["grading_run_id"] for e in [*events, *seen]}
    return {
        "grader_calls": len(grader.calls), "worker_calls": len(worker.calls),
        "status": values["_rubric_status"], "iterations": values["_rubric_iterations"],
        "final_message": (values["messages"][-1].type, values["messages"][-1].content),
        "start_events": [set(e) for e in events if e["type"] == "rubric_evaluation_start"],
        "end_events": [{k: e[k] for k in ("type", *seed_fields)} for e in events
                       if e["type"] == "rubric_evaluation_end"],
        "callback": [{k: ev[k] for k in seed_fields} for ev in seen],
        "evaluations": [{k: ev[k] for k in seed_fields} for ev in values["_rubric_evaluations"]],
        "one_grading_run": len(ids) == 1,
    }


def test_one_repeat_and_no_return_best_change_nothing_the_seed_specifies() -> None:
    defaults = _seed_view({})
    explicit = _seed_view({"grader_repeats": 1, "return_best": False, "consensus": "majority"})
    assert defaults == explicit and defaults["one_grading_run"]
    # One grader call per pass, the last attempt stays the final message, the cap is the
    # status while each pass keeps the grader's own verdict, and criteria are {name, passed}
    # or {name, passed, gap}: nothing of repeats, best attempt or consensus shows.
    assert (defaults["grader_calls"], defaults["worker_calls"]) == (3, 3)
    assert defaults["final_message"] == ("ai", "also worse")
    assert (defaults["status"], defaults["iterations"]) == ("max_iterations_reached", 3)
    assert defaults["start_events"] == [{"type", "grading_run_id", "iteration"}] * 3
    assert [e["result"] for e in defaults["callback"]] == ["needs_revision"] * 3
    assert defaults["callback"] == defaults["evaluations"]
    assert [e["iteration"] for e in defaults["end_events"]] == [0, 1, 2]
    for ev in defaults["evaluations"]:
        for c in ev["criteria"]:
            assert set(c) == ({"name", "passed"} if c["passed"] else {"name", "passed", "gap"})


def test_a_new_grading_run_does_not_inherit_the_last_run_s_best_pass() -> None:
    mw = RubricMiddleware(model="x:y")
    state: Any = {"messages": [], "rubric": RUBRIC, "_active_rubric": RUBRIC,
                  "_current_grading_run_id": "old", "_rubric_iterations": 2,
                  "_rubric_status": "satisfied", "_rubric_best_iteration": 1}
    update = mw.before_agent(state, None)  # type: ignore[arg-type]
    assert update is not None and update["_rubric_best_iteration"] is None
    # On a thread: the first run's best pass was its second; the next run, stopped before its
    # first verdict, must not claim a best pass of its own yet.
    agent, _, _ = _make(["d1", "d2", "d3"], [_v("c1"), ALL, KeyboardInterrupt()])
    config = {"configurable": {"thread_id": "t"}}
    agent.invoke({"messages": [HumanMessage("write it")], "rubric": RUBRIC}, config)
    assert agent.get_state(config).values["_rubric_best_iteration"] == 1
    with pytest.raises(KeyboardInterrupt):
        agent.invoke({"messages": [HumanMessage("again")]}, config)
    values = agent.get_state(config).values
    assert values["_rubric_iterations"] == 0 and values["_rubric_best_iteration"] is None
