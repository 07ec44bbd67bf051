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
    method's, censored seeds at the budget (so a censored method's speed-up is an upper bound and a
    censored baseline's a lower bound)."""
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
    return {
        "mean": _ratio(sum(numerator), sum(denominator)),
        "lo": quantile(ratios, alpha),
        "hi": quantile(ratios, 1 - alpha),
        "n": n,
    }


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
