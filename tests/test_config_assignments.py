"""`ExperimentConfig.from_assignments`: the ``worker=M,grader=G,...`` form of a configuration
(the CLI's ``--config``), and the CLI's message when it cannot be read."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import pytest

from rubric_core.cli import main
from rubric_core.settings import ConfigSyntaxError, ExperimentConfig

if TYPE_CHECKING:
    from pathlib import Path


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("", {}, id="empty_is_the_default"),
    pytest.param(" worker = openai:m , grader=rules,, ", {"worker_model": "openai:m",
                                                         "grader_model": "rules"},
                 id="spaces_and_empty_parts"),
    pytest.param("tools=run_python+http_get+", {"grader_tools": ("run_python", "http_get")},
                 id="tools_joined_by_plus"),
    pytest.param("cap=5", {"max_iterations": 5}, id="cap_is_max_iterations"),
    pytest.param("max_iterations=2,grader_repeats=3", {"max_iterations": 2,
                                                        "grader_repeats": 3}, id="numbers"),
    pytest.param("return_best=ON", {"return_best": True}, id="yes_in_any_case"),
    pytest.param("return_best=off", {"return_best": False}, id="no"),
    pytest.param("base_url=http://127.0.0.1:8000/v1,label=local",
                 {"base_url": "http://127.0.0.1:8000/v1", "label": "local"}, id="url_keeps_colons"),
    pytest.param("rubric=- a", {"rubric": "- a"}, id="rubric_as_written"),
])
def test_assignments_set_the_fields_they_name(text: str, expected: dict[str, Any]) -> None:
    assert ExperimentConfig.from_assignments(text) == ExperimentConfig(**expected)


def test_rubric_and_system_values_go_through_read_text() -> None:
    seen: list[tuple[str, str]] = []

    def read(value: str, key: str) -> str:
        seen.append((value, key))
        return value.upper()

    config = ExperimentConfig.from_assignments("rubric=@r.txt,system=@s.txt,label=x",
                                               read_text=read)
    assert (config.rubric, config.worker_system_prompt, config.label) == ("@R.TXT", "@S.TXT", "x")
    assert seen == [("@r.txt", "rubric"), ("@s.txt", "system")]


@pytest.mark.parametrize(("text", "message"), [
    pytest.param("worker", "'worker': 'worker' is not KEY=VALUE with KEY one of base_url, ",
                 id="no_equals"),
    pytest.param("model=x", "'model=x': 'model=x' is not KEY=VALUE", id="unknown_key"),
    pytest.param("cap=three", "'cap=three': cap must be a whole number", id="cap_not_a_number"),
    pytest.param("return_best=maybe", "'return_best=maybe': return_best must be yes or no",
                 id="not_yes_or_no"),
])
def test_unreadable_assignments_raise_a_value_error_that_starts_with_the_text(
    text: str, message: str
) -> None:
    with pytest.raises(ConfigSyntaxError) as caught:
        ExperimentConfig.from_assignments(text)
    assert isinstance(caught.value, ValueError)
    assert str(caught.value).startswith(message)


def test_the_cli_names_the_flag_and_stores_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "db.sqlite3"
    code = main(["eval", "--dataset", "bundled", "--db", str(db), "--config", "cap=three"],
                io.StringIO())
    assert code == 2
    assert capsys.readouterr().err == "error: --config 'cap=three': cap must be a whole number\n"
    assert not db.exists()


def test_the_cli_reads_a_config_rubric_as_it_reads_every_at_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.txt"
    code = main(["eval", "--dataset", "bundled", "--db", str(tmp_path / "db.sqlite3"),
                 "--config", f"worker=demo,rubric=@{missing}"], io.StringIO())
    assert code == 2
    assert f"error: cannot read rubric file {str(missing)!r}" in capsys.readouterr().err
