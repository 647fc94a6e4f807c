"""Per-request load results: one JSON line per request, and the per-task summary built from them.

Latency percentiles are computed from every request's own samples (nearest rank); acceptance
is summed first, then divided (D = 0 gives no value). TTFT is measured to the first chunk
that carries text (the role chunk of chat streams carries none), each chunk timed when its
line arrives, before it is parsed; TPOT per request as (last text chunk - first) /
(completion tokens - 1), ITL between text chunks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specwatch.acceptance import Acceptance

# A request cut by the run's stop (Locust kills the user mid-stream): a failure here, a client_abort at the exporter.
STOPPED_MID_REQUEST = "stopped mid-request: the run ended before the answer did (the exporter counts a client_abort)"

@dataclass
class RequestResult:
    task: str
    ok: bool
    warmup: bool
    start: float
    end: float
    ttft_s: float | None = None
    tpot_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    prompt_tokens: int = 0
    spec: dict[str, Any] | None = None
    error: str | None = None
    # the server's own timing of the request (`--enable-per-request-metrics`: generation_time_ms, mean_itl_ms, ...)
    server: dict[str, Any] | None = None
    round: int = 1  # the study's round whose block sent it (`specwatch.experiment.blocks`); 1 outside a study

    def line(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":")) + "\n"


def read_results(paths: Iterable[Path]) -> list[RequestResult]:
    out: list[RequestResult] = []
    for path in paths:
        if path.exists():
            out += [RequestResult(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    return out


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(p / 100 * len(ordered)) - 1, 0)]


def _ms(values: Sequence[float]) -> dict[str, float | None]:
    return {f"p{p}": None if (v := percentile(values, p)) is None else round(v * 1000, 3) for p in (50, 95, 99)}


def summarise(results: Sequence[RequestResult]) -> dict[str, Any]:
    measured = [r for r in results if not r.warmup]
    per_task: dict[str, Any] = {}
    for task in sorted({r.task for r in measured}):
        rows = [r for r in measured if r.task == task]
        ok = [r for r in rows if r.ok]
        span = (max(r.end for r in ok) - min(r.start for r in ok)) if ok else 0.0
        acc = Acceptance()
        for r in ok:
            acc = acc.add(r.spec, r.completion_tokens)
        tokens = sum(r.completion_tokens for r in ok)
        per_task[task] = {
            "requests": len(rows), "failures": len(rows) - len(ok),
            "ttft_ms": _ms([r.ttft_s for r in ok if r.ttft_s is not None]),
            "tpot_ms": _ms([r.tpot_s for r in ok if r.tpot_s is not None]),
            "itl_ms": _ms([x for r in ok for x in r.itl_s]),
            "output_tokens": tokens,
            "output_tokens_per_second": round(tokens / span, 2) if span > 0 else None,
            "acceptance": acc.as_dict(),
            "errors": sorted({r.error for r in rows if r.error})[:10],
        }
    return {"tasks": per_task, "warmup_requests": len(results) - len(measured)}
