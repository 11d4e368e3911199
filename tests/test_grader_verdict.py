"""The verdict tool built per rubric, and the forced verdict call (`rubric_core.grader.verdict`).

Against the scripted OpenAI-compatible server: what each mode sends, how a pass moves to the
next mode when a server refuses or ignores one, and what a bad reply becomes (prose, broken
or cut arguments, unknown criteria, an empty reply). tests/test_real_llama.py runs the same
pass against llama.cpp's servers.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import pytest
from langchain.agents import create_agent
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from openai_server import FakeOpenAI, Reply, error, text, tool_call
from scripted import ScriptedChatModel

from rubric_core import RubricMiddleware
from rubric_core.grader import (
    MAX_TOOL_ROUNDS,
    GraderOutputError,
    bind_grader,
    build_grader_messages,
    drive_sync,
    grade_steps,
    keyed_verdict,
    verdict_modes,
    verdict_schema,
    verdict_tool,
)
from rubric_core.grader.steps import CUT_PROBLEM, CUT_TWICE
from rubric_core.grader.verdict import (
    EXPLANATION_MAX_CHARS,
    GAP_MAX_CHARS,
    GAP_PATTERN,
    TOOL_ARG_MAX_CHARS,
)
from rubric_core.models import resolve_model
from rubric_core.offline.graders import HybridGrader

if TYPE_CHECKING:
    from collections.abc import Iterator

CRITERIA = ["The poem has three lines", "It mentions \"spring\""]
FORCED = {"type": "function", "function": {"name": "GraderResponse"}}


def keyed(*failing: str, result: str = "needs_revision") -> dict[str, Any]:
    """Verdict arguments in the per-rubric shape; criteria in ``failing`` fail."""
    return {"criteria": {c: {"passed": c not in failing, "gap": f"fix {c}" if c in failing
                             else ""} for c in CRITERIA},
            "explanation": "judged", "result": result}


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


def compatible(server: FakeOpenAI) -> Any:
    return resolve_model("openai-compatible:grader", base_url=server.base_url, timeout_s=5)


def grade(model: Any, *, tools: list[Any] | None = None, modes: Any = None,
          **kwargs: Any) -> Any:
    """One pass over a fixed answer, forced as the model's binding allows."""
    binding = bind_grader(model, tools or [], CRITERIA)
    messages = build_grader_messages([HumanMessage("Write a haiku."), AIMessage("A haiku.")],
                                     CRITERIA)
    steps = grade_steps(messages, CRITERIA, tools or [], backoff_s=0,
                        modes=binding.modes if modes is None else modes, **kwargs)
    return drive_sync(steps, binding, sleep=lambda _s: None)


# --------------------------------------------------------------------------- the schema


def test_each_criterion_is_one_required_property_by_its_exact_name() -> None:
    schema = verdict_schema(CRITERIA)
    graded = schema["properties"]["criteria"]
    assert list(graded["properties"]) == CRITERIA and graded["required"] == CRITERIA
    assert graded["additionalProperties"] is False and schema["additionalProperties"] is False
    one = graded["properties"][CRITERIA[0]]
    assert one == {"type": "object", "properties": {"passed": {"type": "boolean"},
                                                     "gap": {"type": "string"}},
                   "required": ["passed", "gap"], "additionalProperties": False}
    assert schema["required"] == ["criteria", "explanation", "result"]
    assert schema["properties"]["result"]["enum"] == ["satisfied", "needs_revision",
                                                      "rubric_cannot_be_judged"]


def test_a_bounded_criterion_passes_without_a_gap_or_fails_with_one() -> None:
    """For a grammar: a failing criterion cannot be left without its gap."""
    one = verdict_schema(CRITERIA, bounded=True)["properties"]["criteria"]["properties"][
        CRITERIA[1]]
    passes, fails = one["anyOf"]
    assert passes["properties"] == {"passed": {"type": "boolean", "const": True},
                                    "gap": {"type": "string", "maxLength": 0}}
    assert fails["properties"] == {"passed": {"type": "boolean", "const": False},
                                   "gap": {"type": "string", "pattern": GAP_PATTERN}}
    gap = re.compile(GAP_PATTERN)
    assert gap.match("Line 2 has 9 syllables") and not gap.match("\n\n")
    assert not gap.match(" x") and not gap.match("x" * (GAP_MAX_CHARS + 1))
    assert passes["additionalProperties"] is fails["additionalProperties"] is False


def test_a_rubric_with_a_repeated_criterion_is_listed_with_an_enum() -> None:
    schema = verdict_schema(["Short", "short.", "Rhymes"])
    graded = schema["properties"]["criteria"]
    assert graded["type"] == "array" and graded["minItems"] == graded["maxItems"] == 3
    assert graded["items"]["properties"]["name"]["enum"] == ["Short", "short.", "Rhymes"]
    assert graded["items"]["additionalProperties"] is False


def _properties(schema: dict[str, Any]) -> Iterator[str]:
    for name, sub in (schema.get("properties") or {}).items():
        yield name
        yield from _properties(sub)
    if isinstance(schema.get("items"), dict):
        yield from _properties(schema["items"])


def test_each_provider_gets_the_schema_it_takes(server: FakeOpenAI) -> None:
    local = verdict_tool(CRITERIA, compatible(server))["function"]
    assert local["parameters"]["properties"]["explanation"]["maxLength"] == EXPLANATION_MAX_CHARS
    one = local["parameters"]["properties"]["criteria"]["properties"][CRITERIA[0]]
    assert one["anyOf"][1]["properties"]["gap"]["pattern"] == GAP_PATTERN
    assert "strict" not in local
    own = verdict_tool(CRITERIA, ChatOpenAI(model="gpt-4.1-mini", api_key="k"))["function"]
    assert own["strict"] is True and "maxLength" not in json.dumps(own)
    anthropic = verdict_tool(CRITERIA, ChatAnthropic(model="claude-haiku-4-5", api_key="k"))
    # Anthropic's tool schemas refuse property names outside ^[a-zA-Z0-9_.-]{1,64}$.
    names = list(_properties(anthropic["function"]["parameters"]))
    assert names and all(re.fullmatch(r"[a-zA-Z0-9_.-]{1,64}", n) for n in names)
    hybrid = verdict_tool(CRITERIA, HybridGrader(llm=compatible(server)))["function"]
    assert hybrid == local  # a hybrid grader's verdict is its LLM's


def test_the_modes_tried_depend_on_the_server(server: FakeOpenAI) -> None:
    assert verdict_modes(compatible(server)) == ("tool_choice", "json_schema", "prompt")
    assert verdict_modes(ChatOpenAI(model="gpt-4.1-mini", api_key="k")) == (
        "tool_choice", "prompt")
    assert verdict_modes(ScriptedChatModel()) == ("tool_choice", "prompt")


def test_anthropic_is_sent_the_tool_it_must_call() -> None:
    """What langchain-anthropic builds from our binding (not sent: no network here)."""
    model = ChatAnthropic(model="claude-haiku-4-5", api_key="k")
    bound = bind_grader(model, [], CRITERIA).runnable("GraderResponse", "tool_choice")
    payload = model._get_request_payload([HumanMessage("grade")], **bound.kwargs)
    assert payload["tool_choice"] == {"type": "tool", "name": "GraderResponse"}
    assert [t["name"] for t in payload["tools"]] == ["GraderResponse"]


@pytest.mark.parametrize(
    ("args", "result", "names"),
    [
        pytest.param(keyed(), "satisfied", CRITERIA, id="all_pass_is_satisfied"),
        pytest.param(keyed(CRITERIA[1], result="satisfied"), "needs_revision", CRITERIA,
                     id="a_failure_is_needs_revision_whatever_it_says"),
        pytest.param(keyed(result="rubric_cannot_be_judged"), "failed", CRITERIA,
                     id="cannot_be_judged_is_failed"),
        pytest.param(keyed(result="failed"), "failed", CRITERIA, id="failed_is_kept"),
    ],
)
def test_a_keyed_verdict_reads_as_a_list_its_criteria_deciding(
        args: dict[str, Any], result: str, names: list[str]) -> None:
    read = keyed_verdict(args)
    assert read["result"] == result and [c["name"] for c in read["criteria"]] == names


# --------------------------------------------------------------------------- the forced call


def test_the_verdict_call_names_the_tool_and_its_schema(server: FakeOpenAI) -> None:
    server.enqueue(tool_call("GraderResponse", keyed(CRITERIA[0])))
    outcome = grade(compatible(server))
    (body,) = server.requests
    assert body["tool_choice"] == FORCED
    assert body["tools"][0]["function"]["parameters"] == verdict_schema(CRITERIA, bounded=True)
    assert outcome.mode == "tool_choice" and outcome.response.result == "needs_revision"
    assert [c["passed"] for c in outcome.criteria] == [False, True]


def test_a_server_that_ignores_tool_choice_is_asked_for_a_json_schema(
        server: FakeOpenAI) -> None:
    """llama.cpp's llama-server ignores tools for a template without them: prose back."""
    server.enqueue(text("The poem is lovely."), text(json.dumps(keyed())))
    outcome = grade(compatible(server))
    forced, schema = server.requests
    assert forced["tool_choice"] == FORCED
    assert "tools" not in schema and "tool_choice" not in schema
    assert schema["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "GraderResponse", "schema": verdict_schema(CRITERIA, bounded=True),
        "strict": True}}
    assert outcome.mode == "json_schema" and outcome.response.result == "satisfied"
    assert outcome.model_calls == 2


def test_a_refused_json_schema_leaves_the_prompt_alone(server: FakeOpenAI) -> None:
    """llama.cpp's Python server answers 500 naming response_format: not retried."""
    server.enqueue(text("prose"), error(500, "validation error: response_format.type"),
                   tool_call("GraderResponse", keyed()))
    outcome = grade(compatible(server))
    assert len(server.requests) == 3 and outcome.mode == "prompt"
    last = server.requests[-1]
    assert "tool_choice" not in last and "response_format" not in last
    assert outcome.retries == 0


def test_the_next_pass_starts_where_the_last_one_ended(server: FakeOpenAI) -> None:
    worker = ScriptedChatModel(replies=["draft one", "draft two"])
    server.enqueue(text("prose"), text(json.dumps(keyed(CRITERIA[0]))),
                   text(json.dumps(keyed())))
    agent = create_agent(model=worker, middleware=[
        RubricMiddleware(model=compatible(server), retry_backoff_s=0)],
        checkpointer=InMemorySaver())
    cfg: dict[str, Any] = {"configurable": {"thread_id": "t"}}
    agent.invoke({"messages": [HumanMessage("Write a haiku.")],
                  "rubric": "\n".join(f"- {c}" for c in CRITERIA)}, cfg)
    evaluations = agent.get_state(cfg).values["_rubric_evaluations"]
    assert [e["result"] for e in evaluations] == ["needs_revision", "satisfied"]
    assert [e["verdict_mode"] for e in evaluations] == ["json_schema", "json_schema"]
    assert ["response_format" in r for r in server.requests] == [False, True, True]


def test_a_server_that_says_it_takes_no_tools_starts_at_the_json_schema(
        server: FakeOpenAI) -> None:
    """llama-server says so at GET /props: no reply of prose to a tool_choice first."""
    server.props = {"chat_template_caps": {"supports_tools": False}}
    server.enqueue(text('{"text": "a"}'), text(json.dumps(keyed())))
    outcome = grade(compatible(server), tools=[text_stats], force_tools=True)
    assert outcome.mode == "json_schema" and outcome.model_calls == 2
    first = server.requests[0]["response_format"]["json_schema"]
    assert first["name"] == "text_stats"
    assert first["schema"]["properties"]["text"]["maxLength"] == TOOL_ARG_MAX_CHARS


def test_an_empty_reply_to_a_forced_call_counts_as_ignored(server: FakeOpenAI) -> None:
    server.enqueue(text(""), text(json.dumps(keyed())))
    assert grade(compatible(server)).mode == "json_schema"


# --------------------------------------------------------------------------- bad output


def test_a_verdict_cut_at_the_output_limit_is_asked_again_shorter(server: FakeOpenAI) -> None:
    cut = tool_call("GraderResponse", '{"criteria": {"The poem has', finish_reason="length")
    server.enqueue(cut, tool_call("GraderResponse", keyed()))
    outcome = grade(compatible(server))
    assert outcome.response.result == "satisfied"
    correction = server.requests[1]["messages"][-1]
    assert correction["role"] == "tool" and correction["content"] == CUT_PROBLEM


def test_a_verdict_cut_twice_fails_saying_so(server: FakeOpenAI) -> None:
    cut = text('{"criteria": {"The poem has three lines": {"passed": tr', finish_reason="length")
    server.enqueue(text("prose"), cut, cut)
    with pytest.raises(GraderOutputError, match="cut off at its output token limit") as caught:
        grade(compatible(server))
    assert CUT_TWICE in str(caught.value) and "raise the grader's max_tokens" in str(caught.value)


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        pytest.param(tool_call("GraderResponse", '{"criteria": [}'), "not valid JSON",
                     id="invalid_json_arguments"),
        pytest.param(tool_call("GraderResponse", {"criteria": {CRITERIA[0]: {
            "passed": False, "gap": ""}, CRITERIA[1]: {"passed": True, "gap": ""}},
            "explanation": "x", "result": "needs_revision"}), "without a gap",
            id="failing_without_a_gap"),
    ],
)
def test_a_malformed_forced_verdict_is_corrected_once(server: FakeOpenAI, bad: Reply,
                                                      problem: str) -> None:
    server.enqueue(bad, tool_call("GraderResponse", keyed()))
    outcome = grade(compatible(server))
    assert outcome.response.result == "satisfied"
    assert problem in server.requests[1]["messages"][-1]["content"]
    assert server.requests[1]["tool_choice"] == FORCED  # the correction is forced too


def test_criteria_not_in_the_rubric_are_recorded_and_never_counted(server: FakeOpenAI) -> None:
    """A provider that ignores the schema may invent names: they are kept apart."""
    listed = {"result": "satisfied", "explanation": "x", "criteria": [
        {"name": c, "passed": True} for c in [*CRITERIA, "Uses rhyme"]]}
    server.enqueue(tool_call("GraderResponse", listed))
    outcome = grade(compatible(server))
    assert outcome.unknown_criteria == ["Uses rhyme"] and len(outcome.criteria) == 2


# --------------------------------------------------------------------------- evidence tools


@tool
def text_stats(text: str) -> str:
    """Count the lines of a text."""
    return f"{len(text.splitlines())} lines"


def test_evidence_the_model_chooses_is_run_then_the_verdict_forced(server: FakeOpenAI) -> None:
    server.enqueue(tool_call("text_stats", {"text": "a\nb\nc"}), text("Three lines."),
                   tool_call("GraderResponse", keyed()))
    outcome = grade(compatible(server), tools=[text_stats])
    free, after, forced = server.requests
    assert "tool_choice" not in free and "tool_choice" not in after
    assert forced["tool_choice"] == FORCED
    assert after["messages"][-1] == {"role": "tool", "content": "3 lines",
                                     "tool_call_id": after["messages"][-2]["tool_calls"][0]["id"]}
    assert outcome.tool_calls == ["text_stats"] and outcome.mode == "tool_choice"


def test_past_the_round_limit_the_verdict_is_forced(server: FakeOpenAI) -> None:
    server.enqueue(*[tool_call("text_stats", {"text": "a"})] * MAX_TOOL_ROUNDS,
                   tool_call("GraderResponse", keyed()))
    outcome = grade(compatible(server), tools=[text_stats])
    assert len(outcome.tool_calls) == MAX_TOOL_ROUNDS
    assert server.requests[-1]["tool_choice"] == FORCED


@pytest.mark.parametrize("mode", ["tool_choice", "json_schema"])
def test_forced_tools_are_each_called_once_before_the_verdict(server: FakeOpenAI,
                                                              mode: str) -> None:
    if mode == "tool_choice":
        server.enqueue(tool_call("text_stats", {"text": "a\nb"}),
                       tool_call("GraderResponse", keyed()))
    else:
        server.enqueue(text('{"text": "a\\nb"}'), text(json.dumps(keyed())))
    outcome = grade(compatible(server), tools=[text_stats], force_tools=True,
                    modes=(mode, "prompt"))
    first, second = server.requests
    if mode == "tool_choice":
        assert first["tool_choice"] == {"type": "function", "function": {"name": "text_stats"}}
        assert second["tool_choice"] == FORCED
    else:
        assert first["response_format"]["json_schema"]["name"] == "text_stats"
        assert second["response_format"]["json_schema"]["name"] == "GraderResponse"
    assert outcome.tool_calls == ["text_stats"] and second["messages"][-1]["content"] == "2 lines"
    assert outcome.response.result == "satisfied"


def test_the_middleware_forces_its_tools_when_asked(server: FakeOpenAI) -> None:
    server.enqueue(tool_call("text_stats", {"text": "x"}), tool_call("GraderResponse", keyed()))
    agent = create_agent(model=ScriptedChatModel(replies=["a haiku"]), middleware=[
        RubricMiddleware(model=compatible(server), tools=[text_stats], force_tools=True)],
        checkpointer=InMemorySaver())
    cfg: dict[str, Any] = {"configurable": {"thread_id": "t"}}
    agent.invoke({"messages": [HumanMessage("Write a haiku.")],
                  "rubric": "\n".join(CRITERIA)}, cfg)
    assert agent.get_state(cfg).values["_rubric_status"] == "satisfied"
    assert server.requests[0]["tool_choice"]["function"]["name"] == "text_stats"
    with pytest.raises(TypeError, match="force_tools"):
        RubricMiddleware(model="rules", force_tools="yes")  # type: ignore[arg-type]


def test_a_hybrid_asks_its_llm_only_what_the_rules_cannot_check(server: FakeOpenAI) -> None:
    rubric = ["The poem has 3 lines", "It sounds cheerful"]
    server.enqueue(tool_call("GraderResponse", {"criteria": {"It sounds cheerful": {
        "passed": False, "gap": "gloomy"}}, "explanation": "x", "result": "needs_revision"}))
    hybrid = HybridGrader(llm=compatible(server))
    binding = bind_grader(hybrid, [], rubric)
    messages = build_grader_messages([HumanMessage("q"), AIMessage("a\nb\nc")], rubric)
    outcome = drive_sync(grade_steps(messages, rubric, [], modes=binding.modes), binding)
    (body,) = server.requests
    asked = body["tools"][0]["function"]["parameters"]["properties"]["criteria"]
    assert asked["required"] == ["It sounds cheerful"] and body["tool_choice"] == FORCED
    assert [(c["name"], c["passed"]) for c in outcome.criteria] == [
        ("The poem has 3 lines", True), ("It sounds cheerful", False)]
    assert outcome.missing == [] and outcome.response.result == "needs_revision"


def test_offline_graders_keep_working_under_the_forced_call() -> None:
    """``rules`` and ``hybrid:`` answer a forced call as before, by their own rules."""
    from rubric_core.offline.graders import RulesGrader

    rules = ["The poem has 3 lines"]
    binding = bind_grader(RulesGrader(), [], rules)
    messages = build_grader_messages([HumanMessage("q"), AIMessage("a\nb\nc")], rules)
    outcome = drive_sync(grade_steps(messages, rules, [], modes=binding.modes), binding)
    assert outcome.response.result == "satisfied" and outcome.mode == "tool_choice"


# --------------------------------------------------------------------------- usage of a failure


def test_a_grader_error_keeps_the_tokens_its_calls_used(server: FakeOpenAI,
                                                         tmp_path: Any) -> None:
    """A re-grade's cost line said "no usage reported" for gradings that all failed."""
    from rubric_core.lab import GraderConfig, create_regrade, parse_answers, run_regrade
    from rubric_core.store import Store

    server.default = text("I think it is fine.")  # never a verdict
    answers = parse_answers("id,request,answer\na,Write a haiku.,A haiku.\n", name="one")
    config = GraderConfig(rubric="- It is a haiku", grader_model="openai-compatible:g",
                          base_url=server.base_url)
    with Store(tmp_path / "db.sqlite3") as store:
        job = create_regrade(store, answers, [config])
        list(run_regrade(store, job.job_id, concurrency=1))
        (result,) = store.regrade_results(job.job_id)
    assert result.result == "grader_error" and "unusable verdict twice" in result.explanation
    assert len(server.requests) == 3  # the forced call, the JSON schema, the correction
    # Every one of the three replies reported its usage: all of it is counted.
    assert result.input_tokens is not None and result.input_tokens >= 3 * 500
    assert result.output_tokens is not None and result.output_tokens >= 3


def test_the_cli_forces_the_graders_tools_when_asked(server: FakeOpenAI) -> None:
    from rubric_core.cli import build_parser
    from rubric_core.cli.run import settings_from
    from rubric_core.session import build_spec

    args = build_parser().parse_args([
        "run", "--example", "find_duplicates", "--grader", "openai-compatible:g", "--base-url",
        server.base_url, "--force-grader-tools"])
    settings = settings_from(args)
    assert settings.force_grader_tools and settings.grader_tools
    assert build_spec(settings).force_grader_tools
    assert not settings_from(build_parser().parse_args(
        ["run", "--example", "haiku"])).force_grader_tools
