"""llama.cpp's Python server (``llama_cpp.server`` 0.3.36) with SmolLM2-135M-Instruct.

It differs from ``llama-server``: it validates every message against its schema (an assistant
message whose content is a list of parts, or ``null``, was answered HTTP 500, so no run could
revise there), it turns a named ``tool_choice`` into a grammar (the verdict comes as a tool
call), and it refuses a JSON-schema ``response_format`` with HTTP 500. One server for this
module; structure is asserted, never the model's wording.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from llama_support import python_server, sampling

from rubric_core import session
from rubric_core.grader import bind_grader, build_grader_messages, drive_sync, grade_steps
from rubric_core.local_model import MODEL_STRING
from rubric_core.models import resolve_model
from rubric_core.settings import RunSettings
from rubric_core.store import Store

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def python_url() -> Iterator[str]:
    with python_server() as server:
        yield server.url


def test_a_revision_is_answered_where_it_was_refused(tmp_path: Path, python_url: str) -> None:
    settings = RunSettings(prompt="Write a haiku about spring.",
                           rubric='- The poem has three lines\n- Mentions "quokka"',
                           worker_model=MODEL_STRING, grader_model="rules",
                           base_url=python_url, max_iterations=2, worker_max_tokens=40)

    def models(model: str, _role: str, base_url: str | None) -> Any:
        return resolve_model(model, base_url=base_url, timeout_s=180, **sampling())

    with Store(tmp_path / "db.sqlite3") as store, session.start(
            store, settings, models=models) as run:
        events = list(run)
    final = events[-1]
    assert final["type"] == "run_finished" and final["error"] is None, final
    assert final["status"] in {"satisfied", "max_iterations_reached"}
    assert [e["iteration"] for e in final["evaluations"]] == [0, 1]  # the revision was graded


def test_the_verdict_call_is_forced_by_name_and_complete(python_url: str) -> None:
    criteria = ["The poem is about spring"]
    model = resolve_model(MODEL_STRING, base_url=python_url, max_tokens=400, **sampling())
    binding = bind_grader(model, [], criteria)
    messages = build_grader_messages(
        [HumanMessage("Write a haiku about spring."),
         AIMessage("Spring rain on the hill\ngreen buds open in warm light\nbirds sing")],
        criteria)
    outcome = drive_sync(grade_steps(messages, criteria, [], modes=binding.modes), binding)
    assert outcome.mode == "tool_choice" and outcome.model_calls == 1
    assert [c["name"] for c in outcome.criteria] == criteria and outcome.missing == []
    assert all(isinstance(c["passed"], bool) for c in outcome.criteria)
    assert outcome.input_tokens and outcome.output_tokens
