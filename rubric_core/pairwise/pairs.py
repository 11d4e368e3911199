"""Reading a pairs file: CSV or JSONL with ``id``, ``prompt``, ``a``, ``b``, optional ``rubric``.

The whole file is checked before any pair is judged; the first problem is refused with its row
(counted as a spreadsheet counts them: the header is row 1; a JSONL file's rows are its lines)
and column named, and nothing partial is returned. The limits are the datasets' (size, rows,
cell length: `rubric_core.datasets`). Cells are text: a JSONL number is kept as written.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING

from rubric_core.datasets import (
    MAX_CELL_CHARS,
    MAX_DATASET_BYTES,
    MAX_DATASET_ROWS,
    DatasetError,
    DuplicateKeyError,
    is_jsonl_name,
    read_limited,
    sniff_format,
    unique_keys,
)
from rubric_core.pairwise.types import Pair

if TYPE_CHECKING:
    import os
    from collections.abc import Iterator

COLUMNS = ("id", "prompt", "a", "b", "rubric")
"""A pairs file's columns; ``rubric`` may be left out (or empty): the judgement's rubric."""

REQUIRED = ("id", "prompt", "a", "b")
"""The columns every pairs file has."""


class PairsError(DatasetError):
    """A pairs file that cannot be judged; the message names the row (and column)."""


def _too_big(size: int, *, at_least: bool = False) -> PairsError:
    shown = f"{'at least ' if at_least else ''}{size / 1024 / 1024:,.1f} MB"
    return PairsError(f"the pairs file is {shown}; the limit is "
                      f"{MAX_DATASET_BYTES // 1024 // 1024} MB. Split it into smaller files.")


def read_pairs_file(path: str | os.PathLike[str]) -> list[Pair]:
    """Read and check a pairs file (JSONL when its name ends in ``.jsonl`` or ``.ndjson``).

    Raises:
        PairsError: The file is too large, or the first problem in it (`parse_pairs`).
        OSError: The file cannot be opened.

    """
    file = Path(path)
    return parse_pairs(read_limited(file, _too_big), fmt="jsonl" if is_jsonl_name(file) else None)


def parse_pairs(data: bytes | str, *, fmt: str | None = None) -> list[Pair]:
    """Read and check a whole pairs file; nothing partial is ever returned.

    Args:
        data: The file's bytes (UTF-8) or text.
        fmt: ``csv`` or ``jsonl``; sniffed from the text when None.

    Raises:
        PairsError: The first problem, naming its row and column.

    """
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data[: exc.start].count(b"\n") + 1
            msg = f"row {line}: the file is not UTF-8 text (byte {exc.start}); save it as UTF-8"
            raise PairsError(msg) from exc
    else:
        text = data
    text = text.lstrip("\ufeff")
    if len(text) > MAX_DATASET_BYTES:
        raise _too_big(len(text))
    fmt = fmt or sniff_format(text)
    records = _csv(text) if fmt == "csv" else _jsonl(text)
    pairs: list[Pair] = []
    seen: dict[str, int] = {}
    for row, values in records:
        if len(pairs) >= MAX_DATASET_ROWS:
            msg = f"row {row}: more than {MAX_DATASET_ROWS:,} pairs; split the file"
            raise PairsError(msg)
        pairs.append(_pair(row, values, seen))
    if not pairs:
        msg = "the pairs file has no rows: add a header (id, prompt, a, b) and at least one pair"
        raise PairsError(msg)
    return pairs


def _check_columns(columns: list[str], row: int) -> None:
    for index, name in enumerate(columns, 1):
        if name not in COLUMNS:
            msg = (f"row {row}, column {index}: unknown column {name[:40]!r}; a pairs file has "
                   "id, prompt, a, b and an optional rubric")
            raise PairsError(msg)
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        msg = (f"row {row}: no {', '.join(repr(c) for c in missing)} column; a pairs file has "
               "id, prompt, a, b and an optional rubric")
        raise PairsError(msg)


def _pair(row: int, values: dict[str, str], seen: dict[str, int]) -> Pair:
    for column, value in values.items():
        if len(value) > MAX_CELL_CHARS:
            msg = (f"row {row}, column {column!r}: {len(value):,} characters; a cell holds at "
                   f"most {MAX_CELL_CHARS:,}")
            raise PairsError(msg)
    pair_id = values.get("id", "").strip()
    for column in ("id", "prompt"):
        if not values.get(column, "").strip():
            msg = f"row {row}, column {column!r}: empty; every pair needs an id and a prompt"
            raise PairsError(msg)
    if pair_id in seen:
        msg = f"row {row}, column 'id': {pair_id[:40]!r} is also the id of row {seen[pair_id]}"
        raise PairsError(msg)
    seen[pair_id] = row
    return Pair(pair_id, values["prompt"], values.get("a", ""), values.get("b", ""),
                values.get("rubric", "") or "")


def _csv(text: str) -> Iterator[tuple[int, dict[str, str]]]:
    if csv.field_size_limit() <= MAX_DATASET_BYTES:  # a long cell reaches our own check
        csv.field_size_limit(MAX_DATASET_BYTES + 1)
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    row = 1
    try:
        header = next(reader, None)
        if header is None:
            msg = "the pairs file is empty: give a header row (id, prompt, a, b) and rows"
            raise PairsError(msg)
        columns = [c.strip() for c in header]
        _check_columns(columns, 1)
        if len(set(columns)) < len(columns):
            twice = next(c for c in columns if columns.count(c) > 1)
            msg = f"row 1: column {twice!r} appears twice in the header"
            raise PairsError(msg)
        for cells in reader:
            row += 1
            if len(cells) > len(columns) and any(c.strip() for c in cells[len(columns):]):
                msg = (f"row {row}: {len(cells)} cells but the header has {len(columns)} "
                       "columns; quote cells that contain commas")
                raise PairsError(msg)
            if not any(c.strip() for c in cells):
                continue  # a blank line between rows
            yield row, {c: (cells[i] if i < len(cells) else "") for i, c in enumerate(columns)}
    except csv.Error as exc:
        msg = (f"row {row + 1}: not readable as CSV ({exc}); a quote inside a quoted cell is "
               "written twice (\"\"), and a quoted cell must be closed")
        raise PairsError(msg) from exc


def _jsonl(text: str) -> Iterator[tuple[int, dict[str, str]]]:
    for line_no, line in enumerate(io.StringIO(text, newline=None), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line, parse_int=str, parse_float=str,
                               object_pairs_hook=unique_keys)
        except DuplicateKeyError as exc:
            msg = f"row {line_no}: {exc}"
            raise PairsError(msg) from None
        except (ValueError, RecursionError) as exc:
            msg = f"row {line_no}: not a JSON object ({type(exc).__name__})"
            raise PairsError(msg) from None
        if not isinstance(value, dict):
            msg = f"row {line_no}: a JSON {type(value).__name__}, not an object of columns"
            raise PairsError(msg)
        columns = [str(k) for k in value]
        _check_columns(columns, line_no)
        cells: dict[str, str] = {}
        for key, cell in value.items():
            if isinstance(cell, dict | list):
                msg = f"row {line_no}, column {key!r}: nested JSON is not a cell; give text"
                raise PairsError(msg)
            cells[str(key)] = "" if cell is None else str(cell)
        yield line_no, cells


__all__ = ["COLUMNS", "REQUIRED", "PairsError", "parse_pairs", "read_pairs_file"]
