"""benchmarks/compare/stats.py against values derived by hand (each derivation in a comment)."""

from __future__ import annotations

import math

import pytest
from compare import stats


def test_quantile_interpolates_between_order_statistics() -> None:
    # position q * (n - 1): 0.25 * 3 = 0.75 -> 1 + 0.75 * (2 - 1) = 1.75; 0.5 -> 2.5
    assert stats.quantile([1.0, 2.0, 3.0, 4.0], 0.25) == 1.75
    assert stats.quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert stats.quantile([5.0], 0.975) == 5.0


def test_bootstrap_of_two_values_spans_the_exact_resampling_distribution() -> None:
    # resampling [0, 1]: the mean is 0 (p 1/4), 0.5 (1/2) or 1 (1/4); the 2.5% and 97.5% quantiles
    # of 10 000 draws are 0 and 1 (each end holds ~2 500 draws, far more than 250)
    ci = stats.bootstrap([0.0, 1.0], seed=3)
    assert (ci["mean"], ci["lo"], ci["hi"], ci["n"]) == (0.5, 0.0, 1.0, 2)


def test_bootstrap_quantiles_of_a_skewed_sample() -> None:
    # [0, 0, 0, 1]: the resample mean is Binomial(4, 1/4) / 4; P(mean = 0) = (3/4)^4 = 0.316 > 0.025,
    # P(mean <= 0.5) = 0.949 < 0.975 <= P(mean <= 0.75) = 0.996: the CI is [0, 0.75]
    ci = stats.bootstrap([0.0, 0.0, 0.0, 1.0], seed=0)
    assert (ci["mean"], ci["lo"], ci["hi"]) == (0.25, 0.0, 0.75)
    assert stats.bootstrap([0.0, 0.0, 0.0, 1.0], seed=0) == ci  # a fixed seed gives the same interval
    with pytest.raises(ValueError, match="no values"):
        stats.bootstrap([])


def test_a_paired_difference_is_resolved_only_when_its_interval_excludes_zero() -> None:
    same = stats.paired_difference([0.7, 0.8, 0.6], [0.7, 0.8, 0.6])
    assert (same["mean"], same["lo"], same["hi"], same["resolved"]) == (0.0, 0.0, 0.0, False)
    # differences 0.1, 0.1, 0.1: every resample's mean is 0.1 (up to rounding)
    ahead = stats.paired_difference([0.8, 0.9, 0.7], [0.7, 0.8, 0.6])
    assert ahead["resolved"] and ahead["lo"] == pytest.approx(0.1) and ahead["hi"] == pytest.approx(0.1)
    # differences +0.1 and -0.1: the mean 0 lies inside [-0.1, 0.1]
    mixed = stats.paired_difference([0.8, 0.6], [0.7, 0.7])
    assert not mixed["resolved"] and mixed["lo"] == pytest.approx(-0.1) and mixed["hi"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="equal lengths"):
        stats.paired_difference([1.0], [1.0, 2.0])


def test_interpolation_area_and_plateau_of_a_curve() -> None:
    curve = [(0.0, 0.5), (10.0, 0.7), (20.0, 0.8)]
    assert stats.at(curve, 5.0) == pytest.approx(0.6)  # halfway from 0.5 to 0.7
    assert stats.at(curve, 25.0) == 0.8  # held at the last evaluation
    # trapezoids: 10 * (0.5 + 0.7) / 2 = 6, 10 * (0.7 + 0.8) / 2 = 7.5 -> 13.5 / 20
    assert stats.area(curve, 20.0) == pytest.approx(13.5 / 20)
    # budget 10 stops at the second point: 6 / 10
    assert stats.area(curve, 10.0) == pytest.approx(0.6)
    # past the end, held at 0.8: (13.5 + 10 * 0.8) / 30
    assert stats.area(curve, 30.0) == pytest.approx(21.5 / 30)
    assert stats.plateau(curve) == pytest.approx((0.5 + 0.7 + 0.8) / 3)
    assert stats.plateau(curve, last=2) == pytest.approx(0.75)


def test_compute_to_target_interpolates_the_crossing_and_censors_at_the_budget() -> None:
    curve = [(0.0, 0.5), (10.0, 0.7), (20.0, 0.8)]
    assert stats.to_target(curve, 0.6, 30.0) == (pytest.approx(5.0), True)  # 0.6 is halfway up 0..10
    assert stats.to_target(curve, 0.75, 30.0) == (pytest.approx(15.0), True)
    assert stats.to_target(curve, 0.4, 30.0) == (0.0, True)  # already there at the start
    assert stats.to_target(curve, 0.9, 30.0) == (30.0, False)  # never: censored at the budget


def test_a_censored_speed_up_is_a_ratio_of_means_with_the_budget_in_place() -> None:
    # the baseline reaches the target at 10 and 20 units; the method at 5 and never (budget 30):
    # (10 + 20) / (5 + 30) = 0.857..., an upper bound on the method's speed-up (only it is censored)
    r = stats.ratio_of_means([10.0, 20.0], [5.0, 30.0])
    assert r["mean"] == pytest.approx(30 / 35)
    # resampling the seed pairs: (10, 5) twice -> 2, (20, 30) twice -> 2/3, mixed -> 30/35
    assert r["lo"] == pytest.approx(2 / 3) and r["hi"] == pytest.approx(2.0)
    # a method at the target from the start: infinitely faster; both at the start: undefined
    assert stats.ratio_of_means([10.0], [0.0])["mean"] == float("inf")
    assert math.isnan(stats.ratio_of_means([0.0], [0.0])["mean"])


def test_a_speed_up_in_seconds_censors_both_methods_at_their_common_horizon() -> None:
    # baseline 1 s per unit, the method 2 s per unit, budget 30 units: the common horizon is the
    # baseline's 30 s. Seed 0: 10 units (10 s) against 5 units (10 s); seed 1: neither reaches the
    # target (30 s each at the horizon); seed 2: the baseline never, the method at 20 units (40 s,
    # past the horizon: censored at 30 s too). So (10 + 30 + 30) / (10 + 30 + 30) = 1.
    r = stats.seconds_ratio([10.0, 30.0, 30.0], 1.0, [5.0, 30.0, 20.0], 2.0, 30.0)
    assert r["horizon_seconds"] == 30.0
    assert r["censored"] == {"method": 2, "baseline": 2}  # seeds 1 and 2 for both
    assert r["mean"] == pytest.approx(1.0) and r["lo"] == pytest.approx(1.0) and r["hi"] == pytest.approx(1.0)
    # scaling the compute ratio by the cost ratio would have read 70 / 55 / 2 = 0.64: slower
    assert stats.ratio_of_means([10.0, 30.0, 30.0], [5.0, 30.0, 20.0])["mean"] / 2.0 == pytest.approx(70 / 55 / 2)
    # where both reach the target inside the horizon it is the compute ratio times the cost ratio
    both = stats.seconds_ratio([10.0, 20.0], 1.0, [2.0, 4.0], 2.0, 30.0)
    assert both["mean"] == pytest.approx(30 / 12)


def test_the_selection_rule_penalises_spread() -> None:
    # mean 0.8, sample sd 0.1 -> 0.7; a steadier 0.76 +- 0.01 wins over it
    assert stats.selection_score([0.7, 0.8, 0.9]) == pytest.approx(0.7)
    assert stats.selection_score([0.75, 0.76, 0.77]) == pytest.approx(0.75)
    assert stats.selection_score([0.75, 0.76, 0.77]) > stats.selection_score([0.7, 0.8, 0.9])


def test_a_slope_is_least_squares_per_100k_units() -> None:
    # y rises 0.002 per 100k: exactly the tolerance; a V shape has slope 0 (its halves cancel)
    assert stats.slope([(0.0, 0.0), (100_000.0, 0.002), (200_000.0, 0.004)]) == pytest.approx(0.002)
    assert stats.slope([(0.0, 1.0), (1.0, 0.0), (2.0, 1.0)]) == 0.0
    with pytest.raises(ValueError, match="two points"):
        stats.slope([(0.0, 1.0)])


def _curves(slope_per_100k: float, offsets: list[float], wiggle: float = 0.0) -> list[list[tuple[float, float]]]:
    """Curves evaluated every 30k units to 750k: each seed's offset plus the slope, and an
    alternating wiggle (+w, -w, ...) that a least-squares line does not follow."""
    xs = [30_000.0 * i for i in range(26)]
    return [
        [(x, 0.7 + o + slope_per_100k * x / 100_000 + wiggle * (-1) ** i) for i, x in enumerate(xs)] for o in offsets
    ]


def test_the_plateau_test_passes_a_flat_curve_and_fails_one_rising_at_the_tolerance() -> None:
    flat = stats.plateau_test(_curves(0.0, [0.0, 0.01, -0.02], wiggle=0.001), 750_000, 25)
    # the last third: the evaluations from 510k (>= 500k) to 750k
    assert (flat["from_units"], flat["to_units"], flat["n"]) == (510_000, 750_000, 3)
    assert flat["verdict"] == "flat" and abs(flat["slope"]) < 2e-4 and flat["lo"] <= 0 <= flat["hi"]
    # every seed rises at exactly 0.002 per 100k: every resample's slope is 0.002, so the CI sits on
    # the tolerance, which counts as still rising
    rising = stats.plateau_test(_curves(stats.SLOPE_TOLERANCE, [0.0, 0.01, -0.02]), 750_000, 25)
    assert rising["verdict"] == "still rising" and rising["lo"] == pytest.approx(0.002)
    # half the tolerance is not rising; a fall at twice it is falling
    assert stats.plateau_test(_curves(0.001, [0.0, 0.01]), 750_000, 25)["verdict"] == "flat"
    assert stats.plateau_test(_curves(-0.004, [0.0, 0.01]), 750_000, 25)["verdict"] == "falling"
    # seeds that disagree: one rises at 0.01, one falls at 0.01; the mean is flat but the CI is wide
    mixed = stats.plateau_test(_curves(0.01, [0.0]) + _curves(-0.01, [0.0]), 750_000, 25)
    assert mixed["verdict"] == "flat" and mixed["lo"] == pytest.approx(-0.01) and mixed["hi"] == pytest.approx(0.01)


def test_student_t_against_table_values() -> None:
    # two-sided 95% critical values: df 9 -> 2.262157, df 25 -> 2.059539 (any t table)
    assert stats.t_quantile(0.975, 9) == pytest.approx(2.262157, abs=1e-6)
    assert stats.t_quantile(0.975, 25) == pytest.approx(2.059539, abs=1e-6)
    # df 1 is Cauchy: P(T <= 1) = 1/2 + atan(1)/pi = 0.75
    assert stats.t_cdf(1.0, 1) == pytest.approx(0.75, abs=1e-12)
    assert stats.t_cdf(0.0, 7) == pytest.approx(0.5, abs=1e-12)


def test_a_paired_t_interval_by_hand() -> None:
    # differences 1, 2, 3, 4: mean 2.5, sd sqrt(5/3) = 1.290994, se 0.645497; t(0.975, 3) = 3.182446
    # -> 2.5 +- 2.054260; t = 3.872983 on 3 df: two-sided p = 0.030466
    t = stats.paired_t([1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0])
    assert (t["mean"], t["n"]) == (2.5, 4)
    assert t["lo"] == pytest.approx(2.5 - 2.054260, abs=1e-5) and t["hi"] == pytest.approx(2.5 + 2.054260, abs=1e-5)
    assert t["p"] == pytest.approx(0.030466, abs=1e-5)
    with pytest.raises(ValueError, match="two or more pairs"):
        stats.paired_t([1.0], [0.0])


def test_holm_by_hand() -> None:
    # m = 4 at alpha 0.05, p sorted 0.01, 0.02, 0.03, 0.04: 0.01 <= 0.05/4 = 0.0125 rejects; 0.02 <=
    # 0.05/3 = 0.0167? no: it stops, and 0.03 (<= 0.025? no) and 0.04 (<= 0.05, alone: yes) stay too
    assert stats.holm({"a": 0.03, "b": 0.01, "c": 0.02, "d": 0.04}) == {"b": True, "c": False, "a": False, "d": False}
    # 0.01, 0.015, 0.02, 0.5: 0.0125, 0.0167, 0.025 pass; 0.5 > 0.05 fails
    assert stats.holm({"a": 0.02, "b": 0.01, "c": 0.015, "d": 0.5}) == {"b": True, "c": True, "a": True, "d": False}
    assert stats.holm({"x": 0.04}) == {"x": True} and stats.holm({"x": 0.06}) == {"x": False}
