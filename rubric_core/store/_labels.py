"""People's labels of the grader's criterion verdicts (the lab's ground truth).

``labels`` holds one row per (run, evaluation ``seq``, criterion, labeller): agree or disagree,
the verdict the person says is right, and a note of at most `LABEL_NOTE_CHAR_LIMIT` characters.
The labeller's name and the note are stored scrubbed of secrets (`rubric_core.redact`), like
every text the store keeps: a key typed into either is never written. Labels go with their
evaluations (deleting a run deletes its labels).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rubric_core.redact import redact
from rubric_core.store._core import CHUNK, StoreCore
from rubric_core.store._records import label_from_row, named_rows
from rubric_core.types import LABEL_NOTE_CHAR_LIMIT, LABELLER_CHAR_LIMIT

if TYPE_CHECKING:
    from collections.abc import Iterable

    from rubric_core.types import CriterionLabel



def check_label_text(labeller: object, note: object) -> tuple[str, str]:
    """A label's name and note as typed, checked: ``(name stripped, note)``.

    The one check of a label's text: the app calls it before saving (to say what is wrong in
    the form) and `LabelStore.set_label` calls it again, whoever its caller is.

    Raises:
        ValueError: An empty name, or a name or note over its limit (`LABELLER_CHAR_LIMIT`,
            `LABEL_NOTE_CHAR_LIMIT`); the message says which and by how much.

    """
    name = labeller.strip() if isinstance(labeller, str) else ""
    if not name:
        msg = "a label needs the labeller's name: fill in 'Your name'"
        raise ValueError(msg)
    if len(name) > LABELLER_CHAR_LIMIT:
        msg = (f"'Your name' is {len(name):,} characters; a name holds at most "
               f"{LABELLER_CHAR_LIMIT:,}. Shorten it and save the label again.")
        raise ValueError(msg)
    text = note if isinstance(note, str) else ""
    if len(text) > LABEL_NOTE_CHAR_LIMIT:
        msg = (f"the note is {len(text):,} characters; a note holds at most "
               f"{LABEL_NOTE_CHAR_LIMIT:,}. Shorten it and save the label again.")
        raise ValueError(msg)
    return name, text


def labeller_name(name: object) -> str:
    """A labeller's name as labels are keyed by it: checked, stripped, scrubbed of secrets.

    Raises:
        ValueError: As `check_label_text`.

    """
    return redact(check_label_text(name, "")[0])


class LabelStore(StoreCore):
    """The store's labels (see the module docstring); a part of `rubric_core.store.Store`."""

    def set_label(
        self, run_id: str, seq: int, criterion: str, labeller: str, *, agree: bool,
        correct: bool | None = None, note: str = "",
    ) -> CriterionLabel:
        """Record (or replace) a person's label of one criterion verdict.

        Labels are keyed by (run, evaluation ``seq``, criterion, labeller): labelling the same
        verdict again under the same name updates it and keeps its ``created_at``.

        Args:
            run_id: The run.
            seq: The evaluation's 0-based position in the run (`evaluations` order).
            criterion: The criterion's name as the evaluation records it.
            labeller: The person's local name (surrounding whitespace is ignored; stored
                scrubbed of secrets, like the note).
            agree: Whether the person agrees with the grader's verdict.
            correct: The verdict the person says is right (True: pass), or None.
            note: Free text, at most `LABEL_NOTE_CHAR_LIMIT` characters (scrubbed of secrets).

        Returns:
            The stored label.

        Raises:
            KeyError: No such run, evaluation or criterion.
            ValueError: An empty labeller, a note over `LABEL_NOTE_CHAR_LIMIT` characters, or
                ``agree`` with a ``correct`` verdict that contradicts the grader's.

        """
        name, note = check_label_text(labeller, note or "")
        labeller, note = redact(name), redact(note)
        now = self.now()
        with self._connect(write=True) as conn:
            row = conn.execute("SELECT criteria_json FROM evaluations WHERE run_id = ? AND "
                               "seq = ?", (run_id, seq)).fetchone()
            if row is None:
                msg = f"no evaluation {seq} in run {run_id!r}"
                raise KeyError(msg)
            verdicts = {c.get("name"): bool(c.get("passed"))
                        for c in json.loads(row["criteria_json"])}
            if criterion not in verdicts:
                msg = f"evaluation {seq} of run {run_id!r} has no criterion {criterion!r}"
                raise KeyError(msg)
            if agree and correct is not None and correct != verdicts[criterion]:
                msg = ("a label that agrees with the grader cannot give another verdict as the "
                       "correct one: mark it 'disagree'")
                raise ValueError(msg)
            conn.execute(
                "INSERT INTO labels (run_id, seq, criterion, labeller, agree, correct, note, "
                "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (run_id, seq, criterion, labeller) DO UPDATE SET "
                "agree = excluded.agree, correct = excluded.correct, note = excluded.note, "
                "updated_at = excluded.updated_at",
                (run_id, seq, criterion, labeller, int(bool(agree)),
                 None if correct is None else int(bool(correct)), note, now, now),
            )
            stored = conn.execute(
                "SELECT * FROM labels WHERE run_id = ? AND seq = ? AND criterion = ? AND "
                "labeller = ?", (run_id, seq, criterion, labeller)).fetchone()
        return label_from_row(stored)

    def delete_label(self, run_id: str, seq: int, criterion: str, labeller: str) -> bool:
        """Remove one label (``labeller`` as `set_label` takes it); True when it existed."""
        with self._connect(write=True) as conn:
            cursor = conn.execute(
                "DELETE FROM labels WHERE run_id = ? AND seq = ? AND criterion = ? AND "
                "labeller = ?", (run_id, seq, criterion, redact(labeller.strip())))
            return bool(cursor.rowcount)

    def labels(self, run_ids: Iterable[str] | None = None) -> list[CriterionLabel]:
        """Labels of some runs (every label when None), by run, evaluation, criterion, name.

        Args:
            run_ids: The runs wanted; None for all.

        """
        sql = "SELECT * FROM labels"
        order = " ORDER BY run_id, seq, criterion, labeller"
        with self._connect() as conn:
            if run_ids is None:
                return [label_from_row(r) for r in named_rows(conn.execute(sql + order))]
            ids = list(dict.fromkeys(run_ids))
            out: list[CriterionLabel] = []
            for start in range(0, len(ids), CHUNK):
                chunk = ids[start : start + CHUNK]
                where = f" WHERE run_id IN ({', '.join('?' * len(chunk))})"
                rows = named_rows(conn.execute(sql + where + order, chunk))
                out += [label_from_row(r) for r in rows]
        return sorted(out, key=lambda lb: (lb["run_id"], lb["seq"], lb["criterion"],
                                           lb["labeller"]))
