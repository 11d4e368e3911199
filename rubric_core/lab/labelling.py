"""Labelling an answer set: one person's pass/fail verdict on one criterion of one answer.

An answer set's people's verdicts (`rubric_core.store.ItemLabel`) come with it from an upload,
from Review's labels of runs, or from the bundled set; `label_answer` adds one more, or
changes or removes one (a *skip*), in the stored set version itself: a verdict annotates the
answers without changing them, so the re-grades of that version judge against it at once
(`rubric_core.lab.results.read_job` reads the labels fresh). What a person types is checked as
Review's labels are (`rubric_core.store.check_label_text`: a name of 1 to
`rubric_core.types.LABELLER_CHAR_LIMIT` characters, a bounded note) and stored scrubbed of
secrets.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from rubric_core.datasets import MAX_COLUMN_NAME_CHARS
from rubric_core.redact import redact
from rubric_core.store import ItemLabel, check_label_text

if TYPE_CHECKING:
    from rubric_core.store import Store

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def label_answer(store: Store, set_name: str, set_version: int, item_id: str, criterion: str,
                 labeller: str, passed: bool | None, *, note: str = "") -> ItemLabel | None:
    """Record a person's verdict on one criterion of one answer (None: remove theirs).

    Args:
        store: The database.
        set_name: The answer set.
        set_version: Its version.
        item_id: The answer.
        criterion: The criterion as the rubric writes it (people's verdicts are matched to a
            rubric's criteria by `rubric_core.rubric.normalize_name`).
        labeller: Who gives the verdict.
        passed: True for pass, False for fail, None to remove this person's verdict (skip).
        note: Why, optionally (at most `rubric_core.types.LABEL_NOTE_CHAR_LIMIT` characters).

    Returns:
        The label as stored (scrubbed), or None when one was removed.

    Raises:
        ValueError: An empty or too long name or note, or a criterion that is not one line of
            plain text (each message says what to change).
        KeyError: No such answer in that set version.

    """
    name, text = check_label_text(labeller, note)
    if _CONTROL.search(name):
        msg = "'Your name' holds a line break or a control character: write it on one line"
        raise ValueError(msg)
    criterion = criterion.strip() if isinstance(criterion, str) else ""
    if not criterion or _CONTROL.search(criterion) or len(criterion) > MAX_COLUMN_NAME_CHARS:
        msg = (f"a labelled criterion is one line of 1 to {MAX_COLUMN_NAME_CHARS} characters, "
               f"got {criterion[:40]!r}")
        raise ValueError(msg)
    label = ItemLabel(item_id, redact(criterion), redact(name), bool(passed), redact(text))
    store.set_answer_label(set_name, set_version, label, remove=passed is None)
    return None if passed is None else label

