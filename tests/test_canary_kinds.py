"""The policy's comparison kinds in the canary's scoring: ITL p95 a caution against a baseline that does not
speculate, a gate between two speculative configs; `auto` tells them apart by whether the baseline drafted.

Per-request samples (as the event log gives) for TPOT and acceptance, Prometheus figures for ITL p95 (the
only source of it), planted: the candidate's TPOT 20 % faster, its ITL p95 1.5x the baseline's.
"""

from __future__ import annotations

import random

import pytest
import yaml

from specwatch import resources
from specwatch.canary import policy as policy_mod
from specwatch.canary.samples import Side
from specwatch.canary.scoring import CanaryVerdict, canary_verdict


def side(tpot: float, itl_p95: float, drafts: bool, rng: random.Random, n: int = 40) -> Side:
    s = Side(requests=n)
    s.samples["tpot"] = [tpot * rng.lognormvariate(0, 0.05) for _ in range(n)]
    if drafts:
        s.samples["acceptance_rate"] = [0.6 + 0.05 * rng.random() for _ in range(n)]
    s.figures["itl_p95"], s.counts["itl_p95"] = itl_p95, float(n)
    return s


def verdict_of(baseline_drafts: bool, policy: policy_mod.Policy | None = None) -> CanaryVerdict:
    rng = random.Random(5)
    data = {("code", "baseline"): side(0.010, 0.020, baseline_drafts, rng),
            ("code", "candidate"): side(0.008, 0.030, True, rng)}
    return canary_verdict(policy or policy_mod.load(), data, "baseline", "candidate", ("code",), "10m")


def test_bursts_against_a_baseline_that_does_not_speculate_are_a_caution_not_a_failure() -> None:
    v = verdict_of(baseline_drafts=False)
    itl = {m.metric: m for m in v.tasks[0].metrics}["itl_p95"]
    assert v.comparison == "speculation_vs_none" and v.verdict == "pass", v.tasks[0].reasons
    assert itl.state == "high" and not itl.failed and itl.caution and "caution (speculation vs none" in itl.reason
    assert v.tasks[0].score == 100 and any(r.startswith("caution: ITL p95") for r in v.tasks[0].reasons)


def test_the_same_bursts_between_two_speculative_configs_fail_the_metric() -> None:
    v = verdict_of(baseline_drafts=True)
    itl = {m.metric: m for m in v.tasks[0].metrics}["itl_p95"]
    assert v.comparison == "speculation_vs_speculation"
    assert itl.failed and not itl.caution and v.tasks[0].score is not None and v.tasks[0].score < 100


def test_a_named_kind_wins_over_the_data() -> None:
    doc = yaml.safe_load(resources.CANARY_POLICY.read_text())
    strict = policy_mod.parse({**doc, "comparison": "speculation_vs_speculation"})
    assert verdict_of(baseline_drafts=False, policy=strict).comparison == "speculation_vs_speculation"
    lenient = policy_mod.parse({**doc, "comparisons": {"speculation_vs_none": {"cautions": ["itl_p95"]},
                                                       "speculation_vs_speculation": {"cautions": ["itl_p95"]}}})
    assert not {m.metric: m for m in verdict_of(True, lenient).tasks[0].metrics}["itl_p95"].failed


@pytest.mark.parametrize("change, message", [
    ({"comparison": "spec_vs_none"}, "comparison: expected auto or one of"),
    ({"comparisons": {"speculation_vs_none": {"cautions": ["itl"]}, "speculation_vs_speculation": {}}},
     "cautions: expected a list of the policy's metrics"),
    ({"comparisons": {"speculation_vs_none": {"cautions": []}}}, "expected a mapping with exactly"),
])
def test_a_bad_comparison_is_named(change: dict, message: str) -> None:
    with pytest.raises(policy_mod.PolicyError, match=message):
        policy_mod.parse({**yaml.safe_load(resources.CANARY_POLICY.read_text()), **change})


def test_the_alerts_read_the_same_policy() -> None:
    """Thresholds as the policy's tolerances; the ITL alert as its comparison kinds say (promtool runs the default's
    cases in specwatch/data/prometheus/tests/alerts.test.yml: no ITL alert against a baseline that does not draft)."""
    from specwatch.monitoring import MONITORING
    from specwatch.promconfig.alerts import alerting_rules, baseline_drafts, from_policy

    policy = policy_mod.load()
    alerts = MONITORING.alerts
    # read from the policy, not written beside it: a policy with other tolerances moves the alerts with it
    assert from_policy(alerts.tpot_regression).level == pytest.approx(1 + policy.metric("tpot").allowed_increase)
    assert from_policy(alerts.itl_regression).level == pytest.approx(1 + policy.metric("itl_p95").allowed_increase)
    assert alerts.tpot_regression.threshold is None and alerts.itl_regression.threshold is None
    doc = yaml.safe_load(resources.CANARY_POLICY.read_text())
    tighter = policy_mod.parse({**doc, "metrics": {**doc["metrics"], "tpot": {**doc["metrics"]["tpot"],
                                                                               "allowed_increase": 0.03}}})
    rules = {r.name: r for r in alerting_rules(tighter)}
    assert "candidate_over_baseline_rate5m > 1.03\n" in rules[alerts.tpot_regression.name].expr

    def itl_alert(**change: object) -> str | None:
        rules = {r.name: r for r in alerting_rules(policy_mod.parse({**doc, **change}))}
        rule = rules.get(alerts.itl_regression.name)
        return None if rule is None else rule.expr

    default = itl_alert()
    assert default is not None and baseline_drafts() in default
    gate = itl_alert(comparisons={"speculation_vs_none": {"cautions": []},
                                  "speculation_vs_speculation": {"cautions": []}})
    assert gate is not None and baseline_drafts() not in gate
    assert itl_alert(comparison="speculation_vs_none") is None  # a caution for every comparison this policy makes
