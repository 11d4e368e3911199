"""``rubric-studio eval``: run a dataset through one or more configurations (an experiment).

The arguments become a dataset and `ExperimentConfig` s; the library checks them
(`rubric_core.experiments.create_experiment`) and runs the experiment on the queue engine
(`rubric_core.experiments.run_experiment`, with ``--workers N`` supervised worker processes:
`rubric_core.engine.supervisor`). This module prints progress and the summary and turns the
summary into the exit status.
"""

from __future__ import annotations

import dataclasses
import time
from decimal import Decimal
from pathlib import Path
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
from rubric_core.store import StoreError, default_db_path, is_unavailable, is_url, shown_location

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterable, Sequence

    import pandas as pd

    from rubric_core.datasets import Dataset
    from rubric_core.experiments.budget import Budget
    from rubric_core.prices import Prices
    from rubric_core.settings import ExperimentConfig

DESCRIPTION = (
    "Every dataset row runs the rubric loop under every --config (and every repeat), recorded "
    "in --db; prints progress and a summary. Exit 0 when every configuration's satisfied rate "
    "reaches --min-pass-rate, 1 otherwise, 2 for bad input, 130 when interrupted (Ctrl-C, or "
    "the database went away: the message says how to resume)."
)
"""``eval --help``'s description."""

INTERRUPTED = 130
"""The exit status of an experiment cut short, resumable with ``--resume``: after a Ctrl-C
(`rubric_core.cli.main`), and when the database went away with cells not ended."""

PROGRESS_EVERY_S = 2.0
"""Longest a configuration's progress goes unprinted while cells end (see `ProgressPrinter`)."""


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``eval``."""
    add = parser.add_argument
    add("--dataset", help="a CSV or JSONL file, or 'bundled' for the offline demo")
    add("--dataset-name", default=None, help="store it under this name")
    add("--rubric", default=None, help="TEXT or @FILE: the rubric for rows without their own")
    add("--model", action="append", default=[], metavar="M",
        help="a worker model: one configuration each, graded by --grader with "
        "--max-iterations; repeat to compare models")
    add("--grader", default=None,
        help="grader model of the --model configurations (default: rules)")
    add("--max-iterations", type=int, default=None,
        help="grader passes per cell for the --model configurations (default 3)")
    add_judging_arguments(parser, " (for the --model configurations)")
    add_max_tokens_arguments(parser, " (for the --model configurations)")
    add("--config", action="append", default=[], metavar="KEY=VALUE,...",
        help="worker=M,grader=G[,rubric=@FILE][,system=@FILE][,tools=a+b][,cap=N]"
        "[,label=L][,base_url=URL][,grader_repeats=K][,consensus=unanimous]"
        "[,return_best=yes][,max_tokens=N][,grader_max_tokens=N]: a configuration in full; "
        "repeat for more. With no --model and no --config: worker=demo,grader=rules")
    add("--repeats", type=int, default=1,
        help="run every row × configuration this many times (default 1), to see "
        "how stable the verdicts are")
    add("--concurrency", type=int, default=None,
        help="cells at once, over every process running the experiment (default 4)")
    add("--workers", type=int, default=1,
        help="worker processes running the cells (default 1: this one; needs a PostgreSQL "
        "--db above 1): a process is bound to one CPU core by Python's GIL, so more workers "
        "use more cores; the limits hold over all of them, and a worker that dies is "
        "restarted. More join from any machine with 'rubric-studio worker'")
    add("--rate-limit", action="append", default=None, metavar="[MODEL=]N/PERIOD",
        help="at most N cells start per PERIOD (s, min or h; e.g. 60/min), over every "
        "process; MODEL=N/PERIOD: at most N cells using model MODEL (worker or grader) start "
        "per PERIOD. Repeatable, once per model")
    add("--model-limit", action="append", default=[], metavar="M=N",
        help="at most N cells at once use model M (worker or grader), over every process; "
        "repeatable")
    add("--config-limit", action="append", default=[], metavar="K=N",
        help="at most N cells of configuration K at once, over every process; K: its number "
        "(from 0, its config_index in the summary) or its label; repeatable")
    add("--config-rate-limit", action="append", default=[], metavar="K=N/PERIOD",
        help="at most N cells of configuration K start per PERIOD (s, min or h), over every "
        "process; K as for --config-limit; repeatable")
    add("--min-pass-rate", type=float, default=None,
        help="satisfied share (0-1) each configuration needs for exit 0; without "
        "it, exit 0 needs every cell ended without an error")
    add("--db", default=None,
        help="SQLite file or postgresql:// URL (default: the app's database, $RUBRIC_STUDIO_DB)")
    add("--resume", default=None, metavar="EXP_ID",
        help="continue a stopped or killed experiment")
    add("--retry-errors", action="store_true",
        help="with --resume: run again the cells that ended in an error")
    add("--csv", default=None, help="write every pass × criterion as CSV here")
    add("--summary-csv", default=None, help="write the summary table as CSV here")
    add_price_arguments(parser)
    add("--max-cost", default=None, metavar="USD",
        help="a budget in US dollars: no cell starts that would spend past it (what was spent "
        "plus an estimate per cell); the experiment then stops, resumable. Kept with the "
        "experiment: --resume continues under it, or under a new --max-cost")
    add("--allow-unknown-prices", action="store_true",
        help="with --max-cost: run even when a model has no known price (its calls count $0)")


class ProgressPrinter:
    """Prints an experiment's events as they come.

    A configuration's progress line when it starts, ends, gains an error, or at most every
    `PROGRESS_EVERY_S` seconds (a 1,000-row experiment is not 1,000 lines); every cell that
    did not end satisfied; every backoff.

    Args:
        out: Where to print.
    """

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.shown: dict[int, tuple[float, int]] = {}  # config -> (when, errors) last printed
        self.lost: str | None = None
        """What the store said when the database went away (said once, at the end)."""

    def __call__(self, event: Any) -> None:
        """Print one `run_experiment` event (or nothing, for a throttled progress line).

        A cell cut by a lost database prints nothing: the end says it once for all of them.
        """
        out = self.out
        if event["type"] == "cell_finished" and event.get("lost_database"):
            return
        if event["type"] == "experiment_finished" and event.get("lost_database"):
            self.lost = event["lost_database"]
        if event["type"] == "experiment_progress":
            index, now = event["config_index"], time.monotonic()
            last = self.shown.get(index)
            if (last is not None and event["done"] < event["total"]
                    and event["errors"] == last[1] and now - last[0] < PROGRESS_EVERY_S):
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
        elif event["type"] == "experiment_finished" and event.get("budget_reached"):
            from rubric_core.prices import format_dollars

            out.write(f"budget reached: {format_dollars(Decimal(event['spent_usd']))} spent; "
                      "no further cell starts (resume with --resume and a larger --max-cost)\n")
        elif event["type"] == "experiment_backoff":
            out.write(f"    server answered {event['status_code']}: waiting "
                      f"{event['wait_s']:.2f}s ({event['hits']} so far)\n")
        out.flush()


def config_limits(args: argparse.Namespace, configs: Sequence[ExperimentConfig]
                  ) -> tuple[dict[int, int], dict[int, tuple[int, float]]]:
    """``--config-limit`` and ``--config-rate-limit`` by configuration index (from 0).

    Raises:
        UsageError: A value that is not ``K=N`` (``K=N/PERIOD``), a K naming no configuration
            (or several), or two values for one configuration.

    """
    from rubric_core.experiments import MAX_CONCURRENCY

    at_once: dict[int, int] = {}
    rates: dict[int, tuple[int, float]] = {}
    for flag, values in (("--config-limit", args.config_limit),
                         ("--config-rate-limit", args.config_rate_limit)):
        for value in values:
            name, sep, spec = value.rpartition("=")
            if not sep or not name.strip():
                form = "K=N" if flag == "--config-limit" else "K=N/PERIOD"
                msg = f"{flag} {value!r}: expected {form} (K: a configuration's number or label)"
                raise UsageError(msg)
            index = _config_index(name.strip(), configs, flag)
            found: dict[int, Any] = at_once if flag == "--config-limit" else rates
            if index in found:
                msg = f"{flag} {value!r}: a second limit for configuration {index}"
                raise UsageError(msg)
            if flag == "--config-rate-limit":
                found[index] = _rate(spec, value, flag)
                continue
            try:
                found[index] = int(spec)
            except ValueError:
                msg = (f"{flag} {value!r}: expected K=N with N a whole number from 1 to "
                       f"{MAX_CONCURRENCY}")
                raise UsageError(msg) from None
    return at_once, rates


def _config_index(name: str, configs: Sequence[ExperimentConfig], flag: str) -> int:
    """The index of the configuration ``name`` (its number from 1, or its label) names."""
    labels = [c.display_label() for c in configs]
    if name.isdigit():
        if int(name) < len(configs):
            return int(name)
        msg = (f"{flag} {name}=…: no configuration {name} (the experiment has "
               f"{len(configs)}, numbered from 0 as the progress lines and the summary's "
               "config_index show them)")
        raise UsageError(msg)
    matches = [i for i, label in enumerate(labels) if label == name]
    if len(matches) != 1:
        why = "several configurations have" if matches else "no configuration has"
        msg = (f"{flag} {name!r}=…: {why} that label; use its number (0 to "
               f"{len(configs) - 1}) or one of: {', '.join(repr(label) for label in labels)}")
        raise UsageError(msg)
    return matches[0]


def model_limits(values: list[str]) -> dict[str, int]:
    """``--model-limit MODEL=N`` values by model (their range is `check_limits`'s).

    Raises:
        UsageError: A value that is not ``MODEL=N`` with N a whole number.

    """
    from rubric_core.experiments import MAX_CONCURRENCY

    limits: dict[str, int] = {}
    for value in values:
        model, sep, number = value.rpartition("=")
        try:
            limit = int(number)
        except ValueError:
            sep = ""
        if not sep or not model.strip():
            msg = (f"--model-limit {value!r}: expected MODEL=N with N a whole number from 1 "
                   f"to {MAX_CONCURRENCY}")
            raise UsageError(msg)
        limits[model.strip()] = limit
    return limits


MAX_RATE_LIMIT = 1_000_000
"""Most cells ``--rate-limit`` may allow per period."""
MAX_RATE_PERIOD_S = 86_400.0
"""Longest ``--rate-limit`` period: a day."""
_PERIODS = {"s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0, "hour": 3600.0}


def rate_limit(text: str | None) -> tuple[int, float] | None:
    """One ``N/PERIOD`` as ``(cells, seconds)``; None without it.

    Raises:
        UsageError: Not a whole number over one of ``s``, ``min`` or ``h`` (or ``30s``).

    """
    return None if text is None else _rate(text, text)


def _rate(text: str, shown: str, flag: str = "--rate-limit") -> tuple[int, float]:
    """``N/PERIOD`` as ``(cells, seconds)``; ``shown`` is the value named in a refusal."""
    number, _, period = text.strip().partition("/")
    period = period.strip().lower()
    count = period.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = period[len(count):]
    try:
        limit = int(number)
        seconds = (float(count) if count else 1.0) * _PERIODS[unit]
    except (ValueError, KeyError):
        limit, seconds = 0, 0.0
    if limit < 1 or not seconds > 0:
        expected = ("expected N/PERIOD or MODEL=N/PERIOD, e.g. 60/min, 5/s or "
                    "openai:gpt-4.1-mini=100/30s" if flag == "--rate-limit" else
                    "expected K=N/PERIOD, e.g. 2=60/min or baseline=5/s")
        msg = f"{flag} {shown!r}: {expected}"
        raise UsageError(msg)
    if limit > MAX_RATE_LIMIT or seconds > MAX_RATE_PERIOD_S:
        msg = (f"{flag} {shown!r}: at most {MAX_RATE_LIMIT:,} cells over a period of at "
               f"most {MAX_RATE_PERIOD_S / 3600:.0f} h")
        raise UsageError(msg)
    return limit, seconds


def rate_limits(values: list[str] | None
                ) -> tuple[tuple[int, float] | None, dict[str, tuple[int, float]]]:
    """``--rate-limit`` values: the whole experiment's (or None) and each model's.

    Whether each model is one the experiment uses is the library's check
    (`rubric_core.experiments.scheduler.check_rates`).

    Raises:
        UsageError: A value that is not ``N/PERIOD`` or ``MODEL=N/PERIOD``, or two for the
            whole experiment or for one model.

    """
    whole: tuple[int, float] | None = None
    models: dict[str, tuple[int, float]] = {}
    for value in values or []:
        model, sep, spec = value.rpartition("=")
        model = model.strip()
        if sep and not model:
            msg = f"--rate-limit {value!r}: a model before '=' (MODEL=N/PERIOD)"
            raise UsageError(msg)
        parsed = _rate(spec if sep else value, value)
        if (model in models) if sep else (whole is not None):
            msg = f"--rate-limit {value!r}: a second rate limit for {model or 'the experiment'}"
            raise UsageError(msg)
        if sep:
            models[model] = parsed
        else:
            whole = parsed
    return whole, models


def configurations(args: argparse.Namespace) -> list[ExperimentConfig]:
    """The configurations --model / --grader / --max-iterations / --config ask for.

    Without any of them: the offline default (demo worker, rules grader). A configuration
    without a rubric takes ``--rubric``.

    Raises:
        UsageError: A ``--config`` that cannot be read, or a rubric file that cannot.

    """
    from rubric_core.settings import ConfigSyntaxError, ExperimentConfig

    shared: dict[str, Any] = {}
    if args.grader:
        shared["grader_model"] = args.grader
    if args.max_iterations is not None:
        shared["max_iterations"] = args.max_iterations
    shared.update(judging(args))
    for field, limit in zip(("worker_max_tokens", "grader_max_tokens"), max_tokens(args),
                            strict=True):
        if limit is not None:
            shared[field] = limit
    if args.model:
        configs = [ExperimentConfig(worker_model=m, **shared) for m in args.model]
    elif args.config and not shared:
        configs = []
    else:
        configs = [ExperimentConfig(**shared)]
    for text in args.config:
        try:
            configs.append(ExperimentConfig.from_assignments(text, read_text=text_arg))
        except ConfigSyntaxError as exc:
            msg = f"--config {exc}"
            raise UsageError(msg) from exc
    rubric = text_arg(args.rubric, "rubric") if args.rubric else ""
    return [c if c.rubric else dataclasses.replace(c, rubric=rubric) for c in configs]


def load_dataset(args: argparse.Namespace) -> Dataset:
    """``--dataset``: a CSV or JSONL file, or ``bundled``.

    Raises:
        UsageError: Not a file.
        ValueError: A file that is not a dataset (the message names the row and column).

    """
    from rubric_core.datasets import read_dataset_file

    if args.dataset == "bundled":
        from rubric_core.offline.demo_dataset import demo_dataset

        return demo_dataset()
    path = Path(args.dataset)
    if not path.is_file():
        msg = f"--dataset {args.dataset!r} is not a file (or give 'bundled')"
        raise UsageError(msg)
    # Refused by its size before it is read: never more than the limit is held in memory.
    return read_dataset_file(path, name=args.dataset_name or None)


def _check_arguments(args: argparse.Namespace) -> None:
    """What only the command line knows: flag combinations and the exit-status threshold."""
    if args.min_pass_rate is not None and not 0 <= args.min_pass_rate <= 1:
        msg = f"--min-pass-rate must be a share between 0 and 1, got {args.min_pass_rate}"
        raise UsageError(msg)
    from rubric_core.types import DEFAULT_CONCURRENCY

    concurrency = DEFAULT_CONCURRENCY if args.concurrency is None else args.concurrency
    if not 1 <= args.workers <= max(concurrency, 1):
        msg = (f"--workers must be from 1 to the concurrency ({concurrency}), got "
               f"{args.workers}: a worker beyond it would never run a cell")
        raise UsageError(msg)
    if args.workers > 1 and not is_url(args.db or default_db_path()):
        msg = ("--workers N needs a PostgreSQL --db (postgresql://…): on SQLite the queue "
               "engine does not hold --concurrency over several processes, so one process "
               "runs the cells there")
        raise UsageError(msg)
    if args.resume is None and not args.dataset:
        msg = "give --dataset FILE|bundled (or --resume EXP_ID)"
        raise UsageError(msg)
    if args.resume is not None and (
            args.dataset or args.config or args.model or args.grader
            or args.max_iterations is not None or judging(args) or any(max_tokens(args))):
        msg = ("--resume continues an experiment as it was created: drop --dataset, "
               "--model, --grader, --max-iterations, --grader-repeats, --consensus, "
               "--return-best, --max-tokens, --grader-max-tokens and --config")
        raise UsageError(msg)


def resume_command(exp_id: str, db: str | Path) -> str:
    """The command that continues an experiment (its password masked)."""
    return f"rubric-studio eval --resume {exp_id} --db {shown_location(db)}"


def cut_short(left: int | None, total: int | None, exp_id: str, db: str | Path,
              out: TextIO) -> int:
    """Say that the database went away with ``left`` cells not ended; `INTERRUPTED`.

    ``left`` and ``total`` are None when the database is still away (nothing could be read).
    """
    from rubric_core.engine.outage import experiment_cut_short

    out.write(experiment_cut_short(left, total, "Once the database is back, continue them "
                                   f"with:\n  {resume_command(exp_id, db)}") + "\n")
    out.write(f"interrupted: exit {INTERRUPTED}\n")
    return INTERRUPTED


def _exit_status(rows: list[dict[Any, Any]], args: argparse.Namespace, exp_id: str,
                 out: TextIO, lost: str | None = None) -> int:
    """0, 1 or `INTERRUPTED` from the summary rows (and say why, last)."""
    left = sum(int(row["cells"]) - int(row["done"]) for row in rows)
    if lost is not None and left:
        return cut_short(left, sum(int(row["cells"]) for row in rows), exp_id,
                         args.db or default_db_path(), out)
    if lost is not None:
        out.write("the database went away for a moment during the experiment; every cell "
                  "ended all the same\n")
    if left:
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


def _budget(args: argparse.Namespace, prices: Prices) -> Budget | None:
    """``--max-cost`` (with the ``--price`` overrides), or None.

    Raises:
        UsageError: A bad amount, or --allow-unknown-prices without --max-cost.

    """
    from rubric_core.experiments.budget import Budget, BudgetError

    if args.max_cost is None:
        if args.allow_unknown_prices:
            msg = "--allow-unknown-prices goes with --max-cost USD"
            raise UsageError(msg)
        return None
    try:
        return Budget.parse(args.max_cost, prices.overrides.values(),
                            allow_unknown=args.allow_unknown_prices)
    except BudgetError as exc:
        raise UsageError(str(exc)) from exc


def _check(configs: Iterable[ExperimentConfig], budget: Budget) -> None:
    """`check_budget`, as a usage error (exit 2) naming the models without a price."""
    from rubric_core.experiments.budget import BudgetError, check_budget

    try:
        check_budget(configs, budget)
    except BudgetError as exc:
        raise UsageError(str(exc)) from exc


def _shown(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary as printed: dollars as text ("unknown" where a price is unknown)."""
    from rubric_core.prices import format_dollars

    shown = summary.copy()
    for column in ("cost_usd", "cost_per_100_rows_usd"):
        shown[column] = [format_dollars(v) for v in summary[column]]
    return shown


def run_eval(args: argparse.Namespace, out: TextIO) -> int:
    """``eval``: create (or resume) the experiment, run it, print and write its summary.

    Returns:
        0 when every configuration reaches ``--min-pass-rate`` (without it: when no cell
        ended in an error), `INTERRUPTED` when the database went away with cells not ended,
        1 otherwise.

    Raises:
        UsageError: Bad arguments, or no such experiment to resume.
        ValueError: A bound the library refuses (concurrency, repeats, iterations...).

    """
    from rubric_core.costs import experiment_cost
    from rubric_core.engine.supervisor import supervised
    from rubric_core.experiments import (
        DEFAULT_CONCURRENCY,
        SUMMARY_COLUMNS,
        create_experiment,
        experiment_results,
        export_columns,
        export_experiment_rows,
        run_experiment,
        summary_rows,
    )
    from rubric_core.experiments.budget import Budget, estimate_experiment
    from rubric_core.experiments.limits import ExperimentLimits
    from rubric_core.export import write_csv
    from rubric_core.prices import format_dollars
    from rubric_core.store import Store

    for path in (args.csv, args.summary_csv):
        if path:
            check_output(path)
    _check_arguments(args)
    whole_rate, model_rates = rate_limits(args.rate_limit)  # refused before anything is stored
    printer = ProgressPrinter(out)
    prices = prices_from(args)
    budget = _budget(args, prices)
    concurrency = DEFAULT_CONCURRENCY if args.concurrency is None else args.concurrency
    # Parsed and checked once; the configurations' own limits join it below.
    limits = ExperimentLimits(concurrency=concurrency, rate=whole_rate,
                              per_model=model_limits(args.model_limit), model_rates=model_rates)
    db = args.db or default_db_path()
    store = Store(db)
    try:
        if args.resume:
            experiment = store.get_experiment(args.resume)
            if experiment is None:
                msg = f"no experiment {args.resume!r} in {shown_location(db)}"
                raise UsageError(msg)
        else:
            configs = configurations(args)
            # a model rate limit none uses, a bad configuration limit: refused before anything
            # is stored
            per_config, config_rates = config_limits(args, configs)
            dataclasses.replace(limits, per_config=per_config,
                                config_rates=config_rates).check(configs)
            if budget is not None:  # refused before anything is stored
                _check(configs, budget)
            experiment = create_experiment(store, load_dataset(args), configs,
                                           repeats=args.repeats)
        exp_id = experiment.experiment_id
        per_config, config_rates = config_limits(args, experiment.configurations)
        limits = dataclasses.replace(limits, per_config=per_config, config_rates=config_rates)
        if budget is None and experiment.budget is not None and args.price:
            # A kept budget is checked with the prices given now as well.
            budget = Budget.from_dict(experiment.budget).with_overrides(prices.overrides.values())
        if budget is not None:
            _check(experiment.configurations, budget)
            store.set_experiment_budget(exp_id, budget.to_dict())  # every worker reads it
        estimate = estimate_experiment(store, experiment, budget.prices if budget else prices,
                                       retry_errors=args.retry_errors)
        shown_budget = (f", budget {format_dollars(budget.max_usd)}" if budget else "")
        out.write(f"estimate: {estimate.text()}{shown_budget}\n")
        out.write(f"experiment {exp_id} ({experiment.name}): "
                  f"{len(experiment.configurations)} configuration(s), "
                  f"dataset {experiment.dataset_name} v{experiment.dataset_version}; "
                  f"resume with: {resume_command(exp_id, db)}\n")
        def say(line: str) -> None:
            out.write(line + "\n")
            out.flush()

        # --workers N > 1: N supervised worker processes run the cells, under the queue's one
        # --concurrency and --model-limit (limits over every process, never shared out), and
        # this one only queues and watches them (rubric_core.engine.supervisor); --workers 1:
        # this process runs them.
        helpers = args.workers if args.workers > 1 else 0
        with supervised(db, exp_id, helpers, on_message=say) as workers:
            for event in run_experiment(store, exp_id, limits=limits,
                                        retry_errors=args.retry_errors, run_here=not helpers):
                printer(event)
        failed = workers.failures
        for message in failed:
            out.write(message + "\n")
        try:
            results = experiment_results(store, exp_id)
        except StoreError as exc:  # still away: no summary to print, only how to go on
            if not is_unavailable(exc):
                raise
            return cut_short(None, None, exp_id, db, out)
        costs = experiment_cost(store, prices, results.experiment)
        summary = results.summary(costs)
        out.write("\n" + redact(_shown(summary).to_string(index=False)) + "\n")
        out.write(f"cost: {format_dollars(costs.total)} (priced from the recorded tokens; "
                  "--price overrides win)\n")
        if args.csv:
            with open(args.csv, "w", encoding="utf-8", newline="") as handle:
                count = write_csv(export_experiment_rows(store, exp_id, prices=prices), handle,
                                  export_columns(store, exp_id))
            out.write(f"wrote {count} rows to {args.csv}\n")
        if args.summary_csv:
            with open(args.summary_csv, "w", encoding="utf-8", newline="") as handle:
                write_csv(summary_rows(results, costs), handle, SUMMARY_COLUMNS)
            out.write(f"wrote the summary to {args.summary_csv}\n")
    finally:
        store.close()
    return _exit_status(summary.to_dict("records"), args, exp_id, out, printer.lost)
