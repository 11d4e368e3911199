"""Pairwise judgements: two answers judged against a rubric in both orders, and their calls.

- ``pairwise_judgements``: one row per judgement (a CLI ``pairwise``, a head-to-head from
  Review or Experiments): what was compared (``label_a``, ``label_b``), with which grader and
  rubric, from where.
- ``pairwise_pairs``: one row per judged pair: the request, both answers, the rubric used, and
  per criterion both orders' winners and reasons and the combined winner (``criteria_json``,
  `rubric_core.pairwise.CriterionJudgement`), or the pair's error. Written once, as the pair is
  judged (``ON CONFLICT DO NOTHING`` on its position), so an interrupted judgement keeps the
  pairs it judged.
- ``pairwise_calls``: every model call of a pair, as ``model_calls`` keeps a run's (numbers in
  columns, so a price table can cost them; messages and reply as one JSON text), bounded per
  judgement by `CALL_CONTENT_BUDGET_CHARS` of text (past it a call keeps its numbers). Its
  ``iteration`` is the order: 0 with A shown first, 1 with B shown first.

Every text is stored scrubbed of secrets (`rubric_core.redact`); call records arrive scrubbed.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import TYPE_CHECKING, Any, cast

from rubric_core.redact import redact, redact_data, secret_values
from rubric_core.store._core import NO_LIMIT, StoreCore
from rubric_core.store._records import CallUsage, named_rows
from rubric_core.types import CALL_CONTENT_BUDGET_CHARS
from rubric_core.usage import token_sum

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from rubric_core.types import ModelCallRecord

_CALL_NUMBERS = ("call_id", "role", "iteration", "attempt", "provider", "model", "status",
                 "error", "started_at", "latency_s", "first_token_s", "input_tokens",
                 "cached_input_tokens", "cache_creation_tokens", "output_tokens", "http_retries")
"""`ModelCallRecord` keys with a column of their own in ``pairwise_calls``."""

_CALL_CONTENT = ("messages", "messages_total", "reply", "tools")
"""`ModelCallRecord` keys kept together in ``content_json``."""

_JUDGEMENT_COLUMNS = ("judgement_id, name, source, grader_model, base_url, rubric, label_a, "
                      "label_b, created_at")


@dataclasses.dataclass(frozen=True, slots=True)
class PairwiseRecord:
    """A stored pairwise judgement (`PairwiseStore.create_pairwise`)."""

    judgement_id: str
    """Unique id (uuid4 hex)."""
    name: str
    """Short human label."""
    source: str
    """Where it was started (`rubric_core.pairwise.Source`)."""
    grader_model: str
    """The grader's model string."""
    base_url: str | None
    """The grader's OpenAI-compatible base URL, if any."""
    rubric: str
    """The rubric of pairs without their own."""
    label_a: str
    """What answer A is (``pass 1``, a configuration's label, a file's ``a`` column)."""
    label_b: str
    """What answer B is."""
    created_at: str
    """ISO 8601 UTC time it was started."""
    pairs: int = 0
    """Pairs recorded so far."""


@dataclasses.dataclass(frozen=True, slots=True)
class PairwiseItem:
    """One judged pair of a stored judgement."""

    seq: int
    """0-based position of the pair in its judgement."""
    pair_id: str
    """The pair's id."""
    prompt: str
    """The request."""
    answer_a: str
    """Answer A."""
    answer_b: str
    """Answer B."""
    rubric: str
    """The rubric it was judged against."""
    criteria: list[dict[str, Any]]
    """Per criterion (`rubric_core.pairwise.CriterionJudgement`), in rubric order."""
    error: str | None
    """Why the pair could not be judged at all, or None."""
    duration_s: float | None
    """Seconds both orders took."""
    input_tokens: int | None
    """Input tokens over its calls (None: none reported)."""
    output_tokens: int | None
    """Output tokens over its calls (None: none reported)."""


def _record(row: Any, pairs: int = 0) -> PairwiseRecord:
    return PairwiseRecord(row["judgement_id"], row["name"], row["source"], row["grader_model"],
                          row["base_url"], row["rubric"], row["label_a"], row["label_b"],
                          row["created_at"], pairs)


def _call_from_row(row: Mapping[str, Any]) -> ModelCallRecord:
    content = json.loads(row["content_json"]) if row["content_json"] else None
    call: dict[str, Any] = {name: row[name] for name in _CALL_NUMBERS}
    call.update({"grading_run_id": None, "messages": [], "messages_total": 0, "reply": None,
                 "tools": []})
    if content is not None:
        call.update({k: content[k] for k in _CALL_CONTENT if k in content})
    call["content_kept"] = content is not None
    return cast("ModelCallRecord", call)


class PairwiseStore(StoreCore):
    """The store's pairwise judgements (see the module docstring); a part of `Store`."""

    def create_pairwise(self, *, name: str, source: str, grader_model: str,
                        base_url: str | None = None, rubric: str = "", label_a: str = "a",
                        label_b: str = "b") -> PairwiseRecord:
        """Start a judgement (its pairs are added as they are judged); texts scrubbed."""
        known = secret_values()
        judgement_id, now = uuid.uuid4().hex, self.now()
        values = (judgement_id, redact(name, secrets=known), source,
                  redact(grader_model, secrets=known),
                  redact(base_url, secrets=known) if base_url else None,
                  redact(rubric, secrets=known), redact(label_a, secrets=known),
                  redact(label_b, secrets=known), now)
        with self._connect(write=True) as conn:
            conn.execute(f"INSERT INTO pairwise_judgements ({_JUDGEMENT_COLUMNS}) VALUES "
                         f"({', '.join('?' * len(values))})", values)
            row = conn.execute(f"SELECT {_JUDGEMENT_COLUMNS} FROM pairwise_judgements WHERE "
                               "judgement_id = ?", (judgement_id,)).fetchone()
        return _record(row)

    def add_pairwise_pair(
        self, judgement_id: str, seq: int, *, pair_id: str, prompt: str, answer_a: str,
        answer_b: str, rubric: str, criteria: Sequence[Mapping[str, Any]],
        error: str | None = None, duration_s: float | None = None,
        calls: Sequence[ModelCallRecord] = (),
    ) -> bool:
        """Record one judged pair and its calls in one transaction (once per ``seq``).

        Returns:
            False when that position was recorded already (nothing is written).

        Raises:
            KeyError: No such judgement.

        """
        known = secret_values()
        inputs = token_sum(*(c.get("input_tokens") for c in calls))
        outputs = token_sum(*(c.get("output_tokens") for c in calls))
        shown = json.dumps(redact_data([dict(c) for c in criteria], secrets=known),
                           ensure_ascii=False)
        with self._connect(write=True) as conn:
            if conn.execute("SELECT 1 FROM pairwise_judgements WHERE judgement_id = ?"
                            f"{conn.dialect.lock_rows}", (judgement_id,)).fetchone() is None:
                msg = f"no pairwise judgement {judgement_id!r}"
                raise KeyError(msg)
            cursor = conn.execute(
                "INSERT INTO pairwise_pairs (judgement_id, seq, pair_id, prompt, answer_a, "
                "answer_b, rubric, criteria_json, error, duration_s, input_tokens, "
                "output_tokens, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT DO NOTHING",
                (judgement_id, seq, *(redact(t, secrets=known) for t in (
                    pair_id, prompt, answer_a, answer_b, rubric)), shown,
                 redact(error, secrets=known) if error else None, duration_s, inputs, outputs,
                 self.now()))
            if not cursor.rowcount:
                return False
            used = int(conn.execute(
                "SELECT COALESCE(SUM(content_chars), 0) AS chars FROM pairwise_calls WHERE "
                "judgement_id = ?", (judgement_id,)).fetchone()["chars"])
            rows = []
            for index, call in enumerate(calls):
                content = json.dumps({k: call.get(k) for k in _CALL_CONTENT}, ensure_ascii=False)
                stored: str | None = content
                if used + len(content) > CALL_CONTENT_BUDGET_CHARS:
                    stored = None  # the numbers still count; the text is not kept
                else:
                    used += len(content)
                rows.append((judgement_id, seq, index, *(call.get(n) for n in _CALL_NUMBERS),
                             stored, len(stored or "")))
            conn.executemany(
                f"INSERT INTO pairwise_calls (judgement_id, pair_seq, seq, "
                f"{', '.join(_CALL_NUMBERS)}, content_json, content_chars) VALUES "
                f"({', '.join('?' * (len(_CALL_NUMBERS) + 5))}) ON CONFLICT DO NOTHING", rows)
        return True

    def list_pairwise(self, limit: int | None = None) -> list[PairwiseRecord]:
        """Stored judgements, newest first, each with how many pairs it recorded."""
        with self._connect() as conn:
            rows = named_rows(conn.execute(
                f"SELECT {_JUDGEMENT_COLUMNS}, (SELECT COUNT(*) FROM pairwise_pairs p WHERE "
                "p.judgement_id = j.judgement_id) AS pairs FROM pairwise_judgements j "
                "ORDER BY created_at DESC, judgement_id LIMIT ?",
                (NO_LIMIT if limit is None else limit,)))
        return [_record(r, int(r["pairs"])) for r in rows]

    def get_pairwise(self, judgement_id: str) -> PairwiseRecord | None:
        """One judgement by id, or None."""
        with self._connect() as conn:
            row = conn.execute(
                f"SELECT {_JUDGEMENT_COLUMNS}, (SELECT COUNT(*) FROM pairwise_pairs p WHERE "
                "p.judgement_id = j.judgement_id) AS pairs FROM pairwise_judgements j WHERE "
                "judgement_id = ?", (judgement_id,)).fetchone()
        return None if row is None else _record(row, int(row["pairs"]))

    def pairwise_items(self, judgement_id: str) -> list[PairwiseItem]:
        """A judgement's pairs in order (empty for an unknown judgement)."""
        with self._connect() as conn:
            rows = named_rows(conn.execute(
                "SELECT seq, pair_id, prompt, answer_a, answer_b, rubric, criteria_json, error, "
                "duration_s, input_tokens, output_tokens FROM pairwise_pairs WHERE "
                "judgement_id = ? ORDER BY seq", (judgement_id,)))
        return [PairwiseItem(r["seq"], r["pair_id"], r["prompt"], r["answer_a"], r["answer_b"],
                             r["rubric"], json.loads(r["criteria_json"]), r["error"],
                             r["duration_s"], r["input_tokens"], r["output_tokens"])
                for r in rows]

    def pairwise_calls(self, judgement_id: str) -> dict[int, list[ModelCallRecord]]:
        """A judgement's calls by pair position, each pair's in the order they ended."""
        out: dict[int, list[ModelCallRecord]] = {}
        with self._connect() as conn:
            for row in named_rows(conn.execute(
                    "SELECT * FROM pairwise_calls WHERE judgement_id = ? ORDER BY pair_seq, seq",
                    (judgement_id,))):
                out.setdefault(int(row["pair_seq"]), []).append(_call_from_row(row))
        return out

    def pairwise_call_usage(self, judgement_id: str) -> list[CallUsage]:
        """The numbers of a judgement's calls, for pricing (``run_id`` is the judgement's id)."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT judgement_id, role, iteration, status, started_at, input_tokens, "
                "cached_input_tokens, cache_creation_tokens, output_tokens FROM pairwise_calls "
                "WHERE judgement_id = ? ORDER BY pair_seq, seq", (judgement_id,)).fetchall()
        return [CallUsage(*row) for row in rows]

    def delete_pairwise(self, judgement_id: str) -> bool:
        """Delete a judgement with its pairs and calls; True when it existed."""
        with self._connect(write=True) as conn:
            conn.execute("DELETE FROM pairwise_calls WHERE judgement_id = ?", (judgement_id,))
            conn.execute("DELETE FROM pairwise_pairs WHERE judgement_id = ?", (judgement_id,))
            cursor = conn.execute("DELETE FROM pairwise_judgements WHERE judgement_id = ?",
                                  (judgement_id,))
            return bool(cursor.rowcount)


__all__ = ["PairwiseItem", "PairwiseRecord", "PairwiseStore"]
