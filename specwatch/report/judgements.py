"""The judge's answer for every candidate, task, concurrency and performance metric of one report, built once.

`build` runs the judge (`specwatch.judge.blocked`: within rounds where the study ran in rounds) on
TPOT, the ITL p95 of each request and each request's output tokens per second, candidate against
its baseline, with the policy's tolerance, level and minimum samples, at every concurrency of the
run (and the target) and in every task. Each answer is a `MetricLine`: the comparison, what it
found (better, worse, no change, undecided, insufficient data) and the line that says it, "TPOT
-19 % [-31 %, -6 %], n = 24 / 24: better". The verdicts (`specwatch.report.verdict`), the judge's
table (`specwatch.report.render`) and the relative performance plot (`specwatch.report.plots`)
read this one table; none of them runs the judge.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from specwatch import judge
from specwatch.canary import policy as policy_mod
from specwatch.judge import Band, Comparison
from specwatch.report.results import PERF_METRICS, RunResults, VariantResults
from specwatch.stats import Shift

TITLES = {"tpot": "TPOT", "itl_p95": "ITL p95", "output_tps": "output tok/s", "acceptance_rate": "acceptance"}
Finding = Literal["better", "worse", "no change", "undecided", "insufficient data"]
Key = tuple[str, str, int, str]  # (variant, task, concurrency, metric)


@dataclass(frozen=True)
class MetricLine:
    """One metric of one task: what the judge found, and the line that says it."""

    metric: str
    concurrency: int | None  # None: the acceptance pass
    finding: Finding | None  # None: the candidate's own figure (acceptance), not a comparison
    comparison: Comparison | None
    text: str


@dataclass(frozen=True)
class Judgements:
    """The judge's lines of one report, keyed by (variant, task, concurrency, metric), and the policy they follow."""

    policy: policy_mod.Policy
    lines: Mapping[Key, MetricLine]

    def perf(self, variant: str, task: str, concurrency: int) -> list[MetricLine]:
        """TPOT, ITL p95 and output tok/s of one candidate, task and concurrency (`PERF_METRICS`' order)."""
        return [self.lines[(variant, task, concurrency, m)] for m in PERF_METRICS]


def pct(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.0f} %"


def _interval(cmp: Comparison, e: Shift) -> str:
    if cmp.scale == "ratio":
        return f"[{pct(e.low)}, {pct(e.high)}]"
    return f"[{e.low:+.3f}, {e.high:+.3f}]"


def line_text(title: str, cmp: Comparison, finding: Finding, rules: judge.Rules) -> str:
    """"TPOT -19 % [-31 %, -6 %], n = 24 / 24: better" (ratio metrics; differences in points); a blocked
    comparison adds its interval over rounds: "TPOT -19 % [-31 %, -6 %] over requests, [-35 %, -2 %] over 4
    rounds, n = 24 / 24: better"."""
    n = f"n = {cmp.n_baseline} / {cmp.n_candidate}"
    if cmp.effect is not None:
        e = cmp.effect
        estimate = pct(e.estimate) if cmp.scale == "ratio" else f"{e.estimate:+.3f}"
        effect = f"{estimate} {_interval(cmp, e)}"
        if cmp.over_rounds is not None:
            effect += f" over requests, {_interval(cmp, cmp.over_rounds)} over {cmp.rounds} rounds"
        return f"{title} {effect}, {n}: {finding}"
    need = f"the judge needs {rules.min_samples} per side"
    if cmp.baseline and cmp.candidate is not None:
        return f"{title} {pct(cmp.candidate / cmp.baseline)} (medians, no interval), {n}: {finding} ({need})"
    return f"{title}: no samples, {n}: {finding} ({need})"


def _finding(cmp: Comparison, mp: policy_mod.MetricPolicy) -> Finding:
    """better / worse beyond the band; "no change" only when every interval lies inside it; else undecided."""
    if cmp.state == "insufficient":
        return "insufficient data"
    if mp.fails(cmp.state):
        return "worse"
    if cmp.state != "pass":
        return "better"
    return "no change" if cmp.within else "undecided"


def band(mp: policy_mod.MetricPolicy) -> Band:
    return Band.around("ratio", mp.allowed_decrease, mp.allowed_increase)


def metric_policy(policy: policy_mod.Policy, name: str) -> policy_mod.MetricPolicy:
    found = [m for m in policy.metrics if m.name == name]
    return found[0] if found else policy_mod.load().metric(name)  # a policy without it: the default's


def server_clock(v: VariantResults, base: VariantResults, concurrency: int, task: str) -> bool:
    """TPOT from the servers' own clocks where both sides timed every request (a sweep's servers do): a busy
    client's reading of 64 streams on 2 cores is bunched."""
    return v.server_clock(concurrency, task) and base.server_clock(concurrency, task)


def _perf_lines(v: VariantResults, base: VariantResults, concurrency: int, task: str,
                policy: policy_mod.Policy) -> list[MetricLine]:
    """TPOT, ITL p95 and output tok/s of one task at one concurrency, candidate `v` against `base`, compared
    within rounds where the study ran in rounds (`specwatch.judge.blocked`)."""
    out = []
    clock = server_clock(v, base, concurrency, task)
    for name in PERF_METRICS:
        mp = metric_policy(policy, name)
        cmp = judge.blocked(base.samples_by_round(concurrency, task, name, clock),
                                v.samples_by_round(concurrency, task, name, clock), "ratio", band(mp), policy.rules)
        finding = _finding(cmp, mp)
        title = f"{TITLES[name]} (server clock)" if clock and name == "tpot" else TITLES[name]
        text = line_text(title, cmp, finding, policy.rules)
        tolerance = f"-{mp.allowed_decrease:.0%} .. +{mp.allowed_increase:.0%}"
        if finding == "no change":
            text += f" (within {tolerance})"
        elif finding == "undecided":
            text += f" (the interval reaches beyond {tolerance})"
        out.append(MetricLine(name, concurrency, finding, cmp, text))
    return out


def variant_tasks(v: VariantResults) -> list[str]:
    """The tasks a verdict is given for: every task of the variant's passes, or "all" where it has none."""
    return sorted(set(v.acceptance) | {t for per in v.perf.values() for t in per}
                  | {t for per in v.requests.values() for t in per}) or ["all"]


def perf_tasks(run: RunResults) -> list[str]:
    """Every task of any variant's performance pass."""
    return sorted({t for v in run.variants for c in (*v.perf, *v.requests)
                   for t in (*v.perf.get(c, {}), *v.requests.get(c, {}))})


def concurrencies(run: RunResults) -> list[int]:
    """Every concurrency of any variant's performance pass."""
    return sorted({c for v in run.variants for c in (*v.perf, *v.requests)})


def build(run: RunResults, baseline: str, target: int, policy: policy_mod.Policy | None = None) -> Judgements:
    """Every candidate with a baseline judged at every concurrency of the run and `target`, in every task of the
    performance pass and of its own verdicts (`variant_tasks`): the cells the verdicts, the table and the plot
    read (`policy`: the canary's packaged one by default)."""
    policy = policy or policy_mod.load()
    lines: dict[Key, MetricLine] = {}
    concs = sorted({*concurrencies(run), target})
    for v, base in run.candidates(baseline):
        if base is None:
            continue
        for task in sorted({*perf_tasks(run), *variant_tasks(v)}):
            for c in concs:
                lines.update(((v.name, task, c, m.metric), m) for m in _perf_lines(v, base, c, task, policy))
    return Judgements(policy, lines)
