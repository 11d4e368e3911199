"""Drafts in the database (`rubric_core.store._drafts`), on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from rubric_core import redact

if TYPE_CHECKING:
    from rubric_core.store import Store


def test_a_draft_is_saved_replaced_and_loaded(store: Store) -> None:
    assert store.load_draft("a" * 32) is None
    store.save_draft("a" * 32, {"prompt": "one", "max_iterations": 3})
    store.save_draft("a" * 32, {"prompt": "two", "grader_tools": ["t"]})
    assert store.load_draft("a" * 32) == {"prompt": "two", "grader_tools": ["t"]}


def test_a_draft_is_scrubbed_and_bounded(store: Store) -> None:
    secret = "sk-draft-secret-0123456789abcdef"
    redact.register_secret(secret)
    store.save_draft("b" * 32, {"prompt": f"use {secret}"})
    assert secret not in str(store.load_draft("b" * 32))
    with pytest.raises(ValueError, match="characters"):
        store.save_draft("c" * 32, {"prompt": "x" * 1_000_001})
