"""Cohen's κ's interval (`rubric_core.analytics.kappa_interval`) on known tables.

The standard error is pinned two ways: by a table worked by hand (the Fleiss–Cohen–Everitt
terms written out below), and against an independent derivation, the delta method computed
numerically (finite differences of κ as a function of the four cell shares, with the
multinomial covariance of those shares), on several tables.
"""

from __future__ import annotations

import itertools

import pytest

from rubric_core.analytics import cohen_kappa, kappa_interval


def _pairs(tt: int, tf: int, ft: int, ff: int) -> list[tuple[bool, bool]]:
    """A 2 × 2 table as (rater A, rater B) pairs: tf = A passes, B fails."""
    return ([(True, True)] * tt + [(True, False)] * tf + [(False, True)] * ft
            + [(False, False)] * ff)


def test_a_table_worked_by_hand() -> None:
    # n = 50; cell shares p11 .4, p10 .1, p01 .2, p00 .3 (first index: A's verdict, 1 = pass).
    # A's margins .5/.5, B's .6 pass/.4 fail: po = .7, pe = .5, κ = .4.
    # A = .3(1 - .9·.6)² + .4(1 - 1.1·.6)² = .06348 + .04624 = .10972
    # B = .6² · (.2(.4 + .5)² + .1(.6 + .5)²) = .36 · .283 = .10188
    # C = (.4 - .5·.6)² = .01;  SE = √((A + B - C) / 50) / (1 - .5) = .126996
    # 95%: .4 ± 1.959964 · .126996 = [.151089, .648911]
    result = kappa_interval(_pairs(20, 5, 10, 15))
    assert (result.n, result.kappa, result.se) == (50, 0.4, 0.127)
    assert (result.low, result.high) == (0.1511, 0.6489)
    assert cohen_kappa(_pairs(20, 5, 10, 15)).kappa == result.kappa


def _kappa(p: tuple[float, float, float, float]) -> float:
    tt, tf, ft, ff = p
    observed = tt + ff
    a_yes, b_yes = tt + tf, tt + ft
    expected = a_yes * b_yes + (1 - a_yes) * (1 - b_yes)
    return (observed - expected) / (1 - expected)


def _delta_method_se(counts: tuple[int, int, int, int]) -> float:
    n = sum(counts)
    p = tuple(c / n for c in counts)
    h = 1e-6
    grad = []
    for i in range(4):
        up = tuple(v + (h if j == i else 0.0) for j, v in enumerate(p))
        down = tuple(v - (h if j == i else 0.0) for j, v in enumerate(p))
        grad.append((_kappa(up) - _kappa(down)) / (2 * h))  # type: ignore[arg-type]
    variance = sum(grad[i] * grad[j] * ((p[i] if i == j else 0.0) - p[i] * p[j]) / n
                   for i, j in itertools.product(range(4), repeat=2))
    return float(variance ** 0.5)


@pytest.mark.parametrize("counts", [
    pytest.param((20, 5, 10, 15), id="moderate"),
    pytest.param((40, 3, 2, 55), id="high_agreement"),
    pytest.param((12, 9, 11, 8), id="near_chance"),
    pytest.param((30, 1, 9, 2), id="skewed_margins"),
    pytest.param((5, 20, 18, 7), id="worse_than_chance"),
])
def test_the_standard_error_is_the_delta_method_variance(
        counts: tuple[int, int, int, int]) -> None:
    result = kappa_interval(_pairs(*counts))
    assert result.se == pytest.approx(_delta_method_se(counts), abs=1e-4)
    assert result.low is not None and result.high is not None and result.kappa is not None
    assert -1.0 <= result.low < result.kappa < result.high <= 1.0


def test_wider_for_more_confidence_and_narrower_for_more_items() -> None:
    small = kappa_interval(_pairs(20, 5, 10, 15))
    wide = kappa_interval(_pairs(20, 5, 10, 15), confidence=0.99)
    large = kappa_interval(_pairs(200, 50, 100, 150))
    assert wide.kappa == small.kappa == large.kappa
    assert (wide.high - wide.low) > (small.high - small.low)  # type: ignore[operator]
    assert (large.high - large.low) < (small.high - small.low)  # type: ignore[operator]
    assert large.se == pytest.approx(small.se / 10 ** 0.5, abs=1e-4)  # type: ignore[operator]


@pytest.mark.parametrize(("pairs", "kappa", "se"), [
    pytest.param([], None, None, id="no_pairs"),
    pytest.param(_pairs(10, 0, 0, 0), None, None, id="one_verdict_throughout_undefined"),
    pytest.param(_pairs(6, 0, 0, 4), 1.0, 0.0, id="perfect_agreement_has_no_width"),
])
def test_edges(pairs: list[tuple[bool, bool]], kappa: float | None, se: float | None) -> None:
    result = kappa_interval(pairs)
    assert (result.kappa, result.se) == (kappa, se)
    if kappa is not None:
        assert result.low == result.high == kappa


@pytest.mark.parametrize("confidence", [0.0, 1.0, -0.5, 95])
def test_a_confidence_outside_zero_one_is_refused(confidence: float) -> None:
    with pytest.raises(ValueError, match="confidence must be between 0 and 1"):
        kappa_interval(_pairs(1, 1, 1, 1), confidence=confidence)
