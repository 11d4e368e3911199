"""Call traces: every model call of a run (``model_calls``), bounded per run.

The session recording a run writes its calls as each pass ends (`CallStore.add_calls`), under
the run's owner, as evaluations are written: a former owner that was only paused finds its
calls refused (`rubric_core.store.RunTakenOver`). A run's calls are bounded as a whole: at
most `MAX_CALLS_PER_RUN` rows, and at most `CALL_CONTENT_BUDGET_CHARS` characters of messages
and replies; past the budget a call keeps its numbers (tokens, latency, retries) and says that
its text was not kept (``content_kept`` False). A call is recorded once: a resumed run that
reports a call again (same ``call_id``) changes nothing.

The records (`rubric_core.types.ModelCallRecord`) arrive scrubbed of secrets and cut to size
(`rubric_core.calls`); each one's numbers have columns of their own, so a price table can
cost calls in SQL, and its messages, reply and tool names are one JSON text.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, cast

from rubric_core.store._core import CHUNK
from rubric_core.store._records import CALL_USAGE_COLUMNS, CallUsage, named_rows
from rubric_core.store._runs import RunStore
from rubric_core.types import CALL_CONTENT_BUDGET_CHARS, MAX_CALLS_PER_RUN

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from rubric_core.types import ModelCallRecord

_NUMBERS = ("call_id", "role", "iteration", "grading_run_id", "attempt", "provider", "model",
            "status", "error", "started_at", "latency_s", "first_token_s", "input_tokens",
            "cached_input_tokens", "cache_creation_tokens", "output_tokens", "http_retries")
"""`ModelCallRecord` keys with a column of their own, in column order."""

_CONTENT = ("messages", "messages_total", "reply", "tools")
"""`ModelCallRecord` keys kept together in ``content_json``."""

_INSERT = (f"INSERT INTO model_calls (run_id, seq, {', '.join(_NUMBERS)}, content_json, "
           f"content_chars) VALUES ({', '.join('?' * (len(_NUMBERS) + 4))}) "
           "ON CONFLICT DO NOTHING")


def _call_from_row(row: Any) -> ModelCallRecord:
    content = json.loads(row["content_json"]) if row["content_json"] else None
    call = {name: row[name] for name in _NUMBERS}
    call.update({"messages": [], "messages_total": 0, "reply": None, "tools": []})
    if content is not None:
        call.update({k: content[k] for k in _CONTENT if k in content})
    call["content_kept"] = content is not None
    return cast("ModelCallRecord", call)


class CallStore(RunStore):
    """The store's call traces (see the module docstring); a part of `rubric_core.store.Store`.

    A run's calls belong to it (and go with it), so this part extends the run index.
    """

    def add_calls(self, run_id: str, calls: Sequence[ModelCallRecord], *,
                  owner: str | None = None) -> int:
        """Record model calls of a run, within the run's bounds.

        Args:
            run_id: The run the calls were made for.
            calls: Call records, scrubbed and cut to size (`rubric_core.calls`).
            owner: The recorder; the calls are refused when another owner holds the run now.

        Returns:
            How many calls were stored (a call already stored, or one past
            `MAX_CALLS_PER_RUN`, is not).

        Raises:
            KeyError: No such run.
            RunTakenOver: ``owner`` no longer holds the run (nothing is written).

        """
        if not calls:
            return 0
        with self._connect(write=True) as conn:
            self._require_run(conn, run_id, lock=True, owner=owner)
            row = conn.execute(
                "SELECT COUNT(*) AS n, COALESCE(MAX(seq) + 1, 0) AS next_seq, "
                "COALESCE(SUM(content_chars), 0) AS chars FROM model_calls WHERE run_id = ?",
                (run_id,)).fetchone()
            count, seq, used = int(row["n"]), int(row["next_seq"]), int(row["chars"])
            rows: list[tuple[Any, ...]] = []
            for call in calls[: max(0, MAX_CALLS_PER_RUN - count)]:
                content = json.dumps({k: call.get(k) for k in _CONTENT}, ensure_ascii=False)
                if used + len(content) > CALL_CONTENT_BUDGET_CHARS:
                    stored, chars = None, 0  # the numbers still count; the text is not kept
                else:
                    stored, chars = content, len(content)
                    used += chars
                rows.append((run_id, seq, *(call.get(name) for name in _NUMBERS), stored,
                             chars))
                seq += 1
            conn.executemany(_INSERT, rows)
            after = conn.execute("SELECT COUNT(*) AS n FROM model_calls WHERE run_id = ?",
                                 (run_id,)).fetchone()["n"]
        return int(after) - count

    def calls(self, run_id: str) -> list[ModelCallRecord]:
        """A run's model calls in the order they ended (empty for unknown runs)."""
        return self.calls_for_runs([run_id])[run_id]

    def calls_for_runs(self, run_ids: Iterable[str]) -> dict[str, list[ModelCallRecord]]:
        """Model calls of many runs in a few queries.

        Returns:
            Every requested id, in the order given, mapped to its calls in record order.

        """
        out: dict[str, list[ModelCallRecord]] = {rid: [] for rid in run_ids}
        ids = list(out)
        with self._connect() as conn:
            for start in range(0, len(ids), CHUNK):
                chunk = ids[start : start + CHUNK]
                rows = named_rows(conn.execute(
                    f"SELECT * FROM model_calls WHERE run_id IN ({', '.join('?' * len(chunk))}) "
                    "ORDER BY run_id, seq", chunk))
                for row in rows:
                    out[row["run_id"]].append(_call_from_row(row))
        return out

    def call_usage_for_runs(self, run_ids: Iterable[str]) -> dict[str, list[CallUsage]]:
        """The numbers of many runs' calls (no messages or replies), for pricing.

        Returns:
            Every requested id mapped to its calls in record order.

        """
        out: dict[str, list[CallUsage]] = {rid: [] for rid in run_ids}
        ids = list(out)
        columns = ", ".join(CALL_USAGE_COLUMNS)
        with self._connect() as conn:
            for start in range(0, len(ids), CHUNK):
                chunk = ids[start : start + CHUNK]
                cursor = conn.execute(
                    f"SELECT {columns} FROM model_calls WHERE run_id IN "
                    f"({', '.join('?' * len(chunk))}) ORDER BY run_id, seq", chunk)
                for row in cursor:
                    call = CallUsage(*row)
                    out[call.run_id].append(call)
        return out

    def experiment_call_usage(self, experiment_id: str) -> dict[str, list[CallUsage]]:
        """The numbers of the calls of every run an experiment paid for.

        Its cells' runs (each cell's latest run) and their earlier runs
        (`ExperimentStore.earlier_cell_runs`: those on the threads a retry replaced).

        Returns:
            Run id → its calls in record order, for the runs that recorded any.

        """
        columns = ", ".join(f"m.{c}" for c in CALL_USAGE_COLUMNS)
        out: dict[str, list[CallUsage]] = {}
        with self._connect() as conn:
            cursor = conn.execute(
                f"SELECT {columns} FROM (SELECT thread_id FROM experiment_cells WHERE "
                "experiment_id = ? UNION ALL SELECT thread_id FROM retired_cell_threads WHERE "
                "experiment_id = ?) t JOIN runs r ON r.thread_id = t.thread_id "
                "JOIN model_calls m ON m.run_id = r.run_id ORDER BY r.rowid, m.seq",
                (experiment_id, experiment_id))
            for row in cursor:
                call = CallUsage(*row)
                out.setdefault(call.run_id, []).append(call)
        return out
