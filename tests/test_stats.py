"""Two-sample statistics against scipy and brute force on the same samples, and the canary's scoring on known truths."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats as sp  # type: ignore[import-untyped]

from specwatch import resources
from specwatch.canary import policy as policy_mod
from specwatch.canary.samples import Side, parse_window
from specwatch.canary.scoring import judge_task
from specwatch.stats import compare, hodges_lehmann, mann_whitney, newcombe, wilson

REPO = Path(__file__).resolve().parents[1]


def _samples() -> list[tuple[str, list[float], list[float]]]:
    rng = random.Random(7)
    return [
        ("normal, shifted", [rng.gauss(10, 2) for _ in range(40)], [rng.gauss(11, 2) for _ in range(55)]),
        ("lognormal, equal", [rng.lognormvariate(0, 0.5) for _ in range(30)],
         [rng.lognormvariate(0, 0.5) for _ in range(30)]),
        ("heavy ties", [float(rng.randint(0, 4)) for _ in range(50)], [float(rng.randint(1, 5)) for _ in range(45)]),
        ("binary", [float(rng.random() < 0.1) for _ in range(80)], [float(rng.random() < 0.3) for _ in range(70)]),
        ("tiny", [1.0, 2.0, 3.0], [2.5, 4.0]),
        ("disjoint", [float(i) for i in range(20)], [float(i) + 100 for i in range(25)]),
    ]


@pytest.mark.parametrize(("name", "x", "y"), _samples(), ids=[s[0] for s in _samples()])
def test_mann_whitney_matches_scipy_asymptotic(name: str, x: list[float], y: list[float]) -> None:
    ours = mann_whitney(x, y)
    theirs = sp.mannwhitneyu(x, y, alternative="two-sided", method="asymptotic", use_continuity=True)
    assert ours.u == pytest.approx(float(theirs.statistic), abs=1e-9)
    assert ours.p_value == pytest.approx(float(theirs.pvalue), rel=1e-9, abs=1e-15)


def test_mann_whitney_on_identical_constant_samples_is_no_evidence() -> None:
    assert mann_whitney([3.0] * 10, [3.0] * 12).p_value == 1.0


@pytest.mark.parametrize(("name", "x", "y"), _samples(), ids=[s[0] for s in _samples()])
def test_hodges_lehmann_is_the_median_of_all_pairwise_differences(name: str, x: list[float], y: list[float]) -> None:
    brute = np.subtract.outer(np.asarray(x), np.asarray(y)).ravel()
    shift = hodges_lehmann(x, y)
    assert shift.estimate == pytest.approx(float(np.median(brute)), abs=1e-12)
    assert shift.low <= shift.estimate <= shift.high
    # the interval's ends are order statistics of the differences, symmetric in rank
    ordered = np.sort(brute)
    lo_rank = int(np.searchsorted(ordered, shift.low, side="left"))
    hi_rank = int(np.searchsorted(ordered, shift.high, side="right"))
    assert ordered[lo_rank] == shift.low and ordered[hi_rank - 1] == shift.high


def test_hodges_lehmann_interval_uses_the_moses_rank_for_10_and_10() -> None:
    """n1 = n2 = 10 at 95 %: the exact tables' critical U is 23, so the interval is [d_(24), d_(77)]."""
    x = [float(i * i) for i in range(10)]
    y = [float(3 * i + 0.5) for i in range(10)]
    d = sorted(a - b for a in x for b in y)
    shift = hodges_lehmann(x, y, 0.95)
    assert (shift.low, shift.high) == (d[23], d[76])


def test_hodges_lehmann_interval_covers_the_true_shift_about_95_percent_of_the_time() -> None:
    rng = random.Random(11)
    trials, hits = 400, 0
    for _ in range(trials):
        x = [rng.expovariate(1.0) + 0.7 for _ in range(25)]  # skewed, shifted by 0.7
        y = [rng.expovariate(1.0) for _ in range(30)]
        s = hodges_lehmann(x, y, 0.95)
        hits += s.low <= 0.7 <= s.high
    # binomial(400, 0.95) has a standard deviation of 1.1 points: 0.91 .. 0.99 is a wide, safe band
    assert 0.91 <= hits / trials <= 0.99, hits / trials


def test_log_scale_effect_is_a_ratio() -> None:
    rng = random.Random(3)
    base = [rng.lognormvariate(math.log(0.010), 0.2) for _ in range(200)]
    cand = [v * 1.5 for v in (rng.lognormvariate(math.log(0.010), 0.2) for _ in range(200))]
    cmp = compare(base, cand, log_scale=True)
    assert cmp.effect.low < 1.5 < cmp.effect.high
    assert 1.4 < cmp.effect.estimate < 1.6 and cmp.p_value < 1e-10


@pytest.mark.parametrize(("k", "n"), [(0, 20), (3, 40), (17, 17), (50, 120)])
def test_wilson_matches_scipy(k: int, n: int) -> None:
    ci = sp.binomtest(k, n).proportion_ci(0.95, method="wilson")
    low, high = wilson(k, n, 1.959963984540054)
    assert (low, high) == pytest.approx((ci.low, ci.high), abs=1e-12)


@pytest.mark.parametrize(("k1", "n1", "k2", "n2"), [(9, 60, 2, 70), (1, 40, 1, 45), (0, 30, 4, 30)])
def test_newcombe_z_test_matches_the_chi_square_test(k1: int, n1: int, k2: int, n2: int) -> None:
    shift, p = newcombe(k1, n1, k2, n2)
    table = [[k1, n1 - k1], [k2, n2 - k2]]
    assert p == pytest.approx(sp.chi2_contingency(table, correction=False).pvalue, rel=1e-9)
    assert shift.estimate == pytest.approx(k1 / n1 - k2 / n2)
    assert shift.low < shift.estimate < shift.high


# -- the judge on samples whose truth is known -------------------------------------------------------------
def _side(rng: random.Random, n: int, tpot: float, errors: int = 0) -> Side:
    side = Side(requests=n, errors=errors)
    side.samples["tpot"] = [rng.lognormvariate(math.log(tpot), 0.15) for _ in range(n)]
    side.samples["ttft"] = [rng.lognormvariate(math.log(0.05), 0.2) for _ in range(n)]
    side.samples["e2e"] = [t * 64 for t in side.samples["tpot"]]
    side.samples["output_tps"] = [64 / e for e in side.samples["e2e"]]
    return side


@pytest.fixture(scope="module")
def policy() -> policy_mod.Policy:
    return policy_mod.load(resources.CANARY_POLICY)


def test_a_slower_candidate_fails_on_tpot_and_a_faster_one_passes(policy: policy_mod.Policy) -> None:
    rng = random.Random(5)
    base = _side(rng, 60, 0.010)
    slower = judge_task("code", policy, base, _side(rng, 60, 0.014))
    tpot = next(m for m in slower.metrics if m.metric == "tpot")
    assert (slower.verdict, tpot.state, tpot.failed) == ("fail", "high", True)
    assert "critical" in slower.reasons[0] and "TPOT" in slower.reasons[0]
    faster = judge_task("code", policy, base, _side(rng, 60, 0.006))
    tpot = next(m for m in faster.metrics if m.metric == "tpot")
    assert (faster.verdict, tpot.state, tpot.failed) == ("pass", "low", False)


def test_same_distribution_passes_and_too_few_samples_is_insufficient(policy: policy_mod.Policy) -> None:
    rng = random.Random(9)
    same = judge_task("chat", policy, _side(rng, 80, 0.010), _side(rng, 80, 0.010))
    assert same.verdict == "pass" and same.score == 100
    few = judge_task("chat", policy, _side(rng, 5, 0.010), _side(rng, 5, 0.030))
    assert few.verdict == "insufficient"
    assert all(m.state == "insufficient" for m in few.metrics)


def test_errors_on_the_candidate_fail_the_critical_error_ratio(policy: policy_mod.Policy) -> None:
    rng = random.Random(2)
    result = judge_task("code", policy, _side(rng, 200, 0.010, errors=0), _side(rng, 200, 0.010, errors=30))
    err = next(m for m in result.metrics if m.metric == "error_ratio")
    assert (err.state, err.failed, result.verdict) == ("high", True, "fail")


def test_policy_errors_name_the_key(tmp_path: Path) -> None:
    doc = yaml.safe_load((resources.CANARY_POLICY).read_text())
    doc["metrics"]["tpot"]["direction"] = "down"
    with pytest.raises(policy_mod.PolicyError, match=r"metrics\.tpot\.direction"):
        policy_mod.parse(doc)
    doc["metrics"]["tpot"]["direction"] = "lower_is_better"
    doc["metrics"]["nonsense"] = {"direction": "no_change"}
    with pytest.raises(policy_mod.PolicyError, match="unknown metric"):
        policy_mod.parse(doc)
    assert parse_window("10m") == 600
    with pytest.raises(ValueError):
        parse_window("10 minutes")
