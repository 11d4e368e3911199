"""The demo worker: flawed first drafts, feedback-driven revisions, streaming."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from rubric_core.examples import EXAMPLES, get_example
from rubric_core.grader import build_grader_messages
from rubric_core.middleware import revision_message
from rubric_core.offline.demo import DemoWorker
from rubric_core.offline.graders import RulesGrader
from rubric_core.types import REVISION_SOURCE, GraderResponse, RubricEvaluation


def answer(messages: list[BaseMessage]) -> str:
    reply = DemoWorker().invoke(messages)
    assert isinstance(reply.content, str)
    return reply.content


def rules_verdict(name: str, text: str) -> dict[str, Any]:
    example = get_example(name)
    messages = build_grader_messages(
        [HumanMessage(example.prompt), AIMessage(text)], example.criteria(), nonce="abc123"
    )
    grader = RulesGrader().bind_tools([*example.grader_tools(), GraderResponse])
    [call] = grader.invoke(messages).tool_calls
    return call["args"]


def feedback(criteria: list[dict[str, Any]]) -> HumanMessage:
    """The revision turn the middleware would send for these verdicts."""
    evaluation: RubricEvaluation = {
        "grading_run_id": "g", "iteration": 0, "result": "needs_revision",
        "explanation": "Some criteria fail.", "criteria": criteria,  # type: ignore[typeddict-item]
        "status": "needs_revision", "unverified": False, "duration_s": 0.0,
        "input_tokens": None, "output_tokens": None, "answer": "",
    }
    return revision_message(evaluation)


FIRST_DRAFT_FAILURES = {
    "haiku": ["Lines follow a 5-7-5 syllable pattern", "The theme is spring"],
    "photosynthesis": ["The answer is one sentence",
                       "The answer mentions light and chlorophyll"],
    "find_duplicates": ["All tests pass in run_find_duplicates_tests"],
    "json_product": ["The answer is valid JSON",
                     "The record validates against the JSON schema in check_product_schema"],
}


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_first_draft_has_realistic_flaws(name: str) -> None:
    draft = answer([SystemMessage("be good"), HumanMessage(get_example(name).prompt)])
    verdict = rules_verdict(name, draft)
    assert verdict["result"] == "needs_revision"
    failing = [c["name"] for c in verdict["criteria"] if not c["passed"]]
    assert failing == FIRST_DRAFT_FAILURES[name]


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_revision_from_the_graders_feedback_satisfies_the_rubric(name: str) -> None:
    prompt = HumanMessage(get_example(name).prompt)
    draft = answer([prompt])
    turn = feedback(rules_verdict(name, draft)["criteria"])
    revised = answer([prompt, AIMessage(draft), turn])
    assert rules_verdict(name, revised)["result"] == "satisfied"
    # Same feedback, same answer: driven by the text, not by how often it was called.
    assert answer([prompt, AIMessage(draft), turn]) == revised


def test_feedback_naming_one_criterion_fixes_only_that_one() -> None:
    prompt = HumanMessage(get_example("haiku").prompt)
    draft = answer([prompt])
    syllables_only = feedback([
        {"name": "The poem has three lines", "passed": True},
        {"name": "Lines follow a 5-7-5 syllable pattern", "passed": False,
         "gap": "line 2 has 8 syllables, needs 7"},
        {"name": "The theme is spring", "passed": True},
    ])
    revised = answer([prompt, AIMessage(draft), syllables_only])
    assert revised.splitlines()[1] == "green buds open in warm light"
    assert revised.splitlines()[0] == draft.splitlines()[0] == "Soft rain on the hill"
    # A later turn naming the theme fixes it and keeps the earlier fix.
    theme_only = feedback([{"name": "The theme is spring", "passed": False,
                            "gap": "missing: spring"}])
    final = answer([prompt, AIMessage(draft), syllables_only, AIMessage(revised), theme_only])
    assert final == "Spring rain on the hill\ngreen buds open in warm light\nbirds sing by the pond"


def test_reworded_criteria_are_matched_by_keywords() -> None:
    prompt = HumanMessage(get_example("photosynthesis").prompt)
    turn = HumanMessage(
        "Failing criteria:\n- Uses the word chlorophyll somewhere: not found\n\n"
        "Passing criteria (keep these):\n- Exactly one sentence",
        name=REVISION_SOURCE,
    )
    revised = answer([prompt, AIMessage("draft"), turn])
    assert "chlorophyll" in revised
    assert revised.count(". ") == 1  # still two sentences: that criterion was not named


def test_feedback_without_the_usual_headers_is_scanned_for_keywords() -> None:
    prompt = HumanMessage(get_example("find_duplicates").prompt)
    turn = HumanMessage("The unhashable test fails.", additional_kwargs={
        "lc_source": REVISION_SOURCE})
    assert "seen = []" in answer([prompt, AIMessage("draft"), turn])


def test_a_user_message_is_not_feedback() -> None:
    prompt = HumanMessage(get_example("haiku").prompt)
    draft = answer([prompt])
    plain = HumanMessage("Another haiku, please.\n\nFailing criteria:\n- The theme is spring: x")
    assert answer([prompt, AIMessage(draft), plain]) == draft  # a new prompt: a new draft


def test_unknown_prompt_says_it_is_an_offline_demo_and_lists_examples() -> None:
    text = answer([HumanMessage("What is the capital of France?")])
    assert "offline demo model" in text
    for name in EXAMPLES:
        assert name in text


def test_streaming_yields_word_sized_chunks_that_join_to_the_answer() -> None:
    messages = [HumanMessage(get_example("find_duplicates").prompt)]
    chunks = list(DemoWorker().stream(messages))
    pieces = [c.content for c in chunks if c.content]
    assert len(pieces) > 20
    assert all(isinstance(p, str) and len(p.split()) <= 1 for p in pieces)
    assert "".join(str(p) for p in pieces) == answer(messages)


def test_token_delay_sleeps_between_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("rubric_core.offline.demo.time.sleep", slept.append)
    pieces = [c for c in DemoWorker(token_delay_s=0.01).stream([HumanMessage("hi")]) if c.content]
    assert slept == [0.01] * (len(pieces) - 1)


def test_bind_tools_returns_the_model_itself() -> None:
    worker = DemoWorker()
    assert worker.bind_tools([GraderResponse]) is worker
    assert worker._llm_type == "demo-worker"
