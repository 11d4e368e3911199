"""Command line: ``rubric-studio run|eval|regrade|answers|datasets|db|examples|analytics|app``.

Also ``pairwise`` (two answers judged in both orders), and the queue engine's ``worker``,
``recover`` and ``queue``.

``python -m rubric_core`` is the same command.

Prints each grader pass as it happens; exits 0 when the rubric is satisfied, 1 when the run
ends otherwise, 2 for bad arguments or configuration (with a message, not a traceback), 130
when interrupted.

This module assembles the parser: each sub-command's arguments and handler (``func``) come
from the module of its command group (`rubric_core.cli.run`, `.eval`, `.analytics`,
`.pairwise`, `.datasets`, `.db`, `.app`, `.engine`, `.queue`); `main` calls the handler and
turns errors into exit statuses.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from rubric_core.cli import analytics, datasets, db
from rubric_core.cli import app as app_command
from rubric_core.cli import engine as engine_command
from rubric_core.cli import eval as eval_command
from rubric_core.cli import lab as lab_command
from rubric_core.cli import local as local_command
from rubric_core.cli import pairwise as pairwise_command
from rubric_core.cli import queue as queue_command
from rubric_core.cli import run as run_command
from rubric_core.cli._common import MAX_TEXT_FILE_BYTES, UsageError, add_log_arguments
from rubric_core.cli.app import app_root, start_app
from rubric_core.cli.run import NEXT_STEPS
from rubric_core.library_logs import send_library_logs
from rubric_core.models import ModelConfigError
from rubric_core.redact import install_log_redaction, install_traceback_redaction, redact
from rubric_core.rubric import RubricError
from rubric_core.store import StoreError

USAGE_ERRORS = (UsageError, ModelConfigError, RubricError, StoreError, ValueError, OSError)
"""Errors reported as ``error: MESSAGE`` with exit status 2 (anything else is a bug)."""

def build_parser() -> argparse.ArgumentParser:
    """The ``rubric-studio`` parser; each sub-command sets ``func(args, out) -> exit status``."""
    parser = argparse.ArgumentParser(
        prog="rubric-studio", description="Run rubric-driven agent loops."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a prompt until its rubric is satisfied")
    run_command.add_run_arguments(run)
    run.set_defaults(func=run_command.run)  # looked up as the parser is built

    examples = sub.add_parser("examples", help="list the bundled examples")
    examples.set_defaults(func=run_command.list_examples)

    stats = sub.add_parser(
        "analytics", help="per-criterion loop statistics over the runs in a database",
        description=analytics.DESCRIPTION)
    analytics.add_analytics_arguments(stats)
    stats.set_defaults(func=analytics.analytics)

    ev = sub.add_parser(
        "eval", help="run a dataset through one or more configurations (an experiment)",
        description=eval_command.DESCRIPTION)
    eval_command.add_eval_arguments(ev)
    ev.set_defaults(func=eval_command.run_eval)

    rg = sub.add_parser(
        "regrade", help="grade fixed answers under rubric versions; print criterion health",
        description=lab_command.REGRADE_DESCRIPTION)
    lab_command.add_regrade_arguments(rg)
    rg.set_defaults(func=lab_command.regrade)

    ans = sub.add_parser("answers", help="list, import, show, export or delete answer sets")
    lab_command.add_answers_arguments(ans)
    ans.set_defaults(func=lab_command.answers)

    pw = sub.add_parser(
        "pairwise", help="judge two answers per row in both orders; print the flip rate",
        description=pairwise_command.DESCRIPTION)
    pairwise_command.add_pairwise_arguments(pw)
    pw.set_defaults(func=pairwise_command.pairwise)

    ds = sub.add_parser("datasets", help="list, show or delete stored datasets")
    datasets.add_datasets_arguments(ds)
    ds.set_defaults(func=datasets.datasets)

    database = sub.add_parser(
        "db", help="manage the database (copy it between SQLite and PostgreSQL)")
    actions = database.add_subparsers(dest="db_command", required=True)
    copy = actions.add_parser(
        "copy", help="copy every run, rubric, dataset, experiment and checkpoint",
        description=db.COPY_DESCRIPTION)
    db.add_copy_arguments(copy)
    copy.set_defaults(func=db.copy)

    wk = sub.add_parser("worker", help="run queued experiment cells (queue engine)",
                        description=engine_command.WORKER_DESCRIPTION)
    engine_command.add_worker_arguments(wk)
    wk.set_defaults(func=engine_command.worker)

    rc = sub.add_parser("recover", help="re-queue the cells of stopped workers (queue engine)",
                        description=engine_command.RECOVER_DESCRIPTION)
    engine_command.add_db_argument(rc)
    rc.set_defaults(func=engine_command.recover)

    qu = sub.add_parser("queue", help="an experiment's cells in the queue engine",
                        description=queue_command.DESCRIPTION)
    queue_command.add_queue_arguments(qu)
    qu.set_defaults(func=queue_command.queue)

    lm = sub.add_parser("local-model", help="serve a small real model here (llama.cpp), no key",
                        description=local_command.DESCRIPTION)
    local_command.add_local_arguments(lm)
    lm.set_defaults(func=local_command.local_model)

    app = sub.add_parser("app", help="start the Streamlit app (streamlit run serve.py)",
                         description=app_command.DESCRIPTION)
    app.set_defaults(func=app_command.app)
    # Every command that runs (``db copy``, not ``db``): where DBOS's and psycopg's records go.
    for command in (*sub.choices.values(), *actions.choices.values()):
        if command not in (database, app):  # 'app' hands its arguments to streamlit
            add_log_arguments(command)
    return parser


def main(argv: list[str] | None = None, out: TextIO | None = None, *,
         keep_log_routing: bool = False) -> int:
    """Entry point (the ``rubric-studio`` console script); returns the exit status.

    Args:
        argv: The arguments (``sys.argv[1:]`` when None).
        out: Where results go (standard output when None); errors go to standard error.
        keep_log_routing: Keep DBOS's and psycopg's records where ``--verbose`` and
            ``--log-file`` send them after the command, until the process exits (`program`:
            the engine's threads may still log as the interpreter exits); otherwise they go
            back to where they went before it.

    """
    out = out or sys.stdout
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["app"] and not {"-h", "--help"} & set(argv[1:2]):
        # Everything after 'app' belongs to 'streamlit run', so argparse must not see it.
        try:
            return start_app(argv[1:])
        except UsageError as exc:
            sys.stderr.write(f"error: {exc}\n")
            return 2
    args = build_parser().parse_args(argv)
    install_log_redaction()
    install_traceback_redaction()
    restore_logs = None
    try:
        restore_logs = send_library_logs(verbose=args.verbose, log_file=args.log_file)
        status: int = args.func(args, out)
    except USAGE_ERRORS as exc:
        sys.stderr.write(f"error: {redact(str(exc))}\n")
        return 2
    except (KeyboardInterrupt, Exception) as exc:
        if not _raised_during_ctrl_c(exc):
            raise
        sys.stderr.write("interrupted\n")
        return 130
    finally:
        if restore_logs is not None and not keep_log_routing:
            restore_logs()
    return status


def _raised_during_ctrl_c(exc: BaseException) -> bool:
    """Whether `exc` is a Ctrl-C or was raised while one was being handled.

    A KeyboardInterrupt lands between any two bytecodes, also inside a library's own clean-up:
    psycopg_pool 3.3's ``connection()`` raises ``UnboundLocalError`` from its ``finally`` when
    the Ctrl-C arrives before it set its timer, so the Ctrl-C reaches us as that error with
    the KeyboardInterrupt as its context (the Ctrl-C drill saw it once in a fresh clone's run).
    It is still the Ctrl-C: the command stops as for one.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def program() -> None:
    """The ``rubric-studio`` program (``python -m rubric_core`` too): `main`, then exit.

    Exits with `main`'s status, 130 after a Ctrl-C, whatever the interpreter remembers:

    - CPython 3.11 keeps a process-wide "unhandled KeyboardInterrupt" flag that any
      ``exec()`` or ``eval()`` of a string sets when a KeyboardInterrupt leaves it, handled
      later or not, and never clears; ``python -m`` then ends the process by killing it with
      SIGINT (its parent sees -2, not 130). Classes made by ``dataclasses`` and
      ``namedtuple`` get their methods that way, so a Ctrl-C during an import does it: the
      Ctrl-C drill saw ``eval`` print "interrupted" and die of SIGINT about one round in 40,
      always just after its workers started. Every ``exec()`` of a string clears the flag
      first, so one is run here. (Named ``program``: ``rubric_core.cli.run`` is the ``run``
      command's module.)
    - Once a Ctrl-C stopped the command everything it had to undo is undone: a later SIGINT
      (Ctrl-C pressed twice) is ignored as the interpreter exits.
    """
    import signal

    status = main(keep_log_routing=True)
    if status == 130:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    exec("pass")  # clears the flag above (a constant string: nothing to inject)
    raise SystemExit(status)


__all__ = ["MAX_TEXT_FILE_BYTES", "NEXT_STEPS", "USAGE_ERRORS", "UsageError", "app_root",
           "build_parser", "main", "program"]
