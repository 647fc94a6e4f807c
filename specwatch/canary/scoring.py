"""The canary's scoring: each metric pass / high / low, a weighted score, and a verdict per task in words.

After Kayenta's judge, stricter on evidence:

- A metric with per-request samples on both sides goes to the one judge (`specwatch.judge`,
  the study's too): it is `high` (or `low`) only when the difference is significant (p < alpha)
  *and* the whole Hodges-Lehmann interval of the effect lies beyond the allowed increase (or
  decrease). Otherwise it is `pass`: no evidence of a change larger than the tolerance.
- A metric known only as a figure from Prometheus (a ratio of rates or a p95) has no
  interval; its point ratio (or difference) against the tolerance decides, and the
  reason says so.
- Fewer than `min_samples` on either side is `insufficient`, never a pass: it is left out of
  the score, and when the metric is critical the task's verdict is "insufficient data".
- High or low fails the metric only in its bad direction (a faster TPOT is `low` and passes).
- A metric the policy names a caution for the comparison's kind (ITL p95 when the baseline does not
  speculate: `policy.comparisons`) is judged and shown, and a bad change is said as a caution: it
  neither fails the task nor lowers the score.
- Score = 100 x the weight of the metrics that did not fail / the weight of those judged.
  A critical metric that failed fails the task; otherwise score >= pass is pass, >= marginal
  is marginal, below is fail. The overall verdict is the worst task's (fail, insufficient
  data, marginal, pass in that order).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from specwatch import judge
from specwatch.canary.policy import SPECULATION_VS_NONE, MetricPolicy, Policy
from specwatch.canary.samples import METRICS, Data, Side
from specwatch.judge import Scale, State
from specwatch.stats import Shift

Verdict = Literal["pass", "marginal", "fail", "insufficient"]
VERDICTS: tuple[Verdict, ...] = ("fail", "insufficient", "marginal", "pass")  # worst first


@dataclass(frozen=True)
class MetricResult:
    metric: str
    state: State
    failed: bool
    critical: bool
    weight: float
    method: str  # how it was judged
    n_baseline: int
    n_candidate: int
    baseline: float | None = None  # the median (samples) or the figure (Prometheus)
    candidate: float | None = None
    effect: Shift | None = None  # ratio or difference, with its interval where there is one
    p_value: float | None = None
    reason: str = ""
    caution: bool = False  # a bad change here is a caution for this comparison's kind, not a failure


@dataclass(frozen=True)
class TaskVerdict:
    task: str
    verdict: Verdict
    score: float | None
    metrics: tuple[MetricResult, ...]
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class CanaryVerdict:
    baseline: str
    candidate: str
    window: str
    verdict: Verdict
    tasks: tuple[TaskVerdict, ...]
    sources: tuple[str, ...] = field(default_factory=tuple)
    comparison: str = ""  # the policy's comparison kind this verdict was judged as


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{value * 1000:.4g} ms"
    return f"{value:.4g}{' ' + unit if unit else ''}"


def _describe_effect(scale: str, effect: Shift) -> str:
    ci = f"{effect.confidence:.0%} CI"
    if scale == "ratio":
        return f"{effect.estimate:.3f}x the baseline ({ci} {effect.low:.3f}x to {effect.high:.3f}x)"
    return f"{effect.estimate:+.4f} vs the baseline ({ci} {effect.low:+.4f} to {effect.high:+.4f})"


def _tolerance(mp: MetricPolicy, scale: str) -> str:
    if scale == "ratio":
        return f"-{mp.allowed_decrease:.0%} .. +{mp.allowed_increase:.0%}"
    return f"-{mp.allowed_decrease:g} .. +{mp.allowed_increase:g}"


def _insufficient(mp: MetricPolicy, method: str, nb: int, nc: int, why: str) -> MetricResult:
    return MetricResult(mp.name, "insufficient", False, mp.critical, mp.weight, method, nb, nc,
                        reason=f"{METRICS[mp.name].title}: insufficient data ({why})")


def judge_metric(mp: MetricPolicy, policy: Policy, base: Side, cand: Side) -> MetricResult:
    spec = METRICS[mp.name]
    title, need = spec.title, policy.min_samples
    if spec.scale == "share":  # candidate-only floor (mirror mode)
        n = int(round(cand.counts.get(mp.name, 0)))
        value = cand.figures.get(mp.name)
        if value is None or n < need:
            return _insufficient(mp, "share (Prometheus)", 0, n, f"{n} compared requests, the policy needs {need}")
        assert mp.at_least is not None
        state: State = "low" if value < mp.at_least else "pass"
        failed = mp.fails(state)
        return MetricResult(mp.name, state, failed, mp.critical, mp.weight, "share (Prometheus)", 0, n, None, value,
                            reason=f"{title}: {value:.2%} of {n} greedy requests, the floor is {mp.at_least:.2%}"
                                   f"{' — fail' if failed else ''}")
    scale: Scale = "ratio" if spec.scale == "ratio" else "difference"
    band = judge.Band.around(scale, mp.allowed_decrease, mp.allowed_increase)  # no meaningful change
    if spec.per_request and (base.requests or cand.requests):
        method = "Newcombe interval, z-test" if spec.scale == "proportion" else (
            "Mann-Whitney U, Hodges-Lehmann on logs" if spec.scale == "ratio" else "Mann-Whitney U, Hodges-Lehmann")
        if spec.scale == "proportion":
            cmp = judge.proportions(base.errors, base.requests, cand.errors, cand.requests, band, policy.rules)
        else:
            cmp = judge.samples(base.samples.get(mp.name, []), cand.samples.get(mp.name, []),
                                    scale, band, policy.rules)
        nb, nc = cmp.n_baseline, cmp.n_candidate
        if cmp.state == "insufficient" or cmp.effect is None or cmp.p_value is None:
            why = (f"the baseline has no samples (does it {'speculate' if mp.name == 'acceptance_rate' else 'serve'}?)"
                   if nb == 0 else f"{nb} baseline and {nc} candidate samples, the policy needs {need} per side")
            return _insufficient(mp, method, nb, nc, why)
        state = cmp.state
        failed = mp.fails(state)
        reason = (f"{title}: candidate {_describe_effect(spec.scale, cmp.effect)}, p = {cmp.p_value:.2g}, "
                  f"n = {nb} / {nc}; tolerance {_tolerance(mp, spec.scale)}: {cmp.detail}"
                  f"{' — fail' + (' (critical)' if mp.critical else '') if failed else ''}")
        return MetricResult(mp.name, state, failed, mp.critical, mp.weight, method, nb, nc, cmp.baseline,
                            cmp.candidate, cmp.effect, cmp.p_value, reason)
    # Prometheus figures only: a ratio of rates (or of p95s), no interval
    method = "ratio of windowed rates (Prometheus), no interval"
    nb, nc = int(round(base.counts.get(mp.name, 0))), int(round(cand.counts.get(mp.name, 0)))
    bf, cf = base.figures.get(mp.name), cand.figures.get(mp.name)
    if bf is None or cf is None or nb < need or nc < need:
        why = ("no figure for " + " and ".join(s for s, f in (("the baseline", bf), ("the candidate", cf)) if f is None)
               if bf is None or cf is None else f"{nb} baseline and {nc} candidate requests, the policy needs {need}")
        return _insufficient(mp, method, nb, nc, why)
    if spec.scale == "ratio":
        if bf <= 0:
            return _insufficient(mp, method, nb, nc, "the baseline's figure is 0")
        point = cf / bf
        text = f"{point:.3f}x the baseline ({_fmt(cf, spec.unit)} vs {_fmt(bf, spec.unit)})"
    else:
        point = cf - bf
        text = f"{point:+.4f} vs the baseline ({cf:.4f} vs {bf:.4f})"
    state = "high" if point > band.high else "low" if point < band.low else "pass"
    failed = mp.fails(state)
    reason = (f"{title}: candidate {text}, n = {nb} / {nc}; tolerance {_tolerance(mp, spec.scale)}: "
              f"{'outside' if state != 'pass' else 'within'} (point estimate, no test)"
              f"{' — fail' + (' (critical)' if mp.critical else '') if failed else ''}")
    return MetricResult(mp.name, state, failed, mp.critical, mp.weight, method, nb, nc, bf, cf,
                        Shift(point, point, point, 0.0), None, reason)


def as_caution(result: MetricResult, kind: str) -> MetricResult:
    """A failed metric that is a caution for `kind`: shown as such, neither failing nor scored down."""
    if not result.failed:
        return dataclasses.replace(result, caution=True)
    why = "tokens arrive in bursts against a baseline that does not speculate" if kind == SPECULATION_VS_NONE else kind
    reason = result.reason.replace(" — fail (critical)", "").replace(" — fail", "")
    return dataclasses.replace(result, failed=False, caution=True,
                               reason=f"{reason} — caution ({kind.replace('_', ' ')}: {why})")


def judge_task(task: str, policy: Policy, base: Side, cand: Side, kind: str = "") -> TaskVerdict:
    results = tuple(as_caution(r, kind) if policy.is_caution(mp.name, kind) else r
                    for mp, r in ((mp, judge_metric(mp, policy, base, cand)) for mp in policy.metrics))
    judged = [r for r in results if r.state != "insufficient"]
    weight = sum(r.weight for r in judged)
    score = 100 * sum(r.weight for r in judged if not r.failed) / weight if weight > 0 else None
    critical_failed = [r for r in results if r.critical and r.failed]
    critical_missing = [r for r in results if r.critical and r.state == "insufficient"]
    reasons: list[str] = []
    verdict: Verdict
    if critical_failed:
        verdict = "fail"
        reasons += [f"critical metric failed: {r.reason}" for r in critical_failed]
    elif critical_missing or score is None:
        verdict = "insufficient"
        reasons += [f"critical metric without enough data: {r.reason}" for r in critical_missing] or [
            "no metric had enough data"]
    else:
        verdict = "pass" if score >= policy.pass_score else "marginal" if score >= policy.marginal_score else "fail"
        reasons.append(f"score {score:.0f} (pass at {policy.pass_score:g}, marginal at {policy.marginal_score:g})")
        reasons += [f"failed: {r.reason}" for r in results if r.failed]
    reasons += [f"caution: {r.reason}" for r in results if r.caution and r.state in ("high", "low")]
    reasons += [f"not judged: {r.reason}" for r in results if r.state == "insufficient" and not r.critical]
    return TaskVerdict(task, verdict, score, results, tuple(reasons))


def worst(verdicts: Sequence[Verdict]) -> Verdict:
    return min(verdicts, key=VERDICTS.index) if verdicts else "insufficient"


def canary_verdict(policy: Policy, data: Data, baseline: str, candidate: str, tasks: Sequence[str],
                   window: str, sources: Sequence[str] = ()) -> CanaryVerdict:
    """The verdict for every task; a task without data on a side is judged on an empty side (insufficient).
    The comparison's kind is the policy's, or (auto) speculation against speculation when the baseline drafted."""
    kind = policy.kind(baseline_speculates(data, baseline))
    out = tuple(judge_task(t, policy, data.get((t, baseline), Side()), data.get((t, candidate), Side()), kind)
                for t in tasks)
    return CanaryVerdict(baseline, candidate, window, worst([t.verdict for t in out]), out, tuple(sources), kind)


def baseline_speculates(data: Data, baseline: str) -> bool:
    """Whether the baseline drafted in the window: acceptance samples (event log) or a figure (Prometheus)."""
    return any(side.samples.get("acceptance_rate") or side.figures.get("acceptance_rate") is not None
               for (_, variant), side in data.items() if variant == baseline)
