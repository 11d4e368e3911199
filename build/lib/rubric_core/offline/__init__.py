"""Models that need no key and no network: the demo worker and the rules-based graders.

`DemoWorker` answers the bundled examples with a flawed first draft and revisions driven by the
grader's feedback; `RulesGrader` checks countable criteria (lines, syllables, words, mentions,
formats, tests) with the evidence tools' pure functions; `HybridGrader` lets an LLM judge the
criteria the rules cannot check, with the rule results as evidence it may not contradict.
"""

from __future__ import annotations

from rubric_core.offline.demo import DemoWorker
from rubric_core.offline.graders import HybridGrader, RulesGrader
from rubric_core.offline.rules import check_criterion, unrecognised_criteria
from rubric_core.tools import json_schema_tool

__all__ = [
    "DemoWorker",
    "HybridGrader",
    "RulesGrader",
    "check_criterion",
    "json_schema_tool",
    "unrecognised_criteria",
]
