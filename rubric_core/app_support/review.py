"""Review: run history, tables, heatmap, diff and export."""

from __future__ import annotations

import html
import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from rubric_core.app_support._common import (
    HISTORY_PAGE_SIZE,
    UiMessage,
    criterion_note,
    pass_notes,
)
from rubric_core.export import (
    EXPORT_COLUMNS,
    JSON_COLUMNS,
    criteria_changes,
    criterion_rows,
    heatmap_frame,
    iteration_diff,
    pass_number,
    to_csv,
    to_json,
    write_csv,
    write_json,
)
from rubric_core.rubric import normalize_name, parse_criteria
from rubric_core.types import RUN_ORIGINS, RUN_STATUSES
from rubric_core.usage import token_sum

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from rubric_core.store import RunRecord, Store
    from rubric_core.types import RubricEvaluation


@dataclass(frozen=True)
class RunFilters:
    """The Review page's filters, as ``Store.list_runs`` takes them."""

    statuses: tuple[str, ...] = ()
    """Keep these statuses (all when empty)."""
    model: str = ""
    """Keep runs whose worker or grader is exactly this."""
    text: str = ""
    """Keep runs whose title, prompt or rubric contains this."""
    origin: str = "all"
    """``single`` (runs started alone), ``experiment`` (experiment cells) or ``all``."""

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``list_runs`` / ``count_runs``."""
        statuses = [s for s in self.statuses if s in RUN_STATUSES]
        return {
            "status": statuses or None,
            "model": self.model.strip() or None,
            "text": self.text.strip() or None,
            "origin": self.origin if self.origin in RUN_ORIGINS else None,
        }


ORIGIN_CHOICES = {"single": "Single runs", "experiment": "Experiment cells", "all": "All runs"}
"""The history's origin filter: value → label (single runs first: a person's own work)."""


def page_count(total: int, page_size: int = HISTORY_PAGE_SIZE) -> int:
    """Pages needed for ``total`` runs (at least one)."""
    return max(1, -(-total // page_size))


def history_frame(runs: Sequence[RunRecord], costs: Sequence[str] | None = None
                  ) -> pd.DataFrame:
    """The run index as a table for the history listing.

    Args:
        runs: A page of the run index.
        costs: Each run's cost as text (`rubric_core.app_support.costs.run_list_costs`), for
            a ``cost`` column after ``status`` (seen without scrolling); none without.

    """
    rows = [
        {
            "created": r.created_at[:19].replace("T", " "), "title": r.title, "status": r.status,
            "worker": r.worker_model, "grader": r.grader_model, "iterations": r.iterations,
            "duration_s": r.duration_s, "run_id": r.run_id,
        }
        for r in runs
    ]
    columns = ["created", "title", "status", "worker", "grader", "iterations", "duration_s",
               "run_id"]
    frame = pd.DataFrame(rows, columns=columns)
    if costs is not None:
        frame.insert(columns.index("status") + 1, "cost", list(costs))
    return frame


def run_label(record: RunRecord) -> str:
    """One line naming a run in a selectbox."""
    title = record.title or "(untitled)"
    return f"{record.created_at[:16].replace('T', ' ')} · {title} · {record.status} · " + (
        record.run_id[:8]
    )


def iteration_table(evaluations: Iterable[RubricEvaluation], *, grader_model: str = "",
                    tool_names: Sequence[str] = ()) -> pd.DataFrame:
    """One row per pass × criterion: the Review page's iteration table.

    With a ``hybrid:`` grader the note says which of the rule and the model decided
    (`rubric_core.app_support.running.rule_decisions`).
    """
    from rubric_core.app_support.running import rule_decisions

    rows: list[dict[str, Any]] = []
    for ev in evaluations:
        decided = rule_decisions(ev, grader_model, tool_names)
        tokens = token_sum(ev.get("input_tokens"), ev.get("output_tokens"))
        explanation = ev.get("explanation", "")
        if notes := pass_notes(ev):
            explanation = f"{explanation} ({notes})" if explanation else notes
        base = {"verdict": ev.get("result"), "explanation": explanation,
                "duration_s": ev.get("duration_s"), "tokens": tokens}
        for row in criterion_rows(ev):
            rows.append({
                "pass": pass_number(ev), "criterion": row["criterion"] or "",
                "passed": row["passed"], "gap": row["gap"] or "",
                "note": " · ".join(filter(None, (decided.get(str(row["criterion"])),
                                                 criterion_note(row, ev.get("repeats"))))),
                **base,
            })
    frame = pd.DataFrame(rows, columns=["pass", "criterion", "passed", "gap", "note",
                                        "verdict", "explanation", "duration_s", "tokens"])
    return frame.astype({"pass": "int64", "passed": "boolean", "tokens": "Int64"})


def heatmap_table(evaluations: Iterable[RubricEvaluation], rubric: str | None) -> pd.DataFrame:
    """Criteria × iteration (1-based columns) with ``pass``/``fail``/``—`` cells."""
    frame = heatmap_frame(evaluations, rubric=rubric)
    frame.columns = pd.Index([f"pass {int(c) + 1}" for c in frame.columns])
    return frame.apply(lambda col: col.map(
        lambda v: "pass" if v is True else "fail" if v is False else "—"
    ))


HEATMAP_COLORS = {"pass": "background-color: #d3f9d8; color: #2b8a3e",
                  "fail": "background-color: #ffe3e3; color: #c92a2a",
                  "—": "color: #868e96"}
"""CSS per heatmap cell value (for ``DataFrame.style.map``)."""


def heatmap_css(value: object) -> str:
    """CSS for one heatmap cell."""
    return HEATMAP_COLORS.get(str(value), "")


def iteration_answers(evaluations: Iterable[RubricEvaluation]) -> dict[int, str]:
    """The graded answer of each iteration (1-based), last grading run wins per iteration."""
    return {int(ev.get("iteration", 0)) + 1: ev.get("answer", "") for ev in evaluations}


def evaluation_at(evaluations: Sequence[RubricEvaluation], iteration: int) -> RubricEvaluation:
    """The evaluation of 1-based ``iteration`` (the last one recorded for it)."""
    for ev in reversed(evaluations):
        if int(ev.get("iteration", 0)) + 1 == iteration:
            return ev
    msg = f"no evaluation for iteration {iteration}"
    raise KeyError(msg)


def diff_html(before: str, after: str) -> str:
    """The word-level diff of two answers as HTML (text escaped; ``<ins>``/``<del>`` spans)."""
    parts: list[str] = []
    for op, text in iteration_diff(before, after):
        escaped = html.escape(text)
        if op == "insert":
            parts.append(f'<ins style="background:#d3f9d8;text-decoration:none">{escaped}</ins>')
        elif op == "delete":
            parts.append(f'<del style="background:#ffe3e3">{escaped}</del>')
        else:
            parts.append(escaped)
    body = "".join(parts)
    return f'<div style="white-space:pre-wrap;line-height:1.5">{body}</div>'


def changes_summary(
    before: RubricEvaluation,
    after: RubricEvaluation,
    *,
    rubrics: tuple[str, str] | None = None,
) -> list[UiMessage]:
    """Criteria fixed and regressed between two evaluations, as page messages.

    Criteria are matched by name (`rubric_core.export.criteria_changes`). When the two were
    graded against different rubrics (``rubrics``: before's and after's text), that is said
    first, with the criteria found in only one of them; only the shared ones are compared.
    """
    changes = criteria_changes(before, after)
    out: list[UiMessage] = []
    differ = rubrics is not None and rubrics[0].strip() != rubrics[1].strip()
    shared = 0
    if differ:
        names_a = [c.get("name", "") for c in before.get("criteria") or []]
        names_b = [c.get("name", "") for c in after.get("criteria") or []]
        if rubrics is not None:  # the rubric text names criteria even for a grader_error pass
            names_a = names_a or parse_criteria(rubrics[0])
            names_b = names_b or parse_criteria(rubrics[1])
        fold_a = {normalize_name(n) for n in names_a}
        fold_b = {normalize_name(n) for n in names_b}
        shared = len(fold_a & fold_b)
        only_a = [n for n in names_a if normalize_name(n) not in fold_b]
        only_b = [n for n in names_b if normalize_name(n) not in fold_a]
        text = ("These runs were graded against different rubrics: "
                + (f"{shared} criterion(s) by the same name are compared below."
                   if shared else "no criterion is shared, so none can be compared."))
        if only_a:
            text += " Only in the first: " + "; ".join(only_a) + "."
        if only_b:
            text += " Only in the second: " + "; ".join(only_b) + "."
        out.append(UiMessage("info", text))
    if changes["fixed"]:
        out.append(UiMessage("success", "Fixed: " + "; ".join(changes["fixed"])))
    if changes["regressed"]:
        out.append(UiMessage("error", "Regressed: " + "; ".join(changes["regressed"])))
    if changes["still_failing"]:
        out.append(UiMessage("warning", "Still failing: " + "; ".join(changes["still_failing"])))
    moved = changes["fixed"] or changes["regressed"] or changes["still_failing"]
    if not moved and not (differ and shared == 0):
        what = "shared criterion" if differ else "criterion"
        out.append(UiMessage("info", f"No {what} changed between these two."))
    return out


def export_bytes(rows: Iterable[Sequence[Any]] | pd.DataFrame) -> tuple[bytes, bytes]:
    """CSV (formula-safe, UTF-8) and JSON bytes of export rows, written as a stream.

    ``rows`` come from `rubric_core.export.export_rows`; a DataFrame is accepted too. Rows
    with call traces (``export_rows(..., calls=...)``) give JSON with its ``calls`` field and
    the CSV without it.
    """
    if isinstance(rows, pd.DataFrame):
        return to_csv(rows).encode("utf-8"), to_json(rows).encode("utf-8")
    materialised = rows if isinstance(rows, list) else list(rows)
    csv_out, json_out = io.StringIO(), io.StringIO()
    width = len(EXPORT_COLUMNS)
    traced = bool(materialised) and len(materialised[0]) > width
    write_csv([row[:width] for row in materialised] if traced else materialised, csv_out)
    write_json(materialised, json_out, JSON_COLUMNS if traced else EXPORT_COLUMNS)
    return csv_out.getvalue().encode("utf-8"), json_out.getvalue().encode("utf-8")


def filtered_pairs(
    store: Store, filters: RunFilters
) -> list[tuple[RunRecord, list[RubricEvaluation]]]:
    """Every run matching the filters with its evaluations (for export), oldest first."""
    runs = store.list_runs(limit=None, **filters.kwargs())[::-1]
    by_run = store.evaluations_for_runs(r.run_id for r in runs)
    return [(r, by_run[r.run_id]) for r in runs]
