"""``rubric-studio db copy``: a whole database copied between SQLite and PostgreSQL.

The copy itself is `rubric_core.store.copy_store`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

from rubric_core.store import shown_location

if TYPE_CHECKING:
    import argparse

COPY_DESCRIPTION = (
    "Copy a whole Rubric Studio database to another: SQLite file to postgresql:// URL or back "
    "(rubric_core.store.copy_store). The destination must be empty unless --into-nonempty; "
    "the counts copied are checked against it."
)
"""``db copy --help``'s description."""


def add_copy_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``db copy``."""
    parser.add_argument("--from", dest="source", required=True, metavar="PATH_OR_URL")
    parser.add_argument("--to", dest="destination", required=True, metavar="PATH_OR_URL")
    parser.add_argument("--into-nonempty", action="store_true",
                        help="add to a destination that holds data (rows already there are "
                        "kept)")


def copy(args: argparse.Namespace, out: TextIO) -> int:
    """``db copy``: copy, then print the rows copied per table; 0 when done."""
    from rubric_core.store import copy_store

    counts = copy_store(args.source, args.destination, into_nonempty=args.into_nonempty)
    out.write(f"copied {shown_location(args.source)} to {shown_location(args.destination)}:\n")
    for table, count in counts.items():
        out.write(f"  {table:18} {count:8}\n")
    return 0
