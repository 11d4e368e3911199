"""``python -m rubric_core``: see `rubric_core.cli`."""

from __future__ import annotations

from rubric_core.cli import program

program()
