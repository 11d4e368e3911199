"""Drafts: what a person has typed into the app, kept so a reload or a closed tab loses nothing.

``drafts`` holds one row per draft id (a random id the app keeps in the page's URL, never a
key): the form's values as JSON, scrubbed of secrets like every text the store keeps (the app
never puts a key in a draft in the first place). Drafts are working copies, not records: they
are not copied by `rubric_core.store.copy_store`, and a draft untouched for `DRAFT_KEEP_DAYS`
days is deleted when another is saved.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from rubric_core.redact import redact_data
from rubric_core.store._core import StoreCore

DRAFT_KEEP_DAYS = 30
"""Days a draft is kept after its last change."""

DRAFT_CHAR_LIMIT = 1_000_000
"""Largest draft (its JSON, in characters) the store accepts."""


class DraftStore(StoreCore):
    """The store's drafts (see the module docstring); a part of `rubric_core.store.Store`."""

    def save_draft(self, draft_id: str, data: dict[str, Any]) -> None:
        """Keep ``data`` (JSON values) as draft ``draft_id``, replacing what it held.

        Raises:
            ValueError: An empty id, values that are not JSON, or a draft over
                `DRAFT_CHAR_LIMIT` characters.

        """
        if not draft_id.strip():
            msg = "a draft needs an id"
            raise ValueError(msg)
        try:
            text = json.dumps(redact_data(data), ensure_ascii=False, sort_keys=True)
        except (TypeError, ValueError) as exc:
            msg = f"a draft holds JSON values only: {exc}"
            raise ValueError(msg) from exc
        if len(text) > DRAFT_CHAR_LIMIT:
            msg = (f"the draft is {len(text):,} characters, over the {DRAFT_CHAR_LIMIT:,} kept: "
                   "shorten the prompt or rubric")
            raise ValueError(msg)
        now = self.now()
        expired = (datetime.fromisoformat(now) - timedelta(days=DRAFT_KEEP_DAYS)).isoformat(
            timespec="microseconds")
        with self._connect(write=True) as conn:
            conn.execute(
                "INSERT INTO drafts (draft_id, data_json, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (draft_id) DO UPDATE SET data_json = excluded.data_json, "
                "updated_at = excluded.updated_at", (draft_id, text, now))
            conn.execute("DELETE FROM drafts WHERE updated_at < ?", (expired,))

    def load_draft(self, draft_id: str) -> dict[str, Any] | None:
        """The values of draft ``draft_id``; None when there is none (or it expired)."""
        with self._connect() as conn:
            row = conn.execute("SELECT data_json FROM drafts WHERE draft_id = ?",
                               (draft_id,)).fetchone()
        if row is None:
            return None
        data = json.loads(row["data_json"])
        return data if isinstance(data, dict) else None
