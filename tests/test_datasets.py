"""Datasets: CSV and JSONL read whole or refused with the row and column named."""

from __future__ import annotations

import json

import pytest

from rubric_core import datasets
from rubric_core.datasets import DatasetError, parse_dataset, rows_from_jsonl


def test_csv_with_prompt_template_cells_rubric_and_variables() -> None:
    text = ("id,prompt,rubric,topic,season\n"
            "h1,Write a haiku about {topic} in {season}.,,rain,spring\n"
            'h2,"Summarise {topic}, briefly",- One sentence,tides,\n')
    ds = parse_dataset(text.encode("utf-8"), name="mixed.csv")
    assert ds.columns == ("id", "prompt", "rubric", "topic", "season")
    first, second = ds.rows
    assert first.id == "h1" and first.prompt == "Write a haiku about rain in spring."
    assert first.rubric is None and first.variables == {"topic": "rain", "season": "spring"}
    assert second.prompt == "Summarise tides, briefly" and second.rubric == "- One sentence"


def test_jsonl_and_a_template_for_rows_without_prompts() -> None:
    text = '{"topic": "owls", "n": 3}\n\n{"topic": "the sea", "n": 5}\n'
    ds = parse_dataset(text, template="Write {n} lines about {topic}.")
    assert [r.prompt for r in ds.rows] == ["Write 3 lines about owls.",
                                           "Write 5 lines about the sea."]
    assert [r.id for r in ds.rows] == ["1", "2"]


def test_literal_braces_and_json_in_prompts_are_kept() -> None:
    text = 'prompt,name\n"Return {{""x"": 1}} for {name} as {""a"": 2}",bob\n'
    [row] = parse_dataset(text).rows
    assert row.prompt == 'Return {"x": 1} for bob as {"a": 2}'


def test_stored_rows_round_trip_exactly() -> None:
    text = 'prompt,topic\n"Say {topic}",a {brace} value\n'
    ds = parse_dataset(text)
    back = rows_from_jsonl(ds.to_jsonl(), name=ds.name)
    assert back.rows == ds.rows
    assert json.loads(ds.to_jsonl().splitlines()[0])["prompt"] == "Say a {brace} value"


@pytest.mark.parametrize(
    ("data", "kwargs", "message"),
    [
        pytest.param(b"prompt\n\xff\xfehello\n", {}, "row 2: the file is not UTF-8",
                     id="bad_encoding"),
        pytest.param("topic\nrain\n", {}, "there is no 'prompt' column (columns: topic)",
                     id="missing_prompt"),
        pytest.param("prompt,topic\nhi,a\n,\n", {}, "row 3 is empty", id="empty_row"),
        pytest.param("prompt,topic\n\"Write about {topc}\",rain\n", {},
                     "row 2, column 'prompt' uses {topc}, but there is no column 'topc'",
                     id="unknown_variable"),
        pytest.param("topic\nrain\n", {"template": "About {season}"},
                     "the prompt template uses {season}, but there is no column 'season'",
                     id="unknown_template_variable"),
        pytest.param("prompt,topic\n\"About {topic}\",\n", {},
                     "row 2, column 'topic': empty, but the prompt uses {topic}",
                     id="empty_variable"),
        pytest.param("id,prompt\na,x\na,y\n", {}, "row 3, column 'id': 'a' is used by an earlier",
                     id="duplicate_id"),
        pytest.param("prompt,prompt\nx,y\n", {}, "column 'prompt' appears twice",
                     id="duplicate_column"),
        pytest.param("prompt,\nx,y\n", {}, "row 1, column 2: the column has no name",
                     id="unnamed_column"),
        pytest.param("prompt\n", {}, "the dataset has no rows", id="header_only"),
        pytest.param("", {}, "the dataset is empty", id="empty_file"),
        pytest.param('{"prompt": "x"}\n[1, 2]\n', {}, "row 2: a JSON list, not an object",
                     id="jsonl_not_object"),
        pytest.param('{"prompt": "x"}\n{"prompt": \n', {}, "row 2: not a JSON object",
                     id="jsonl_broken"),
        pytest.param('{"prompt": "x", "meta": {"a": 1}}\n', {}, "column 'meta': nested JSON",
                     id="jsonl_nested"),
        pytest.param("prompt\nx,y,z\n", {}, "row 2: 3 cells but the header has 1 columns",
                     id="too_many_cells"),
        pytest.param("prompt\n" + "x" * (datasets.MAX_CELL_CHARS + 1) + "\n", {},
                     "row 2, column 'prompt'", id="huge_cell"),
    ],
)
def test_bad_datasets_name_the_row_and_column(data: bytes | str, kwargs: dict[str, str],
                                              message: str) -> None:
    with pytest.raises(DatasetError) as raised:
        parse_dataset(data, **kwargs)  # type: ignore[arg-type]
    assert message in str(raised.value)


def test_size_and_row_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets, "MAX_DATASET_ROWS", 3)
    with pytest.raises(DatasetError, match="4 rows; the limit is 3"):
        parse_dataset("prompt\na\nb\nc\nd\n")
    monkeypatch.setattr(datasets, "MAX_DATASET_BYTES", 10)
    with pytest.raises(DatasetError, match="is at least 27 bytes; the limit is 10 bytes"):
        parse_dataset("prompt\n" + "a" * 20)


def test_a_bom_and_crlf_from_a_spreadsheet_are_fine() -> None:
    data = "\ufeffprompt,topic\r\n\"Write about {topic}\",rain\r\n".encode()
    [row] = parse_dataset(data).rows
    assert row.prompt == "Write about rain"
