"""The canary verdict as Markdown (for people) and JSON (for pipelines), and the files they go to."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from specwatch.canary.samples import METRICS
from specwatch.canary.scoring import CanaryVerdict, MetricResult

LABELS = {"pass": "PASS", "marginal": "MARGINAL", "fail": "FAIL", "insufficient": "INSUFFICIENT DATA"}


def as_dict(verdict: CanaryVerdict) -> dict[str, Any]:
    doc = dataclasses.asdict(verdict)
    doc["evaluated_at"] = time.time()
    return doc


def _value(r: MetricResult, v: float | None) -> str:
    if v is None:
        return "-"
    unit = METRICS[r.metric].unit
    return f"{v * 1000:.4g} ms" if unit == "s" else f"{v:.4g}"


def _effect(r: MetricResult) -> str:
    if r.effect is None:
        return "-"
    ratio = METRICS[r.metric].scale in ("ratio",)
    e = r.effect
    point = f"{e.estimate:.3f}x" if ratio else f"{e.estimate:+.4f}"
    if e.confidence == 0:
        return point
    return f"{point} [{e.low:.3f}, {e.high:.3f}]" if ratio else f"{point} [{e.low:+.4f}, {e.high:+.4f}]"


def markdown(verdict: CanaryVerdict) -> str:
    lines = [f"# Canary: {verdict.candidate} against {verdict.baseline}", "",
             f"Verdict: **{LABELS[verdict.verdict]}** (window {verdict.window}; "
             f"sources: {', '.join(verdict.sources) or '-'}; comparison: "
             f"{verdict.comparison.replace('_', ' ') or '-'})", ""]
    for t in verdict.tasks:
        score = "-" if t.score is None else f"{t.score:.0f}"
        lines += [f"## Task `{t.task}`: {LABELS[t.verdict]} (score {score})", ""]
        lines += [f"- {reason}" for reason in t.reasons]
        lines += ["", "| metric | state | baseline | candidate | effect [CI] | p | n (b / c) | weight | critical |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in t.metrics:
            state = r.state + (" (fail)" if r.failed else " (caution)" if r.caution and r.state != "pass" else "")
            p = "-" if r.p_value is None else f"{r.p_value:.2g}"
            lines.append(f"| {METRICS[r.metric].title} | {state} | {_value(r, r.baseline)} | "
                         f"{_value(r, r.candidate)} | {_effect(r)} | {p} | {r.n_baseline} / {r.n_candidate} | "
                         f"{r.weight:g} | {'yes' if r.critical else ''} |")
        lines.append("")
    lines += ["Baseline and candidate values are medians of per-request samples (event log) or Prometheus "
              "figures (ratios of windowed rates: means; ITL p95); ratio effects are candidate / baseline "
              "(Hodges-Lehmann on logs), others candidate - baseline.", ""]
    return "\n".join(lines)


def write(verdict: CanaryVerdict, out: Path) -> tuple[Path, Path]:
    """`canary.md` and `canary.json` in `out`; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / "canary.md", out / "canary.json"
    md.write_text(markdown(verdict))
    js.write_text(json.dumps(as_dict(verdict), indent=2) + "\n")
    return md, js
