"""Constants and small types every section of the app support shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rubric_core.types import MAX_ITERATIONS as MAX_ITERATIONS  # re-exported

if TYPE_CHECKING:
    from collections.abc import Mapping

Level = Literal["error", "warning", "info", "success", "caption"]
"""How loudly a message is shown (the name of the Streamlit call that shows it)."""

TOKEN_DELAY_ENV = "RUBRIC_STUDIO_TOKEN_DELAY"
"""Environment variable: seconds between the demo worker's streamed chunks."""

DEFAULT_TOKEN_DELAY_S = 0.01
"""Delay that makes the offline demo worker's stream visible in the browser."""

PACED_TOKEN_DELAY_S = 0.08
"""With "Pace the offline demo" on: seconds between the demo worker's pieces (a haiku draft
streams for about two seconds)."""

PACED_GRADER_PAUSE_S = 1.0
"""With "Pace the offline demo" on: seconds the rules grader takes over each verdict."""

MIN_ITERATIONS = 1
"""Lowest iteration cap the sidebar accepts."""


LLM_GRADER_HINT = "hybrid:openai:gpt-4.1-mini"
"""Grader to suggest when the rules grader cannot check a criterion."""

HISTORY_PAGE_SIZE = 50
"""Runs per page of the history table."""

FORM_DEFAULTS: dict[str, Any] = {
    "worker_model": "demo",
    "grader_model": "rules",
    "base_url": "",
    "max_iterations": 3,
    "grader_repeats": 1,
    "consensus": "majority",
    "return_best": False,
    "worker_max_tokens": 0,
    "grader_max_tokens": 0,
    "pace_demo": True,
    "example_select": "haiku",
    "example_name": None,
    "prompt": "",
    "worker_system_prompt": "",
    "rubric_text": "",
    "grader_tools": [],
    "grader_system_prompt": "",
    "rubric_name": "",
    "filter_status": [],
    "filter_model": "",
    "filter_text": "",
    "filter_origin": "single",
    "history_page": 1,
    "exp_budget": 0.0,
}
"""Session-state keys shared between pages, with their first values."""


@dataclass(frozen=True)
class UiMessage:
    """A message for the page: what is wrong (or notable) and what to do."""

    level: Level
    """How to show it."""
    text: str
    """The message."""


def criterion_note(row: Mapping[str, Any], repeats: int | None) -> str:
    """What a verdict table says of a criterion beyond pass/fail (`export.criterion_rows` row).

    ``regressed`` when it passed on the previous pass and fails now; with grader repeats, how
    many repeats agreed with the verdict (marked unstable when they did not all agree).
    """
    notes = ["regressed"] if row.get("regressed") else []
    agreement = row.get("agreement")
    if repeats and repeats > 1 and agreement is not None:
        agreeing = round(float(agreement) * repeats)
        text = f"{agreeing}/{repeats} repeats agree"
        notes.append(f"unstable: {text}" if row.get("unstable") else text)
    return " · ".join(notes)


def pass_notes(evaluation: Mapping[str, Any]) -> str:
    """What a pass's headline adds: a cut or unchanged answer, criteria repeats disagreed on."""
    notes = []
    if evaluation.get("answer_cut"):
        notes.append("answer cut off at the worker's max tokens (finish_reason: length)")
    if evaluation.get("stalled"):
        notes.append("answer unchanged from the previous pass")
    unstable = evaluation.get("unstable") or []
    if unstable:
        notes.append(f"{len(unstable)} criterion verdict(s) unstable across "
                     f"{evaluation.get('repeats')} gradings")
    return " · ".join(notes)
