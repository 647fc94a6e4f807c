"""`specwatch report results/<run-id>`: Markdown and a self-contained HTML page with PNG plots and a go / no-go.

Modules: `results` (read the experiment's folder), `quality` (greedy identity, the code edit check),
`judgements` (performance judged on per-request samples by `specwatch.judge` with the canary policy, once per
report: every candidate, task, concurrency and metric), `verdict` (GO / NO-GO / INCONCLUSIVE: the article's
rules on those judgements), `drift` (each side against itself), `modes` (a cell split in two), `confounders`
(what the two servers differ in beyond speculation), `rounds` (the rounds re-measured), `plots` (matplotlib
PNGs), `render` (Markdown, HTML).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specwatch.canary import policy as policy_mod
from specwatch.report import judgements, plots, render, results, verdict


@dataclass(frozen=True)
class Report:
    markdown: Path
    html: Path
    verdicts: list[verdict.Verdict]


def build(folder: Path, baseline: str | None = None, target_concurrency: int | None = None,
          capacity_loss_bound: float = verdict.DEFAULT_CAPACITY_LOSS, policy_file: Path | None = None) -> Report:
    """`policy_file`: the judge's tolerances, level and minimum samples (default: the canary's packaged policy)."""
    policy = policy_mod.load(policy_file)
    run = results.load(folder)
    if baseline is None:
        plain = [v.name for v in run.variants if not v.speculative]
        baseline = "baseline" if run.variant("baseline") else (plain[0] if plain else None)
        if baseline is None and len(run.variants) == 1:  # a one-variant study: its own tables, no verdict
            baseline = run.variants[0].name
    if baseline is None or run.variant(baseline) is None:
        raise results.ResultsError(f"{folder}: no baseline variant (a variant without speculative_config); "
                                   "name one with --baseline")
    concurrencies = sorted({c for v in run.variants for c in v.perf})
    target = target_concurrency or (concurrencies[-1] if concurrencies else 1)
    judged = judgements.build(run, baseline, target, policy)
    verdicts = verdict.verdicts(run, baseline, target, judged, capacity_loss_bound)
    out = folder / "report"
    pngs = plots.all_plots(run, baseline, out, judged)
    md, html = render.write(out, render.markdown(run, baseline, target, verdicts, pngs, judged))
    return Report(md, html, verdicts)
