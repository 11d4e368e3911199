"""Per-configuration limits on the queue engine: a configuration's cells at once and its cells
started per period hold, alone, beside an unlimited configuration, and with a model limit on
the same cells; bad values are refused before anything is stored (library and ``eval``).

Real parts: the throwaway PostgreSQL cluster, the engine, and the loopback server of
`test_engine_limits` that records, per worker model, the cells it serves at once and when each
cell's first request came (each configuration here has a worker model of its own, so the
server tells the configurations apart).
"""

from __future__ import annotations

import contextlib
import io
from typing import TYPE_CHECKING, Any

import pytest
from test_engine_limits import (
    G,
    ModelServer,
    W,
    X,
    _events,
    _experiment,
    _workflows,
    assert_rate_held,
)
from test_experiments import runs_per_thread

from rubric_core.engine import queues as engine_queues
from rubric_core.store import Store

if TYPE_CHECKING:
    from pathlib import Path


@pytest.mark.parametrize(("limits", "w_most", "both_most", "levels"), [
    pytest.param({"per_config": {0: 2, 1: 2}}, 2, 4, 0, id="both_configurations_partitions"),
    pytest.param({"per_config": {0: 2}}, 2, None, 1, id="one_configuration_its_own_queue"),
    pytest.param({"per_config": {0: 1}, "per_model": {G: 3}}, 1, 3, 2,
                 id="with_a_model_limit_on_the_same_cells")])
def test_a_configuration_limit_holds(pg_url: str, limits: dict[str, Any], w_most: int,
                                     both_most: int | None, levels: int) -> None:
    """Configuration 1 (worker w) at most ``w_most`` cells at once; the experiment allows 8."""
    rows = 6
    server = ModelServer(delay_s=0.15)
    with server.fake, Store(pg_url) as store:
        exp_id = _experiment(store, server, rows, (W, X))
        events = list(_events(store, exp_id, concurrency=8, **limits))
        assert events[-1]["status"] == "finished"
        assert {c.status for c in store.experiment_cells(exp_id)} == {"satisfied"}
        assert runs_per_thread(store, exp_id) == [1] * (2 * rows)
        passed = _workflows(engine_queues.gate_prefix(exp_id))
    assert server.most_at_once("w") == w_most
    if both_most is None:
        assert server.most_at_once("w", "x") > w_most  # configuration 2 is not held back
    else:
        assert server.most_at_once("w", "x") == both_most
    # Levels passed per cell: none with partitions; configuration 1's queue (its cells only);
    # the model's and the configuration's queues (configuration 2's cells: the model's only).
    assert len(passed) == {0: 0, 1: rows, 2: 3 * rows}[levels]
    assert len(server.fake.requests) == 2 * rows * 4


def test_a_configuration_rate_limit_holds(pg_url: str) -> None:
    """Configuration 1: at most 2 cells started per 2 s (by DBOS and by the server);
    configuration 2's cells are not held back by it."""
    rows, limit, period = 6, 2, 2.0
    server = ModelServer(delay_s=0.05)
    with server.fake, Store(pg_url) as store:
        exp_id = _experiment(store, server, rows, (W, X))
        events = list(_events(store, exp_id, concurrency=2 * rows,
                              config_rates={0: (limit, period)}))
        assert events[-1]["status"] == "finished"
        assert runs_per_thread(store, exp_id) == [1] * (2 * rows)
        levels = _workflows(engine_queues.gate_prefix(exp_id))
    assert len(levels) == rows  # each cell of configuration 1 passed its queue once
    assert_rate_held(levels, server.firsts["w"], rows, limit, period)
    xs = sorted(server.firsts["x"])
    assert xs[-1] - xs[0] < period  # configuration 2's cells all started within one period


def test_bad_configuration_limits_are_refused(tmp_path: Path) -> None:
    from rubric_core.cli import main
    from rubric_core.datasets import parse_dataset
    from rubric_core.experiments import create_experiment, run_experiment
    from rubric_core.settings import ExperimentConfig

    db = str(tmp_path / "runs.sqlite3")
    config = ["--config", "worker=demo,grader=rules,label=base"]
    for argv, message in (
            (["--config-limit", "1=1"], "no configuration 1 (the experiment has 1, numbered"),
            (["--config-limit", "other=1"], "no configuration has that label"),
            (["--config-limit", "base=x"], "expected K=N with N a whole number"),
            (["--config-limit", "=3"], "expected K=N (K: a configuration's number or label)"),
            (["--config-limit", "0=0"], "the limit of configuration 0 (base) must be from 1"),
            (["--config-limit", "0=2", "--config-limit", "base=3"],
             "a second limit for configuration 0"),
            (["--config-rate-limit", "0=5"], "expected K=N/PERIOD"),
            (["--config-rate-limit", "base=0/min"], "expected K=N/PERIOD"),
            (["--config-rate-limit", "0=5/fortnight"], "expected K=N/PERIOD")):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = main(["eval", "--dataset", "bundled", "--db", db, *config, *argv],
                        out=io.StringIO())
        assert code == 2, (argv, err.getvalue())
        assert message in err.getvalue(), (argv, err.getvalue())
    with Store(db) as store:
        assert store.list_experiments() == []  # refused before anything was stored
        exp = create_experiment(store, parse_dataset("prompt\nq\n", name="q"),
                                [ExperimentConfig(rubric="- c")])
        for kwargs, message in (
                ({"per_config": {1: 2}}, "configuration 1, which the experiment does not have"),
                ({"per_config": {True: 2}}, "configuration True, which the experiment"),
                ({"config_rates": {-1: (1, 1.0)}}, "configuration -1, which the experiment"),
                ({"per_config": {0: 0}}, "must be from 1 to"),
                ({"config_rates": {0: (1, 0.0)}}, "is a whole number of cells"),
                # Attack: a model named like configuration 0's limit key, to take its limits.
                ({"per_model": {"\x1fconfiguration 0": 1}, "per_config": {0: 3}},
                 "a model string has no control characters"),
                ({"model_rates": {"demo\n": (1, 1.0)}},
                 "a model string has no control characters")):
            with pytest.raises(ValueError, match=message):
                list(run_experiment(store, exp.experiment_id, **kwargs))


def test_eval_takes_configuration_limits(tmp_path: Path) -> None:
    """The whole path on SQLite, by number (config_index, from 0) and by label."""
    from rubric_core.cli import main

    db = str(tmp_path / "runs.sqlite3")
    out = io.StringIO()
    code = main(["eval", "--dataset", "bundled", "--db", db, "--concurrency", "8",
                 "--config", "worker=demo,grader=rules,label=a",
                 "--config", "worker=demo,grader=rules,label=b",
                 "--config-limit", "0=2", "--config-rate-limit", "b=1000/s"], out=out)
    assert code == 0, out.getvalue()
    assert "[0] a: 24/24 done, 100% satisfied" in out.getvalue()
    assert "[1] b: 24/24 done, 100% satisfied" in out.getvalue()
