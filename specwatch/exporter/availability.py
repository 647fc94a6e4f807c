"""Which upstreams can take a split's traffic: one known down gives its share to the others until it is healthy.

An upstream is **down** when its health probe fails (`/health` not 200), or when
`down_after_failures` requests in a row could not reach it (refused, reset or timed out before the
response head). It is **healthy again** once the probe has found it up for `up_after_seconds` with no
connection failure meanwhile. Each transition is logged once and shown by `specwatch_upstream_routable`;
every request the router sends elsewhere because of it is counted in `specwatch_rerouted_total{from, to}`
(`routing.Router`). Requests that were in flight when an upstream died are not retried: they are the
upstream errors they are.

With `--workers N` the down set lives in the shared state (`shared.SharedState`): any worker that sees the
failures marks a variant down for all; worker 0, the one that probes, marks it healthy again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from specwatch.exporter.config import ExporterConfig
from specwatch.exporter.metrics import ExporterMetrics
from specwatch.exporter.shared import SharedState, State

log = logging.getLogger("specwatch.exporter")


class Availability:
    """The variants known down, and why; fed by the probe (`probed`) and by the tap (`failed`, `reached`)."""

    def __init__(self, cfg: ExporterConfig, metrics: ExporterMetrics, shared: SharedState | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg, self.metrics, self.shared, self.clock = cfg, metrics, shared, clock
        self.down: dict[str, str] = {}  # variant -> why
        self._failures = dict.fromkeys(cfg.upstreams, 0)
        self._up_since: dict[str, float] = {}  # a down variant's first probe up since its last failure
        for variant in cfg.upstreams:
            metrics.upstream_routable.labels(variant).set(1)

    def is_down(self, variant: str) -> bool:
        return variant in self.down

    # -- what is seen ----------------------------------------------------------------------------------
    def probed(self, variant: str, up: bool) -> None:
        if not up:
            self._up_since.pop(variant, None)
            self._mark_down(variant, "its health probe failed")
            return
        if variant not in self.down:
            return
        now = self.clock()
        since = self._up_since.setdefault(variant, now)
        if now - since >= self.cfg.up_after_seconds:
            self._mark_up(variant, f"its health probe has answered for {now - since:.0f} s")

    def failed(self, variant: str) -> None:
        """A request could not reach `variant` (no response head)."""
        self._up_since.pop(variant, None)
        self._failures[variant] = self._failures.get(variant, 0) + 1
        if self._failures[variant] >= self.cfg.down_after_failures:
            self._mark_down(variant, f"{self._failures[variant]} requests in a row could not reach it")

    def reached(self, variant: str) -> None:
        """A request to `variant` got its response head."""
        self._failures[variant] = 0

    # -- transitions -----------------------------------------------------------------------------------
    def _mark_down(self, variant: str, why: str) -> None:
        if variant in self.down:
            return
        self.down[variant] = why
        self.metrics.upstream_routable.labels(variant).set(0)
        others = [v for v in self.cfg.upstreams if v not in self.down and v != self.cfg.mirror]
        log.warning("upstream %s is down (%s): its share of the split goes to %s until it is healthy for %.0f s",
                    variant, why, ", ".join(others) or "nobody (every upstream is down)", self.cfg.up_after_seconds)
        self._publish(variant, why)

    def _mark_up(self, variant: str, why: str) -> None:
        if self.down.pop(variant, None) is None:
            return
        self._failures[variant] = 0
        self._up_since.pop(variant, None)
        self.metrics.upstream_routable.labels(variant).set(1)
        log.warning("upstream %s is healthy again (%s): back in the split", variant, why)
        self._publish(variant, None)

    # -- across workers --------------------------------------------------------------------------------
    def _publish(self, variant: str, why: str | None) -> None:
        """This one transition into the shared down set (merged there: other workers' entries stay)."""
        if self.shared is None:
            return

        def change(state: State) -> State:
            down = dict(state.get("down") or {})
            if why is None:
                down.pop(variant, None)
            else:
                down[variant] = why
            return {**state, "down": down}
        self.shared.update(change)

    def adopt(self, state: State) -> None:
        """Another worker's view (the shared state changed): its down set becomes this worker's."""
        theirs = {str(k): str(v) for k, v in (state.get("down") or {}).items()}
        for variant in set(self.down) - set(theirs):
            self.down.pop(variant)
            self._failures[variant] = 0
            self.metrics.upstream_routable.labels(variant).set(1)
        for variant, why in theirs.items():
            if variant not in self.down:
                self.down[variant] = why
                self.metrics.upstream_routable.labels(variant).set(0)
