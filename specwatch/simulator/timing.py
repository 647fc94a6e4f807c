"""How long a simulated engine step takes: measured H200 step times, interpolated.

Tables: ../shared/reference/h200-step-times.md (Qwen3-8B target, Qwen3-0.6B draft; batch 1-64,
1/2/4/5/17 tokens per sequence, 512 and 2048 tokens of context), bilinear in log(batch) and
tokens per sequence, linear in context between the two measured contexts (held flat
outside), extrapolated proportionally above batch 64. On top of the forward pass: a fixed
per-step overhead for vLLM's scheduler, sampler and detokenizer (1.2 ms, the SpecDecode-Bench
fit P1), prefill from the same fit (5.886 ms + 0.02101 ms per prompt token), and per method
the drafting cost: a 0.6B draft model runs k sequential decode steps, an EAGLE head
2.135 ms per step (P1), MTP one head step, n-gram / suffix 0.6 % of the verify time (P1).
"""

from __future__ import annotations

import bisect
import math

BATCHES = (1, 4, 8, 16, 32, 64)
TOKENS = (1, 2, 4, 5, 17)
# model -> context -> rows by batch, columns by tokens per sequence (ms)
H200_MS: dict[str, dict[int, tuple[tuple[float, ...], ...]]] = {
    "qwen3-8b": {
        512: ((4.84, 5.08, 5.12, 5.12, 5.14), (4.98, 5.33, 5.17, 5.22, 5.46), (5.19, 5.42, 5.55, 5.63, 6.28),
              (5.12, 6.06, 6.17, 6.30, 8.98), (5.53, 7.17, 7.59, 8.11, 16.03), (6.22, 9.68, 11.30, 12.77, 32.02)),
        2048: ((4.89, 5.70, 5.73, 5.76, 5.79), (5.20, 5.95, 5.79, 5.83, 6.07), (5.63, 6.70, 6.79, 6.89, 7.55),
               (5.92, 8.58, 8.68, 8.84, 11.79), (7.11, 12.48, 13.24, 13.55, 22.02),
               (9.42, 20.93, 22.80, 24.18, 43.59)),
    },
    "qwen3-0.6b": {
        512: ((1.35, 1.53, 1.47, 1.50, 1.44), (1.42, 1.40, 1.44, 1.46, 1.51), (1.29, 1.47, 1.49, 1.51, 1.54),
              (1.41, 1.67, 1.70, 1.69, 1.91), (1.64, 2.10, 2.14, 2.17, 2.83), (2.15, 2.94, 3.07, 3.24, 4.90)),
        2048: ((1.38, 1.99, 2.03, 2.00, 1.93), (1.64, 1.90, 1.95, 1.95, 2.01), (1.67, 1.98, 1.98, 2.01, 2.04),
               (2.07, 2.70, 2.71, 2.71, 2.92), (2.91, 4.24, 4.32, 4.38, 5.18), (4.62, 7.61, 7.74, 7.97, 9.76)),
    },
}
STEP_OVERHEAD_MS = 1.2
PREFILL_BASE_MS, PREFILL_PER_TOKEN_MS = 5.886, 0.02101
EAGLE_HEAD_MS = 2.135
LOOKUP_SHARE = 0.006


def _interp(xs: tuple[int, ...], x: float, transform: bool) -> tuple[int, int, float]:
    """Indices of the neighbours of x in xs and the weight of the upper one."""
    if x <= xs[0]:
        return 0, 0, 0.0
    if x >= xs[-1]:
        return len(xs) - 1, len(xs) - 1, 0.0
    hi = bisect.bisect_left(xs, x)
    lo = hi - 1
    f = math.log if transform else float
    return lo, hi, (f(x) - f(xs[lo])) / (f(xs[hi]) - f(xs[lo]))


def _table(model: str, ctx: int, batch: float, tokens: float) -> float:
    rows = H200_MS[model][ctx]
    b0, b1, wb = _interp(BATCHES, batch, True)
    t0, t1, wt = _interp(TOKENS, tokens, False)

    def at(b: int, t: int) -> float:
        return rows[b][t]

    low = at(b0, t0) * (1 - wt) + at(b0, t1) * wt
    high = at(b1, t0) * (1 - wt) + at(b1, t1) * wt
    value = low * (1 - wb) + high * wb
    if batch > BATCHES[-1]:  # beyond the table: the batch-64 cost grows with the work
        value *= batch / BATCHES[-1]
    return value


def forward_ms(model: str, batch: int, tokens_per_seq: float, context: float) -> float:
    """One forward pass: `batch` sequences, `tokens_per_seq` new tokens each, `context` cached tokens each."""
    if batch <= 0:
        return 0.0
    lo, hi = 512, 2048
    w = min(max((context - lo) / (hi - lo), 0.0), 1.0)
    return _table(model, lo, batch, tokens_per_seq) * (1 - w) + _table(model, hi, batch, tokens_per_seq) * w


def draft_ms(method: str, batch: int, k: int, context: float, verify_ms: float) -> float:
    """The drafting cost of one step for `batch` sequences with k draft slots each."""
    if batch <= 0 or k <= 0:
        return 0.0
    if method == "draft_model":
        return k * forward_ms("qwen3-0.6b", batch, 1, context)
    if method in ("eagle", "eagle3"):
        return EAGLE_HEAD_MS
    if method == "mtp":
        return k * forward_ms("qwen3-0.6b", batch, 1, context) / 2
    return LOOKUP_SHARE * verify_ms


def step_ms(method: str | None, batch: int, k: int, verify_tokens_per_seq: float, context: float,
            prefill_tokens: int) -> float:
    """One engine step: drafting for `batch` decoding sequences (k slots each), verifying
    `verify_tokens_per_seq` tokens per sequence, plus `prefill_tokens` of prompt, plus overhead."""
    total = STEP_OVERHEAD_MS
    if batch:
        verify = forward_ms("qwen3-8b", batch, verify_tokens_per_seq, context)
        total += verify + (draft_ms(method, batch, k, context, verify) if method else 0.0)
    if prefill_tokens:
        total += PREFILL_PER_TOKEN_MS * prefill_tokens + (0.0 if batch else PREFILL_BASE_MS)
    return total
