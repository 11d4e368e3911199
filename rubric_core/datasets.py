"""Datasets: many prompts for one rubric, read from CSV or JSONL and checked whole.

A dataset is a table of rows. Columns:

- ``prompt``: the prompt for that row. It may use ``{column}`` variables, filled from the same
  row's other columns (``{{`` and ``}}`` are literal braces). Instead of a ``prompt`` column, a
  dataset may be read with a ``template`` (the experiment's prompt) whose variables name its
  columns.
- ``rubric`` (optional): a per-row rubric; rows without one use the experiment's rubric.
- ``id`` (optional): a unique row id; by default the row's 1-based number.
- any other column is kept as a variable: it fills templates and is exported with the results.

`parse_dataset` reads all of it or nothing: the first problem raises `DatasetError` naming the
row and the column (bad encoding, a missing ``prompt``, an empty row, an unknown template
variable, a duplicate id, a file or row count over the limits), so nothing is ever stored
half-way. Rows are numbered as a spreadsheet shows them: the header is row 1 in a CSV, the first
line is row 1 in JSONL.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from collections import Counter
from typing import TYPE_CHECKING, Any, Literal, NoReturn

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

MAX_DATASET_BYTES = 20 * 1024 * 1024
"""The largest dataset file accepted."""

MAX_DATASET_ROWS = 10_000
"""The most rows a dataset may hold."""

MAX_CELL_CHARS = 100_000
"""The longest single cell (a prompt or a rubric) accepted."""

MAX_DATASET_COLUMNS = 200
"""The most columns a dataset may have. Every row holds a cell for each (a short row is
filled with empty ones), and every export row repeats them."""

RESERVED_COLUMNS = ("id", "prompt", "rubric")
"""Columns with a meaning of their own; every other column is a variable."""

DatasetFormat = Literal["csv", "jsonl"]


class DatasetError(ValueError):
    """A dataset that cannot be used, with where (row, column) and what to do."""


@dataclasses.dataclass(frozen=True)
class DatasetRow:
    """One row: its id, the filled-in prompt, its own rubric (if any) and its variables."""

    id: str
    """Unique within the dataset."""
    prompt: str
    """The prompt with its variables filled in."""
    rubric: str | None
    """The row's own rubric, or None to use the experiment's."""
    variables: dict[str, str]
    """Every other column of the row, by name."""


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A parsed, checked dataset."""

    name: str
    """What the user called it (a file name, say)."""
    columns: tuple[str, ...]
    """The columns as read, in order."""
    rows: tuple[DatasetRow, ...]
    """The rows, in file order."""

    def to_jsonl(self) -> str:
        """The rows as JSONL (id, prompt, rubric, then the variables), for storing or export."""
        lines = []
        for row in self.rows:
            record: dict[str, Any] = {"id": row.id, "prompt": row.prompt}
            if row.rubric is not None:
                record["rubric"] = row.rubric
            record.update(row.variables)
            lines.append(json.dumps(record, ensure_ascii=False))
        return "\n".join(lines) + ("\n" if lines else "")


def _decode(data: bytes | str) -> str:
    if isinstance(data, str):
        return data
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        msg = (f"row {line}: the file is not UTF-8 text (byte {exc.start}: "
               f"{data[exc.start:exc.start + 1]!r}). Save it as UTF-8 (in a spreadsheet: "
               "'CSV UTF-8') and upload it again.")
        raise DatasetError(msg) from exc
    return text


def sniff_format(text: str) -> DatasetFormat:
    """``jsonl`` when the first non-blank line is a JSON object, else ``csv``."""
    # Not splitlines(): a list of every line of a 20 MB file just to read the first one.
    return "jsonl" if text.lstrip().startswith("{") else "csv"


def _records_csv(text: str) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        msg = "the dataset is empty: give a header row (with a 'prompt' column) and rows"
        raise DatasetError(msg) from None
    except csv.Error as exc:
        msg_0 = f"row 1: not readable as CSV ({exc})"
        raise DatasetError(msg_0) from exc
    columns = [name.strip() for name in header]
    _check_column_count(len(columns))
    for index, name in enumerate(columns, start=1):
        if not name:
            msg_0 = f"row 1, column {index}: the header is empty; name every column"
            raise DatasetError(msg_0)
    duplicates = sorted(name for name, count in Counter(columns).items() if count > 1)
    if duplicates:
        msg_0 = f"row 1: column {duplicates[0]!r} appears twice in the header"
        raise DatasetError(msg_0)
    records: list[tuple[int, dict[str, str]]] = []
    try:
        for cells in reader:
            line = reader.line_num
            if len(cells) > len(columns) and any(c.strip() for c in cells[len(columns):]):
                msg = (f"row {line}: {len(cells)} cells but the header has {len(columns)} "
                       "columns; quote cells that contain commas")
                raise DatasetError(msg)
            if len(records) >= MAX_DATASET_ROWS:
                # Past the limit only count: a megabyte of blank lines would otherwise become
                # a million rows of empty cells (gigabytes) before the limit is checked.
                _too_many_rows(len(records) + 1 + sum(1 for _ in reader))
            values = {name: (cells[i] if i < len(cells) else "") for i, name in
                      enumerate(columns)}
            records.append((line, values))
    except csv.Error as exc:
        msg_0 = f"row {reader.line_num}: not readable as CSV ({exc})"
        raise DatasetError(msg_0) from exc
    return columns, records


def _check_column_count(count: int) -> None:
    if count > MAX_DATASET_COLUMNS:
        msg = (f"the dataset has {count:,} columns; the limit is {MAX_DATASET_COLUMNS:,}. "
               "Keep the columns the prompts use and the ones you want exported.")
        raise DatasetError(msg)


def _too_many_rows(count: int) -> NoReturn:
    msg = (f"the dataset has {count:,} rows; the limit is {MAX_DATASET_ROWS:,}. "
           "Split it into smaller datasets.")
    raise DatasetError(msg)


def _records_jsonl(text: str) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    columns: dict[str, None] = {}  # ordered, and a set: a line of 100,000 keys stays linear
    records: list[tuple[int, dict[str, str]]] = []
    lines = io.StringIO(text, newline=None)  # lazily, one line at a time
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if len(records) >= MAX_DATASET_ROWS:
            _too_many_rows(len(records) + 1 + sum(1 for rest in lines if rest.strip()))
        try:
            value = json.loads(line)
        except ValueError as exc:
            msg = f"row {line_no}: not a JSON object ({exc.args[0]})"
            raise DatasetError(msg) from exc
        if not isinstance(value, dict):
            msg = f"row {line_no}: a JSON {type(value).__name__}, not an object of columns"
            raise DatasetError(msg)
        row: dict[str, str] = {}
        for key, cell in value.items():
            if isinstance(cell, dict | list):
                msg = (f"row {line_no}, column {key!r}: nested JSON is not a cell; give text "
                       "or a number")
                raise DatasetError(msg)
            row[str(key)] = "" if cell is None else str(cell)
            columns[str(key)] = None
        _check_column_count(len(columns))
        records.append((line_no, row))
    return list(columns), records


_VARIABLE = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


def template_variables(template: str) -> list[str]:
    """The ``{column}`` names a template uses, in order of first use.

    Only ``{name}`` with a plain identifier is a variable; any other brace (a JSON example in
    a prompt, say) is literal text, and ``{{`` / ``}}`` are literal braces.
    """
    names: list[str] = []
    for match in _VARIABLE.finditer(template):
        name = match.group(1)
        if name and name not in names:
            names.append(name)
    return names


def fill(template: str, variables: Mapping[str, str]) -> str:
    """``template`` with its ``{column}`` variables replaced from ``variables``.

    Raises:
        KeyError: A variable the mapping does not have.

    """

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token in ("{{", "}}"):
            return token[0]
        return str(variables[match.group(1)])

    return _VARIABLE.sub(replace, template)


def parse_dataset(
    data: bytes | str,
    *,
    name: str = "dataset",
    fmt: DatasetFormat | None = None,
    template: str | None = None,
) -> Dataset:
    """Read and check a whole dataset; nothing partial is ever returned.

    Args:
        data: The file's bytes (UTF-8) or pasted text.
        name: What to call the dataset.
        fmt: ``csv`` or ``jsonl``; sniffed from the text when None.
        template: The experiment's prompt template, used for rows without a ``prompt`` cell.

    Raises:
        DatasetError: The first problem, naming its row and column.

    """
    size = len(data.encode("utf-8")) if isinstance(data, str) else len(data)
    if size > MAX_DATASET_BYTES:
        msg = (f"the dataset is {size / 1024 / 1024:.1f} MB; the limit is "
               f"{MAX_DATASET_BYTES // 1024 // 1024} MB. Split it into smaller datasets.")
        raise DatasetError(msg)
    text = _decode(data)
    fmt = fmt or sniff_format(text)
    if fmt not in ("csv", "jsonl"):
        msg_0 = f"unknown dataset format {fmt!r}: use 'csv' or 'jsonl'"
        raise DatasetError(msg_0)
    columns, records = _records_csv(text) if fmt == "csv" else _records_jsonl(text)
    if not records:
        msg_0 = "the dataset has no rows: add at least one row under the header"
        raise DatasetError(msg_0)
    if len(records) > MAX_DATASET_ROWS:
        _too_many_rows(len(records))
    if "prompt" not in columns and not (template and template.strip()):
        msg = (f"there is no 'prompt' column (columns: {', '.join(columns) or 'none'}): name "
               "the prompt column 'prompt', or give a prompt template that uses the columns "
               "as {variables}")
        raise DatasetError(msg)
    if template is not None:
        for var in template_variables(template):
            if var not in columns:
                msg = (f"the prompt template uses {{{var}}}, but the dataset has no column "
                       f"{var!r} (columns: {', '.join(columns)})")
                raise DatasetError(msg)
    rows: list[DatasetRow] = []
    seen: set[str] = set()
    for line, values in records:
        rows.append(_row(line, values, template, seen, len(rows) + 1))
    return Dataset(name=name, columns=tuple(columns), rows=tuple(rows))


def _row(
    line: int, values: Mapping[str, str], template: str | None, seen: set[str], number: int
) -> DatasetRow:
    if not any(str(v).strip() for v in values.values()):
        msg = f"row {line} is empty: delete it or fill it in"
        raise DatasetError(msg)
    for column, cell in values.items():
        if len(cell) > MAX_CELL_CHARS:
            msg = (f"row {line}, column {column!r}: {len(cell):,} characters; the limit is "
                   f"{MAX_CELL_CHARS:,}")
            raise DatasetError(msg)
    variables = {k: v for k, v in values.items() if k not in RESERVED_COLUMNS}
    raw_prompt = (values.get("prompt") or "").strip()
    source = raw_prompt or (template or "").strip()
    if not source:
        msg_0 = f"row {line}, column 'prompt': the prompt is empty"
        raise DatasetError(msg_0)
    where = f"row {line}, column 'prompt'" if raw_prompt else "the prompt template"
    for var in template_variables(source):
        if var not in variables:
            known = ", ".join(variables) or "none"
            msg = (f"{where} uses {{{var}}}, but there is no column {var!r} to fill it "
                   f"(variables: {known})")
            raise DatasetError(msg)
        if not variables[var].strip():
            msg = f"row {line}, column {var!r}: empty, but the prompt uses {{{var}}}"
            raise DatasetError(msg)
    row_id = (values.get("id") or "").strip() or str(number)
    if row_id in seen:
        msg_0 = f"row {line}, column 'id': {row_id!r} is used by an earlier row"
        raise DatasetError(msg_0)
    seen.add(row_id)
    rubric = (values.get("rubric") or "").strip() or None
    return DatasetRow(id=row_id, prompt=fill(source, variables), rubric=rubric,
                      variables=dict(variables))


def rows_from_jsonl(text: str, *, name: str = "dataset") -> Dataset:
    """A dataset stored with `Dataset.to_jsonl`, read back exactly.

    Prompts are not filled again: they were filled when the dataset was first read.
    """
    rows: list[DatasetRow] = []
    columns: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        variables = {k: str(v) for k, v in record.items() if k not in RESERVED_COLUMNS}
        for key in record:
            if key not in columns:
                columns.append(key)
        rows.append(DatasetRow(id=str(record["id"]), prompt=str(record["prompt"]),
                               rubric=record.get("rubric"), variables=variables))
    return Dataset(name=name, columns=tuple(columns), rows=tuple(rows))


def preview(dataset: Dataset, limit: int = 20) -> list[dict[str, str]]:
    """The first ``limit`` rows as flat records (id, prompt, rubric, variables) for a table."""
    out: list[dict[str, str]] = []
    for row in dataset.rows[:limit]:
        out.append({"id": row.id, "prompt": row.prompt, "rubric": row.rubric or "",
                    **row.variables})
    return out


__all__: Sequence[str] = (
    "MAX_CELL_CHARS", "MAX_DATASET_BYTES", "MAX_DATASET_COLUMNS", "MAX_DATASET_ROWS", "Dataset",
    "DatasetError",
    "DatasetRow", "fill", "parse_dataset", "preview", "rows_from_jsonl", "sniff_format",
    "template_variables",
)
