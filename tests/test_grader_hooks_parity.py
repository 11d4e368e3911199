"""The grader hooks mean what deepagents 0.7.32's do: one scenario, run on both middlewares.

Each test takes ``impl``, our `RubricMiddleware` or deepagents' (installed as a dev
requirement), drives a real agent with scripted models and asserts only what both must agree
on: what the grader middleware's hooks saw and changed, what ``build_grader_state`` was given
and added, the grader's runtime context, and the errors. Where ours differs on purpose the test
says so and pins both sides (README, "Grader middleware").
"""

from __future__ import annotations

import asyncio
import warnings
from dataclasses import dataclass
from typing import Any, NotRequired

import pytest
from langchain.agents import AgentState, create_agent
from langchain.agents.middleware import AgentMiddleware, ModelCallLimitMiddleware, hook_config
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from scripted import ScriptedChatModel, tool_call, verdict

from rubric_core import RubricMiddleware

RUBRIC = "- c1\n- c2"
PASS = verdict("satisfied", "all good", ["c1", "c2"])
FAIL = verdict("needs_revision", "c2 is missing", ["c1", ("c2", "add c2")])


def _deepagents() -> type:
    with warnings.catch_warnings():  # deepagents marks its RubricMiddleware beta
        warnings.simplefilter("ignore")
        from deepagents.middleware.rubric import RubricMiddleware as Theirs
    return Theirs


IMPLS = {"ours": lambda: RubricMiddleware, "deepagents": _deepagents}


@pytest.fixture(params=sorted(IMPLS))
def impl(request: pytest.FixtureRequest) -> type:
    return IMPLS[request.param]()


class Grading(AgentState):
    ticket: NotRequired[str]


@dataclass
class Ctx:
    user: str


@tool
def count_words(text: str) -> int:
    """Count the words of a text."""
    return len(text.split())


def run(impl: type, grader_replies: list[Any], *, mode: str = "invoke",
        worker_replies: tuple[str, ...] = ("draft", "revised"), context: Any = None,
        context_schema: Any = None, **kwargs: Any) -> tuple[dict[str, Any], ScriptedChatModel]:
    """Run one agent with ``impl``'s middleware; the final state and the grader model."""
    grader = ScriptedChatModel(replies=list(grader_replies))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mw = impl(model=grader, **kwargs)
    agent = create_agent(model=ScriptedChatModel(replies=list(worker_replies)), middleware=[mw],
                         checkpointer=InMemorySaver(), context_schema=context_schema)
    config: Any = {"configurable": {"thread_id": "t"}}
    ask = {"messages": [HumanMessage("write it")], "rubric": RUBRIC}
    if mode == "invoke":
        agent.invoke(ask, config, context=context)
    else:
        asyncio.run(agent.ainvoke(ask, config, context=context))
    return agent.get_state(config).values, grader


def _tool_names(tools: list[Any]) -> list[str]:
    return [t.name if hasattr(t, "name") else t["function"]["name"] for t in tools]


class Spy(AgentMiddleware):
    """Records what each grader hook sees; ``before_model`` appends to ``ticket``."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[Any, ...]] = []

    def before_agent(self, state: Any, runtime: Any) -> None:
        self.seen.append(("before_agent", state.get("ticket")))

    def before_model(self, state: Any, runtime: Any) -> dict[str, Any]:
        self.seen.append(("before_model", state.get("ticket"),
                          [m.type for m in state["messages"]], runtime.context))
        return {"ticket": f"{state.get('ticket')}+seen"}

    def wrap_model_call(self, request: Any, handler: Any) -> Any:
        self.seen.append(("wrap_model_call", request.state.get("ticket"),
                          [m.type for m in request.messages], _tool_names(request.tools),
                          bool(request.system_prompt), request.runtime.context))
        return handler(request)

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        self.seen.append(("wrap_tool_call", request.tool_call["name"],
                          request.tool_call["args"], request.state.get("ticket"),
                          request.runtime.context))
        return handler(request)

    def after_agent(self, state: Any, runtime: Any) -> None:
        self.seen.append(("after_agent", state.get("ticket")))


def test_every_grader_call_passes_through_the_hooks_in_create_agents_order(impl: type) -> None:
    spy = Spy()
    values, _ = run(impl, [tool_call("count_words", {"text": "a b c"}), PASS],
                    tools=[count_words], grader_middleware=[spy], grader_state_schema=Grading,
                    grader_context_schema=Ctx, context=Ctx("ann"), context_schema=Ctx,
                    build_grader_state=lambda state, iteration: {"ticket": f"T{iteration}"})
    assert values["_rubric_status"] == "satisfied"
    ann = Ctx("ann")
    assert spy.seen == [
        ("before_agent", "T0"),
        ("before_model", "T0", ["human"], ann),
        ("wrap_model_call", "T0+seen", ["human"], ["count_words"], True, ann),
        ("wrap_tool_call", "count_words", {"text": "a b c"}, "T0+seen", ann),
        ("before_model", "T0+seen", ["human", "ai", "tool"], ann),
        ("wrap_model_call", "T0+seen+seen", ["human", "ai", "tool"], ["count_words"], True,
         ann),
        ("after_agent", "T0+seen+seen"),
    ]


class AsyncSpy(AgentMiddleware):
    """Sync and async forms of each hook, each recording which one ran."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def before_model(self, state: Any, runtime: Any) -> None:
        self.seen.append("before_model")

    async def abefore_model(self, state: Any, runtime: Any) -> None:
        self.seen.append("abefore_model")

    def wrap_model_call(self, request: Any, handler: Any) -> Any:
        self.seen.append("wrap_model_call")
        return handler(request)

    async def awrap_model_call(self, request: Any, handler: Any) -> Any:
        self.seen.append("awrap_model_call")
        return await handler(request)

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        self.seen.append("wrap_tool_call")
        return handler(request)

    async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
        self.seen.append("awrap_tool_call")
        return await handler(request)


@pytest.mark.parametrize(("mode", "prefix"), [("invoke", ""), ("ainvoke", "a")])
def test_invoke_runs_the_sync_hooks_and_ainvoke_the_async_ones(
    impl: type, mode: str, prefix: str
) -> None:
    spy = AsyncSpy()
    values, _ = run(impl, [tool_call("count_words", {"text": "a"}), PASS], mode=mode,
                    tools=[count_words], grader_middleware=[spy])
    assert values["_rubric_status"] == "satisfied"
    assert spy.seen == [f"{prefix}before_model", f"{prefix}wrap_model_call",
                        f"{prefix}wrap_tool_call", f"{prefix}before_model",
                        f"{prefix}wrap_model_call"]


class Strict(AgentMiddleware):
    """Changes each grader request and each tool call's arguments."""

    def wrap_model_call(self, request: Any, handler: Any) -> Any:
        return handler(request.override(messages=[*request.messages, HumanMessage("be strict")]))

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        call = {**request.tool_call, "args": {"text": "one two three four"}}
        return handler(request.override(tool_call=call))


def test_a_hook_may_change_the_request_and_the_tool_call(impl: type) -> None:
    values, grader = run(impl, [tool_call("count_words", {"text": "a"}), PASS],
                         tools=[count_words], grader_middleware=[Strict()])
    assert values["_rubric_status"] == "satisfied"
    first, second = grader.calls
    assert first[-1].content == "be strict"
    result = next(m for m in second if isinstance(m, ToolMessage))
    assert result.content == "4"


def test_build_grader_state_gets_the_state_and_iteration_of_each_pass(impl: type) -> None:
    calls: list[tuple[str, int, int]] = []

    def build(state: Any, iteration: int) -> dict[str, Any]:
        calls.append((state["rubric"], len(state["messages"]), iteration))
        return {"ticket": f"T{iteration}"}

    values, _ = run(impl, [FAIL, PASS], grader_state_schema=Grading, build_grader_state=build)
    assert values["_rubric_status"] == "satisfied"
    # The request and answer, then the request, answer, revision turn and revised answer.
    assert calls == [(RUBRIC, 2, 0), (RUBRIC, 4, 1)]


def test_the_grader_context_is_the_agents_made_the_grader_schema(impl: type) -> None:
    spy = Spy()
    run(impl, [PASS], grader_middleware=[spy], grader_context_schema=Ctx,
        context={"user": "bo"})
    contexts = [s[-1] for s in spy.seen if s[0] == "before_model"]
    assert contexts == [Ctx("bo")]


def test_build_grader_state_needs_a_grader_state_schema(impl: type) -> None:
    with pytest.raises(ValueError, match="`grader_state_schema` is required"):
        impl(model="openai:gpt-4.1-mini", build_grader_state=lambda state, iteration: {})


def test_build_grader_state_may_not_set_messages(impl: type) -> None:
    values, grader = run(impl, [PASS], grader_state_schema=Grading,
                         build_grader_state=lambda state, iteration: {"messages": []})
    [ev] = values["_rubric_evaluations"]
    assert ev["result"] == "grader_error"
    assert "ValueError" in ev["explanation"] and "`messages`" in ev["explanation"]
    assert grader.calls == []


class EndsEarly(AgentMiddleware):
    @hook_config(can_jump_to=["end"])
    def before_model(self, state: Any, runtime: Any) -> dict[str, Any]:
        return {"jump_to": "end"}


def test_a_hook_that_ends_the_grader_run_before_its_verdict_is_a_grader_error(
    impl: type
) -> None:
    values, grader = run(impl, [PASS], grader_middleware=[EndsEarly()])
    [ev] = values["_rubric_evaluations"]
    assert ev["result"] == "grader_error" and grader.calls == []


def test_langchains_model_call_limit_bounds_the_grader(impl: type) -> None:
    limit = ModelCallLimitMiddleware(run_limit=1, exit_behavior="error")
    values, grader = run(impl, [tool_call("count_words", {"text": "a"}), PASS],
                         tools=[count_words], grader_middleware=[limit])
    [ev] = values["_rubric_evaluations"]
    assert ev["result"] == "grader_error" and "ModelCallLimitExceededError" in ev["explanation"]
    assert len(grader.calls) == 1


# --------------------------------------------------------------------------- on purpose


def test_an_undeclared_field_is_dropped_by_theirs_and_refused_by_ours(impl: type) -> None:
    spy = Spy()
    values, _ = run(impl, [PASS], grader_middleware=[spy], grader_state_schema=Grading,
                    build_grader_state=lambda state, iteration: {"ticket": "T", "extra": 1})
    [ev] = values["_rubric_evaluations"]
    if impl is RubricMiddleware:  # a typo would otherwise vanish without a word
        assert ev["result"] == "grader_error"
        assert "does not declare: extra" in ev["explanation"]
    else:
        assert ev["result"] == "satisfied" and spy.seen[0] == ("before_agent", "T")


def test_a_non_mapping_is_refused_by_ours_and_read_as_pairs_by_theirs(impl: type) -> None:
    spy = Spy()
    values, _ = run(impl, [PASS], grader_middleware=[spy], grader_state_schema=Grading,
                    build_grader_state=lambda state, iteration: [("ticket", "T")])
    [ev] = values["_rubric_evaluations"]
    if impl is RubricMiddleware:  # the documented contract is a mapping
        assert ev["result"] == "grader_error"
        assert "must return a mapping, got list" in ev["explanation"]
    else:
        assert ev["result"] == "satisfied" and spy.seen[0] == ("before_agent", "T")
