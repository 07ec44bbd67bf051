"""The comparison's statistics, in plain Python (no numpy needed), each a pure function of its
inputs and a seed.

A *curve* is a list of ``(units, reward)`` points in increasing ``units`` (the held-out
evaluations of one run). Confidence intervals are percentile bootstraps over seeds: resample the
seeds with replacement ``resamples`` times, take the statistic of each resample, and report its
2.5% and 97.5% quantiles (linear interpolation between order statistics). Paired comparisons
resample seed *indices*, so that seed ``k`` of one method stays beside seed ``k`` of the other.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any

Curve = Sequence[tuple[float, float]]

RESAMPLES = 10_000
LEVEL = 0.95


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ascending ``sorted_values``, interpolating between order statistics
    (numpy's default 'linear' method)."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    position = q * (len(sorted_values) - 1)
    lo = math.floor(position)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (position - lo) * (sorted_values[hi] - sorted_values[lo])


def bootstrap(
    values: Sequence[float],
    statistic: Callable[[Sequence[float]], float] = statistics.fmean,
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
    level: float = LEVEL,
) -> dict[str, float]:
    """``statistic`` of ``values`` with its percentile-bootstrap CI: ``{"mean", "lo", "hi", "n"}``
    (``mean`` is the statistic of the values themselves)."""
    if not values:
        raise ValueError("bootstrap of no values")
    rng = random.Random(seed)
    n = len(values)
    stats = sorted(statistic([values[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    alpha = (1.0 - level) / 2
    return {"mean": statistic(values), "lo": quantile(stats, alpha), "hi": quantile(stats, 1 - alpha), "n": n}


def paired_difference(a: Sequence[float], b: Sequence[float], **kwargs) -> dict[str, float | bool]:
    """Mean of ``a[k] - b[k]`` over the paired seeds with its bootstrap CI, and ``resolved``:
    whether the interval excludes 0."""
    if len(a) != len(b):
        raise ValueError(f"paired values need equal lengths, got {len(a)} and {len(b)}")
    ci = bootstrap([x - y for x, y in zip(a, b)], **kwargs)
    return {**ci, "resolved": ci["lo"] > 0 or ci["hi"] < 0}


def at(curve: Curve, units: float) -> float:
    """The curve's reward at ``units``, linear between the two evaluations around it (the last
    evaluation's reward past the end; an error before the first)."""
    if units < curve[0][0]:
        raise ValueError(f"{units} units is before the curve's first evaluation at {curve[0][0]}")
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x0 <= units <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (units - x0) / (x1 - x0)
    return curve[-1][1]


def area(curve: Curve, budget: float) -> float:
    """Mean reward over ``[0, budget]`` units: the trapezoid area under the curve (held at its
    last value up to ``budget``), divided by ``budget``."""
    points = [(x, y) for x, y in curve if x <= budget]
    if points[-1][0] < budget:
        points.append((budget, at(curve, budget)))
    total = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(points, points[1:]))
    return total / budget


def plateau(curve: Curve, last: int = 3) -> float:
    """Mean reward of the last ``last`` evaluations."""
    return statistics.fmean(y for _, y in curve[-last:])


def to_target(curve: Curve, target: float, budget: float) -> tuple[float, bool]:
    """Units at which the curve first reaches ``target`` (linear between the evaluations around the
    crossing) and whether it did: ``(units, True)``, or ``(budget, False)`` -- censored at the budget,
    never dropped."""
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if y0 >= target:
            return x0, True
        if y1 >= target:
            return x0 + (x1 - x0) * (target - y0) / (y1 - y0), True
    if curve[-1][1] >= target:
        return curve[-1][0], True
    return budget, False


def ratio_of_means(
    numerator: Sequence[float],
    denominator: Sequence[float],
    *,
    seed: int = 0,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
) -> dict[str, float]:
    """``mean(numerator) / mean(denominator)`` with a paired percentile-bootstrap CI (both sides
    resampled with the same seed indices). Used for speed-ups: a baseline's compute to target over a
    method's, censored seeds at the budget: a ratio of means restricted to the budget, which bounds
    the unrestricted speed-up from above where only the method has censored seeds, from below where
    only the baseline has, and neither way where both have."""
    if len(numerator) != len(denominator) or not numerator:
        raise ValueError("ratio_of_means needs two non-empty sequences of equal length")
    rng = random.Random(seed)
    n = len(numerator)
    ratios = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        ratios.append(_ratio(sum(numerator[i] for i in idx), sum(denominator[i] for i in idx)))
    ratios.sort()
    alpha = (1.0 - level) / 2
    # two-sided bootstrap p-value against a ratio of 1 (no speed-up), for Holm's correction
    below, above = sum(r <= 1 for r in ratios) / resamples, sum(r >= 1 for r in ratios) / resamples
    return {
        "mean": _ratio(sum(numerator), sum(denominator)),
        "lo": quantile(ratios, alpha),
        "hi": quantile(ratios, 1 - alpha),
        "n": n,
        "p": min(1.0, 2 * min(below, above)),
    }


def seconds_ratio(
    baseline_units: Sequence[float],
    baseline_rate: float,
    method_units: Sequence[float],
    method_rate: float,
    budget: float,
    *,
    seed: int = 0,
) -> dict[str, float]:
    """A speed-up to a target in seconds: each seed's compute to it (censored at ``budget`` units) at
    its method's seconds per unit, both censored again at the pair's common horizon, the shorter of
    the two budgets in seconds; then :func:`ratio_of_means` (the same seed indices as the compute
    axis's). Scaling the compute ratio by the cost ratio instead would count a seed that neither
    method reaches as slower for the costlier method, whose budget in seconds is longer."""
    horizon = budget * min(baseline_rate, method_rate)
    base = [min(u * baseline_rate, horizon) for u in baseline_units]
    mine = [min(u * method_rate, horizon) for u in method_units]
    censored = {"method": sum(t >= horizon for t in mine), "baseline": sum(t >= horizon for t in base)}
    return {**ratio_of_means(base, mine, seed=seed), "horizon_seconds": horizon, "censored": censored}


def _ratio(a: float, b: float) -> float:
    """``a / b``; a method at the target from the start (0 units) is infinitely faster, 0 / 0 is NaN."""
    if b == 0:
        return math.nan if a == 0 else math.inf
    return a / b


def selection_score(plateaus: Sequence[float]) -> float:
    """The sweep's rule, fixed before the runs: mean minus one (sample) standard deviation over the
    sweep seeds of each run's plateau (mean of its last three evaluations), so that a rate that
    is good on average but unstable loses to a steadier one."""
    sd = statistics.stdev(plateaus) if len(plateaus) > 1 else 0.0
    return statistics.fmean(plateaus) - sd


# ---------------------------------------------------------------------------------------------
# the verdict's tests: the plateau slope, Student's t, Holm's correction
# ---------------------------------------------------------------------------------------------

SLOPE_PER = 100_000.0
"""Slopes are reported per this many compute units."""
SLOPE_TOLERANCE = 0.002
"""Fixed before the runs that read it: a seed-mean curve whose slope over the last third of the
budget has a CI lying at or above this (reward per 100k units) is still rising."""


def slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of ``points`` (x, y), in y per :data:`SLOPE_PER` units of x."""
    if len(points) < 2:
        raise ValueError("a slope needs two points or more")
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        raise ValueError("a slope needs two distinct x values")
    return SLOPE_PER * sum((x - mx) * (y - my) for x, y in points) / sxx


def plateau_test(
    curves: Sequence[Curve],
    budget: float,
    evaluations: int,
    *,
    tolerance: float = SLOPE_TOLERANCE,
    seed: int = 0,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
) -> dict[str, Any]:
    """Whether the seed-mean curve still rises at the end of the budget: the least-squares slope of
    the mean over seeds of ``curves`` at the protocol's evaluation points (``budget * i /
    evaluations``) in the last third of the budget, with a percentile-bootstrap CI over seeds. ``"still rising"`` when the whole CI lies at or above
    ``tolerance``, ``"falling"`` when it lies at or below ``-tolerance``, else ``"flat"``."""
    xs = [budget * i / evaluations for i in range(1, evaluations + 1) if budget * i / evaluations >= budget * 2 / 3]
    if len(xs) < 2:
        raise ValueError(f"the last third of the budget ({budget:,.0f} units) holds fewer than two evaluations")

    values = [[at(c, x) for x in xs] for c in curves]  # [seed][point], read once: resamples reuse them

    def of(sample: Sequence[list[float]]) -> float:
        return slope([(x, statistics.fmean(v[j] for v in sample)) for j, x in enumerate(xs)])

    rng = random.Random(seed)
    n = len(curves)
    draws = sorted(of([values[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    alpha = (1.0 - level) / 2
    lo, hi = quantile(draws, alpha), quantile(draws, 1 - alpha)
    margin = 1e-12  # a slope exactly at the tolerance counts as reaching it, whatever its rounding
    verdict = "still rising" if lo >= tolerance - margin else "falling" if hi <= -tolerance + margin else "flat"
    return {
        "slope": of(values),
        "lo": lo,
        "hi": hi,
        "n": n,
        "from_units": xs[0],
        "to_units": xs[-1],
        "per_units": SLOPE_PER,
        "tolerance": tolerance,
        "verdict": verdict,
    }


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t (bisection on :func:`t_cdf`, to 1e-12)."""
    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def paired_t(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> dict[str, Any]:
    """Mean of ``a[k] - b[k]`` with its Student-t CI and two-sided p-value (n - 1 degrees of freedom)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"a paired t interval needs two or more pairs of equal length, got {len(a)} and {len(b)}")
    d = [x - y for x, y in zip(a, b)]
    n, mean, sd = len(d), statistics.fmean(d), statistics.stdev(d)
    se = sd / math.sqrt(n)
    half = t_quantile(1 - (1 - level) / 2, n - 1) * se
    p = 0.0 if se == 0 and mean != 0 else 1.0 if se == 0 else 2 * (1 - t_cdf(abs(mean) / se, n - 1))
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": n, "sd": sd, "p": p}


def holm(p_values: dict[str, float], alpha: float = 1 - LEVEL) -> dict[str, bool]:
    """Holm's step-down correction over a family of tests: each test's name -> whether it is
    rejected (resolved) at family-wise error ``alpha``. The k-th smallest p (k from 0) is compared
    with ``alpha / (m - k)``; the first that fails stops every larger one."""
    order = sorted(p_values, key=lambda k: p_values[k])
    m, out, stopped = len(order), {}, False
    for k, name in enumerate(order):
        stopped = stopped or p_values[name] > alpha / (m - k)
        out[name] = not stopped
    return out
