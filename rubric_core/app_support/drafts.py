"""Drafts: a reload or a closed tab loses nothing.

The form (prompt, rubric, prompts, tools, the sidebar's models and options, the Experiments
page's budget) is kept in the database as a draft (`rubric_core.store.Store.save_draft`) under
a random id the page's URL carries (``?draft=ID``); a reload, or the same URL opened again,
restores it. A key is never part of a draft: only `DRAFT_KEYS` are kept, and none of them
holds one. A restored draft is saved on under a new id, so two tabs opened from one URL never
write the same draft. Links to a run or an experiment are `rubric_core.app_support.links`.
"""

from __future__ import annotations

import math
import re
import uuid
from typing import TYPE_CHECKING, Any

from rubric_core.app_support._common import FORM_DEFAULTS
from rubric_core.app_support.settings import check_max_iterations
from rubric_core.store import StoreError
from rubric_core.types import CONSENSUS_MODES, MAX_GRADER_REPEATS, MAX_OUTPUT_TOKENS

if TYPE_CHECKING:
    from collections.abc import Mapping, MutableMapping

    from rubric_core.store._drafts import DraftStore

DRAFT_KEYS: tuple[str, ...] = (
    "prompt", "rubric_text", "worker_system_prompt", "grader_system_prompt", "grader_tools",
    "example_name", "rubric_name", "worker_model", "grader_model", "base_url",
    "max_iterations", "grader_repeats", "consensus", "return_best", "pace_demo",
    "exp_budget", "worker_max_tokens", "grader_max_tokens",
)
"""The session-state keys a draft keeps (never ``session_api_key`` or another secret).

``exp_budget`` is the Experiments page's budget field (US dollars; 0: none)."""

DRAFT_PARAM = "draft"
"""The URL query parameter holding the draft id."""

_ID = re.compile(r"[0-9a-f]{32}")


def new_draft_id() -> str:
    """A fresh, unguessable draft id (32 hex digits)."""
    return uuid.uuid4().hex


def param_id(value: object) -> str | None:
    """A draft id from a URL parameter; None when it is not one."""
    text = value.strip().lower() if isinstance(value, str) else ""
    return text if _ID.fullmatch(text) else None


def draft_of(state: Mapping[str, Any]) -> dict[str, Any]:
    """The draft of a session: the `DRAFT_KEYS` it holds, as JSON values."""
    out: dict[str, Any] = {}
    for key in DRAFT_KEYS:
        if key not in state:
            continue
        value = state[key]
        if isinstance(value, tuple):
            value = list(value)
        if value is None or isinstance(value, str | int | float | bool | list):
            out[key] = value
    return out


def is_blank(draft: Mapping[str, Any]) -> bool:
    """Whether a draft holds nothing the person typed (the form's first values)."""
    return all(draft.get(k) == FORM_DEFAULTS.get(k, draft.get(k)) for k in draft)


def _valid(key: str, value: Any) -> bool:
    if key == "grader_tools":
        return isinstance(value, list) and all(isinstance(t, str) for t in value)
    if key == "example_name":
        return value is None or isinstance(value, str)
    if key == "max_iterations":
        return check_max_iterations(value)[1] is None
    if key == "grader_repeats":
        return (isinstance(value, int) and not isinstance(value, bool)
                and 1 <= value <= MAX_GRADER_REPEATS)
    if key == "consensus":
        return value in CONSENSUS_MODES
    if key in ("return_best", "pace_demo"):
        return isinstance(value, bool)
    if key in ("worker_max_tokens", "grader_max_tokens"):  # 0: the model's default
        return (isinstance(value, int) and not isinstance(value, bool)
                and 0 <= value <= MAX_OUTPUT_TOKENS)
    if key == "exp_budget":  # the number field's own range: dollars from 0 (no budget) up
        return (isinstance(value, int | float) and not isinstance(value, bool)
                and math.isfinite(value) and value >= 0)
    return isinstance(value, str)


def _widget_value(key: str, value: Any) -> Any:
    # The budget's field holds a float: an int from a hand-edited draft would be refused.
    return float(value) if key == "exp_budget" else value


def restore_draft(state: MutableMapping[str, Any], draft: Mapping[str, Any]) -> int:
    """Put a stored draft's values into the session; returns how many were restored.

    Only `DRAFT_KEYS` with a value of the widget's type are taken: a draft edited in the
    database cannot put anything else into the session.
    """
    restored = 0
    for key in DRAFT_KEYS:
        if key in draft and _valid(key, draft[key]):
            state[key] = _widget_value(key, draft[key])
            restored += 1
    return restored


def sync_draft(state: MutableMapping[str, Any], params: MutableMapping[str, Any],
               store: DraftStore) -> str | None:
    """Keep the session's draft and the URL's ``?draft=`` in step (every script run).

    On a session's first run, the draft the URL names is restored (and saved on under a new
    id); afterwards the draft is saved whenever it changed. A blank form is not saved.

    Args:
        state: Session state.
        params: The page's query parameters (``st.query_params``).
        store: The database.

    Returns:
        What to tell the person: that a draft was restored, or why drafts cannot be kept now;
        None otherwise.

    """
    notice = None
    try:
        if "draft_id" not in state:  # a new browser session: a reload, or a link opened
            state["draft_id"] = new_draft_id()
            wanted = param_id(params.get(DRAFT_PARAM))
            stored = store.load_draft(wanted) if wanted is not None else None
            if stored is not None and restore_draft(state, stored):
                notice = "Restored what you had typed (your draft from this link)."
        current = draft_of(state)
        if current != state.get("draft_saved") and not is_blank(current):
            store.save_draft(state["draft_id"], current)
            state["draft_saved"] = current
    except (StoreError, ValueError) as exc:
        return f"Your typing is not being kept across reloads: {exc}"
    if state.get("draft_saved") is not None and params.get(DRAFT_PARAM) != state["draft_id"]:
        params[DRAFT_PARAM] = state["draft_id"]
    return notice
