"""What `specwatch tune` writes into `<run>/tune/`: the config, the recommendation, cost rules, report and plot.

    tune/
      speculative-config.json   the exact `--speculative-config` value (null: no speculation recommended)
      recommendation.json       ranges, the model (acceptance per task, mix, cost table), gains with intervals
      cost-rules.yml            the step-cost table as a Prometheus rules file (specwatch.promconfig.cost_rules)
      tune.md                   the report in plain words
      tune.png                  k against batch size; the expected gain per k against batch size
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from specwatch.files import write_json, write_text
from specwatch.promconfig.cost_rules import StepCost, write_cost_rules
from specwatch.tune import fit, render
from specwatch.tune.fit import Recommendation
from specwatch.tune.sweep import Sweep


def data_parallel_warning(data_parallel_size: int) -> tuple[str, ...]:
    """What a deployment with data parallelism above 1 must know: vLLM 0.32.0 disables the per-batch-size table
    there (vllm/v1/spec_decode/dynamic/utils.py, vllm/config/vllm.py), so every batch drafts the maximum k."""
    if data_parallel_size <= 1:
        return ()
    return (f"the deployment runs data parallel size {data_parallel_size}: vLLM disables "
            "num_speculative_tokens_per_batch_size above 1 and drafts num_speculative_tokens at every batch size, "
            "so the per-batch-size ranges below do not apply there; deploy the k of the range your running batch "
            "stays in as a fixed num_speculative_tokens instead.",)


def tune(sweep: Sweep, *, mix: Mapping[str, float] | None = None, max_tpot_ms: float | None = None,
         acceptance: Mapping[str, tuple[float, ...]] | None = None, acceptance_source: str = "the sweep",
         tolerance: float = 0.01, resamples: int = 300, warnings: tuple[str, ...] = ()) -> Recommendation:
    model = fit.build_model(sweep, mix, acceptance)
    choices, ranges = fit.recommend(model, max(sweep.concurrencies), max_tpot_ms, tolerance)
    chosen = {c.batch: c.k for c in choices}
    points = [(b, chosen[b]) for b in sweep.concurrencies] + [(b, k) for b in sweep.concurrencies for k in sweep.ks]
    gains = fit.bootstrap_gains(sweep, model, sorted(set(points)), resamples, live_acceptance=acceptance is not None)
    return Recommendation(ranges, fit.speculative_config(sweep.method, ranges), model, choices, gains,
                          max_tpot_ms, acceptance_source, warnings)


def step_costs(sweep: Sweep, model: fit.Model, variant: str | None = None) -> list[StepCost]:
    """The fitted step cost at each measured concurrency for every k (interpolated at the batch size itself).

    `variant`: the `variant` label the rules carry, which must be the live deployment's (the
    exporter's route, e.g. `candidate`) for the dashboard's "best k" to join; default the method.
    """
    label = variant or sweep.label
    return [StepCost(label, b, k, round(model.cost.at(b, k), 6)) for b in model.cost.batches for k in sweep.ks]


def write(sweep: Sweep, rec: Recommendation, out: Path, cost_variant: str | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "speculative-config.json", json.dumps(rec.speculative_config) + "\n")
    write_cost_rules(step_costs(sweep, rec.model, cost_variant), out / "cost-rules.yml")
    m = rec.model
    write_json(out / "recommendation.json", {
        "method": dict(sweep.method), "speculative_config": rec.speculative_config,
        "num_speculative_tokens_per_batch_size": [list(r) for r in rec.ranges],
        "max_tpot_ms": rec.max_tpot_ms, "acceptance_source": rec.acceptance_source, "mix": dict(m.mix),
        "warnings": list(rec.warnings),
        "acceptance_per_position": {t: list(p) for t, p in m.acceptance.items()},
        "expected_tokens_per_step": {t: {str(k): fit.expected_tokens(p, k) for k in sweep.ks}
                                     for t, p in m.acceptance.items()},
        "step_cost_seconds": {f"{b},{k}": s for (b, k), s in sorted(m.cost.seconds.items())},
        "measured_batch": {f"{b},{k}": m.cost.batch(b, k) for (b, k) in sorted(m.cost.seconds)},
        "gains": [{"batch": b, "k": k, "gain": i.estimate, "low": i.low, "high": i.high}
                  for (b, k), i in sorted(rec.gains.items())],
        "choices": [{"batch": c.batch, "k": c.k, "tpot_ms": dict(c.tpot_ms), "meets_objective": c.meets_objective}
                    for c in rec.choices],
    })
    render.plot(sweep, rec, out / "tune.png")
    write_text(out / "tune.md", render.markdown(sweep, rec))
