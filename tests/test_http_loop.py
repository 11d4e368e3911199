"""The loop over real HTTP: ChatOpenAI clients talking to FakeOpenAI servers on 127.0.0.1.

Worker and grader are both `langchain_openai.ChatOpenAI`, so these tests cover what scripted
models cannot: the client's error types (rate limits, 5xx, timeouts, dropped connections,
broken bodies), usage reporting, and token streaming through the runner.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from typing import TYPE_CHECKING, Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from openai_server import FakeOpenAI, Reply, drop, error, malformed, slow, text, verdict

from rubric_core import RubricMiddleware
from rubric_core.grader import bind_grader, build_grader_messages, drive_sync, grade_steps
from rubric_core.models import BASE_URL_ENV
from rubric_core.runner import RunSpec, build_agent, run_rubric

if TYPE_CHECKING:
    from collections.abc import Iterator

RUBRIC = "- c1\n- c2"
TIMEOUT_S = 0.5


FAIL = verdict("needs_revision", ("c2",))
PASS = verdict("satisfied")


def is_grader(body: dict[str, Any]) -> bool:
    """Grader requests are the ones offering the verdict tool."""
    names = [t.get("function", {}).get("name") for t in body.get("tools") or []]
    return "GraderResponse" in names


def chat(server: FakeOpenAI, model: str, **kwargs: Any) -> ChatOpenAI:
    kwargs.setdefault("timeout", TIMEOUT_S)
    return ChatOpenAI(base_url=server.base_url, api_key="test",  # type: ignore[arg-type]
                      model=model, max_retries=0, **kwargs)


@pytest.fixture
def worker() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def grader() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


def agent_for(worker: FakeOpenAI, grader: FakeOpenAI, **kwargs: Any) -> Any:
    kwargs.setdefault("retry_backoff_s", 0)
    mw = RubricMiddleware(model=chat(grader, "grader-model"), **kwargs)
    return create_agent(model=chat(worker, "worker-model"), middleware=[mw],
                        checkpointer=InMemorySaver())


CFG: dict[str, Any] = {"configurable": {"thread_id": "t"}}


def ask() -> dict[str, Any]:
    return {"messages": [HumanMessage("write it")], "rubric": RUBRIC}


def values(agent: Any) -> dict[str, Any]:
    return agent.get_state(CFG).values


def ai_texts(vals: dict[str, Any]) -> list[str]:
    return [m.text for m in vals["messages"] if isinstance(m, AIMessage)]


# --------------------------------------------------------------------------- the loop


def test_one_server_serves_worker_and_grader_end_to_end() -> None:
    drafts, verdicts = iter(["draft 1", "draft 2"]), iter([FAIL, PASS])

    def respond(body: dict[str, Any]) -> Reply:
        return next(verdicts) if is_grader(body) else text(next(drafts))

    with FakeOpenAI(default=respond) as server:
        agent = agent_for(server, server)
        agent.invoke(ask(), CFG)
        vals = values(agent)
        bodies = list(server.requests)
    assert vals["_rubric_status"] == "satisfied"
    assert ai_texts(vals) == ["draft 1", "draft 2"]
    assert [is_grader(b) for b in bodies] == [False, True, False, True]
    # The revision turn reached the worker over the wire, with the grader's gap in it.
    revision = bodies[2]["messages"][-1]
    assert revision["role"] == "user" and "- c2: fix c2" in revision["content"]
    assert bodies[2]["model"] == "worker-model" and bodies[3]["model"] == "grader-model"
    first, second = vals["_rubric_evaluations"]
    assert (first["result"], second["result"]) == ("needs_revision", "satisfied")
    for ev in (first, second):
        assert ev["input_tokens"] and ev["output_tokens"]
    # The grader is sent the attempt, not the history: the first draft is gone by pass two.
    assert "draft 1" not in bodies[3]["messages"][-1]["content"]


def test_async_loop_over_http(worker: FakeOpenAI, grader: FakeOpenAI) -> None:
    worker.enqueue(text("draft 1"), text("draft 2"))
    grader.enqueue(error(429, "slow down"), FAIL, PASS)
    agent = agent_for(worker, grader)
    asyncio.run(agent.ainvoke(ask(), CFG))
    assert values(agent)["_rubric_status"] == "satisfied"
    assert len(grader.requests) == 3 and len(worker.requests) == 2


# --------------------------------------------------------------------------- grader failures


@pytest.mark.parametrize(
    "glitches",
    [
        pytest.param([error(429, "rate limited"), error(500, "boom")], id="429_then_500"),
        pytest.param([error(503, "overloaded"), error(408, "request timeout")], id="503_then_408"),
        pytest.param([slow(60, PASS)], id="reply_slower_than_client_timeout"),
        pytest.param([malformed()], id="body_not_json"),
    ],
)
def test_transient_grader_failures_are_retried(
    worker: FakeOpenAI, grader: FakeOpenAI, glitches: list[Reply]
) -> None:
    worker.enqueue(text("draft 1"))
    grader.enqueue(*glitches, PASS)
    agent = agent_for(worker, grader)
    agent.invoke(ask(), CFG)
    vals = values(agent)
    assert vals["_rubric_status"] == "satisfied"
    assert len(grader.requests) == len(glitches) + 1
    (ev,) = vals["_rubric_evaluations"]
    assert ev["duration_s"] < 30  # the 60 s reply was abandoned, not waited for


@pytest.mark.parametrize(
    ("reply", "explanation"),
    [
        pytest.param(error(500, "grader is down"),
                     ["Error code: 500", "grader is down", "grader model 'grader-model'",
                      "HTTP 500", "retryable error", "2 retries made"], id="500_forever"),
        pytest.param(malformed(),
                     ["GraderOutputError", "not valid JSON", "3 attempt(s)",
                      "grader model 'grader-model'", "2 retries made",
                      # the body that could not be parsed is kept
                      'as received (up to 4,000 characters):\n{"id": "chatcmpl-broken"'],
                     id="not_json_forever"),
        pytest.param(slow(5, PASS), ["Timeout", "grader model 'grader-model'", "2 retries made"],
                     id="timeout_forever"),
    ],
)
def test_grader_that_keeps_failing_ends_in_grader_error_with_thread_intact(
    worker: FakeOpenAI, grader: FakeOpenAI, reply: Reply, explanation: list[str]
) -> None:
    worker.enqueue(text("draft 1"), text("draft 2"))
    grader.enqueue(FAIL)
    grader.default = reply
    agent = agent_for(worker, grader, max_retries=2)
    agent.invoke(ask(), CFG)
    vals = values(agent)
    assert vals["_rubric_status"] == "grader_error"
    assert len(grader.requests) == 1 + 3  # one good pass, then one try and two retries
    first, last = vals["_rubric_evaluations"]
    assert first["result"] == "needs_revision"
    assert last["result"] == "grader_error" and last["criteria"] == []
    for part in explanation:
        assert part in last["explanation"]
    assert last["answer"] == "draft 2"
    # Nothing lost: the request, both drafts and the revision turn between them.
    assert ai_texts(vals) == ["draft 1", "draft 2"]
    assert [m.type for m in vals["messages"]] == ["human", "ai", "human", "ai"]


def test_client_error_is_not_retried(worker: FakeOpenAI, grader: FakeOpenAI) -> None:
    worker.enqueue(text("draft 1"))
    grader.enqueue(error(400, "the prompt is longer than the context"), PASS)
    agent = agent_for(worker, grader)
    agent.invoke(ask(), CFG)
    (ev,) = values(agent)["_rubric_evaluations"]
    assert ev["result"] == "grader_error"
    assert "Error code: 400" in ev["explanation"]
    assert "longer than the context" in ev["explanation"]
    assert "(grader model 'grader-model', HTTP 400, not retryable, 0 retries made)" in (
        ev["explanation"])
    assert len(grader.requests) == 1


def test_a_server_that_refuses_tools_is_asked_for_a_json_schema(
        worker: FakeOpenAI, grader: FakeOpenAI) -> None:
    """A 400 naming tools is a refusal of the forced call, not of the request: asked again."""
    worker.enqueue(text("draft 1"))
    grader.enqueue(error(400, "model does not support tools"), PASS)
    agent = agent_for(worker, grader)
    agent.invoke(ask(), CFG)
    (ev,) = values(agent)["_rubric_evaluations"]
    assert ev["result"] == "satisfied" and ev["verdict_mode"] == "json_schema"
    forced, schema = grader.requests
    assert forced["tool_choice"] == {"type": "function", "function": {"name": "GraderResponse"}}
    assert "tools" not in schema and schema["response_format"]["type"] == "json_schema"


# --------------------------------------------------------------------------- the runner


def test_runner_streams_worker_tokens_over_http(worker: FakeOpenAI, grader: FakeOpenAI) -> None:
    answer = "Spring rain taps the roof while the old cat sleeps on, dreaming of summer."
    worker.enqueue(text("too short"), text(answer))
    grader.enqueue(FAIL, PASS)
    spec = RunSpec(prompt="write it", rubric=RUBRIC, worker=chat(worker, "w"),
                   grader=chat(grader, "g"))
    events = list(run_rubric(spec))
    assert [e["type"] for e in events if e["type"] != "worker_token"] == [
        "worker_started", "worker_message", "evaluation_started", "evaluation_finished",
    ] * 2 + ["run_finished"]
    tokens = [e for e in events if e["type"] == "worker_token" and e["iteration"] == 1]
    assert len(tokens) > 1  # streamed in pieces, not one block at the end
    assert "".join(t["text"] for t in tokens) == answer
    assert all(body.get("stream") for body in worker.requests)
    final = events[-1]
    assert final["status"] == "satisfied" and final["answer"] == answer
    assert [e["result"] for e in final["evaluations"]] == ["needs_revision", "satisfied"]


def test_runner_reports_tokens_for_openai_compatible_model_strings() -> None:
    verdicts = iter([FAIL, PASS])

    def respond(body: dict[str, Any]) -> Reply:
        return next(verdicts) if is_grader(body) else text("an answer in a few words")

    with FakeOpenAI(default=respond) as server:
        spec = RunSpec(prompt="write it", rubric=RUBRIC, worker="openai-compatible:w",
                       grader="openai-compatible:g", base_url=server.base_url)
        final = list(run_rubric(spec))[-1]
        bodies = list(server.requests)
    assert final["status"] == "satisfied"
    # Everything streams under stream_events; usage comes only when asked for.
    assert all(b["stream"] and b["stream_options"] == {"include_usage": True} for b in bodies)
    for ev in final["evaluations"]:
        assert ev["input_tokens"] and ev["output_tokens"]


def test_worker_server_killed_mid_run_then_resumed_on_a_new_server(
    worker: FakeOpenAI, grader: FakeOpenAI
) -> None:
    worker.enqueue(text("draft 1"))
    served: list[int] = []

    def respond(body: dict[str, Any]) -> Reply:
        served.append(1)
        if len(served) == 1:
            worker.stop()  # the worker's server dies while its first answer is graded
            return FAIL
        return PASS

    grader.default = respond
    saver, thread = InMemorySaver(), "killed"
    spec = RunSpec(prompt="write it", rubric=RUBRIC, worker=chat(worker, "w"),
                   grader=chat(grader, "g"))
    final = list(run_rubric(spec, checkpointer=saver, thread_id=thread))[-1]
    assert final["status"] == "error"
    assert final["error"] and "Connection" in final["error"]
    assert [e["result"] for e in final["evaluations"]] == ["needs_revision"]
    cfg = {"configurable": {"thread_id": thread}}
    vals = build_agent(spec, saver).get_state(cfg).values
    assert ai_texts(vals) == ["draft 1"]
    assert vals["messages"][-1].additional_kwargs.get("lc_source") == "rubric_grader"

    with FakeOpenAI() as revived:
        revived.enqueue(text("draft 2"))
        spec.worker = chat(revived, "w")
        events = list(run_rubric(spec, checkpointer=saver, thread_id=thread, resume=True))
        assert len(revived.requests) == 1  # only the answer that was cut off is asked again
    final = events[-1]
    assert final["status"] == "satisfied" and final["answer"] == "draft 2"
    evs = final["evaluations"]
    assert [e["iteration"] for e in evs] == [0, 1]
    assert len({e["grading_run_id"] for e in evs}) == 1
    vals = build_agent(spec, saver).get_state(cfg).values
    assert ai_texts(vals) == ["draft 1", "draft 2"]


def test_worker_dropping_connections_ends_run_in_error_and_recovers_on_resume() -> None:
    verdicts = iter([FAIL, PASS])
    state = {"down": False}

    def respond(body: dict[str, Any]) -> Reply:
        if is_grader(body):
            state["down"] = True  # fail every worker call after the first grading pass
            return next(verdicts)
        return drop() if state["down"] else text(f"draft {len(server.requests)}")


    with FakeOpenAI(default=respond) as server:
        saver = InMemorySaver()
        spec = RunSpec(prompt="write it", rubric=RUBRIC, worker=chat(server, "w"),
                       grader=chat(server, "g"))
        final = list(run_rubric(spec, checkpointer=saver, thread_id="d"))[-1]
        assert final["status"] == "error" and "Connection" in (final["error"] or "")
        state["down"] = False
        final = list(run_rubric(spec, checkpointer=saver, thread_id="d", resume=True))[-1]
    assert final["status"] == "satisfied"
    assert [e["result"] for e in final["evaluations"]] == ["needs_revision", "satisfied"]


# --------------------------------------------------------------------------- grader trust


LINES_RUBRIC = "- The answer has exactly 3 lines\n- The tone is friendly"
LINES_CRITERIA = ("The answer has exactly 3 lines", "The tone is friendly")
SIX_LINES = "\n".join(f"hello friend, line {i}" for i in range(1, 7))
THREE_LINES = "hello friend\nhow are you\nsee you soon"


def json_text(result: str, names: tuple[str, ...], failing: tuple[str, ...] = ()) -> Reply:
    """A verdict written as plain text, as some models answer instead of calling the tool."""
    items = [{"name": n, "passed": n not in failing, **({"gap": f"fix {n}"} if n in failing
                                                        else {})} for n in names]
    return text(json.dumps({"result": result, "explanation": f"{result}.", "criteria": items}))


def hybrid_agent(worker: FakeOpenAI, grader: FakeOpenAI, monkeypatch: pytest.MonkeyPatch,
                 **kwargs: Any) -> Any:
    """The `hybrid:<model>` grader exactly as the app and the CLI name it."""
    monkeypatch.setenv(BASE_URL_ENV, grader.base_url)
    kwargs.setdefault("retry_backoff_s", 0)
    mw = RubricMiddleware(model="hybrid:openai-compatible:grader-model", **kwargs)
    return create_agent(model=chat(worker, "worker-model"), middleware=[mw],
                        checkpointer=InMemorySaver())


def ask_lines() -> dict[str, Any]:
    return {"messages": [HumanMessage("greet me")], "rubric": LINES_RUBRIC}


@pytest.mark.parametrize(
    "replies",
    [
        pytest.param([json_text("satisfied", LINES_CRITERIA)], id="plain_text_json"),
        pytest.param([verdict("satisfied", (), LINES_CRITERIA)], id="tool_call"),
        pytest.param([error(429, "slow down"), json_text("satisfied", LINES_CRITERIA)],
                     id="after_a_retry"),
        pytest.param([text("Looks friendly and fine to me."),
                      json_text("satisfied", LINES_CRITERIA)], id="after_a_correction"),
    ],
)
def test_hybrid_rule_results_are_final_over_http(
    worker: FakeOpenAI, grader: FakeOpenAI, monkeypatch: pytest.MonkeyPatch,
    replies: list[Reply],
) -> None:
    worker.enqueue(text(SIX_LINES), text(THREE_LINES))
    grader.enqueue(*replies, json_text("satisfied", LINES_CRITERIA))
    agent = hybrid_agent(worker, grader, monkeypatch, max_iterations=2)
    agent.invoke(ask_lines(), CFG)
    vals = values(agent)
    first, second = vals["_rubric_evaluations"]
    assert first["result"] == "needs_revision"  # the LLM said satisfied; the rule says 6 lines
    assert first["criteria"] == [
        {"name": "The answer has exactly 3 lines", "passed": False,
         "gap": "the answer has 6 lines, needs exactly 3"},
        {"name": "The tone is friendly", "passed": True},
    ]
    assert second["result"] == "satisfied" and vals["_rubric_status"] == "satisfied"
    # The LLM was shown the rule result as evidence it may not contradict.
    assert any("[FAIL] 1. The answer has exactly 3 lines" in str(m.get("content"))
               for m in grader.requests[0]["messages"])


def test_hybrid_llm_that_keeps_failing_is_a_grader_error_naming_it(
    worker: FakeOpenAI, grader: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker.enqueue(text(SIX_LINES))
    grader.default = error(500, "grader is down")
    agent = hybrid_agent(worker, grader, monkeypatch, max_retries=1)
    agent.invoke(ask_lines(), CFG)
    (ev,) = values(agent)["_rubric_evaluations"]
    assert ev["result"] == "grader_error" and ev["criteria"] == []
    assert ("(grader model 'hybrid:grader-model', HTTP 500, retryable error, 1 retry made)"
            in ev["explanation"])


def test_invented_criterion_names_are_not_matched_by_position(
    worker: FakeOpenAI, grader: FakeOpenAI
) -> None:
    invented = verdict("satisfied", (), ("Is polite", "Is short"))  # same count as the rubric
    worker.enqueue(text("draft 1"))
    grader.enqueue(invented, invented)
    agent = agent_for(worker, grader, max_iterations=1)
    agent.invoke(ask(), CFG)
    (ev,) = values(agent)["_rubric_evaluations"]
    assert ev["result"] == "needs_revision" and ev["unverified"] is True
    assert [c["passed"] for c in ev["criteria"]] == [False, False]
    assert ev["status"] == "max_iterations_reached"
    correction = grader.requests[1]["messages"][-1]["content"]
    assert "not in the rubric (ignored): 'Is polite'; 'Is short'" in correction


def test_invented_failing_criterion_does_not_force_a_revision(
    worker: FakeOpenAI, grader: FakeOpenAI
) -> None:
    worker.enqueue(text("draft 1"))
    grader.enqueue(verdict("needs_revision", ("Is witty",), ("c1", "c2", "Is witty")))
    agent = agent_for(worker, grader)
    agent.invoke(ask(), CFG)
    vals = values(agent)
    (ev,) = vals["_rubric_evaluations"]
    assert ev["result"] == "satisfied" and vals["_rubric_status"] == "satisfied"
    assert "Result set to 'satisfied'" in ev["explanation"]
    assert len(worker.requests) == 1 and len(grader.requests) == 1
    assert ev["unknown_criteria"] == ["Is witty"]  # recorded on the evaluation, not used


def test_unknown_criteria_are_recorded_on_the_grading_outcome(grader: FakeOpenAI) -> None:
    grader.enqueue(verdict("needs_revision", ("Is witty",), ("c1", "c2", "Is witty")))
    messages = build_grader_messages([HumanMessage("q"), AIMessage("a")], ["c1", "c2"])
    outcome = drive_sync(grade_steps(messages, ["c1", "c2"], []),
                         bind_grader(chat(grader, "grader-model"), []))
    assert outcome.unknown_criteria == ["Is witty"]
    assert outcome.response.result == "satisfied" and outcome.missing == []


def test_unparseable_reply_is_kept_capped_on_the_evaluation(
    worker: FakeOpenAI, grader: FakeOpenAI
) -> None:
    rambling = "I would say it is mostly fine. " + "really " * 2_000 + "FINAL WORD"
    worker.enqueue(text("draft 1"))
    # Prose to the forced call, prose to the JSON schema, then to the correction in prose.
    grader.enqueue(text("I think it is fine."), text("Still fine."), text(rambling))
    agent = agent_for(worker, grader)
    agent.invoke(ask(), CFG)
    assert ["tool_choice" in r for r in grader.requests] == [True, False, False]
    assert ["response_format" in r for r in grader.requests] == [False, True, False]
    (ev,) = values(agent)["_rubric_evaluations"]
    assert ev["result"] == "grader_error"
    head, _, kept = ev["explanation"].partition(
        "Grader reply as received (up to 4,000 characters):\n")
    assert head.startswith("GraderOutputError: grader returned an unusable verdict twice")
    assert "(grader model 'grader-model', 0 retries made)" in head
    assert kept.startswith("I would say it is mostly fine.") and kept.endswith("FINAL WORD")
    assert len(kept) <= 4_000 and "characters omitted" in kept


def test_retry_after_http_date_is_waited_for(worker: FakeOpenAI, grader: FakeOpenAI) -> None:
    worker.enqueue(text("draft 1"))
    when = email.utils.formatdate(time.time() + 3, usegmt=True)  # whole seconds: 2 to 3 s ahead
    grader.enqueue(error(429, "slow down", headers={"Retry-After": when}), PASS)
    agent = agent_for(worker, grader)  # retry_backoff_s=0: only the header can make it wait
    agent.invoke(ask(), CFG)
    assert values(agent)["_rubric_status"] == "satisfied"
    first, second = grader.request_times
    assert 1.0 <= second - first <= 10.0
