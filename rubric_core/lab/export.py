"""A re-grade's results as rows: one per configuration × answer × repeat × criterion, streamed.

`regrade_rows` reads the results a configuration at a time and yields rows in
:data:`REGRADE_COLUMNS` order, for `rubric_core.export.write_csv` / `write_json` (formula-safe,
streamed). A ``grader_error`` grading is one row with an empty criterion and its error. The
people's verdicts on the row's criterion are a JSON object ``{labeller: "pass" | "fail"}``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rubric_core.lab.results import people_verdicts

if TYPE_CHECKING:
    from collections.abc import Iterator

    from rubric_core.store import Store

REGRADE_COLUMNS: tuple[str, ...] = (
    "job_id", "config_index", "config", "rubric_name", "rubric_version", "grader_model",
    "item_id", "repeat_index", "result", "criterion", "passed", "gap", "people", "error",
    "input_tokens", "output_tokens", "duration_s", "cached_input_tokens",
)
"""Columns of `regrade_rows`, in order (a later column is appended, never inserted:
``cached_input_tokens``, of ``input_tokens`` those read from the provider's prompt cache, empty
for gradings recorded before it was kept)."""


def regrade_rows(store: Store, job_id: str) -> Iterator[tuple[Any, ...]]:
    """Every grading of a re-grade as rows (see the module docstring).

    Raises:
        KeyError: No such re-grade.

    """
    job = store.get_regrade_job(job_id)
    if job is None:
        msg = f"no re-grade {job_id!r} in this database"
        raise KeyError(msg)
    people = people_verdicts(store.answer_labels(job.set_name, job.set_version))
    for index, config in enumerate(job.configurations):
        head = (job.job_id, index, config.display_label(), config.rubric_name or "",
                config.rubric_version, config.grader_model)
        for result in store.regrade_results(job_id, config_index=index):
            tail = (result.error or "", result.input_tokens, result.output_tokens,
                    result.duration_s, result.cached_input_tokens)
            if not result.criteria:
                yield (*head, result.item_id, result.repeat_index, result.result, "", None, "",
                       "", *tail)
                continue
            for verdict in result.criteria:
                labelled = people.get(config.labelled_as(verdict["name"]), {}).get(
                    result.item_id, {})
                shown = json.dumps({k: "pass" if v else "fail" for k, v in labelled.items()},
                                   ensure_ascii=False) if labelled else ""
                yield (*head, result.item_id, result.repeat_index, result.result,
                       verdict["name"], bool(verdict["passed"]), verdict.get("gap", ""),
                       shown, *tail)
