"""The step-cost table as a static Prometheus recording-rule file (for the live "best k" panel).

# stub: replaced by issue-19-live
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StepCost:
    variant: str  # the method/config label, e.g. "ngram"
    batch_size: int  # running requests in the step
    k: int  # draft length (0 = no speculation)
    seconds: float  # median step time at (batch_size, k)


def render_cost_rules(costs: Sequence[StepCost]) -> str:
    lines = ["groups:", "  - name: specwatch_tune_step_cost", "    rules:"]
    for c in costs:
        lines += ["      - record: variant_batch_k:specwatch_step_seconds:median",
                  f"        expr: vector({c.seconds!r})",
                  f"        labels: {{variant: \"{c.variant}\", batch_size: \"{c.batch_size}\", k: \"{c.k}\"}}"]
    return "\n".join(lines) + "\n"


def write_cost_rules(costs: Sequence[StepCost], path: Path) -> None:
    path.write_text(render_cost_rules(costs), encoding="utf-8")
