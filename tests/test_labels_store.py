"""Labels where they are stored: notes are capped, and neither the labeller's name nor the note
keeps a key (issue #23, holes 10 and 11), on both databases."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from pg_support import database_holds

from rubric_core.store import LABEL_NOTE_CHAR_LIMIT, Store

if TYPE_CHECKING:
    from pathlib import Path

_KEY = "sk-proj-" + "Zq7Labeller0Name0Key0Typed0In0" * 2


def _graded_run(store: Store) -> str:
    run = store.create_run(prompt="p", rubric="- a")
    store.add_evaluation(run.run_id, {
        "grading_run_id": "g", "iteration": 0, "result": "satisfied", "explanation": "",
        "status": "satisfied", "unverified": False, "duration_s": 0.1, "input_tokens": None,
        "output_tokens": None, "answer": "x", "criteria": [{"name": "a", "passed": True}]})
    return run.run_id


def test_a_note_over_the_limit_is_refused_and_nothing_is_stored(
    db_location: str | Path,
) -> None:
    with Store(db_location) as store:
        run_id = _graded_run(store)
        with pytest.raises(ValueError, match=f"a note holds at most {LABEL_NOTE_CHAR_LIMIT:,}"):
            store.set_label(run_id, 0, "a", "ana", agree=True,
                            note="x" * (LABEL_NOTE_CHAR_LIMIT + 1))
        assert store.labels() == []
        big = "2 MB " * 400_000
        with pytest.raises(ValueError, match=f"the note is {len(big):,} characters; a note holds"):
            store.set_label(run_id, 0, "a", "ana", agree=True, note=big)
        assert store.labels() == []
        stored = store.set_label(run_id, 0, "a", "ana", agree=True,
                                 note="y" * LABEL_NOTE_CHAR_LIMIT)  # the limit itself is fine
        assert len(stored["note"]) == LABEL_NOTE_CHAR_LIMIT
        assert [lb["note"] for lb in store.labels()] == ["y" * LABEL_NOTE_CHAR_LIMIT]


def test_a_key_typed_as_the_labeller_s_name_or_in_the_note_is_stored_nowhere(
    db_location: str | Path,
) -> None:
    with Store(db_location) as store:
        run_id = _graded_run(store)
        stored = store.set_label(run_id, 0, "a", f" {_KEY} ", agree=False, correct=False,
                                 note=f"my key is {_KEY}")
        labels = store.labels()
        assert _KEY not in str(stored) and _KEY not in str(labels)
        assert [(lb["labeller"], lb["note"]) for lb in labels] == [
            ("[redacted]", "my key is [redacted]")]
        # The same name finds the same (scrubbed) label again.
        store.set_label(run_id, 0, "a", _KEY, agree=True)
        assert [lb["agree"] for lb in store.labels()] == [True]
        assert store.delete_label(run_id, 0, "a", _KEY)
        assert store.labels() == []
    assert database_holds(db_location, _KEY) == []  # the files (and WAL), or every table
    assert database_holds(db_location, _KEY[:24]) == []
