"""Answer sets: fixed answers to grade with people's verdicts, from uploads, runs or experiments.

An answer set is what stays fixed while a rubric changes: items (an id, the request, the
answer) and people's pass/fail verdicts per criterion. It comes from

- an upload (`parse_answers`, `read_answers_file`): CSV or JSONL with ``request`` and
  ``answer`` columns, an optional ``id`` (by default the row's number) and ``rubric`` (the rubric
  the answer was first graded with, kept for reference), and people's verdicts as
  ``label:<criterion>`` columns (the labeller named at import) or ``label@<person>:<criterion>``
  columns (that person's), each cell ``pass``/``fail`` (also yes/no, true/false, 1/0, y/n;
  empty: not labelled). Any other column is refused, so nothing in a file is silently dropped;
- the final answers of stored runs matching a filter (`answers_from_runs`), with the labels
  people gave their final evaluation;
- an experiment's cells (`answers_from_experiment`): each cell's final answer, or every
  pass's answer.

An upload is read as datasets are (`rubric_core.datasets`): its size is checked before it is
read, CSV is read strictly, a byte order mark is dropped, and the first problem refuses the
whole file naming its row and column (rows are numbered as a spreadsheet shows them: the
header is row 1 in a CSV, the first line row 1 in JSONL). The same limits apply (file size,
rows, columns, column-name and cell lengths); a column name with a control character, and an
id or column name holding a key (or text shaped like one), are refused. Text is scrubbed of
secrets when the set is stored (`Store.save_answer_set`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from rubric_core.datasets import (
    MAX_CELL_CHARS,
    MAX_DATASET_BYTES,
    MAX_DATASET_ROWS,
    DatasetError,
    DuplicateKeyError,
    check_column_names,
    has_control_chars,
    is_jsonl_name,
    read_limited,
    sniff_format,
    unique_keys,
)
from rubric_core.labels import labelled_verdicts
from rubric_core.redact import redact
from rubric_core.store import AnswerItem, ItemLabel
from rubric_core.types import LABELLER_CHAR_LIMIT

if TYPE_CHECKING:
    import os
    from collections.abc import Iterable, Iterator, Sequence

    from rubric_core.store import RunRecord, Store

MAX_ANSWER_ITEMS = MAX_DATASET_ROWS
"""The most answers a set may hold (a dataset's row limit)."""

UPLOAD_LABELLER = "uploaded"
"""Who a ``label:<criterion>`` column's verdicts are recorded as when the import names nobody."""

PASS_WORDS = frozenset({"pass", "passed", "yes", "y", "true", "1"})
"""Cells read as a pass verdict (case and surrounding spaces ignored)."""

FAIL_WORDS = frozenset({"fail", "failed", "no", "n", "false", "0"})
"""Cells read as a fail verdict."""

_LABEL_COLUMN = re.compile(r"^label(?:@(?P<who>[^:]+))?:(?P<criterion>.+)$", re.DOTALL)
class AnswerSetError(DatasetError):
    """An answer set that cannot be used, with where (row, column) and what to do."""


@dataclasses.dataclass(frozen=True)
class AnswerSet:
    """A checked answer set, ready to store (`Store.save_answer_set`)."""

    name: str
    """What to call it."""
    items: tuple[AnswerItem, ...]
    """The answers, in order (ids unique)."""
    labels: tuple[ItemLabel, ...] = ()
    """People's verdicts."""
    source: str = "upload"
    """How it was made (``upload``, ``bundled``, ``runs``, ``experiment <id>``)."""

    def labelled_criteria(self) -> list[str]:
        """The criteria people labelled, in order of first appearance."""
        return list(dict.fromkeys(lb.criterion for lb in self.labels))

    def labellers(self) -> list[str]:
        """Who labelled, in order of first appearance."""
        return list(dict.fromkeys(lb.labeller for lb in self.labels))


# -- uploads ----------------------------------------------------------------------------------


def read_answers_file(path: str | os.PathLike[str], *, name: str | None = None,
                      labeller: str = UPLOAD_LABELLER) -> AnswerSet:
    """Read and check an answer file, refusing one over the size limit before reading it.

    Args:
        path: A CSV file, or JSONL when its name ends in ``.jsonl`` or ``.ndjson``.
        name: What to call the set; the file's name without its extension by default.
        labeller: Who the ``label:<criterion>`` columns' verdicts are recorded as.

    Raises:
        AnswerSetError: The file is too large, or the first problem in it (`parse_answers`).
        OSError: The file cannot be opened.

    """
    file = Path(path)
    data = read_limited(file, _too_big)
    return parse_answers(data, name=name or file.stem,
                         fmt="jsonl" if is_jsonl_name(file) else None, labeller=labeller)


def _too_big(size: int, *, at_least: bool = True) -> AnswerSetError:
    del at_least  # the message always says "at least"
    shown = f"{size / 1024 / 1024:,.1f} MB"
    return AnswerSetError(f"the answer file is at least {shown}; the limit is "
                          f"{MAX_DATASET_BYTES // 1024 // 1024} MB. Split it into smaller sets.")


def parse_answers(data: bytes | str, *, name: str = "answers", fmt: str | None = None,
                  labeller: str = UPLOAD_LABELLER) -> AnswerSet:
    """Read and check a whole answer file; nothing partial is ever returned.

    Args:
        data: The file's bytes (UTF-8) or pasted text.
        name: What to call the set.
        fmt: ``csv`` or ``jsonl``; sniffed from the text when None.
        labeller: Who the ``label:<criterion>`` columns' verdicts are recorded as.

    Raises:
        AnswerSetError: The first problem, naming its row and column.

    """
    name = name.strip()
    if not name or len(name) > 200 or has_control_chars(name):
        msg = (f"the answer set name {name[:40]!r} must be 1 to 200 characters of plain text; "
               "give it a short name")
        raise AnswerSetError(msg)
    if redact(name) != name:
        msg = ("the answer set name holds an API key or a secret (or text shaped like one); "
               "give it another name (--name NAME)")
        raise AnswerSetError(msg)
    labeller = _labeller(labeller, "the import's labeller")
    size = len(data.encode("utf-8", "surrogatepass")) if isinstance(data, str) else len(data)
    if size > MAX_DATASET_BYTES:
        raise _too_big(size)
    text = _decode(data)
    fmt = fmt or sniff_format(text)
    if fmt not in ("csv", "jsonl"):
        msg = f"unknown answer file format {fmt!r}: use 'csv' or 'jsonl'"
        raise AnswerSetError(msg)
    records = _csv_records(text) if fmt == "csv" else _jsonl_records(text)
    items: list[AnswerItem] = []
    labels: list[ItemLabel] = []
    seen: set[str] = set()
    for row, values in records:
        if len(items) >= MAX_ANSWER_ITEMS:
            msg = (f"row {row}: the set has more than {MAX_ANSWER_ITEMS:,} answers; split it "
                   "into smaller sets")
            raise AnswerSetError(msg)
        item, item_labels = _item(row, values, len(items) + 1, seen, labeller)
        items.append(item)
        labels += item_labels
    if not items:
        msg = "the answer file has no rows: add at least one row with a request and an answer"
        raise AnswerSetError(msg)
    return AnswerSet(name=name, items=tuple(items), labels=tuple(labels), source="upload")


def _decode(data: bytes | str) -> str:
    if isinstance(data, str):
        return data.lstrip("\ufeff")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        msg = (f"row {line}: the file is not UTF-8 text (byte {exc.start}); save it as "
               "UTF-8 (in a spreadsheet: 'CSV UTF-8') and upload it again")
        raise AnswerSetError(msg) from exc
    return text.lstrip("\ufeff")


def _check_header(columns: Sequence[str], row: int) -> None:
    """Refuse too many columns, unknown or unnamed ones, and names that cannot be kept."""
    try:
        check_column_names(columns, row, by_name=False)
    except DatasetError as exc:
        raise AnswerSetError(str(exc)) from None
    for index, column in enumerate(columns, start=1):
        where = f"row {row}, column {index}"
        if column not in ("id", "request", "answer", "rubric") and not _LABEL_COLUMN.match(
                column):
            msg = (f"{where}: unknown column {column[:40]!r}. An answer file has request, "
                   "answer, optional id and rubric, and people's verdicts as "
                   "label:<criterion> or label@<person>:<criterion>; remove or rename it")
            raise AnswerSetError(msg)
    for needed in ("request", "answer"):
        if needed not in columns:
            msg = (f"row {row}: there is no {needed!r} column (columns: "
                   f"{', '.join(c[:40] for c in columns) or 'none'}); an answer file needs "
                   "request and answer columns")
            raise AnswerSetError(msg)


def _csv_records(text: str) -> Iterator[tuple[int, dict[str, str]]]:
    if csv.field_size_limit() <= MAX_DATASET_BYTES:
        csv.field_size_limit(MAX_DATASET_BYTES + 1)  # a long cell reaches our own check
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    row = 1
    try:
        header = next(reader, None)
        if header is None:
            msg = "the answer file is empty: give a header row (request, answer, ...) and rows"
            raise AnswerSetError(msg)
        columns = [c.strip() for c in header]
        _check_header(columns, 1)
        if len(set(columns)) < len(columns):
            twice = next(c for c in columns if columns.count(c) > 1)
            msg = f"row 1: column {twice[:40]!r} appears twice in the header"
            raise AnswerSetError(msg)
        for cells in reader:
            row += 1
            if len(cells) > len(columns) and any(c.strip() for c in cells[len(columns):]):
                msg = (f"row {row}: {len(cells)} cells but the header has {len(columns)} "
                       "columns; quote cells that contain commas")
                raise AnswerSetError(msg)
            if not any(c.strip() for c in cells):
                continue  # a blank line between rows
            yield row, {c: (cells[i] if i < len(cells) else "") for i, c in enumerate(columns)}
    except csv.Error as exc:
        msg = (f"row {row + 1}: not readable as CSV ({exc}); a quote inside a quoted cell is "
               "written twice (\"\"), and a quoted cell must be closed")
        raise AnswerSetError(msg) from exc


def _jsonl_records(text: str) -> Iterator[tuple[int, dict[str, str]]]:
    for line_no, line in enumerate(io.StringIO(text, newline=None), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line, parse_int=str, parse_float=str,
                               object_pairs_hook=unique_keys)
        except DuplicateKeyError as exc:
            msg = f"row {line_no}: {exc}"
            raise AnswerSetError(msg) from None
        except (ValueError, RecursionError) as exc:
            msg = f"row {line_no}: not a JSON object ({type(exc).__name__})"
            raise AnswerSetError(msg) from None
        if not isinstance(value, dict):
            msg = f"row {line_no}: a JSON {type(value).__name__}, not an object of columns"
            raise AnswerSetError(msg)
        _check_header([str(k) for k in value], line_no)
        values: dict[str, str] = {}
        for key, cell in value.items():
            if isinstance(cell, dict | list):
                msg = (f"row {line_no}, column {str(key)[:40]!r}: nested JSON is not a cell; "
                       "give text, a number or true/false")
                raise AnswerSetError(msg)
            values[str(key)] = "" if cell is None else str(cell)
        yield line_no, values


def _labeller(name: str, where: str) -> str:
    name = name.strip() if isinstance(name, str) else ""
    if not name or len(name) > LABELLER_CHAR_LIMIT or has_control_chars(name):
        msg = (f"{where}: a labeller's name must be 1 to {LABELLER_CHAR_LIMIT} characters of "
               "plain text")
        raise AnswerSetError(msg)
    return redact(name)


def _item(row: int, values: dict[str, str], number: int, seen: set[str],
          labeller: str) -> tuple[AnswerItem, list[ItemLabel]]:
    for column, cell in values.items():
        if len(cell) > MAX_CELL_CHARS:
            msg = (f"row {row}, column {column[:40]!r}: {len(cell):,} characters; the limit "
                   f"for a cell is {MAX_CELL_CHARS:,}")
            raise AnswerSetError(msg)
    request, answer = values.get("request", ""), values.get("answer", "")
    for column, cell in (("request", request), ("answer", answer)):
        if not cell.strip():
            msg = f"row {row}, column {column!r}: empty; every row needs a request and an answer"
            raise AnswerSetError(msg)
    item_id = (values.get("id") or "").strip() or str(number)
    if redact(item_id) != item_id or has_control_chars(item_id):
        msg = (f"row {row}, column 'id': the id holds an API key, a secret or a control "
               "character (or text shaped like one); give the row another id")
        raise AnswerSetError(msg)
    if item_id in seen:
        msg = f"row {row}, column 'id': {item_id!r} is used by an earlier row"
        raise AnswerSetError(msg)
    seen.add(item_id)
    labels: list[ItemLabel] = []
    for column, cell in values.items():
        match = _LABEL_COLUMN.match(column)
        if match is None or not cell.strip():
            continue
        word = cell.strip().casefold()
        if word not in PASS_WORDS | FAIL_WORDS:
            msg = (f"row {row}, column {column[:40]!r}: {cell.strip()[:20]!r} is not a verdict; "
                   "write pass or fail (or yes/no, true/false, 1/0), or leave it empty")
            raise AnswerSetError(msg)
        who = match.group("who")
        person = labeller if who is None else _labeller(who, f"row {row}, column {column!r}")
        criterion = match.group("criterion").strip()
        if not criterion:
            msg = f"row {row}, column {column!r}: name the criterion after 'label:'"
            raise AnswerSetError(msg)
        labels.append(ItemLabel(item_id, criterion, person, word in PASS_WORDS))
    rubric = (values.get("rubric") or "").strip() or None
    return AnswerItem(item_id, request, answer, rubric, "upload"), labels


# -- from stored runs and experiments ---------------------------------------------------------


def _final_items(store: Store, runs: Sequence[RunRecord], every_pass: bool,
                 ids: Sequence[str]) -> tuple[list[AnswerItem], list[ItemLabel]]:
    """Items (and their labels) from the runs' evaluations: each run's last, or every one."""
    items: list[AnswerItem] = []
    labels: list[ItemLabel] = []
    for start in range(0, len(runs), 300):
        chunk = list(zip(runs[start : start + 300], ids[start : start + 300], strict=True))
        evaluations = store.evaluations_for_runs(r.run_id for r, _ in chunk)
        verdicts = labelled_verdicts(store.labels(r.run_id for r, _ in chunk), evaluations)
        by_eval: dict[tuple[str, int], str] = {}  # (run, evaluation seq) -> item id
        for run, item_id in chunk:
            evs = evaluations.get(run.run_id) or []
            picked = list(enumerate(evs)) if every_pass else list(enumerate(evs))[-1:]
            for seq, ev in picked:
                if not str(ev.get("answer") or "").strip():
                    continue
                iid = f"{item_id}/p{seq + 1}" if every_pass else item_id
                by_eval[run.run_id, seq] = iid
                items.append(AnswerItem(iid, run.prompt, str(ev["answer"]), run.rubric,
                                        f"run:{run.run_id}"))
                if len(items) > MAX_ANSWER_ITEMS:
                    msg = (f"more than {MAX_ANSWER_ITEMS:,} answers match: narrow the filter")
                    raise AnswerSetError(msg)
        labels += [ItemLabel(by_eval[v.run_id, v.seq], v.criterion, v.labeller, v.person, v.note)
                   for v in verdicts if (v.run_id, v.seq) in by_eval]
    return items, labels


def answers_from_runs(store: Store, *, name: str, rubric: str | None = None,
                      model: str | None = None, status: str | None = None,
                      text: str | None = None) -> AnswerSet:
    """The final answers of the stored runs matching a filter, with people's labels of them.

    Args:
        store: The database.
        name: What to call the set.
        rubric: Only runs of this rubric (spaces around it ignored).
        model: Only runs whose worker or grader model is exactly this.
        status: Only runs in this status (`rubric_core.types.RUN_STATUSES`).
        text: Only runs whose title, prompt or rubric contains this (any case).

    Raises:
        AnswerSetError: No run with an answer matches, or more than `MAX_ANSWER_ITEMS` do.

    """
    if rubric is not None:
        runs = [r for r in store.runs_for_rubric(rubric)
                if (model is None or model in (r.worker_model, r.grader_model))
                and (status is None or r.status == status)
                and (text is None or text.casefold() in
                     f"{r.title}\n{r.prompt}\n{r.rubric}".casefold())]
    else:
        runs = store.list_runs(status=status, model=model, text=text, limit=None)
    runs = list(reversed(runs))  # oldest first: a set reads in the order the runs were made
    items, labels = _final_items(store, runs, False, [r.run_id for r in runs])
    if not items:
        msg = "no stored run with an answer matches the filter: loosen it (or run some first)"
        raise AnswerSetError(msg)
    return AnswerSet(name=name, items=tuple(items), labels=tuple(labels), source="runs")


def answers_from_experiment(store: Store, experiment_id: str, *, name: str | None = None,
                            every_pass: bool = False) -> AnswerSet:
    """An experiment's answers: each cell's final answer, or every pass's (``every_pass``).

    Item ids are ``<row>/<configuration>/<repeat>`` (and ``/p<pass>`` with ``every_pass``).

    Raises:
        KeyError: No such experiment.
        AnswerSetError: None of its cells has an answer yet.

    """
    experiment = store.get_experiment(experiment_id)
    if experiment is None:
        msg = f"no experiment {experiment_id!r} in this database"
        raise KeyError(msg)
    cells = [c for c in store.experiment_cells(experiment_id) if c.run is not None]
    runs = [c.run for c in cells if c.run is not None]
    ids = [f"{c.row_id}/{c.config_index}/{c.repeat_index}" for c in cells]
    items, labels = _final_items(store, runs, every_pass, ids)
    if not items:
        msg = f"experiment {experiment_id[:8]} has no answers yet: run it first"
        raise AnswerSetError(msg)
    return AnswerSet(name=name or f"{experiment.name} answers", items=tuple(items),
                     labels=tuple(labels), source=f"experiment {experiment_id}")


def label_columns(labels: Iterable[ItemLabel], default: str = UPLOAD_LABELLER) -> list[str]:
    """The ``label...`` columns that write these labels back into an answer file."""
    columns = [f"label:{lb.criterion}" if lb.labeller == default
               else f"label@{lb.labeller}:{lb.criterion}" for lb in labels]
    return list(dict.fromkeys(columns))
