"""Two-sample statistics for the judge (`specwatch.judge`), in pure Python: Mann-Whitney U, Hodges-Lehmann, Newcombe.

- `mann_whitney(x, y)`: U of `x` (R1 - n1(n1+1)/2, mid-ranks for ties), the normal
  approximation with the tie correction and a 0.5 continuity correction, two-sided p-value.
  The same numbers as `scipy.stats.mannwhitneyu(x, y, method="asymptotic")`.
- `hodges_lehmann(x, y, confidence)`: the shift of `x` relative to `y`, the median of the
  n1 * n2 pairwise differences x_i - y_j, with the distribution-free (Moses) interval from
  their order statistics: [d_(k), d_(N-k+1)] with k = floor(N/2 - z * sqrt(n1 n2 (n1+n2+1) / 12)),
  N = n1 n2 (normal approximation of U's null distribution, no tie correction).
  Above `MAX_PER_SIDE` samples a side is thinned to that many evenly spaced order statistics
  for the estimate and interval only (the interval gets wider, never narrower than the data allow).
- `newcombe(k1, n1, k2, n2, confidence)`: p1 - p2 with Newcombe's hybrid score interval
  (from two Wilson intervals) and the pooled two-proportion z-test, for error ratios.
- `ratio_of_sums(numerators, denominators, confidence)`: sum(a) / sum(b) over requests (an
  acceptance rate C / D, summed first, then divided) with the ratio estimator's interval (Student's t
  with n - 1 degrees of freedom), the request as the unit (tokens of one request are not independent
  draws).
- `mean_interval(values, confidence)`: the mean of a few values (one effect per round of a blocked
  study) with Student's t interval; `t_quantile(p, df)` from the regularised incomplete beta function.

`compare()` applies them to one metric: on the log scale for positive, ratio-like metrics
(the effect and its interval are then candidate / baseline ratios, exp of the log shift);
on the natural scale for bounded ones (the effect is candidate - baseline).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

MAX_PER_SIDE = 2000  # 4 million pairwise differences at most: a few seconds in pure Python


@dataclass(frozen=True)
class MannWhitney:
    u: float  # U of the first sample
    z: float  # standardised max(U1, U2), continuity-corrected
    p_value: float  # two-sided


@dataclass(frozen=True)
class Shift:
    estimate: float
    low: float
    high: float
    confidence: float


def _norm_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2))


def ranks(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """Mid-ranks (1-based) of `values` and the sizes of the tie groups."""
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    ties: list[int] = []
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        mid = (i + j) / 2 + 1
        for pos in range(i, j + 1):
            out[order[pos]] = mid
        ties.append(j - i + 1)
        i = j + 1
    return out, ties


def mann_whitney(x: Sequence[float], y: Sequence[float]) -> MannWhitney:
    """Two-sided Mann-Whitney U test (normal approximation, tie and continuity corrections)."""
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("mann_whitney: both samples need at least one value")
    r, ties = ranks([*x, *y])
    u1 = sum(r[:n1]) - n1 * (n1 + 1) / 2
    u = max(u1, n1 * n2 - u1)
    n = n1 + n2
    tie_term = sum(t ** 3 - t for t in ties)
    variance = n1 * n2 / 12 * ((n + 1) - (tie_term / (n * (n - 1)) if n > 1 else 0.0))
    if variance <= 0:  # every value equal: no evidence of a difference
        return MannWhitney(u1, 0.0, 1.0)
    z = (u - n1 * n2 / 2 - 0.5) / math.sqrt(variance)
    return MannWhitney(u1, z, min(1.0, 2 * _norm_sf(z)))


def _thin(values: Sequence[float], limit: int) -> list[float]:
    s = sorted(values)
    if len(s) <= limit:
        return s
    return [s[round(i * (len(s) - 1) / (limit - 1))] for i in range(limit)]


def _median_sorted(s: Sequence[float]) -> float:
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


def median(values: Sequence[float]) -> float:
    return _median_sorted(sorted(values))


def hodges_lehmann(x: Sequence[float], y: Sequence[float], confidence: float = 0.95) -> Shift:
    """Shift of x relative to y: the median of x_i - y_j, with its distribution-free interval."""
    if not x or not y:
        raise ValueError("hodges_lehmann: both samples need at least one value")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence}: expected a value in (0, 1)")
    xs, ys = _thin(x, MAX_PER_SIDE), _thin(y, MAX_PER_SIDE)
    n1, n2 = len(xs), len(ys)
    diffs = sorted(a - b for a in xs for b in ys)
    total = len(diffs)
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    k = math.floor(total / 2 - z * math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12))
    k = max(k, 1)  # too few samples for this confidence: the interval is the whole range
    return Shift(_median_sorted(diffs), diffs[k - 1], diffs[total - k], confidence)


def wilson(k: int, n: int, z: float) -> tuple[float, float]:
    """Wilson score interval of a proportion k / n."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe(k1: int, n1: int, k2: int, n2: int, confidence: float = 0.95) -> tuple[Shift, float]:
    """p1 - p2 with Newcombe's hybrid score interval, and the pooled z-test's two-sided p-value."""
    if n1 <= 0 or n2 <= 0:
        raise ValueError("newcombe: both sides need at least one trial")
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson(k1, n1, z)
    l2, u2 = wilson(k2, n2, z)
    d = p1 - p2
    shift = Shift(d, d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2),
                  confidence)
    pooled = (k1 + k2) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    p_value = 1.0 if se == 0 else min(1.0, 2 * _norm_sf(abs(d) / se))
    return shift, p_value


def ratio_of_sums(numerators: Sequence[float], denominators: Sequence[float], confidence: float = 0.95) -> Shift:
    """sum(a) / sum(b) with the ratio estimator's interval: var = n / (n - 1) * sum((a_i - r b_i)^2) / sum(b)^2."""
    if len(numerators) != len(denominators) or not numerators:
        raise ValueError("ratio_of_sums: expected as many numerators as denominators, at least one")
    total = sum(denominators)
    if total <= 0:
        raise ValueError("ratio_of_sums: the denominators add up to 0")
    r = sum(numerators) / total
    n = len(numerators)
    if n < 2:
        return Shift(r, r, r, 0.0)  # one request: no spread to estimate
    se = math.sqrt(n / (n - 1) * sum((a - r * b) ** 2 for a, b in zip(numerators, denominators, strict=True))) / total
    t = t_quantile(1 - (1 - confidence) / 2, n - 1)
    return Shift(r, r - t * se, r + t * se, confidence)


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-14:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1 - front * _beta_fraction(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function."""
    tail = 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (bisection on `t_cdf`)."""
    if not 0 < p < 1 or df <= 0:
        raise ValueError(f"t_quantile: expected 0 < p < 1 and df > 0, got p = {p}, df = {df}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
        if high - low < 1e-12:
            break
    return (low + high) / 2


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> Shift:
    """The mean of `values` with Student's t interval (n - 1 degrees of freedom); at least two values."""
    n = len(values)
    if n < 2:
        raise ValueError("mean_interval: expected at least two values")
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(1 - (1 - confidence) / 2, n - 1) * sd / math.sqrt(n)
    return Shift(mean, mean - half, mean + half, confidence)


@dataclass(frozen=True)
class ShiftTest:
    """What `compare` finds for one metric, candidate against baseline: the test's p-value and the effect."""

    p_value: float
    effect: Shift  # a ratio (log scale) or a difference (natural scale)
    u: float | None = None  # Mann-Whitney U of the candidate sample


def compare(baseline: Sequence[float], candidate: Sequence[float], log_scale: bool,
            confidence: float = 0.95) -> ShiftTest:
    """Mann-Whitney on the samples; Hodges-Lehmann on logs (-> a ratio) or on the values (-> a difference)."""
    test = mann_whitney(candidate, baseline)  # ranks do not change under log
    if log_scale:
        if min(baseline) <= 0 or min(candidate) <= 0:
            raise ValueError("log scale needs positive values")
        s = hodges_lehmann([math.log(v) for v in candidate], [math.log(v) for v in baseline], confidence)
        effect = Shift(math.exp(s.estimate), math.exp(s.low), math.exp(s.high), confidence)
    else:
        effect = hodges_lehmann(candidate, baseline, confidence)
    return ShiftTest(test.p_value, effect, test.u)
