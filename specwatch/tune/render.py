"""The tune report in plain words (Markdown), its plot, and the console summary."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specwatch.report.plots import BASELINE_COLOUR, colour_map  # noqa: E402
from specwatch.tune import fit  # noqa: E402
from specwatch.tune.fit import Recommendation  # noqa: E402
from specwatch.tune.sweep import Sweep  # noqa: E402


def k_colours(ks: tuple[int, ...]) -> dict[int, str]:
    """The report's style: no speculation (k = 0) grey as a baseline, every k after it in the palette's order."""
    by_name = colour_map([str(k) for k in sorted(ks)], baseline="0")
    return {k: by_name[str(k)] for k in ks}


def _k(k: int) -> str:
    return "no speculation" if k == 0 else f"k={k}"


def _range(start: int, end: int, last: bool) -> str:
    if last:
        return f"from {start} running requests up" if start > 1 else "at every batch size"
    return f"up to {end} running request{'s' if end > 1 else ''}" if start == 1 else f"from {start} to {end}"


def headline(rec: Recommendation) -> str:
    """"Use k=4 up to 8 running requests, k=2 from 9 to 32, no speculation from 33 running requests up"."""
    if rec.speculative_config is None:
        return "Use no speculation: at no measured batch size does any k pay for its verification."
    parts = [f"{_k(k)} {_range(s, e, i == len(rec.ranges) - 1)}" for i, (s, e, k) in enumerate(rec.ranges)]
    return "Use " + ", ".join(parts) + "."


def _pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


def why(sweep: Sweep, rec: Recommendation) -> list[str]:
    """One sentence per range: what the chosen k yields, what it costs, and the best alternative there."""
    m = rec.model
    lines = []
    for start, end, k in rec.ranges:
        b = next((c for c in sweep.concurrencies if start <= c <= end), end)
        plain = m.cost.at(b, 0)
        alts = sorted((kk for kk in sweep.ks if kk != k), key=lambda kk: -m.tokens_per_s(b, kk))
        alt = alts[0] if alts else k
        yields = f"{m.tokens_per_step(k):.2f} tokens per step" if k else "1 token per step"
        cost = f"a step costs {1000 * m.cost.at(b, k):.2f} ms ({m.cost.at(b, k) / plain:.2f}x a plain step)"
        lines.append(
            f"- {_range(start, end, (start, end, k) == rec.ranges[-1]).capitalize()} ({_k(k)}, at batch {b}): "
            f"{_k(k)} yields {yields} on this mix and {cost}: {_pct(m.gain(b, k))} output tokens per second per "
            f"stream against no speculation. The next best, {_k(alt)}, yields {m.tokens_per_step(alt):.2f} at "
            f"{m.cost.at(b, alt) / plain:.2f}x: {_pct(m.gain(b, alt))}.")
    return lines


def markdown(sweep: Sweep, rec: Recommendation) -> str:
    m = rec.model
    ks = sweep.ks
    out = [f"# Tuning {sweep.label}: the draft length per batch size", "",
           f"Run `{sweep.root.name}`: {sweep.label} at k in {list(ks)} (k = 0: no speculation) and concurrency "
           f"{list(sweep.concurrencies)}, tasks {', '.join(sweep.tasks)}; task mix "
           + ", ".join(f"{t} {w:.0%}" for t, w in m.mix.items()) + f"; acceptance from {rec.acceptance_source}"
           + (f"; TPOT objective {rec.max_tpot_ms:g} ms per task." if rec.max_tpot_ms else "; no TPOT objective."),
           "", *[f"**Warning:** {w}\n" for w in rec.warnings],
           "## Recommendation", "", f"**{headline(rec)}**", "",
           "```", f"--speculative-config '{json.dumps(rec.speculative_config)}'"
           if rec.speculative_config else "(no --speculative-config)", "```", "",
           "Why: speculation turns one step into several tokens, but a step that verifies k drafts for every "
           "running request costs more as the batch grows, while the acceptance per position stays what the "
           "workload makes it. The best k is where the extra tokens per step outweigh the extra step time:", "",
           *why(sweep, rec), ""]
    missed = [c.batch for c in rec.choices if not c.meets_objective]
    if missed:
        out += [f"At batch sizes {missed[0]}-{missed[-1]} no k meets the TPOT objective of {rec.max_tpot_ms:g} ms "
                "for every task; the k with the lowest worst-task TPOT is chosen there. Keep the running batch "
                f"below {missed[0]} (`--max-num-seqs`) to meet it.", ""]
    out += ["## Expected gain per range", "",
            "Output tokens per second per stream against no speculation, at the measured concurrencies, with a "
            "95 % bootstrap interval over requests (every cell's requests and each task's acceptance records "
            "resampled, the fit redone).", "",
            "| range (running requests) | k | batch | expected gain | 95 % interval | expected TPOT per task |",
            "|---|---|---|---|---|---|"]
    chosen = {c.batch: c for c in rec.choices}
    for start, end, k in rec.ranges:
        for b in [c for c in sweep.concurrencies if start <= c <= end] or [end]:
            g = rec.gains.get((b, k))
            tpot = ", ".join(f"{t} {v:.2f} ms" for t, v in chosen[b].tpot_ms.items())
            interval = f"[{_pct(g.low)}, {_pct(g.high)}]" if g else "-"
            out.append(f"| {start}-{end} | {k} | {b} | {_pct(m.gain(b, k))} | {interval} | {tpot} |")
    out += ["", "## Every k at every measured concurrency (expected gain)", "",
            "| batch | " + " | ".join(_k(k) for k in ks) + " |", "|---" * (len(ks) + 1) + "|"]
    for b in sweep.concurrencies:
        cells = []
        for k in ks:
            g = rec.gains.get((b, k))
            mark = "**" if chosen[b].k == k else ""
            cells.append(f"{mark}{_pct(m.gain(b, k))}{mark}" + (f" [{_pct(g.low)}, {_pct(g.high)}]" if g and k else ""))
        out.append(f"| {b} | " + " | ".join(cells) + " |")
    out += ["", "## Acceptance per task", "",
            "P(a decode step accepts at least i drafts), summed over requests, then divided; and the expected "
            "tokens per step E(k) = 1 + sum of P_1..P_k.", "",
            "| task | " + " | ".join(f"P_{i}" for i in range(1, max(ks) + 1)) + " | "
            + " | ".join(f"E(k={k})" for k in ks if k) + " |",
            "|---" * (1 + max(ks) + len([k for k in ks if k])) + "|"]
    for t, p in m.acceptance.items():
        out.append(f"| {t} | " + " | ".join(f"{x:.3f}" for x in p) + " | "
                   + " | ".join(f"{fit.expected_tokens(p, k):.2f}" for k in ks if k) + " |")
    out += ["", "## Step cost (median ms per decode step, its ratio to a plain step, the measured batch)", "",
            "Per request: step time = TPOT x (output tokens - 1) / decode steps, the TPOT on the server's clock "
            "(`--enable-per-request-metrics`; the client's where the server gave none), decode steps from its "
            "`metrics.speculative_decoding` (max(R, n - 1 - C)); batch = the median over the cell's requests of the "
            "requests in flight while each decoded (a closed loop at concurrency C runs about C, less while Locust "
            "spawns its users and while the last round drains).",
            "", "| concurrency | " + " | ".join(_k(k) for k in ks) + " |", "|---" * (len(ks) + 1) + "|"]
    for b in m.cost.batches:
        plain = m.cost.seconds[(b, 0)]
        out.append(f"| {b} | " + " | ".join(
            f"{1000 * m.cost.seconds[(b, k)]:.2f} ({m.cost.seconds[(b, k)] / plain:.2f}x, b={m.cost.batch(b, k):.0f})"
            for k in ks) + " |")
    out += ["", "![k against batch size; expected gain per k](tune.png)", "",
            "Files: `speculative-config.json` (the exact flag value), `recommendation.json` (everything above), "
            "`cost-rules.yml` (the step-cost table for Prometheus: the live panel's \"best k at the current "
            "running batch size\")" + (", `proof.md` (the recommendation measured)." if sweep.dynamic else "."), ""]
    return "\n".join(out)


def summary(sweep: Sweep, rec: Recommendation) -> str:
    lines = [headline(rec)]
    if rec.speculative_config is not None:
        lines.append(f"--speculative-config '{json.dumps(rec.speculative_config)}'")
    for b in sweep.concurrencies:
        k = next(c.k for c in rec.choices if c.batch == b)
        g = rec.gains.get((b, k))
        lines.append(f"  batch {b}: {_k(k)}, expected gain {_pct(rec.model.gain(b, k))}"
                     + (f" [{_pct(g.low)}, {_pct(g.high)}]" if g and k else ""))
    return "\n".join(lines)


def plot(sweep: Sweep, rec: Recommendation, path: Path) -> Path:
    m = rec.model
    colours = k_colours(sweep.ks)
    top = max(sweep.concurrencies)
    batches = list(range(1, top + 1))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.step(batches, [c.k for c in rec.choices], where="post", color="#1f77b4", gid="recommended")
    left.scatter(sweep.concurrencies, [next(c.k for c in rec.choices if c.batch == b) for b in sweep.concurrencies],
                 color="#1f77b4", zorder=3)
    left.set(xscale="log", xlabel="running requests (batch size)", ylabel="recommended k",
             title="Recommended draft length", yticks=list(sweep.ks))
    for k in sweep.ks:
        right.plot(batches, [100 * m.gain(b, k) for b in batches], color=colours[k], label=_k(k), gid=f"k{k}")
        for b in sweep.concurrencies:
            g = rec.gains.get((b, k))
            if g and k:
                yerr = [[100 * (g.estimate - g.low)], [100 * (g.high - g.estimate)]]
                right.errorbar([b], [100 * g.estimate], yerr=yerr, color=colours[k], fmt="o", markersize=3, capsize=2)
    right.axhline(0, color=BASELINE_COLOUR, linewidth=0.8)
    right.set(xscale="log", xlabel="running requests (batch size)", ylabel="expected gain (%)",
              title="Output tokens/s per stream vs no speculation")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
