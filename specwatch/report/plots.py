"""The report's PNG plots (matplotlib, no display): one function per figure, each returns its file."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from specwatch.report.results import RunResults, VariantResults  # noqa: E402


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _tasks(run: RunResults) -> list[str]:
    return sorted({t for v in run.variants for t in v.acceptance})


def _speculative(run: RunResults) -> list[VariantResults]:
    return [v for v in run.variants if any(a.steps for a in v.acceptance.values())]


def acceptance_bars(run: RunResults, out: Path) -> Path:
    """Acceptance rate and mean acceptance length by task and variant."""
    tasks, variants = _tasks(run), _speculative(run)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    width = 0.8 / max(len(variants), 1)
    for i, v in enumerate(variants):
        xs = [t + i * width for t in range(len(tasks))]
        axes[0].bar(xs, [v.acceptance[t].acceptance_rate or 0 if t in v.acceptance else 0 for t in tasks],
                    width, label=v.name)
        axes[1].bar(xs, [v.acceptance[t].mean_acceptance_length or 0 if t in v.acceptance else 0 for t in tasks],
                    width, label=v.name)
    for ax, title in zip(axes, ("acceptance rate C / D", "mean acceptance length 1 + C / R"), strict=True):
        ax.set_xticks([t + 0.4 - width / 2 for t in range(len(tasks))], tasks)
        ax.set_title(title)
    axes[0].set_ylim(0, 1)
    axes[1].legend(fontsize=8)
    return _save(fig, out / "acceptance.png")


def position_decay(run: RunResults, out: Path) -> Path:
    """Unconditional acceptance by position (P(accepted >= p + 1) per verify step), per task."""
    tasks = _tasks(run)
    fig, axes = plt.subplots(1, max(len(tasks), 1), figsize=(5 * max(len(tasks), 1), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=False):
        for v in _speculative(run):
            acc = v.acceptance.get(task)
            if acc and acc.per_position:
                ax.plot(range(len(acc.per_position)), acc.per_position, marker="o", label=v.name)
        ax.set_title(f"{task}: acceptance by position")
        ax.set_xlabel("draft position")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8)
    return _save(fig, out / "position_decay.png")


def length_histograms(run: RunResults, out: Path) -> Path:
    """Share of verify steps that accepted 0, 1, ... k drafts, per task and variant."""
    tasks, variants = _tasks(run), _speculative(run)
    fig, axes = plt.subplots(1, max(len(tasks), 1), figsize=(5 * max(len(tasks), 1), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=False):
        width = 0.8 / max(len(variants), 1)
        for i, v in enumerate(variants):
            acc = v.acceptance.get(task)
            if acc and acc.steps:
                ax.bar([k + i * width for k in range(len(acc.histogram))],
                       [h / acc.steps for h in acc.histogram], width, label=v.name)
        ax.set_title(f"{task}: accepted drafts per verify step")
        ax.set_xlabel("accepted")
        ax.legend(fontsize=8)
    return _save(fig, out / "length_histograms.png")


def coverage(run: RunResults, out: Path) -> Path:
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
        ax.bar([t + i * width for t in range(len(tasks))], values, width, label=v.name)
    ax.set_xticks([t + 0.4 - width / 2 for t in range(len(tasks))], tasks)
    ax.set_title("draft coverage (steps with a draft / decode steps)")
    ax.legend(fontsize=8)
    return _save(fig, out / "coverage.png")


def relative_performance(run: RunResults, baseline: str, out: Path) -> Path:
    """TPOT p50, ITL p95 / p99 and output throughput relative to the baseline, per task and concurrency."""
    base = run.variant(baseline)
    tasks = sorted({t for v in run.variants for per in v.perf.values() for t in per})
    metrics = (("tpot_ms", "p50", "TPOT p50"), ("itl_ms", "p95", "ITL p95"), ("itl_ms", "p99", "ITL p99"),
               ("output_tokens_per_second", None, "output tokens / s"))
    fig, axes = plt.subplots(len(tasks) or 1, len(metrics), figsize=(14, 3.2 * max(len(tasks), 1)), squeeze=False)
    for row, task in enumerate(tasks):
        for col, (key, q, title) in enumerate(metrics):
            ax = axes[row][col]
            for v in run.variants:
                if base is None or v.name == baseline:
                    continue
                xs, ys = [], []
                for c in sorted(v.perf):
                    mine, theirs = v.perf[c].get(task, {}).get(key), base.perf.get(c, {}).get(task, {}).get(key)
                    if q is not None:
                        mine = (mine or {}).get(q)
                        theirs = (theirs or {}).get(q)
                    if mine and theirs:
                        xs.append(c)
                        ys.append(mine / theirs)
                if xs:
                    ax.plot(xs, ys, marker="o", label=v.name)
            ax.axhline(1.0, color="grey", linewidth=0.8)
            ax.set_title(f"{task}: {title} / baseline")
            ax.set_xlabel("concurrency")
            if row == 0 and col == 0:
                ax.legend(fontsize=8)
    return _save(fig, out / "relative_performance.png")


def kv_capacity(run: RunResults, out: Path) -> Path:
    """num_gpu_blocks per variant (vllm:cache_config_info): what a draft model's weights cost."""
    named = [(v.name, v.num_gpu_blocks or 0) for v in run.variants]
    fig, ax = plt.subplots(figsize=(6, 3.4))
    ax.bar([n for n, _ in named], [b for _, b in named])
    ax.set_title("KV cache blocks (num_gpu_blocks)")
    ax.tick_params(axis="x", rotation=30)
    return _save(fig, out / "kv_capacity.png")


LINESTYLES = ("-", "--", ":", "-.")
DASHBOARD_QUERIES_PNG = "dashboard_queries.png"


def dashboard_queries(run: RunResults, out: Path) -> Path | None:
    """The key dashboard panels' queries over each variant's window (`timeline.json`), variants overlaid.

    x is the time since the variant's server became healthy; colour is the variant, the line style
    tells a panel's several series of one variant apart (quantiles, drafted vs accepted).
    """
    timeline = run.timeline
    if not timeline or not timeline.get("variants"):
        return None
    queries = timeline["queries"]
    variants = list(timeline["variants"])
    colours = {v: f"C{i % 10}" for i, v in enumerate(variants)}
    cols = 2
    rows = (len(queries) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(13, 3.3 * rows), squeeze=False)
    for ax, query in zip(axes.flat, queries, strict=False):
        for variant in variants:
            lines = timeline["variants"][variant]["series"].get(query["panel"], [])
            for i, line in enumerate(lines):
                xs, ys = zip(*line["points"], strict=True) if line["points"] else ((), ())
                ax.plot(xs, ys, color=colours[variant], linestyle=LINESTYLES[i % len(LINESTYLES)],
                        linewidth=1.2, marker="o", markersize=2.5, label=line["name"] or variant)
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


def all_plots(run: RunResults, baseline: str, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    made = [acceptance_bars(run, out), position_decay(run, out), length_histograms(run, out), coverage(run, out),
            relative_performance(run, baseline, out), kv_capacity(run, out), dashboard_queries(run, out)]
    return [p for p in made if p is not None]
