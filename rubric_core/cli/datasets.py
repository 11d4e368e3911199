"""``rubric-studio datasets``: list, show or delete the datasets stored in a database."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from rubric_core.cli._common import UsageError, existing_database
from rubric_core.redact import redact
from rubric_core.store import default_db_path, shown_location
from rubric_core.store import is_url as is_db_url

if TYPE_CHECKING:
    import argparse

PREVIEW_ROWS = 10
"""Rows ``datasets show`` prints."""


def add_datasets_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``datasets``."""
    parser.add_argument("--db", default=None,
                        help="SQLite file or postgresql:// URL (default: the app's database, "
                        "$RUBRIC_STUDIO_DB)")
    parser.add_argument("action", nargs="?", default="list", choices=("list", "show", "delete"))
    parser.add_argument("name", nargs="?", default=None)


def datasets(args: argparse.Namespace, out: TextIO) -> int:
    """``datasets [list|show NAME|delete NAME]``; 0 unless the input is bad.

    Raises:
        UsageError: No NAME, no database (except for ``list``), or no such dataset.

    """
    from rubric_core.datasets import preview
    from rubric_core.store import Store

    if args.action != "list" and not args.name:
        msg = f"datasets {args.action} needs a NAME"
        raise UsageError(msg)
    args.db = args.db or default_db_path()
    if args.action == "list" and not is_db_url(args.db) and not Path(args.db).is_file():
        out.write(f"no datasets: no database at {args.db} yet\n")
        return 0
    args.db = existing_database(args.db)
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
            for record in preview(dataset, PREVIEW_ROWS):
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
