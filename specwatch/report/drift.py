"""How far a variant moved against itself over the study: the A/A test every verdict gets for free.

A study measures each variant more than once: in rounds (an interleaved design), or at least over the
span of its one block (a sequential design). The tasks are pooled, each request taken over its task's
median: the machine's drift is no task's. The same server with the same config, measured at two
times, should give the same TPOT; where it does not, the machine changed under the study (a busy
neighbour, a build, throttling). `drift` finds the two rounds whose medians lie furthest apart (in a
sequential design: the first and the second half of the block, by start time) and compares their
requests with the judge's two-sample estimate: the move is beyond the tolerance only when the whole
Hodges-Lehmann interval lies outside the policy's band, so the spread of a few requests is not called
drift. The same two parts of the candidate say whether the drift hit both sides alike (the blocking
cancels it) or not (the blocks of a round saw different conditions). What a verdict does with it is
`specwatch.report.verdict`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

from specwatch.judge import Band
from specwatch.report.results import RequestResult, VariantResults, request_value
from specwatch.stats import Shift, compare, median

MIN_PER_PART = 3  # requests in each of the two parts compared: fewer say nothing


@dataclass(frozen=True)
class Drift:
    """The largest move of one metric of one variant between two parts of the study, later against earlier."""

    variant: str
    metric: str
    first: str  # "round 1", "the first half of its block"
    second: str
    ratio: Shift  # the later part against the earlier one (Hodges-Lehmann on logs, with its interval)
    beyond: bool  # the whole interval lies outside the band
    parts: int  # rounds with enough requests (2 for the halves of a sequential block)

    @property
    def between(self) -> str:
        return f"between {self.first} and {self.second}"

    def text(self, title: str) -> str:
        """'baseline TPOT +48 % between round 1 and round 3'."""
        return f"{self.variant} {title} {(self.ratio.estimate - 1) * 100:+.0f} % {self.between}"


def _normalised(v: VariantResults, concurrency: int, metric: str, server_clock: bool
                ) -> list[tuple[RequestResult, float]]:
    """Every ok measured request of every task with its value over its task's median: the tasks pooled."""
    out: list[tuple[RequestResult, float]] = []
    for rows in v.requests.get(concurrency, {}).values():
        values = [(r, x) for r in rows if r.ok and (x := request_value(r, metric, server_clock)) is not None and x > 0]
        if values:
            mid = median([x for _, x in values])
            out += [(r, x / mid) for r, x in values]
    return out


def parts(v: VariantResults, concurrency: int, metric: str, server_clock: bool = False,
          min_per_part: int = MIN_PER_PART) -> dict[str, list[float]]:
    """The pooled values per round (`round R`); with one round, per half of the block in time order; parts of fewer
    than `min_per_part` values left out. What a verdict's drift compares, and what `drift.png` draws
    (`report.plots.drift_over_study`, every round however thin): one definition of drift."""
    pooled = _normalised(v, concurrency, metric, server_clock)
    by_round: dict[int, list[float]] = {}
    for r, x in pooled:
        by_round.setdefault(r.round, []).append(x)
    if len(by_round) >= 2:
        split = {f"round {r}": by_round[r] for r in sorted(by_round)}
    else:
        ordered = [x for _, x in sorted(pooled, key=lambda p: p[0].start)]
        middle = len(ordered) // 2
        split = {"the first half of its block": ordered[:middle], "the second half of its block": ordered[middle:]}
    return {k: xs for k, xs in split.items() if len(xs) >= min_per_part}


def drift(v: VariantResults, concurrency: int, metric: str, band: Band, server_clock: bool = False,
          between: tuple[str, str] | None = None) -> Drift | None:
    """The largest move of `metric` between two rounds of `v` (or the halves of its one block), its tasks pooled
    (each request over its task's median: the machine's drift is no task's), or its move `between` two named
    parts (another variant's drift, on this one); None without the data."""
    found = parts(v, concurrency, metric, server_clock)
    if between is not None:
        if not all(p in found for p in between):
            return None
        first, second = between
    elif len(found) < 2:
        return None
    else:
        first, second = max(combinations(list(found), 2),
                            key=lambda p: abs(math.log(median(found[p[1]]) / median(found[p[0]]))))
    ratio = compare(found[first], found[second], log_scale=True).effect
    beyond = ratio.low > band.high or ratio.high < band.low
    return Drift(v.name, metric, first, second, ratio, beyond, len(found))
