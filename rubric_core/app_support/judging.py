"""Judging the grader: people's labels, grader-vs-people agreement, loop analytics, answers.

What the Review page's Labels, Agreement and Loop analytics tabs draw, and the labelled final
answers of the Run and Review pages. Numbering for people is 1-based ("pass 1").
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from rubric_core.align import (
    AlignmentCheck,
    Example,
    Item,
    aligned_prompt,
    examples_from,
    items_from,
    model_grader,
    regrade,
)
from rubric_core.analytics import scoped_analytics
from rubric_core.app_support._common import UiMessage
from rubric_core.attempts import ShownAnswer, final_answers
from rubric_core.export import scrub_frame, to_csv
from rubric_core.labels import (
    OVERALL,
    agreement_table,
    check_label_text,
    disagreements,
    labelled_verdicts,
)
from rubric_core.redact import redact
from rubric_core.rubric import normalize_name
from rubric_core.store import StoreError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    import altair as alt
    from langchain_core.language_models import BaseChatModel

    from rubric_core.labels import LabelledVerdict
    from rubric_core.store import ExperimentRecord, RunRecord, Store
    from rubric_core.types import CriterionLabel, RubricEvaluation

LABEL_CHOICES = ("agree", "disagree")
"""What a person says about a grader verdict."""

CORRECT_CHOICES = ("not given", "pass", "fail")
"""The optional correct verdict a person gives with a disagreement."""

LABEL_EXPORT_COLUMNS = (
    "run_id", "run_title", "evaluation_seq", "pass", "criterion", "grader_verdict", "labeller",
    "label", "correct_verdict", "person_verdict", "note", "created_at", "updated_at",
)
"""Columns of `labels_csv`."""


def default_labeller() -> str:
    """The OS user name, the default for "Your name" (``"me"`` when it cannot be read)."""
    try:
        return getpass.getuser() or "me"
    except (KeyError, OSError):
        return "me"


def picked_row(selection: Any, ids: Sequence[str]) -> str | None:
    """The id of the row selected in a single-row ``st.dataframe`` selection, or None."""
    try:
        rows = list(selection["selection"]["rows"])
    except (KeyError, TypeError):
        return None
    if not rows or not 0 <= int(rows[0]) < len(ids):
        return None
    return ids[int(rows[0])]


def label_targets(evaluations: Sequence[RubricEvaluation]) -> list[tuple[int, str]]:
    """Every criterion verdict of a run that can be labelled: ``(evaluation seq, criterion)``."""
    return [(seq, str(c.get("name", ""))) for seq, ev in enumerate(evaluations)
            for c in ev.get("criteria") or []]


def target_label(evaluations: Sequence[RubricEvaluation], target: tuple[int, str]) -> str:
    """A verdict as a person reads it: "Pass 2 · criterion — grader: fail"."""
    seq, name = target
    ev = evaluations[seq]
    passed = next((bool(c.get("passed")) for c in ev.get("criteria") or []
                   if c.get("name") == name), None)
    verdict = "pass" if passed else "fail"
    return f"Pass {int(ev.get('iteration', 0)) + 1} · {name} — grader: {verdict}"


def run_labels_frame(
    evaluations: Sequence[RubricEvaluation], labels: Sequence[CriterionLabel]
) -> pd.DataFrame:
    """This run's labels as a table (1-based pass, the grader's verdict beside each)."""
    verdicts = labelled_verdicts(labels, {lb["run_id"]: evaluations for lb in labels})
    by_key = {(lb["seq"], lb["criterion"], lb["labeller"]): lb for lb in labels}
    rows = [{
        "pass": v.iteration + 1, "criterion": v.criterion,
        "grader": "pass" if v.grader else "fail", "labeller": v.labeller,
        "label": "agree" if v.grader == v.person else "disagree",
        "person": "pass" if v.person else "fail", "note": v.note,
        "updated": by_key[(v.seq, v.criterion, v.labeller)]["updated_at"][:19].replace("T", " "),
    } for v in verdicts]
    # Scrubbed here too: a database written by an older version may hold a key in a name.
    return scrub_frame(pd.DataFrame(rows, columns=["pass", "criterion", "grader", "labeller",
                                                   "label", "person", "note", "updated"]))


@dataclass(frozen=True)
class LabelInput:
    """What the labelling form holds."""

    run_id: str
    """The run."""
    target: tuple[int, str]
    """``(evaluation seq, criterion)`` being labelled."""
    labeller: str
    """"Your name"."""
    label: str
    """One of :data:`LABEL_CHOICES`."""
    correct: str = "not given"
    """One of :data:`CORRECT_CHOICES` (used with ``disagree``)."""
    note: str = ""
    """Free text."""


def save_label(store: Store, form: LabelInput) -> UiMessage:
    """Store a label from the form (upsert); the outcome as a page message."""
    agree = form.label == "agree"
    correct = None if agree or form.correct == "not given" else form.correct == "pass"
    seq, criterion = form.target
    try:
        labeller, note = check_label_text(form.labeller, form.note)
        store.set_label(form.run_id, seq, criterion, labeller, agree=agree,
                        correct=correct, note=note)
    except (KeyError, ValueError, StoreError) as exc:
        return UiMessage("error", f"Label not saved: {exc}")
    verb = "agrees" if agree else "disagrees"
    return UiMessage("success",
                     f"Saved: {redact(labeller)} {verb} with the grader on “{criterion}”.")


def _all_verdicts(
    store: Store, runs: Sequence[RunRecord] | None = None
) -> tuple[list[LabelledVerdict], dict[str, RunRecord]]:
    labels = store.labels(None if runs is None else [r.run_id for r in runs])
    run_ids = list(dict.fromkeys(lb["run_id"] for lb in labels))
    evaluations = store.evaluations_for_runs(run_ids)
    records = {rid: r for rid in run_ids if (r := store.get_run(rid)) is not None}
    return labelled_verdicts(labels, evaluations), records


@dataclass(frozen=True)
class AgreementView:
    """The Agreement tab: the table, and the disagreements with the runs they open."""

    table: pd.DataFrame
    """`rubric_core.labels.agreement_table` over every labelled run."""
    disagreements: pd.DataFrame
    """One row per disagreement (1-based pass)."""
    run_ids: list[str]
    """The run of each disagreement row, in row order."""


def agreement_view(store: Store) -> AgreementView:
    """Grader vs people over every labelled verdict in the database, across runs."""
    verdicts, records = _all_verdicts(store)
    differ = disagreements(verdicts)
    rows = [{
        "run": (records[v.run_id].title if v.run_id in records else "") + f" · {v.run_id[:8]}",
        "pass": v.iteration + 1, "criterion": v.criterion,
        "grader": "pass" if v.grader else "fail", "person": "pass" if v.person else "fail",
        "labeller": v.labeller, "note": v.note,
    } for v in differ]
    frame = scrub_frame(pd.DataFrame(rows, columns=["run", "pass", "criterion", "grader",
                                                    "person", "labeller", "note"]))
    return AgreementView(agreement_table(verdicts), frame, [v.run_id for v in differ])


MAX_ALIGN_ANSWERS = 20
"""At most this many labelled answers are re-graded by one Align check (2 grader calls each)."""


@dataclass(frozen=True)
class AlignmentInputs:
    """What an Align check needs, read from the labels."""

    items: list[Item]
    """Labelled answers to re-grade (at most `MAX_ALIGN_ANSWERS`)."""
    examples: list[Example]
    """Every labelled verdict as a few-shot example."""
    names: dict[str, str]
    """Normalised criterion → display name."""


def alignment_inputs(store: Store, rubric: str | None = None) -> AlignmentInputs:
    """The labelled answers and examples for the Align check.

    Args:
        store: The database.
        rubric: Only labels of runs graded against this rubric text (spaces around it
            ignored), so one rubric's examples never calibrate another's grader; None: every
            label.

    """
    scope = None if rubric is None else store.runs_for_rubric(rubric)
    verdicts, records = _all_verdicts(store, scope)
    by_run = store.evaluations_for_runs(records)
    answers = {(rid, seq): str(ev.get("answer") or "")
               for rid, evs in by_run.items() for seq, ev in enumerate(evs)}
    runs = {rid: (r.prompt, r.rubric) for rid, r in records.items()}
    names = {normalize_name(v.criterion): v.criterion for v in reversed(verdicts)}
    return AlignmentInputs(items_from(verdicts, runs, answers)[:MAX_ALIGN_ANSWERS],
                           examples_from(verdicts, answers), names)


def alignment_frame(check: AlignmentCheck) -> pd.DataFrame:
    """Agreement without and with the examples, per criterion and overall."""
    rows = [(name, a.n, a.percent, a.kappa, b.percent, b.kappa)
            for name, (a, b) in check.per_criterion.items()]
    rows.append((OVERALL, check.without.n, check.without.percent, check.without.kappa,
                 check.with_examples.percent, check.with_examples.kappa))
    return pd.DataFrame.from_records(rows, columns=[
        "criterion", "n", "agreement_without", "kappa_without", "agreement_with",
        "kappa_with"])


def run_alignment(inputs: AlignmentInputs, grader: BaseChatModel,
                  base: str | None = None) -> AlignmentCheck:
    """Re-grade the labelled answers with and without the examples (see `rubric_core.align`)."""
    return regrade(inputs.items, inputs.examples, model_grader(grader), base,
                   names=inputs.names)


def align_with_sidebar_grader(
    inputs: AlignmentInputs, state: Mapping[str, Any], secrets: Mapping[str, Any]
) -> pd.DataFrame:
    """`run_alignment` with the sidebar's grader (its key rule applies), as a table.

    Raises:
        ModelConfigError: The grader cannot be built.
        Exception: Whatever the grader raised; the page shows it.
    """
    from rubric_core.app_support.settings import build_model

    grader = build_model(str(state.get("grader_model") or "rules"),
                         base_url=state.get("base_url") or None, secrets=secrets,
                         session_key=state.get("session_api_key") or None)
    return alignment_frame(run_alignment(inputs, grader))


def aligned_grader_prompt(inputs: AlignmentInputs) -> str:
    """The built-in grader prompt with the labelled examples, for the custom grader prompt."""
    return aligned_prompt(inputs.examples)


def labels_csv(store: Store) -> bytes:
    """Every label in the database as formula-safe UTF-8 CSV (:data:`LABEL_EXPORT_COLUMNS`)."""
    labels = store.labels()
    verdicts, records = _all_verdicts(store)
    by_key = {(lb["run_id"], lb["seq"], lb["criterion"], lb["labeller"]): lb for lb in labels}
    rows = []
    for v in verdicts:
        lb = by_key[(v.run_id, v.seq, v.criterion, v.labeller)]
        correct = lb["correct"]
        rows.append((
            v.run_id, records[v.run_id].title if v.run_id in records else "", v.seq,
            v.iteration + 1, v.criterion, "pass" if v.grader else "fail", v.labeller,
            "agree" if lb["agree"] else "disagree",
            "" if correct is None else "pass" if correct else "fail",
            "pass" if v.person else "fail", v.note, lb["created_at"], lb["updated_at"],
        ))
    return to_csv(pd.DataFrame(rows, columns=list(LABEL_EXPORT_COLUMNS))).encode("utf-8")


ANALYTICS_SCOPES = ("This run", "An experiment", "All runs of this rubric")
"""What the Loop analytics tab can cover."""
_SCOPE_KEYS = dict(zip(ANALYTICS_SCOPES, ("run", "experiment", "rubric"), strict=True))


def analytics_for(
    store: Store, record: RunRecord, scope: str, experiment_id: str | None = None
) -> tuple[pd.DataFrame, int]:
    """`rubric_core.analytics.scoped_analytics` for this run, an experiment or its rubric.

    Args:
        store: The database.
        record: The run open in Review.
        scope: One of :data:`ANALYTICS_SCOPES`.
        experiment_id: The experiment, for ``"An experiment"``.

    Returns:
        The table and how many runs it covers.

    """
    kind = _SCOPE_KEYS[scope]
    key = {"run": record.run_id, "rubric": record.rubric}.get(kind, experiment_id or "")
    scoped = scoped_analytics(store, kind, key)
    return scoped.table, len(scoped.runs)


def experiment_of_run(store: Store, record: RunRecord,
                      experiments: Sequence[ExperimentRecord]) -> str | None:
    """The experiment among ``experiments`` one of whose cells ran on this run's thread."""
    for experiment in experiments:
        if any(cell.thread_id == record.thread_id
               for cell in store.experiment_cells(experiment.experiment_id)):
            return experiment.experiment_id
    return None


CHART_MEASURES = {"first_pass_fail_rate": "First-pass fail rate",
                  "mean_passes_to_fix": "Mean passes to fix",
                  "oscillations": "Oscillations (pass → fail → pass)",
                  "feedback_efficacy": "Feedback efficacy",
                  "revision_tokens": "Tokens on revisions it forced",
                  "instability": "Instability under repeats"}
"""Columns of the analytics table the chart can show, with their titles."""
_CHART_FORMATS = {"first_pass_fail_rate": (".0%", ".0%"), "mean_passes_to_fix": (".2f", "~g"),
                  "oscillations": (".0f", "d"), "feedback_efficacy": (".0%", ".0%"),
                  "revision_tokens": (",.0f", "~s"), "instability": (".0%", ".0%")}
"""Per measure: the tooltip's number format (Python's) and the axis's (d3's)."""
_SHARES = frozenset({"first_pass_fail_rate", "feedback_efficacy", "instability"})
"""Measures that are shares, drawn on a 0 to 1 axis."""

CHART_LABEL_LIMIT_PX = 320
"""The widest a criterion name is drawn on the chart's axis; a longer one ends in "…"."""
CHART_ROW_PX = 28
"""Height of each criterion's row on the chart."""


def analytics_chart(table: pd.DataFrame, measure: str) -> alt.Chart:
    """One horizontal bar per criterion, in the table's (rubric) order, for ``st.altair_chart``.

    Criterion names label the bars, cut at `CHART_LABEL_LIMIT_PX` with an ellipsis; hovering a
    bar shows the whole name and the value. A criterion without a value (never fixed, say)
    keeps its row, with no bar and "—" as its value.
    """
    import altair as alt  # lazily: only the analytics tab draws it

    title = CHART_MEASURES[measure]
    shown, axis = _CHART_FORMATS[measure]
    values = pd.to_numeric(table[measure], errors="coerce").astype(float)
    names = [str(name) for name in table["criterion"]]
    data = pd.DataFrame({
        "criterion": names,
        "value": values.fillna(0.0),
        "shown": ["—" if pd.isna(v) else format(float(v), shown) for v in values],
    })
    x_scale = alt.Scale(domain=[0, 1]) if measure in _SHARES else alt.Scale()
    return alt.Chart(data).mark_bar().encode(
        x=alt.X("value:Q", title=title, scale=x_scale, axis=alt.Axis(format=axis)),
        y=alt.Y("criterion:N", sort=names, title=None,
                axis=alt.Axis(labelLimit=CHART_LABEL_LIMIT_PX)),
        tooltip=[alt.Tooltip("criterion:N", title="Criterion"),
                 alt.Tooltip("shown:N", title=title)],
    ).properties(height=alt.Step(CHART_ROW_PX))


def analytics_csv(table: pd.DataFrame) -> bytes:
    """The analytics table as formula-safe UTF-8 CSV."""
    return to_csv(table).encode("utf-8")


def shown_answers(evaluations: Sequence[RubricEvaluation]) -> list[ShownAnswer]:
    """The answers the Run and Review pages show, labelled (`rubric_core.attempts`)."""
    return final_answers(evaluations)


def answer_heading(answer: ShownAnswer, first: bool) -> str:
    """Markdown heading of a shown answer: "Final answer — last attempt (pass 3 of 3)"."""
    counts = f" · {answer.passed}/{answer.total} criteria pass" if answer.total else ""
    if answer.label == "Final answer":
        return f"**Final answer**{counts}"
    return (f"**Final answer — {answer.label}**{counts}" if first
            else f"**The {answer.label}**{counts}")


def labelled_keys(labels: Sequence[Mapping[str, Any]]) -> set[tuple[int, str]]:
    """The ``(seq, criterion)`` pairs of a run that carry at least one label."""
    return {(int(lb["seq"]), str(lb["criterion"])) for lb in labels}
