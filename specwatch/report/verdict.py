"""GO / NO-GO / INCONCLUSIVE per variant and task: the article's rules, on per-request samples, by the one judge.

Performance at the target concurrency, per task: TPOT, the ITL p95 of each request and each
request's output tokens per second, candidate against baseline, judged by `specwatch.judge` (the
canary's judge) once per report (`specwatch.report.judgements`, the table the verdicts read) with the canary
policy's tolerances, level and minimum samples (by default
`specwatch/data/canary-policy.yaml`: TPOT and output tokens/s +-10 %, ITL p95 +-20 %, 20 requests
per side). Each metric gets a line with the effect, its interval and the samples it rests on,
"TPOT -19 % [-31 %, -6 %], n = 24 / 24", and what the judge found: better, worse, no change beyond
the tolerance, or insufficient data. The acceptance rate is the candidate's exact C / D of the
acceptance pass (summed first, then divided) with the ratio estimator's interval over requests.

The verdict:
- NO-GO: the run did not finish; the greedy outputs differ from the baseline's (a difference that
  starts at a near-tie of the model's two best tokens is float numerics, said and not counted:
  `specwatch.report.quality`); the KV capacity lost is above the bound (these three exact rules as
  before); or TPOT or output tokens/s is worse
  beyond its tolerance (the judge's `high` / `low` in the metric's bad direction: a canary fail).
  A worse ITL p95 is said as a caution against a baseline that does not speculate, and is a NO-GO
  like TPOT against one that does (the policy's comparison kinds, `deciding`).
- GO: TPOT and output tokens/s both better beyond their tolerance (the article's "both beat the
  baseline", with evidence) and nothing for a NO-GO.
- INCONCLUSIVE: anything else. Fewer samples than the judge's minimum (the canary's
  `insufficient`) never gives a GO or a NO-GO on performance; nor does a change within the
  tolerance (the canary's `pass`) or an interval that reaches beyond it ("undecided"); nor a
  missing baseline; nor a machine that drifted in a way the design cannot cancel.

In rounds (an interleaved or bracketed study) each metric is compared within rounds
(`specwatch.judge.blocked`: an interval over requests and one over rounds). Every line names the
baseline's drift against itself over the study (`specwatch.report.drift`); `_drift_reason` says
when that drift voids a decision and when the blocking cancelled it.
Reasons name the article's two traps: gains only at concurrencies below the target, and high
acceptance (exact C / D >= 60 %) without an end-to-end gain.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from specwatch.canary import policy as policy_mod
from specwatch.report.drift import Drift, drift
from specwatch.report.judgements import (
    TITLES,
    Judgements,
    MetricLine,
    band,
    metric_policy,
    pct,
    server_clock,
    variant_tasks,
)
from specwatch.report.quality import NEAR_TIE_NATS, identity
from specwatch.report.results import RunResults, VariantResults
from specwatch.stats import Shift, ratio_of_sums

HIGH_ACCEPTANCE = 0.6
DEFAULT_CAPACITY_LOSS = 0.25

Outcome = Literal["go", "no-go", "inconclusive"]
LABELS: dict[Outcome, str] = {"go": "GO", "no-go": "NO-GO", "inconclusive": "INCONCLUSIVE"}
MIN_ACCEPTANCE_REQUESTS = 8  # the acceptance rate's interval is over requests: fewer give a figure, no interval
# The article's rule decides on TPOT and output tokens/s. The ITL tail is judged and shown; against a
# baseline that does not speculate a worse one is a caution, not a NO-GO (a chunk's gap is a whole step,
# and a verify step is longer than a plain one by construction, so every speculative config streams in
# longer bursts even where it wins); between two speculative configs it decides too. The policy's
# comparison kinds say which (`deciding`), for the canary and the alerts alike.
DECIDING = ("tpot", "output_tps")


def deciding(policy: policy_mod.Policy, baseline_speculates: bool) -> tuple[tuple[str, ...], str]:
    """The metrics whose worse change is a NO-GO for this comparison, and the comparison's kind."""
    kind = policy.kind(baseline_speculates)
    return DECIDING + tuple(m for m in ("itl_p95",) if not policy.is_caution(m, kind)), kind


@dataclass(frozen=True)
class Verdict:
    variant: str
    task: str
    outcome: Outcome
    reason: str
    metrics: tuple[MetricLine, ...] = ()

    @property
    def go(self) -> bool:
        return self.outcome == "go"

    @property
    def label(self) -> str:
        return LABELS[self.outcome]


def _acceptance(v: VariantResults, task: str) -> MetricLine | None:
    """The acceptance pass's C / D with its interval over requests (Student's t), from 8 requests on."""
    pairs = v.spec_requests.get(task, [])
    if not pairs or not sum(d for _, d in pairs):
        return None
    e = ratio_of_sums([c for c, _ in pairs], [d for _, d in pairs])
    interval = (f" [{max(e.low, 0):.0%}, {min(e.high, 1):.0%}]" if len(pairs) >= MIN_ACCEPTANCE_REQUESTS else
                f" (no interval: {MIN_ACCEPTANCE_REQUESTS} requests needed)")
    return MetricLine("acceptance_rate", None, None, None,
                      f"acceptance {e.estimate:.0%}{interval}, n = {len(pairs)} requests (acceptance pass, C / D)")


def judge(run: RunResults, baseline_name: str, target_concurrency: int, judgements: Judgements,
          capacity_loss_bound: float = DEFAULT_CAPACITY_LOSS) -> list[Verdict]:
    """A verdict per candidate and task, from the report's judgements (`specwatch.report.judgements.build` with the
    same baseline and target) and their policy."""
    return [_judge_one(v, baseline, task, target_concurrency, capacity_loss_bound, judgements, run.design)
            for v, baseline in run.candidates(baseline_name) for task in variant_tasks(v)]


def _gain(lines: Sequence[MetricLine]) -> bool:
    found = {m.metric: m.finding for m in lines}
    return found.get("tpot") == "better" and found.get("output_tps") == "better"


@dataclass(frozen=True)
class Drifts:
    """The TPOT drift of each side against itself over the study (the A/A test, every task pooled)."""

    base: Drift | None  # the baseline's largest move
    cand_alongside: Drift | None  # the candidate's move between the same two rounds
    cand: Drift | None  # the candidate's own largest move


def drifts(v: VariantResults, baseline: VariantResults, task: str, target: int, policy: policy_mod.Policy) -> Drifts:
    tpot = band(metric_policy(policy, "tpot"))
    clock = server_clock(v, baseline, target, task)
    base = drift(baseline, target, "tpot", tpot, clock)
    pair = (base.first, base.second) if base is not None and base.first.startswith("round") else None
    return Drifts(base, drift(v, target, "tpot", tpot, clock, pair) if pair else None,
                  drift(v, target, "tpot", tpot, clock))


@dataclass(frozen=True)
class DriftNote:
    """What a verdict's line says about drift."""

    text: str
    voids: bool = False  # the design cannot cancel it: no GO or NO-GO on performance
    first: bool = False  # it explains the verdict: said before the figures


def _drift_reason(design: str, d: Drifts, perf: Sequence[MetricLine], decided: bool, tolerance: float) -> DriftNote:
    """What the verdict's line says about drift, and whether the drift voids a decision on performance.

    Sequential: a baseline that moved beyond the tolerance within its window voids it (nothing can cancel it).
    In rounds: a baseline that moved beyond the tolerance between two rounds while the candidate, between the
    same rounds, did not move with it (`_unlike`) voids it: the blocks of those rounds saw different conditions.
    A drift that hit both sides alike is cancelled by the blocking and named. A comparison left undecided says
    first what moved: either side beyond the tolerance, or rounds whose own effects disagree (decided over
    requests, not over rounds: the blocks of a round saw different conditions)."""
    title, base = TITLES["tpot"], d.base
    if design == "sequential":
        if base is None:
            return DriftNote("drift not measured (too few baseline requests); a sequential design neither sees nor "
                             "cancels drift between the variants' windows")
        if base.beyond:
            return DriftNote(f"the machine drifted: {base.text(title)}; a sequential design cannot cancel it",
                             voids=True, first=True)
        return DriftNote(f"drift: {base.text(title)}, within the tolerance; a sequential design neither sees nor "
                         "cancels drift between the variants' windows")
    if base is None:
        return DriftNote("drift not measured (too few baseline requests per round)")
    along = d.cand_alongside
    if base.beyond and (along is None or _unlike(base.ratio, along.ratio, tolerance)):
        alongside = f", {along.variant} {pct(along.ratio.estimate)} between the same rounds" if along else ""
        return DriftNote(f"the machine drifted: {base.text(title)}{alongside}: the blocks of those rounds saw "
                         "different conditions", voids=True, first=True)
    if not decided:
        moved = [x.text(title) for x in (base, d.cand) if x is not None and x.beyond]
        moved += [f"the rounds disagree on {TITLES[m.metric]} ({pct(min(m.comparison.per_round))} .. "
                  f"{pct(max(m.comparison.per_round))} by round)" for m in perf
                  if m.metric in DECIDING and m.comparison is not None and m.comparison.rounds_disagree]
        if moved:
            named = "" if base.beyond else f" (baseline {base.text(title).partition(' ')[2]}, within the tolerance)"
            return DriftNote(f"the machine drifted: {'; '.join(moved)}: no decision{named}", first=True)
    if base.beyond:
        assert along is not None
        return DriftNote(f"drift: {base.text(title)} and {along.variant} {pct(along.ratio.estimate)} alike, beyond "
                         "the tolerance; compared within rounds, the blocking cancels it")
    return DriftNote(f"drift: {base.text(title)} over {base.parts} rounds, within the tolerance")


def _unlike(base: Shift, cand: Shift, tolerance: float) -> bool:
    """Two moves between the same rounds that differ with evidence: their intervals do not overlap, and their
    estimates lie further apart than the tolerance."""
    apart = abs(math.log(cand.estimate / base.estimate)) > math.log(1 + tolerance)
    return apart and (base.low > cand.high or cand.low > base.high)


def _judge_one(v: VariantResults, baseline: VariantResults | None, task: str, target: int, bound: float,
               judgements: Judgements, design: str = "sequential") -> Verdict:
    if v.state != "done":
        return Verdict(v.name, task, "no-go", f"the run did not finish ({v.state}: {v.error or 'no status'})")
    if baseline is None or baseline.state != "done":
        return Verdict(v.name, task, "inconclusive", "no finished baseline to compare with")
    reasons: list[str] = []
    no_go = False
    policy = judgements.policy
    perf = judgements.perf(v.name, task, target)
    reasons.append(f"at concurrency {target}: " + "; ".join(m.text for m in perf))
    gates, kind = deciding(policy, baseline.speculative)
    worse = [TITLES[m.metric] for m in perf if m.finding == "worse" and m.metric in gates]
    decided = bool(worse) or _gain(perf)
    note = _drift_reason(design, drifts(v, baseline, task, target, policy), perf, decided,
                         metric_policy(policy, "tpot").allowed_increase)
    void = note.voids
    if void:
        worse = []
    reasons.insert(0 if note.first else len(reasons), note.text)
    if worse:
        no_go = True
        reasons.append(f"{' and '.join(worse)} worse than the baseline beyond the tolerance")
    if any(m.finding == "worse" for m in perf if m.metric not in gates):
        reasons.append("caution: ITL p95 worse beyond the tolerance (tokens arrive in bursts: a verify step "
                       f"takes longer than a plain one; a caution when comparing {kind.replace('_', ' ')})")
    gain = _gain(perf) and not void
    judged = all(m.finding != "insufficient data" for m in perf if m.metric in ("tpot", "output_tps"))
    lines = list(perf)
    accept = _acceptance(v, task)
    if accept is not None:
        lines.append(accept)
        reasons.append(accept.text)
    if not gain:
        lower = [c for c in sorted(set(v.requests) | set(v.perf)) if c < target
                 and _gain(judgements.perf(v.name, task, c))]
        if lower:
            reasons.append(f"gains only at concurrency {', '.join(map(str, lower))}, below the target")
        rate = v.acceptance[task].acceptance_rate if task in v.acceptance else None
        if judged and not void and rate is not None and rate >= HIGH_ACCEPTANCE:
            reasons.append(f"high acceptance ({rate:.0%}) without an end-to-end gain: "
                           "the draft costs what it saves")
    if task in v.outputs and task in baseline.outputs:
        same = identity(v.outputs[task], baseline.outputs[task])
        ties = same.near_ties
        tie_text = (f"{ties} part{'s' if ties == 1 else ''} at a near-tie (the two runs' top two within "
                    f"{NEAR_TIE_NATS:g} nats: numerics, not quality)")
        if same.all_identical:
            reasons.append(f"outputs identical to the baseline's ({same.identical}/{same.compared})")
        elif same.compared and same.quality_differences == 0:
            reasons.append(f"outputs identical to the baseline's in {same.identical} of {same.compared} requests; "
                           f"the other {tie_text}")
        else:
            no_go = True
            reasons.append(f"outputs differ from the baseline's in {same.compared - same.identical} of "
                           f"{same.compared} requests (quality check fails"
                           f"{f'; {tie_text}' if ties else ''})")
    if v.num_gpu_blocks is not None and baseline.num_gpu_blocks:
        loss = 1 - v.num_gpu_blocks / baseline.num_gpu_blocks
        reasons.append(f"KV capacity {0.0 - loss:+.0%} ({v.num_gpu_blocks} vs {baseline.num_gpu_blocks} blocks)")
        if loss > bound:
            no_go = True
            reasons.append(f"capacity loss above the {bound:.0%} bound")
    outcome: Outcome = "no-go" if no_go else "go" if gain else "inconclusive"
    return Verdict(v.name, task, outcome, "; ".join(reasons), tuple(lines))
