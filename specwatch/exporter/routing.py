"""Which upstream serves a request: a pinned variant, a sticky or random weighted split, and the mirror."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping

from specwatch.exporter.config import ExporterConfig

VARIANT_HEADER = "x-specwatch-variant"


class Router:
    def __init__(self, cfg: ExporterConfig, rng: random.Random | None = None) -> None:
        self.cfg = cfg
        self.rng = rng or random.Random()
        self.weights = dict(cfg.split)  # mutable: a canary can set a weight to 0

    def _bucket(self, headers: Mapping[str, str]) -> float:
        key = headers.get(self.cfg.sticky_header.lower()) if self.cfg.sticky_header else None
        if key is None:
            return self.rng.random() * 100
        digest = hashlib.sha256(key.encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2 ** 64 * 100  # same key, same bucket, same route

    def route(self, headers: Mapping[str, str]) -> str:
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
