"""rubric_core.grader.hooks: the grader middleware around our bounded pass, and its checks.

What deepagents' hooks also do is pinned against both middlewares in
tests/test_grader_hooks_parity.py; these are ours alone: the constructor's checks, that a
request no hook changed is sent exactly as without hooks (forcing and prompt-cache hints), how
a changed model or a short-circuit reply is taken, repeats and retries, and the errors a hook
can cause.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

import pytest
from langchain.agents import AgentState, create_agent
from langchain.agents.middleware import AgentMiddleware, hook_config
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, interrupt
from pydantic import BaseModel
from scripted import ScriptedChatModel, tool_call, verdict

from rubric_core import RubricMiddleware
from rubric_core.grader import coerce_context

RUBRIC = "- c1\n- c2"
PASS = verdict("satisfied", "all good", ["c1", "c2"])
FAIL = verdict("needs_revision", "c2 is missing", ["c1", ("c2", "add c2")])


class Grading(AgentState):
    ticket: NotRequired[str]


@dataclass
class Ctx:
    user: str


class CtxModel(BaseModel):
    user: str


class CtxDict(TypedDict):
    user: str


@tool
def count_words(text: str) -> int:
    """Count the words of a text."""
    return len(text.split())


def make(grader: ScriptedChatModel, **kwargs: Any) -> Any:
    kwargs.setdefault("retry_backoff_s", 0)
    worker = ScriptedChatModel(replies=["draft", "revised"], default="again")
    return create_agent(model=worker, middleware=[RubricMiddleware(model=grader, **kwargs)],
                        checkpointer=InMemorySaver())


CFG: Any = {"configurable": {"thread_id": "t"}}
ASK = {"messages": [HumanMessage("write it")], "rubric": RUBRIC}


def graded(grader: ScriptedChatModel, mode: str = "invoke", **kwargs: Any) -> dict[str, Any]:
    agent = make(grader, **kwargs)
    if mode == "invoke":
        agent.invoke(ASK, CFG)
    else:
        asyncio.run(agent.ainvoke(ASK, CFG))
    return agent.get_state(CFG).values


class Noop(AgentMiddleware):
    """A hook that passes every request on unchanged."""

    def wrap_model_call(self, request: Any, handler: Any) -> Any:
        return handler(request)

    async def awrap_model_call(self, request: Any, handler: Any) -> Any:
        return await handler(request)


class Tooled(AgentMiddleware):
    def __init__(self) -> None:
        super().__init__()
        self.tools = [count_words]


class Named(AgentMiddleware):
    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name

    @property
    def name(self) -> str:
        return self._name


# --------------------------------------------------------------------------- construction


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        pytest.param({"grader_middleware": Noop()}, TypeError, "must be a list",
                     id="one_middleware_not_a_list"),
        pytest.param({"grader_middleware": [Noop(), "log"]}, TypeError,
                     r"grader_middleware\[1\] must be an AgentMiddleware instance", id="a_str"),
        pytest.param({"grader_middleware": [Named("x"), Named("x")]}, ValueError,
                     "two middleware named 'x'", id="duplicate_names"),
        pytest.param({"grader_middleware": [Tooled()]}, ValueError,
                     r"brings tools \(count_words\).*tools=\[", id="middleware_with_tools"),
        pytest.param({"grader_context_schema": Ctx("a")}, TypeError, "must be a class",
                     id="context_schema_instance"),
        pytest.param({"grader_state_schema": Ctx}, TypeError, "extends AgentState",
                     id="state_schema_not_typeddict"),
        pytest.param({"grader_state_schema": CtxDict}, TypeError, "extends AgentState",
                     id="state_schema_without_messages"),
        pytest.param({"build_grader_state": lambda s, i: {}}, ValueError,
                     "`grader_state_schema` is required", id="builder_without_schema"),
        pytest.param({"grader_state_schema": Grading, "build_grader_state": {"ticket": 1}},
                     TypeError, "build_grader_state must be callable", id="builder_not_callable"),
    ],
)
def test_bad_grader_hook_arguments_are_refused_at_construction(
    kwargs: dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        RubricMiddleware(model="openai:gpt-4.1-mini", **kwargs)


@pytest.mark.parametrize(
    ("schema", "context", "expected"),
    [
        pytest.param(Ctx, {"user": "a"}, Ctx("a"), id="dict_to_dataclass"),
        pytest.param(CtxModel, {"user": "a"}, CtxModel(user="a"), id="dict_to_pydantic"),
        pytest.param(CtxDict, {"user": "a"}, {"user": "a"}, id="typeddict_stays_a_dict"),
        pytest.param(Ctx, Ctx("b"), Ctx("b"), id="an_instance_stays"),
        pytest.param(Ctx, None, None, id="none_stays_none"),
        pytest.param(None, {"user": "a"}, {"user": "a"}, id="no_schema"),
    ],
)
def test_the_context_is_coerced_as_langgraph_coerces_a_graphs(
    schema: Any, context: Any, expected: Any
) -> None:
    assert coerce_context(schema, context) == expected


# --------------------------------------------------------------------------- the request


class ChatAnthropic(ScriptedChatModel):
    """Named like langchain_anthropic's, so the grader call gets Anthropic's cache hint."""


def test_an_unchanged_request_is_sent_exactly_as_without_hooks() -> None:
    plain, hooked = ChatAnthropic(replies=[PASS]), ChatAnthropic(replies=[PASS])
    graded(plain)
    graded(hooked, grader_middleware=[Noop()])
    [sent_plain], [sent_hooked] = plain.calls, hooked.calls
    assert [m.type for m in sent_hooked] == ["system", "human"]
    assert sent_hooked[0].content == sent_plain[0].content
    stable_plain, stable_hooked = sent_plain[1].content[0], sent_hooked[1].content[0]
    assert stable_hooked == stable_plain  # the cacheable start, with its breakpoint
    assert stable_hooked["cache_control"] == {"type": "ephemeral"}  # type: ignore[index]


class Swap(AgentMiddleware):
    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def wrap_model_call(self, request: Any, handler: Any) -> Any:
        return handler(request.override(model=self.model))


def test_a_changed_model_answers_with_the_verdict_tool_bound_to_it() -> None:
    first, fallback = ScriptedChatModel(), ScriptedChatModel(replies=[PASS])
    values = graded(first, grader_middleware=[Swap(fallback)], tools=[count_words])
    assert values["_rubric_status"] == "satisfied"
    assert first.calls == [] and len(fallback.calls) == 1
    names = [t.name if hasattr(t, "name") else t["function"]["name"]
             for t in fallback.bound_tools]
    assert names == ["count_words", "GraderResponse"]


class Answers(AgentMiddleware):
    """Answers every grader call itself, without calling the model."""

    def wrap_model_call(self, request: Any, handler: Any) -> Any:
        return PASS


def test_a_hook_that_answers_itself_gives_the_verdict_without_a_model_call() -> None:
    # deepagents' nested agent loops on such a reply (it never becomes a structured response);
    # ours reads it as the grader's reply, so it is not run there.
    grader = ScriptedChatModel()
    values = graded(grader, grader_middleware=[Answers()])
    assert values["_rubric_status"] == "satisfied" and grader.calls == []


class Adds(AgentMiddleware):
    def before_model(self, state: Any, runtime: Any) -> dict[str, Any]:
        return {"messages": [HumanMessage("note from before_model")]}


def test_a_messages_update_lasts_for_that_call_only() -> None:
    grader = ScriptedChatModel(replies=[tool_call("count_words", {"text": "a"}), PASS])
    graded(grader, grader_middleware=[Adds()], tools=[count_words])
    first, second = grader.calls
    assert first[-1].content == "note from before_model"
    assert [m.type for m in second] == ["system", "human", "ai", "tool", "human"]
    assert sum(m.content == "note from before_model" for m in second) == 1


# --------------------------------------------------------------------------- runs


class Counts(AgentMiddleware):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def before_agent(self, state: Any, runtime: Any) -> None:
        self.seen.append(f"before_agent:{state.get('ticket')}")

    def before_model(self, state: Any, runtime: Any) -> None:
        self.seen.append("before_model")

    def wrap_model_call(self, request: Any, handler: Any) -> Any:
        self.seen.append("wrap_model_call")
        return handler(request)


def test_each_repeat_is_a_grader_run_and_the_state_is_built_once_per_pass() -> None:
    built: list[int] = []

    def build(state: Any, iteration: int) -> dict[str, Any]:
        built.append(iteration)
        return {"ticket": "T"}

    counts = Counts()
    values = graded(ScriptedChatModel(replies=[PASS, PASS, PASS]), grader_repeats=3,
                    grader_middleware=[counts], grader_state_schema=Grading,
                    build_grader_state=build)
    assert values["_rubric_status"] == "satisfied" and built == [0]
    assert counts.seen == ["before_agent:T", "before_model", "wrap_model_call"] * 3


class RateLimited(Exception):
    status_code = 429


def test_a_retried_call_passes_the_wrap_chain_again_but_not_before_model() -> None:
    counts = Counts()
    graded(ScriptedChatModel(replies=[RateLimited("slow down"), PASS]),
           grader_middleware=[counts])
    assert counts.seen == ["before_agent:None", "before_model", "wrap_model_call",
                           "wrap_model_call"]


class EndsAfter(AgentMiddleware):
    @hook_config(can_jump_to=["end"])
    def after_model(self, state: Any, runtime: Any) -> dict[str, Any]:
        return {"jump_to": "end"}


def test_ending_the_run_after_a_verdict_keeps_it_and_refuses_a_correction() -> None:
    values = graded(ScriptedChatModel(replies=[PASS]), grader_middleware=[EndsAfter()])
    assert values["_rubric_status"] == "satisfied"
    partial = verdict("satisfied", "fine", ["c1"])  # leaves c2 out: a correction would follow
    values = graded(ScriptedChatModel(replies=[partial, PASS]), max_iterations=1,
                    grader_middleware=[EndsAfter()])
    [ev] = values["_rubric_evaluations"]
    assert ev["unverified"] is True and ev["status"] == "max_iterations_reached"


# --------------------------------------------------------------------------- errors


class ReturnsText(AgentMiddleware):
    def before_model(self, state: Any, runtime: Any) -> Any:
        return "ok"


class OnlyAsync(AgentMiddleware):
    async def abefore_model(self, state: Any, runtime: Any) -> None:
        return None


class OnlySyncWrap(AgentMiddleware):
    def wrap_model_call(self, request: Any, handler: Any) -> Any:
        return handler(request)


@pytest.mark.parametrize(
    ("middleware", "mode", "message"),
    [
        pytest.param(ReturnsText(), "invoke",
                     "ReturnsText's grader hook must return a state update", id="not_a_dict"),
        pytest.param(OnlyAsync(), "invoke", "OnlyAsync has only abefore_model",
                     id="async_only_hook_under_invoke"),
        pytest.param(OnlySyncWrap(), "ainvoke",
                     "Asynchronous implementation of awrap_model_call is not available",
                     id="sync_only_wrap_under_ainvoke"),
    ],
)
def test_a_hook_that_cannot_run_ends_the_pass_as_a_grader_error_saying_why(
    middleware: AgentMiddleware, mode: str, message: str
) -> None:
    values = graded(ScriptedChatModel(replies=[PASS]), mode, grader_middleware=[middleware])
    [ev] = values["_rubric_evaluations"]
    assert ev["result"] == "grader_error" and message in ev["explanation"]


class Commands(AgentMiddleware):
    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        return Command(update={"ticket": "x"})


def test_a_tool_hook_returning_a_command_is_answered_as_a_tool_error() -> None:
    grader = ScriptedChatModel(replies=[tool_call("count_words", {"text": "a"}), PASS])
    values = graded(grader, grader_middleware=[Commands()], tools=[count_words])
    assert values["_rubric_status"] == "satisfied"
    result = next(m for m in grader.calls[1] if isinstance(m, ToolMessage))
    assert result.status == "error" and "must return a ToolMessage, got Command" in result.content


class AsksFirst(AgentMiddleware):
    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        if interrupt({"tool": request.tool_call["name"]}) != "yes":
            return ToolMessage("refused", tool_call_id=request.tool_call["id"])
        return handler(request)


def test_an_interrupt_in_a_tool_hook_pauses_the_run_and_resumes_it() -> None:
    # The node runs again on resume, so the grader asks for the tool once more.
    asks = tool_call("count_words", {"text": "a b"})
    grader = ScriptedChatModel(replies=[asks, asks, PASS])
    agent = make(grader, grader_middleware=[AsksFirst()], tools=[count_words])
    paused = agent.invoke(ASK, CFG)
    assert paused["__interrupt__"][0].value == {"tool": "count_words"}
    assert not agent.get_state(CFG).values.get("_rubric_evaluations")
    agent.invoke(Command(resume="yes"), CFG)
    values = agent.get_state(CFG).values
    assert values["_rubric_status"] == "satisfied"
    result = next(m for m in grader.calls[-1] if isinstance(m, ToolMessage))
    assert result.content == "2"
