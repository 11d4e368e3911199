"""Rubric lab page: answer sets, labelling, re-grades in the background, health, compare, refine.

The work is `rubric_core.lab`'s; this module turns the page's widgets into its calls and its
results into tables and messages. It also keeps the registry of the re-grades this process
runs: each in a background thread of its own (`start_regrade`), whose progress the page polls
(`regrade_view`), so a rerun of the page never waits for a re-grade, Stop reaches it from any
rerun (`stop_regrade`), and a second browser session on this server sees it running. The
re-grade's results and status are in the database, so another server shows them too.
"""

from __future__ import annotations

import dataclasses
import io
import threading
from collections import OrderedDict
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

import pandas as pd

from rubric_core.app_support._common import UiMessage
from rubric_core.app_support.settings import max_tokens_from_widgets, model_problem
from rubric_core.export import write_csv, write_json
from rubric_core.lab import (
    BUNDLED_NAME,
    BUNDLED_RUBRIC,
    BUNDLED_RUBRIC_NAME,
    REGRADE_COLUMNS,
    UPLOAD_LABELLER,
    AnswerSetError,
    GraderConfig,
    RefineError,
    accept_rewrite,
    answers_from_experiment,
    answers_from_runs,
    bundled_answer_set,
    create_regrade,
    find_disagreements,
    job_progress,
    label_answer,
    parse_answers,
    read_job,
    regrade_rows,
    resolve_refiner,
    run_regrade,
    suggest_rewrites,
)
from rubric_core.models import ModelConfigError
from rubric_core.redact import error_text
from rubric_core.registry import ActiveRegistry, describe_owner, owned_here, owner_is_gone
from rubric_core.rubric import normalize_name, parse_criteria
from rubric_core.store import StoreError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, MutableMapping, Sequence

    from rubric_core.http_retry import SharedBackoff
    from rubric_core.lab import (
        AnswerSet,
        AnswerSetInfo,
        HealthReport,
        RegradeFinished,
        RegradeJob,
        RegradeProgress,
        Rewrite,
        RubricComparison,
    )
    from rubric_core.store import Store
    from rubric_core.types import ModelResolver

TYPED_RUBRIC = "(typed below)"
"""The rubric picker's choice for a rubric typed into the form rather than a saved one."""

MAX_LAB_CONFIGS = 4
"""Configuration blocks the re-grade form offers (the library allows more, added later)."""

LABEL_SHOW = ("every answer", "not labelled by me", "disagreeing with the grader")
"""Which answers the labelling view walks through."""

LABEL_VERDICTS = ("pass", "fail", "skip")
"""What a person can say of a criterion (skip: no verdict; an earlier one is removed)."""


# -- answer sets ------------------------------------------------------------------------------


def _stored(store: Store, answers: AnswerSet) -> tuple[UiMessage, str]:
    before = {i.version for i in store.answer_set_versions(answers.name)}
    version = store.save_answer_set(answers)
    size = f"{len(answers.items)} answers, {len(answers.labels)} people's verdicts"
    if version in before:
        return UiMessage("info", f"Answer set {answers.name!r} is unchanged: still version "
                                 f"{version} ({size})."), answers.name
    return UiMessage("success", f"Stored answer set {answers.name!r} version {version} "
                                f"({size}). Label it or re-grade it below."), answers.name


def import_bundled_answers(store: Store) -> tuple[UiMessage, str]:
    """Store the bundled labelled set and save its rubric to the library (runs offline)."""
    _, name = _stored(store, bundled_answer_set())
    version, _ = store.save_rubric_version(BUNDLED_RUBRIC_NAME, BUNDLED_RUBRIC)
    return UiMessage("success", f"The bundled set {BUNDLED_NAME!r} is stored (32 answers, each "
                                "criterion labelled by Ana and Ben), and its rubric is saved as "
                                f"{BUNDLED_RUBRIC_NAME!r} v{version}: re-grade it with the "
                                "`rules` grader below."), name


def import_answer_file(store: Store, data: bytes, *, file_name: str, name: str,
                  labeller: str) -> tuple[UiMessage, str | None]:
    """Check a whole uploaded answer file and store it; nothing is stored when a row is bad."""
    fmt = "jsonl" if file_name.lower().endswith((".jsonl", ".ndjson")) else None
    try:
        answers = parse_answers(data, name=name.strip() or PurePath(file_name).stem or "answers",
                                fmt=fmt, labeller=labeller.strip() or UPLOAD_LABELLER)
    except AnswerSetError as exc:
        return UiMessage("error", f"Nothing was stored: {str(exc).rstrip('.')}. Fix the file "
                                  "and upload it again."), None
    return _stored(store, answers)


def import_run_answers(store: Store, *, name: str, model: str, status: str | None,
                text: str) -> tuple[UiMessage, str | None]:
    """The final answers of the stored runs matching a filter, with Review's labels of them."""
    try:
        answers = answers_from_runs(store, name=name.strip() or "runs",
                                    model=model.strip() or None, status=status or None,
                                    text=text.strip() or None)
    except AnswerSetError as exc:
        return UiMessage("error", f"Nothing was stored: {exc}."), None
    return _stored(store, answers)


def import_experiment_answers(store: Store, experiment_id: str, *, name: str,
                      every_pass: bool) -> tuple[UiMessage, str | None]:
    """An experiment's cells' answers (each cell's final one, or every pass's)."""
    try:
        answers = answers_from_experiment(store, experiment_id, name=name.strip() or None,
                                          every_pass=every_pass)
    except (AnswerSetError, KeyError) as exc:
        return UiMessage("error", f"Nothing was stored: {str(exc).strip(chr(39))}."), None
    return _stored(store, answers)


def answer_sets_frame(infos: Sequence[AnswerSetInfo]) -> pd.DataFrame:
    """The stored answer sets (latest versions) as a table."""
    return pd.DataFrame(
        [{"name": i.name, "version": i.version, "answers": i.item_count,
          "verdicts": i.label_count, "source": i.source,
          "stored": i.created_at[:19].replace("T", " ")} for i in infos],
        columns=["name", "version", "answers", "verdicts", "source", "stored"])


# -- labelling --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LabelView:
    """What the labelling panel walks through for one answer set version."""

    item_ids: list[str]
    """The answers to walk, in set order (after the ``show`` filter)."""
    criteria: list[str]
    """The criteria to label: the rubric's, then any other criterion people labelled."""
    people: dict[tuple[str, str], dict[str, bool]]
    """(item, normalised criterion) → labeller → verdict."""
    grader: dict[tuple[str, str], tuple[bool, str]]
    """(item, normalised criterion) → the grader's verdict and gap (the chosen re-grade's)."""

    def caption(self, item_id: str, criterion: str, labeller: str) -> str:
        """One line under a criterion: your verdict, others', the grader's (with its gap)."""
        key = (item_id, normalize_name(criterion))
        people = self.people.get(key, {})
        mine = people.get(labeller)
        parts = [f"you: {'—' if mine is None else _word(mine)}"]
        others = [f"{who}: {_word(ok)}" for who, ok in sorted(people.items()) if who != labeller]
        if others:
            parts.append(", ".join(others))
        if key in self.grader:
            passed, gap = self.grader[key]
            parts.append(f"grader: {_word(passed)}" + (f" — {gap[:160]}" if gap else ""))
        return " · ".join(parts)


def _word(passed: bool) -> str:
    return "pass" if passed else "fail"


def label_view(store: Store, set_name: str, version: int, *, labeller: str, rubric: str,
               show: str, job_id: str | None = None) -> LabelView:
    """The answers and criteria to label, with people's and the grader's verdicts.

    Args:
        store: The database.
        set_name: The answer set.
        version: Its version.
        labeller: Who labels (for the "not labelled by me" filter).
        rubric: The rubric whose criteria are labelled (may be empty).
        show: One of `LABEL_SHOW`.
        job_id: A re-grade of this set version whose last configuration's verdicts are shown.

    """
    labels = store.answer_labels(set_name, version)
    criteria = list(dict.fromkeys(parse_criteria(rubric) if rubric.strip() else []))
    known = {normalize_name(c) for c in criteria}
    for lb in labels:
        if normalize_name(lb.criterion) not in known:
            known.add(normalize_name(lb.criterion))
            criteria.append(lb.criterion)
    people: dict[tuple[str, str], dict[str, bool]] = {}
    for lb in labels:
        people.setdefault((lb.item_id, normalize_name(lb.criterion)), {})[lb.labeller] = lb.passed
    grader: dict[tuple[str, str], tuple[bool, str]] = {}
    if job_id is not None:
        job = read_job(store, job_id)
        index = len(job.job.configurations) - 1
        config = job.job.configurations[index]
        for item_id, verdict in job.verdicts[index].items():
            for name, v in verdict.criteria.items():
                grader[item_id, config.labelled_as(name)] = (bool(v["passed"]),
                                                             str(v.get("gap") or ""))
    ids = [it.id for it in store.answer_items(set_name, version)]
    keys = [normalize_name(c) for c in criteria]
    if show == LABEL_SHOW[1]:
        ids = [i for i in ids if any(labeller not in people.get((i, k), {}) for k in keys)]
    elif show == LABEL_SHOW[2]:
        ids = [i for i in ids if any((i, k) in grader and any(
            p != grader[i, k][0] for p in people.get((i, k), {}).values()) for k in keys)]
    return LabelView(ids, criteria, people, grader)


def label_after(view: LabelView, item_id: str, criterion: str) -> tuple[str | None, str | None]:
    """Where the cursor goes after a verdict: the next criterion, else the next answer's first."""
    crit = view.criteria.index(criterion) if criterion in view.criteria else 0
    if crit + 1 < len(view.criteria):
        return item_id, view.criteria[crit + 1]
    return label_neighbour(view, item_id, 1), (view.criteria[0] if view.criteria else None)


def label_neighbour(view: LabelView, item_id: str, step: int) -> str | None:
    """The answer ``step`` places away in the walk (clamped to its ends)."""
    if not view.item_ids:
        return None
    at = view.item_ids.index(item_id) if item_id in view.item_ids else 0
    return view.item_ids[min(max(at + step, 0), len(view.item_ids) - 1)]


def record_verdict(store: Store, set_name: str, version: int, item_id: str, criterion: str,
                   labeller: str, verdict: str) -> UiMessage:
    """Store a verdict (`LABEL_VERDICTS`; skip removes the person's); the outcome as a message."""
    try:
        label_answer(store, set_name, version, item_id, criterion, labeller,
                     None if verdict == "skip" else verdict == "pass")
    except (ValueError, KeyError, StoreError) as exc:
        return UiMessage("error", f"Verdict not saved: {str(exc).strip(chr(39))}")
    return UiMessage("caption", f"Saved: {verdict} on “{criterion}” for answer {item_id}.")


# -- the re-grade form ------------------------------------------------------------------------


def lab_config_key(index: int, field: str) -> str:
    """Session-state key of one field of one configuration block."""
    return f"lab_cfg_{index}_{field}"


def keep_lab_form(state: MutableMapping[str, Any]) -> None:
    """Give the form its defaults and keep its values while another page is shown."""
    defaults: dict[str, Any] = {"lab_cfg_count": 1, "lab_concurrency": 8, "lab_show":
                                LABEL_SHOW[0], "lab_refiner": "demo"}
    for i in range(MAX_LAB_CONFIGS):
        defaults |= {lab_config_key(i, "rubric"): TYPED_RUBRIC, lab_config_key(i, "text"): "",
                     lab_config_key(i, "grader"): state.get("grader_model") or "rules",
                     lab_config_key(i, "repeats"): 1, lab_config_key(i, "consensus"): "majority",
                     lab_config_key(i, "few_shot"): False}
    for key, value in defaults.items():
        state[key] = state.get(key, value)


def grader_configs_from_state(state: Mapping[str, Any], store: Store, *,
                       secrets: Mapping[str, Any],
                       session_key: str | None) -> tuple[list[GraderConfig], list[UiMessage]]:
    """The configuration blocks as `GraderConfig` values, and what stops them (errors).

    Each takes the sidebar's base URL and grader output token limit.
    """
    base_url = str(state.get("base_url") or "").strip() or None
    limit = max_tokens_from_widgets(None, state.get("grader_max_tokens"))["grader_max_tokens"]
    configs: list[GraderConfig] = []
    problems: list[UiMessage] = []
    for i in range(min(int(state.get("lab_cfg_count") or 1), MAX_LAB_CONFIGS)):
        def get(field: str, default: Any = None, i: int = i) -> Any:
            return state.get(lab_config_key(i, field)) or default

        where = f"Configuration {i + 1}"
        name, version = get("rubric", TYPED_RUBRIC), get("version")
        try:
            text = str(get("text", "")) if name == TYPED_RUBRIC else store.load_rubric(name,
                                                                                      version)
        except KeyError as exc:
            problems.append(UiMessage("error", f"{where}: {str(exc).strip(chr(39))}."))
            continue
        config = GraderConfig(
            rubric=text, grader_model=str(get("grader", "rules")).strip(), base_url=base_url,
            grader_repeats=int(get("repeats", 1)), consensus=str(get("consensus", "majority")),
            few_shot=bool(get("few_shot")), rubric_name=None if name == TYPED_RUBRIC else name,
            rubric_version=None if name == TYPED_RUBRIC else version, max_tokens=limit)
        try:
            config.validate()
        except ValueError as exc:
            problems.append(UiMessage("error", f"{where}: {exc}."))
            continue
        if reason := model_problem(config.grader_model, base_url=base_url, secrets=secrets,
                                   session_key=session_key):
            problems.append(UiMessage("error", f"{where}, grader model: {reason}"))
            continue
        configs.append(config)
    return configs, problems


def new_regrade(store: Store, set_name: str, version: int, configs: Sequence[GraderConfig], *,
                models: ModelResolver) -> tuple[RegradeJob | None, UiMessage | None]:
    """Create the re-grade (nothing runs yet); or None and why it was refused."""
    try:
        job = create_regrade(store, set_name, configs, set_version=version, models=models)
    except (ValueError, KeyError, ModelConfigError) as exc:
        return None, UiMessage("error", f"The re-grade was not created: {exc}")
    return job, None


def regrade_label(job: RegradeJob) -> str:
    """One line for the re-grade picker (no status: the caption under it gives that)."""
    return (f"{job.name} v{job.set_version} · {len(job.configurations)} config(s) · "
            f"{job.created_at[:16].replace('T', ' ')} · {job.job_id[:8]}")


def regrade_config_labels(job: RegradeJob) -> list[str]:
    """Each configuration's label, numbered (two may read the same)."""
    return [f"{i + 1}. {c.display_label()}" for i, c in enumerate(job.configurations)]


# -- re-grades in the background --------------------------------------------------------------


@dataclasses.dataclass
class LiveRegrade:
    """A re-grade this process runs: its stop event and what its thread saw last."""

    stop: threading.Event
    """Set it to stop the re-grade (what Stop does)."""
    progress: dict[int, RegradeProgress] = dataclasses.field(default_factory=dict)
    """The last progress event per configuration."""
    note: UiMessage | None = None
    """A backoff notice while it runs; how it ended, after."""


ACTIVE_REGRADES: ActiveRegistry[LiveRegrade] = ActiveRegistry("Re-grade")
"""The re-grades this process runs right now, each with its thread's last view of it."""

_ENDED: OrderedDict[str, UiMessage] = OrderedDict()
_ENDED_KEPT = 64


def regrade_active(job_id: str) -> bool:
    """Whether this process is running (or stopping) the re-grade right now."""
    return job_id in ACTIVE_REGRADES


def stop_regrade(job_id: str) -> bool:
    """Ask this process's run of the re-grade to stop; False when none is running."""
    live = ACTIVE_REGRADES.get(job_id)
    if live is None:
        return False
    live.stop.set()
    return True


def wait_regrade(job_id: str, timeout_s: float) -> bool:
    """Wait for a re-grade of this process to end; True when it is no longer active."""
    return ACTIVE_REGRADES.wait_until_inactive(job_id, timeout_s)


def start_regrade(store: Store, job_id: str, *, models: ModelResolver, backoff: SharedBackoff,
                  concurrency: int, retry_errors: bool = False) -> UiMessage | None:
    """Run (or continue) a re-grade in a background thread; a message when it cannot start.

    Only what is not recorded is graded (`run_regrade`), so Resume never grades an answer
    twice; ``retry_errors`` first forgets the gradings that ended ``grader_error``.
    """
    live = LiveRegrade(threading.Event())
    try:
        ACTIVE_REGRADES.add(job_id, live)
    except RuntimeError as exc:
        return UiMessage("warning", str(exc))
    _ENDED.pop(job_id, None)
    thread = threading.Thread(
        target=_run, name=f"regrade-{job_id[:8]}", daemon=True,
        args=(store, job_id, live, dict(models=models, backoff=backoff, concurrency=concurrency,
                                        retry_errors=retry_errors)))
    thread.start()
    return None


def _run(store: Store, job_id: str, live: LiveRegrade, options: dict[str, Any]) -> None:
    ended: UiMessage = UiMessage("warning", "The re-grade ended without a word: Resume it.")
    try:
        for event in run_regrade(store, job_id, stop=live.stop, **options):
            if event["type"] == "regrade_progress":
                live.progress[event["config_index"]] = event
            elif event["type"] == "regrade_backoff":
                live.note = UiMessage("info", f"The model server answered "
                                              f"{event['status_code']}: gradings wait "
                                              f"{event['wait_s']:.1f} s (shared backoff).")
            elif event["type"] == "regrade_finished":
                ended = _finished(event)
    except Exception as exc:  # shown on the page; the recorded gradings stay
        ended = UiMessage("error", f"The re-grade stopped: {error_text(exc)}. Fix it, then "
                                   "Resume (what was recorded is kept).")
    finally:
        _ENDED[job_id] = ended
        while len(_ENDED) > _ENDED_KEPT:
            _ENDED.popitem(last=False)
        ACTIVE_REGRADES.discard(job_id)


def _finished(event: RegradeFinished) -> UiMessage:
    if event["status"] == "finished":
        return UiMessage("success", f"Re-grade finished after {event['duration_s']:.1f} s.")
    return UiMessage("info", f"Re-grade stopped after {event['duration_s']:.1f} s: Resume "
                             "grades only what was not recorded.")


@dataclasses.dataclass(frozen=True)
class RegradeView:
    """Where a re-grade stands, for the page: progress per configuration and a message."""

    job: RegradeJob
    """The re-grade as stored now."""
    running_here: bool
    """Whether this process runs it right now."""
    progress: list[RegradeProgress]
    """Per configuration (with an ETA while it runs here)."""
    message: UiMessage | None
    """A backoff notice, how it ended, or that it is not running here."""
    running_elsewhere: bool = False
    """Whether another process (the CLI, another server) grades it right now."""

    @property
    def errors(self) -> int:
        """Gradings that ended ``grader_error`` (retryable)."""
        return sum(p["errors"] for p in self.progress)

    @property
    def complete(self) -> bool:
        """Every grading recorded."""
        return all(p["done"] >= p["total"] for p in self.progress)


def regrade_view(store: Store, job_id: str) -> RegradeView:
    """The re-grade's progress: its thread's view when it runs here, else the database's."""
    job = store.get_regrade_job(job_id)
    if job is None:
        msg = f"no re-grade {job_id!r} in this database"
        raise KeyError(msg)
    live = ACTIVE_REGRADES.get(job_id)
    stored = job_progress(store, job_id)
    if live is not None:
        progress = [live.progress.get(p["config_index"], p) for p in stored]
        return RegradeView(job, True, progress, live.note)
    holder = _grading_elsewhere(store, job_id)
    if holder is not None:
        return RegradeView(job, False, stored, UiMessage(
            "info", f"Another process is grading this re-grade now ({describe_owner(holder)}): "
                    "its progress is followed here. Stop it there; Resume is for when it has "
                    "ended."), running_elsewhere=True)
    message = _ENDED.get(job_id)
    if message is None and job.status == "running":
        message = UiMessage("info", "This re-grade is not running: it was interrupted (its "
                                    "process stopped or was killed). Resume continues it.")
    return RegradeView(job, False, stored, message)


def _grading_elsewhere(store: Store, job_id: str) -> str | None:
    """A live process of another session grading items of the re-grade now, if any."""
    from rubric_core.engine.status import NoEngineTables, regrade_executors

    try:
        executors = regrade_executors(store, job_id)
    except NoEngineTables:
        return None
    return next((e for e in executors if not owned_here(e) and not owner_is_gone(e)), None)


def regrade_progress_text(event: RegradeProgress) -> tuple[float, str]:
    """Progress bar value and text for one configuration."""
    done, total = event["done"], max(event["total"], 1)
    parts = [f"{event['config_index'] + 1}. {event['label']}: {done}/{event['total']} gradings"]
    if event["errors"]:
        parts.append(f"{event['errors']} error(s)")
    if event["eta_s"] is not None and done < event["total"]:
        parts.append(f"ETA {event['eta_s']:.0f} s")
    return min(done / total, 1.0), " · ".join(parts)


# -- health, compare, refine, downloads -------------------------------------------------------


def _num(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.0f}%"


def health_frame(report: HealthReport) -> pd.DataFrame:
    """Criterion health, one row per configuration × criterion, read as a person reads it."""
    return pd.DataFrame([{
        "criterion": h.criterion,
        "flags": ", ".join(f"{f} ({h.redundant_with})" if f == "redundant" else f
                           for f in h.flags),
        "κ with people": _num(h.kappa),
        "κ 95% interval": "—" if h.kappa_low is None else
        f"[{_num(h.kappa_low)}, {_num(h.kappa_high)}]",
        "n": h.people_n, "people vs people κ": _num(h.people_kappa),
        "people pairs": h.people_pairs,
        "agreement": "—" if h.agree_pct is None else f"{h.agree_pct:.0f}%",
        "pass rate": _pct(h.pass_rate), "graded": h.graded, "stability": _pct(h.stability),
        "config": f"{h.config_index + 1}. {h.config_label}"} for h in report.criteria])


def rubric_compare_frame(cmp: RubricComparison) -> pd.DataFrame:
    """The before/after table: per matched criterion, pass rates and κ of both, and flips."""
    return pd.DataFrame([{
        "criterion (A)": c.criterion_a, "criterion (B)": " + ".join(c.criteria_b),
        "κ A": _num(c.kappa_a), "κ B": _num(c.kappa_b),
        "Δ κ": "—" if c.kappa_delta is None else f"{c.kappa_delta:+.2f}",
        "pass rate A": _pct(c.pass_rate_a), "pass rate B": _pct(c.pass_rate_b),
        "Δ pass rate": "—" if c.pass_rate_delta is None else f"{100 * c.pass_rate_delta:+.0f}",
        "flips": len(c.flips), "McNemar p": f"{c.p_value:.3g}", "n": c.n,
        "people n": c.people_n} for c in cmp.criteria])


def flips_frame(cmp: RubricComparison, criterion: str) -> pd.DataFrame:
    """The answers whose verdict on one of A's criteria flipped, both gaps side by side."""
    columns = ["answer id", "answer", "A", "A's gap", "B", "B's gap", "people"]
    found = next((c for c in cmp.criteria if c.criterion_a == criterion), None)
    return pd.DataFrame([{
        "answer id": f.item_id, "answer": f.answer, "A": _word(f.passed_a), "A's gap": f.gap_a,
        "B": _word(f.passed_b), "B's gap": f.gap_b,
        "people": ", ".join(f"{who}: {_word(ok)}" for who, ok in sorted(f.people.items()))}
        for f in (found.flips if found else [])], columns=columns)


def kappa_change(cmp: RubricComparison, criterion: str) -> str:
    """One line: κ with people and the pass rate of a criterion, before and after."""
    found = next((c for c in cmp.criteria if c.criterion_a == criterion), None)
    if found is None:
        return f"“{criterion}” has no counterpart in the other configuration."
    return (f"“{criterion}” → “{' + '.join(found.criteria_b)}”: κ with people "
            f"{_num(found.kappa_a)} → {_num(found.kappa_b)} (n {found.people_n}), pass rate "
            f"{_pct(found.pass_rate_a)} → {_pct(found.pass_rate_b)}, {len(found.flips)} "
            "verdict(s) flipped.")


def refiner_options(state: Mapping[str, Any]) -> list[str]:
    """The refiner models offered: the offline demo refiner, then the sidebar's LLMs."""
    sidebar = [str(state.get(k) or "") for k in ("grader_model", "worker_model")]
    return list(dict.fromkeys(["demo", *(m for m in sidebar if m and m not in ("demo",
                                                                              "rules"))]))


def suggest_rewrite(store: Store, job_id: str, config_index: int, criterion: str, refiner: str, *,
            models: ModelResolver, base_url: str | None) -> tuple[list[Rewrite], UiMessage]:
    """Ask the refiner for up to three rewordings or splits of a criterion."""
    job = store.get_regrade_job(job_id)
    if job is None or not 0 <= config_index < len(job.configurations):
        return [], UiMessage("error", "That re-grade or configuration is gone: pick another.")
    try:
        shown = find_disagreements(store, job_id, config_index, criterion)
        model = (resolve_refiner("demo") if refiner.strip() == "demo"
                 else models(refiner.strip(), "grader", base_url))
        rewrites = suggest_rewrites(model, rubric=job.configurations[config_index].rubric,
                                    criterion=criterion, disagreements=shown)
    except (RefineError, ValueError, ModelConfigError) as exc:
        return [], UiMessage("error", f"No suggestion: {exc}")
    return rewrites, UiMessage("info", f"{len(rewrites)} suggestion(s) from {refiner}, shown "
                                       f"{len(shown)} disagreement(s) with people. Edit one "
                                       "(one criterion per line) and accept it.")


def accept_suggestion(store: Store, job_id: str, config_index: int, criterion: str,
           text: str) -> tuple[int | None, UiMessage]:
    """Save the edited rewrite as a new rubric version and add it to the re-grade."""
    lines = [line.strip().removeprefix("- ").strip() for line in text.splitlines()]
    try:
        index = accept_rewrite(store, job_id, config_index, criterion, [x for x in lines if x])
    except (ValueError, KeyError, IndexError) as exc:
        return None, UiMessage("error", f"Not accepted: {str(exc).strip(chr(39))}")
    config = store.get_regrade_job(job_id).configurations[index]  # type: ignore[union-attr]
    return index, UiMessage("success", f"Saved as {config.rubric_name!r} "
                                       f"v{config.rubric_version} and added as configuration "
                                       f"{index + 1}: it is being graded on the same answers.")


def regrade_download(store: Store, job_id: str, fmt: str) -> Callable[[], bytes]:
    """A callable for ``st.download_button(data=...)``: every grading as CSV or JSON rows."""

    def build() -> bytes:
        text = io.StringIO(newline="")
        (write_csv if fmt == "csv" else write_json)(regrade_rows(store, job_id), text,
                                                    REGRADE_COLUMNS)
        return text.getvalue().encode("utf-8")

    return build
