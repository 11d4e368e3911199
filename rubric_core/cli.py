"""Command line: ``rubric-studio run|eval|datasets|db|examples|analytics|app ...``.

``python -m rubric_core`` is the same command.

Prints each grader pass as it happens; exits 0 when the rubric is satisfied, 1 when the run
ends otherwise, 2 for bad arguments or configuration (with a message, not a traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rubric_core.models import ModelConfigError
from rubric_core.redact import install_log_redaction, install_traceback_redaction, redact
from rubric_core.rubric import RubricError
from rubric_core.store import DB_ENV_VAR, StoreError, default_db_path, shown_location
from rubric_core.store import is_url as is_db_url

if TYPE_CHECKING:
    from collections.abc import Iterator

    from rubric_core.runner import RunEvent
    from rubric_core.settings import RunSettings

NEXT_STEPS = {
    "max_iterations_reached": "raise --max-iterations, or make the criteria easier to meet",
    "failed": "the grader could not judge this rubric: rewrite the criteria, or use an LLM "
    "grader (e.g. --grader hybrid:openai:gpt-4.1-mini)",
    "grader_error": "the grader itself failed: check its model name, key and server",
    "interrupted": "run again with --resume --thread THREAD --db PATH to continue",
    "error": "the worker failed: check its model name, key and server",
}


class UsageError(Exception):
    """Bad command-line input, reported without a traceback."""


MAX_TEXT_FILE_BYTES = 1024 * 1024
"""The largest ``@FILE`` (or ``@-`` input) read for a prompt, rubric or system prompt."""


def _text_arg(value: str, what: str) -> str:
    """``TEXT`` or ``@FILE`` (``@-`` reads standard input), at most `MAX_TEXT_FILE_BYTES`."""
    if not value.startswith("@"):
        return value
    path = value[1:]
    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_TEXT_FILE_BYTES + 1)
        else:
            if Path(path).is_dir():
                msg = f"{what} file {path!r} is a directory"
                raise UsageError(msg)
            with open(path, "rb") as handle:  # bounded: /dev/zero or a huge file stop here
                data = handle.read(MAX_TEXT_FILE_BYTES + 1)
        if len(data) > MAX_TEXT_FILE_BYTES:
            msg = (
                f"{what} file {path!r} is over {MAX_TEXT_FILE_BYTES // 1024} KB: "
                             "give a smaller file"
            )
            raise UsageError(msg)
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        msg = f"{what} file {path!r} is not UTF-8 text: {exc}"
        raise UsageError(msg) from exc
    except OSError as exc:
        msg = f"cannot read {what} file {path!r}: {exc}"
        raise UsageError(msg) from exc


def _check_output(path: str) -> None:
    """Refuse an output path that cannot be written, before any token is spent."""
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        msg = f"--csv {path!r} is a directory: give a file path"
        raise UsageError(msg)
    if not parent.is_dir():
        msg = f"--csv {path!r}: the directory {str(parent)!r} does not exist"
        raise UsageError(msg)
    if not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        msg = f"--csv {path!r} is not writable"
        raise UsageError(msg)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rubric-studio", description="Run rubric-driven agent loops."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a prompt until its rubric is satisfied")
    run.add_argument("--prompt", help="TEXT or @FILE")
    run.add_argument("--rubric", help="TEXT or @FILE: one criterion per line")
    run.add_argument("--example", help="a bundled example (see `examples`)")
    run.add_argument("--model", default=None, help="worker model (default: demo)")
    run.add_argument("--grader", default=None, help="grader model (default: rules)")
    run.add_argument("--system-prompt", default=None, help="worker system prompt, TEXT or @FILE")
    run.add_argument("--max-iterations", type=int, default=None)
    _add_judging_arguments(run, "")
    run.add_argument("--base-url", default=None, help="OpenAI-compatible server URL")
    run.add_argument("--csv", default=None, help="write the evaluations as CSV to this path")
    run.add_argument("--db", default=None,
                     help="SQLite file or postgresql:// URL to keep the thread in")
    run.add_argument("--thread", default=None, help="thread id (with --db, to resume)")
    run.add_argument("--resume", action="store_true", help="continue an interrupted thread")
    run.add_argument("--quiet", action="store_true", help="do not print the worker's answers")
    sub.add_parser("examples", help="list the bundled examples")
    stats = sub.add_parser(
        "analytics", help="per-criterion loop statistics over the runs in a database",
        description="How often each criterion fails on the first pass, how many passes fix "
        "it, oscillations, feedback efficacy, tokens on the revisions it forced and instability "
        "under repeats (rubric_core.analytics), over one run, an experiment, every run of a "
        "rubric, or (by default) every run in --db.",
    )
    stats.add_argument("--db", default=None,
                       help="the database to read: SQLite file or postgresql:// URL (default: "
                       "the app's database, $RUBRIC_STUDIO_DB)")
    scope = stats.add_mutually_exclusive_group()
    scope.add_argument("--run", default=None, help="one run: its id or a unique prefix of it")
    scope.add_argument("--experiment", default=None,
                       help="an experiment's cells: its id or a unique prefix of it")
    scope.add_argument("--rubric", default=None,
                       help="every run graded against this rubric, TEXT or @FILE")
    stats.add_argument("--csv", default=None, help="also write the table as CSV to this path")
    _add_eval_parsers(sub)
    _add_db_parsers(sub)
    sub.add_parser(
        "app", help="start the Streamlit app (streamlit run serve.py)",
        description="Start the Streamlit app from the clone it was installed from. Arguments "
        "after 'app' go to 'streamlit run', e.g. rubric-studio app --server.port 8600.",
    )
    return parser


def app_root() -> Path | None:
    """The directory holding the Streamlit app (``serve.py``, ``app.py``, ``pages/``), if any.

    The app ships with the repository, not inside the package: it is found next to the
    package (an editable install or a clone) or in the current directory.
    """
    package_parent = Path(__file__).resolve().parents[1]
    for candidate in (package_parent, Path.cwd()):
        if all((candidate / name).exists() for name in ("serve.py", "app.py", "pages")):
            return candidate
    return None


def _start_app(streamlit_args: list[str]) -> int:
    root = app_root()
    if root is None:
        msg = (
            "the Streamlit app (serve.py, app.py, pages/) ships with the repository, not the "
            "package: run 'rubric-studio app' inside a clone, or install from one with "
            "'pip install -e .'"
        )
        raise UsageError(
            msg
        )
    args = [a for a in streamlit_args if a != "--"]
    os.chdir(root)  # streamlit reads .streamlit/config.toml from the working directory
    os.execv(sys.executable, [sys.executable, "-m", "streamlit", "run", "serve.py", *args])
    return 0  # pragma: no cover - execv does not return


def _add_judging_arguments(parser: Any, whose: str) -> None:
    """--grader-repeats, --consensus and --return-best (RubricMiddleware's options)."""
    from rubric_core.consensus import CONSENSUS_MODES, MAX_GRADER_REPEATS

    parser.add_argument("--grader-repeats", type=int, default=None, metavar="K",
                        help=f"grade each answer K times (1-{MAX_GRADER_REPEATS}) and take the "
                        f"consensus per criterion{whose} (default 1)")
    parser.add_argument("--consensus", choices=CONSENSUS_MODES, default=None,
                        help="how repeats combine: majority (a tie fails; the default) or "
                        "unanimous")
    parser.add_argument("--return-best", action="store_const", const=True, default=None,
                        help="at the iteration cap, end with the best attempt's answer "
                        f"instead of the last one{whose}")


def _judging(args: argparse.Namespace) -> dict[str, Any]:
    """The judging options given on the command line, by `RunSettings` field name."""
    values = {"grader_repeats": args.grader_repeats, "consensus": args.consensus,
              "return_best": args.return_best}
    return {k: v for k, v in values.items() if v is not None}


def _settings(args: argparse.Namespace) -> RunSettings:
    """The run the arguments describe (a bundled example, then the arguments that override)."""
    from rubric_core.settings import RunSettings

    prompt = rubric = system = None
    tools: tuple[str, ...] = ()
    max_iterations = 3
    if args.example:
        from rubric_core.examples import get_example

        try:
            example = get_example(args.example)
        except KeyError as exc:
            raise UsageError(str(exc.args[0] if exc.args else exc)) from exc
        prompt, rubric, system = example.prompt, example.rubric, example.worker_system_prompt
        tools = tuple(t.name for t in example.grader_tools())
        max_iterations = example.max_iterations
    if args.prompt is not None:
        prompt = _text_arg(args.prompt, "prompt")
    if args.rubric is not None:
        rubric = _text_arg(args.rubric, "rubric")
    if args.system_prompt is not None:
        system = _text_arg(args.system_prompt, "system prompt")
    if not prompt:
        msg = "give --prompt TEXT|@FILE or --example NAME"
        raise UsageError(msg)
    if not rubric:
        msg = "give --rubric TEXT|@FILE or --example NAME"
        raise UsageError(msg)
    if args.max_iterations is not None:
        max_iterations = args.max_iterations
    settings = RunSettings(
        prompt=prompt, rubric=rubric, worker_model=args.model or "demo",
        grader_model=args.grader or "rules", base_url=args.base_url,
        worker_system_prompt=system or "", grader_tools=tools, max_iterations=max_iterations,
        example_name=args.example, **_judging(args),
    )
    try:
        settings.validate()
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return settings.titled()


_RESUME_CHECKED = (
    ("prompt", "--prompt", "prompt"), ("rubric", "--rubric", "rubric"),
    ("system_prompt", "--system-prompt", "worker_system_prompt"),
    ("example", "--example", "example_name"), ("model", "--model", "worker_model"),
    ("grader", "--grader", "grader_model"), ("max_iterations", "--max-iterations",
                                             "max_iterations"),
    ("grader_repeats", "--grader-repeats", "grader_repeats"),
    ("consensus", "--consensus", "consensus"), ("return_best", "--return-best", "return_best"),
)


def _check_resume_arguments(args: argparse.Namespace, stored: RunSettings) -> None:
    """Resume runs the stored settings: an argument that asks for other ones is an error."""
    for name, flag, field in _RESUME_CHECKED:
        value = getattr(args, name)
        if value is None:
            continue
        if name in ("prompt", "rubric", "system_prompt"):
            value = _text_arg(value, flag.removeprefix("--").replace("-", " "))
        have = getattr(stored, field)
        # The store keeps texts scrubbed of secrets: compare them the same way.
        if value != have and not (isinstance(value, str) and redact(value) == have):
            msg = (
                f"thread {args.thread!r} was started with another {flag.removeprefix('--')}: "
                f"--resume continues it with its stored settings, so drop {flag} (or start a "
                "new run without --resume)"
            )
            raise UsageError(
                msg
            )


def _print_event(event: RunEvent, out: TextIO, quiet: bool) -> None:
    from rubric_core.export import criterion_rows

    lines: list[str] = []
    if event["type"] == "worker_message" and not quiet:
        lines.append(f"\n── answer (iteration {event['iteration'] + 1}) ──\n{event['text']}\n")
    elif event["type"] == "evaluation_started":
        lines.append(f"\ngrading iteration {event['iteration'] + 1} …\n")
    elif event["type"] == "evaluation_finished":
        ev = event["evaluation"]
        flag = " (unverified)" if ev.get("unverified") else ""
        lines.append(f"verdict: {ev['result']}{flag} — {ev['explanation']}\n")
        for row in criterion_rows(ev):
            if row["index"] is None:
                continue
            mark = "PASS" if row["passed"] else "FAIL"
            gap = "" if row["passed"] else f" — {row['gap'] or ''}"
            lines.append(f"  [{mark}] {row['criterion']}{gap}\n")
    if lines:
        out.write(redact("".join(lines)))
    out.flush()


def _consume(events: Iterator[RunEvent], out: TextIO, quiet: bool) -> dict[str, Any]:
    """Print events as they come; the ``run_finished`` event (empty if there was none)."""
    final: dict[str, Any] = {}
    for event in events:
        _print_event(event, out, quiet)
        if event["type"] == "run_finished":
            final = dict(event)
    return final


def _run(args: argparse.Namespace, out: TextIO) -> int:
    from rubric_core import session

    if args.resume and not (args.db and args.thread):
        msg = "--resume needs --db PATH and --thread ID"
        raise UsageError(msg)
    settings = None if args.resume else _settings(args)
    if args.csv:
        _check_output(args.csv)
    run_id: str | None = None
    if args.db:
        from rubric_core.store import Store

        store = Store(args.db)
        try:
            if args.resume:
                record = store.latest_run_for_thread(args.thread)
                if record is None:
                    msg = (
                        f"no run on thread {args.thread!r} in {shown_location(args.db)}: check "
                        "--thread and --db, or start a new run without --resume"
                    )
                    raise UsageError(
                        msg
                    )
                _check_resume_arguments(args, record.settings)
                try:
                    run = session.resume(store, record.run_id, base_url=args.base_url)
                except (KeyError, RuntimeError) as exc:
                    raise UsageError(str(exc.args[0] if exc.args else exc)) from exc
            else:
                assert settings is not None
                run = session.start(store, settings, thread_id=args.thread or uuid.uuid4().hex)
            settings, run_id = run.settings, run.run_id
            final = _consume(iter(run), out, args.quiet)
        finally:
            store.close()
    else:
        from rubric_core.runner import run_rubric

        assert settings is not None
        final = _consume(run_rubric(session.build_spec(settings)), out, args.quiet)
    status = final.get("status", "error")
    from rubric_core.attempts import final_answers  # the final answer, labelled as the app does

    for shown in final_answers(final.get("evaluations", [])):
        body = "" if args.quiet else f"{shown.text}\n"
        out.write(redact(f"\n── {shown.label} · {shown.passed}/{shown.total} criteria pass ──\n"
                         f"{body}"))
    out.write(f"\nstatus: {status} after {len(final.get('evaluations', []))} grading pass(es)"
              f" in {final.get('duration_s', 0):.2f}s (thread {final.get('thread_id')})\n")
    if final.get("error"):
        out.write(f"error: {redact(final['error'])}\n")
    if run_id is not None:
        out.write(f"recorded as run {run_id[:8]} in {shown_location(args.db)} (the app's Review "
                  f"page lists it when {DB_ENV_VAR} points at that database)\n")
    if status in NEXT_STEPS:
        out.write(f"next: {NEXT_STEPS[status]}\n")
    if args.csv:
        from rubric_core.export import export_rows, write_csv

        # Keys are RunRecord field names, which export_rows maps to its run_* columns.
        run_info = {"run_id": run_id or final.get("thread_id"), "title": settings.title,
                    "worker_model": settings.worker_model,
                    "grader_model": settings.grader_model, "status": status}
        with open(args.csv, "w", encoding="utf-8", newline="") as handle:
            count = write_csv(export_rows([(run_info, final.get("evaluations", []))]), handle)
        out.write(f"wrote {count} rows to {args.csv}\n")
    return 0 if status == "satisfied" else 1


def _analytics(args: argparse.Namespace, out: TextIO) -> int:
    from rubric_core.analytics import scoped_analytics
    from rubric_core.export import to_csv
    from rubric_core.store import Store

    if args.csv:
        _check_output(args.csv)
    args.db = args.db or default_db_path()
    if not is_db_url(args.db) and not Path(args.db).is_file():
        # a path: a URL holds no password to show
        msg = f"no database at {args.db}: pass --db PATH_OR_URL or set {DB_ENV_VAR}"
        raise UsageError(msg)
    scope, key = "all", ""
    if args.run is not None:
        scope, key = "run", args.run
    elif args.experiment is not None:
        scope, key = "experiment", args.experiment
    elif args.rubric is not None:
        scope, key = "rubric", _text_arg(args.rubric, "--rubric")
    store = Store(args.db)
    try:
        scoped = scoped_analytics(store, scope, key)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    finally:
        store.close()
    frame = scoped.table
    if frame.empty:
        out.write(f"no graded runs in {shown_location(args.db)}"
                  + ("" if scope == "all" else f" for this {scope}") + "\n")
        return 0
    out.write(f"{len(scoped.runs)} run(s), {scoped.passes} grading pass(es)\n")
    # Empty cells (never fixed, no gaps, no repeats) print as "-", not NaN or None.
    out.write(redact(frame.astype(object).fillna("-").to_string(index=False)) + "\n")
    if args.csv:
        with open(args.csv, "w", encoding="utf-8", newline="") as handle:
            handle.write(to_csv(frame))
        out.write(f"wrote {len(frame)} rows to {args.csv}\n")
    return 0


# -- experiments: eval and datasets --------------------------------------------------------------

_CONFIG_KEYS = {
    "worker": "worker_model", "grader": "grader_model", "rubric": "rubric",
    "system": "worker_system_prompt", "tools": "grader_tools", "cap": "max_iterations",
    "max_iterations": "max_iterations", "label": "label", "base_url": "base_url",
    "grader_repeats": "grader_repeats", "consensus": "consensus", "return_best": "return_best",
}


def _add_eval_parsers(sub: Any) -> None:
    ev = sub.add_parser(
        "eval", help="run a dataset through one or more configurations (an experiment)",
        description="Every dataset row runs the rubric loop under every --config (and every "
        "repeat), recorded in --db; prints progress and a summary. Exit 0 when every "
        "configuration's satisfied rate reaches --min-pass-rate, 1 otherwise, 2 for bad input.",
    )
    ev.add_argument("--dataset", help="a CSV or JSONL file, or 'bundled' for the offline demo")
    ev.add_argument("--dataset-name", default=None, help="store it under this name")
    ev.add_argument("--rubric", default=None,
                    help="TEXT or @FILE: the rubric for rows without their own")
    ev.add_argument("--model", action="append", default=[], metavar="M",
                    help="a worker model: one configuration each, graded by --grader with "
                    "--max-iterations; repeat to compare models")
    ev.add_argument("--grader", default=None,
                    help="grader model of the --model configurations (default: rules)")
    ev.add_argument("--max-iterations", type=int, default=None,
                    help="grader passes per cell for the --model configurations (default 3)")
    _add_judging_arguments(ev, " (for the --model configurations)")
    ev.add_argument("--config", action="append", default=[], metavar="KEY=VALUE,...",
                    help="worker=M,grader=G[,rubric=@FILE][,system=@FILE][,tools=a+b][,cap=N]"
                    "[,label=L][,base_url=URL][,grader_repeats=K][,consensus=unanimous]"
                    "[,return_best=yes]: a configuration in full; repeat for more. With "
                    "no --model and no --config: worker=demo,grader=rules")
    ev.add_argument("--repeats", type=int, default=1,
                    help="run every row × configuration this many times (default 1), to see "
                    "how stable the verdicts are")
    ev.add_argument("--concurrency", type=int, default=None,
                    help="cells at once, over all workers (default 4)")
    ev.add_argument("--workers", type=int, default=1,
                    help="processes sharing the experiment's cells (default 1): a process is "
                    "bound to one CPU core by Python's GIL, so more workers use more cores; "
                    "--concurrency and --model-limit are shared out between them")
    ev.add_argument("--model-limit", action="append", default=[], metavar="M=N",
                    help="at most N cells at once use model M (worker or grader); repeatable")
    ev.add_argument("--min-pass-rate", type=float, default=None,
                    help="satisfied share (0-1) each configuration needs for exit 0; without "
                    "it, exit 0 needs every cell ended without an error")
    ev.add_argument("--db", default=None,
                    help="SQLite file or postgresql:// URL (default: the app's database, "
                    "$RUBRIC_STUDIO_DB)")
    ev.add_argument("--resume", default=None, metavar="EXP_ID",
                    help="continue a stopped or killed experiment")
    ev.add_argument("--retry-errors", action="store_true",
                    help="with --resume: run again the cells that ended in an error")
    ev.add_argument("--csv", default=None, help="write every pass × criterion as CSV here")
    ev.add_argument("--summary-csv", default=None, help="write the summary table as CSV here")
    ds = sub.add_parser("datasets", help="list, show or delete stored datasets")
    ds.add_argument("--db", default=None,
                    help="SQLite file or postgresql:// URL (default: the app's database, "
                    "$RUBRIC_STUDIO_DB)")
    ds.add_argument("action", nargs="?", default="list", choices=("list", "show", "delete"))
    ds.add_argument("name", nargs="?", default=None)


_YES = frozenset({"yes", "true", "1", "on"})
_NO = frozenset({"no", "false", "0", "off"})


def _config(text: str) -> Any:
    from rubric_core.settings import ExperimentConfig

    values: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        field = _CONFIG_KEYS.get(key.strip())
        if not sep or field is None:
            msg = (f"--config {text!r}: {part!r} is not KEY=VALUE with KEY one of "
                   f"{', '.join(sorted(_CONFIG_KEYS))}")
            raise UsageError(msg)
        value = value.strip()
        if field in ("rubric", "worker_system_prompt"):
            values[field] = _text_arg(value, key)
        elif field == "grader_tools":
            values[field] = tuple(t for t in value.split("+") if t)
        elif field in ("max_iterations", "grader_repeats"):
            try:
                values[field] = int(value)
            except ValueError:
                msg = f"--config {text!r}: {key.strip()} must be a whole number"
                raise UsageError(msg) from None
        elif field == "return_best":
            flag = value.lower()
            if flag not in _YES | _NO:
                msg = f"--config {text!r}: return_best must be yes or no"
                raise UsageError(msg)
            values[field] = flag in _YES
        else:
            values[field] = value
    return ExperimentConfig(**values)


def _load_dataset(args: argparse.Namespace) -> Any:
    from rubric_core.datasets import parse_dataset

    if args.dataset == "bundled":
        from rubric_core.offline.demo_dataset import demo_dataset

        return demo_dataset()
    path = Path(args.dataset)
    if not path.is_file():
        msg = f"--dataset {args.dataset!r} is not a file (or give 'bundled')"
        raise UsageError(msg)
    name = args.dataset_name or path.stem
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return parse_dataset(path.read_bytes(), name=name, fmt="jsonl")
    return parse_dataset(path.read_bytes(), name=name)


_PROGRESS_EVERY_S = 2.0


class _ProgressPrinter:
    """Prints an experiment's events as they come.

    A configuration's progress line when it starts, ends, gains an error, or at most every
    `_PROGRESS_EVERY_S` seconds (a 1,000-row experiment is not 1,000 lines); every cell that
    did not end satisfied; every backoff.
    """

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.shown: dict[int, tuple[float, int]] = {}  # config -> (when, errors) last printed

    def __call__(self, event: Any) -> None:
        out = self.out
        if event["type"] == "experiment_progress":
            index, now = event["config_index"], time.monotonic()
            last = self.shown.get(index)
            if (last is not None and event["done"] < event["total"]
                    and event["errors"] == last[1] and now - last[0] < _PROGRESS_EVERY_S):
                return
            self.shown[index] = (now, event["errors"])
            rate = event["satisfied_rate"]
            eta = "" if event["eta_s"] is None else f", ETA {event['eta_s']:.0f}s"
            shown = "–" if rate is None else f"{rate:.0%}"
            out.write(f"[{index}] {event['label']}: {event['done']}/{event['total']} done, "
                      f"{shown} satisfied, {event['errors']} error(s){eta}\n")
        elif event["type"] == "cell_finished" and event["status"] not in ("satisfied",):
            out.write(f"    row {event['row_id']} [{event['config_index']}]: {event['status']}"
                      + (f" — {redact(event['error'])}" if event["error"] else "") + "\n")
        elif event["type"] == "experiment_backoff":
            out.write(f"    server answered {event['status_code']}: waiting "
                      f"{event['wait_s']:.2f}s ({event['hits']} so far)\n")
        out.flush()


def _eval(args: argparse.Namespace, out: TextIO) -> int:
    from rubric_core.experiments import (
        DEFAULT_CONCURRENCY,
        MAX_CONCURRENCY,
        MAX_REPEATS,
        SUMMARY_COLUMNS,
        create_experiment,
        experiment_results,
        export_columns,
        export_experiment_rows,
        run_experiment,
        summary_rows,
    )
    from rubric_core.export import write_csv
    from rubric_core.store import Store

    for path in (args.csv, args.summary_csv):
        if path:
            _check_output(path)
    if args.concurrency is not None and not 1 <= args.concurrency <= MAX_CONCURRENCY:
        msg = f"--concurrency must be from 1 to {MAX_CONCURRENCY}, got {args.concurrency}"
        raise UsageError(msg)
    if not 1 <= args.repeats <= MAX_REPEATS:
        msg = f"--repeats must be from 1 to {MAX_REPEATS}, got {args.repeats}"
        raise UsageError(msg)
    if args.max_iterations is not None and args.max_iterations < 1:
        msg = "--max-iterations must be at least 1"
        raise UsageError(msg)
    if args.min_pass_rate is not None and not 0 <= args.min_pass_rate <= 1:
        msg = f"--min-pass-rate must be a share between 0 and 1, got {args.min_pass_rate}"
        raise UsageError(msg)
    per_model = _model_limits(args.model_limit)
    concurrency = args.concurrency or DEFAULT_CONCURRENCY
    if not 1 <= args.workers <= concurrency:
        msg = (f"--workers must be from 1 to --concurrency ({concurrency}), got {args.workers}: "
               "each worker runs at least one cell at a time")
        raise UsageError(msg)
    for model, limit in per_model.items():
        if limit < args.workers:
            msg = (f"--model-limit {model}={limit} is shared out between {args.workers} "
                   "workers: give each at least one (N at least --workers)")
            raise UsageError(msg)
    if args.resume is None and not args.dataset:
        msg = "give --dataset FILE|bundled (or --resume EXP_ID)"
        raise UsageError(msg)
    db = args.db or default_db_path()
    store = Store(db)
    try:
        if args.resume:
            if (args.dataset or args.config or args.model or args.grader
                    or args.max_iterations is not None or _judging(args)):
                msg = ("--resume continues an experiment as it was created: drop --dataset, "
                       "--model, --grader, --max-iterations, --grader-repeats, --consensus, "
                       "--return-best and --config")
                raise UsageError(msg)
            experiment = store.get_experiment(args.resume)
            if experiment is None:
                msg = f"no experiment {args.resume!r} in {shown_location(db)}"
                raise UsageError(msg)
        else:
            dataset = _load_dataset(args)
            rubric = _text_arg(args.rubric, "rubric") if args.rubric else ""
            configs = [*_model_configs(args), *(_config(c) for c in args.config)]
            configs = [c if c.rubric else dataclasses.replace(c, rubric=rubric) for c in configs]
            experiment = create_experiment(store, dataset, configs, repeats=args.repeats)
        exp_id = experiment.experiment_id
        out.write(f"experiment {exp_id} ({experiment.name}): "
                  f"{len(experiment.configurations)} configuration(s), "
                  f"dataset {experiment.dataset_name} v{experiment.dataset_version}; "
                  f"resume with: rubric-studio eval --resume {exp_id} "
                  f"--db {shown_location(db)}\n")
        show = _ProgressPrinter(out)
        shares = _shares(concurrency, args.workers)
        limits = {m: _shares(n, args.workers) for m, n in per_model.items()}
        with _helper_workers(args, exp_id, db, shares[1:],
                             [{m: n[i] for m, n in limits.items()}
                              for i in range(1, args.workers)]) as helpers:
            for event in run_experiment(store, exp_id, retry_errors=args.retry_errors,
                                        concurrency=shares[0],
                                        per_model={m: n[0] for m, n in limits.items()}):
                show(event)
            failed = helpers.wait()
        for message in failed:
            out.write(message + "\n")
        results = experiment_results(store, exp_id)
        summary = results.summary()
        out.write("\n" + redact(summary.to_string(index=False)) + "\n")
        if args.csv:
            with open(args.csv, "w", encoding="utf-8", newline="") as handle:
                count = write_csv(export_experiment_rows(store, exp_id), handle,
                                  export_columns(store, exp_id))
            out.write(f"wrote {count} rows to {args.csv}\n")
        if args.summary_csv:
            with open(args.summary_csv, "w", encoding="utf-8", newline="") as handle:
                write_csv(summary_rows(results), handle, SUMMARY_COLUMNS)
            out.write(f"wrote the summary to {args.summary_csv}\n")
    finally:
        store.close()
    rows = summary.to_dict("records")
    if any(row["done"] < row["cells"] for row in rows):
        out.write("not every cell ended (stopped?): exit 1\n")
        return 1
    if args.min_pass_rate is None:
        errors = sum(int(row["errors"]) for row in rows)
        if errors:
            out.write(f"{errors} cell(s) ended in an error (retry them with --resume "
                      f"{exp_id} --retry-errors): exit 1\n")
        return 1 if errors else 0
    low = [row["configuration"] for row in rows
           if (row["satisfied_pct"] or 0.0) / 100 < args.min_pass_rate]
    if low:
        out.write(f"below --min-pass-rate {args.min_pass_rate:g}: {', '.join(low)}: exit 1\n")
    return 1 if low else 0


def _shares(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` whole numbers as even as can be (the first ones larger)."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


class _Helpers:
    """Helper worker processes of one `eval --workers N` (see `_helper_workers`)."""

    def __init__(self) -> None:
        self.procs: list[tuple[subprocess.Popen[bytes], Any]] = []

    def wait(self) -> list[str]:
        """Wait for every helper to end; a message for each that failed (exit 2 or a crash)."""
        failed = []
        for index, (proc, log) in enumerate(self.procs, start=2):
            code = proc.wait()
            if code not in (0, 1):  # 1: its share of cells fell below --min-pass-rate
                log.seek(0)
                tail = redact(log.read().decode("utf-8", "replace").strip()[-1000:])
                failed.append(f"worker {index} (pid {proc.pid}) exited {code}: {tail}")
        return failed


@contextlib.contextmanager
def _helper_workers(args: argparse.Namespace, exp_id: str, db: str | Path,
                    concurrency: list[int], limits: list[dict[str, int]]) -> Iterator[_Helpers]:
    """Start ``len(concurrency)`` more `eval --resume` processes on the experiment.

    They share its cells through the store's leases, as workers on other machines would. The
    database goes to them in the environment, not on the command line (a URL's password would
    show in ``ps``). If this process stops early (Ctrl-C, an error), they are stopped too:
    their running cells end ``interrupted`` and resume later.
    """
    helpers = _Helpers()
    env = {**os.environ, DB_ENV_VAR: str(db)}
    try:
        for share, limit in zip(concurrency, limits, strict=True):
            cmd = [sys.executable, "-m", "rubric_core", "eval", "--resume", exp_id,
                   "--concurrency", str(share),
                   *(f"--model-limit={m}={n}" for m, n in limit.items()),
                   *(["--retry-errors"] if args.retry_errors else [])]
            log = tempfile.TemporaryFile()  # noqa: SIM115 - closed after the helper ends
            helpers.procs.append((subprocess.Popen(
                cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=log), log))
        yield helpers
    except BaseException:
        for proc, _ in helpers.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # a clean stop: its cells become resumable
        for proc, _ in helpers.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        raise
    finally:
        for _, log in helpers.procs:
            log.close()


def _model_configs(args: argparse.Namespace) -> list[Any]:
    """The configurations --model / --grader / --max-iterations ask for (and the default)."""
    from rubric_core.settings import ExperimentConfig

    shared: dict[str, Any] = {}
    if args.grader:
        shared["grader_model"] = args.grader
    if args.max_iterations is not None:
        shared["max_iterations"] = args.max_iterations
    shared.update(_judging(args))
    if args.model:
        return [ExperimentConfig(worker_model=m, **shared) for m in args.model]
    if args.config and not shared:
        return []
    return [ExperimentConfig(**shared)]  # the offline default: demo worker, rules grader


def _model_limits(values: list[str]) -> dict[str, int]:
    from rubric_core.experiments import MAX_CONCURRENCY

    limits: dict[str, int] = {}
    for value in values:
        model, sep, number = value.rpartition("=")
        try:
            limit = int(number)
        except ValueError:
            limit = 0
        if not sep or not model.strip() or not 1 <= limit <= MAX_CONCURRENCY:
            msg = (f"--model-limit {value!r}: expected MODEL=N with N a whole number from 1 "
                   f"to {MAX_CONCURRENCY}")
            raise UsageError(msg)
        limits[model.strip()] = limit
    return limits


def _datasets(args: argparse.Namespace, out: TextIO) -> int:
    from rubric_core.datasets import preview
    from rubric_core.store import Store

    if args.action != "list" and not args.name:
        msg = f"datasets {args.action} needs a NAME"
        raise UsageError(msg)
    args.db = args.db or default_db_path()
    if not is_db_url(args.db) and not Path(args.db).is_file():  # opening would create it
        if args.action == "list":
            out.write(f"no datasets: no database at {args.db} yet\n")
            return 0
        msg = f"no database at {args.db}: pass --db PATH_OR_URL or set {DB_ENV_VAR}"
        raise UsageError(msg)
    store = Store(args.db)
    try:
        if args.action == "list":
            infos = store.list_datasets()
            for info in infos:
                out.write(f"{info.name:24} v{info.version:<3} {info.row_count:6} rows  "
                          f"{info.created_at[:19]}\n")
            if not infos:
                out.write(f"no datasets in {shown_location(args.db)}\n")
        elif args.action == "show":
            try:
                dataset, version = store.load_dataset(args.name)
            except KeyError as exc:
                raise UsageError(str(exc.args[0])) from exc
            out.write(f"{dataset.name} v{version}: {len(dataset.rows)} rows, columns "
                      f"{', '.join(dataset.columns)}\n")
            for record in preview(dataset, 10):
                out.write(redact(" | ".join(f"{k}={v[:40]!r}" for k, v in record.items()))
                          + "\n")
        else:
            deleted = store.delete_dataset(args.name)
            if not deleted:
                msg = f"no dataset {args.name!r} in {shown_location(args.db)}"
                raise UsageError(msg)
            out.write(f"deleted {deleted} version(s) of {args.name}\n")
    finally:
        store.close()
    return 0


# -- db: copy a database -------------------------------------------------------------------------


def _add_db_parsers(sub: Any) -> None:
    db = sub.add_parser("db", help="manage the database (copy it between SQLite and PostgreSQL)")
    actions = db.add_subparsers(dest="db_command", required=True)
    copy = actions.add_parser(
        "copy", help="copy every run, rubric, dataset, experiment and checkpoint",
        description="Copy a whole Rubric Studio database to another: SQLite file to "
        "postgresql:// URL or back (rubric_core.store.copy_store). The destination must be "
        "empty unless --into-nonempty; the counts copied are checked against it.")
    copy.add_argument("--from", dest="source", required=True, metavar="PATH_OR_URL")
    copy.add_argument("--to", dest="destination", required=True, metavar="PATH_OR_URL")
    copy.add_argument("--into-nonempty", action="store_true",
                      help="add to a destination that holds data (rows already there are kept)")


def _db(args: argparse.Namespace, out: TextIO) -> int:
    from rubric_core.store import copy_store

    counts = copy_store(args.source, args.destination, into_nonempty=args.into_nonempty)
    out.write(f"copied {shown_location(args.source)} to {shown_location(args.destination)}:\n")
    for table, count in counts.items():
        out.write(f"  {table:18} {count:8}\n")
    return 0


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point; returns the exit status."""
    out = out or sys.stdout
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["app"] and not {"-h", "--help"} & set(argv[1:2]):
        # Everything after 'app' belongs to 'streamlit run', so argparse must not see it.
        try:
            return _start_app(argv[1:])
        except UsageError as exc:
            sys.stderr.write(f"error: {exc}\n")
            return 2
    args = _parser().parse_args(argv)
    install_log_redaction()
    install_traceback_redaction()
    try:
        if args.command == "examples":
            from rubric_core.examples import list_examples

            for ex in list_examples():
                out.write(f"{ex.name:16} {ex.title}\n")
            return 0
        if args.command == "app":
            return _start_app([])
        if args.command == "analytics":
            return _analytics(args, out)
        if args.command == "eval":
            return _eval(args, out)
        if args.command == "datasets":
            return _datasets(args, out)
        if args.command == "db":
            return _db(args, out)
        return _run(args, out)
    except (UsageError, ModelConfigError, RubricError, StoreError, ValueError, OSError) as exc:
        sys.stderr.write(f"error: {redact(str(exc))}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


if __name__ == "__main__":  # pragma: no cover
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    raise SystemExit(main())
