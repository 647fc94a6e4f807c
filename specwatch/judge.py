"""One judge of a candidate against its baseline on per-request samples, for `specwatch canary` and the study.

One metric at a time (TPOT, an ITL tail, output tokens per second, an acceptance rate, an error
ratio), on per-request samples of both sides:

- Fewer than `Rules.min_samples` on either side is `insufficient`: never a pass, never a
  change, whatever the numbers say.
- Otherwise Mann-Whitney U tests the samples and Hodges-Lehmann gives the effect with its
  interval: on logs for ratio metrics (the effect is candidate / baseline), on the values for
  differences (candidate - baseline); a proportion (errors of requests) gets Newcombe's interval
  and the two-proportion z-test.
- `high` (or `low`) only when the difference is significant (p < alpha) *and* the whole
  interval lies above (below) the band of no meaningful change; otherwise `pass`: no evidence of
  a change larger than the band.

The states are the canary's. What a state means is the caller's: the canary scores them
(`specwatch.canary.judge`: a `high` TPOT fails), the study turns them into GO / NO-GO /
INCONCLUSIVE (`specwatch.report.verdict`: a `low` TPOT is a gain).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from specwatch.stats import Shift, compare, median, newcombe

State = Literal["pass", "high", "low", "insufficient"]
Scale = Literal["ratio", "difference"]

MIN_SAMPLES = 20  # per side; the canary policy's default (`min_samples`), and the study's


@dataclass(frozen=True)
class Rules:
    """How much evidence a change needs: samples per side, the test's level, the interval's confidence."""

    min_samples: int = MIN_SAMPLES
    alpha: float = 0.05
    confidence: float = 0.95


@dataclass(frozen=True)
class Band:
    """The effects that are no meaningful change, on the effect's scale: [low, high]."""

    low: float
    high: float

    @classmethod
    def around(cls, scale: Scale, allowed_decrease: float, allowed_increase: float) -> Band:
        """Ratio metrics: [1 - decrease, 1 + increase] (fractions); differences: [-decrease, +increase]."""
        if scale == "ratio":
            return cls(1 - allowed_decrease, 1 + allowed_increase)
        return cls(-allowed_decrease, allowed_increase)


@dataclass(frozen=True)
class Comparison:
    """The judge's answer for one metric: its state, the samples it rests on, the effect and its interval."""

    state: State
    scale: Scale
    n_baseline: int
    n_candidate: int
    effect: Shift | None = None  # None when insufficient
    p_value: float | None = None
    baseline: float | None = None  # the median (or the proportion) of each side, where it has samples
    candidate: float | None = None
    significant: bool = False

    @property
    def detail(self) -> str:
        """The state in words, as the canary's reasons say it."""
        if self.state == "insufficient":
            return "insufficient data"
        if self.state == "pass":
            return ("significant, but the interval reaches into the tolerance" if self.significant
                    else "no significant difference")
        return f"significant and entirely {'higher' if self.state == 'high' else 'lower'} than the tolerance"


def classify(p_value: float, effect: Shift, band: Band, alpha: float) -> State:
    """high / low only when significant and the whole interval is beyond the band; pass otherwise."""
    if p_value >= alpha:
        return "pass"
    if effect.low > band.high:
        return "high"
    if effect.high < band.low:
        return "low"
    return "pass"


def samples(baseline: Sequence[float], candidate: Sequence[float], scale: Scale, band: Band,
            rules: Rules = Rules()) -> Comparison:
    """Compare two per-request samples (ratio scale: positive values only, e.g. seconds or tokens / s)."""
    nb, nc = len(baseline), len(candidate)
    medians = (median(baseline) if baseline else None, median(candidate) if candidate else None)
    if nb < rules.min_samples or nc < rules.min_samples:
        return Comparison("insufficient", scale, nb, nc, None, None, *medians)
    cmp = compare(baseline, candidate, scale == "ratio", rules.confidence)
    return Comparison(classify(cmp.p_value, cmp.effect, band, rules.alpha), scale, nb, nc, cmp.effect, cmp.p_value,
                      *medians, cmp.p_value < rules.alpha)


def proportions(k_baseline: int, n_baseline: int, k_candidate: int, n_candidate: int, band: Band,
                rules: Rules = Rules()) -> Comparison:
    """Compare two proportions (k of n requests each): the effect is candidate - baseline."""
    shares = (k_baseline / n_baseline if n_baseline else None, k_candidate / n_candidate if n_candidate else None)
    if n_baseline < rules.min_samples or n_candidate < rules.min_samples:
        return Comparison("insufficient", "difference", n_baseline, n_candidate, None, None, *shares)
    effect, p = newcombe(k_candidate, n_candidate, k_baseline, n_baseline, rules.confidence)
    return Comparison(classify(p, effect, band, rules.alpha), "difference", n_baseline, n_candidate, effect, p,
                      *shares, p < rules.alpha)
