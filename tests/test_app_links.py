"""`rubric_core.app_support.links`: which link a script run follows, and what a link's id names."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest

from rubric_core.app_support.links import (
    OPEN_EXPERIMENT,
    OPEN_RUN,
    find_experiment,
    find_run,
    follow_link,
    show_link,
)
from rubric_core.datasets import parse_dataset
from rubric_core.experiments import create_experiment
from rubric_core.settings import ExperimentConfig, RunSettings

if TYPE_CHECKING:
    from rubric_core.store import Store

RUN = "ab" * 16
OTHER = "cd" * 16


def test_a_new_session_follows_the_link_once_and_not_the_one_its_page_wrote() -> None:
    state: dict[str, Any] = {}
    params = {"run": RUN[:8]}
    link = follow_link(state, params)
    assert link is not None and (link.page, link.target_id) == ("pages/review.py", RUN[:8])
    assert state[OPEN_RUN] == RUN[:8]
    del state[OPEN_RUN]  # the page took it, and shows the whole id
    show_link(state, params, "run", RUN)
    assert params == {"run": RUN}
    assert follow_link(state, params) is None  # what the page wrote is no new link
    assert OPEN_RUN not in state


def test_a_live_session_follows_a_url_that_changed_under_it() -> None:
    # The browser's Back: the URL names the run shown before, the page shows another.
    state: dict[str, Any] = {}
    params = {"run": RUN}
    show_link(state, params, "run", OTHER)
    params["run"] = RUN
    link = follow_link(state, params)
    assert link is not None and state[OPEN_RUN] == RUN
    params = {"experiment": OTHER}
    link = follow_link(state, params)
    assert link is not None and link.page == "pages/experiments.py"
    assert state[OPEN_EXPERIMENT] == OTHER


@pytest.mark.parametrize("value", [
    pytest.param("", id="empty"), pytest.param("abc", id="too_short"),
    pytest.param("a" * 33, id="too_long"), pytest.param("../x", id="traversal")])
def test_a_value_that_is_no_id_is_no_link(value: str) -> None:
    state: dict[str, Any] = {}
    assert follow_link(state, {"run": value, "experiment": value}) is None
    assert OPEN_RUN not in state and OPEN_EXPERIMENT not in state


def _run(store: Store, title: str) -> tuple[str, str]:
    record = store.create_run(RunSettings(prompt=title, rubric="- c", title=title),
                              thread_id=uuid.uuid4().hex)  # as the CLI's runs: not the run id
    assert record.thread_id != record.run_id
    return record.run_id, record.thread_id


def test_a_run_is_found_by_its_id_a_prefix_or_its_thread(store: Store) -> None:
    run_id, thread_id = _run(store, "first")
    _run(store, "second")
    for given in (run_id, run_id[:8], thread_id):
        assert find_run(store, given).target_id == run_id, given
    missing = find_run(store, "0123abcd")
    assert missing.target_id is None
    assert missing.problem is not None and "?run=0123abcd" in missing.problem
    assert "no run '0123abcd' in this database" in missing.problem


def test_an_experiment_is_found_by_its_id_or_a_prefix(store: Store) -> None:
    dataset = parse_dataset("prompt\nq\n", name="q")
    older = create_experiment(store, dataset, [ExperimentConfig(rubric="- c")]).experiment_id
    create_experiment(store, dataset, [ExperimentConfig(rubric="- c")])
    assert find_experiment(store, older).target_id == older
    assert find_experiment(store, older[:8]).target_id == older
    missing = find_experiment(store, "0123abcd")
    assert missing.target_id is None and "?experiment=0123abcd" in (missing.problem or "")
