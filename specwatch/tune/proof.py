"""The proof: the recommended dynamic config's TPOT against the best fixed k and against the k best at concurrency 1.

Per concurrency of the sweep and per task (TPOT differs by task, so tasks are not pooled; the
same prompts on every side), the judge (`specwatch.judge`, Mann-Whitney and Hodges-Lehmann on
logs, per-request TPOT) compares the dynamic config (candidate) with
- the best fixed k (0 included) at that concurrency, the one with the most output tokens per
  second per stream over the mix (sum of w_task / median TPOT_task): the target is `pass` (no
  change beyond the band: within the run's noise) or `low` (faster);
- the fixed k a user would otherwise pick, the one best at the lowest concurrency: the dynamic
  config should be `low` at the high end.
The drafts per drafting step (D / R of the dynamic cell's requests) show whether the server
followed the table: at most the table's K at that batch size, where K is below the largest.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specwatch import judge
from specwatch.acceptance import parse
from specwatch.experiment.layout import RunFolder
from specwatch.files import write_json, write_text
from specwatch.stats import median
from specwatch.tune.fit import mix_of
from specwatch.tune.sweep import Cell, Sweep, load, tpots

BAND = judge.Band.around("ratio", 0.02, 0.02)  # +-2 % of TPOT: no meaningful change
WORDS = {"low": "faster", "high": "slower", "pass": "within noise", "insufficient": "too few requests"}


@dataclass(frozen=True)
class Row:
    concurrency: int
    task: str
    table_k: int
    drafts_per_step: float | None  # D / R of the dynamic cell
    dynamic: Cell
    best_k: int
    best: Cell
    vs_best: judge.Comparison
    single_k: int
    vs_single: judge.Comparison
    single: Cell


def table_k(config: Mapping[str, Any], batch: int) -> int:
    """The K a per-batch-size table gives `batch` (vLLM 0.32.0's lookup: gaps and the tail carry the last K)."""
    chosen = 0
    for start, _end, k in sorted(config.get("num_speculative_tokens_per_batch_size") or []):
        if start > batch:
            break
        chosen = k
    return min(chosen, int(config["num_speculative_tokens"]))


def _drafts_per_step(cell: Cell, run: Path) -> float | None:
    drafted = steps = 0
    for r in RunFolder(run).variant(cell.variant).requests(cell.concurrency):
        if r.ok and not r.warmup and r.spec:
            f = parse(r.spec)
            drafted += f.drafted
            steps += f.steps
    return drafted / steps if steps else None


RULES = judge.Rules()


def rows(sweep: Sweep, rules: judge.Rules = RULES) -> list[Row]:
    if not sweep.dynamic or sweep.dynamic_config is None:
        raise ValueError(f"{sweep.root}: the dynamic config was not measured (a sweep with `proof: true` measures "
                         "it after tuning)")
    mix = mix_of(sweep)

    def rate(k: int, c: int) -> float:
        """Output tokens per second per stream over the mix, from the cell's median TPOT per task."""
        cell = sweep.cell(k, c)
        return sum(w / median(tpots(part(cell, t).samples)) for t, w in mix.items())

    low = min(sweep.concurrencies)
    single = max(sweep.ks, key=lambda k: rate(k, low))
    out = []
    for c in sweep.concurrencies:
        best_k = max(sweep.ks, key=lambda k: rate(k, c))  # noqa: B023
        drafts = _drafts_per_step(sweep.dynamic[c], sweep.root)
        for t in sweep.tasks:
            dyn, best, fixed = part(sweep.dynamic[c], t), part(sweep.cell(best_k, c), t), part(sweep.cell(single, c), t)
            out.append(Row(c, t, table_k(sweep.dynamic_config, c), drafts, dyn, best_k, best,
                           judge.samples(tpots(best.samples), tpots(dyn.samples), "ratio", BAND, rules), single,
                           judge.samples(tpots(fixed.samples), tpots(dyn.samples), "ratio", BAND, rules), fixed))
    return out


def part(cell: Cell, task: str) -> Cell:
    """The cell's requests of one task."""
    return Cell(cell.variant, cell.k, cell.concurrency, tuple(s for s in cell.samples if s.task == task))


def _ms(cell: Cell) -> str:
    return f"{1000 * median(tpots(cell.samples)):.2f} (n={len(cell.samples)})"


def _effect(cmp: judge.Comparison) -> str:
    if cmp.effect is None:
        return f"- (n={cmp.n_candidate} vs {cmp.n_baseline})"
    e = cmp.effect
    return f"{e.estimate:.3f} [{e.low:.3f}, {e.high:.3f}]"


def _k(k: int) -> str:
    return "none" if k == 0 else f"k={k}"


def table(sweep: Sweep, result: Sequence[Row]) -> str:
    single = result[0].single_k
    lines = ["| concurrency | task | table K | drafts / step | dynamic TPOT p50 ms (n) | best fixed | its TPOT p50 ms "
             "(n) | dynamic / best [95 %] | verdict | " + f"fixed {_k(single)} TPOT p50 ms (n) | dynamic / "
             f"{_k(single)} [95 %] | verdict |", "|---" * 12 + "|"]
    for r in result:
        dps = f"{r.drafts_per_step:.2f}" if r.drafts_per_step is not None else "-"
        lines.append(f"| {r.concurrency} | {r.task} | {r.table_k} | {dps} | {_ms(r.dynamic)} | {_k(r.best_k)} | "
                     f"{_ms(r.best)} | {_effect(r.vs_best)} | {WORDS[r.vs_best.state]} | {_ms(r.single)} | "
                     f"{_effect(r.vs_single)} | {WORDS[r.vs_single.state]} |")
    return "\n".join(lines)


def mix_rate(cell: Cell, mix: Mapping[str, float]) -> float:
    """Output tokens per second per stream over the mix: sum of w_task / median TPOT_task."""
    return sum(w / median(tpots(part(cell, t).samples)) for t, w in mix.items())


def mix_ratio(dynamic: Cell, fixed: Cell, mix: Mapping[str, float], resamples: int = 400,
              seed: int = 0) -> tuple[float, float, float]:
    """Dynamic over fixed, in tokens per second per stream over the mix, with a 95 % bootstrap interval over requests
    (each task's requests resampled on both sides)."""
    rng = random.Random(seed)

    def resampled(cell: Cell) -> Cell:
        out = [rng.choice(group) for t in mix if (group := part(cell, t).samples) for _ in group]
        return Cell(cell.variant, cell.k, cell.concurrency, tuple(out))

    draws = sorted(mix_rate(resampled(dynamic), mix) / mix_rate(resampled(fixed), mix) for _ in range(resamples))
    return (mix_rate(dynamic, mix) / mix_rate(fixed, mix), draws[int(0.025 * (resamples - 1))],
            draws[math.ceil(0.975 * (resamples - 1))])


def mix_table(sweep: Sweep, result: Sequence[Row]) -> tuple[str, list[dict[str, Any]]]:
    """Per concurrency, over the mix: the dynamic config's tokens per second per stream against the best fixed k and
    against the k best at the lowest concurrency."""
    mix = mix_of(sweep)
    single = result[0].single_k
    lines = [f"| concurrency | dynamic / best fixed (k) [95 %] | dynamic / fixed {_k(single)} [95 %] |",
             "|---|---|---|"]
    records = []
    for c in sweep.concurrencies:
        best_k = next(r.best_k for r in result if r.concurrency == c)
        vs_best = mix_ratio(sweep.dynamic[c], sweep.cell(best_k, c), mix)
        vs_single = mix_ratio(sweep.dynamic[c], sweep.cell(single, c), mix)
        lines.append(f"| {c} | {vs_best[0]:.3f} ({_k(best_k)}) [{vs_best[1]:.3f}, {vs_best[2]:.3f}] | "
                     f"{vs_single[0]:.3f} [{vs_single[1]:.3f}, {vs_single[2]:.3f}] |")
        records.append({"concurrency": c, "best_k": best_k, "vs_best": vs_best, "single_k": single,
                        "vs_single": vs_single})
    return "\n".join(lines), records


def conclusions(sweep: Sweep, result: Sequence[Row], backend: str | None) -> list[str]:
    single = result[0].single_k
    matched = [f"{r.concurrency}/{r.task}" for r in result if r.vs_best.state in ("pass", "low")]
    high = max(r.concurrency for r in result)
    tops = [r for r in result if r.concurrency == high]
    short = sum(r.vs_best.state == "insufficient" for r in result)
    out = [f"- Against the best fixed k at each concurrency: within noise or better in {len(matched)} of "
           f"{len(result)} cells (concurrency/task: {', '.join(matched) or 'none'})"
           + (f"; too few requests for a verdict in {short} (the judge needs {judge.MIN_SAMPLES} a side)."
              if short else "."),
           f"- Against {_k(single)}, the fixed k best at concurrency {result[0].concurrency}: at the high end "
           f"(concurrency {high}) the dynamic config is "
           + "; ".join(f"{WORDS[r.vs_single.state]} on {r.task} (TPOT ratio {_effect(r.vs_single)})" for r in tops)
           + "."]
    firsts = {r.concurrency: r for r in result}
    top_k = int((sweep.dynamic_config or {})["num_speculative_tokens"])
    lowered = [r for r in firsts.values() if r.table_k < top_k and r.drafts_per_step is not None]
    if lowered:  # a server that ignored the table would draft the static k (async methods: exactly) everywhere
        ok = all(r.drafts_per_step is not None and r.drafts_per_step < top_k - 0.5 for r in lowered)
        out.append("- The server " + ("followed" if ok else "did NOT follow") + " the per-batch-size table: where it "
                   f"gives less than the static k={top_k}, drafts per drafting step were "
                   + ", ".join(f"{r.drafts_per_step:.2f} at concurrency {r.concurrency} (table K {r.table_k})"
                               for r in lowered)
                   + " (the batch wanders around the concurrency while users start and the last round drains).")
    if backend == "vllm_cpu":
        out.append("- Measured on the real vLLM 0.32.0 CPU build, which honours the table (docs/tuning.md): a real "
                   "server, but a CPU's step costs and small batches, not a GPU's.")
    if backend == "sim":
        out.append("- Measured on the simulator (`specwatch sim`, H200 step times): a proof on the modelled GPU, "
                   "not on a real one.")
    return out


def write_proof(root: Path, out: Path) -> str:
    sweep = load(root)
    backend = sweep.backend
    result = rows(sweep)
    text = table(sweep, result)
    mix_text, mix_records = mix_table(sweep, result)
    mix_words = ("Over the task mix (" + ", ".join(f"{t} {w:.0%}" for t, w in mix_of(sweep).items()) + "): output "
                 "tokens per second per stream (sum of w_task / median TPOT_task), dynamic over fixed, above 1 = the "
                 "dynamic config is faster; 95 % bootstrap interval over requests.")
    lines = ["# Proof: the recommended dynamic config against every fixed k", "",
             f"`--speculative-config '{json.dumps(sweep.dynamic_config)}'`", "",
             "Per concurrency and task: per-request TPOT of the dynamic config (candidate) against the best fixed "
             "k there (the most output tokens per second per stream over the mix), and against the fixed k best at "
             "the lowest concurrency; ratio = dynamic / fixed (Hodges-Lehmann on logs, 95 % interval), verdict from "
             f"the judge (Mann-Whitney, band +-2 %; at least {judge.MIN_SAMPLES} requests a side). `drafts / step`: "
             "D / R of the dynamic config's requests, against the table's K at that batch size.", "", text, "",
             mix_words, "", mix_text, "",
             *conclusions(sweep, result, backend), ""]
    write_text(out / "proof.md", "\n".join(lines))
    write_json(out / "proof.json", [{
        "concurrency": r.concurrency, "task": r.task, "table_k": r.table_k, "drafts_per_step": r.drafts_per_step,
        "dynamic_tpot_p50_s": median(tpots(r.dynamic.samples)), "n_dynamic": len(r.dynamic.samples),
        "best_k": r.best_k, "best_tpot_p50_s": median(tpots(r.best.samples)), "n_best": len(r.best.samples),
        "vs_best": {"state": r.vs_best.state, "ratio": r.vs_best.effect.estimate if r.vs_best.effect else None,
                    "low": r.vs_best.effect.low if r.vs_best.effect else None,
                    "high": r.vs_best.effect.high if r.vs_best.effect else None, "p_value": r.vs_best.p_value},
        "single_k": r.single_k,
        "vs_single": {"state": r.vs_single.state,
                      "ratio": r.vs_single.effect.estimate if r.vs_single.effect else None,
                      "low": r.vs_single.effect.low if r.vs_single.effect else None,
                      "high": r.vs_single.effect.high if r.vs_single.effect else None,
                      "p_value": r.vs_single.p_value},
    } for r in result])
    write_json(out / "proof-mix.json", mix_records)
    return ("Proof (TPOT per concurrency and task):\n" + text + "\n" + mix_words + "\n" + mix_text + "\n"
            + "\n".join(conclusions(sweep, result, backend)))
