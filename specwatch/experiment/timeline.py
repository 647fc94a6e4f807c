"""Prometheus beside a study: it scrapes each variant's server while that variant runs, and the key
dashboard queries over each variant's window are saved to `timeline.json` for the report's plots.

The Prometheus is the Debian binary on the repository's own configuration and rules (the local
stack's `PrometheusServer`); its data lives in the run folder (`prometheus/data`), so a resumed run
still has the earlier variants' series. Each variant's server is one `vllm` target labelled with
the variant's name, retargeted as the next server starts (discovered by the time it answers). The
exact figures of the report come from the `/metrics` snapshots; these curves show how the same
quantities moved during the passes, as the Grafana panels would (Prometheus scrapes every 5 s and
records 1 m rates, so the last seconds of a pass may fall after the last scrape).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from specwatch.files import read_json_object, write_json
from specwatch.grafana.key_queries import key_queries, legend, substitute
from specwatch.net import free_port
from specwatch.promconfig.server import VLLM_JOB, PrometheusError, PrometheusServer, Targets

STEP_SECONDS = 5.0          # the configuration's scrape and evaluation interval
SETTLE_SECONDS = 11.0       # after a window ends: one more scrape and one more rule evaluation
FIRST_SCRAPE_SECONDS = 15.0  # file discovery picks a new target up at once; its first scrape comes within 5 s


@dataclass(frozen=True)
class Span:
    """When a variant's server was measured: from healthy to the last snapshot (Unix seconds)."""

    start: float
    end: float


def prometheus_version(binary: str) -> str:
    """`prometheus, version 2.42.0 (...)` -> `2.42.0` (the first line's third word), or `unknown`."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return "unknown"
    words = (out.stdout or out.stderr).split()
    return words[2] if len(words) > 2 and words[1] == "version" else "unknown"


class Timeline:
    """A Prometheus for one run attempt; `watch` each variant's server, `save` the windows, `stop`."""

    def __init__(self, folder: Path, out: Path, binary: str = "prometheus") -> None:
        self.folder, self.out, self.binary = folder, out, binary
        self.server: PrometheusServer | None = None
        self.scraped: dict[str, str] = {}  # variant -> its server's URL, while it is up
        self.lock = threading.Lock()  # an interleaved study starts its servers from several threads

    @staticmethod
    def available(binary: str) -> bool:
        return shutil.which(binary) is not None

    def start(self) -> str:
        """Start Prometheus; returns its URL."""
        self.server = PrometheusServer(self.folder, Targets(), free_port(), self.binary).start()
        return self.server.url

    def target(self, variant: str, url: str) -> None:
        """Scrape `url` as the `vllm` target of `variant` from now on, beside the other servers up now.

        Called as the server starts: file discovery hands a new target to the scrapes up to 5 s after the
        file changes, and that wait then passes while the server loads (it is `up 0` until it answers)."""
        with self.lock:
            self.scraped[variant] = url
            self._retarget()

    def untarget(self, variant: str) -> None:
        """Stop scraping `variant`'s server (it has stopped)."""
        with self.lock:
            if self.scraped.pop(variant, None) is not None:
                self._retarget()

    def _retarget(self) -> None:
        targets = Targets(vllm=dict(self.scraped))
        if self.server is not None and self.server.targets != targets:
            self.server.retarget(targets)

    def watch(self, variant: str, url: str, timeout: float = FIRST_SCRAPE_SECONDS) -> bool:
        """`target` `url` if it is not the target already, then wait for a scrape of it.

        Returns once Prometheus has scraped it (up == 1), so that the window's first sample is the server
        before any pass; False when that did not happen within `timeout` (the curves then start later).
        """
        if self.server is None:
            return False
        self.target(variant, url)
        up = f"up{{job={json.dumps(VLLM_JOB)},variant={json.dumps(variant)}}}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if any(v == 1 for v in self.server.values(up).values()):
                    return True
            except (PrometheusError, requests.RequestException, ValueError):
                return False  # Prometheus is gone or confused: the study goes on, the curves will say so
            time.sleep(0.2)
        return False

    def save(self, windows: Mapping[str, Span], backends: Mapping[str, str]) -> None:
        """Query the key panels over each window and merge them into `timeline.json` (earlier variants kept)."""
        if self.server is None or not windows:
            return
        time.sleep(max(0.0, max(w.end for w in windows.values()) + SETTLE_SECONDS - time.time()))
        record = read_json_object(self.out) or {"prometheus": {"version": prometheus_version(self.binary),
                                                 "scrape_interval_seconds": STEP_SECONDS},
                                  "step_seconds": STEP_SECONDS, "variants": {}}
        record["queries"] = [{"dashboard": q.dashboard, "panel": q.panel, "unit": q.unit,
                              "targets": [{"expr": substitute(e), "legend": fmt} for e, fmt in q.exprs]}
                             for q in key_queries()]
        for variant, window in windows.items():
            record["variants"][variant] = {"window": [window.start, window.end], "backend": backends.get(variant),
                                           "series": self._series(record["queries"], variant, window)}
        write_json(self.out, record)

    def _series(self, queries: list[dict[str, Any]], variant: str, window: Span) -> dict[str, list[dict[str, Any]]]:
        assert self.server is not None
        out: dict[str, list[dict[str, Any]]] = {}
        for q in queries:
            lines = []
            for i, target in enumerate(q["targets"]):
                for s in self.server.query_range(target["expr"], window.start, window.end + SETTLE_SECONDS,
                                                 STEP_SECONDS):
                    labels = {k: v for k, v in s["metric"].items() if k != "__name__"}
                    if labels.get("variant") not in (None, variant):
                        continue  # an earlier variant's series, still inside its last rate window
                    points = [[round(float(t) - window.start, 3), float(v)] for t, v in s["values"]
                              if math.isfinite(float(v))]
                    if points:
                        lines.append({"target": i, "name": legend(target["legend"], labels), "labels": labels,
                                      "points": points})
            out[q["panel"]] = lines
        return out

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


__all__ = ["PrometheusError", "Timeline", "Span", "prometheus_version"]
