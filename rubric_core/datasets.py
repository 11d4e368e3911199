"""Datasets: many prompts for one rubric, read from CSV or JSONL and checked whole.

A dataset is a table of rows. Columns:

- ``prompt``: the prompt for that row. It may use ``{column}`` variables, filled from the same
  row's other columns, ``id`` and ``rubric`` included (``{{`` and ``}}`` are literal braces).
  Instead of a ``prompt`` column, a dataset may be read with a ``template`` (the experiment's
  prompt) whose variables name its columns.
- ``rubric`` (optional): a per-row rubric; rows without one use the experiment's rubric.
- ``id`` (optional): a unique row id; by default the row's 1-based number.
- any other column is kept as a variable: it fills templates and is exported with the results.

`parse_dataset` reads all of it or nothing: the first problem raises `DatasetError` naming the
row and the column (bad encoding, a missing ``prompt``, an empty row, an unknown template
variable, a duplicate id, a quote left open, a file, row, column, cell or filled-prompt size
over the limits), so nothing is ever stored half-way. `read_dataset_file` checks a file's size
before reading it. Rows are numbered as a spreadsheet shows them: the header is row 1 in a CSV
(a cell with line breaks is still one row), the first line is row 1 in JSONL.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from rubric_core.redact import redact

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

MAX_DATASET_BYTES = 20 * 1024 * 1024
"""The largest dataset file accepted."""

MAX_DATASET_ROWS = 10_000
"""The most rows a dataset may hold."""

MAX_CELL_CHARS = 100_000
"""The longest single cell (a prompt or a rubric) accepted."""

MAX_DATASET_COLUMNS = 200
"""The most columns a dataset may have. Every row holds a cell for each (a short row is
filled with empty ones), and every export row repeats them."""

MAX_PROMPT_CHARS = 200_000
"""The longest prompt a row may have once its ``{column}`` variables are filled in (twice a
cell: a template around one long document fits; a variable used a thousand times does not)."""

MAX_DATASET_PROMPT_CHARS = 50_000_000
"""The most characters all the filled-in prompts of a dataset may hold together: a variable
repeated in every row would otherwise turn a small file into gigabytes."""

MAX_DATASET_NAME_CHARS = 200
"""The longest dataset name accepted."""

MAX_COLUMN_NAME_CHARS = 100
"""The longest column name accepted: a stored row repeats every name beside its cell."""

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
    text = data if isinstance(data, str) else _decode_bytes(data)
    # A byte order mark left as a character (pasted text, or a file saved twice by tools that
    # each add one) would be part of the first column's name: "\ufeffprompt" is not "prompt".
    return text.lstrip("\ufeff")


def _decode_bytes(data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        msg = (f"row {line}: the file is not UTF-8 text (byte {exc.start}: "
               f"{data[exc.start:exc.start + 1]!r}). Save it as UTF-8 (in a spreadsheet: "
               "'CSV UTF-8') and upload it again.")
        raise DatasetError(msg) from exc
    return text


def read_dataset_file(
    path: str | os.PathLike[str], *, name: str | None = None, template: str | None = None
) -> Dataset:
    """Read and check a dataset file, refusing one over the size limit before reading it.

    At most `MAX_DATASET_BYTES` + 1 bytes are ever read, so a multi-gigabyte (or growing)
    file costs no more memory than the largest file accepted.

    Args:
        path: A CSV file, or JSONL when its name ends in ``.jsonl`` or ``.ndjson``.
        name: What to call the dataset; the file's name without its extension by default.
        template: As for `parse_dataset`.

    Raises:
        DatasetError: The file is too large, or the first problem in it (`parse_dataset`).
        OSError: The file cannot be opened.

    """
    file = Path(path)
    data = read_limited(file, _too_big)
    fmt: DatasetFormat | None = "jsonl" if is_jsonl_name(file) else None
    return parse_dataset(data, name=name or file.stem, fmt=fmt, template=template)


def read_limited(path: str | os.PathLike[str],
                 too_big: Callable[..., Exception]) -> bytes:
    """A file's bytes, refused by its size before it is read, never more than the limit read.

    Datasets and answer files (`rubric_core.lab.answers`) both read through it.

    Args:
        path: The file.
        too_big: Builds the error for a file over `MAX_DATASET_BYTES`: called with its size,
            and ``at_least=True`` when the file grew past the limit while it was read.

    Raises:
        OSError: The file cannot be opened.

    """
    with Path(path).open("rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > MAX_DATASET_BYTES:
            raise too_big(size)
        data = handle.read(MAX_DATASET_BYTES + 1)  # a file that grew since fstat stops here
    if len(data) > MAX_DATASET_BYTES:
        raise too_big(len(data), at_least=True)
    return data


def is_jsonl_name(path: str | os.PathLike[str]) -> bool:
    """Whether a file's name says JSONL (``.jsonl``, ``.ndjson``); anything else is read as CSV."""
    return Path(path).suffix.lower() in (".jsonl", ".ndjson")


def sniff_format(text: str) -> DatasetFormat:
    """``jsonl`` when the first non-blank line is a JSON object, else ``csv``."""
    # Not splitlines(): a list of every line of a 20 MB file just to read the first one.
    return "jsonl" if text.lstrip().startswith("{") else "csv"


_CSV_ERRORS = {
    "unexpected end of data": ("a quoted cell starts here and is never closed: close it with "
                               "'\"' (a quote inside a quoted cell is written twice: \"\")"),
    "',' expected after '\"'": ("text follows a closing quote: write a quote inside a quoted "
                                "cell twice (\"\"), or quote the whole cell"),
}
"""The csv module's strict errors, said so a person knows what to fix."""


def _allow_long_cells() -> None:
    # The csv module refuses a field over its own limit (128 KiB by default) as unreadable; a
    # long cell must reach the cell check below, which names its row, column and our limit.
    # The limit is process-wide and only ever raised here, to what a whole file can hold.
    if csv.field_size_limit() <= MAX_DATASET_BYTES:
        csv.field_size_limit(MAX_DATASET_BYTES + 1)


def _csv_error(row: int, exc: csv.Error) -> DatasetError:
    reason = _CSV_ERRORS.get(str(exc), f"not readable as CSV ({exc})")
    return DatasetError(f"row {row}: {reason}")


def _records_csv(text: str) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    _allow_long_cells()
    # strict: a quote left open would otherwise swallow every later row into one cell, silently.
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader)
    except StopIteration:
        msg = "the dataset is empty: give a header row (with a 'prompt' column) and rows"
        raise DatasetError(msg) from None
    except csv.Error as exc:
        raise _csv_error(1, exc) from exc
    columns = [name.strip() for name in header]
    check_column_names(columns, 1, by_name=False)
    duplicates = sorted(name for name, count in Counter(columns).items() if count > 1)
    if duplicates:
        msg_0 = f"row 1: column {duplicates[0]!r} appears twice in the header"
        raise DatasetError(msg_0)
    records: list[tuple[int, dict[str, str]]] = []
    # Rows are counted as records, not lines: a spreadsheet shows a cell with line breaks as
    # one row, and so must every message that names a row.
    row = 1
    try:
        for cells in reader:
            row += 1
            if len(cells) > len(columns) and any(c.strip() for c in cells[len(columns):]):
                msg = (f"row {row}: {len(cells)} cells but the header has {len(columns)} "
                       "columns; quote cells that contain commas")
                raise DatasetError(msg)
            if len(records) >= MAX_DATASET_ROWS:
                # Past the limit only count: a megabyte of blank lines would otherwise become
                # a million rows of empty cells (gigabytes) before the limit is checked.
                _too_many_rows(len(records) + 1 + _count_rest(reader))
            values = {name: (cells[i] if i < len(cells) else "") for i, name in
                      enumerate(columns)}
            records.append((row, values))
    except csv.Error as exc:
        raise _csv_error(row + 1, exc) from exc  # the record that failed was not counted yet
    return columns, records


def _count_rest(rows: Iterator[Any]) -> int:
    count = 0
    try:
        for _ in rows:
            count += 1
    except csv.Error:
        pass  # the count is only for the message: "at least" is enough
    return count


def check_column_names(columns: Sequence[str], row: int, *, by_name: bool) -> None:
    """Refuse too many columns, an unnamed one, or a name that cannot be kept as it is.

    A name too long to repeat in every row, holding a control character or a key. Messages
    name the column by its name (JSONL keys) or by its position (a CSV header). Answer sets
    (`rubric_core.lab.answers`) check their headers with it too.

    Raises:
        DatasetError: The first such column.

    """
    if len(columns) > MAX_DATASET_COLUMNS:
        msg = (f"the dataset has {len(columns):,} columns; the limit is "
               f"{MAX_DATASET_COLUMNS:,}. Keep the columns the prompts use and the ones you "
               "want exported.")
        raise DatasetError(msg)
    for index, name in enumerate(columns, start=1):
        where = f"row {row}, column {_shown(name) if by_name else index}"
        if not name.strip():
            msg = f"{where}: the column has no name; give every column a name"
            raise DatasetError(msg)
        if _CONTROL.search(name):
            msg = (f"{where}: the column name holds a control character (a line break, a tab "
                   "or an escape); name it with plain text")
            raise DatasetError(msg)
        if len(name) > MAX_COLUMN_NAME_CHARS:
            # A name is repeated in every stored row and every export row's header.
            msg = (f"{where}: a column name of {len(name):,} characters; the limit is "
                   f"{MAX_COLUMN_NAME_CHARS:,}. Give it a short name.")
            raise DatasetError(msg)
        if redact(name) != name:
            # A name is stored, exported and shown as it is: scrubbing it could merge two
            # columns, so a name holding a key (or what looks like one) is refused instead.
            msg = (f"{where}: the column name holds an API key or a secret (or text shaped "
                   "like one); rename the column")
            raise DatasetError(msg)


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
"""Control characters: in a name printed to a terminal, an escape sequence can rewrite it."""


def has_control_chars(text: str) -> bool:
    """Whether ``text`` holds a control character (not allowed in names that are shown)."""
    return _CONTROL.search(text) is not None


def _check_name(name: str) -> None:
    if len(name) > MAX_DATASET_NAME_CHARS:
        msg = (f"a dataset name of {len(name):,} characters; the limit is "
               f"{MAX_DATASET_NAME_CHARS:,}. Give it a short name.")
        raise DatasetError(msg)
    if _CONTROL.search(name):
        msg = (f"the dataset name {_shown(name)} holds a control character (a line break, a "
               "tab or an escape); name it with plain text")
        raise DatasetError(msg)
    if redact(name) != name:
        # A name finds its versions and is shown as it is: scrubbing could merge two sets.
        msg = ("the dataset name holds an API key or a secret (or text shaped like one); give "
               "it another name")
        raise DatasetError(msg)


def _shown(name: str, limit: int = 40) -> str:
    """A column name for a message: quoted, and cut when long."""
    return repr(name if len(name) <= limit else name[:limit] + "…")


class DuplicateKeyError(ValueError):
    """A JSON object that names one key twice (`unique_keys`)."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for JSON rows: an object naming a key twice is refused.

    ``json.loads`` keeps the last of two equal keys, so the first value would be dropped
    without a word; a CSV header naming a column twice is refused, and so is this.

    Raises:
        DuplicateKeyError: Naming the key.

    """
    value = dict(pairs)
    if len(value) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                break
            seen.add(key)
        msg = f"the key {_shown(key)} appears twice in one object; keep one"
        raise DuplicateKeyError(msg)
    return value


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
            # Numbers are kept as written: "1.10" stays "1.10", and a 5,000-digit id is text,
            # not an int over Python's conversion limit.
            value = json.loads(line, parse_int=str, parse_float=str,
                               object_pairs_hook=unique_keys)
        except DuplicateKeyError as exc:
            msg = f"row {line_no}: {exc}"
            raise DatasetError(msg) from None
        except RecursionError:
            msg = (f"row {line_no}: JSON nested too deep to read; a cell is text or a number, "
                   "not nested JSON")
            raise DatasetError(msg) from None
        except ValueError as exc:
            msg = f"row {line_no}: not a JSON object ({exc.args[0]})"
            raise DatasetError(msg) from exc
        if not isinstance(value, dict):
            msg = f"row {line_no}: a JSON {type(value).__name__}, not an object of columns"
            raise DatasetError(msg)
        row: dict[str, str] = {}
        known = len(columns)
        for key, cell in value.items():
            if isinstance(cell, dict | list):
                msg = (f"row {line_no}, column {_shown(key)}: nested JSON is not a cell; give "
                       "text or a number")
                raise DatasetError(msg)
            row[str(key)] = "" if cell is None else str(cell)
            columns[str(key)] = None
        if len(columns) > known:  # only a line that adds columns can break their limits
            check_column_names(list(columns), line_no, by_name=True)
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
    _check_name(name)
    size = len(data)
    if isinstance(data, str) and MAX_DATASET_BYTES // 4 < size <= MAX_DATASET_BYTES:
        # One to four UTF-8 bytes a character: encode only when that does not decide. A lone
        # surrogate (the store scrubs it) is counted, not a UnicodeEncodeError.
        size = len(data.encode("utf-8", "surrogatepass"))
    if size > MAX_DATASET_BYTES:
        raise _too_big(size, at_least=isinstance(data, str) and size == len(data))
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
            _check_variable(var, columns, "the prompt template")
    rows: list[DatasetRow] = []
    seen: set[str] = set()
    filled = 0
    for line, values in records:
        row = _row(line, values, template, seen, len(rows) + 1)
        filled += len(row.prompt)
        if filled > MAX_DATASET_PROMPT_CHARS:
            msg = (f"row {line}: the prompts filled in so far come to {filled:,} characters; "
                   f"the limit for a dataset is {MAX_DATASET_PROMPT_CHARS:,}. Use fewer or "
                   "shorter variables in the prompt, or split the dataset.")
            raise DatasetError(msg)
        rows.append(row)
    return Dataset(name=name, columns=tuple(columns), rows=tuple(rows))


def _too_big(size: int, *, at_least: bool = False) -> DatasetError:
    shown = f"{size / 1024 / 1024:,.1f} MB" if size >= 1024 * 1024 else f"{size:,} bytes"
    limit = MAX_DATASET_BYTES
    limit_shown = (f"{limit // 1024 // 1024} MB" if limit % (1024 * 1024) == 0
                   else f"{limit:,} bytes")
    return DatasetError(f"the dataset is {'at least ' if at_least else ''}{shown}; the limit is "
                        f"{limit_shown}. Split it into smaller datasets.")


def _check_variable(var: str, columns: Iterable[str], where: str) -> None:
    """Refuse a ``{var}`` that no column of the row can fill."""
    if var == "prompt":
        msg = (f"{where} uses {{prompt}}, but a prompt cannot fill itself: rename the column "
               "that holds the text, or write {{prompt}} for literal braces")
        raise DatasetError(msg)
    names = [c for c in columns if c != "prompt"]
    if var not in names:
        msg = (f"{where} uses {{{var}}}, but there is no column {var!r} to fill it "
               f"(columns that can: {', '.join(names) or 'none'})")
        raise DatasetError(msg)


def _filled_length(template: str, variables: Mapping[str, str]) -> int:
    """``len(fill(template, variables))``, without building it (it may be gigabytes)."""
    length = len(template)
    for match in _VARIABLE.finditer(template):
        name = match.group(1)
        length += -1 if name is None else len(variables[name]) - len(match.group(0))
    return length


def _row(
    line: int, values: Mapping[str, str], template: str | None, seen: set[str], number: int
) -> DatasetRow:
    if not any(str(v).strip() for v in values.values()):
        msg = f"row {line} is empty: delete it or fill it in"
        raise DatasetError(msg)
    for column, cell in values.items():
        if len(cell) > MAX_CELL_CHARS:
            msg = (f"row {line}, column {_shown(column)}: {len(cell):,} characters; the limit "
                   f"for a cell is {MAX_CELL_CHARS:,}. Shorten it, or split it over rows.")
            raise DatasetError(msg)
    # Every column but the prompt itself fills a {variable}: id and rubric too.
    fillable = {k: v for k, v in values.items() if k != "prompt"}
    raw_prompt = (values.get("prompt") or "").strip()
    source = raw_prompt or (template or "").strip()
    if not source:
        msg_0 = f"row {line}, column 'prompt': the prompt is empty"
        raise DatasetError(msg_0)
    where = f"row {line}, column 'prompt'" if raw_prompt else "the prompt template"
    for var in template_variables(source):
        _check_variable(var, fillable, where)
        if not fillable[var].strip():
            msg = f"row {line}, column {var!r}: empty, but the prompt uses {{{var}}}"
            raise DatasetError(msg)
    length = _filled_length(source, fillable)
    if length > MAX_PROMPT_CHARS:
        what = f"row {line}, column 'prompt'" if raw_prompt else f"row {line}, the template"
        msg = (f"{what}: the prompt comes to {length:,} characters once its variables are "
               f"filled in; the limit is {MAX_PROMPT_CHARS:,}. Use a variable fewer times, or "
               "shorten its cell.")
        raise DatasetError(msg)
    row_id = (values.get("id") or "").strip() or str(number)
    if redact(row_id) != row_id:
        # An id names a row in cells, results and exports: scrubbed, two ids could become one.
        msg_0 = (f"row {line}, column 'id': the id holds an API key or a secret (or text "
                 "shaped like one); give the row another id")
        raise DatasetError(msg_0)
    if row_id in seen:
        msg_0 = f"row {line}, column 'id': {row_id!r} is used by an earlier row"
        raise DatasetError(msg_0)
    seen.add(row_id)
    rubric = (values.get("rubric") or "").strip() or None
    variables = {k: v for k, v in values.items() if k not in RESERVED_COLUMNS}
    return DatasetRow(id=row_id, prompt=fill(source, fillable), rubric=rubric,
                      variables=variables)


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
    "MAX_CELL_CHARS", "MAX_COLUMN_NAME_CHARS", "MAX_DATASET_BYTES", "MAX_DATASET_COLUMNS",
    "MAX_DATASET_NAME_CHARS", "MAX_DATASET_PROMPT_CHARS", "MAX_DATASET_ROWS", "MAX_PROMPT_CHARS",
    "Dataset", "DatasetError", "DatasetRow", "fill", "parse_dataset", "preview",
    "read_dataset_file", "rows_from_jsonl", "sniff_format", "template_variables",
)
