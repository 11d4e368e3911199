"""Shared fixtures and sample texts. `rubric_core` is the installed package (the test command
installs this clone with ``pip install -e .[dev]``); nothing here patches ``sys.path``."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Sample answers shared by test_offline_rules.py and test_offline_graders.py, so the phrasing
# table and the grader verdicts are pinned against the same text.
HAIKU_DRAFT = "Soft rain on the hill\ngreen buds open in the warm light\nbirds sing by the pond"
HAIKU_FIXED = "Spring rain on the hill\ngreen buds open in warm light\nbirds sing by the pond"
SUMMARY = (
    "Photosynthesis is the process by which plants use light energy to turn water and carbon "
    "dioxide into glucose. Oxygen is released as a by-product."
)
CODE_OK = "```python\ndef add(a, b):\n    return a + b\n```"
