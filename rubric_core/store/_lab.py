"""The rubric lab: answer sets (fixed answers with people's verdicts) and their re-grades.

- ``answer_sets``, ``answer_items`` and ``answer_labels``: a named set of answers, every version
  kept, each item with its request and answer, and people's pass/fail verdicts per criterion
  and labeller. A save that would store the same items and labels as the latest version keeps
  that version (compared by a digest of the scrubbed content).
- ``regrade_jobs`` and ``regrade_results``: a re-grade of one set version under grader
  configurations (`rubric_core.lab.GraderConfig`, appended over time, never changed), and one
  result row per (job, configuration, item, repeat), with its tokens (input, of them cached,
  output). A result is written once, in one
  transaction, with ``ON CONFLICT DO NOTHING`` on that key: a resumed re-grade skips what is
  recorded, and two processes that graded the same item cannot both record it. A
  ``grader_error`` row is deleted only to retry it (`LabStore.delete_regrade_errors`).

Every text is stored scrubbed of secrets (`rubric_core.redact`), like every text the store
keeps.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import TYPE_CHECKING, Any

from rubric_core.redact import redact, redact_data, secret_values
from rubric_core.store._core import CHUNK, NO_LIMIT, StoreCore, check_name
from rubric_core.store._records import (
    AnswerItem,
    ItemLabel,
    answer_item_from_row,
    answer_set_info_from_row,
    item_label_from_row,
    named_rows,
    regrade_job_from_row,
    regrade_result_from_row,
)
from rubric_core.types import EXPERIMENT_STATUSES

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from rubric_core.grader_settings import GraderConfig
    from rubric_core.lab.answers import AnswerSet
    from rubric_core.store._records import AnswerSetInfo, RegradeJob, RegradeResult

_SET_COLUMNS = "name, version, source, item_count, label_count, created_at"
_ITEM_COLUMNS = "item_id, request, answer, rubric, origin"
_RESULT_COLUMNS = ("r.config_index, r.item_id, r.repeat_index, r.result, r.explanation, "
                   "r.criteria_json, r.missing_json, r.error, r.input_tokens, r.output_tokens, "
                   "r.duration_s, r.cached_input_tokens")


def _chunks(values: Sequence[Any]) -> Iterable[Sequence[Any]]:
    for start in range(0, len(values), CHUNK):
        yield values[start : start + CHUNK]


class LabStore(StoreCore):
    """The store's answer sets and re-grades; a part of `rubric_core.store.Store`."""

    # -- answer sets ----------------------------------------------------------------------------

    def save_answer_set(self, answer_set: AnswerSet, name: str | None = None) -> int:
        """Store a checked answer set (`rubric_core.lab.answers`) as a new version.

        Every item and label is written in one transaction, or none is; their text is scrubbed
        of secrets first.

        Args:
            answer_set: The set (items and people's verdicts).
            name: Store it under this name instead of ``answer_set.name``.

        Returns:
            The new version (1 for a new name); when the scrubbed items and labels equal the
            latest version's, that version's number and nothing is written.

        Raises:
            ValueError: An empty name or a set without items.

        """
        name = (name if name is not None else answer_set.name).strip()
        if not name:
            msg = "an answer set needs a name: give it a short non-empty name"
            raise ValueError(msg)
        check_name(name, "answer set")
        if not answer_set.items:
            msg = f"answer set {name!r} has no answers"
            raise ValueError(msg)
        known = secret_values()
        items = [(i, it.id, redact(it.request, secrets=known), redact(it.answer, secrets=known),
                  None if it.rubric is None else redact(it.rubric, secrets=known),
                  redact(it.origin, secrets=known)) for i, it in enumerate(answer_set.items)]
        labels = [(lb.item_id, redact(lb.criterion, secrets=known),
                   redact(lb.labeller, secrets=known), int(bool(lb.passed)),
                   redact(lb.note, secrets=known)) for lb in answer_set.labels]
        digest = hashlib.sha256(json.dumps([items, labels], ensure_ascii=False)
                                .encode("utf-8", "surrogatepass")).hexdigest()
        with self._connect(write=True) as conn:
            conn.lock(f"answers:{name}")  # read the latest version, then write the next one
            latest = conn.execute(
                "SELECT version, digest FROM answer_sets WHERE name = ? "
                "ORDER BY version DESC LIMIT 1", (name,)).fetchone()
            if latest is not None and latest["digest"] == digest:
                return int(latest["version"])
            version = 1 if latest is None else int(latest["version"]) + 1
            conn.execute(
                "INSERT INTO answer_sets (name, version, source, item_count, label_count, "
                "digest, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (name, version, redact(answer_set.source, secrets=known), len(items),
                 len(labels), digest, self.now()))
            conn.executemany(
                "INSERT INTO answer_items (set_name, set_version, seq, item_id, request, answer, "
                "rubric, origin) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(name, version, *row) for row in items])
            conn.executemany(
                "INSERT INTO answer_labels (set_name, set_version, item_id, criterion, labeller, "
                "passed, note) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                [(name, version, *row) for row in labels])
        return version

    def list_answer_sets(self) -> list[AnswerSetInfo]:
        """The latest version of every stored answer set, by name."""
        with self._connect() as conn:
            rows = conn.execute(
                f"SELECT {_SET_COLUMNS} FROM answer_sets s WHERE version = (SELECT MAX(version) "
                "FROM answer_sets WHERE name = s.name) ORDER BY name").fetchall()
        return [answer_set_info_from_row(r) for r in rows]

    def answer_set_versions(self, name: str) -> list[AnswerSetInfo]:
        """Every stored version of an answer set, oldest first (empty for an unknown name)."""
        with self._connect() as conn:
            rows = conn.execute(f"SELECT {_SET_COLUMNS} FROM answer_sets WHERE name = ? "
                                "ORDER BY version", (name.strip(),)).fetchall()
        return [answer_set_info_from_row(r) for r in rows]

    def answer_set_info(self, name: str, version: int | None = None) -> AnswerSetInfo:
        """One version of an answer set (the latest when ``version`` is None).

        Raises:
            KeyError: No such set or version (the message says how to list them).

        """
        sql = f"SELECT {_SET_COLUMNS} FROM answer_sets WHERE name = ?"
        params: list[Any] = [name.strip()]
        if version is None:
            sql += " ORDER BY version DESC LIMIT 1"
        else:
            sql += " AND version = ?"
            params.append(version)
        with self._connect() as conn:
            row = conn.execute(sql, params).fetchone()
        if row is None:
            which = "" if version is None else f" version {version}"
            msg = (f"no stored answer set {name!r}{which}: see `rubric-studio answers list "
                   "--db PATH`")
            raise KeyError(msg)
        return answer_set_info_from_row(row)

    def answer_items(self, name: str, version: int, *, offset: int = 0,
                     limit: int | None = None,
                     ids: Iterable[str] | None = None) -> list[AnswerItem]:
        """Items of an answer set version in set order: a page of them, or the ones named.

        Args:
            name: The set's name.
            version: Its version.
            offset: Skip this many items first (ignored with ``ids``).
            limit: At most this many (all when None; ignored with ``ids``).
            ids: Only these items (in set order; unknown ids are left out).

        """
        base = (f"SELECT {_ITEM_COLUMNS} FROM answer_items WHERE set_name = ? AND "
                "set_version = ?")
        with self._connect() as conn:
            if ids is None:
                rows = named_rows(conn.execute(
                    base + " ORDER BY seq LIMIT ? OFFSET ?",
                    (name, version, NO_LIMIT if limit is None else limit, offset)))
                return [answer_item_from_row(r) for r in rows]
            found: list[tuple[int, AnswerItem]] = []
            for chunk in _chunks(list(dict.fromkeys(ids))):
                marks = ", ".join("?" * len(chunk))
                rows = named_rows(conn.execute(
                    f"SELECT seq, {_ITEM_COLUMNS} FROM answer_items WHERE set_name = ? AND "
                    f"set_version = ? AND item_id IN ({marks})", (name, version, *chunk)))
                found += [(r["seq"], answer_item_from_row(r)) for r in rows]
        return [item for _, item in sorted(found, key=lambda pair: pair[0])]

    def answer_labels(self, name: str, version: int) -> list[ItemLabel]:
        """People's verdicts of an answer set version, by item (set order), criterion, labeller."""
        with self._connect() as conn:
            rows = named_rows(conn.execute(
                "SELECT l.item_id, l.criterion, l.labeller, l.passed, l.note FROM answer_labels l "
                "JOIN answer_items i ON i.set_name = l.set_name AND i.set_version = "
                "l.set_version AND i.item_id = l.item_id WHERE l.set_name = ? AND "
                "l.set_version = ? ORDER BY i.seq, l.criterion, l.labeller", (name, version)))
        return [item_label_from_row(r) for r in rows]

    def set_answer_label(self, set_name: str, set_version: int, label: ItemLabel,
                         *, remove: bool = False) -> bool:
        """Record (or replace) one person's verdict on one answer of a stored set version.

        Labelling annotates the answers rather than changing them, so the label is written into
        that version in place (a re-grade of it sees it at once); the version's digest is not
        changed, so importing the same file again still keeps the version, labels and all. The
        caller checks the text (`rubric_core.lab.labelling.label_answer`); it is scrubbed of
        secrets here.

        Args:
            set_name: The set's name.
            set_version: Its version.
            label: The verdict, keyed by (item, criterion, labeller).
            remove: Delete that person's verdict instead (a skip).

        Returns:
            Whether a row was written or deleted.

        Raises:
            KeyError: No such answer in that set version.

        """
        known = secret_values()
        key = (set_name, set_version, label.item_id, redact(label.criterion, secrets=known),
               redact(label.labeller, secrets=known))
        with self._connect(write=True) as conn:
            if conn.execute("SELECT 1 FROM answer_items WHERE set_name = ? AND set_version = ? "
                            "AND item_id = ?", key[:3]).fetchone() is None:
                msg = (f"no answer {label.item_id!r} in answer set {set_name!r} version "
                       f"{set_version}")
                raise KeyError(msg)
            if remove:
                changed = conn.execute(
                    "DELETE FROM answer_labels WHERE set_name = ? AND set_version = ? AND "
                    "item_id = ? AND criterion = ? AND labeller = ?", key).rowcount
            else:
                changed = conn.execute(
                    "INSERT INTO answer_labels (set_name, set_version, item_id, criterion, "
                    "labeller, passed, note) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (set_name, "
                    "set_version, item_id, criterion, labeller) DO UPDATE SET passed = "
                    "excluded.passed, note = excluded.note",
                    (*key, int(bool(label.passed)), redact(label.note, secrets=known))).rowcount
            conn.execute(
                "UPDATE answer_sets SET label_count = (SELECT COUNT(*) FROM answer_labels WHERE "
                "set_name = ? AND set_version = ?) WHERE name = ? AND version = ?",
                (set_name, set_version, set_name, set_version))
        return bool(changed)

    def delete_answer_set(self, name: str) -> int:
        """Delete every version of an answer set that no re-grade uses.

        Returns:
            How many versions were deleted (0 for an unknown name).

        Raises:
            ValueError: A re-grade uses one of its versions (delete it first).

        """
        with self._connect(write=True) as conn:
            used = [r["job_id"] for r in conn.execute(
                "SELECT job_id FROM regrade_jobs WHERE set_name = ? LIMIT 3", (name.strip(),))]
            if used:
                msg = (f"answer set {name!r} is used by re-grade(s) "
                       f"{', '.join(u[:8] for u in used)}: delete them first")
                raise ValueError(msg)
            return int(conn.execute("DELETE FROM answer_sets WHERE name = ?",
                                    (name.strip(),)).rowcount)

    # -- re-grade jobs --------------------------------------------------------------------------

    def create_regrade_job(self, *, name: str, set_name: str, set_version: int,
                           configurations: Sequence[GraderConfig]) -> RegradeJob:
        """Add a re-grade of a stored answer set version under these configurations.

        The configurations are stored scrubbed of secrets; the record holds what was stored.

        Raises:
            ValueError: No configurations.
            KeyError: No such answer set version.

        """
        if not configurations:
            msg = "a re-grade needs at least one grader configuration"
            raise ValueError(msg)
        known = secret_values()
        stored = [redact_data(c.to_dict(), secrets=known) for c in configurations]
        job_id, now = uuid.uuid4().hex, self.now()
        with self._connect(write=True) as conn:
            if conn.execute("SELECT 1 FROM answer_sets WHERE name = ? AND version = ?",
                            (set_name, set_version)).fetchone() is None:
                msg = f"no stored answer set {set_name!r} version {set_version}"
                raise KeyError(msg)
            conn.execute(
                "INSERT INTO regrade_jobs (job_id, name, set_name, set_version, configs_json, "
                "status, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (job_id, redact(name.strip() or set_name, secrets=known), set_name, set_version,
                 json.dumps(stored, ensure_ascii=False), "running", now, now))
            row = conn.execute("SELECT * FROM regrade_jobs WHERE job_id = ?",
                               (job_id,)).fetchone()
        return regrade_job_from_row(row)

    def get_regrade_job(self, job_id: str) -> RegradeJob | None:
        """The re-grade with this id, or None."""
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM regrade_jobs WHERE job_id = ?",
                               (job_id,)).fetchone()
        return regrade_job_from_row(row) if row else None

    def list_regrade_jobs(self, *, limit: int | None = 100) -> list[RegradeJob]:
        """Re-grades, most recent first."""
        with self._connect() as conn:
            rows = named_rows(conn.execute(
                "SELECT * FROM regrade_jobs ORDER BY created_at DESC, rowid DESC LIMIT ?",
                (NO_LIMIT if limit is None else limit,)))
        return [regrade_job_from_row(r) for r in rows]

    def set_regrade_status(self, job_id: str, status: str) -> None:
        """Set a re-grade's lifecycle status (`rubric_core.types.EXPERIMENT_STATUSES`)."""
        if status not in EXPERIMENT_STATUSES:
            msg = f"unknown re-grade status {status!r}; expected {sorted(EXPERIMENT_STATUSES)}"
            raise ValueError(msg)
        with self._connect(write=True) as conn:
            conn.execute("UPDATE regrade_jobs SET status = ?, updated_at = ? WHERE job_id = ?",
                         (status, self.now(), job_id))

    def touch_regrade(self, job_id: str) -> None:
        """Say that a process grades this re-grade now (``updated_at``, by the database's clock).

        Every process grading a re-grade's items touches it every
        `rubric_core.session.HEARTBEAT_S`; recovery on another machine reads it
        (`regrade_touched`) to tell a re-grade still being graded from one whose processes died
        (`rubric_core.engine.recovery`).
        """
        with self._connect(write=True) as conn:
            conn.execute("UPDATE regrade_jobs SET updated_at = ? WHERE job_id = ?",
                         (self.now(), job_id))

    def regrade_touched(self, job_ids: Iterable[str]) -> dict[str, str | None]:
        """When each of these re-grades was last touched or changed (ISO 8601 UTC)."""
        out: dict[str, str | None] = {}
        with self._connect() as conn:
            for chunk in _chunks(list(dict.fromkeys(job_ids))):
                marks = ", ".join("?" * len(chunk))
                out.update((str(r[0]), r[1]) for r in conn.execute(
                    f"SELECT job_id, updated_at FROM regrade_jobs WHERE job_id IN ({marks})",
                    chunk))
        return out

    def add_regrade_config(self, job_id: str, config: GraderConfig) -> int:
        """Append a configuration to a re-grade (its answers graded again under it).

        Returns:
            The new configuration's index.

        Raises:
            KeyError: No such re-grade.

        """
        stored = redact_data(config.to_dict())
        with self._connect(write=True) as conn:
            conn.lock(f"regrade:{job_id}")  # read the configurations, then write them longer
            row = conn.execute(f"SELECT configs_json FROM regrade_jobs WHERE job_id = ?"
                               f"{conn.dialect.lock_rows}", (job_id,)).fetchone()
            if row is None:
                msg = f"no re-grade {job_id!r}"
                raise KeyError(msg)
            configs = [*json.loads(row["configs_json"]), stored]
            conn.execute("UPDATE regrade_jobs SET configs_json = ?, status = 'running', "
                         "updated_at = ? WHERE job_id = ?",
                         (json.dumps(configs, ensure_ascii=False), self.now(), job_id))
        return len(configs) - 1

    def delete_regrade_job(self, job_id: str) -> bool:
        """Delete a re-grade and its results; False when there is no such re-grade.

        Items of it still queued on the queue engine find it gone and end without grading.
        """
        with self._connect(write=True) as conn:
            return bool(conn.execute("DELETE FROM regrade_jobs WHERE job_id = ?",
                                     (job_id,)).rowcount)

    # -- re-grade results -----------------------------------------------------------------------

    def record_regrade_result(self, job_id: str, result: RegradeResult) -> bool:
        """Record one grading, once: True when written, False when that key already was.

        The texts are scrubbed of secrets before they are written.
        """
        known = secret_values()
        with self._connect(write=True) as conn:
            return bool(conn.execute(
                "INSERT INTO regrade_results (job_id, config_index, item_id, repeat_index, "
                "result, explanation, criteria_json, missing_json, error, input_tokens, "
                "output_tokens, duration_s, created_at, cached_input_tokens) VALUES (?, ?, ?, ?, "
                "?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (job_id, result.config_index, result.item_id, result.repeat_index, result.result,
                 redact(result.explanation, secrets=known),
                 json.dumps(redact_data(list(result.criteria), secrets=known),
                            ensure_ascii=False),
                 json.dumps(redact_data(list(result.missing), secrets=known),
                            ensure_ascii=False),
                 None if result.error is None else redact(result.error, secrets=known),
                 result.input_tokens, result.output_tokens, result.duration_s, self.now(),
                 result.cached_input_tokens),
            ).rowcount)

    def graded_keys(self, job_id: str,
                    item_ids: Iterable[str]) -> set[tuple[int, str, int]]:
        """The (configuration, item, repeat) keys recorded for these items of a re-grade."""
        out: set[tuple[int, str, int]] = set()
        with self._connect() as conn:
            for chunk in _chunks(list(dict.fromkeys(item_ids))):
                marks = ", ".join("?" * len(chunk))
                out.update((int(r[0]), str(r[1]), int(r[2])) for r in conn.execute(
                    "SELECT config_index, item_id, repeat_index FROM regrade_results WHERE "
                    f"job_id = ? AND item_id IN ({marks})", (job_id, *chunk)))
        return out

    def regrade_counts(self, job_id: str) -> dict[int, tuple[int, int]]:
        """Per configuration index: (results recorded, of which ``grader_error``)."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT config_index, COUNT(*) AS n, SUM(CASE WHEN result = 'grader_error' "
                "THEN 1 ELSE 0 END) AS errors FROM regrade_results WHERE job_id = ? "
                "GROUP BY config_index", (job_id,)).fetchall()
        return {int(r["config_index"]): (int(r["n"]), int(r["errors"] or 0)) for r in rows}

    def regrade_results(self, job_id: str, *,
                        config_index: int | None = None) -> list[RegradeResult]:
        """A re-grade's results, by configuration, item (set order) and repeat; no answer text."""
        where = "r.job_id = ?"
        params: list[Any] = [job_id]
        if config_index is not None:
            where += " AND r.config_index = ?"
            params.append(config_index)
        with self._connect() as conn:
            rows = named_rows(conn.execute(
                f"SELECT {_RESULT_COLUMNS} FROM regrade_results r "
                "JOIN regrade_jobs j ON j.job_id = r.job_id "
                "LEFT JOIN answer_items i ON i.set_name = j.set_name AND i.set_version = "
                "j.set_version AND i.item_id = r.item_id "
                f"WHERE {where} ORDER BY r.config_index, i.seq, r.repeat_index", params))
        return [regrade_result_from_row(r) for r in rows]

    def delete_regrade_errors(self, job_id: str, *, config_index: int | None = None,
                              item_id: str | None = None) -> int:
        """Delete ``grader_error`` results so that they are graded again (a retry).

        Returns:
            How many were deleted.

        """
        sql = "DELETE FROM regrade_results WHERE job_id = ? AND result = 'grader_error'"
        params: list[Any] = [job_id]
        if config_index is not None:
            sql += " AND config_index = ?"
            params.append(config_index)
        if item_id is not None:
            sql += " AND item_id = ?"
            params.append(item_id)
        with self._connect(write=True) as conn:
            return int(conn.execute(sql, params).rowcount)
