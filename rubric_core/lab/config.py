"""`GraderConfig`, one grader configuration of a re-grade, importable from here as before.

It is defined in `rubric_core.grader_settings`, the bottom layer the store reads it with.
"""

from __future__ import annotations

from rubric_core.grader_settings import GraderConfig

__all__ = ["GraderConfig"]
