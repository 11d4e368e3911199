"""``rubric-studio pairwise``: two answers per row, judged per criterion in both orders.

The pairs file is read and checked whole first (`rubric_core.pairwise.read_pairs_file`: a bad
row is refused with its row named, exit 2); then every pair is judged with A shown first and
with B shown first and recorded in ``--db`` (`rubric_core.pairwise.judge_and_record`). Printed:
per criterion the wins of A and B, ties, inconsistent (the orders disagree), failed (an order
could not judge it) and the position flip rate, then the overall flip rate and the cost.
``--list`` lists stored judgements and ``--show ID`` prints (and with ``--csv`` exports) one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

from rubric_core.cli._common import (
    UsageError,
    add_price_arguments,
    check_output,
    existing_database,
    prices_from,
    text_arg,
)
from rubric_core.redact import redact
from rubric_core.store import default_db_path, shown_location

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    from rubric_core.pairwise import StoredJudgement
    from rubric_core.prices import Prices
    from rubric_core.store import Store

DESCRIPTION = (
    "Judge two answers per row of --pairs (CSV or JSONL: id, prompt, a, b, optional rubric) "
    "against --rubric with --grader, every criterion in both orders (A shown first, then B), "
    "recorded in --db. Prints per criterion the wins of A and B, ties, inconsistent (the two "
    "orders disagree) and the position flip rate (the share of judgements whose orders "
    "disagree). Exit 0 when every criterion was judged in both orders, 1 when some could not "
    "be (the reason is printed), 2 for bad input."
)
"""``pairwise --help``'s description."""

_TALLY_HEADERS = ("criterion", "A wins", "B wins", "ties", "inconsistent", "failed", "judged",
                  "flip rate")


def add_pairwise_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``pairwise``."""
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--pairs", default=None, metavar="FILE",
                      help="a CSV or JSONL file with id, prompt, a, b and an optional rubric")
    what.add_argument("--list", action="store_true", help="list the stored judgements")
    what.add_argument("--show", default=None, metavar="ID",
                      help="print a stored judgement (its id or a unique prefix of it)")
    add = parser.add_argument
    add("--rubric", default=None, metavar="TEXT|@FILE",
        help="the rubric of rows without their own (needed unless every row has one)")
    add("--grader", default="rules", metavar="MODEL",
        help="grader model (default: rules, which judges offline: a passing answer beats a "
        "failing one, else tie)")
    add("--base-url", default=None, help="OpenAI-compatible server of the grader")
    add("--name", default=None, help="what to call the judgement (default: the file's name)")
    add("--concurrency", type=int, default=4, metavar="N",
        help="grader calls at once (default 4)")
    add("--csv", default=None, metavar="OUT",
        help="write one row per (pair, criterion) here: pair_id, criterion, winner_a_first, "
        "winner_b_first, winner, reason_a_first, reason_b_first, error (formula-safe)")
    add("--db", default=None,
        help="SQLite file or postgresql:// URL (default: the app's database, $RUBRIC_STUDIO_DB)")
    add_price_arguments(parser)


def pairwise(args: argparse.Namespace, out: TextIO) -> int:
    """``pairwise``: judge a pairs file, list stored judgements, or show one.

    Raises:
        UsageError: Bad arguments, a missing rubric, no such judgement.
        PairsError: A pairs file that cannot be judged (its row named).

    """
    from rubric_core.store import Store

    if args.csv:
        check_output(args.csv)
    if args.concurrency < 1:
        msg = f"--concurrency must be 1 or more, got {args.concurrency}"
        raise UsageError(msg)
    prices = prices_from(args)
    if args.pairs is None:
        db = existing_database(args.db)
        with Store(db) as store:
            if args.list:
                return _list(store, out)
            return _report(store, _find(store, args.show), prices, args.csv, out)
    judged = _judge(args)
    with Store(args.db or default_db_path()) as store:
        return _report(store, judged(store), prices, args.csv, out)


def _judge(args: argparse.Namespace) -> Callable[[Store], StoredJudgement]:
    """Read and check everything the judging needs; a function that judges into a store."""
    from pathlib import Path

    from rubric_core.models import model_resolver
    from rubric_core.pairwise import (
        JudgementSpec,
        StoredJudgement,
        judge_and_record,
        read_pairs_file,
    )

    path = Path(args.pairs)
    if not path.is_file():
        msg = f"--pairs {args.pairs!r} is not a file"
        raise UsageError(msg)
    pairs = read_pairs_file(path)
    rubric = text_arg(args.rubric, "--rubric") if args.rubric else ""
    without = [p.pair_id for p in pairs if not p.rubric.strip()]
    if not rubric.strip() and without:
        msg = (f"give --rubric TEXT|@FILE: {len(without)} row(s) have no rubric of their own "
               f"(first: id {without[0][:40]!r})")
        raise UsageError(msg)
    grader = model_resolver(streaming=False)(args.grader, "grader", args.base_url)
    spec = JudgementSpec(args.name or path.stem, "cli", args.grader, rubric,
                         base_url=args.base_url)

    def judged(store: Store) -> StoredJudgement:
        record = judge_and_record(store, grader, pairs, spec, concurrency=args.concurrency)
        return StoredJudgement.read(store, record.judgement_id)

    return judged


def _find(store: Store, key: str) -> StoredJudgement:
    from rubric_core.pairwise import StoredJudgement

    matches = [r for r in store.list_pairwise() if r.judgement_id.startswith(key.strip())]
    if len(matches) != 1:
        why = "matches no" if not matches else f"matches {len(matches)}"
        msg = (f"--show {key!r} {why} stored judgement in {shown_location(store.location)}; "
               "list them with --list")
        raise UsageError(msg)
    return StoredJudgement.read(store, matches[0].judgement_id)


def _list(store: Store, out: TextIO) -> int:
    records = store.list_pairwise()
    if not records:
        out.write(f"no pairwise judgements in {shown_location(store.location)}\n")
    for r in records:
        out.write(redact(f"{r.judgement_id[:12]}  {r.created_at[:19].replace('T', ' ')}  "
                         f"{r.pairs} pair(s)  grader {r.grader_model}  {r.source}  "
                         f"{r.name}: {r.label_a} vs {r.label_b}") + "\n")
    return 0


def _report(store: Store, judged: StoredJudgement, prices: Prices, csv_path: str | None,
            out: TextIO) -> int:
    from rubric_core.export import write_csv
    from rubric_core.pairwise import CSV_COLUMNS, flip_rate_text
    from rubric_core.prices import format_dollars

    record = judged.record
    out.write(redact(f"judgement {record.judgement_id} ({record.name}): {len(judged.items)} "
                     f"pair(s), grader {record.grader_model}; A = {record.label_a}, "
                     f"B = {record.label_b}") + "\n")
    rows = [t.row() for t in judged.tallies()]
    shown = [_TALLY_HEADERS, *((*row[:-1], "-" if row[-1] is None else f"{row[-1]:.2f}")
                              for row in rows)]
    widths = [max(len(str(r[i])) for r in shown) for i in range(len(_TALLY_HEADERS))]
    for row in shown:
        cells = [str(c).ljust(w) if i == 0 else str(c).rjust(w)
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        out.write(redact("  ".join(cells)) + "\n")
    tallies = judged.tallies()
    out.write(f"position {flip_rate_text(tallies[-1])}\n")
    for item in judged.failed_pairs():
        out.write(redact(f"    pair {item.pair_id}: {item.error}") + "\n")
    failures = [(item.pair_id, c) for item in judged.items for c in item.criteria
                if c.get("error")]
    for pair_id, c in failures[:5]:
        out.write(redact(f"    pair {pair_id} · {c['criterion']}: {c['error']}")[:600] + "\n")
    if len(failures) > 5:
        out.write(f"    … and {len(failures) - 5} more (see --csv's error column)\n")
    out.write(f"cost: {format_dollars(judged.cost(store, prices))} (priced from the recorded "
              "tokens; --price overrides win)\n")
    if csv_path:
        with open(csv_path, "w", encoding="utf-8", newline="") as handle:
            count = write_csv(judged.csv_rows(), handle, CSV_COLUMNS)
        out.write(f"wrote {count} rows to {csv_path}\n")
    return 1 if failures or judged.failed_pairs() else 0
