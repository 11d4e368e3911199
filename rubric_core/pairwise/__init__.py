"""Pairwise judging: is B better than A, per criterion, judged in both orders.

Each pair is judged twice, A shown first and B shown first, each time one grader call forced
to answer a per-rubric verdict tool; the two verdicts, mapped back to the pair's own terms,
combine per criterion into ``a``, ``b``, ``tie`` or ``inconsistent``, and the share of
judgements whose orders disagree is the grader's **position flip rate**.

- `types`: the vocabulary and records (`Pair`, `CriterionJudgement`, `PairJudgement`);
- `prompt`: what a call is sent (stable start first, the answers delimited and escaped last);
- `schema`: the per-rubric verdict tool, and reading a reply by name;
- `steps`: one order as steps (retries, one correction), and its driver;
- `offline`: the ``rules`` grader judging pairwise (a passing answer beats a failing one);
- `judge`: both orders of each pair, combined (`judge_pairs`);
- `pairs`: reading a pairs file (CSV/JSONL: id, prompt, a, b, optional rubric);
- `results`: tallies, flip rate, CSV rows, cost;
- `record`: judging into the store and reading a stored judgement back.
"""

from __future__ import annotations

from rubric_core.pairwise.judge import combine, judge_pair, judge_pairs
from rubric_core.pairwise.offline import RulesPairwiseGrader, pairwise_grader
from rubric_core.pairwise.pairs import PairsError, parse_pairs, read_pairs_file
from rubric_core.pairwise.prompt import (
    PAIRWISE_SYSTEM_PROMPT,
    PAIRWISE_TOOL,
    build_pairwise_messages,
    parse_pairwise_payload,
)
from rubric_core.pairwise.record import (
    JudgementSpec,
    StoredJudgement,
    ajudge_and_record,
    judge_and_record,
)
from rubric_core.pairwise.results import (
    CSV_COLUMNS,
    OVERALL,
    TALLY_COLUMNS,
    Tally,
    csv_rows,
    flip_rate_text,
    judgement_cost,
    tallies,
)
from rubric_core.pairwise.schema import read_reply, verdict_tool
from rubric_core.pairwise.types import (
    INCONSISTENT,
    ORDERS,
    OUTCOMES,
    WINNERS,
    CriterionJudgement,
    Order,
    OrderVerdict,
    Outcome,
    Pair,
    PairJudgement,
    Source,
    Winner,
)

__all__ = [
    "CSV_COLUMNS",
    "INCONSISTENT",
    "ORDERS",
    "OUTCOMES",
    "OVERALL",
    "PAIRWISE_SYSTEM_PROMPT",
    "PAIRWISE_TOOL",
    "TALLY_COLUMNS",
    "WINNERS",
    "CriterionJudgement",
    "JudgementSpec",
    "Order",
    "OrderVerdict",
    "Outcome",
    "Pair",
    "PairJudgement",
    "PairsError",
    "RulesPairwiseGrader",
    "Source",
    "StoredJudgement",
    "Tally",
    "Winner",
    "ajudge_and_record",
    "build_pairwise_messages",
    "combine",
    "csv_rows",
    "flip_rate_text",
    "judge_and_record",
    "judge_pair",
    "judge_pairs",
    "judgement_cost",
    "pairwise_grader",
    "parse_pairs",
    "parse_pairwise_payload",
    "read_pairs_file",
    "read_reply",
    "tallies",
    "verdict_tool",
]
