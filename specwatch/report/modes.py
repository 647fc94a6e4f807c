"""Whether one cell's per-request values split into two modes further apart than the tolerance.

A fixed-k arm can be bistable (one engine's A/B of one config measured 94.9-110.2 tok/s from round to round);
a Hodges-Lehmann shift then summarises two modes as one. `two_modes` is the detector, on the log values of a
cell's requests (a variant, task and concurrency; every round pooled, so a mode per round shows too):

- sort them and cut at the largest gap between neighbours that leaves each group at least
  `max(MIN_GROUP, 20 %)` of the requests (no mode of a few outliers);
- two modes when the gap itself (the empty stretch between the groups) is wider than `SPREADS` times the
  larger of the two groups' standard deviations (each group tight, far from the other), and the groups'
  medians lie further apart than the tolerance (`log` of the band's narrower edge: a split within the
  tolerance changes no verdict).

Calibrated on planted samples (`tests/test_verdict_confounders.py`): a log-normal of any spread with 20 to 200
requests gave a gap of at most 2.5 standard deviations in 5000 draws each; two modes 25 % apart with a log
spread of 0.02, the smaller holding 40 %, gave at least 3.1. Fewer than `MIN_REQUESTS` values say nothing.
The rounds' medians splitting (a mode per round) is also each side's drift between two rounds, judged by
`specwatch.report.verdict`'s drift rule.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from specwatch.judge import Band
from specwatch.stats import median

MIN_REQUESTS = 10
MIN_GROUP = 3
MIN_SHARE = 0.2
SPREADS = 3.0


@dataclass(frozen=True)
class Modes:
    """Two modes of one cell's values: each group's size and median (in the values' unit), lower one first."""

    low_n: int
    low: float
    high_n: int
    high: float

    @property
    def apart(self) -> float:
        """The higher mode over the lower one (1.38: 38 % apart)."""
        return self.high / self.low


def two_modes(values: Sequence[float], tolerance: Band) -> Modes | None:
    """The two modes of positive `values` (the rule above), None when they form one (or are too few to tell)."""
    logs = sorted(math.log(x) for x in values if x > 0)
    n = len(logs)
    least = max(MIN_GROUP, math.ceil(MIN_SHARE * n))
    if n < max(MIN_REQUESTS, 2 * least):
        return None
    cut = max(range(least, n - least + 1), key=lambda k: logs[k] - logs[k - 1])
    low, high = logs[:cut], logs[cut:]
    spread = max(statistics.stdev(low), statistics.stdev(high))
    apart = median(high) - median(low)
    edge = min([math.log(tolerance.high)] + ([-math.log(tolerance.low)] if tolerance.low > 0 else []))
    if logs[cut] - logs[cut - 1] <= SPREADS * spread or apart <= edge:
        return None
    return Modes(len(low), math.exp(median(low)), len(high), math.exp(median(high)))
