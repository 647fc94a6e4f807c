"""The fit and the recommendation: expected tokens per step per k, step cost per (batch size, k), the best k per range.

- Acceptance, per task: P_i = P(a decode step accepted >= i drafts), the summed survival counts
  (vLLM's per-position counter) over the summed decode steps of every request measured with
  k >= i. Per decode step, not per drafting step, so steps an n-gram proposer skipped count as
  accepting nothing. For greedy drafting the first i drafts do not depend on k, so every cell
  with k >= i measures the same P_i.
- Expected tokens per step: E_t(k) = 1 + sum_{i=1..k} P_i (the bonus token plus each accepted draft).
- Step cost: the median step time of each measured (concurrency, k) cell at the cell's median
  measured batch (requests in flight, `sweep.in_flight`), linear in log(batch size) between a k's
  measured batches and held flat outside them.
- Per batch size b, per k: output tokens per second per stream = sum_t w_t E_t(k) / cost(b, k)
  (w the task mix) and each task's expected TPOT cost(b, k) / E_t(k). The recommended k is the
  smallest k within `tolerance` of the best throughput among the k whose every task meets the
  TPOT objective (when none meets it, the k with the lowest worst-task TPOT, flagged).
- Intervals: a bootstrap over requests (every cell's requests and each task's acceptance
  records resampled with replacement, the whole fit redone), percentile intervals.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specwatch.stats import median
from specwatch.tune.sweep import Sample, Sweep

Ranges = tuple[tuple[int, int, int], ...]


def fit_acceptance(records: Sequence[tuple[int, Sample]], max_k: int) -> tuple[float, ...]:
    """P_1..P_max_k from (k the request ran with, the request); 0 where no request measured a position."""
    out = []
    for i in range(1, max_k + 1):
        accepted = steps = 0
        for k, s in records:
            if k >= i:
                accepted += s.survival[i - 1] if i - 1 < len(s.survival) else 0
                steps += s.decode_steps
        out.append(accepted / steps if steps else 0.0)
    return tuple(out)


def expected_tokens(per_position: Sequence[float], k: int) -> float:
    """1 + sum_{i=1..k} P(accepted >= i): tokens per decode step with k drafts."""
    return 1.0 + sum(per_position[:k])


@dataclass(frozen=True)
class CostTable:
    """Median seconds per decode step per measured (concurrency, k) cell, at the cell's measured batch size.

    `at` interpolates a k's cells in log(batch); `measured` (default: batch = concurrency) is the
    median number of requests in flight the cell's requests decoded with."""

    batches: tuple[int, ...]  # the measured concurrencies
    seconds: Mapping[tuple[int, int], float]  # (concurrency, k)
    measured: Mapping[tuple[int, int], float] | None = None  # (concurrency, k) -> batch

    def batch(self, concurrency: int, k: int) -> float:
        return (self.measured or {}).get((concurrency, k), float(concurrency))

    def at(self, batch: float, k: int) -> float:
        points = sorted((self.batch(c, k), self.seconds[(c, k)]) for c in self.batches)
        xs = [max(x, 1.0) for x, _ in points]
        if batch <= xs[0]:
            return points[0][1]
        if batch >= xs[-1]:
            return points[-1][1]
        hi = bisect.bisect_left(xs, batch)
        lo = hi - 1
        if xs[hi] == xs[lo]:
            return points[hi][1]
        w = (math.log(batch) - math.log(xs[lo])) / (math.log(xs[hi]) - math.log(xs[lo]))
        return points[lo][1] * (1 - w) + points[hi][1] * w


@dataclass(frozen=True)
class Choice:
    batch: int
    k: int
    tokens_per_s: Mapping[int, float]  # per stream, the mix, for every k
    tpot_ms: Mapping[str, float]  # per task, at the chosen k
    meets_objective: bool


@dataclass(frozen=True)
class Model:
    """Everything the recommendation rests on."""

    ks: tuple[int, ...]
    mix: Mapping[str, float]  # task -> weight, summing to 1
    acceptance: Mapping[str, tuple[float, ...]]  # task -> P_1..P_K
    cost: CostTable

    def tokens_per_step(self, k: int) -> float:
        return sum(w * expected_tokens(self.acceptance[t], k) for t, w in self.mix.items())

    def tokens_per_s(self, batch: float, k: int) -> float:
        return self.tokens_per_step(k) / self.cost.at(batch, k)

    def tpot_ms(self, batch: float, k: int) -> dict[str, float]:
        return {t: 1000 * self.cost.at(batch, k) / expected_tokens(self.acceptance[t], k) for t in self.mix}

    def gain(self, batch: float, k: int) -> float:
        """Expected output tokens per second per stream at k relative to no speculation, minus 1."""
        return self.tokens_per_s(batch, k) / self.tokens_per_s(batch, 0) - 1


def choose(model: Model, batch: int, max_tpot_ms: float | None, tolerance: float) -> Choice:
    rates = {k: model.tokens_per_s(batch, k) for k in model.ks}
    worst = {k: max(model.tpot_ms(batch, k).values()) for k in model.ks}
    feasible = [k for k in model.ks if max_tpot_ms is None or worst[k] <= max_tpot_ms]
    if feasible:
        best = max(rates[k] for k in feasible)
        k = min(k for k in feasible if rates[k] >= (1 - tolerance) * best)
    else:
        k = min(model.ks, key=lambda k: (worst[k], k))
    return Choice(batch, k, rates, model.tpot_ms(batch, k), bool(feasible))


def recommend(model: Model, max_batch: int, max_tpot_ms: float | None = None,
              tolerance: float = 0.01) -> tuple[list[Choice], Ranges]:
    """The choice at every batch size 1..max_batch, and the ranges [start, end, k] it makes (start at 1)."""
    choices = [choose(model, b, max_tpot_ms, tolerance) for b in range(1, max_batch + 1)]
    ranges: list[tuple[int, int, int]] = []
    for c in choices:
        if ranges and ranges[-1][2] == c.k:
            ranges[-1] = (ranges[-1][0], c.batch, c.k)
        else:
            ranges.append((c.batch, c.batch, c.k))
    return choices, tuple(ranges)


def speculative_config(method: Mapping[str, object], ranges: Ranges) -> dict[str, object] | None:
    """The `--speculative-config` object: the method's keys, k = the largest K, the per-batch-size table.

    None when every range says k = 0 (no speculation at any batch size)."""
    top = max(k for _, _, k in ranges)
    if top == 0:
        return None
    return {**method, "num_speculative_tokens": top,
            "num_speculative_tokens_per_batch_size": [list(r) for r in ranges]}


def mix_of(sweep: Sweep) -> dict[str, float]:
    """The observed mix: each task's share of the sweep's measured requests."""
    counts = {t: 0 for t in sweep.tasks}
    for cell in sweep.cells.values():
        for s in cell.samples:
            counts[s.task] = counts.get(s.task, 0) + 1
    total = sum(counts.values())
    return {t: n / total for t, n in counts.items() if n}


def acceptance_records(sweep: Sweep) -> dict[str, list[tuple[int, Sample]]]:
    out: dict[str, list[tuple[int, Sample]]] = {}
    for (k, _c), cell in sweep.cells.items():
        if k > 0:
            for s in cell.samples:
                out.setdefault(s.task, []).append((k, s))
    return out


def cost_table(cells: Mapping[tuple[int, int], Sequence[Sample]]) -> CostTable:
    """From (k, concurrency) -> requests: the median step time and the median measured batch per cell."""
    seconds = {(c, k): median([s.step_s for s in samples]) for (k, c), samples in cells.items()}
    measured = {(c, k): median([s.batch or float(c) for s in samples]) for (k, c), samples in cells.items()}
    return CostTable(tuple(sorted({c for (_k, c) in cells})), seconds, measured)


def build_model(sweep: Sweep, mix: Mapping[str, float] | None = None,
                acceptance: Mapping[str, tuple[float, ...]] | None = None) -> Model:
    """The model from a sweep; `mix` defaults to the observed one, `acceptance` (e.g. live traffic) to the sweep's."""
    weights = dict(mix or mix_of(sweep))
    total = sum(weights.values())
    weights = {t: w / total for t, w in weights.items() if w > 0}
    records = acceptance_records(sweep)
    top = max(sweep.ks)
    fitted = {t: fit_acceptance(records.get(t, []), top) for t in weights}
    if acceptance is not None:
        fitted.update({t: (tuple(p[:top]) + (0.0,) * top)[:top] for t, p in acceptance.items() if t in weights})
    missing = [t for t in weights if not any(fitted[t]) and t not in records and t not in (acceptance or {})]
    if missing:
        raise ValueError(f"task mix: no measured acceptance for {', '.join(missing)} "
                         f"(the sweep's tasks are {', '.join(sweep.tasks)})")
    cells = {key: cell.samples for key, cell in sweep.cells.items()}
    return Model(sweep.ks, weights, fitted, cost_table(cells))


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float


def bootstrap_gains(sweep: Sweep, model: Model, points: Sequence[tuple[int, int]], resamples: int = 300,
                    confidence: float = 0.95, seed: int = 0,
                    live_acceptance: bool = False) -> dict[tuple[int, int], Interval]:
    """The expected gain at each (batch, k) of `points` with its bootstrap interval over requests."""
    rng = random.Random(seed)
    records = acceptance_records(sweep)
    cells = {key: cell.samples for key, cell in sweep.cells.items()}
    top = max(sweep.ks)
    draws: dict[tuple[int, int], list[float]] = {p: [] for p in points}
    for _ in range(resamples):
        resampled = {key: [rng.choice(samples) for _ in samples] for key, samples in cells.items()}
        acceptance = dict(model.acceptance)
        if not live_acceptance:
            for t in model.mix:
                recs = records.get(t, [])
                acceptance[t] = fit_acceptance([rng.choice(recs) for _ in recs], top) if recs else acceptance[t]
        m = Model(model.ks, model.mix, acceptance, cost_table(resampled))
        for b, k in points:
            draws[(b, k)].append(m.gain(b, k))
    out = {}
    tail = (1 - confidence) / 2
    for (b, k), values in draws.items():
        values.sort()
        lo = values[int(tail * (len(values) - 1))]
        hi = values[math.ceil((1 - tail) * (len(values) - 1))]
        out[(b, k)] = Interval(model.gain(b, k), lo, hi)
    return out


@dataclass(frozen=True)
class Recommendation:
    """The fit's answer: the per-batch-size ranges and their `--speculative-config`, the model behind them, the choice
    at every batch size and the expected gains with their intervals (what `tuner` writes and `render` words)."""

    ranges: Ranges
    speculative_config: dict[str, Any] | None
    model: Model
    choices: list[Choice]
    gains: dict[tuple[int, int], Interval]  # (batch, k) at the measured concurrencies
    max_tpot_ms: float | None
    acceptance_source: str
    warnings: tuple[str, ...] = ()
