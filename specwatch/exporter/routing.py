"""Which upstream serves a request: a pinned variant, a sticky or random weighted split, and the mirror.

With several workers the weights live in `SharedState`: each request first checks its version
counter and rereads the weights when another worker's admin call changed them.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping

from specwatch.exporter.config import ExporterConfig
from specwatch.exporter.shared import SharedState

VARIANT_HEADER = "x-specwatch-variant"


class Router:
    def __init__(self, cfg: ExporterConfig, rng: random.Random | None = None,
                 shared: SharedState | None = None) -> None:
        self.cfg = cfg
        self.rng = rng or random.Random()
        self.weights = dict(cfg.split)  # mutable: a canary can set a weight to 0
        self.shared = shared
        self._version = -1
        self.refresh()

    def refresh(self) -> None:
        """Take the shared weights when they changed since the last look (no-op for a single process)."""
        if self.shared is not None and self.shared.version() != self._version:
            self._version, state = self.shared.read()
            self.weights = {str(k): float(v) for k, v in state["weights"].items()}

    def _bucket(self, headers: Mapping[str, str]) -> float:
        key = headers.get(self.cfg.sticky_header.lower()) if self.cfg.sticky_header else None
        if key is None:
            return self.rng.random() * 100
        digest = hashlib.sha256(key.encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2 ** 64 * 100  # same key, same bucket, same route

    def route(self, headers: Mapping[str, str]) -> str:
        self.refresh()
        pinned = headers.get(VARIANT_HEADER)
        if pinned is not None and pinned in self.cfg.upstreams:
            return pinned
        bucket = self._bucket(headers)
        edge = 0.0
        for variant, pct in self.weights.items():
            edge += pct
            if bucket < edge:
                return variant
        return self.cfg.default_variant
