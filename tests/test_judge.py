"""The one judge on planted samples: no change found where there is none, a real one found, too few never judged."""

from __future__ import annotations

import random

import pytest

from specwatch import judge
from specwatch.judge import Band, Rules

BAND = Band.around("ratio", 0.10, 0.10)  # the canary policy's TPOT tolerance


def _lognormal(rng: random.Random, n: int, median: float, sigma: float) -> list[float]:
    return [median * rng.lognormvariate(0, sigma) for _ in range(n)]


@pytest.mark.parametrize("n", [2, 5, 10, 19, 20, 24, 40, 100])
def test_identical_distributions_are_almost_never_high_or_low(n: int) -> None:
    """Per-request spreads like the real CPU server's TPOT (log sd 0.09 chat, 0.17 code), 200 draws each.

    A statistical judge can make a false change rare, not impossible: with the interval required to
    clear the +-10 % band as well as p < 0.05, at most 1 % of draws may be high or low (measured:
    0-0.7 % at log sd 0.2, none at 0.1 or from n = 50 on; 0.5-0.9 % at log sd 0.4 and n = 20-24)."""
    for sigma in (0.1, 0.2):
        changed = 0
        for seed in range(200):
            rng = random.Random(f"{n}-{sigma}-{seed}")
            base, cand = _lognormal(rng, n, 0.06, sigma), _lognormal(rng, n, 0.06, sigma)
            cmp = judge.samples(base, cand, "ratio", BAND)
            assert (cmp.state == "insufficient") == (n < judge.MIN_SAMPLES)
            assert (cmp.n_baseline, cmp.n_candidate) == (n, n)
            changed += cmp.state in ("high", "low")
        assert changed <= 2, (n, sigma, changed)


def test_a_planted_30_percent_regression_is_high_from_the_minimum_on() -> None:
    for n in (judge.MIN_SAMPLES, 24, 60):
        for seed in range(20):
            rng = random.Random(f"{n}-{seed}")
            base, cand = _lognormal(rng, n, 0.06, 0.1), _lognormal(rng, n, 0.06 * 1.3, 0.1)
            cmp = judge.samples(base, cand, "ratio", BAND)
            assert cmp.state == "high" and cmp.significant, (n, seed, cmp)
            assert cmp.effect is not None and 1.1 < cmp.effect.low < cmp.effect.estimate < cmp.effect.high
            assert cmp.detail == "significant and entirely higher than the tolerance"


def test_too_few_samples_are_insufficient_whatever_the_difference() -> None:
    base = [0.05 + i * 1e-4 for i in range(judge.MIN_SAMPLES - 1)]
    cand = [3 * v for v in base]  # three times slower, with no overlap at all
    cmp = judge.samples(base, cand, "ratio", BAND)
    assert cmp.state == "insufficient" and cmp.effect is None and cmp.p_value is None
    assert cmp.baseline is not None and cmp.candidate == pytest.approx(3 * cmp.baseline)
    assert judge.samples(base, cand, "ratio", BAND, Rules(min_samples=len(base))).state == "high"
    assert judge.proportions(0, 5, 5, 5, Band(-0.01, 0.01)).state == "insufficient"


def test_within_the_tolerance_is_pass_even_when_significant() -> None:
    rng = random.Random(3)
    base = _lognormal(rng, 400, 0.06, 0.05)
    cand = [v * 1.05 for v in _lognormal(rng, 400, 0.06, 0.05)]  # +5 %: real, inside +-10 %
    cmp = judge.samples(base, cand, "ratio", BAND)
    assert cmp.significant and cmp.state == "pass"
    assert cmp.within and cmp.detail == "no meaningful change (the interval lies inside the tolerance)"


def test_the_band_and_the_states_follow_the_scale() -> None:
    assert Band.around("ratio", 0.1, 0.2) == Band(0.9, 1.2)
    assert Band.around("difference", 0.05, 0.01) == Band(-0.05, 0.01)
    rng = random.Random(5)
    base = [rng.random() * 0.2 + 0.5 for _ in range(50)]
    lower = [v - 0.2 for v in base]
    cmp = judge.samples(base, lower, "difference", Band.around("difference", 0.05, 0.05))
    assert cmp.state == "low" and cmp.effect is not None and cmp.effect.estimate == pytest.approx(-0.2)


def test_blocked_samples_cancel_a_shift_that_hits_both_sides_of_a_round() -> None:
    """Per round, a slow machine multiplies both sides alike: the blocked effect is the same as on a quiet one, while a
    comparison of the pooled samples sees the spread between rounds as noise."""
    rng = random.Random(5)
    base = {r: _lognormal(rng, 6, 0.06, 0.05) for r in range(1, 5)}
    cand = {r: [v * 0.8 for v in _lognormal(rng, 6, 0.06, 0.05)] for r in range(1, 5)}
    quiet = judge.blocked(base, cand, "ratio", BAND)
    slow = {1: 1.0, 2: 1.6, 3: 0.7, 4: 1.3}
    noisy = judge.blocked({r: [v * slow[r] for v in vs] for r, vs in base.items()},
                          {r: [v * slow[r] for v in vs] for r, vs in cand.items()}, "ratio", BAND)
    assert quiet.state == noisy.state == "low" and quiet.rounds == noisy.rounds == 4
    assert quiet.effect is not None and noisy.effect is not None and quiet.over_rounds is not None
    assert noisy.effect.estimate == pytest.approx(quiet.effect.estimate)
    assert noisy.over_rounds is not None and noisy.over_rounds.high == pytest.approx(quiet.over_rounds.high)
    assert noisy.over_rounds.high < 0.9 and len(noisy.per_round) == 4
    pooled = judge.samples([v * slow[r] for r, vs in base.items() for v in vs],
                           [v * slow[r] for r, vs in cand.items() for v in vs], "ratio", BAND)
    assert pooled.effect is not None and noisy.effect is not None
    assert pooled.effect.high - pooled.effect.low > 2 * (noisy.effect.high - noisy.effect.low)


def test_rounds_that_disagree_leave_a_blocked_comparison_undecided() -> None:
    """Three rounds say -20 %, one says +30 %: the interval over rounds reaches across the band, so no `low`."""
    rng = random.Random(6)
    base = {r: _lognormal(rng, 6, 0.06, 0.03) for r in range(1, 5)}
    factor = {1: 0.8, 2: 0.8, 3: 1.3, 4: 0.8}
    cand = {r: [v * factor[r] for v in _lognormal(rng, 6, 0.06, 0.03)] for r in range(1, 5)}
    cmp = judge.blocked(base, cand, "ratio", BAND)
    assert cmp.over_rounds is not None and cmp.over_rounds.low < 0.9 < cmp.over_rounds.high
    assert cmp.state == "pass" and not cmp.within
    two = judge.blocked({1: base[1], 2: base[2]}, {1: cand[1], 2: cand[2]}, "ratio", BAND, judge.Rules(12))
    assert two.rounds == 2 and two.state == "low"  # with two rounds the aligned interval decides alone
