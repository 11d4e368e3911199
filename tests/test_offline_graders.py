"""The offline graders: RulesGrader verdicts and tools, HybridGrader merging with an LLM."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import pytest
from conftest import CODE_OK, HAIKU_DRAFT, HAIKU_FIXED, SUMMARY
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field
from scripted import ScriptedChatModel

from rubric_core import RubricMiddleware
from rubric_core.grader import bind_grader, build_grader_messages, drive_sync, grade_steps
from rubric_core.offline.graders import HybridGrader, RulesGrader
from rubric_core.rubric import parse_criteria
from rubric_core.tools import json_schema_tool
from rubric_core.tools.python_tests import python_tests_tool
from rubric_core.types import GraderResponse

if TYPE_CHECKING:
    from collections.abc import Sequence

    from langchain_core.runnables import RunnableConfig

CODE_BAD = "```python\ndef add(a, b):\n    return a - b\n```"
ADD_TESTS = [
    {"name": "small", "args": [1, 2], "expected": 3},
    {"name": "zero", "args": [0, 0], "expected": 0},
]


def grade(
    model: BaseChatModel, criteria: Sequence[str], answer: str, tools: Sequence[Any] = ()
) -> dict[str, Any]:
    """Send one grader request the way the grading loop does; return the verdict's args."""
    messages = build_grader_messages(
        [HumanMessage("the request"), AIMessage(answer)], criteria, nonce="abc123"
    )
    reply = model.bind_tools([*tools, GraderResponse]).invoke(messages)
    assert isinstance(reply, AIMessage)
    [call] = reply.tool_calls
    assert call["name"] == "GraderResponse"
    GraderResponse.model_validate(call["args"])  # the loop would accept it
    return call["args"]


# --------------------------------------------------------------------------- the rules grader


def test_haiku_gaps_are_exact() -> None:
    criteria = ["The poem has three lines", "Lines follow a 5-7-5 syllable pattern",
                "The theme is spring"]
    args = grade(RulesGrader(), criteria, HAIKU_DRAFT)
    assert args["result"] == "needs_revision"
    assert args["criteria"] == [
        {"name": "The poem has three lines", "passed": True},
        {"name": "Lines follow a 5-7-5 syllable pattern", "passed": False,
         "gap": "line 2 has 8 syllables, needs 7"},
        {"name": "The theme is spring", "passed": False, "gap": "missing: spring"},
    ]
    assert grade(RulesGrader(), criteria, HAIKU_FIXED)["result"] == "satisfied"


def test_the_issue_12_rubric_passes_an_answer_naming_only_cherry_blossoms() -> None:
    # Issue #12: "or" was read as "and", so a correct answer failed every pass.
    criteria = parse_criteria("- The poem mentions spring or cherry blossoms")
    answer = "Pink cherry blossoms\nfall on the quiet river\npetals drift away"
    args = grade(RulesGrader(), criteria, answer)
    assert args["result"] == "satisfied"
    assert args["criteria"] == [{"name": criteria[0], "passed": True}]
    messages = build_grader_messages([HumanMessage("req"), AIMessage(answer)], criteria)
    outcome = drive_sync(grade_steps(messages, criteria, [], backoff_s=0),
                         bind_grader(RulesGrader(), []), sleep=lambda s: None)
    assert outcome.response.result == "satisfied"
    # Still exact: an answer with neither term gets a gap that names both.
    [missing] = grade(RulesGrader(), criteria, "Soft rain on the hill")["criteria"]
    assert missing["gap"] == "missing: spring, cherry blossoms (needs at least one)"


def test_the_issue_12_rubric_is_satisfied_in_one_agent_run() -> None:
    answer = "Pink cherry blossoms\nfall on the quiet river\npetals drift away"
    worker = ScriptedChatModel(replies=[AIMessage(answer)], default="another draft")
    middleware = RubricMiddleware(model=RulesGrader(), max_iterations=3, retry_backoff_s=0)
    agent = create_agent(model=worker, middleware=[middleware], checkpointer=InMemorySaver())
    config: RunnableConfig = {"configurable": {"thread_id": "issue-12"}}
    agent.invoke({"messages": [HumanMessage("Write a haiku about spring.")],
                  "rubric": "- The poem mentions spring or cherry blossoms"}, config)
    assert agent.get_state(config).values["_rubric_status"] == "satisfied"


def test_count_and_pattern_gaps_say_what_is_wrong() -> None:
    four = HAIKU_FIXED + "\nand then the night"
    [lines, syllables] = grade(
        RulesGrader(), ["The poem has three lines", "syllables 5/7/5"], four
    )["criteria"]
    assert lines["gap"] == "the answer has 4 lines, needs exactly 3"
    assert syllables["gap"] == (
        "the answer has 4 lines (syllables 5-7-5-4); the 5-7-5 pattern needs 3"
    )
    [sentence] = grade(RulesGrader(), ["The answer is one sentence"], SUMMARY)["criteria"]
    assert sentence["gap"] == "the answer has 2 sentences, needs exactly 1"


def test_unrecognised_criterion_fails_the_verdict_and_names_it() -> None:
    criteria = ["The poem has three lines", "The imagery is vivid"]
    args = grade(RulesGrader(), criteria, HAIKU_FIXED)
    assert args["result"] == "failed"
    assert "'The imagery is vivid'" in args["explanation"]
    assert "LLM grader" in args["explanation"] and "hybrid:" in args["explanation"]
    assert args["criteria"][0] == {"name": "The poem has three lines", "passed": True}
    assert args["criteria"][1]["passed"] is False


def test_criterion_names_are_returned_exactly_as_given() -> None:
    criteria = ["The Poem HAS three lines.", "SYLLABLES 5/7/5"]
    args = grade(RulesGrader(), criteria, HAIKU_FIXED)
    assert [c["name"] for c in args["criteria"]] == criteria


def test_no_grader_request_is_a_failed_verdict() -> None:
    reply = RulesGrader().invoke([HumanMessage("hello")])
    [call] = reply.tool_calls
    assert call["args"]["result"] == "failed" and call["args"]["criteria"] == []


def test_bind_tools_returns_a_copy_that_remembers_tools_by_name() -> None:
    tool = python_tests_tool("run_add_tests", ADD_TESTS, function="add")
    base = RulesGrader()
    bound = base.bind_tools([tool, GraderResponse])
    assert bound is not base and base.tools == []
    assert [t.name for t in bound.tools] == ["run_add_tests"]
    assert bound._llm_type == "rules-grader"


def test_all_tests_pass_in_tool_calls_the_bound_tool() -> None:
    tool = python_tests_tool("run_add_tests", ADD_TESTS, function="add")
    criteria = ["All tests pass in run_add_tests"]
    assert grade(RulesGrader(), criteria, CODE_OK, [tool])["result"] == "satisfied"
    args = grade(RulesGrader(), criteria, CODE_BAD, [tool])
    assert args["result"] == "needs_revision"
    gap = args["criteria"][0]["gap"]
    assert "run_add_tests" in gap and "small" in gap
    # The same criterion without the tool bound is not recognised.
    assert grade(RulesGrader(), criteria, CODE_OK)["result"] == "failed"


def test_schema_tool_criterion_calls_the_named_tool() -> None:
    schema = {"type": "object", "properties": {"price": {"type": "number"}},
              "required": ["price"]}
    tool = json_schema_tool("check_price", schema)
    criterion = "The record validates against the JSON schema in `check_price`"
    assert grade(RulesGrader(), [criterion], '{"price": 2}', [tool])["result"] == "satisfied"
    [verdict] = grade(RulesGrader(), [criterion], '{"price": "2"}', [tool])["criteria"]
    assert verdict["gap"].startswith("check_price: ") and "number" in verdict["gap"]
    assert tool.invoke({"text": '{"price": 2}'})["ok"] is True


# --------------------------------------------------------------------------- hybrid


class TinyLLM(BaseChatModel):
    """Answers with scripted replies (or functions of the messages); records what it got."""

    replies: list[Any] = Field(default_factory=list)
    calls: list[list[BaseMessage]] = Field(default_factory=list)
    bound: list[Any] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "tiny"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> TinyLLM:  # type: ignore[override]
        self.bound = list(tools)
        return self

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        self.calls.append(list(messages))
        reply = self.replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        if callable(reply):
            reply = reply(messages)
        return ChatResult(generations=[ChatGeneration(message=reply)])


def verdict_call(result: str, items: list[dict[str, Any]], call_id: str = "v1") -> AIMessage:
    args = {"result": result, "explanation": "LLM says so.", "criteria": items}
    return AIMessage("", tool_calls=[{"name": "GraderResponse", "args": args, "id": call_id}])


HYBRID_CRITERIA = ["The poem has three lines", "Lines follow a 5-7-5 syllable pattern",
                   "The imagery is vivid"]


def test_hybrid_rule_results_override_a_contradicting_llm() -> None:
    llm = TinyLLM(replies=[verdict_call("satisfied", [
        {"name": "The poem has three lines", "passed": True},
        {"name": "Lines follow a 5-7-5 syllable pattern", "passed": True},  # wrong: 5-8-5
        {"name": "The imagery is vivid", "passed": True},
    ])])
    args = grade(HybridGrader(llm=llm), HYBRID_CRITERIA, HAIKU_DRAFT)
    assert args["result"] == "needs_revision"
    assert args["criteria"][1] == {"name": "Lines follow a 5-7-5 syllable pattern",
                                   "passed": False, "gap": "line 2 has 8 syllables, needs 7"}
    assert args["criteria"][2] == {"name": "The imagery is vivid", "passed": True}
    assert "Rule checks replaced" in args["explanation"]


def test_hybrid_sends_rule_evidence_and_binds_tools_and_verdict_schema() -> None:
    llm = TinyLLM(replies=[verdict_call("needs_revision", [
        {"name": "The imagery is vivid", "passed": False, "gap": "flat images"},
    ])])
    tool = python_tests_tool("run_add_tests", ADD_TESTS, function="add")
    args = grade(HybridGrader(llm=llm), HYBRID_CRITERIA, HAIKU_DRAFT, [tool])
    [sent] = llm.calls
    assert isinstance(sent[2], HumanMessage)  # right after the grader request
    evidence = sent[2].content
    assert isinstance(evidence, str) and evidence.startswith("<rule_evidence>")
    assert "- [PASS] 1. The poem has three lines" in evidence
    assert ("- [FAIL] 2. Lines follow a 5-7-5 syllable pattern — line 2 has 8 syllables, "
            "needs 7") in evidence
    assert "The imagery is vivid" not in evidence
    assert [getattr(t, "name", t) for t in llm.bound] == ["run_add_tests", GraderResponse]
    # The LLM answered only its own criterion; the rules fill in theirs, in rubric order.
    assert [c["name"] for c in args["criteria"]] == HYBRID_CRITERIA
    assert args["result"] == "needs_revision"


def test_hybrid_keeps_failed_and_skips_the_llm_when_rules_know_everything() -> None:
    llm = TinyLLM(replies=[verdict_call("failed", [
        {"name": c, "passed": True} for c in HYBRID_CRITERIA])])
    assert grade(HybridGrader(llm=llm), HYBRID_CRITERIA, HAIKU_FIXED)["result"] == "failed"
    idle = TinyLLM()
    args = grade(HybridGrader(llm=idle), HYBRID_CRITERIA[:2], HAIKU_FIXED)
    assert args["result"] == "satisfied" and idle.calls == []


def test_hybrid_returns_evidence_tool_calls_and_merges_after_the_loop_runs_them() -> None:
    tool = python_tests_tool("run_add_tests", ADD_TESTS, function="add")
    ask = AIMessage("", tool_calls=[{"name": "run_add_tests", "args": {"code": "def add(a, b):"
                                     "\n    return a + b"}, "id": "t1"}])

    def decide(messages: list[BaseMessage]) -> AIMessage:
        assert messages[-1].type == "tool" and '"ok": true' in str(messages[-1].content)
        return verdict_call("satisfied", [{"name": "The imagery is vivid", "passed": True}])

    llm = TinyLLM(replies=[ask, decide])
    grader = HybridGrader(llm=llm)
    messages = build_grader_messages(
        [HumanMessage("req"), AIMessage(HAIKU_FIXED)], HYBRID_CRITERIA, nonce="abc123"
    )
    steps = grade_steps(messages, HYBRID_CRITERIA, [tool])
    outcome = drive_sync(steps, bind_grader(grader, [tool]))
    assert outcome.tool_calls == ["run_add_tests"]
    assert outcome.response.result == "satisfied"
    assert [c["name"] for c in outcome.criteria] == HYBRID_CRITERIA
    # Second call: evidence still sits right after the request, before the tool exchange.
    assert str(llm.calls[1][2].content).startswith("<rule_evidence>")
    assert llm.calls[1][3] is not None and llm.calls[1][3].type == "ai"


def test_hybrid_leaves_out_what_the_llm_left_out_so_the_loop_asks_again() -> None:
    partial = verdict_call("satisfied", [{"name": "The poem has three lines", "passed": True}])
    full = verdict_call("satisfied", [{"name": "The imagery is vivid", "passed": True}], "v2")
    llm = TinyLLM(replies=[partial, full])
    messages = build_grader_messages(
        [HumanMessage("req"), AIMessage(HAIKU_FIXED)], HYBRID_CRITERIA, nonce="abc123"
    )
    grader = HybridGrader(llm=llm)
    outcome = drive_sync(grade_steps(messages, HYBRID_CRITERIA, []), bind_grader(grader, []))
    assert len(llm.calls) == 2
    assert "leaves out 1 of the 3 criteria" in str(llm.calls[1][-1].content)
    assert outcome.missing == [] and outcome.response.result == "satisfied"


def test_hybrid_async_path_merges_the_same_way() -> None:
    llm = TinyLLM(replies=[verdict_call("satisfied", [
        {"name": "The imagery is vivid", "passed": True}])])
    messages = build_grader_messages(
        [HumanMessage("req"), AIMessage(HAIKU_DRAFT)], HYBRID_CRITERIA, nonce="abc123"
    )
    bound = HybridGrader(llm=llm).bind_tools([GraderResponse])
    reply = asyncio.run(bound.ainvoke(messages))
    args = reply.tool_calls[0]["args"]
    assert args["result"] == "needs_revision"
    assert [c["passed"] for c in args["criteria"]] == [True, False, True]


# ----------------------------------------------------------------------- hybrid: rules are final


LINES_CRITERIA = ["The answer has exactly 3 lines", "The tone is friendly"]
SIX_LINES = "\n".join(f"hello friend, line {i}" for i in range(1, 7))


def text_verdict(result: str, items: list[dict[str, Any]]) -> AIMessage:
    return AIMessage("Here is my verdict:\n" + json.dumps(
        {"result": result, "explanation": "LLM says so.", "criteria": items}))


def all_pass(criteria: Sequence[str]) -> list[dict[str, Any]]:
    return [{"name": c, "passed": True} for c in criteria]


def run_hybrid(llm: TinyLLM, criteria: Sequence[str], answer: str) -> Any:
    messages = build_grader_messages([HumanMessage("req"), AIMessage(answer)], criteria)
    grader = HybridGrader(llm=llm)
    return drive_sync(grade_steps(messages, list(criteria), [], backoff_s=0),
                      bind_grader(grader, []), sleep=lambda s: None)


def test_hybrid_merges_a_verdict_written_as_json_text() -> None:
    llm = TinyLLM(replies=[text_verdict("satisfied", all_pass(LINES_CRITERIA))])
    args = grade(HybridGrader(llm=llm), LINES_CRITERIA, SIX_LINES)  # one GraderResponse call
    assert args["result"] == "needs_revision"
    assert args["criteria"][0] == {"name": "The answer has exactly 3 lines", "passed": False,
                                   "gap": "the answer has 6 lines, needs exactly 3"}
    assert args["criteria"][1] == {"name": "The tone is friendly", "passed": True}
    assert "Rule checks replaced" in args["explanation"]


def test_hybrid_text_verdict_keeps_its_text_and_runs_through_the_pass() -> None:
    llm = TinyLLM(replies=[text_verdict("satisfied", all_pass(LINES_CRITERIA))])
    messages = build_grader_messages([HumanMessage("r"), AIMessage(SIX_LINES)], LINES_CRITERIA)
    reply = HybridGrader(llm=llm).bind_tools([GraderResponse]).invoke(messages)
    assert isinstance(reply, AIMessage) and str(reply.content).startswith("Here is my verdict")
    outcome = run_hybrid(TinyLLM(replies=[text_verdict("satisfied", all_pass(LINES_CRITERIA))]),
                         LINES_CRITERIA, SIX_LINES)
    assert outcome.response.result == "needs_revision"
    assert [c["passed"] for c in outcome.criteria] == [False, True]


def test_hybrid_rules_stay_final_after_a_correction() -> None:
    llm = TinyLLM(replies=[AIMessage("Looks great to me!"),
                           text_verdict("satisfied", all_pass(LINES_CRITERIA))])
    outcome = run_hybrid(llm, LINES_CRITERIA, SIX_LINES)
    assert len(llm.calls) == 2 and "must call the GraderResponse" in str(llm.calls[1][-1].content)
    assert outcome.response.result == "needs_revision"
    assert outcome.criteria[0]["passed"] is False


def test_hybrid_rules_stay_final_after_a_transient_error() -> None:
    llm = TinyLLM(replies=[TimeoutError("slow"), text_verdict("satisfied",
                                                              all_pass(LINES_CRITERIA))])
    outcome = run_hybrid(llm, LINES_CRITERIA, SIX_LINES)
    assert outcome.retries == 1 and outcome.response.result == "needs_revision"


def test_hybrid_llm_error_is_a_failure_not_a_verdict() -> None:
    llm = TinyLLM(replies=[ValueError("bad key")])
    with pytest.raises(ValueError, match="bad key"):
        run_hybrid(llm, LINES_CRITERIA, SIX_LINES)


def test_hybrid_does_not_match_llm_answers_by_position() -> None:
    # Same count as the rubric, wrong names: nothing is taken for the LLM's own criterion.
    llm = TinyLLM(replies=[verdict_call("satisfied", all_pass(["Is polite", "Is brief"])),
                           verdict_call("satisfied", all_pass(["Is polite", "Is brief"]), "v2")])
    outcome = run_hybrid(llm, LINES_CRITERIA, "a\nb\nc")
    assert outcome.missing == ["The tone is friendly"]
    assert outcome.unknown_criteria == ["Is polite", "Is brief"]
    assert outcome.criteria == [{"name": "The answer has exactly 3 lines", "passed": True}]


def test_hybrid_passes_invented_criteria_on_for_the_pass_to_ignore() -> None:
    items = [*all_pass(LINES_CRITERIA), {"name": "Is witty", "passed": False, "gap": "joke"}]
    llm = TinyLLM(replies=[verdict_call("needs_revision", items)])
    outcome = run_hybrid(llm, LINES_CRITERIA, "hi\nthere\nfriend")
    assert outcome.response.result == "satisfied"
    assert outcome.unknown_criteria == ["Is witty"]


def test_hybrid_grader_label_names_its_llm() -> None:
    assert HybridGrader(llm=TinyLLM()).grader_label == "hybrid:TinyLLM"
    assert RulesGrader().grader_label == "rules"
