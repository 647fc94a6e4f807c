"""Client-side LLM latencies (TTFT, TPOT, ITL) per task, kept apart from Locust's request statistics.

Locust's statistics are about HTTP requests; a time to first token or an inter-token gap is not a request, so
these live here. A `LatencyBook` holds per (metric, task) the exact count, sum, minimum and maximum and a
histogram of 1 % log-spaced buckets: percentiles within 0.5 % (clamped to the exact min and max, so one sample
is exact), sub-millisecond gaps kept (Locust rounds to whole ms), and books merge by adding counts, so a worker
sends what it recorded since its last report (`take`) and the master adds it up (`merge`).
Percentiles are nearest rank over the bucket counts, as `specwatch load`'s summary is over the raw values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

METRICS = ("TTFT", "TPOT", "ITL")
GROWTH = 1.01            # each bucket 1 % wider than the one below
FLOOR_MS = 0.001         # 1 µs: smaller values (and 0) share bucket 0
PERCENTILES = (50, 95, 99)
_LOG_GROWTH = math.log(GROWTH)


def bucket(ms: float) -> int:
    return 0 if ms <= FLOOR_MS else 1 + int(math.log(ms / FLOOR_MS) / _LOG_GROWTH)


def bucket_value(index: int) -> float:
    """The geometric middle of the bucket: within 0.5 % of every value in it."""
    return FLOOR_MS if index == 0 else FLOOR_MS * GROWTH ** (index - 0.5)


@dataclass
class Series:
    count: int = 0
    total_ms: float = 0.0
    min_ms: float = math.inf
    max_ms: float = 0.0
    buckets: dict[int, int] = field(default_factory=dict)

    def add(self, ms: float) -> None:
        self.count += 1
        self.total_ms += ms
        self.min_ms = min(self.min_ms, ms)
        self.max_ms = max(self.max_ms, ms)
        i = bucket(ms)
        self.buckets[i] = self.buckets.get(i, 0) + 1

    def merge(self, other: Series) -> None:
        self.count += other.count
        self.total_ms += other.total_ms
        self.min_ms = min(self.min_ms, other.min_ms)
        self.max_ms = max(self.max_ms, other.max_ms)
        for i, n in other.buckets.items():
            self.buckets[i] = self.buckets.get(i, 0) + n

    def percentile(self, p: float) -> float | None:
        """Nearest rank: the smallest value with at least p % of the samples at or below it."""
        if not self.count:
            return None
        rank = max(1, math.ceil(p / 100 * self.count))
        seen = 0
        for i in sorted(self.buckets):
            seen += self.buckets[i]
            if seen >= rank:
                return min(max(bucket_value(i), self.min_ms), self.max_ms)
        return self.max_ms

    def as_message(self) -> dict[str, Any]:
        return {"n": self.count, "sum": self.total_ms, "min": self.min_ms, "max": self.max_ms,
                "b": [[i, n] for i, n in sorted(self.buckets.items())]}

    @classmethod
    def from_message(cls, data: dict[str, Any]) -> Series:
        return cls(int(data["n"]), float(data["sum"]), float(data["min"]), float(data["max"]),
                   {int(i): int(n) for i, n in data["b"]})


class LatencyBook:
    """Every (metric, task) series of one Locust process, or of a whole distributed run on its master."""

    def __init__(self) -> None:
        self.series: dict[tuple[str, str], Series] = {}

    def record(self, metric: str, task: str, seconds: float) -> None:
        if metric not in METRICS:
            raise ValueError(f"latency metric {metric!r}: expected one of {', '.join(METRICS)}")
        self.series.setdefault((metric, task), Series()).add(seconds * 1000)

    def clear(self) -> None:
        self.series = {}

    def take(self) -> list[list[Any]]:
        """What was recorded since the last take, as a message (msgpack-safe), and forget it: a worker's delta."""
        message = [[metric, task, s.as_message()] for (metric, task), s in self.series.items()]
        self.clear()
        return message

    def merge(self, message: list[list[Any]] | None) -> None:
        for metric, task, data in message or ():
            self.series.setdefault((str(metric), str(task)), Series()).merge(Series.from_message(data))

    def rows(self) -> list[dict[str, Any]]:
        """One row per (task, metric) in task order, then TTFT, TPOT, ITL: the count and ms at each percentile."""
        order = {m: i for i, m in enumerate(METRICS)}
        rows = []
        for (metric, task), s in sorted(self.series.items(), key=lambda kv: (kv[0][1], order[kv[0][0]])):
            row: dict[str, Any] = {"metric": metric, "task": task, "count": s.count,
                                   "mean": s.total_ms / s.count if s.count else None}
            row.update({f"p{p}": s.percentile(p) for p in PERCENTILES})
            row["max"] = s.max_ms if s.count else None
            rows.append(row)
        return rows
