"""Which upstream serves a request: a pinned variant, a sticky or random weighted split, and the mirror.

A split's pick that is known down (`availability`) goes to the split's other upstreams in proportion to
their shares (the default route where none has a share); a pinned variant (`X-Specwatch-Variant`) is
never rerouted, nor is the mirror. `pick` says where a request goes and which variant it was taken
from; the tap counts it in `specwatch_rerouted_total` once it is forwarded (a request refused before,
413 or 400, is not), and mirrors only the default route's own requests, never rerouted ones. With
several workers the weights and the down set live in `SharedState`: each request first checks its
version counter and rereads them when another worker changed them.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping

from specwatch.exporter.availability import Availability
from specwatch.exporter.config import ExporterConfig
from specwatch.exporter.metrics import ExporterMetrics
from specwatch.exporter.shared import SharedState

VARIANT_HEADER = "x-specwatch-variant"


class Router:
    def __init__(self, cfg: ExporterConfig, metrics: ExporterMetrics, rng: random.Random | None = None,
                 shared: SharedState | None = None) -> None:
        self.cfg, self.metrics = cfg, metrics
        self.rng = rng or random.Random()
        self.weights = dict(cfg.split)  # mutable: a canary can set a weight to 0
        self.shared = shared
        self.availability = Availability(cfg, metrics, shared)
        self._version = -1
        self.refresh()

    def refresh(self) -> None:
        """Take the shared weights when they changed since the last look (no-op for a single process)."""
        if self.shared is not None and self.shared.version() != self._version:
            self._version, state = self.shared.read()
            self.weights = {str(k): float(v) for k, v in state["weights"].items()}
            self.availability.adopt(state)

    def _bucket(self, headers: Mapping[str, str]) -> float:
        key = headers.get(self.cfg.sticky_header.lower()) if self.cfg.sticky_header else None
        if key is None:
            return self.rng.random() * 100
        digest = hashlib.sha256(key.encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2 ** 64 * 100  # same key, same bucket, same route

    def route(self, headers: Mapping[str, str]) -> str:
        """The variant that serves a request with these headers."""
        return self.pick(headers)[0]

    def pick(self, headers: Mapping[str, str]) -> tuple[str, str | None]:
        """The variant that serves a request, and the split's pick it was rerouted from (None: not rerouted)."""
        self.refresh()
        pinned = headers.get(VARIANT_HEADER)
        if pinned is not None and pinned in self.cfg.upstreams:
            return pinned, None
        bucket = self._bucket(headers)
        stretches = self.stretches()
        variant, within = _pick(stretches, bucket)
        if not self.availability.down or not self.availability.is_down(variant):
            return variant, None
        alive = [(v, pct) for v, pct in stretches if pct > 0 and not self.availability.is_down(v)]
        if not alive:  # the split's others have no share: the default route takes it, where it is up
            default = self.cfg.default_variant
            if self.availability.is_down(default) or default == variant:
                return variant, None  # nobody to send it to: it fails as the upstream error it is
            alive = [(default, 100.0)]
        # where the bucket lies within the down variant's stretch, spread over the live ones: in proportion to
        # their shares, and the same key to the same place (sticky) for as long as it is down
        to, _ = _pick(alive, within * sum(pct for _, pct in alive))
        return to, variant

    def forwarded(self, variant: str, rerouted_from: str | None) -> None:
        """A request is on its way to `variant`: counted in `specwatch_rerouted_total` where it was rerouted."""
        if rerouted_from is not None:
            self.metrics.rerouted.labels(rerouted_from, variant).inc()

    def stretches(self) -> list[tuple[str, float]]:
        """The split as consecutive stretches of [0, 100): each weight in order, then the default route's rest."""
        stretches = list(self.weights.items())
        rest = 100.0 - sum(self.weights.values())
        if rest > 0:
            stretches.append((self.cfg.default_variant, rest))
        return stretches


def _pick(stretches: list[tuple[str, float]], bucket: float) -> tuple[str, float]:
    """The variant whose stretch holds `bucket` (the last one for a bucket at the very end), and where in its
    stretch the bucket lies (0 <= within < 1)."""
    edge = 0.0
    for name, pct in stretches:
        if bucket < edge + pct:
            return name, (bucket - edge) / pct
        edge += pct
    return stretches[-1][0], 0.0
