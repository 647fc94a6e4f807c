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

A blocked study (`blocked`: the variants measured in rounds, one block each per round) is judged
within rounds: each round's values are aligned on the round's centre before the test and
Hodges-Lehmann (aligned ranks, Hodges & Lehmann 1962), so a slowdown that hits every variant of a
round cancels; and the effect of each round is kept, their mean with Student's t interval over
rounds. `high` / `low` then needs both intervals, over requests and over rounds, beyond the band
(from `GATING_ROUNDS` rounds on; with two the interval over rounds is shown, not required).

The states are the canary's. What a state means is the caller's: the canary scores them
(`specwatch.canary.scoring`: a `high` TPOT fails), the study turns them into GO / NO-GO /
INCONCLUSIVE (`specwatch.report.verdict`: a `low` TPOT is a gain).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from specwatch.stats import Shift, compare, mean_interval, median, newcombe

State = Literal["pass", "high", "low", "insufficient"]
Scale = Literal["ratio", "difference"]

MIN_SAMPLES = 20  # per side; the canary policy's default (`min_samples`), and the study's
# From 3 rounds on the interval over rounds must agree too; with 2 its Student's t has one degree of freedom (a
# multiplier of 12.7) and says nothing: it is shown, and the aligned interval over requests decides alone.
GATING_ROUNDS = 3


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
    within: bool = False  # every interval lies inside the band: evidence of no meaningful change
    rounds: int = 1  # rounds with samples on both sides (1: not blocked)
    over_rounds: Shift | None = None  # the mean of the per-round effects, with its interval over rounds
    per_round: tuple[float, ...] = ()  # the effect in each round (a ratio, or a difference)
    by_requests: State | None = None  # blocked: the state the interval over requests alone gives

    @property
    def rounds_disagree(self) -> bool:
        """Blocked, decided over requests but not over rounds: the rounds' own effects spread across the band."""
        return self.by_requests in ("high", "low") and self.state == "pass" and self.over_rounds is not None

    @property
    def detail(self) -> str:
        """The state in words, as the canary's reasons say it."""
        if self.state == "insufficient":
            return "insufficient data"
        if self.state == "pass":
            if self.within:
                return "no meaningful change (the interval lies inside the tolerance)"
            return ("significant, but the interval reaches into the tolerance" if self.significant
                    else "no significant difference, but the interval reaches beyond the tolerance")
        return f"significant and entirely {'higher' if self.state == 'high' else 'lower'} than the tolerance"


def state_of(p_value: float, effect: Shift, band: Band, alpha: float) -> State:
    """high / low only when significant and the whole interval is beyond the band; pass otherwise."""
    if p_value >= alpha:
        return "pass"
    if effect.low > band.high:
        return "high"
    if effect.high < band.low:
        return "low"
    return "pass"


def inside(effect: Shift, band: Band) -> bool:
    return band.low <= effect.low and effect.high <= band.high


def samples(baseline: Sequence[float], candidate: Sequence[float], scale: Scale, band: Band,
            rules: Rules = Rules()) -> Comparison:
    """Compare two per-request samples (ratio scale: positive values only, e.g. seconds or tokens / s)."""
    nb, nc = len(baseline), len(candidate)
    medians = (median(baseline) if baseline else None, median(candidate) if candidate else None)
    if nb < rules.min_samples or nc < rules.min_samples:
        return Comparison("insufficient", scale, nb, nc, None, None, *medians)
    cmp = compare(baseline, candidate, scale == "ratio", rules.confidence)
    return Comparison(state_of(cmp.p_value, cmp.effect, band, rules.alpha), scale, nb, nc, cmp.effect, cmp.p_value,
                      *medians, cmp.p_value < rules.alpha, inside(cmp.effect, band))


def blocked(baseline: Mapping[int, Sequence[float]], candidate: Mapping[int, Sequence[float]], scale: Scale,
            band: Band, rules: Rules = Rules()) -> Comparison:
    """Compare per-request samples measured in rounds (round -> values on each side), within rounds.

    Only rounds with values on both sides count. With one such round this is `samples`. Otherwise each
    round's values (their logs on the ratio scale) are aligned on the round's centre, the midpoint of the
    two sides' medians, and the aligned values are tested and estimated as two samples: a shift that hits
    both sides of a round moves its centre and nothing else. The per-round effects (candidate median
    against baseline median) give the interval over rounds. `high` / `low` needs both intervals beyond
    the band; `within`, both inside it (the interval over rounds from `GATING_ROUNDS` rounds on).
    """
    rounds = sorted(r for r in baseline if baseline[r] and candidate.get(r))
    flat_b = [x for r in rounds for x in baseline[r]]
    flat_c = [x for r in rounds for x in candidate[r]]
    if len(rounds) < 2:
        return samples(flat_b or [x for v in baseline.values() for x in v],
                       flat_c or [x for v in candidate.values() for x in v], scale, band, rules)
    nb, nc = len(flat_b), len(flat_c)
    medians = (median(flat_b), median(flat_c))
    if nb < rules.min_samples or nc < rules.min_samples:
        return Comparison("insufficient", scale, nb, nc, None, None, *medians, rounds=len(rounds))
    ratio = scale == "ratio"
    if ratio and (min(flat_b) <= 0 or min(flat_c) <= 0):
        raise ValueError("the ratio scale needs positive values")
    f = math.log if ratio else float
    back = math.exp if ratio else float
    aligned_b: list[float] = []
    aligned_c: list[float] = []
    per_round: list[float] = []
    for r in rounds:
        b, c = [f(x) for x in baseline[r]], [f(x) for x in candidate[r]]
        mb, mc = median(b), median(c)
        centre = (mb + mc) / 2
        aligned_b += [x - centre for x in b]
        aligned_c += [x - centre for x in c]
        per_round.append(mc - mb)
    cmp = compare(aligned_b, aligned_c, False, rules.confidence)
    e, m = cmp.effect, mean_interval(per_round, rules.confidence)
    effect = Shift(back(e.estimate), back(e.low), back(e.high), e.confidence)
    over = Shift(back(m.estimate), back(m.low), back(m.high), m.confidence)
    by_requests = state_of(cmp.p_value, effect, band, rules.alpha)
    by_rounds: State = "high" if over.low > band.high else "low" if over.high < band.low else "pass"
    gates = len(rounds) >= GATING_ROUNDS
    state: State = by_requests if by_requests == by_rounds or not gates else "pass"
    within = inside(effect, band) and (inside(over, band) or not gates)
    return Comparison(state, scale, nb, nc, effect, cmp.p_value, *medians, cmp.p_value < rules.alpha, within,
                      len(rounds), over, tuple(back(d) for d in per_round), by_requests)


def proportions(k_baseline: int, n_baseline: int, k_candidate: int, n_candidate: int, band: Band,
                rules: Rules = Rules()) -> Comparison:
    """Compare two proportions (k of n requests each): the effect is candidate - baseline."""
    shares = (k_baseline / n_baseline if n_baseline else None, k_candidate / n_candidate if n_candidate else None)
    if n_baseline < rules.min_samples or n_candidate < rules.min_samples:
        return Comparison("insufficient", "difference", n_baseline, n_candidate, None, None, *shares)
    effect, p = newcombe(k_candidate, n_candidate, k_baseline, n_baseline, rules.confidence)
    return Comparison(state_of(p, effect, band, rules.alpha), "difference", n_baseline, n_candidate, effect, p,
                      *shares, p < rules.alpha)
