"""``rubric-studio run`` (a new run, or ``--resume`` of a stored one) and ``examples``.

The arguments become a `RunSettings`; `rubric_core.session` runs it and records it in the
app's database (``--db``, else ``RUBRIC_STUDIO_DB``, else the default file: where ``eval``
records too, so the app's Review page lists what the CLI ran), or `rubric_core.runner` runs
it unrecorded with ``--no-db``; each grader pass is printed as it happens.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, TextIO

from rubric_core.cli._common import (
    UsageError,
    add_judging_arguments,
    add_max_tokens_arguments,
    add_price_arguments,
    check_output,
    judging,
    max_tokens,
    prices_from,
    text_arg,
)
from rubric_core.redact import redact
from rubric_core.store import DB_ENV_VAR, default_db_path, shown_location

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator

    from rubric_core.costs import RunCost
    from rubric_core.prices import Prices
    from rubric_core.runner import RunEvent
    from rubric_core.settings import RunSettings

NEXT_STEPS = {
    "max_iterations_reached": "raise --max-iterations, or make the criteria easier to meet",
    "failed": "the grader could not judge this rubric: rewrite the criteria, or use an LLM "
    "grader (e.g. --grader hybrid:openai:gpt-4.1-mini)",
    "grader_error": "the grader itself failed: check its model name, key and server",
    "interrupted": "run again with --resume --thread THREAD (and the same --db) to continue",
    "error": "the worker failed: check its model name, key and server",
}
"""What to do after a run that ended in one of these statuses."""

_RESUME_CHECKED = (
    ("prompt", "--prompt", "prompt"), ("rubric", "--rubric", "rubric"),
    ("system_prompt", "--system-prompt", "worker_system_prompt"),
    ("example", "--example", "example_name"),
    ("max_iterations", "--max-iterations", "max_iterations"),
    ("grader_repeats", "--grader-repeats", "grader_repeats"),
    ("consensus", "--consensus", "consensus"), ("return_best", "--return-best", "return_best"),
)
"""(argument, flag, `RunSettings` field) that ``--resume`` compares with the stored run.

``--base-url``, ``--model`` and ``--grader`` are not compared: they move the resumed run to
another server or models, and the change is recorded in its settings
(`rubric_core.session.resumed_settings`)."""


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``run``."""
    parser.add_argument("--prompt", help="TEXT or @FILE")
    parser.add_argument("--rubric", help="TEXT or @FILE: one criterion per line")
    parser.add_argument("--example", help="a bundled example (see `examples`)")
    parser.add_argument("--model", default=None,
                        help="worker model (default: demo; with --resume: continue with it)")
    parser.add_argument("--grader", default=None,
                        help="grader model (default: rules; with --resume: continue with it)")
    parser.add_argument("--system-prompt", default=None,
                        help="worker system prompt, TEXT or @FILE")
    parser.add_argument("--max-iterations", type=int, default=None)
    add_judging_arguments(parser, "")
    add_max_tokens_arguments(parser, " (with --resume: continue with it, recorded in the run's "
                             "settings)")
    parser.add_argument("--force-grader-tools", action="store_true",
                        help="the grader calls each of its tools once, each call forced, "
                        "before its verdict (for small models that never choose a tool)")
    parser.add_argument("--base-url", default=None,
                        help="OpenAI-compatible server URL (with --resume: continue the run on "
                        "this server, recorded in its settings)")
    parser.add_argument("--csv", default=None, help="write the evaluations as CSV to this path")
    parser.add_argument("--db", default=None,
                        help=f"SQLite file or postgresql:// URL to record the run in (default: "
                        f"${DB_ENV_VAR}, else the app's database)")
    parser.add_argument("--no-db", action="store_true",
                        help="record nothing: run in memory only (cannot be resumed)")
    parser.add_argument("--thread", default=None, help="thread id (to resume it later)")
    parser.add_argument("--resume", action="store_true", help="continue an interrupted thread")
    parser.add_argument("--quiet", action="store_true",
                        help="do not print the worker's answers")
    add_price_arguments(parser)


def list_examples(args: argparse.Namespace, out: TextIO) -> int:  # noqa: ARG001 - one signature
    """``examples``: the bundled examples, one per line."""
    from rubric_core.examples import list_examples as bundled

    for ex in bundled():
        out.write(f"{ex.name:16} {ex.title}\n")
    return 0


def settings_from(args: argparse.Namespace) -> RunSettings:
    """The run the arguments describe (a bundled example, then the arguments that override).

    Raises:
        UsageError: No prompt or rubric, an unknown example, or settings that cannot run.

    """
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
        prompt = text_arg(args.prompt, "prompt")
    if args.rubric is not None:
        rubric = text_arg(args.rubric, "rubric")
    if args.system_prompt is not None:
        system = text_arg(args.system_prompt, "system prompt")
    if not prompt:
        msg = "give --prompt TEXT|@FILE or --example NAME"
        raise UsageError(msg)
    if not rubric:
        msg = "give --rubric TEXT|@FILE or --example NAME"
        raise UsageError(msg)
    if args.max_iterations is not None:
        max_iterations = args.max_iterations
    worker_max_tokens, grader_max_tokens = max_tokens(args)
    settings = RunSettings(
        prompt=prompt, rubric=rubric, worker_model=args.model or "demo",
        grader_model=args.grader or "rules", base_url=args.base_url,
        worker_system_prompt=system or "", grader_tools=tools, max_iterations=max_iterations,
        example_name=args.example, force_grader_tools=args.force_grader_tools,
        worker_max_tokens=worker_max_tokens, grader_max_tokens=grader_max_tokens,
        **judging(args),
    )
    try:
        settings.validate()
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return settings.titled()


def _check_resume_arguments(args: argparse.Namespace, stored: RunSettings) -> None:
    """Resume runs the stored settings: an argument that asks for other ones is an error."""
    for name, flag, field in _RESUME_CHECKED:
        value = getattr(args, name)
        if value is None:
            continue
        if name in ("prompt", "rubric", "system_prompt"):
            value = text_arg(value, flag.removeprefix("--").replace("-", " "))
        have = getattr(stored, field)
        # The store keeps texts scrubbed of secrets: compare them the same way.
        if value != have and not (isinstance(value, str) and redact(value) == have):
            msg = (
                f"thread {args.thread!r} was started with another {flag.removeprefix('--')}: "
                f"--resume continues it with its stored settings, so drop {flag} (or start a "
                "new run without --resume)"
            )
            raise UsageError(msg)


def _print_event(event: RunEvent, out: TextIO, quiet: bool) -> None:
    from rubric_core.export import criterion_rows

    lines: list[str] = []
    if event["type"] == "worker_message" and not quiet:
        lines.append(f"\n── answer (pass {event['iteration'] + 1}) ──\n{event['text']}\n")
    elif event["type"] == "evaluation_started":
        lines.append(f"\ngrading pass {event['iteration'] + 1} …\n")
    elif event["type"] == "evaluation_finished":
        ev = event["evaluation"]
        flag = " (unverified)" if ev.get("unverified") else ""
        if ev.get("answer_cut"):
            lines.append("  (the answer was cut off at the worker's output token limit, "
                         "finish_reason: length: graded as it stands; raise --max-tokens for "
                         "longer answers)\n")
        lines.append(f"verdict: {ev['result']}{flag} — {ev['explanation']}\n")
        for row in criterion_rows(ev):
            if row["index"] is None:
                continue
            mark = "PASS" if row["passed"] else "FAIL"
            gap = "" if row["passed"] else f" — {row['gap'] or ''}"
            lines.append(f"  [{mark}] {row['criterion']}{gap}\n")
        if ev.get("input_tokens") is not None:
            lines.append(f"  grader tokens: {ev['input_tokens']} in "
                         f"({ev.get('cached_input_tokens') or 0} cached), "
                         f"{ev.get('output_tokens') or 0} out\n")
    if lines:
        out.write(redact("".join(lines)))
    out.flush()


def _consume(events: Iterator[RunEvent], out: TextIO, quiet: bool) -> dict[str, Any]:
    """Print events as they come; the ``run_finished`` event (empty if there was none)."""
    final: dict[str, Any] = {}
    calls: list[Any] = []
    for event in events:
        _print_event(event, out, quiet)
        if event["type"] in ("evaluation_finished", "run_finished"):
            calls += event.get("calls") or []
        if event["type"] == "run_finished":
            final = dict(event)
    final["calls"] = calls
    return final


def _run_recorded(args: argparse.Namespace, settings: RunSettings | None, out: TextIO
                  ) -> tuple[RunSettings, str, dict[str, Any]]:
    """Start (or resume) the run in ``--db``: its settings, run id and ``run_finished``."""
    from rubric_core import session
    from rubric_core.store import Store

    store = Store(args.db)
    try:
        if args.resume:
            record = store.latest_run_for_thread(args.thread)
            if record is None:
                msg = (f"no run on thread {args.thread!r} in {shown_location(args.db)}: check "
                       "--thread and --db, or start a new run without --resume")
                raise UsageError(msg)
            _check_resume_arguments(args, record.settings)
            try:
                worker_limit, grader_limit = max_tokens(args)
                run = session.resume(store, record.run_id, base_url=args.base_url,
                                     worker_model=args.model, grader_model=args.grader,
                                     worker_max_tokens=worker_limit,
                                     grader_max_tokens=grader_limit)
            except (KeyError, RuntimeError, ValueError) as exc:
                raise UsageError(str(exc.args[0] if exc.args else exc)) from exc
        else:
            assert settings is not None
            run = session.start(store, settings, thread_id=args.thread or uuid.uuid4().hex)
        return run.settings, run.run_id, _consume(iter(run), out, args.quiet)
    finally:
        store.close()


def _cost(args: argparse.Namespace, prices: Prices, settings: RunSettings, run_id: str | None,
          final: dict[str, Any]) -> RunCost:
    """The run's cost from its recorded calls (with ``--no-db``: its events' calls)."""
    from rubric_core.costs import run_cost, usage_of

    iterations = len(final.get("evaluations", []))
    if run_id is not None:
        from rubric_core.store import Store

        with Store(args.db) as store:
            calls = store.call_usage_for_runs([run_id])[run_id]
    else:
        calls = usage_of("", final.get("calls") or [])
    return run_cost(prices, settings, calls, iterations=iterations)


def cost_lines(cost: RunCost) -> str:
    """``cost: $X (worker $W, grader $G)`` and one line of per-pass costs."""
    from rubric_core.prices import format_dollars as usd

    text = (f"cost: {usd(cost.total)} (worker {usd(cost.worker)}, grader {usd(cost.grader)}; "
            "priced from the recorded tokens; --price overrides win)\n")
    if cost.passes:
        text += "  per pass: " + ", ".join(
            f"{p.iteration + 1} {usd(p.total)}" for p in cost.passes) + "\n"
    return text


def run(args: argparse.Namespace, out: TextIO) -> int:
    """``run``: 0 when the rubric is satisfied, 1 when the run ends otherwise.

    Raises:
        UsageError: Bad arguments, or nothing to resume.

    """
    from rubric_core import session

    if args.no_db and (args.db or args.resume):
        msg = "--no-db records nothing: drop --db and --resume, or drop --no-db"
        raise UsageError(msg)
    if args.resume and not args.thread:
        msg = "--resume needs --thread ID (the run's thread, printed when it ran)"
        raise UsageError(msg)
    settings = None if args.resume else settings_from(args)
    prices = prices_from(args)
    if args.csv:
        check_output(args.csv)
    run_id: str | None = None
    if not args.no_db:
        args.db = args.db or default_db_path()
        settings, run_id, final = _run_recorded(args, settings, out)
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
    cost = _cost(args, prices, settings, run_id, final)
    out.write(cost_lines(cost))
    if run_id is not None:
        out.write(f"recorded as run {run_id[:8]} in {shown_location(args.db)} (the app's Review "
                  f"page lists it when it uses that database: the default, or {DB_ENV_VAR})\n")
    if status in NEXT_STEPS:
        out.write(f"next: {NEXT_STEPS[status]}\n")
    if args.csv:
        from rubric_core.export import export_rows, write_csv

        # Keys are RunRecord field names, which export_rows maps to its run_* columns.
        run_info = {"run_id": run_id or final.get("thread_id"), "title": settings.title,
                    "worker_model": settings.worker_model,
                    "grader_model": settings.grader_model, "status": status}
        with open(args.csv, "w", encoding="utf-8", newline="") as handle:
            count = write_csv(export_rows([(run_info, final.get("evaluations", []))],
                                          costs=lambda _run: cost), handle)
        out.write(f"wrote {count} rows to {args.csv}\n")
    return 0 if status == "satisfied" else 1
