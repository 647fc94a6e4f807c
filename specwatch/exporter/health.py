"""Health: the exporter's own `/healthz`, and the probe of each upstream's `/health` behind `specwatch_upstream_up`."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from specwatch.exporter.availability import Availability
from specwatch.exporter.config import ExporterConfig
from specwatch.exporter.metrics import ExporterMetrics

PROBE_TIMEOUT_SECONDS = 2


async def healthz(request: web.Request) -> web.Response:
    """The exporter is up (it says nothing about the upstreams: see `specwatch_upstream_up`)."""
    return web.Response(text="ok\n")


class UpstreamProbe:
    """Every `probe_interval_seconds`, GET each upstream's `/health`: up is a 200; anything else counts an error.
    Each answer goes to `availability` too: a failed probe takes the upstream out of the split."""

    def __init__(self, cfg: ExporterConfig, metrics: ExporterMetrics, availability: Availability) -> None:
        self.cfg, self.metrics, self.availability = cfg, metrics, availability
        self._task: asyncio.Task[None] | None = None

    async def probe_once(self, session: aiohttp.ClientSession) -> None:
        for variant, url in self.cfg.upstreams.items():
            try:
                async with session.get(url + "/health",
                                       timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_SECONDS)) as r:
                    up = r.status == 200
            except (aiohttp.ClientError, TimeoutError, OSError):
                up = False
            self.metrics.upstream_up.labels(variant).set(1 if up else 0)
            if not up:
                self.metrics.probe_errors.labels(variant).inc()
            self.availability.probed(variant, up)

    async def _forever(self, session: aiohttp.ClientSession) -> None:
        while True:
            await self.probe_once(session)
            await asyncio.sleep(self.cfg.probe_interval_seconds)

    def start(self, session: aiohttp.ClientSession) -> None:
        self._task = asyncio.create_task(self._forever(session))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
