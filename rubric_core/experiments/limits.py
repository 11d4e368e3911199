"""An experiment's limits, parsed and checked once: `ExperimentLimits`.

Cells at once (``concurrency``), cells started per period (``rate``), and per model string and
per configuration index the same two; every limit holds over every process running the
experiment (`rubric_core.engine.queues.routes` says how). The CLI (``eval``) and the app build
one and pass it whole to `rubric_core.experiments.run_experiment`. A bad value is refused when
the value is made; what depends on the experiment (a model no configuration uses, a
configuration it does not have) by `ExperimentLimits.check`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, TypeVar

from rubric_core.types import DEFAULT_CONCURRENCY, MAX_CONCURRENCY

if TYPE_CHECKING:
    from collections.abc import Hashable, Mapping, Sequence

    from rubric_core.engine.queues import ModelLimit
    from rubric_core.settings import ExperimentConfig

K = TypeVar("K", bound="Hashable")

Rate = tuple[int, float]
"""At most ``(cells, seconds)``: cells started per period."""


def _whole(value: object, low: int = 1, high: int = MAX_CONCURRENCY) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and low <= value <= high


def check_concurrency(concurrency: int) -> None:
    """Refuse a concurrency out of 1 … `MAX_CONCURRENCY` (an experiment's or a re-grade's)."""
    if not _whole(concurrency):
        msg = f"concurrency must be from 1 to {MAX_CONCURRENCY}, got {concurrency}"
        raise ValueError(msg)


def _check_rate(rate: Rate, what: str) -> None:
    limit, period = rate
    if not _whole(limit, high=2**63) or not isinstance(period, int | float) or not period > 0:
        msg = (f"{what} is a whole number of cells (at least 1) per a positive number "
               f"of seconds, got {limit!r} per {period!r}")
        raise ValueError(msg)


def _check_limited_model(model: str) -> None:
    """Refuse a limited model string with a control character.

    Limit keys of models and configurations share one namespace (a configuration's starts with
    one), so such a model could take a configuration's limits.
    """
    if not isinstance(model, str) or any(ord(ch) < 32 or ord(ch) == 127 for ch in model):
        msg = f"a limit for model {model!r}: a model string has no control characters"
        raise ValueError(msg)


@dataclasses.dataclass(frozen=True)
class ExperimentLimits:
    """An experiment's limits over every process (see the module docstring).

    Raises:
        ValueError: A limit out of range or malformed, named with its value.
    """

    concurrency: int = DEFAULT_CONCURRENCY
    """Cells at once, 1 to `MAX_CONCURRENCY`."""
    rate: Rate | None = None
    """Cells started per period, or None."""
    per_model: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Cells at once using a model (worker or grader), by model string."""
    model_rates: Mapping[str, Rate] = dataclasses.field(default_factory=dict)
    """Cells using a model started per period, by model string."""
    per_config: Mapping[int, int] = dataclasses.field(default_factory=dict)
    """Cells of a configuration at once, by its index."""
    config_rates: Mapping[int, Rate] = dataclasses.field(default_factory=dict)
    """Cells of a configuration started per period, by its index."""

    def __post_init__(self) -> None:
        check_concurrency(self.concurrency)
        for model, limit in self.per_model.items():
            _check_limited_model(model)
            if not _whole(limit):
                msg = f"model limit {model}={limit} must be from 1 to {MAX_CONCURRENCY}"
                raise ValueError(msg)
        if self.rate is not None:
            _check_rate(self.rate, "a rate limit")
        for model, rate in self.model_rates.items():
            _check_limited_model(model)
            _check_rate(rate, f"the rate limit of {model}")

    def check(self, configs: Sequence[ExperimentConfig]) -> None:
        """Refuse a limit the experiment of ``configs`` cannot apply.

        Raises:
            ValueError: A rate limit for a model no configuration uses, a limit for a
                configuration it does not have, or a bad configuration limit.

        """
        used = {m for c in configs for m in (c.worker_model, c.grader_model)}
        for model in self.model_rates:
            if model not in used:
                msg = (f"a rate limit for model {model!r}, which no configuration of the "
                       f"experiment uses (its models: {', '.join(sorted(used))})")
                raise ValueError(msg)
        for index in [*self.per_config, *self.config_rates]:
            if not _whole(index, low=0, high=len(configs) - 1):
                msg = (f"a limit for configuration {index!r}, which the experiment does not "
                       f"have (it has {len(configs)}, numbered from 0)")
                raise ValueError(msg)
        for index, limit in self.per_config.items():
            if not _whole(limit):
                msg = (f"the limit of configuration {index} ({configs[index].display_label()}) "
                       f"must be from 1 to {MAX_CONCURRENCY}, got {limit!r}")
                raise ValueError(msg)
        for index, rate in self.config_rates.items():
            _check_rate(rate, f"the rate limit of configuration {index} "
                              f"({configs[index].display_label()})")

    def model_limits(self) -> dict[str, ModelLimit]:
        """Each limited model's limits, as the engine's routes take them."""
        return _limits(self.per_model, self.model_rates)

    def config_limits(self) -> dict[int, ModelLimit]:
        """Each limited configuration's limits (by index), as the engine's routes take them."""
        return _limits(self.per_config, self.config_rates)


def _limits(at_once: Mapping[K, int], rates: Mapping[K, Rate]) -> dict[K, ModelLimit]:
    from rubric_core.engine.queues import ModelLimit

    return {key: ModelLimit(concurrency=at_once.get(key), rate=rates.get(key))
            for key in {*at_once, *rates}}


__all__ = ["ExperimentLimits", "Rate", "check_concurrency"]
