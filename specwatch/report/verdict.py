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
  missing baseline; nor a machine that drifted in a way the design cannot cancel (either side's drift:
  `_drift_reason`); nor, on TPOT or output tok/s, requests of either side that split into two modes
  further apart than the tolerance (`specwatch.report.modes`): the line says so.

In rounds (an interleaved or bracketed study) each metric is compared within rounds
(`specwatch.judge.blocked`: an interval over requests and one over rounds). Every line names each
side's drift against itself over the study (`specwatch.report.drift`); `_drift_reason` says when a
drift voids a decision and when the blocking cancelled it. Two servers that differ in more than their
speculative config (vLLM version, model runner, backend, other argv: `specwatch.report.confounders`)
are named on the line ("the sides differ beyond speculation: ..."); that alone voids nothing: the
comparison is measured, of more than speculation, and the reader is told.
Reasons name the article's two traps: gains only at concurrencies below the target, and high
acceptance (exact C / D >= 60 %) without an end-to-end gain.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from specwatch.canary import policy as policy_mod
from specwatch.judge import Band
from specwatch.report import confounders
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
from specwatch.report.modes import two_modes
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


def verdicts(run: RunResults, baseline_name: str, target_concurrency: int, judgements: Judgements,
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
    """The TPOT drift of each side against itself over the study (the A/A test, every task pooled), and each
    side's move between the rounds where the other side moved most (None where those rounds lack its requests)."""

    base: Drift | None  # the baseline's largest move
    cand_alongside: Drift | None  # the candidate's move between the same two rounds
    cand: Drift | None  # the candidate's own largest move
    base_alongside: Drift | None = None  # the baseline's move between the candidate's two rounds


def drifts(v: VariantResults, baseline: VariantResults, task: str, target: int, policy: policy_mod.Policy) -> Drifts:
    tpot = band(metric_policy(policy, "tpot"))
    clock = server_clock(v, baseline, target, task)
    base = drift(baseline, target, "tpot", tpot, clock)
    cand = drift(v, target, "tpot", tpot, clock)

    def alongside(of: VariantResults, moved: Drift | None) -> Drift | None:
        if moved is None or not moved.first.startswith("round"):
            return None
        return drift(of, target, "tpot", tpot, clock, (moved.first, moved.second))

    return Drifts(base, alongside(v, base), cand, alongside(baseline, cand))


@dataclass(frozen=True)
class DriftNote:
    """What a verdict's line says about drift."""

    text: str
    voids: bool = False  # the design cannot cancel it: no GO or NO-GO on performance
    first: bool = False  # it explains the verdict: said before the figures


def _within(base: Drift | None, title: str) -> str:
    """' (baseline TPOT -3 % between round 2 and round 4, within the tolerance)': the baseline's own drift, named
    where the line is about another move."""
    if base is None or base.beyond:
        return ""
    return f" ({base.text(title)}, within the tolerance)"


def _drift_reason(design: str, d: Drifts, perf: Sequence[MetricLine], decided: bool, tpot_band: Band) -> DriftNote:
    """What the verdict's line says about drift, and whether the drift voids a decision on performance.

    Each side's drift is its largest TPOT move against itself (`specwatch.report.drift`); it is beyond the tolerance
    when the move's whole interval lies outside the band. The same rule holds for the baseline and the candidate.

    Sequential: either side beyond the tolerance within its own window voids a decision (nothing can cancel it).
    In rounds (interleaved, bracketed; from 2 rounds on): a side that moved beyond the tolerance between two rounds
    voids it unless the other side, between the same rounds, moved alike (`_alike`: the ratio of the two moves has
    an interval inside the tolerance band); the blocking then cancels it, and the line names both moves. A move the
    other side did not make, or one where the intervals are too wide to tell, voids it. A comparison left undecided
    says first where the rounds' own effects disagree (decided over requests, not over rounds)."""
    title, base, cand = TITLES["tpot"], d.base, d.cand
    moved = [x for x in (base, cand) if x is not None and x.beyond]
    if design == "sequential":
        if moved:
            return DriftNote(f"the machine drifted: {'; '.join(x.text(title) for x in moved)}; a sequential design "
                             f"cannot cancel it{_within(base, title)}", voids=True, first=True)
        if base is None:
            return DriftNote("drift not measured (too few baseline requests); a sequential design neither sees nor "
                             "cancels drift between the variants' windows")
        own = f" and {cand.text(title)}" if cand is not None else ""
        return DriftNote(f"drift: {base.text(title)}{own}, within the tolerance; a sequential design neither sees "
                         "nor cancels drift between the variants' windows")
    voiding: list[str] = []
    cancelled: list[str] = []
    for x, other in ((base, d.cand_alongside), (cand, d.base_alongside)):
        if x is None or not x.beyond:
            continue
        if other is None:
            voiding.append(f"{x.text(title)}, the other side not measured in those rounds")
            continue
        alike, ratio = _alike(x.ratio, other.ratio, tpot_band)
        both = f"{x.text(title)} against {other.variant} {pct(other.ratio.estimate)} between the same rounds"
        if alike:
            cancelled.append(f"{both}: alike (their ratio {pct(ratio.estimate)} [{pct(ratio.low)}, {pct(ratio.high)}],"
                             " inside the tolerance)")
        elif _unlike(x.ratio, other.ratio, tpot_band):
            voiding.append(f"{both} (the blocks of those rounds saw different conditions)")
        else:
            voiding.append(f"{both} (their ratio {pct(ratio.estimate)} [{pct(ratio.low)}, {pct(ratio.high)}] reaches "
                           "beyond the tolerance: too few requests per round to tell whether both moved alike)")
    disagree = [] if decided else [
        f"the rounds disagree on {TITLES[m.metric]} ({pct(min(m.comparison.per_round))} .. "
        f"{pct(max(m.comparison.per_round))} by round)" for m in perf
        if m.metric in DECIDING and m.comparison is not None and m.comparison.rounds_disagree]
    if voiding or disagree:
        return DriftNote(f"the machine drifted: {'; '.join(voiding + disagree)}: no decision{_within(base, title)}",
                         voids=bool(voiding), first=True)
    if cancelled:
        return DriftNote(f"drift: {'; '.join(cancelled)}, beyond the tolerance; compared within rounds, the "
                         f"blocking cancels it{_within(base, title)}")
    if base is None:
        return DriftNote("drift not measured (too few baseline requests per round)")
    own = f", {cand.text(title)}" if cand is not None else ""
    return DriftNote(f"drift: {base.text(title)}{own} over {base.parts} rounds, within the tolerance")


def _alike(x: Shift, y: Shift, tpot_band: Band) -> tuple[bool, Shift]:
    """Whether two moves between the same rounds are measured alike, and the ratio of the second to the first.

    The ratio's interval is on the log scale the estimate of log(y / x) with a half-width of the root of the sum of
    squares of the two moves' own half-widths (the two sides' requests are independent). Alike only when that whole
    interval lies inside the tolerance band: the two moves are the same within the tolerance and measured narrowly
    enough to say so. Too few requests per round give an interval that reaches beyond the band: not alike."""
    half = math.hypot(math.log(x.high / x.low) / 2, math.log(y.high / y.low) / 2)
    centre = math.log(y.estimate / x.estimate)
    ratio = Shift(math.exp(centre), math.exp(centre - half), math.exp(centre + half), x.confidence)
    return tpot_band.low <= ratio.low and ratio.high <= tpot_band.high, ratio


def _unlike(x: Shift, y: Shift, tpot_band: Band) -> bool:
    """Two moves between the same rounds that differ with evidence: the ratio's interval (`_alike`) lies wholly
    outside the tolerance band."""
    _, ratio = _alike(x, y, tpot_band)
    return ratio.low > tpot_band.high or ratio.high < tpot_band.low


def _split(v: VariantResults, baseline: VariantResults, task: str, target: int, policy: policy_mod.Policy
           ) -> dict[str, str]:
    """The deciding metrics (TPOT, output tok/s) whose requests split into two modes further apart than the
    tolerance on either side (`specwatch.report.modes`), each with the line that says so: no GO or NO-GO rests on
    them."""
    clock = server_clock(v, baseline, target, task)
    out: dict[str, str] = {}
    for metric in DECIDING:
        title = TITLES[metric]
        scale, unit = (1000.0, " ms") if metric == "tpot" else (1.0, " tok/s")
        found = []
        for side in (baseline, v):
            m = two_modes(side.samples(target, task, metric, clock), band(metric_policy(policy, metric)))
            if m is not None:
                found.append(f"{side.name} {title} splits into two modes {pct(m.apart)} apart ({m.low_n} requests "
                             f"around {m.low * scale:.3g}{unit}, {m.high_n} around {m.high * scale:.3g}{unit})")
        if found:
            out[metric] = f"{'; '.join(found)}: one shift does not describe it, no GO or NO-GO on {title}"
    return out


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
    split = _split(v, baseline, task, target, policy)
    worse = [TITLES[m.metric] for m in perf if m.finding == "worse" and m.metric in gates and m.metric not in split]
    decided = bool(worse) or (_gain(perf) and not split)
    note = _drift_reason(design, drifts(v, baseline, task, target, policy), perf, decided,
                         band(metric_policy(policy, "tpot")))
    void = note.voids
    if void:
        worse = []
    reasons.insert(0 if note.first else len(reasons), note.text)
    reasons += split.values()
    beyond = confounders.sentence(v, baseline)
    if beyond is not None:  # named, not voiding: the comparison is still measured, of more than speculation
        reasons.append(beyond)
    if worse:
        no_go = True
        reasons.append(f"{' and '.join(worse)} worse than the baseline beyond the tolerance")
    if any(m.finding == "worse" for m in perf if m.metric not in gates):
        reasons.append("caution: ITL p95 worse beyond the tolerance (tokens arrive in bursts: a verify step "
                       f"takes longer than a plain one; a caution when comparing {kind.replace('_', ' ')})")
    gain = _gain(perf) and not void and not any(m in split for m in DECIDING)
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
