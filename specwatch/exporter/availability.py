"""Which upstreams can take a split's traffic: one known down gives its share to the others until it is healthy.

**Down.** An upstream is down when its health probe fails (`health_path` answers anything but 200 or
404, or does not answer), or when `down_after_failures` requests in a row could not reach it: refused,
reset, or a connect that timed out, before any byte of a response. A slow answer is not an unreachable
one: a request that was sent and timed out waiting (`upstream_timeout_seconds`) is an upstream error of
its own, never counted here (`Tap._exchange`).

**Healthy again.** A down upstream waits `wait` seconds (below), then:
- with a health endpoint (the probe got a 200): once its probe has answered 200 for `wait` with no
  failure (a failed probe or an unreachable request) meanwhile;
- without one (the probe got a 404, or `health_path: off`): once `wait` has passed since its last
  failure; its requests judge it from there (`down_after_failures` of them in a row take it out again).

**Backoff.** The first wait is `up_after_seconds`. An upstream that goes down again within
`flap_window_seconds` of coming back waits twice its last wait, at most `up_after_max_seconds`; one
that stayed up that long starts again from `up_after_seconds`. A flapping upstream so costs its few
failed requests per return ever more rarely, not every `up_after_seconds`.

Each transition is logged once and shown by `specwatch_upstream_routable`; every request the router
sends elsewhere because of it is counted, once forwarded, in `specwatch_rerouted_total{from, to}`
(`routing.Router`, `tap.Tap`). Requests in flight when an upstream died are not retried: they are the
upstream errors they are.

**Across workers** (`--workers N`) the down set, each outage's last failure and wait, and each return
live in the shared state (`shared.SharedState`, times on the host's monotonic clock): any worker that
sees the failures marks a variant down for all, and the probe (worker 0's) reads that shared set every
round, so it brings a variant back whichever worker saw it fail and whichever gets traffic. Every other
worker rereads the set every `probe_interval_seconds` too, so each worker's `specwatch_upstream_routable`
(aggregated `livemin`) follows within a round.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from specwatch.exporter.config import ExporterConfig
from specwatch.exporter.metrics import ExporterMetrics
from specwatch.exporter.shared import State

log = logging.getLogger("specwatch.exporter")
FAILURE_WRITE_SECONDS = 1.0  # a down upstream's later failures move its shared `since` at most this often


class Store(Protocol):
    def update(self, change: Callable[[State], State]) -> State: ...


class _Local:
    """The single process's state: `SharedState.update` without the file."""

    def __init__(self) -> None:
        self.state: State = {}

    def update(self, change: Callable[[State], State]) -> State:
        self.state = change(self.state)
        return self.state


class Availability:
    """The variants known down, and why; fed by the probe (`probed`) and by the tap (`failed`, `reached`)."""

    def __init__(self, cfg: ExporterConfig, metrics: ExporterMetrics, shared: Store | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg, self.metrics, self.clock = cfg, metrics, clock
        self.store: Store = shared if shared is not None else _Local()
        self.down: dict[str, str] = {}  # variant -> why
        self.outages: dict[str, dict[str, float]] = {}  # down variant -> {"since": last failure, "wait": s}
        self._failures = dict.fromkeys(cfg.upstreams, 0)
        self._up_since: dict[str, float] = {}  # a down variant's first probe 200 in the current run of them
        for variant in cfg.upstreams:
            metrics.upstream_routable.labels(variant).set(1)

    def is_down(self, variant: str) -> bool:
        return variant in self.down

    # -- what is seen ----------------------------------------------------------------------------------
    def probed(self, variant: str, up: bool | None) -> None:
        """The probe's answer: True (200), False (failed), None (no health endpoint, or no probe at all)."""
        if up is False:
            self._up_since.pop(variant, None)
            self._mark_down(variant, "its health probe failed")
            return
        if variant not in self.down:
            return
        now = self.clock()
        outage = self.outages.get(variant) or {"since": now, "wait": self.cfg.up_after_seconds}
        if up:
            start = max(self._up_since.setdefault(variant, now), outage["since"])
        else:
            start = outage["since"]
        if now - start >= outage["wait"]:
            self._mark_up(variant, f"its health probe has answered for {now - start:.0f} s" if up else
                          f"no health endpoint: no failure for {now - start:.0f} s, its requests judge it")

    def failed(self, variant: str) -> None:
        """A request could not reach `variant` (refused, reset or no connection, before any response byte)."""
        self._failures[variant] = self._failures.get(variant, 0) + 1
        outage = self.outages.get(variant)
        if outage is not None:  # down already: the wait for it starts again (shared at most every second)
            if self.clock() - outage["since"] >= FAILURE_WRITE_SECONDS:
                self._mark_down(variant, None)
        elif self._failures[variant] >= self.cfg.down_after_failures:
            self._mark_down(variant, f"{self._failures[variant]} requests in a row could not reach it")

    def reached(self, variant: str) -> None:
        """A request to `variant` got its response head."""
        self._failures[variant] = 0

    # -- transitions: decided against the (shared) state under its lock, then adopted here -------------
    def _mark_down(self, variant: str, why: str | None) -> None:
        """Take `variant` out (`why`), or where it is out already restart its wait; None: only the latter."""
        now = self.clock()
        cfg = self.cfg
        moved: dict[str, Any] = {}

        def change(state: State) -> State:
            down, outages = dict(state.get("down") or {}), dict(state.get("outages") or {})
            if variant in down:  # down already (maybe by another worker): a failure meanwhile
                if variant in outages:
                    outages[variant] = {**outages[variant], "since": max(now, outages[variant]["since"])}
                return {**state, "outages": outages}
            if why is None:  # back in the split meanwhile (another worker's probe): one failure is no outage
                return state
            back = (state.get("returns") or {}).get(variant)
            wait = cfg.up_after_seconds
            if back is not None and now - back["at"] < cfg.flap_window_seconds:
                wait = min(2 * back["wait"], cfg.up_after_max_seconds)
                moved["back"] = now - back["at"]
            down[variant] = why
            outages[variant] = {"since": now, "wait": wait}
            moved["wait"] = wait
            return {**state, "down": down, "outages": outages}

        self.adopt(self.store.update(change))
        if "wait" not in moved:
            return
        others = [v for v in cfg.upstreams if v not in self.down and v != cfg.mirror]
        again = (f"; down again {moved['back']:.0f} s after it came back: the wait doubles"
                 if "back" in moved else "")
        log.warning("upstream %s is down (%s): its share of the split goes to %s until it is healthy for %.0f s%s",
                    variant, why, ", ".join(others) or "nobody (every upstream is down)", moved["wait"], again)

    def _mark_up(self, variant: str, why: str) -> None:
        now = self.clock()
        done = []

        def change(state: State) -> State:
            down, outages = dict(state.get("down") or {}), dict(state.get("outages") or {})
            if variant not in down:
                return state
            down.pop(variant)
            outage = outages.pop(variant, None) or {"wait": self.cfg.up_after_seconds}
            returns = {**(state.get("returns") or {}), variant: {"at": now, "wait": outage["wait"]}}
            done.append(True)
            return {**state, "down": down, "outages": outages, "returns": returns}

        self.adopt(self.store.update(change))
        if done:
            log.warning("upstream %s is healthy again (%s): back in the split", variant, why)

    # -- the state, whoever changed it -----------------------------------------------------------------
    def adopt(self, state: State) -> None:
        """The (shared) state's view becomes this worker's: its down set, outages and gauge."""
        theirs = {str(k): str(v) for k, v in (state.get("down") or {}).items()}
        self.outages = {str(k): {"since": float(v["since"]), "wait": float(v["wait"])}
                        for k, v in (state.get("outages") or {}).items()}
        for variant in set(self.down) - set(theirs):
            self.down.pop(variant)
            self._failures[variant] = 0
            self._up_since.pop(variant, None)
            self.metrics.upstream_routable.labels(variant).set(1)
        for variant, why in theirs.items():
            if variant not in self.down:
                self.down[variant] = why
                self._up_since.pop(variant, None)
                self.metrics.upstream_routable.labels(variant).set(0)
