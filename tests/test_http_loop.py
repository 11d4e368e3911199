"""The loop over real HTTP: ChatOpenAI clients talking to FakeOpenAI servers on 127.0.0.1.

Worker and grader are both `langchain_openai.ChatOpenAI`, so these tests cover what scripted
models cannot: the client's error types (rate limits, 5xx, timeouts, dropped connections,
broken bodies), usage reporting, and token streaming through the runner.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from openai_server import FakeOpenAI, Reply, drop, error, malformed, slow, text, verdict

from rubric_core import RubricMiddleware
from rubric_core.runner import RunSpec, build_agent, run_rubric

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
        pytest.param([slow(5, PASS)], id="reply_slower_than_client_timeout"),
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
    assert ev["duration_s"] < 5  # the slow reply was abandoned, not waited for


@pytest.mark.parametrize(
    ("reply", "explanation"),
    [
        pytest.param(error(500, "grader is down"), ["Error code: 500", "grader is down"],
                     id="500_forever"),
        pytest.param(malformed(), ["GraderOutputError", "not valid JSON", "3 attempt(s)"],
                     id="not_json_forever"),
        pytest.param(slow(5, PASS), ["Timeout"], id="timeout_forever"),
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
    grader.enqueue(error(400, "model does not support tools"), PASS)
    agent = agent_for(worker, grader)
    agent.invoke(ask(), CFG)
    (ev,) = values(agent)["_rubric_evaluations"]
    assert ev["result"] == "grader_error"
    assert "Error code: 400" in ev["explanation"]
    assert "does not support tools" in ev["explanation"]
    assert len(grader.requests) == 1


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
