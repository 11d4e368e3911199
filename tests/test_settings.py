"""`RunSettings`: JSON round trip, validation, no credentials, settings of old rows."""

from __future__ import annotations

import json

import pytest

from rubric_core.examples import get_example
from rubric_core.redact import register_secret
from rubric_core.settings import RunSettings, run_title


def _full() -> RunSettings:
    return RunSettings(
        prompt="Write ✓ it", rubric="- c1\n- c2", worker_model="openai-compatible:w",
        grader_model="hybrid:openai:g", base_url="http://127.0.0.1:8000/v1",
        worker_system_prompt="Be brief.", grader_system_prompt="Be strict.",
        grader_tools=["text_stats", "run_python_tests"], max_iterations=7,
        example_name="haiku", title="A title", dataset_row={"id": 3, "tags": ["x"], "n": None},
        grader_repeats=3, consensus="unanimous", return_best=True,
    )


@pytest.mark.parametrize("settings", [
    pytest.param(RunSettings(prompt="p", rubric="- r"), id="defaults"),
    pytest.param(_full(), id="every_field"),
])
def test_json_round_trip_is_exact(settings: RunSettings) -> None:
    text = settings.to_json()
    back = RunSettings.from_json(text)
    assert back == settings and back.to_json() == text
    assert isinstance(back.grader_tools, tuple)
    assert set(json.loads(text)) == set(settings.to_dict())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("[1]", "must be a JSON object", id="not_an_object"),
        pytest.param("{", "not valid JSON", id="not_json"),
        pytest.param('{"prompt": "p"}', "lack \\['rubric'\\]", id="missing_rubric"),
        pytest.param('{"prompt": "p", "rubric": "r", "api_key": "sk"}', "unknown run setting",
                     id="unknown_key"),
    ],
)
def test_from_json_refuses_what_is_not_settings(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunSettings.from_json(text)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param({"prompt": " "}, "prompt is empty", id="empty_prompt"),
        pytest.param({"rubric": "-\n*"}, "no criteria", id="bullets_only"),
        pytest.param({"max_iterations": 0}, "between 1 and 50", id="zero_cap"),
        pytest.param({"max_iterations": 51}, "between 1 and 50", id="over_the_ceiling"),
        pytest.param({"max_iterations": True}, "whole number", id="bool_cap"),
        pytest.param({"worker_model": " "}, "must name a model", id="blank_worker"),
        pytest.param({"grader_repeats": 0}, "grader_repeats must be from 1 to 9",
                     id="zero_repeats"),
        pytest.param({"grader_repeats": 10}, "grader_repeats must be from 1 to 9",
                     id="too_many_repeats"),
        pytest.param({"consensus": "most"}, "consensus must be one of majority, unanimous",
                     id="unknown_consensus"),
    ],
)
def test_validate_says_what_is_wrong(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunSettings(prompt="p", rubric="- r").replace(**changes).validate()


def test_types_are_checked_at_construction() -> None:
    with pytest.raises(TypeError, match="prompt must be a string"):
        RunSettings(prompt=None, rubric="- r")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="grader_tools must be a list"):
        RunSettings(prompt="p", rubric="- r", grader_tools="text_stats")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="JSON values only"):
        RunSettings(prompt="p", rubric="- r", dataset_row={"x": object()})
    with pytest.raises(TypeError):
        RunSettings(prompt="p", rubric="- r", api_key="sk-x")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="grader_repeats must be a whole number"):
        RunSettings(prompt="p", rubric="- r", grader_repeats=True)
    with pytest.raises(TypeError, match="return_best must be true or false"):
        RunSettings(prompt="p", rubric="- r", return_best="yes")  # type: ignore[arg-type]


def test_settings_stored_before_the_judging_options_read_as_the_seeds_defaults() -> None:
    old = '{"prompt": "p", "rubric": "- r", "max_iterations": 2}'
    settings = RunSettings.from_json(old)
    assert (settings.grader_repeats, settings.consensus, settings.return_best) == (
        1, "majority", False)


def test_a_base_url_with_credentials_is_refused() -> None:
    with pytest.raises(ValueError, match="pass its key separately"):
        RunSettings(prompt="p", rubric="- r", base_url="http://user:sk-secret@host/v1")
    assert RunSettings(prompt="p", rubric="- r", base_url="  ").base_url is None


def test_redacted_scrubs_every_text() -> None:
    secret = "sk-settings-" + "z" * 24
    register_secret(secret)
    settings = RunSettings(prompt=f"use {secret}", rubric="- r", title=secret,
                           dataset_row={"k": secret})
    assert secret not in settings.redacted().to_json()


def test_title_is_the_examples_else_the_prompts_start() -> None:
    haiku = get_example("haiku")
    assert RunSettings(prompt=haiku.prompt, rubric="- r", example_name="haiku").titled(
    ).title == haiku.title
    # A prompt edited away from the example is the user's own run (issue #24.1).
    assert RunSettings(prompt="A limerick", rubric="- r", example_name="haiku").titled(
    ).title == "A limerick"
    assert run_title(RunSettings(prompt="Write   it\nnow", rubric="- r")) == "Write it now"
    assert run_title(RunSettings(prompt="x " * 50, rubric="- r")).endswith("…")
    assert RunSettings(prompt="p", rubric="- r", title="Mine").titled().title == "Mine"


def test_settings_of_old_rows_are_derived_from_their_columns() -> None:
    ex = get_example("find_duplicates")
    columns = {"title": "t", "worker_model": "demo", "grader_model": "rules",
               "max_iterations": 4, "worker_system_prompt": None, "grader_system_prompt": None,
               "grader_tools": None}
    of_example = RunSettings.from_columns(prompt=ex.prompt, rubric=ex.rubric, **columns)
    assert of_example.example_name == "find_duplicates"
    assert of_example.grader_tools == tuple(t.name for t in ex.grader_tools())
    assert of_example.worker_system_prompt == ex.worker_system_prompt
    plain = RunSettings.from_columns(prompt="p", rubric="- The answer mentions x", **columns)
    assert (plain.example_name, plain.grader_tools, plain.base_url) == (None, (), None)
    recorded = RunSettings.from_columns(prompt="p", rubric="- r", **{
        **columns, "worker_system_prompt": "sys", "grader_tools": ("text_stats",)})
    assert (recorded.worker_system_prompt, recorded.grader_tools) == ("sys", ("text_stats",))


@pytest.mark.parametrize("module", ["rubric_core.settings", "rubric_core.store"])
def test_light_modules_do_not_import_langchain_agents(module):
    # The store and the settings are read by tools that never run an agent (db copy, exports):
    # they must not pay for, or depend on, LangChain's agents through a shared limit.
    import subprocess
    import sys

    code = f"import sys, {module}; print('langchain.agents' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"
