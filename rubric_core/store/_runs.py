"""The run index: runs, their grader passes, and who records each run now.

``runs`` and ``evaluations`` are a small index of runs and their grader passes, so that history,
filters and exports never have to decode checkpoints (LangGraph's, keyed by each run's
``thread_id``). Each run keeps its whole `RunSettings` as JSON (``settings_json``) beside the
columns Review filters on. A run has an owner (the session recording it): `RunStore.claim_run`
hands a run over, and the former owner's heartbeat, passes and ending are refused from then on
(`RunTakenOver`). API keys are never stored: :meth:`RunStore.create_run` stores a
`rubric_core.settings.RunSettings`, which holds none.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any, cast

from rubric_core.settings import RunSettings
from rubric_core.store._core import CHUNK, NO_LIMIT, StoreCore
from rubric_core.store._fence import RunTakenOver, holds
from rubric_core.store._records import (
    EVALUATION_COLUMNS,
    RUN_COLUMNS,
    RunRecord,
    evaluation_from_row,
    named_rows,
    run_from_row,
    run_to_row,
)
from rubric_core.store._schema import StoreError, search_text
from rubric_core.types import RESUMABLE_STATUSES, RUN_ORIGINS, RUN_STATUSES, TERMINAL_STATUSES

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable

    from rubric_core.store._schema import Tx
    from rubric_core.types import RubricEvaluation

_SELECT_RUN = ", ".join(RUN_COLUMNS)


class ThreadTaken(StoreError):
    """A thread that already has a run was to get another (``create_run(fresh_thread=True)``).

    Another server or process started it first.
    """

    def __init__(self, thread_id: str) -> None:
        super().__init__(f"Thread {thread_id[:8]} already has a run: another server or process "
                         "started it first.")


def check_status(status: str) -> None:
    """Raise ValueError unless ``status`` is one of `rubric_core.types.RUN_STATUSES`."""
    if status not in RUN_STATUSES:
        msg = f"unknown run status {status!r}; expected one of {sorted(RUN_STATUSES)}"
        raise ValueError(msg)


class RunStore(StoreCore):
    """The store's run index (see the module docstring); a part of `rubric_core.store.Store`."""

    def create_run(
        self, settings: RunSettings | None = None, /, *, thread_id: str | None = None,
        owner: str | None = None, fresh_thread: bool = False, **fields: Any,
    ) -> RunRecord:
        """Add a run in status ``running``.

        Only the settings are stored, and settings never hold a credential.

        Args:
            settings: The run's description (already scrubbed of secrets by the caller:
                `rubric_core.session.start` stores ``settings.redacted()``).
            thread_id: LangGraph thread id; defaults to the new run id.
            owner: Who records the run (`RunRecord.owner`); None for no fencing.
            fresh_thread: Refuse (`ThreadTaken`) when ``thread_id`` already has a run, checked
                and inserted under one lock per thread: of two processes starting the same
                experiment cell (one read "no run" and then paused, say), one starts it.
            **fields: Instead of ``settings``: `RunSettings` fields by name (``title``,
                ``prompt``, ``rubric``, ``worker_model``, ...), for scripts and tests.

        Returns:
            The stored record.

        Raises:
            TypeError: Both ``settings`` and fields, an unknown field, or a wrong type.
            ValueError: Settings that cannot run (`RunSettings.validate`).
            ThreadTaken: With ``fresh_thread``, the thread has a run already.

        """
        if settings is None:
            settings = RunSettings(**fields)
        elif fields:
            msg = f"give settings or fields, not both (got {sorted(fields)})"
            raise TypeError(msg)
        if not isinstance(settings, RunSettings):
            msg = f"settings must be RunSettings, got {type(settings).__name__}"
            raise TypeError(msg)
        settings.validate()
        run_id = uuid.uuid4().hex
        now = self.now()
        record = RunRecord(
            run_id=run_id, thread_id=thread_id or run_id, settings=settings, status="running",
            created_at=now, updated_at=now, duration_s=None, iterations=0, input_tokens=None,
            output_tokens=None, error=None, owner=owner, observed_at=now,
        )
        values = run_to_row(record)
        values["search_text"] = search_text(settings.title, settings.prompt, settings.rubric)
        with self._connect(write=True) as conn:
            if fresh_thread:
                conn.lock(f"rubric-thread:{record.thread_id}")  # SQLite: held by the write
                if conn.execute("SELECT 1 FROM runs WHERE thread_id = ?",
                                (record.thread_id,)).fetchone():
                    raise ThreadTaken(record.thread_id)
            conn.execute(
                f"INSERT INTO runs ({', '.join(values)}) "
                f"VALUES ({', '.join('?' * len(values))})",
                list(values.values()),
            )
        return record

    def add_evaluation(self, run_id: str, evaluation: RubricEvaluation, *,
                       owner: str | None = None) -> int:
        """Record one grader pass and refresh the run's totals (and status, when it ends it).

        Args:
            run_id: The run graded.
            evaluation: The evaluation as the middleware recorded it.
            owner: The recorder; the pass is refused when another owner holds the run now.

        Returns:
            The evaluation's 0-based sequence number within the run.

        Raises:
            KeyError: No such run.
            RunTakenOver: ``owner`` no longer holds the run (nothing is written).

        """
        ev = cast("dict[str, Any]", evaluation)
        check_status(ev["status"])
        now = self.now()
        with self._connect(write=True) as conn:
            # One pass at a time takes the next seq; a former owner's pass is refused.
            self._require_run(conn, run_id, lock=True, owner=owner)
            seq = conn.execute(
                "SELECT COALESCE(MAX(seq) + 1, 0) AS seq FROM evaluations WHERE run_id = ?",
                (run_id,)).fetchone()["seq"]
            extra = {k: v for k, v in ev.items() if k not in EVALUATION_COLUMNS}
            conn.execute(
                "INSERT INTO evaluations (run_id, seq, grading_run_id, iteration, result, "
                "status, explanation, criteria_json, answer, duration_s, input_tokens, "
                "output_tokens, unverified, extra_json) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id, seq, ev["grading_run_id"], ev["iteration"], ev["result"],
                    ev["status"], ev.get("explanation", ""),
                    json.dumps(ev.get("criteria", []), ensure_ascii=False),
                    ev.get("answer", ""), ev.get("duration_s"), ev.get("input_tokens"),
                    ev.get("output_tokens"), int(bool(ev.get("unverified", False))),
                    json.dumps(extra, ensure_ascii=False, sort_keys=True) if extra else None,
                ),
            )
            # A pass that ends the grading run sets the run's status; one that asks for a
            # revision leaves it as it is (``running``): a run's status is its lifecycle.
            status = ev["status"] if ev["status"] in TERMINAL_STATUSES else None
            # Cached tokens live in the pass's extra_json (an added key): the run's sum grows
            # by each pass's count as it is recorded (each pass is recorded once).
            cached = ev.get("cached_input_tokens")
            cached = None if cached is None else int(cached)
            conn.execute(
                "UPDATE runs SET iterations = ?, status = COALESCE(?, status), updated_at = ?, "
                "input_tokens = (SELECT SUM(input_tokens) FROM evaluations WHERE run_id = ?), "
                "output_tokens = (SELECT SUM(output_tokens) FROM evaluations WHERE run_id = ?), "
                "cached_input_tokens = COALESCE(cached_input_tokens + ?, cached_input_tokens, ?) "
                "WHERE run_id = ?",
                (seq + 1, status, now, run_id, run_id, cached, cached, run_id),
            )
        return int(seq)

    def finish_run(
        self,
        run_id: str,
        status: str,
        *,
        error: str | None = None,
        duration_s: float | None = None,
        owner: str | None = None,
        only_running: bool = False,
    ) -> bool:
        """Set a run's final status.

        Args:
            run_id: The run.
            status: One of :data:`RUN_STATUSES`.
            error: A message for runs that ended in ``error`` (never a credential).
            duration_s: Wall-clock seconds of the run; kept unchanged when None.
            owner: The recorder; refused when another owner holds the run now.
            only_running: Write only while the run is ``running``: an ending that is not the
                run's own (a Stop, a failure, a dead owner's run marked ``interrupted``) never
                replaces one that was recorded already (a recorder that learns late that its
                run ended, a process woken from a pause).

        Returns:
            Whether the status was written (False only with ``only_running``).

        Raises:
            KeyError: No such run.
            RunTakenOver: ``owner`` no longer holds the run (nothing is written).

        """
        check_status(status)
        with self._connect(write=True) as conn:
            self._require_run(conn, run_id, lock=owner is not None, owner=owner)
            return bool(conn.execute(
                "UPDATE runs SET status = ?, error = ?, updated_at = ?, "
                "duration_s = COALESCE(?, duration_s) WHERE run_id = ?"
                + (" AND status = 'running'" if only_running else ""),
                (status, error, self.now(), duration_s, run_id),
            ).rowcount)

    def touch_run(self, run_id: str, *, duration_s: float | None = None,
                  owner: str | None = None) -> bool:
        """The owner's heartbeat: refresh a running run's ``updated_at`` and duration so far.

        Any other status is left alone (the run has ended meanwhile), and so is a run that
        another owner holds now.

        Returns:
            False when another owner holds the run now (it was taken over: the caller lost
            it); True otherwise, also for a run that has ended.

        Raises:
            KeyError: No such run.

        """
        with self._connect(write=True) as conn:
            try:
                self._require_run(conn, run_id, lock=True, owner=owner)
            except RunTakenOver:
                return False
            conn.execute(
                "UPDATE runs SET updated_at = ?, duration_s = COALESCE(?, duration_s) "
                "WHERE run_id = ? AND status = 'running'",
                (self.now(), duration_s, run_id))
            return True

    def claim_run(self, run_id: str, *, stale_before: str, owner: str | None = None,
                  settings: RunSettings | None = None, gone_owner: str | None = None,
                  seen_status: str | None = None) -> bool:
        """Set a run ``running`` for a new recorder, unless a live one holds it.

        One statement, so of two processes resuming the same run at once only one wins: a run
        is claimed when it is not ``running``, or when its ``running`` row was not touched since
        ``stale_before`` (its owner died). The claimer becomes the run's owner: the former
        owner's heartbeat, passes and ending are refused from then on.

        With ``seen_status`` (the status the caller read when it chose to resume), a run that
        ended since (a status neither resumable nor ``running``, other than the one seen) is
        not claimed: a process that read the run before another resumed and finished it (a
        paused worker waking up, a slow second Resume) must not take a finished run back.

        Args:
            run_id: The run.
            stale_before: An ISO 8601 UTC timestamp by the database's clock (`now`).
            owner: The new recorder.
            settings: The run's settings from now on (a resume that changes its endpoint or
                models), written with the claim; already scrubbed of secrets by the caller.
                None keeps them.
            gone_owner: An owner known to be gone (`rubric_core.registry.owner_is_gone`): a
                ``running`` row it still holds is claimed however fresh its heartbeat.
            seen_status: The run's status when the caller read it (see above); None: any
                status but a live ``running``.

        Returns:
            True when this caller now holds the run; False when another recorder does.

        Raises:
            KeyError: No such run.

        """
        changed: dict[str, Any] = {}
        if settings is not None:
            settings.validate()
            changed = {"settings_json": settings.to_json(),
                       "worker_model": settings.worker_model,
                       "grader_model": settings.grader_model}
        sets = "".join(f", {column} = ?" for column in changed)
        ended: tuple[Any, ...] = ()
        only = ""
        if seen_status is not None:  # not claimable: ended since, as the caller did not see
            ended = tuple(sorted(RUN_STATUSES - RESUMABLE_STATUSES - {"running", seen_status}))
            only = f" AND status NOT IN ({', '.join('?' * len(ended))})"
        with self._connect(write=True) as conn:
            self._require_run(conn, run_id)
            return bool(conn.execute(
                "UPDATE runs SET status = 'running', error = NULL, updated_at = ?, owner = ?"
                f"{sets} WHERE run_id = ? AND (status <> 'running' OR updated_at < ? "
                f"OR owner = ?){only}",
                (self.now(), owner, *changed.values(), run_id, stale_before,
                 gone_owner or "", *ended)).rowcount)

    def interrupt_stale_runs(self, *, updated_before: str, keep: Collection[str] = ()) -> int:
        """Mark ``interrupted`` the ``running`` runs not updated since ``updated_before``.

        Args:
            updated_before: An ISO 8601 UTC timestamp, as the store writes them.
            keep: Runs to leave alone (those this process is recording).

        Returns:
            How many runs were marked.

        """
        keep = list(keep)
        sql = "UPDATE runs SET status = 'interrupted' WHERE status = 'running' AND updated_at < ?"
        if keep:
            sql += f" AND run_id NOT IN ({', '.join('?' * len(keep))})"
        with self._connect(write=True) as conn:
            return int(conn.execute(sql, [updated_before, *keep]).rowcount)

    def get_run(self, run_id: str) -> RunRecord | None:
        """The run with this id, or None."""
        with self._connect() as conn:
            row = conn.execute(
                f"SELECT {_SELECT_RUN} FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
        return run_from_row(row, self.now()) if row else None

    def latest_run_for_thread(self, thread_id: str) -> RunRecord | None:
        """The most recent run on this LangGraph thread, or None."""
        with self._connect() as conn:
            row = conn.execute(
                f"SELECT {_SELECT_RUN} FROM runs WHERE thread_id = ? "
                "ORDER BY created_at DESC, rowid DESC LIMIT 1", (thread_id,)
            ).fetchone()
        return run_from_row(row, self.now()) if row else None

    def list_runs(
        self,
        *,
        status: str | Collection[str] | None = None,
        model: str | None = None,
        text: str | None = None,
        origin: str | None = None,
        limit: int | None = 100,
        offset: int = 0,
    ) -> list[RunRecord]:
        """Runs from the index, most recent first; checkpoints are never read.

        Args:
            status: Keep runs in this status (or any of these statuses).
            model: Keep runs whose worker or grader model is exactly this.
            text: Keep runs whose title, prompt or rubric contains this, ignoring case.
            origin: Keep only runs started alone (``single``) or only experiment cells
                (``experiment``); None for both (`rubric_core.types.RunOrigin`).
            limit: At most this many runs; None for all.
            offset: Skip this many runs first (for paging).

        Returns:
            The matching runs.

        """
        where, params = self._filters(status, model, text, origin)
        if (limit is not None and limit < 0) or offset < 0:
            msg = "limit and offset must not be negative"
            raise ValueError(msg)
        sql = (
            f"SELECT {_SELECT_RUN} FROM runs{where} "
            "ORDER BY created_at DESC, rowid DESC LIMIT ? OFFSET ?"
        )
        with self._connect() as conn:
            rows = named_rows(conn.execute(
                sql, [*params, NO_LIMIT if limit is None else limit, offset]))
        now = self.now()
        return [run_from_row(row, now) for row in rows]

    def count_runs(
        self,
        *,
        status: str | Collection[str] | None = None,
        model: str | None = None,
        text: str | None = None,
        origin: str | None = None,
    ) -> int:
        """How many runs :meth:`list_runs` would find without a limit (same filters)."""
        where, params = self._filters(status, model, text, origin)
        with self._connect() as conn:
            row = conn.execute(f"SELECT COUNT(*) AS n FROM runs{where}", params).fetchone()
        return int(row["n"])

    def evaluations(self, run_id: str) -> list[RubricEvaluation]:
        """A run's evaluations in the order they were recorded (empty for unknown runs)."""
        return self.evaluations_for_runs([run_id])[run_id]

    def evaluations_for_runs(self, run_ids: Iterable[str]) -> dict[str, list[RubricEvaluation]]:
        """Evaluations of many runs in a few queries.

        Args:
            run_ids: The runs wanted.

        Returns:
            Every requested id, in the order given, mapped to its evaluations in record order.

        """
        out: dict[str, list[RubricEvaluation]] = {rid: [] for rid in run_ids}
        ids = list(out)
        with self._connect() as conn:
            for start in range(0, len(ids), CHUNK):
                chunk = ids[start : start + CHUNK]
                rows = named_rows(conn.execute(
                    f"SELECT * FROM evaluations WHERE run_id IN ({', '.join('?' * len(chunk))}) "
                    "ORDER BY run_id, seq",
                    chunk,
                ))
                for row in rows:
                    out[row["run_id"]].append(evaluation_from_row(row))
        return out

    def delete_run(self, run_id: str) -> bool:
        """Delete a run's index rows and, unless another run shares it, its thread's checkpoints.

        Returns:
            True when the run existed.

        """
        with self._connect(write=True) as conn:
            row = conn.execute("SELECT thread_id FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                return False
            thread_id = row["thread_id"]
            conn.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
            shared = conn.execute(
                "SELECT 1 FROM runs WHERE thread_id = ? LIMIT 1", (thread_id,)
            ).fetchone()
        if shared is None:
            self._delete_thread(thread_id)
        return True

    def runs_for_rubric(self, rubric: str) -> list[RunRecord]:
        """Every run graded against this rubric text, newest first.

        Spaces, tabs and line breaks around the text are ignored.
        """
        blank = " \t\r\n"
        with self._connect() as conn:
            rows = named_rows(conn.execute(
                f"SELECT {_SELECT_RUN} FROM runs WHERE trim(rubric, ?) = ? "
                "ORDER BY created_at DESC, rowid DESC", (blank, rubric.strip(blank))))
        now = self.now()
        return [run_from_row(row, now) for row in rows]

    @staticmethod
    def _require_run(conn: Tx, run_id: str, *, lock: bool = False,
                     owner: str | None = None) -> None:
        """Raise KeyError for an unknown run; with ``lock``, hold its row until the end.

        With ``owner``, also raise `RunTakenOver` when another owner holds the run now.
        """
        suffix = conn.dialect.lock_rows if lock else ""
        row = conn.execute(f"SELECT owner FROM runs WHERE run_id = ?{suffix}",
                           (run_id,)).fetchone()
        if row is None:
            msg = f"no run with id {run_id!r}"
            raise KeyError(msg)
        if not holds(row["owner"], owner):
            raise RunTakenOver(run_id)

    @staticmethod
    def _filters(
        status: str | Collection[str] | None, model: str | None, text: str | None,
        origin: str | None = None,
    ) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        if origin is not None:
            if origin not in RUN_ORIGINS:
                msg = f"unknown run origin {origin!r}; expected one of {list(RUN_ORIGINS)}"
                raise ValueError(msg)
            # experiment_cells.thread_id is unique, so indexed: a cell's run is on its thread.
            negate = "NOT " if origin == "single" else ""
            clauses.append(f"thread_id {negate}IN (SELECT thread_id FROM experiment_cells)")
        if status is not None:
            statuses = [status] if isinstance(status, str) else list(status)
            for s in statuses:
                check_status(s)
            clauses.append(f"status IN ({', '.join('?' * len(statuses))})" if statuses
                           else "1 = 0")
            params.extend(statuses)
        if model:
            clauses.append("(worker_model = ? OR grader_model = ?)")
            params.extend([model, model])
        if text:
            # search_text is casefolded in Python: neither database's lower() casefolds.
            clauses.append("search_text LIKE ? ESCAPE '\\'")
            escaped = (text.casefold().replace("\\", "\\\\").replace("%", "\\%")
                       .replace("_", "\\_"))
            params.append(f"%{escaped}%")
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), params
