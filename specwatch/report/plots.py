"""The report's PNG plots (matplotlib, no display): one function per figure, each returns its file.

One colour per variant in every figure of a report (`colours`: the baseline grey, the others in
the plan's order over matplotlib's tab10), and every artist drawn for a variant carries the
variant's name as its `gid`. Performance figures show the spread: every measured request as a
point with the median as a bar, and the judge's effect with its interval against the baseline.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from specwatch.report import drift as drift_mod  # noqa: E402
from specwatch.report.judgements import TITLES, Judgements, band, concurrencies, perf_tasks  # noqa: E402
from specwatch.report.results import PERF_METRICS, RunResults, VariantResults  # noqa: E402
from specwatch.stats import median  # noqa: E402

BASELINE_COLOUR = "#7f7f7f"
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")


def colours(run: RunResults, baseline: str | None = None) -> dict[str, str]:
    """The variant -> colour map every figure of one report uses (fixed by the plan's variant order)."""
    names = [v.name for v in run.variants]
    names += [n for n in (run.timeline or {}).get("variants", {}) if n not in names]
    return colour_map(names, baseline)


def colour_map(names: Sequence[str], baseline: str | None = None) -> dict[str, str]:
    """The baseline's colour for `baseline`, the palette in order for the other names."""
    others = [n for n in names if n != baseline]
    out = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(others)}
    if baseline is not None:
        out[baseline] = BASELINE_COLOUR
    return out


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _tasks(run: RunResults) -> list[str]:
    return sorted({t for v in run.variants for t in v.acceptance})


def _speculative(run: RunResults) -> list[VariantResults]:
    return [v for v in run.variants if any(a.steps for a in v.acceptance.values())]


def acceptance_bars(run: RunResults, out: Path, colour: dict[str, str]) -> Path:
    """Acceptance rate and mean acceptance length by task and variant."""
    tasks, variants = _tasks(run), _speculative(run)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    width = 0.8 / max(len(variants), 1)
    for i, v in enumerate(variants):
        xs = [t + i * width for t in range(len(tasks))]
        axes[0].bar(xs, [v.acceptance[t].acceptance_rate or 0 if t in v.acceptance else 0 for t in tasks],
                    width, label=v.name, color=colour[v.name], gid=v.name)
        axes[1].bar(xs, [v.acceptance[t].mean_acceptance_length or 0 if t in v.acceptance else 0 for t in tasks],
                    width, label=v.name, color=colour[v.name], gid=v.name)
    for ax, title in zip(axes, ("acceptance rate C / D", "mean acceptance length 1 + C / R"), strict=True):
        ax.set_xticks([t + 0.4 - width / 2 for t in range(len(tasks))], tasks)
        ax.set_title(title)
    axes[0].set_ylim(0, 1)
    axes[1].legend(fontsize=8)
    return _save(fig, out / "acceptance.png")


def position_decay(run: RunResults, out: Path, colour: dict[str, str]) -> Path:
    """Acceptance by position per task: of drafts that reached the position (solid) where every step came with
    per-step data (detailed mode), else per draft (dashed, P(accepted >= p + 1) per verify step); the legend
    names which (`specwatch.acceptance`)."""
    tasks = _tasks(run)
    fig, axes = plt.subplots(1, max(len(tasks), 1), figsize=(5 * max(len(tasks), 1), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=False):
        for v in _speculative(run):
            acc = v.acceptance.get(task)
            if not acc or not acc.per_position:
                continue
            if acc.detailed:
                points = [(p, r) for p, r in enumerate(acc.per_position_of_reached) if r is not None]
                ax.plot([p + 1 for p, _ in points], [r for _, r in points], marker="o", color=colour[v.name],
                        label=f"{v.name} (of drafts that reached it)", gid=v.name)
            else:
                ax.plot(range(1, len(acc.per_position) + 1), acc.per_position, marker="o", linestyle="--",
                        color=colour[v.name], label=f"{v.name} (per draft)", gid=v.name)
        ax.set_title(f"{task}: acceptance by position")
        ax.set_xlabel("draft position (1 = the first drafted token)")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8)
    return _save(fig, out / "position_decay.png")


def length_histograms(run: RunResults, out: Path, colour: dict[str, str]) -> Path:
    """Share of verify steps that accepted 0, 1, ... k drafts, per task and variant."""
    tasks, variants = _tasks(run), _speculative(run)
    fig, axes = plt.subplots(1, max(len(tasks), 1), figsize=(5 * max(len(tasks), 1), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=False):
        width = 0.8 / max(len(variants), 1)
        for i, v in enumerate(variants):
            acc = v.acceptance.get(task)
            if acc and acc.steps:
                ax.bar([k + i * width for k in range(len(acc.histogram))],
                       [h / acc.steps for h in acc.histogram], width, label=v.name, color=colour[v.name], gid=v.name)
        ax.set_title(f"{task}: accepted drafts per verify step")
        ax.set_xlabel("accepted")
        ax.legend(fontsize=8)
    return _save(fig, out / "length_histograms.png")


def coverage(run: RunResults, out: Path, colour: dict[str, str]) -> Path:
    """Draft coverage: verify steps with a draft / decode steps (completion tokens - 1 - C per request)."""
    tasks, variants = _tasks(run), _speculative(run)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    width = 0.8 / max(len(variants), 1)
    for i, v in enumerate(variants):
        values = []
        for t in tasks:
            acc = v.acceptance.get(t)
            decode = (acc.output_tokens - acc.requests - acc.accepted) if acc else 0
            values.append(acc.steps / decode if acc and decode > 0 else 0)
        ax.bar([t + i * width for t in range(len(tasks))], values, width, label=v.name, color=colour[v.name],
               gid=v.name)
    ax.set_xticks([t + 0.4 - width / 2 for t in range(len(tasks))], tasks)
    ax.set_title("draft coverage (steps with a draft / decode steps)")
    ax.legend(fontsize=8)
    return _save(fig, out / "coverage.png")


UNITS = {"tpot": ("ms", 1000.0), "itl_p95": ("ms", 1000.0), "output_tps": ("tok/s", 1.0)}


def performance_spread(run: RunResults, out: Path, colour: dict[str, str]) -> Path:
    """Every measured request as a point (TPOT, its ITL p95, its output tok/s), the median as a bar, n below."""
    tasks, concs = perf_tasks(run), concurrencies(run)
    fig, axes = plt.subplots(len(tasks) or 1, len(PERF_METRICS), figsize=(14, 3.4 * max(len(tasks), 1)),
                             squeeze=False)
    width = 0.8 / max(len(run.variants), 1)
    jitter = random.Random(0)
    for row, task in enumerate(tasks):
        for col, metric in enumerate(PERF_METRICS):
            ax = axes[row][col]
            unit, scale = UNITS[metric]
            for i, v in enumerate(run.variants):
                for j, c in enumerate(concs):
                    values = [x * scale for x in v.samples(c, task, metric)]
                    if not values:
                        continue
                    x = j + (i - (len(run.variants) - 1) / 2) * width
                    ax.scatter([x + jitter.uniform(-0.3, 0.3) * width for _ in values], values, s=9, alpha=0.6,
                               color=colour[v.name], gid=v.name, label=v.name if j == 0 else None)
                    mid = sorted(values)[len(values) // 2]
                    ax.hlines(mid, x - width / 2, x + width / 2, colors=colour[v.name], linewidth=2, gid=v.name)
            ax.set_xticks(range(len(concs)), [f"c = {c}" for c in concs])
            ax.set_title(f"{task}: {TITLES[metric]} per request ({unit})")
            if row == 0 and col == 0 and ax.collections:
                ax.legend(fontsize=7)
    return _save(fig, out / "performance_spread.png")


def relative_performance(run: RunResults, baseline: str, out: Path, colour: dict[str, str], judgements: Judgements
                         ) -> Path:
    """The judge's effect (candidate / baseline, Hodges-Lehmann on logs) with its interval, per concurrency, as the
    report's judgements hold it.

    Filled markers with bars: enough samples for the judge; hollow markers: the ratio of medians
    of too few samples (no interval). The grey band is the policy's tolerance.
    """
    policy = judgements.policy
    tasks, concs = perf_tasks(run), concurrencies(run)
    candidates = run.candidates(baseline)
    fig, axes = plt.subplots(len(tasks) or 1, len(PERF_METRICS), figsize=(14, 3.2 * max(len(tasks), 1)),
                             squeeze=False)
    width = 0.8 / max(len(candidates), 1)
    for row, task in enumerate(tasks):
        for col, metric in enumerate(PERF_METRICS):
            ax = axes[row][col]
            tolerance = None
            for i, (v, base) in enumerate(candidates):
                if base is None:
                    continue
                for j, c in enumerate(concs):
                    cmp = judgements.lines[(v.name, task, c, metric)].comparison
                    if cmp is None:
                        continue
                    x = j + (i - (len(candidates) - 1) / 2) * width
                    if cmp.effect is not None:
                        e = cmp.effect
                        ax.errorbar([x], [e.estimate], yerr=[[e.estimate - e.low], [e.high - e.estimate]], fmt="o",
                                    color=colour[v.name], capsize=3, gid=v.name, label=v.name if j == 0 else None)
                    elif cmp.baseline and cmp.candidate is not None:
                        ax.scatter([x], [cmp.candidate / cmp.baseline], facecolors="none", edgecolors=colour[v.name],
                                   gid=v.name, label=v.name if j == 0 else None)
                mp = next((m for m in policy.metrics if m.name == metric), None)
                tolerance = band(mp) if mp else None
            if tolerance:
                ax.axhspan(tolerance.low, tolerance.high, color="0.9", zorder=0)
            ax.axhline(1.0, color="grey", linewidth=0.8)
            ax.set_xticks(range(len(concs)), [f"c = {c}" for c in concs])
            ax.set_title(f"{task}: {TITLES[metric]} / baseline")
            if row == 0 and col == 0 and (ax.lines or ax.collections):
                ax.legend(fontsize=7)
    return _save(fig, out / "relative_performance.png")


def kv_capacity(run: RunResults, out: Path, colour: dict[str, str]) -> Path:
    """num_gpu_blocks per variant (vllm:cache_config_info): what a draft model's weights cost."""
    fig, ax = plt.subplots(figsize=(6, 3.4))
    for v in run.variants:
        ax.bar(v.name, v.num_gpu_blocks or 0, color=colour[v.name], gid=v.name)
    ax.set_title("KV cache blocks (num_gpu_blocks)")
    ax.tick_params(axis="x", rotation=30)
    return _save(fig, out / "kv_capacity.png")


def drift_over_study(run: RunResults, baseline: str, out: Path, colour: dict[str, str]) -> Path | None:
    """Each variant's TPOT round by round over the study, as its verdicts' drift reads it (`report.drift.parts`:
    its tasks pooled, each request over its task's median; the median of each round drawn), the baseline thick:
    what the machine did under the study. A flat baseline is a quiet machine; the blocking cancels a move that every
    variant of a round shares."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    t0 = min((b["start"] for v in run.variants for b in v.blocks), default=None)
    drawn = False
    for v in run.variants:
        for c in sorted(v.requests):
            found = drift_mod.parts(v, c, "tpot", min_per_part=1)
            rounds = {int(k.removeprefix("round ")): xs for k, xs in found.items() if k.startswith("round ")}
            times = {b["round"]: (b["start"] + b["end"]) / 2 for b in v.blocks if b.get("concurrency") == c}
            if t0 is None or len(rounds) < 2 or not all(r in times for r in rounds):
                continue
            xs = [(times[r] - t0) / 60 for r in sorted(rounds)]
            ys = [median(rounds[r]) for r in sorted(rounds)]
            ax.plot(xs, ys, marker="o", color=colour[v.name], linewidth=3 if v.name == baseline else 1.2,
                    label=f"{v.name} (c = {c})", gid=v.name)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel(f"minutes since the first block ({run.design}, {run.rounds} round{'s' if run.rounds != 1 else ''})")
    ax.set_ylabel("block median TPOT / variant's median")
    ax.set_title("Drift: each variant against itself over the study (the baseline thick)")
    ax.legend(fontsize=7)
    return _save(fig, out / "drift.png")


LINESTYLES = ("-", "--", ":", "-.")
DASHBOARD_QUERIES_PNG = "dashboard_queries.png"


def dashboard_queries(run: RunResults, out: Path, colours: dict[str, str]) -> Path | None:
    """The key dashboard panels' queries over each variant's window (`timeline.json`), variants overlaid.

    x is the time since the variant's server became healthy; colour is the variant, the line style
    tells a panel's several series of one variant apart (quantiles, drafted vs accepted).
    """
    timeline = run.timeline
    if not timeline or not timeline.get("variants"):
        return None
    queries = timeline["queries"]
    variants = list(timeline["variants"])
    cols = 2
    rows = (len(queries) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(13, 3.3 * rows), squeeze=False)
    for ax, query in zip(axes.flat, queries, strict=False):
        for variant in variants:
            lines = timeline["variants"][variant]["series"].get(query["panel"], [])
            for i, line in enumerate(lines):
                xs, ys = zip(*line["points"], strict=True) if line["points"] else ((), ())
                ax.plot(xs, ys, color=colours[variant], linestyle=LINESTYLES[i % len(LINESTYLES)],
                        linewidth=1.2, marker="o", markersize=2.5, label=line["name"] or variant, gid=variant)
        ax.set_title(query["panel"], fontsize=10)
        ax.set_xlabel("seconds since the variant's server was healthy", fontsize=8)
        unit = query.get("unit", "")
        if unit == "percentunit":
            ax.set_ylim(0, 1.05)
        ax.set_ylabel({"percentunit": "ratio", "s": "seconds"}.get(unit, unit.replace("suffix:", "").strip()),
                      fontsize=8)
        if ax.lines:
            ax.legend(fontsize=6, ncol=2)
        else:
            ax.text(0.5, 0.5, "no data in any window", ha="center", va="center", transform=ax.transAxes)
    for ax in list(axes.flat)[len(queries):]:
        ax.set_visible(False)
    return _save(fig, out / DASHBOARD_QUERIES_PNG)


def all_plots(run: RunResults, baseline: str, out: Path, judgements: Judgements) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    c = colours(run, baseline)
    made = [acceptance_bars(run, out, c), position_decay(run, out, c), length_histograms(run, out, c),
            coverage(run, out, c), performance_spread(run, out, c),
            relative_performance(run, baseline, out, c, judgements), kv_capacity(run, out, c),
            drift_over_study(run, baseline, out, c), dashboard_queries(run, out, c)]
    return [p for p in made if p is not None]
