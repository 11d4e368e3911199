"""``rubric-studio analytics``: per-criterion loop statistics (`rubric_core.analytics`).

Over one run, an experiment, every run of a rubric, or every run in a database.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

from rubric_core.cli._common import UsageError, check_output, existing_database, text_arg
from rubric_core.redact import redact
from rubric_core.store import shown_location

if TYPE_CHECKING:
    import argparse

DESCRIPTION = (
    "How often each criterion fails on the first pass, how many passes fix it, oscillations, "
    "feedback efficacy, tokens on the revisions it forced and instability under repeats "
    "(rubric_core.analytics), over one run, an experiment, every run of a rubric, or (by "
    "default) every run in --db."
)
"""The command's ``--help`` description."""


def add_analytics_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``analytics``."""
    parser.add_argument("--db", default=None,
                        help="the database to read: SQLite file or postgresql:// URL (default: "
                        "the app's database, $RUBRIC_STUDIO_DB)")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--run", default=None, help="one run: its id or a unique prefix of it")
    scope.add_argument("--experiment", default=None,
                       help="an experiment's cells: its id or a unique prefix of it")
    scope.add_argument("--rubric", default=None,
                       help="every run graded against this rubric, TEXT or @FILE")
    parser.add_argument("--csv", default=None, help="also write the table as CSV to this path")


def analytics(args: argparse.Namespace, out: TextIO) -> int:
    """``analytics``: print the table (and write it as CSV); 0 unless the input is bad.

    Raises:
        UsageError: No such database, or a run or experiment prefix that matches none or many.

    """
    from rubric_core.analytics import scoped_analytics
    from rubric_core.export import to_csv
    from rubric_core.store import Store

    if args.csv:
        check_output(args.csv)
    args.db = existing_database(args.db)
    scope, key = "all", ""
    if args.run is not None:
        scope, key = "run", args.run
    elif args.experiment is not None:
        scope, key = "experiment", args.experiment
    elif args.rubric is not None:
        scope, key = "rubric", text_arg(args.rubric, "--rubric")
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
