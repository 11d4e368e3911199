"""Red-team attacks on datasets (issue #23): files and cells built to be misread, to exhaust
memory, or to be refused for the wrong reason.

Each is judged by what a user sees: the message names the row, the column and the limit, and
nothing is accepted in a shape other than the one the file shows.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
import tracemalloc
from typing import TYPE_CHECKING

import pytest

from rubric_core import datasets
from rubric_core.datasets import DatasetError, parse_dataset
from rubric_core.store import Store

if TYPE_CHECKING:
    from pathlib import Path


# --------------------------------------------------------------------------- limits, said right


def test_a_megabyte_cell_is_refused_as_over_the_cell_limit_naming_row_and_column() -> None:
    # The csv module's own field limit (131,072) used to decide: "not readable as CSV".
    text = 'id,prompt,notes\na,hi,short\nb,hi,"' + "x" * 1_000_000 + '"\n'
    with pytest.raises(DatasetError) as raised:
        parse_dataset(text.encode())
    assert str(raised.value).startswith(
        "row 3, column 'notes': 1,000,000 characters; the limit for a cell is 100,000.")
    assert "CSV" not in str(raised.value)


def test_a_header_cell_over_the_csv_modules_limit_is_named_too() -> None:
    with pytest.raises(DatasetError, match=r"^row 1, column 2: a column name of 200,000 char"):
        parse_dataset("prompt," + "h" * 200_000 + "\nhi,x\n")


def _refused_under_memory_limit(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    def limit_memory() -> None:  # runs in the child only
        cap = 1536 * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    return subprocess.run([sys.executable, "-c", code], preexec_fn=limit_memory,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)


def test_a_sparse_four_gigabyte_file_is_refused_by_its_size_without_being_read(
    tmp_path: Path,
) -> None:
    big = tmp_path / "big.csv"
    with big.open("wb") as handle:  # sparse: 4 GB long, no disk used
        handle.truncate(4 * 1024**3)
    code = (
        "import sys\n"
        "from rubric_core.datasets import DatasetError, read_dataset_file\n"
        "try:\n"
        f"    read_dataset_file({str(big)!r})\n"
        "except DatasetError as exc:\n"
        "    print(exc)\n"
        "    sys.exit(2)\n"
    )
    started = time.perf_counter()
    done = _refused_under_memory_limit(code, tmp_path)
    assert time.perf_counter() - started < 30
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "MemoryError" not in done.stderr
    assert done.stdout.strip() == ("the dataset is 4,096.0 MB; the limit is 20 MB. Split it into "
                                   "smaller datasets.")


def test_eval_refuses_a_sparse_four_gigabyte_dataset_by_its_size(tmp_path: Path) -> None:
    # The attack as it was made: the real CLI under a 1.5 GB memory limit ended in MemoryError.
    big = tmp_path / "big.csv"
    with big.open("wb") as handle:
        handle.truncate(4 * 1024**3)
    code = ("import sys\nfrom rubric_core.cli import main\n"
            f"sys.exit(main(['eval', '--dataset', {str(big)!r}, '--rubric', '- a', '--db', "
            f"{str(tmp_path / 'db.sqlite3')!r}]))\n")
    done = _refused_under_memory_limit(code, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "MemoryError" not in done.stderr
    assert "the dataset is 4,096.0 MB; the limit is 20 MB" in done.stderr


def test_a_dataset_file_is_refused_by_its_size_and_read_by_its_extension(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "hi", "topic": "rain"}\n' * 3, encoding="utf-8")
    monkeypatch.setattr(datasets, "MAX_DATASET_BYTES", 40)
    with pytest.raises(DatasetError, match=r"the dataset is 102 bytes; the limit is 40 bytes"):
        datasets.read_dataset_file(path)
    monkeypatch.setattr(datasets, "MAX_DATASET_BYTES", 200)
    ds = datasets.read_dataset_file(path)
    assert (ds.name, len(ds.rows), ds.columns) == ("rows", 3, ("prompt", "topic"))


# --------------------------------------------------------------------------- {column} variables


def test_id_and_rubric_columns_fill_prompt_variables() -> None:
    text = ("id,prompt,rubric\n"
            "q-17,Answer question {id} so that it meets: {rubric},- Cites a source\n")
    [row] = parse_dataset(text).rows
    assert row.prompt == "Answer question q-17 so that it meets: - Cites a source"
    assert (row.id, row.rubric, row.variables) == ("q-17", "- Cites a source", {})


def test_a_template_may_use_the_id_column() -> None:
    ds = parse_dataset('{"id": "a1", "topic": "owls"}\n', template="Row {id}: about {topic}")
    assert [r.prompt for r in ds.rows] == ["Row a1: about owls"]


@pytest.mark.parametrize(
    ("data", "kwargs", "message"),
    [
        pytest.param("prompt,topic\nSay {prompt},x\n", {},
                     "row 2, column 'prompt' uses {prompt}, but a prompt cannot fill itself",
                     id="prompt_in_its_own_cell"),
        pytest.param("prompt,topic\n,x\n", {"template": "Say {prompt}"},
                     "the prompt template uses {prompt}, but a prompt cannot fill itself",
                     id="prompt_in_the_template"),
        pytest.param("prompt\nQuestion {id}\n", {},
                     "uses {id}, but there is no column 'id' to fill it", id="id_without_column"),
        pytest.param("id,prompt\n ,Question {id}\n", {},
                     "row 2, column 'id': empty, but the prompt uses {id}", id="empty_id_cell"),
    ],
)
def test_variables_that_cannot_be_filled_are_refused_clearly(
    data: str, kwargs: dict[str, str], message: str
) -> None:
    with pytest.raises(DatasetError) as raised:
        parse_dataset(data, **kwargs)  # type: ignore[arg-type]
    assert message in str(raised.value)


def test_a_variable_used_thousands_of_times_is_refused_before_the_prompt_is_built() -> None:
    # 100 KB of "{a}" over a 100 KB cell: 3.3 GB for one row of a 200 KB file.
    text = 'prompt,a\n"' + "{a}" * 33_333 + '",' + "z" * 100_000 + "\n"
    tracemalloc.start()
    try:
        with pytest.raises(DatasetError) as raised:
            parse_dataset(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 30 * 1024 * 1024, peak
    assert str(raised.value).startswith(
        "row 2, column 'prompt': the prompt comes to 3,333,300,000 characters once its "
        "variables are filled in; the limit is 200,000.")


def test_a_modest_variable_bomb_is_refused_per_row() -> None:
    text = 'prompt,a\n"' + "{a}" * 2_000 + '",' + "z" * 50_000 + "\n"
    with pytest.raises(DatasetError, match=r"100,000,000 characters once its variables are"):
        parse_dataset(text)
    with pytest.raises(DatasetError, match=r"^row 2, the template: the prompt comes to 300,"):
        parse_dataset("a\n" + "z" * 100_000 + "\n", template="{a}{a}{a}")


def test_filled_prompts_are_bounded_for_the_whole_dataset() -> None:
    # Each row stays under the per-row limit; together they would be 60 million characters
    # from a 500 KB file.
    row = '"' + "{a}" * 199 + '",' + "z" * 1_000 + "\n"
    with pytest.raises(DatasetError) as raised:
        parse_dataset("prompt,a\n" + row * 300)
    assert "the limit for a dataset is 50,000,000" in str(raised.value)
    assert str(raised.value).startswith("row 253: ")


# --------------------------------------------------------------------------- column names


def test_a_column_name_too_long_to_repeat_in_every_row_is_refused() -> None:
    # Every stored row repeats every column name: twenty 100,000-character names over 10,000
    # one-character rows (a 2 MB file) stored as 20 GB of JSONL.
    name = "n" * (datasets.MAX_COLUMN_NAME_CHARS + 1)
    with pytest.raises(DatasetError, match=r"row 1, column 2: a column name of 101 characters"):
        parse_dataset(f"prompt,{name}\nhi,x\n")
    with pytest.raises(DatasetError, match=r"row 2, column 'n{40}…': a column name of 101"):
        parse_dataset(json.dumps({"prompt": "hi"}) + "\n" + json.dumps({"prompt": "x", name: 1}))
    ok = "n" * datasets.MAX_COLUMN_NAME_CHARS
    assert parse_dataset(f"prompt,{ok}\nhi,x\n").columns == ("prompt", ok)


def test_a_jsonl_key_with_no_name_is_refused_like_an_unnamed_csv_column() -> None:
    with pytest.raises(DatasetError, match=r"row 1, column '': the column has no name"):
        parse_dataset('{"prompt": "hi", "": "x"}\n')


# --------------------------------------------------------------------------- read as shown


def test_a_row_after_a_cell_with_line_breaks_is_numbered_as_a_spreadsheet_shows_it() -> None:
    text = 'prompt,topic\n"line one\nline two\nline three",a\n,\n'
    with pytest.raises(DatasetError, match=r"^row 3 is empty"):
        parse_dataset(text)


def test_a_quote_left_open_does_not_swallow_the_rest_of_the_file() -> None:
    # One stray quote used to turn every later row into part of one cell, silently.
    text = 'prompt\nfirst\n"second\nthird\nfourth\n'
    with pytest.raises(DatasetError) as raised:
        parse_dataset(text)
    assert str(raised.value).startswith("row 3: a quoted cell starts here and is never closed")


def test_text_after_a_closing_quote_is_refused_not_glued() -> None:
    with pytest.raises(DatasetError, match=r"^row 2: text follows a closing quote"):
        parse_dataset('prompt\n"ab"cd\n')


@pytest.mark.parametrize(
    "data",
    [
        pytest.param("\ufeffprompt,topic\nAbout {topic},rain\n", id="pasted_text_with_a_bom"),
        pytest.param(b"\xef\xbb\xbf\xef\xbb\xbfprompt,topic\nAbout {topic},rain\n",
                     id="a_file_saved_twice_with_a_bom"),
    ],
)
def test_byte_order_marks_are_not_part_of_the_first_column_name(data: str | bytes) -> None:
    ds = parse_dataset(data)
    assert ds.columns == ("prompt", "topic")
    assert ds.rows[0].prompt == "About rain"


def test_a_lone_surrogate_in_pasted_text_is_stored_not_a_traceback(tmp_path: Path) -> None:
    # Counting the size used to encode the text strictly: UnicodeEncodeError, not a message.
    ds = parse_dataset("prompt,topic\nAbout {topic},rain \ud800\n", name="pasted")
    with Store(tmp_path / "db.sqlite3") as store:
        store.save_dataset(ds)
        back, _ = store.load_dataset("pasted")
    assert back.rows[0].prompt == "About rain \ufffd"


# --------------------------------------------------------------------------- JSON and names


def test_deeply_nested_json_is_refused_with_a_message_not_a_recursion_error() -> None:
    line = '{"prompt": "x", "a": ' + "[" * 100_000 + "]" * 100_000 + "}\n"
    with pytest.raises(DatasetError, match=r"^row 1: JSON nested too deep to read"):
        parse_dataset(line)


def test_json_numbers_are_kept_as_written() -> None:
    # A 5,000-digit number is valid JSON; it was refused as "not a JSON object" (Python's
    # int conversion limit), and 1.10 became 1.1.
    digits = "7" * 5_000
    [row] = parse_dataset('{"prompt": "x {n} {m}", "n": 1.10, "id": ' + digits + ', "m": 3}\n'
                          ).rows
    assert (row.id, row.prompt) == (digits, "x 1.10 3")


@pytest.mark.parametrize(
    ("data", "name", "message"),
    [
        pytest.param('prompt,"a\x1b[31mb"\nx,y\n', "d",
                     "row 1, column 2: the column name holds a control character", id="csv"),
        pytest.param('{"prompt": "x", "a\\u001b[2Jb": 1}\n', "d",
                     "row 1, column 'a\\x1b[2Jb': the column name holds a control character",
                     id="jsonl"),
        pytest.param("prompt\nx\n", "rows\x1b[2J", "the dataset name 'rows\\x1b[2J' holds a "
                     "control character", id="dataset_name"),
        pytest.param("prompt\nx\n", "n" * 201, "a dataset name of 201 characters; the limit is 200",
                     id="long_dataset_name"),
    ],
)
def test_names_that_would_rewrite_a_terminal_or_flood_a_listing_are_refused(
    data: str, name: str, message: str
) -> None:
    with pytest.raises(DatasetError) as raised:
        parse_dataset(data, name=name)
    assert message in str(raised.value)
