"""Shared fixtures; the repository root is importable so tests use `rubric_core` directly."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

# Sample answers shared by test_offline_rules.py and test_offline_graders.py, so the phrasing
# table and the grader verdicts are pinned against the same text.
HAIKU_DRAFT = "Soft rain on the hill\ngreen buds open in the warm light\nbirds sing by the pond"
HAIKU_FIXED = "Spring rain on the hill\ngreen buds open in warm light\nbirds sing by the pond"
SUMMARY = (
    "Photosynthesis is the process by which plants use light energy to turn water and carbon "
    "dioxide into glucose. Oxygen is released as a by-product."
)
CODE_OK = "```python\ndef add(a, b):\n    return a + b\n```"
