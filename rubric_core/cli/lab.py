"""``rubric-studio regrade`` and ``rubric-studio answers``: the rubric lab from a terminal.

``regrade`` grades a fixed set of answers under one or more rubric versions (grader calls
only) and prints the criterion-health table; its exit status gates CI on the judge itself:
0 when every grading is recorded without an error and every criterion's κ with people's
verdicts reaches ``--min-kappa``, 1 otherwise (the reason is printed last), 2 for bad input,
130 on Ctrl-C (the re-grade is stopped and resumes with ``--resume``). ``answers`` lists,
imports, shows, exports and deletes answer sets. Everything is a `rubric_core.lab` call.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rubric_core.cli._common import (
    UsageError,
    add_max_tokens_arguments,
    add_price_arguments,
    check_output,
    existing_database,
    max_tokens,
    prices_from,
    text_arg,
)
from rubric_core.redact import redact
from rubric_core.store import default_db_path, shown_location
from rubric_core.store import is_url as is_db_url

if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

    from rubric_core.costs import RegradeConfigCost
    from rubric_core.lab import AnswerSet, GraderConfig, HealthReport
    from rubric_core.store import Store

REGRADE_DESCRIPTION = (
    "Grade a fixed set of answers (--answers FILE|bundled, --experiment ID, --runs FILTER or "
    "--answer-set NAME) under each --rubric with --grader: grader calls only, recorded in --db. "
    "Prints criterion health (pass rate, κ with people's verdicts and its interval, stability, "
    "flags). Exit 0 when every grading is recorded without an error and every labelled "
    "criterion's κ reaches --min-kappa, 1 otherwise, 2 for bad input, 130 on Ctrl-C "
    "(resumable with --resume)."
)
"""``regrade --help``'s description."""

PROGRESS_EVERY_S = 2.0
"""Longest a configuration's progress goes unprinted while gradings end."""

RUN_FILTER_KEYS = ("rubric", "model", "status", "text")
"""Keys of ``--runs``."""


def add_regrade_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``regrade``."""
    add = parser.add_argument
    add_price_arguments(parser)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--answers", default=None, metavar="FILE|bundled",
                        help="a CSV or JSONL answer file (request, answer, optional id, "
                        "label:<criterion> columns), or 'bundled' for the offline demo set")
    source.add_argument("--experiment", default=None, metavar="ID",
                        help="an experiment's final answers (with --every-pass: every pass's)")
    source.add_argument("--runs", default=None, metavar="FILTER",
                        help="final answers of stored runs: rubric=@FILE,model=M,status=S,"
                        "text=T (any of them; empty for every run)")
    source.add_argument("--answer-set", default=None, metavar="NAME",
                        help="an answer set already stored (its latest version)")
    add("--every-pass", action="store_true", help="with --experiment: every pass's answer")
    add("--name", default=None, help="store the answer set under this name")
    add("--labeller", default=None,
        help="who the file's label:<criterion> columns are recorded as (default: uploaded)")
    add("--rubric", action="append", default=[], metavar="TEXT|@FILE",
        help="a rubric version to grade with: one configuration each (with --answers bundled "
        "the bundled rubric by default)")
    add("--rubric-name", default=None,
        help="save the rubrics in the library under this name (versions in the given order)")
    add("--grader", default="rules", help="grader model (default: rules)")
    add("--base-url", default=None, help="OpenAI-compatible server of the grader")
    add("--system", default=None, metavar="TEXT|@FILE", help="a custom grader prompt")
    add("--tools", default="", metavar="a+b", help="grader evidence tools, joined by +")
    add("--repeats", type=int, default=1, metavar="K",
        help="grade each answer K times and take the consensus (default 1)")
    add("--consensus", choices=("majority", "unanimous"), default="majority",
        help="how repeats combine (default majority; a tie fails)")
    add("--few-shot", action="store_true",
        help="add people's labelled verdicts as few-shot examples (never an answer's own)")
    add_max_tokens_arguments(parser, "", worker=False)
    add("--concurrency", type=int, default=None, metavar="C",
        help="gradings (requests) at once (default 4)")
    add("--min-kappa", type=float, default=None, metavar="K",
        help="exit 1 when a labelled criterion's κ with people is below K (-1 to 1)")
    add("--csv", default=None, help="write every grading × criterion as CSV here")
    add("--json", default=None, help="write every grading × criterion as JSON here")
    add("--db", default=None,
        help="SQLite file or postgresql:// URL (default: the app's database, $RUBRIC_STUDIO_DB)")
    add("--resume", default=None, metavar="ID", help="continue a stopped or killed re-grade")
    add("--retry-errors", action="store_true",
        help="with --resume: grade again the gradings that ended in an error")


def _check_arguments(args: argparse.Namespace) -> None:
    sources = [args.answers, args.experiment, args.runs, args.answer_set]
    if args.resume is None and all(s is None for s in sources):
        msg = ("give --answers FILE|bundled, --experiment ID, --runs FILTER or --answer-set "
               "NAME (or --resume ID)")
        raise UsageError(msg)
    if args.resume is not None and (any(s is not None for s in sources) or args.rubric):
        msg = "--resume continues a re-grade as it was created: drop the answers and --rubric"
        raise UsageError(msg)
    if args.min_kappa is not None and not -1.0 <= args.min_kappa <= 1.0:
        msg = f"--min-kappa must be from -1 to 1, got {args.min_kappa}"
        raise UsageError(msg)
    if args.every_pass and args.experiment is None:
        msg = "--every-pass goes with --experiment"
        raise UsageError(msg)
    if args.retry_errors and args.resume is None:
        msg = "--retry-errors goes with --resume ID"
        raise UsageError(msg)


def run_filter(text: str) -> dict[str, str]:
    """``--runs KEY=VALUE,...`` as `answers_from_runs` keywords (``rubric`` may be @FILE).

    Raises:
        UsageError: A part that is not KEY=VALUE with a known key.

    """
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in RUN_FILTER_KEYS:
            msg = (f"--runs {text!r}: {part!r} is not KEY=VALUE with KEY one of "
                   f"{', '.join(RUN_FILTER_KEYS)}")
            raise UsageError(msg)
        key = key.strip()
        out[key] = text_arg(value.strip(), "--runs rubric") if key == "rubric" else value.strip()
    return out


def _answer_set(args: argparse.Namespace, store: Store) -> AnswerSet | str:
    """The answer set the arguments name (parsed, or a stored set's name)."""
    from rubric_core.lab import (
        UPLOAD_LABELLER,
        answers_from_experiment,
        answers_from_runs,
        bundled_answer_set,
        read_answers_file,
    )

    if args.answer_set is not None:
        return str(args.answer_set)
    if args.answers == "bundled":
        return bundled_answer_set()
    if args.answers is not None:
        if not Path(args.answers).is_file():
            msg = f"--answers {args.answers!r} is not a file (or give 'bundled')"
            raise UsageError(msg)
        return read_answers_file(args.answers, name=args.name or None,
                                 labeller=args.labeller or UPLOAD_LABELLER)
    if args.experiment is not None:
        try:
            return answers_from_experiment(store, args.experiment, name=args.name,
                                           every_pass=args.every_pass)
        except KeyError as exc:
            raise UsageError(str(exc.args[0])) from exc
    filters = run_filter(args.runs or "")
    return answers_from_runs(store, name=args.name or "runs", **filters)


def _configs(args: argparse.Namespace, store: Store) -> list[GraderConfig]:
    from rubric_core.lab import BUNDLED_RUBRIC, BUNDLED_RUBRIC_NAME, GraderConfig

    rubrics = [text_arg(r, "rubric") for r in args.rubric]
    name = args.rubric_name
    if not rubrics and args.answers == "bundled":
        rubrics, name = [BUNDLED_RUBRIC], name or BUNDLED_RUBRIC_NAME
    if not rubrics:
        msg = "give at least one --rubric TEXT|@FILE to grade the answers with"
        raise UsageError(msg)
    system = text_arg(args.system, "grader prompt") if args.system else ""
    tools = tuple(t for t in args.tools.split("+") if t.strip())
    configs = []
    for rubric in rubrics:
        version = store.save_rubric_version(name, rubric)[0] if name else None
        configs.append(GraderConfig(
            rubric=rubric, grader_model=args.grader, base_url=args.base_url,
            grader_system_prompt=system, grader_tools=tools, grader_repeats=args.repeats,
            consensus=args.consensus, few_shot=args.few_shot, rubric_name=name,
            rubric_version=version, max_tokens=max_tokens(args)[1]))
    return configs


class ProgressPrinter:
    """Prints a re-grade's events as they come.

    A configuration's progress at most every `PROGRESS_EVERY_S` seconds (and at its end or a
    new error), every grading that errored, every backoff.
    """

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.shown: dict[int, tuple[float, int]] = {}

    def __call__(self, event: Any) -> None:
        """Print one `run_regrade` event (or nothing, for a throttled progress line)."""
        out = self.out
        if event["type"] == "regrade_progress":
            index, now = event["config_index"], time.monotonic()
            last = self.shown.get(index)
            if (last is not None and event["done"] < event["total"]
                    and event["errors"] == last[1] and now - last[0] < PROGRESS_EVERY_S):
                return
            self.shown[index] = (now, event["errors"])
            eta = "" if event["eta_s"] is None else f", ETA {event['eta_s']:.0f}s"
            out.write(f"[{index}] {event['label']}: {event['done']}/{event['total']} graded, "
                      f"{event['errors']} error(s){eta}\n")
        elif event["type"] == "item_graded" and event["result"] == "grader_error":
            out.write(f"    {event['item_id']} [{event['config_index']}]: "
                      f"{redact(event['error'] or '')}\n")
        elif event["type"] == "regrade_backoff":
            out.write(f"    server answered {event['status_code']}: waiting "
                      f"{event['wait_s']:.2f}s ({event['hits']} so far)\n")
        out.flush()


def _gate(health: HealthReport, min_kappa: float | None, out: TextIO) -> int:
    """1 when a labelled criterion's κ is below ``min_kappa`` (saying which), else 0."""
    if min_kappa is None:
        return 0
    low, gated = [], 0
    for row in health.criteria:
        if row.people_n == 0:
            continue
        gated += 1
        if (row.kappa is None and (row.agree_pct or 0.0) < 100.0) or (
                row.kappa is not None and row.kappa < min_kappa):
            shown = "undefined" if row.kappa is None else f"{row.kappa:.3f}"
            low.append(f"[{row.config_index}] {row.criterion} (κ {shown}, n {row.people_n})")
    if not gated:
        out.write("no criterion has people's verdicts to check κ against "
                  "(label:<criterion> columns): exit 1\n")
        return 1
    if low:
        out.write(f"below --min-kappa {min_kappa:g}: {'; '.join(low)}: exit 1\n")
        return 1
    return 0


def regrade_cost_line(costs: Sequence[RegradeConfigCost]) -> str:
    """``cost: [0] $X (N tokens in, C cached, M out), …`` and how the input was priced."""
    from rubric_core.prices import format_dollars

    shown = []
    for index, cost in enumerate(costs):
        tokens = ("no usage reported" if cost.input_tokens is None and cost.output_tokens is None
                  else f"{cost.input_tokens or 0:,} tokens in, {cost.cached_input_tokens or 0:,} "
                  f"cached, {cost.output_tokens or 0:,} out")
        shown.append(f"[{index}] {format_dollars(cost.cost)} ({tokens})")
    note = "cached input at the cached price; --price overrides win"
    if older := sum(c.uncached_gradings for c in costs):
        note += (f"; {older:,} grading(s) recorded before cached tokens were kept are priced "
                 "as uncached, at most what they cost")
    return f"cost: {', '.join(shown)} ({note})\n"


def regrade(args: argparse.Namespace, out: TextIO) -> int:
    """``regrade``: create (or resume) the re-grade, run it, print criterion health.

    Returns:
        0, or 1 when a grading is missing or errored or a κ is below ``--min-kappa``.

    Raises:
        UsageError: Bad arguments, or no such re-grade to resume.
        ValueError: A file or bound the library refuses (the message names it).
        KeyboardInterrupt: Ctrl-C, after the re-grade was stopped (resumable).

    """
    from rubric_core.costs import regrade_cost
    from rubric_core.experiments import check_limits
    from rubric_core.export import write_csv, write_json
    from rubric_core.http_retry import SharedBackoff
    from rubric_core.lab import (
        DEFAULT_MIN_KAPPA,
        REGRADE_COLUMNS,
        create_regrade,
        criterion_health,
        regrade_models,
        regrade_rows,
        run_regrade,
    )
    from rubric_core.store import Store
    from rubric_core.types import DEFAULT_CONCURRENCY

    for path in (args.csv, args.json):
        if path:
            check_output(path)
    _check_arguments(args)
    if args.concurrency is not None:
        check_limits(args.concurrency)  # before anything is stored: no job left behind
    prices = prices_from(args)
    db = args.db or default_db_path()
    if args.resume is not None or args.experiment is not None or args.runs is not None or (
            args.answer_set is not None):
        db = existing_database(db)
    store = Store(db)
    backoff = SharedBackoff()
    models = regrade_models(backoff)
    try:
        if args.resume is not None:
            job = store.get_regrade_job(args.resume)
            if job is None:
                msg = f"no re-grade {args.resume!r} in {shown_location(db)}"
                raise UsageError(msg)
        else:
            answers = _answer_set(args, store)
            try:
                job = create_regrade(store, answers, _configs(args, store), models=models)
            except KeyError as exc:
                raise UsageError(str(exc.args[0])) from exc
        out.write(f"re-grade {job.job_id} ({job.name}): {len(job.configurations)} "
                  f"configuration(s), answer set {job.set_name} v{job.set_version}; resume "
                  f"with: rubric-studio regrade --resume {job.job_id} --db "
                  f"{shown_location(db)}\n")
        out.flush()
        printer = ProgressPrinter(out)
        events = run_regrade(store, job.job_id, models=models, backoff=backoff,
                             concurrency=(DEFAULT_CONCURRENCY if args.concurrency is None
                                          else args.concurrency),
                             retry_errors=args.retry_errors)
        finished = False
        try:
            for event in events:
                printer(event)
                finished = finished or (event["type"] == "regrade_finished"
                                        and event["status"] == "finished")
        except KeyboardInterrupt:
            events.close()
            out.write(f"stopped: resume with rubric-studio regrade --resume {job.job_id}\n")
            out.flush()
            raise
        health = criterion_health(store, job.job_id,
                                  min_kappa=(DEFAULT_MIN_KAPPA if args.min_kappa is None
                                             else args.min_kappa))
        table = health.table()
        out.write("\n" + redact(table.to_string(index=False)) + "\n")
        for path, write in ((args.csv, write_csv), (args.json, write_json)):
            if path:
                with open(path, "w", encoding="utf-8", newline="") as handle:
                    count = write(regrade_rows(store, job.job_id), handle, REGRADE_COLUMNS)
                out.write(f"wrote {count} rows to {path}\n")
        out.write(regrade_cost_line(regrade_cost(store, prices, job)))
        counts = store.regrade_counts(job.job_id)
    finally:
        store.close()
    errors = sum(e for _, e in counts.values())
    if not finished:
        out.write("not every answer was graded (stopped?): exit 1\n")
        return 1
    if errors:
        out.write(f"{errors} grading(s) ended in an error (retry them with --resume "
                  f"{job.job_id} --retry-errors): exit 1\n")
        return 1
    return _gate(health, args.min_kappa, out)


# -- answers ----------------------------------------------------------------------------------


def add_answers_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``answers``."""
    parser.add_argument("--db", default=None,
                        help="SQLite file or postgresql:// URL (default: the app's database, "
                        "$RUBRIC_STUDIO_DB)")
    parser.add_argument("action", nargs="?", default="list",
                        choices=("list", "import", "show", "export", "delete"))
    parser.add_argument("target", nargs="?", default=None,
                        help="import: FILE or 'bundled'; show, export, delete: NAME")
    parser.add_argument("--name", default=None, help="import: store under this name")
    parser.add_argument("--labeller", default=None,
                        help="import: who label:<criterion> columns are recorded as")
    parser.add_argument("--version", type=int, default=None, help="show, export: a version")
    parser.add_argument("--csv", default=None, help="export: write the set as CSV here")
    parser.add_argument("--jsonl", default=None, help="export: write the set as JSONL here")


def _export_answers(store: Store, name: str, version: int, path: str, jsonl: bool) -> int:
    from rubric_core.export import write_csv
    from rubric_core.lab import UPLOAD_LABELLER, label_columns

    items = store.answer_items(name, version)
    labels = store.answer_labels(name, version)
    columns = ["id", "request", "answer", "rubric", *label_columns(labels)]
    by_item: dict[str, dict[str, str]] = {}
    for lb in labels:
        column = (f"label:{lb.criterion}" if lb.labeller == UPLOAD_LABELLER
                  else f"label@{lb.labeller}:{lb.criterion}")
        by_item.setdefault(lb.item_id, {})[column] = "pass" if lb.passed else "fail"
    rows = [[it.id, it.request, it.answer, it.rubric or "",
             *(by_item.get(it.id, {}).get(c, "") for c in columns[4:])] for it in items]
    with open(path, "w", encoding="utf-8", newline="") as handle:
        if not jsonl:
            return write_csv(rows, handle, columns)
        for row in rows:
            handle.write(json.dumps({c: v for c, v in zip(columns, row, strict=True) if v != ""},
                                    ensure_ascii=False) + "\n")
    return len(rows)


def answers(args: argparse.Namespace, out: TextIO) -> int:
    """``answers [list|import FILE|show NAME|export NAME --csv/--jsonl OUT|delete NAME]``.

    Returns:
        0 (bad input raises).

    Raises:
        UsageError: A missing target or output, no database, or no such set.

    """
    from rubric_core.lab import UPLOAD_LABELLER, bundled_answer_set, read_answers_file
    from rubric_core.store import Store

    if args.action != "list" and not args.target:
        msg = f"answers {args.action} needs a {'FILE' if args.action == 'import' else 'NAME'}"
        raise UsageError(msg)
    db = args.db or default_db_path()
    if args.action == "list" and not is_db_url(db) and not Path(db).is_file():
        out.write(f"no answer sets: no database at {db} yet\n")
        return 0
    if args.action == "export":
        if not (args.csv or args.jsonl):
            msg = "answers export needs --csv OUT or --jsonl OUT"
            raise UsageError(msg)
        check_output(args.csv or args.jsonl)
    if args.action != "import":
        db = existing_database(db)
    store = Store(db)
    try:
        if args.action == "list":
            infos = store.list_answer_sets()
            for info in infos:
                out.write(redact(f"{info.name:24} v{info.version:<3} {info.item_count:6} answers "
                                 f"{info.label_count:6} labels  {info.source[:30]:30} "
                                 f"{info.created_at[:19]}") + "\n")
            if not infos:
                out.write(f"no answer sets in {shown_location(db)}\n")
            return 0
        if args.action == "import":
            if args.target == "bundled":
                answer_set = bundled_answer_set()
            elif not Path(args.target).is_file():
                msg = f"answers import {args.target!r}: not a file (or give 'bundled')"
                raise UsageError(msg)
            else:
                answer_set = read_answers_file(args.target, name=args.name or None,
                                               labeller=args.labeller or UPLOAD_LABELLER)
            version = store.save_answer_set(answer_set, args.name)
            out.write(f"stored {args.name or answer_set.name} v{version}: "
                      f"{len(answer_set.items)} answers, {len(answer_set.labels)} labels\n")
            return 0
        try:
            info = store.answer_set_info(args.target, args.version)
        except KeyError as exc:
            raise UsageError(str(exc.args[0])) from exc
        if args.action == "show":
            out.write(redact(f"{info.name} v{info.version}: {info.item_count} answers, "
                             f"{info.label_count} labels ({info.source})") + "\n")
            for item in store.answer_items(info.name, info.version, limit=10):
                out.write(redact(f"{item.id}: {item.answer[:70]!r}") + "\n")
        elif args.action == "export":
            path = args.csv or args.jsonl
            count = _export_answers(store, info.name, info.version, path, bool(args.jsonl))
            out.write(f"wrote {count} answers to {path}\n")
        else:
            deleted = store.delete_answer_set(info.name)
            out.write(f"deleted {deleted} version(s) of {info.name}\n")
    finally:
        store.close()
    return 0
