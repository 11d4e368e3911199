"""Head to head, for Review and Experiments: which pairs to judge, judging them, the view.

What is compared becomes a `HeadToHead` (its pairs, the rubric, what A and B are): two passes
of a run (`passes_head_to_head`), the final answers of two runs (`runs_head_to_head`), or two
configurations of an experiment over every row where both ended (`experiment_head_to_head`).
`judge_head_to_head` judges it in both orders with the sidebar's grader (its key rule applies)
and stores it (`rubric_core.pairwise.judge_and_record`); `head_to_head_view` reads a stored
judgement back as the tables the page draws, and `pairwise_list` lists the stored ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from rubric_core.app_support._common import UiMessage
from rubric_core.export import scrub_frame, to_csv, write_csv
from rubric_core.pairwise import (
    CSV_COLUMNS,
    JudgementSpec,
    Pair,
    StoredJudgement,
    flip_rate_text,
    judge_and_record,
)
from rubric_core.prices import format_dollars
from rubric_core.redact import error_text, redact
from rubric_core.types import ENDED_STATUSES

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from rubric_core.experiments.results import ExperimentResults
    from rubric_core.pairwise import Source
    from rubric_core.prices import Prices
    from rubric_core.store import RunRecord, Store
    from rubric_core.types import RubricEvaluation

TALLY_HEADERS = {"criterion": "Criterion", "a_wins": "A wins", "b_wins": "B wins",
                 "ties": "Ties", "inconsistent": "Inconsistent", "failed": "Failed",
                 "judged": "Judged", "flip_rate": "Flip rate"}
"""The per-criterion table's columns, as headed on the page."""

REASON_COLUMNS = ("pair", "criterion", "a_first", "reason_a_first", "b_first", "reason_b_first",
                  "result", "error")
"""The reasons table's columns: both orders side by side."""


@dataclass(frozen=True)
class HeadToHead:
    """What a "Judge head to head" compares."""

    name: str
    """The judgement's label."""
    source: Source
    """The page it was started from."""
    label_a: str
    """What answer A is (``pass 1``, a configuration's label)."""
    label_b: str
    """What answer B is."""
    rubric: str
    """The rubric of pairs without their own."""
    count: int = 0
    """How many pairs there are (0: nothing to judge; `why_none` says why)."""
    load: Callable[[], list[Pair]] = field(default=list)
    """Reads the pairs, in order: only when they are judged (an experiment's are many)."""
    why_none: str = ""
    """Why there is nothing to judge."""


def _ready(name: str, source: Source, label_a: str, label_b: str, rubric: str,
           pairs: list[Pair]) -> HeadToHead:
    return HeadToHead(name, source, label_a, label_b, rubric, len(pairs), lambda: pairs)


def passes_head_to_head(record: RunRecord, evaluations: Sequence[RubricEvaluation],
                        a: int, b: int) -> HeadToHead:
    """Two passes (1-based, as Review shows them) of one run, against the run's rubric."""
    from rubric_core.app_support.review import evaluation_at

    name = f"{record.title[:60]} · pass {a} vs pass {b}"
    if a == b:
        return HeadToHead(name, "review", f"pass {a}", f"pass {b}", record.rubric,
                          why_none="Pick two different passes to judge head to head.")
    first, second = evaluation_at(evaluations, a), evaluation_at(evaluations, b)
    pair = Pair(f"{record.run_id[:8]} pass {a} vs {b}", record.prompt,
                str(first.get("answer") or ""), str(second.get("answer") or ""))
    return _ready(name, "review", f"pass {a}", f"pass {b}", record.rubric, [pair])


def runs_head_to_head(record: RunRecord, evaluations: Sequence[RubricEvaluation],
                      other: RunRecord, other_evaluations: Sequence[RubricEvaluation]
                      ) -> HeadToHead:
    """The final answers of two runs, on the open run's request and rubric."""
    label_a, label_b = f"run {record.run_id[:8]}", f"run {other.run_id[:8]}"
    name = f"{record.title[:40]} vs {other.title[:40]}"
    if not evaluations or not other_evaluations:
        return HeadToHead(name, "review", label_a, label_b, record.rubric,
                          why_none="Both runs need a graded answer to judge head to head.")
    pair = Pair(f"{record.run_id[:8]} vs {other.run_id[:8]}", record.prompt,
                str(evaluations[-1].get("answer") or ""),
                str(other_evaluations[-1].get("answer") or ""))
    return _ready(name, "review", label_a, label_b, record.rubric, [pair])


def experiment_head_to_head(store: Store, results: ExperimentResults, a: int, b: int,
                            labels: Sequence[str]) -> HeadToHead:
    """Configurations `a` and `b` of an experiment, over every row (and repeat) both ended.

    Each pair is a row's two final answers, on the row's request and the rubric its cell under
    `a` was graded with.
    """
    name = f"{results.experiment.name[:60]} · {labels[a]} vs {labels[b]}"
    if a == b:
        return HeadToHead(name, "experiment", labels[a], labels[b], "",
                          why_none="Pick two different configurations.")
    ended = {(c.config_index, c.row_id, c.repeat_index): c.run_id for c in results.cells
             if c.status in ENDED_STATUSES and c.run_id and c.iterations}
    keys = [(row, rep) for (cfg, row, rep) in ended if cfg == a and (b, row, rep) in ended]
    repeats = results.experiment.repeats > 1

    def load() -> list[Pair]:
        runs_a = [ended[(a, row, rep)] for row, rep in keys]
        runs_b = [ended[(b, row, rep)] for row, rep in keys]
        evaluations = store.evaluations_for_runs([*runs_a, *runs_b])
        pairs: list[Pair] = []
        for (row, rep), run_a, run_b in zip(keys, runs_a, runs_b, strict=True):
            record = store.get_run(run_a)
            evs_a, evs_b = evaluations.get(run_a) or [], evaluations.get(run_b) or []
            if record is None or not evs_a or not evs_b:
                continue
            pairs.append(Pair(f"{row}#{rep + 1}" if repeats else row, record.prompt,
                              str(evs_a[-1].get("answer") or ""),
                              str(evs_b[-1].get("answer") or ""), record.rubric))
        return pairs

    why = "" if keys else "No row has ended under both configurations yet."
    return HeadToHead(name, "experiment", labels[a], labels[b], "", len(keys), load, why)


def judge_head_to_head(store: Store, what: HeadToHead, state: Mapping[str, Any],
                       secrets: Mapping[str, Any]) -> tuple[str | None, UiMessage]:
    """Judge `what` in both orders with the sidebar's grader and store it.

    Returns:
        The stored judgement's id (None when nothing was judged) and a message for the page.

    """
    from rubric_core.app_support.settings import build_model

    pairs = what.load() if what.count else []
    if not pairs:
        return None, UiMessage("info", what.why_none or "Nothing to judge.")
    grader_model = str(state.get("grader_model") or "rules")
    base_url = state.get("base_url") or None
    try:
        grader = build_model(grader_model, base_url=base_url, secrets=secrets,
                             session_key=state.get("session_api_key") or None)
        spec = JudgementSpec(what.name, what.source, grader_model, what.rubric,
                             base_url=base_url, label_a=what.label_a, label_b=what.label_b)
        record = judge_and_record(store, grader, pairs, spec)
    except Exception as exc:  # a model that cannot be built, a lost database: say so
        return None, UiMessage("error", f"Head to head could not run: {error_text(exc)}")
    return record.judgement_id, UiMessage(
        "success", redact(f"Judged {record.pairs} pair(s) in both orders with {grader_model}."))


@dataclass(frozen=True)
class HeadToHeadView:
    """A stored judgement as the page draws it."""

    headline: str
    """What was compared, with what, and the flip rate."""
    tallies: pd.DataFrame
    """Per criterion (and over all): A wins, B wins, ties, inconsistent, failed, flip rate."""
    reasons: pd.DataFrame
    """Per pair and criterion: both orders' winners and reasons side by side (`REASON_COLUMNS`)."""
    csv: bytes
    """The export (`rubric_core.pairwise.CSV_COLUMNS`), formula-safe UTF-8."""


def head_to_head_view(store: Store, judgement_id: str, prices: Prices) -> HeadToHeadView:
    """A stored judgement read back for the page (see `HeadToHeadView`).

    Raises:
        KeyError: No such judgement.

    """
    judged = StoredJudgement.read(store, judgement_id)
    record, tallies = judged.record, judged.tallies()
    frame = pd.DataFrame([t.row() for t in tallies], columns=list(TALLY_HEADERS))
    reasons = pd.DataFrame(
        [(item.pair_id, c["criterion"], c.get("winner_a_first") or "—",
          c.get("reason_a_first") or "", c.get("winner_b_first") or "—",
          c.get("reason_b_first") or "", c.get("winner") or "failed", c.get("error") or "")
         for item in judged.items for c in item.criteria], columns=list(REASON_COLUMNS))
    overall = tallies[-1]
    headline = (f"**A** = {record.label_a} · **B** = {record.label_b} · grader "
                f"`{record.grader_model}` · {len(judged.items)} pair(s): A wins "
                f"{overall.a_wins}, B wins {overall.b_wins}, ties {overall.ties}, inconsistent "
                f"{overall.inconsistent}, failed {overall.failed}; position "
                f"{flip_rate_text(overall)}; cost "
                f"{format_dollars(judged.cost(store, prices))}.")
    return HeadToHeadView(redact(headline), scrub_frame(frame.rename(columns=TALLY_HEADERS)),
                          scrub_frame(reasons), _csv(judged))


def _csv(judged: StoredJudgement) -> bytes:
    import io

    out = io.StringIO()
    write_csv(judged.csv_rows(), out, CSV_COLUMNS)
    return out.getvalue().encode("utf-8")


def pairwise_list(store: Store, limit: int = 50) -> tuple[pd.DataFrame, list[str]]:
    """The stored judgements (newest first) as a table, and their ids in row order."""
    records = store.list_pairwise(limit=limit)
    frame = pd.DataFrame([(r.created_at[:19].replace("T", " "), r.name, r.label_a, r.label_b,
                           r.grader_model, r.pairs, r.source) for r in records],
                         columns=["created", "name", "A", "B", "grader", "pairs", "from"])
    return scrub_frame(frame), [r.judgement_id for r in records]


def pairwise_list_csv(store: Store) -> bytes:
    """Every stored judgement as formula-safe UTF-8 CSV (one row each)."""
    return to_csv(pairwise_list(store, limit=10_000)[0]).encode("utf-8")


__all__ = ["REASON_COLUMNS", "TALLY_HEADERS", "HeadToHead", "HeadToHeadView",
           "experiment_head_to_head", "head_to_head_view", "judge_head_to_head",
           "pairwise_list", "pairwise_list_csv", "passes_head_to_head", "runs_head_to_head"]
