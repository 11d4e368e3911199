"""What every command of the CLI shares.

The usage error, ``TEXT``/``@FILE`` arguments, output path checks, the judging options and
the database check.

Only argument handling lives here; what a command does is a library call (`rubric_core.cli`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rubric_core.store import DB_ENV_VAR, default_db_path
from rubric_core.store import is_url as is_db_url

if TYPE_CHECKING:
    import argparse

    from rubric_core.prices import Prices

MAX_TEXT_FILE_BYTES = 1024 * 1024
"""The largest ``@FILE`` (or ``@-`` input) read for a prompt, rubric or system prompt."""


class UsageError(Exception):
    """Bad command-line input, reported without a traceback."""


def text_arg(value: str, what: str) -> str:
    """``TEXT`` or ``@FILE`` (``@-`` reads standard input), at most `MAX_TEXT_FILE_BYTES`.

    Args:
        value: The argument as given.
        what: What it is, for messages (``prompt``, ``rubric``...).

    Returns:
        The text itself, or the file's contents.

    Raises:
        UsageError: The file is a directory, too large, not UTF-8 or cannot be read.

    """
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
            msg = (f"{what} file {path!r} is over {MAX_TEXT_FILE_BYTES // 1024} KB: "
                   "give a smaller file")
            raise UsageError(msg)
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        msg = f"{what} file {path!r} is not UTF-8 text: {exc}"
        raise UsageError(msg) from exc
    except OSError as exc:
        msg = f"cannot read {what} file {path!r}: {exc}"
        raise UsageError(msg) from exc


def check_output(path: str) -> None:
    """Refuse an output path that cannot be written, before any token is spent.

    Raises:
        UsageError: The path is a directory, its directory is missing, or it is not writable.

    """
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


def existing_database(db: str | Path | None) -> str | Path:
    """``--db`` (or the app's database) when it exists: opening a missing file would create it.

    Raises:
        UsageError: A path with no file behind it (a URL is taken as it is).

    """
    db = db or default_db_path()
    if not is_db_url(db) and not Path(db).is_file():  # a path: a URL holds no password to show
        msg = f"no database at {db}: pass --db PATH_OR_URL or set {DB_ENV_VAR}"
        raise UsageError(msg)
    return db


def add_judging_arguments(parser: argparse.ArgumentParser, whose: str) -> None:
    """--grader-repeats, --consensus and --return-best (RubricMiddleware's options).

    Args:
        parser: The command's parser.
        whose: Appended to the help texts (which configurations they apply to).

    """
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


def add_max_tokens_arguments(parser: argparse.ArgumentParser, whose: str,
                             *, worker: bool = True) -> None:
    """--max-tokens (the worker's) and --grader-max-tokens: output token limits per reply.

    Args:
        parser: The command's parser.
        whose: Appended to the help texts (which configurations they apply to).
        worker: Whether the command runs a worker (a re-grade has only a grader).

    """
    from rubric_core.types import DEFAULT_GRADER_MAX_TOKENS, DEFAULT_WORKER_MAX_TOKENS

    cut = ("; a reply cut at it (finish_reason: length) is recorded as cut, and the revision "
           "or the grader's correction asks for a shorter one")
    if worker:
        parser.add_argument(
            "--max-tokens", type=int, default=None, metavar="N", dest="worker_max_tokens",
            help=f"the worker's output token limit per reply{whose} (default: "
            f"{DEFAULT_WORKER_MAX_TOKENS:,} for a model on a base URL, the provider's own "
            f"for others; 0: that default){cut}")
    parser.add_argument(
        "--grader-max-tokens", type=int, default=None, metavar="N",
        help=f"the grader's output token limit per reply{whose} (default: "
        f"{DEFAULT_GRADER_MAX_TOKENS:,} for a model on a base URL, the provider's own for "
        "others; 0: that default)")


def max_tokens(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """The worker's and the grader's output token limits given (None: not given, or 0).

    Raises:
        UsageError: A negative limit.

    """
    limits: list[int | None] = []
    for field, flag in (("worker_max_tokens", "--max-tokens"),
                        ("grader_max_tokens", "--grader-max-tokens")):
        value = getattr(args, field, None)
        if value is not None and value < 0:
            msg = f"{flag} must be a whole number of tokens (0: the model's default)"
            raise UsageError(msg)
        limits.append(value or None)
    return limits[0], limits[1]


def add_price_arguments(parser: argparse.ArgumentParser) -> None:
    """``--price MODEL=IN,CACHED,OUT`` (repeatable): a person's prices for the costs shown."""
    parser.add_argument(
        "--price", action="append", default=[], metavar="MODEL=IN,CACHED,OUT",
        help="US dollars per million input, cached input and output tokens for MODEL (a model "
        "string, or a bare model id); wins over the bundled price table; repeatable. Costs "
        "are computed from recorded tokens, so a price applies to past runs too")


def prices_from(args: argparse.Namespace) -> Prices:
    """The prices ``--price`` gives (over the bundled table).

    Raises:
        UsageError: A ``--price`` that cannot be read, with the shape to write.

    """
    from rubric_core.prices import PriceError, parse_overrides

    try:
        return parse_overrides(getattr(args, "price", None) or [])
    except PriceError as exc:
        msg = f"--price: {exc}"
        raise UsageError(msg) from exc


def judging(args: argparse.Namespace) -> dict[str, Any]:
    """The judging options given on the command line, by `RunSettings` field name."""
    values = {"grader_repeats": args.grader_repeats, "consensus": args.consensus,
              "return_best": args.return_best}
    return {k: v for k, v in values.items() if v is not None}


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    """``--verbose`` and ``--log-file``: where DBOS's and psycopg's own log records go.

    Without either they go nowhere: what they say about a lost database, our own message says
    once (`rubric_core.library_logs`).
    """
    parser.add_argument("--verbose", action="store_true",
                        help="show the queue engine's (DBOS's) and the PostgreSQL driver's "
                        "own warnings on standard error")
    parser.add_argument("--log-file", default=None, metavar="PATH",
                        help="append those warnings to PATH")
