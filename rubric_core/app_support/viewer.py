"""The experiment viewer: coloured cells, disagreeing rows, a row's answers side by side.

Status cells are coloured, the rows where configurations disagree can be shown alone, and one
row's answers under two configurations stand side by side, with their verdicts. The grid
(`rubric_core.app_support.experimenting.results_grid`) stays the source of the cells; this
module only decides how they look, which rows are shown, and what a selected cell opens in
place: its final answer and last verdicts, next to another configuration's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from rubric_core.app_support.experimenting import ResultsGrid

if TYPE_CHECKING:
    from rubric_core.store import Store

STATUS_COLOURS: dict[str, str] = {
    "satisfied": "#d3f9d8",
    "max_iterations_reached": "#fff3bf",
    "needs_revision": "#fff3bf",
    "failed": "#ffe3e3",
    "grader_error": "#ffe3e3",
    "error": "#ffe3e3",
    "interrupted": "#e7f5ff",
    "running": "#e7f5ff",
}
"""Background of a grid cell by its status: green passed, yellow not yet, red broken, blue
unfinished (pending cells stay white)."""


def cell_status(text: object) -> str | None:
    """The status a grid cell's text starts with (``satisfied · 2 passes · …``), or None."""
    if not isinstance(text, str) or not text:
        return None
    return text.split(" · ", 1)[0]


def status_css(text: object) -> str:
    """CSS for a grid cell (pandas ``Styler.map``): its status colour, dark text."""
    colour = STATUS_COLOURS.get(cell_status(text) or "")
    return f"background-color: {colour}; color: #1f2933" if colour else ""


def config_columns(grid: ResultsGrid) -> list[str]:
    """The grid's configuration columns (all but ``row`` and ``repeat``)."""
    return [c for c in grid.table.columns if c not in ("row", "repeat")]


def disagreements(grid: ResultsGrid) -> pd.Series:
    """Per grid row: whether its configurations ended differently.

    Satisfied under one and not under another; a row with a cell not ended yet counts only
    once they all have.
    """
    columns = config_columns(grid)
    flags = []
    for values in grid.table[columns].itertuples(index=False):
        statuses = [cell_status(v) for v in values]
        if any(s in (None, "pending", "running") for s in statuses):
            flags.append(False)
            continue
        flags.append(len({s == "satisfied" for s in statuses}) > 1)
    return pd.Series(flags, index=grid.table.index, dtype=bool)


def shown_grid(grid: ResultsGrid, *, only_disagreements: bool) -> ResultsGrid:
    """The grid to draw: every row, or only the rows where configurations disagree."""
    if not only_disagreements:
        return grid
    keep = disagreements(grid)
    return ResultsGrid(grid.table[keep].reset_index(drop=True),
                       grid.run_ids[keep].reset_index(drop=True))


def styled(grid: ResultsGrid) -> Any:
    """The grid's table with its status cells coloured (a pandas ``Styler``)."""
    return grid.table.style.map(status_css, subset=pd.Index(config_columns(grid)))


def picked_position(selection: Any, grid: ResultsGrid) -> tuple[int, str] | None:
    """The (row position, configuration column) of the selected grid cell, or None."""
    try:
        row, column = selection["selection"]["cells"][0]
        row, column = int(row), str(column)
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    if not 0 <= row < len(grid.table) or column not in config_columns(grid):
        return None
    return row, column


@dataclass(frozen=True)
class CellView:
    """One cell of a row, as the side-by-side view shows it."""

    column: str
    """The configuration's column name."""
    status: str
    """The cell's text in the grid (status, passes, tokens, time)."""
    run_id: str | None
    """The cell's run (None before it ran)."""
    answer: str
    """The final answer (the best attempt's when the run says so); empty before a pass."""
    verdicts: pd.DataFrame
    """The last pass's per-criterion verdicts (criterion, passed, gap, note)."""
    headline: str
    """The last pass's headline (verdict, criteria passed), or why there is none."""


def cell_view(store: Store, grid: ResultsGrid, row: int, column: str) -> CellView:
    """What one cell shows in place: its final answer and its last verdicts."""
    from rubric_core.app_support.judging import shown_answers
    from rubric_core.app_support.running import pass_headline, verdict_frame

    run_id = grid.run_ids.iloc[row][column]
    run_id = run_id if isinstance(run_id, str) and run_id else None
    status = str(grid.table.iloc[row][column] or "pending")
    empty = verdict_frame({"criteria": []})
    if run_id is None:
        return CellView(column, status, None, "", empty, "Not run yet.")
    record = store.get_run(run_id)
    evaluations = store.evaluations(run_id)
    if record is None or not evaluations:
        return CellView(column, status, run_id, "", empty, "No grader pass recorded.")
    answers = shown_answers(evaluations)
    last = evaluations[-1]
    return CellView(
        column, status, run_id, answers[0].text if answers else "",
        verdict_frame(last, grader_model=record.grader_model,
                      tool_names=record.grader_tools or ()),
        pass_headline(last),
    )


def row_label(grid: ResultsGrid, row: int) -> str:
    """The grid row's name: its dataset row id (and repeat)."""
    label = f"row {grid.table.iloc[row]['row']}"
    if "repeat" in grid.table.columns:
        label += f" · repeat {grid.table.iloc[row]['repeat']}"
    return label


_WORDS = {"pct": "%", "id": "id", "s": "(s)"}


def column_labels(frame: pd.DataFrame) -> dict[str, str]:
    """People's headers for a table's snake_case columns (``satisfied_pct`` → "Satisfied %").

    For ``st.dataframe(column_config=...)``: the frame keeps its names (for code and tests),
    the page shows the labels.
    """
    out: dict[str, str] = {}
    for column in frame.columns:
        name = str(column)
        if "_" not in name and name.islower():
            out[name] = name.capitalize()
            continue
        if "_" not in name:
            continue
        words = [_WORDS.get(w, w) for w in name.split("_")]
        out[name] = " ".join(words).capitalize()
    return out


def shown_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A table as shown: an empty value reads "—", never "None" or "nan"."""
    shown = frame.copy()
    for column in shown.columns:
        if shown[column].isna().any():
            shown[column] = shown[column].astype(object).where(shown[column].notna(), "—")
    return shown
