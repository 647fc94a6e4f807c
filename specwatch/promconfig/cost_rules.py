"""The step-cost table as a static Prometheus rule file: measured step times that the best-k rules join with.

`specwatch tune` measures the median step time per variant, running batch size and draft length k; this module
writes them as recording rules of constants (`vector(0.0123)`), one series per measurement, with the labels
`variant`, `batch_size` and `k`, and per variant and batch size the range of running batch sizes that row stands
for: a running batch B uses the smallest measured batch size >= B (the cost of the larger batch, on the safe
side), and beyond the largest measured size the largest. The ranges are two constant series, `lower`
(exclusive, 0 for the smallest size) and `upper` (inclusive, +Inf for the largest), so PromQL selects the row
of the current batch with two comparisons. Record names come from `specwatch.monitoring` (`cost_table`); the
rules that read them (`variant_task:specwatch_best_k:argmax_rate5m` ...) are in the generated recording rules
and give nothing until a table is loaded. Load it by dropping the file into the `tuned/` folder next to
prometheus.yml (docs/prometheus.md says where that is for the local stack, compose and Kubernetes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specwatch.exporter.labels import NAME_PATTERN
from specwatch.files import write_text
from specwatch.monitoring import MONITORING

C = MONITORING.cost_table
GROUP = "specwatch.cost_table"


@dataclass(frozen=True)
class StepCost:
    """One cell of the cost table: the median step time of `variant` at `batch_size` running requests and k."""

    variant: str      # the method/config label, e.g. "ngram": the `variant` label of the traffic it is for
    batch_size: int   # running requests in the step
    k: int            # draft length (0 = no speculation)
    seconds: float    # median step time at (batch_size, k)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate(costs: Sequence[StepCost]) -> None:
    """Raise ValueError, naming the offending entry, unless every cost is a usable, unique table cell."""
    if not costs:
        raise ValueError("no step costs: a cost table needs at least one (variant, batch_size, k, seconds)")
    seen: set[tuple[str, int, int]] = set()
    for cost in costs:
        if not isinstance(cost.variant, str) or not NAME_PATTERN.match(cost.variant):
            raise ValueError(f"{cost}: variant {cost.variant!r} is not a variant name "
                             f"(lowercase letters, digits, '_' and '-', at most 32, starting with a letter)")
        if not _is_int(cost.batch_size) or cost.batch_size < 1:
            raise ValueError(f"{cost}: batch_size must be a whole number >= 1, got {cost.batch_size!r}")
        if not _is_int(cost.k) or not 0 <= cost.k <= MONITORING.max_expected_k:
            raise ValueError(f"{cost}: k must be a whole number from 0 to {MONITORING.max_expected_k} "
                             f"(max_expected_k in specwatch.monitoring), got {cost.k!r}")
        if isinstance(cost.seconds, bool) or not isinstance(cost.seconds, int | float) \
                or not math.isfinite(cost.seconds) or cost.seconds <= 0:
            raise ValueError(f"{cost}: seconds must be a finite number > 0, got {cost.seconds!r}")
        key = (cost.variant, cost.batch_size, cost.k)
        if key in seen:
            raise ValueError(f"{cost}: a second cost for variant {cost.variant!r}, batch_size {cost.batch_size}, "
                             f"k {cost.k}")
        seen.add(key)


def batch_ranges(costs: Sequence[StepCost]) -> dict[tuple[str, int], tuple[float, float]]:
    """(variant, batch_size) -> (lower, upper): the running batch sizes B with lower < B <= upper use that row."""
    sizes: dict[str, list[int]] = {}
    for cost in costs:
        sizes.setdefault(cost.variant, []).append(cost.batch_size)
    out: dict[tuple[str, int], tuple[float, float]] = {}
    for variant, found in sizes.items():
        ordered = sorted(set(found))
        for i, size in enumerate(ordered):
            lower = 0.0 if i == 0 else float(ordered[i - 1])
            upper = math.inf if i == len(ordered) - 1 else float(size)
            out[(variant, size)] = (lower, upper)
    return out


def _number(value: float) -> str:
    """A PromQL number literal that parses back to the same float."""
    return "+Inf" if value == math.inf else repr(float(value))


def _rule(record: str, value: float, comment: str, labels: dict[str, str]) -> list[str]:
    out = [f"      # {comment}", f"      - record: {record}", f"        expr: vector({_number(value)})",
           "        labels:"]
    return out + [f'          {name}: "{text}"' for name, text in labels.items()]


def render_cost_rules(costs: Sequence[StepCost]) -> str:
    """The rule file's YAML text: one step-cost series per StepCost, and the batch ranges per variant and size."""
    validate(costs)
    out = ["# A step-cost table for specwatch's best-k rules, written by specwatch.promconfig.cost_rules "
           "(specwatch tune).",
           "# Drop it into the tuned/ folder next to prometheus.yml and reload Prometheus (docs/prometheus.md).",
           "groups:", f"  - name: {GROUP}", "    rules:"]
    for cost in sorted(costs, key=lambda c: (c.variant, c.batch_size, c.k)):
        out += _rule(C.step_cost, cost.seconds,
                     f"{cost.variant}: median step time at batch size {cost.batch_size}, k = {cost.k}.",
                     {"variant": cost.variant, "batch_size": str(cost.batch_size), "k": str(cost.k)})
    for (variant, size), (lower, upper) in sorted(batch_ranges(costs).items()):
        labels = {"variant": variant, "batch_size": str(size)}
        out += _rule(C.batch_lower, lower, f"{variant}: batch size {size} stands for running batches above this.",
                     labels)
        out += _rule(C.batch_upper, upper, f"{variant}: batch size {size} stands for running batches up to this.",
                     labels)
    return "\n".join(out) + "\n"


def write_cost_rules(costs: Sequence[StepCost], path: Path) -> None:
    """Write the rule file to `path` (its folder created), atomically: Prometheus never reads half a file."""
    write_text(path, render_cost_rules(costs))
