"""Go / no-go per variant and task, by the source article's rules, with the reason in words.

Go: at the target concurrency both TPOT (p50) and output throughput beat the baseline's, the greedy
outputs equal the baseline's, and the KV capacity lost (num_gpu_blocks) stays within the bound.
No-go otherwise, naming every rule that failed, including the article's two traps: a gain only at
concurrencies below the target, and high acceptance without an end-to-end gain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specwatch.report.quality import identity
from specwatch.report.results import RunResults, VariantResults

HIGH_ACCEPTANCE = 0.6
DEFAULT_CAPACITY_LOSS = 0.25


@dataclass(frozen=True)
class Verdict:
    variant: str
    task: str
    go: bool
    reason: str


def _perf(v: VariantResults, concurrency: int, task: str) -> tuple[float | None, float | None]:
    summary: dict[str, Any] = v.perf.get(concurrency, {}).get(task, {})
    tpot = (summary.get("tpot_ms") or {}).get("p50")
    return tpot, summary.get("output_tokens_per_second")


def _pct(new: float, old: float) -> str:
    return f"{(new / old - 1) * 100:+.0f} %"


def judge(run: RunResults, baseline_name: str, target_concurrency: int,
          capacity_loss_bound: float = DEFAULT_CAPACITY_LOSS) -> list[Verdict]:
    baseline = run.variant(baseline_name)
    out: list[Verdict] = []
    for v in run.variants:
        if v.name == baseline_name:
            continue
        tasks = sorted(set(v.acceptance) | {t for per in v.perf.values() for t in per}) or ["all"]
        for task in tasks:
            out.append(_judge_one(v, baseline, task, target_concurrency, capacity_loss_bound))
    return out


def _judge_one(v: VariantResults, baseline: VariantResults | None, task: str, target: int,
               bound: float) -> Verdict:
    if v.state != "done":
        return Verdict(v.name, task, False, f"the run did not finish ({v.state}: {v.error or 'no status'})")
    if baseline is None or baseline.state != "done":
        return Verdict(v.name, task, False, "no finished baseline to compare with")
    reasons: list[str] = []
    ok = True
    tpot, tput = _perf(v, target, task)
    b_tpot, b_tput = _perf(baseline, target, task)
    if None in (tpot, tput, b_tpot, b_tput):
        ok = False
        reasons.append(f"no performance figures at concurrency {target}")
    else:
        assert tpot is not None and tput is not None and b_tpot is not None and b_tput is not None
        faster, more = tpot < b_tpot, tput > b_tput
        reasons.append(f"TPOT {_pct(tpot, b_tpot)} and throughput {_pct(tput, b_tput)} vs baseline at "
                       f"concurrency {target}")
        if not (faster and more):
            ok = False
            lower = [c for c in sorted(v.perf) if c < target and _beats(v, baseline, c, task)]
            if lower:
                reasons.append(f"gains only at concurrency {', '.join(map(str, lower))}, below the target")
            rate = v.acceptance[task].acceptance_rate if task in v.acceptance else None
            if rate is not None and rate >= HIGH_ACCEPTANCE:
                reasons.append(f"high acceptance ({rate:.0%}) without an end-to-end gain: "
                               "the draft costs what it saves")
    if task in v.outputs and task in baseline.outputs:
        same = identity(v.outputs[task], baseline.outputs[task])
        if same.all_identical:
            reasons.append(f"outputs identical to the baseline's ({same.identical}/{same.compared})")
        else:
            ok = False
            reasons.append(f"outputs differ from the baseline's in {same.compared - same.identical} of "
                           f"{same.compared} requests (quality check fails)")
    if v.num_gpu_blocks is not None and baseline.num_gpu_blocks:
        loss = 1 - v.num_gpu_blocks / baseline.num_gpu_blocks
        reasons.append(f"KV capacity {-loss:+.0%} ({v.num_gpu_blocks} vs {baseline.num_gpu_blocks} blocks)")
        if loss > bound:
            ok = False
            reasons.append(f"capacity loss above the {bound:.0%} bound")
    return Verdict(v.name, task, ok, "; ".join(reasons))


def _beats(v: VariantResults, baseline: VariantResults, concurrency: int, task: str) -> bool:
    tpot, tput = _perf(v, concurrency, task)
    b_tpot, b_tput = _perf(baseline, concurrency, task)
    if None in (tpot, tput, b_tpot, b_tput):
        return False
    assert tpot is not None and tput is not None and b_tpot is not None and b_tput is not None
    return tpot < b_tpot and tput > b_tput
