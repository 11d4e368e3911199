"""The bundled examples run end to end offline: demo worker, rules grader, SQLite checkpoints."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver

from rubric_core.examples import EXAMPLES, Example, get_example, list_examples
from rubric_core.middleware import RubricMiddleware
from rubric_core.offline.demo import DemoWorker
from rubric_core.offline.graders import RulesGrader
from rubric_core.offline.rules import unrecognised_criteria
from rubric_core.rubric import lint_rubric

if TYPE_CHECKING:
    from pathlib import Path

EXPECTED = {
    # name: (iterations, criteria that flipped from failing to passing)
    "haiku": (2, {"Lines follow a 5-7-5 syllable pattern", "The theme is spring"}),
    "photosynthesis": (2, {"The answer is one sentence",
                           "The answer mentions light and chlorophyll"}),
    "find_duplicates": (2, {"All tests pass in run_find_duplicates_tests"}),
    "json_product": (2, {"The answer is valid JSON",
                         "The record validates against the JSON schema in check_product_schema"}),
}


def run_example(example: Example, db: Path) -> dict:
    saver = SqliteSaver(sqlite3.connect(db, check_same_thread=False))
    agent = create_agent(
        model=DemoWorker(),
        system_prompt=example.worker_system_prompt,
        middleware=[RubricMiddleware(model=RulesGrader(), tools=example.grader_tools(),
                                     max_iterations=example.max_iterations)],
        checkpointer=saver,
    )
    config = {"configurable": {"thread_id": f"example-{example.name}"}}
    agent.invoke({"messages": [HumanMessage(example.prompt)], "rubric": example.rubric}, config)
    values = agent.get_state(config).values
    saver.conn.close()
    return values


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example_runs_end_to_end_and_ends_satisfied(name: str, tmp_path: Path) -> None:
    values = run_example(get_example(name), tmp_path / "db.sqlite3")
    iterations, flipped = EXPECTED[name]
    assert values["_rubric_status"] == "satisfied"
    assert values["_rubric_iterations"] == iterations
    evaluations = values["_rubric_evaluations"]
    assert len(evaluations) == iterations
    first = {c["name"]: c["passed"] for c in evaluations[0]["criteria"]}
    last = {c["name"]: c["passed"] for c in evaluations[-1]["criteria"]}
    assert {n for n in first if not first[n] and last[n]} == flipped
    assert all(last.values())
    assert evaluations[0]["result"] == "needs_revision"
    assert all(c.get("gap") for c in evaluations[0]["criteria"] if not c["passed"])


def test_a_thread_survives_a_new_connection(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite3"
    run_example(get_example("haiku"), db)
    saver = SqliteSaver(sqlite3.connect(db, check_same_thread=False))
    agent = create_agent(model=DemoWorker(), middleware=[RubricMiddleware(model=RulesGrader())],
                         checkpointer=saver)
    values = agent.get_state({"configurable": {"thread_id": "example-haiku"}}).values
    assert values["_rubric_status"] == "satisfied"
    assert len(values["_rubric_evaluations"]) == 2


@pytest.mark.parametrize("example", list_examples(), ids=lambda e: e.name)
def test_examples_are_well_formed(example: Example) -> None:
    tools = example.grader_tools()
    assert unrecognised_criteria(example.criteria(), [t.name for t in tools]) == []
    assert [i for i in lint_rubric(example.rubric) if i.level == "error"] == []
    assert example.max_iterations >= 2
    assert example.title and example.description and example.worker_system_prompt
    assert example.grader_tools() is not tools  # fresh instances each call


def test_example_tools_and_registry() -> None:
    assert [e.name for e in list_examples()] == list(EXAMPLES) == [
        "haiku", "photosynthesis", "find_duplicates", "json_product"]
    assert [t.name for t in get_example("find_duplicates").grader_tools()] == [
        "run_find_duplicates_tests"]
    assert [t.name for t in get_example("json_product").grader_tools()] == [
        "check_product_schema"]
    assert get_example("haiku").grader_tools() == []
    with pytest.raises(KeyError, match="Known examples: haiku, photosynthesis"):
        get_example("limerick")
