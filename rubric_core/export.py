"""Evaluations to pandas DataFrames, and DataFrames to formula-safe CSV or raw JSON.

One row per (run, iteration, criterion). A ``grader_error`` pass, which has no criteria,
gives a single row whose criterion columns are empty. Columns, in this stable order:

====================  ========  ==============================================================
Column                Type      Meaning
====================  ========  ==============================================================
run_id                str       Id of the run in the run index (empty when exported without one).
run_title             str       The run's human label.
worker_model          str       ``provider:model`` of the worker agent.
grader_model          str       ``provider:model`` of the grader.
run_status            str       The run's final (or current) status, e.g. ``satisfied``.
grading_run_id        str       Shared by every pass of one rubric attempt.
iteration             int       0-based grader pass within its grading run.
criterion_index       Int64     0-based position of the criterion in the grader's answer
                                (rubric order); empty on a ``grader_error`` row.
criterion             str       The criterion as the grader named it; empty on a ``grader_error``.
passed                boolean   Whether the answer met the criterion; empty on a ``grader_error``.
gap                   str       What was missing or wrong; empty when the criterion passed.
result                str       The grader's verdict for the pass (``satisfied``,
                                ``needs_revision``, ``failed`` or ``grader_error``).
status                str       The grading run's status after the pass (adds
                                ``max_iterations_reached``).
unverified            bool      True when the grader left criteria unanswered.
explanation           str       The grader's summary of the pass (the error for ``grader_error``).
duration_s            float     Wall-clock seconds of the pass.
input_tokens          Int64     Grader input tokens, where the provider reports usage.
output_tokens         Int64     Grader output tokens, where the provider reports usage.
agreement             float     With grader repeats: the share of repeats whose verdict on the
                                criterion agrees with the consensus; empty when graded once.
unstable              bool      The grader repeats did not all agree on the criterion.
regressed             bool      The criterion passed on the previous pass and fails on this one.
stalled               bool      The answer is the previous attempt's, unchanged.
answer                str       The text that was graded, on the first row of its iteration only
                                (empty on the iteration's other criterion rows, so a long answer
                                is written once per pass, not once per criterion).
cached_input_tokens   Int64     Of the grader's input tokens, those read from the provider's prompt
                                cache (added after the others were published).
pass_cost_usd         decimal   US dollars of the pass's calls, worker and grader, on the first row
                                of its iteration only (like ``answer``, so a column sum is the
                                run's cost); empty when unknown or exported without prices.
criterion_cost_usd    decimal   The criterion's even share of the pass's grader cost
                                (`rubric_core.costs`); empty when unknown or without prices.
====================  ========  ==============================================================

Costs are computed when exported, from the recorded calls' tokens and the prices given
(``export_rows(..., costs=...)``, `rubric_core.costs.store_costs`): a price override applies to
past runs too. CSV writes them as exact decimals, JSON as numbers.

JSON exports with call traces (``export_rows(..., calls=store)``, `JSON_COLUMNS`) add one
field, ``calls``: on the first row of each pass, the model calls of that pass (the worker's
answer and the grader's calls, `rubric_core.types.ModelCallRecord`); the calls of a pass that
has no evaluation (a worker call that raised) go on the run's last row, each naming its own
``iteration``. The CSV has no such column.

Every text cell is scrubbed of secrets first (`rubric_core.redact`), and :func:`to_csv` and
:func:`to_json` scrub any frame they are given again (:func:`scrub_frame`). `write_csv` and
`write_json` stream rows to a file as they are produced (memory stays flat in the number of
rows); the DataFrame functions are for display and analysis.

Spreadsheet safety (CSV only): a text cell that starts with ``=``, ``+``, ``-``, ``@``, their
full-width forms ``＝ ＋ － ＠`` (which spreadsheets fold to ASCII), a tab or a carriage return
could be run as a formula by Excel, LibreOffice or Google Sheets, so
:func:`to_csv` prefixes it with a single quote ``'``. Text that already starts with ``'`` gets
one too, so the escape is unambiguous: :func:`restore_cell` (or :func:`restore_frame`) removes
exactly one leading quote and gives back the original text. Numeric and boolean columns are
never touched. :func:`to_json` writes raw values: JSON is not opened by spreadsheets.
"""

from __future__ import annotations

import csv
import difflib
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal, TextIO

import pandas as pd

from rubric_core.redact import redact, redact_data, secret_values
from rubric_core.rubric import normalize_name, parse_criteria
from rubric_core.store import RunRecord, Store

if TYPE_CHECKING:
    from rubric_core.costs import RunCost
    from rubric_core.types import ModelCallRecord, RubricEvaluation

EXPORT_COLUMNS: tuple[str, ...] = (
    "run_id", "run_title", "worker_model", "grader_model", "run_status", "grading_run_id",
    "iteration", "criterion_index", "criterion", "passed", "gap", "result", "status",
    "unverified", "explanation", "duration_s", "input_tokens", "output_tokens", "agreement",
    "unstable", "regressed", "stalled", "answer", "cached_input_tokens", "pass_cost_usd",
    "criterion_cost_usd",
)
"""Export columns in their documented, stable order (see the module docstring)."""

JSON_COLUMNS: tuple[str, ...] = (*EXPORT_COLUMNS, "calls")
"""The JSON export's fields when it carries call traces (``export_rows(..., calls=...)``)."""

FORMULA_PREFIXES: tuple[str, ...] = ("=", "+", "-", "@", "＝", "＋", "－", "＠", "\t", "\r")
"""Leading characters that make a spreadsheet treat a cell as a formula."""

ESCAPE = "'"
"""Prefix :func:`to_csv` adds to risky text cells (and to text already starting with it)."""

DiffOp = Literal["equal", "insert", "delete"]
"""One word-diff operation."""

_DTYPES: dict[str, str] = {
    "iteration": "int64", "criterion_index": "Int64", "passed": "boolean", "unverified": "bool",
    "duration_s": "float64", "input_tokens": "Int64", "output_tokens": "Int64",
    "agreement": "float64", "unstable": "bool", "regressed": "bool", "stalled": "bool",
    "cached_input_tokens": "Int64", "pass_cost_usd": "float64", "criterion_cost_usd": "float64",
}
_ESCAPED_PREFIXES = (*FORMULA_PREFIXES, ESCAPE)
_RUNS_PER_READ = 100  # runs whose evaluations are read from the store at a time
_TOKENS = re.compile(r"\s+|\S+")

RunLike = RunRecord | Mapping[str, Any]
"""A run from the index, or a mapping with the same field names."""

CostLookup = Callable[[Any], "RunCost | None"]
"""A run (a `RunLike`) → its cost, or None when not priced (`rubric_core.costs.store_costs`)."""


def _run_columns(run: RunLike | None, text: Callable[[Any], Any]) -> tuple[Any, ...]:
    if run is None:
        return (None, None, None, None, None)
    get = run.get if isinstance(run, Mapping) else lambda key: getattr(run, key, None)
    return tuple(text(get(key)) for key in
                 ("run_id", "title", "worker_model", "grader_model", "status"))


def pass_number(evaluation: Mapping[str, Any]) -> int:
    """The pass as people count it (1-based): the seed's 0-based ``iteration`` plus one.

    Everything shown to people (the app, the CLI) says "pass k" with this number; only the
    evaluations themselves and the exports keep the seed's 0-based ``iteration``.
    """
    return int(evaluation.get("iteration") or 0) + 1


def criterion_rows(evaluation: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An evaluation's criteria flattened to rows, the one way every table and export does it.

    Each row is ``{"index", "criterion", "passed", "gap", "agreement", "unstable",
    "regressed"}`` in rubric order; ``gap`` is None when the criterion passed, ``agreement``
    when the answer was graded once. A pass without criteria (``grader_error``) gives one row
    whose fields are None (False for the flags), so it still shows up.
    """
    criteria = evaluation.get("criteria") or []
    if not criteria:
        return [{"index": None, "criterion": None, "passed": None, "gap": None,
                 "agreement": None, "unstable": False, "regressed": False}]
    unstable = set(evaluation.get("unstable") or ())
    regressed = set(evaluation.get("regressed") or ())
    return [
        {"index": index, "criterion": c.get("name"), "passed": c.get("passed"),
         "gap": None if c.get("passed") else c.get("gap"), "agreement": c.get("agreement"),
         "unstable": c.get("name") in unstable, "regressed": c.get("name") in regressed}
        for index, c in enumerate(criteria)
    ]


def _rows(evaluations: Iterable[RubricEvaluation], run: RunLike | None,
          cost: RunCost | None = None) -> Iterator[tuple]:
    secrets = secret_values()  # read once per run, not once per cell
    shares = len(cost.criteria) if cost is not None else 0

    def _text(value: Any) -> Any:
        return redact(value, secrets=secrets) if isinstance(value, str) else value

    head = _run_columns(run, _text)
    for ev in evaluations:
        cached = ev.get("cached_input_tokens")
        start = (*head, _text(ev.get("grading_run_id")), ev.get("iteration"))
        middle = (
            ev.get("result"), ev.get("status"), bool(ev.get("unverified", False)),
            _text(ev.get("explanation")), ev.get("duration_s"), ev.get("input_tokens"),
            ev.get("output_tokens"),
        )
        answer = _text(ev.get("answer"))
        stalled = bool(ev.get("stalled", False))
        spent = None if cost is None else cost.pass_cost(int(ev.get("iteration") or 0))
        pass_cost = None if spent is None else spent.total
        share = (spent.grader / shares if spent is not None and spent.grader is not None
                 and shares else None)
        for n, row in enumerate(criterion_rows(ev)):
            yield (*start, row["index"], _text(row["criterion"]), row["passed"],
                   _text(row["gap"]), *middle, row["agreement"], row["unstable"],
                   row["regressed"], stalled, answer if n == 0 else None, cached,
                   pass_cost if n == 0 else None, share if row["index"] is not None else None)


def _rows_with_calls(evaluations: Sequence[RubricEvaluation], run: RunLike | None,
                     calls: Sequence[ModelCallRecord], cost: RunCost | None) -> Iterator[tuple]:
    """`_rows` with the `JSON_COLUMNS` ``calls`` field (see the module docstring)."""
    pending = redact_data(list(calls))
    rows = list(_rows(evaluations, run, cost))
    index = 0
    for ev in evaluations:
        # A pass's calls: its grader calls, and the worker's answer it judged (a worker call
        # names the grading run of the grader call before it, None before the first pass).
        mine = [c for c in pending if c["iteration"] == ev.get("iteration") and (
            c["role"] == "worker" or c.get("grading_run_id") == ev.get("grading_run_id"))]
        pending = [c for c in pending if c not in mine]
        for n in range(max(1, len(ev.get("criteria") or []))):
            last = index == len(rows) - 1
            row_calls = mine if n == 0 else None
            if last and pending:  # calls of a pass with no evaluation close the run
                row_calls = [*(row_calls or []), *pending]
            yield (*rows[index], row_calls)
            index += 1


def _pairs(
    source: Store | Iterable[tuple[RunLike, Sequence[RubricEvaluation]]],
) -> Iterator[tuple[RunLike, Sequence[RubricEvaluation]]]:
    """(run, evaluations) in run-creation order; a Store is read one run at a time."""
    if isinstance(source, Store):
        runs = source.list_runs(limit=None)[::-1]
        for start in range(0, len(runs), _RUNS_PER_READ):
            chunk = runs[start : start + _RUNS_PER_READ]
            by_run = source.evaluations_for_runs(r.run_id for r in chunk)
            for record in chunk:
                yield record, by_run[record.run_id]
    else:
        yield from sorted(source, key=lambda pair: _run_columns_created(pair[0]))


def export_rows(
    source: Store | Iterable[tuple[RunLike, Sequence[RubricEvaluation]]],
    *,
    calls: Store | Mapping[str, Sequence[ModelCallRecord]] | None = None,
    costs: CostLookup | None = None,
) -> Iterator[tuple]:
    """Rows in :data:`EXPORT_COLUMNS` order for many runs, produced lazily.

    Args:
        source: A :class:`~rubric_core.store.Store` (every run in it), or ``(run,
            evaluations)`` pairs.
        calls: Also give each row the `JSON_COLUMNS` ``calls`` field (for JSON only): the
            runs' call traces from this store, or by run id.
        costs: Fills ``pass_cost_usd`` and ``criterion_cost_usd``
            (`rubric_core.costs.store_costs`); empty without.

    """
    for run, evaluations in _pairs(source):
        cost = costs(run) if costs is not None else None
        if calls is None:
            yield from _rows(evaluations, run, cost)
            continue
        run_id = (run.get("run_id") if isinstance(run, Mapping)
                  else getattr(run, "run_id", None)) or ""
        traced = calls.calls(run_id) if isinstance(calls, Store) else calls.get(run_id, [])
        yield from _rows_with_calls(evaluations, run, traced, cost)


def _csv_cell(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(_ESCAPED_PREFIXES):
        return ESCAPE + value
    return value


def write_csv(rows: Iterable[Sequence[Any]], out: TextIO,
              columns: Sequence[str] = EXPORT_COLUMNS) -> int:
    """Stream rows to ``out`` as formula-safe CSV (header first, CRLF line ends).

    Open a file with ``newline=""``. Produces the same text as :func:`to_csv` of the same rows.

    Returns:
        The number of data rows written.

    """
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(columns)
    count = 0
    for row in rows:
        writer.writerow([_csv_cell(value) for value in row])
        count += 1
    return count


def write_json(rows: Iterable[Sequence[Any]], out: TextIO,
               columns: Sequence[str] = EXPORT_COLUMNS) -> int:
    """Stream rows to ``out`` as a JSON array of objects (raw values, like :func:`to_json`).

    Returns:
        The number of rows written.

    """
    out.write("[")
    count = 0
    for row in rows:
        out.write(("," if count else "") + json.dumps(dict(zip(columns, row, strict=True)),
                                                      ensure_ascii=False, default=_json_value))
        count += 1
    out.write("]")
    return count


def _json_value(value: Any) -> Any:
    """Dollars (`Decimal`) as JSON numbers; anything else JSON cannot write is refused."""
    if isinstance(value, Decimal):
        return float(value)
    msg = f"cannot write {type(value).__name__} as JSON"
    raise TypeError(msg)


def _frame(rows: Iterable[tuple]) -> pd.DataFrame:
    df = pd.DataFrame.from_records(list(rows), columns=list(EXPORT_COLUMNS))
    return df.astype(_DTYPES)


def evaluations_frame(
    evaluations: Iterable[RubricEvaluation], *, run: RunLike | None = None
) -> pd.DataFrame:
    """One run's evaluations as a table, one row per iteration × criterion.

    Args:
        evaluations: Evaluations in the order they happened.
        run: The run they belong to, for the ``run_*`` and model columns; empty when None.

    Returns:
        A DataFrame with :data:`EXPORT_COLUMNS`.

    """
    return _frame(_rows(evaluations, run))


def runs_frame(
    source: Store | Iterable[tuple[RunLike, Sequence[RubricEvaluation]]],
) -> pd.DataFrame:
    """Many runs' evaluations as one table, ordered by run creation, then as recorded.

    Args:
        source: A :class:`~rubric_core.store.Store` (every run in it), or ``(run,
            evaluations)`` pairs.

    Returns:
        A DataFrame with :data:`EXPORT_COLUMNS`.

    """
    return _frame(export_rows(source))


def _run_columns_created(run: RunLike) -> str:
    value = run.get("created_at") if isinstance(run, Mapping) else run.created_at
    return str(value or "")


def heatmap_frame(
    evaluations: Iterable[RubricEvaluation],
    *,
    grading_run_id: str | None = None,
    rubric: str | None = None,
) -> pd.DataFrame:
    """Pass/fail of each criterion at each iteration of one grading run.

    Args:
        evaluations: Evaluations, possibly of several grading runs.
        grading_run_id: The grading run to show; the last one in ``evaluations`` when None.
        rubric: When given, rows follow its criteria (even those never graded); otherwise
            rows follow the order in which the grader first named each criterion.

    Returns:
        Rows indexed by criterion, columns by iteration; cells True, False, or None where a
        criterion was not graded (a ``grader_error`` pass gives a column of None).

    """
    evs = list(evaluations)
    if grading_run_id is None and evs:
        grading_run_id = evs[-1].get("grading_run_id")
    evs = [ev for ev in evs if ev.get("grading_run_id") == grading_run_id]
    names: dict[str, str] = {normalize_name(c): c for c in parse_criteria(rubric or "")}
    cells: dict[tuple[str, int], bool] = {}
    for ev in evs:
        for c in ev.get("criteria") or []:
            key = normalize_name(c["name"])
            names.setdefault(key, c["name"])
            cells[key, ev["iteration"]] = bool(c["passed"])
    iterations = sorted({ev["iteration"] for ev in evs})
    data = [[cells.get((key, it)) for it in iterations] for key in names]
    return pd.DataFrame(
        data,
        index=pd.Index(list(names.values()), name="criterion", dtype=object),
        columns=pd.Index(iterations, name="iteration", dtype="int64"),
        dtype=object,
    )


def _is_text(series: pd.Series) -> bool:
    return series.dtype == object or isinstance(series.dtype, pd.StringDtype)


def scrub_frame(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``df`` whose text cells are scrubbed of secrets (`rubric_core.redact`).

    :func:`to_csv` and :func:`to_json` call it, so a frame built from stored text the export
    rows did not pass through (people's labels, a database written by an older version) is
    scrubbed like them. Each distinct text is scrubbed once: a column repeats its run, model
    and criterion names on every row.
    """
    secrets = secret_values()  # read once per frame, not once per cell
    out = df
    for col in df.columns:
        series = df[col]
        if not _is_text(series):
            continue
        distinct: Iterable[Any]
        try:
            distinct = pd.unique(series.dropna())  # hashed in C: far fewer texts than cells
        except TypeError:  # an object column holding lists or dicts
            distinct = list({v: None for v in series if isinstance(v, str)})
        changed: dict[str, str] = {}
        for value in distinct:
            if isinstance(value, str):
                clean = redact(value, secrets=secrets)
                if clean != value:
                    changed[value] = clean
        if not changed:
            continue
        if out is df:
            out = df.copy(deep=False)
        out[col] = pd.Series([changed.get(v, v) if isinstance(v, str) else v for v in series],
                             index=series.index, dtype=series.dtype, name=col)
    return out


def neutralize_frame(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``df`` whose risky text cells carry the ``'`` escape (see module docstring)."""
    out = df
    for col in df.columns:
        series = df[col]
        if not _is_text(series):
            continue
        try:
            mask = series.str.startswith(_ESCAPED_PREFIXES, na=False)
        except AttributeError:  # an object column holding no strings at all
            continue
        if not mask.any():
            continue
        if out is df:
            out = df.copy(deep=False)
        fixed = series.copy()
        fixed[mask] = ESCAPE + series[mask]
        out[col] = fixed
    return out


def restore_cell(value: Any) -> Any:
    """Undo :func:`to_csv`'s escape on one cell read back from its CSV.

    Args:
        value: A cell value; only strings are changed.

    Returns:
        The text without the one leading ``'`` the export added; other values unchanged.

    """
    if isinstance(value, str) and value.startswith(ESCAPE):
        return value[1:]
    return value


def restore_frame(df: pd.DataFrame, columns: Iterable[str] | None = None) -> pd.DataFrame:
    """Undo :func:`to_csv`'s escape on every text column of a frame read back from its CSV.

    Args:
        df: The frame, e.g. from ``pd.read_csv(..., dtype=str, keep_default_na=False)``.
        columns: Columns to restore; every text column when None.

    Returns:
        A copy with the escape removed.

    """
    out = df.copy(deep=False)
    for col in df.columns if columns is None else columns:
        series = df[col]
        if not _is_text(series):
            continue
        try:
            mask = series.str.startswith(ESCAPE, na=False)
        except AttributeError:
            continue
        if mask.any():
            fixed = series.copy()
            fixed[mask] = series[mask].str.slice(1)
            out[col] = fixed
    return out


def to_csv(df: pd.DataFrame) -> str:
    """CSV text with secrets scrubbed (:func:`scrub_frame`) and formula injection neutralised.

    Rows end with CRLF (RFC 4180) so that a carriage return inside a cell is always quoted;
    write the text to a file opened with ``newline=""``.

    Args:
        df: Any frame, typically from :func:`evaluations_frame` or :func:`runs_frame`.

    Returns:
        The CSV, header included, index excluded.

    """
    return neutralize_frame(scrub_frame(df)).to_csv(index=False, lineterminator="\r\n")


def to_json(df: pd.DataFrame) -> str:
    """JSON text, one object per row (``records``), values unescaped (secrets scrubbed).

    Args:
        df: Any frame.

    Returns:
        The JSON; missing values are ``null``, floats keep 15 significant digits.

    """
    return scrub_frame(df).to_json(orient="records", force_ascii=False, double_precision=15)


def iteration_diff(a: str, b: str) -> list[tuple[DiffOp, str]]:
    """Word-level differences between two answers.

    Whitespace runs are tokens of their own, so joining the ``equal`` and ``delete`` texts
    gives back ``a`` and joining the ``equal`` and ``insert`` texts gives back ``b``.

    Args:
        a: The earlier text.
        b: The later text.

    Returns:
        ``(op, text)`` pairs in reading order; a replacement is a delete then an insert.

    """
    ta, tb = _TOKENS.findall(a), _TOKENS.findall(b)
    ops: list[tuple[DiffOp, str]] = []

    def push(op: DiffOp, tokens: list[str]) -> None:
        if not tokens:
            return
        text = "".join(tokens)
        if ops and ops[-1][0] == op:
            ops[-1] = (op, ops[-1][1] + text)
        else:
            ops.append((op, text))

    # autojunk would treat frequent tokens such as " " as junk in long texts.
    matcher = difflib.SequenceMatcher(None, ta, tb, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            push("equal", ta[i1:i2])
        else:
            push("delete", ta[i1:i2])
            push("insert", tb[j1:j2])
    return ops


def criteria_changes(
    ev_a: RubricEvaluation, ev_b: RubricEvaluation
) -> dict[str, list[str]]:
    """How each criterion moved from one evaluation to the next.

    Criteria are matched by name, ignoring case, markers and punctuation; a criterion found
    in only one of the two is left out.

    Args:
        ev_a: The earlier evaluation.
        ev_b: The later evaluation.

    Returns:
        ``fixed``, ``regressed``, ``still_failing`` and ``still_passing``: criterion names as
        ``ev_b`` gives them, in its order.

    """
    before = {normalize_name(c["name"]): bool(c["passed"]) for c in ev_a.get("criteria") or []}
    out: dict[str, list[str]] = {
        "fixed": [], "regressed": [], "still_failing": [], "still_passing": []
    }
    for c in ev_b.get("criteria") or []:
        was = before.get(normalize_name(c["name"]))
        if was is None:
            continue
        now = bool(c["passed"])
        key = {
            (False, True): "fixed", (True, False): "regressed",
            (False, False): "still_failing", (True, True): "still_passing",
        }[was, now]
        out[key].append(c["name"])
    return out
