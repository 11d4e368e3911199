"""`ExperimentLimits`: an experiment's limits refused or accepted once, whole."""

from __future__ import annotations

import pytest

from rubric_core.experiments import ExperimentLimits
from rubric_core.settings import ExperimentConfig

CONFIGS = [ExperimentConfig(worker_model="demo", grader_model="rules"),
           ExperimentConfig(worker_model="demo", grader_model="rules", label="B")]


@pytest.mark.parametrize(("fields", "message"), [
    pytest.param({"concurrency": 0}, "concurrency must be from 1", id="no_concurrency"),
    pytest.param({"concurrency": True}, "concurrency must be from 1", id="a_bool_is_no_number"),
    pytest.param({"per_model": {"demo": 0}}, "model limit demo=0", id="a_model_limit_of_0"),
    pytest.param({"per_model": {"a\x1fb": 1}}, "no control characters", id="a_control_char"),
    pytest.param({"rate": (0, 60.0)}, "a rate limit is a whole number", id="a_rate_of_0"),
    pytest.param({"model_rates": {"demo": (1, 0.0)}}, "the rate limit of demo",
                 id="a_zero_period"),
])
def test_a_bad_value_is_refused_when_made(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ExperimentLimits(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("fields", "message"), [
    pytest.param({"model_rates": {"openai:x": (1, 60.0)}}, "which no configuration",
                 id="a_model_no_configuration_uses"),
    pytest.param({"per_config": {2: 1}}, "configuration 2, which the experiment does not",
                 id="a_configuration_it_does_not_have"),
    pytest.param({"per_config": {1: 0}}, r"configuration 1 \(B\) must be from 1",
                 id="a_configuration_limit_of_0"),
])
def test_what_depends_on_the_experiment_is_refused_by_check(fields: dict[str, object],
                                                           message: str) -> None:
    limits = ExperimentLimits(**fields)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        limits.check(CONFIGS)


def test_good_limits_become_the_engines_limit_keys() -> None:
    limits = ExperimentLimits(concurrency=8, per_model={"rules": 2},
                              model_rates={"rules": (60, 60.0)}, per_config={1: 1})
    limits.check(CONFIGS)
    assert {k: (v.concurrency, v.rate) for k, v in limits.model_limits().items()} == {
        "rules": (2, (60, 60.0))}
    assert {k: (v.concurrency, v.rate) for k, v in limits.config_limits().items()} == {
        1: (1, None)}
