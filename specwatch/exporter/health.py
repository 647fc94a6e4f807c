"""Health: the exporter's own `/healthz`, and the probe of each upstream's health path behind `specwatch_upstream_up`.

The probe GETs `health_path` (default `/health`, vLLM's) on every upstream each `probe_interval_seconds`:
a 200 is up; a 404 means the upstream has no such endpoint (up 1, no error: it answers, and its requests
judge it, `availability`); anything else, or no answer, is down and counts a probe error. With
`health_path: off` nothing is sent and `specwatch_upstream_up` is not exported; the rounds still run, so
a variant taken out by its requests comes back after its wait. Each round first rereads the shared down
set (`refresh`), so the probe judges every variant any worker took out. With `--workers N` worker 0
probes; the others only reread the set each round, to keep their `specwatch_upstream_routable` current.

**Version.** When an upstream first answers its probe with 200 (and again after it was down: a restart may
bring another build), the probe GETs `/version` (vLLM's `{"version": "0.32.0"}`) and exposes it as
`specwatch_upstream_version_info{variant, version} 1` (an earlier version of that variant goes to 0). An answer
that is not such an object, or a version outside `[0-9A-Za-z.+_-]{1,64}`, reads `unknown` (label values stay
bounded).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable

import aiohttp
from aiohttp import web

from specwatch.exporter.availability import Availability
from specwatch.exporter.config import ExporterConfig
from specwatch.exporter.metrics import ExporterMetrics

log = logging.getLogger("specwatch.exporter")
PROBE_TIMEOUT_SECONDS = 2
NO_ENDPOINT = 404  # the health path is not there: the upstream is judged by its requests
VERSION_PATH = "/version"
VERSION = re.compile(r"[0-9A-Za-z.+_-]{1,64}")
UNKNOWN_VERSION = "unknown"


async def healthz(request: web.Request) -> web.Response:
    """The exporter is up (it says nothing about the upstreams: see `specwatch_upstream_up`)."""
    return web.Response(text="ok\n")


class UpstreamProbe:
    """Every `probe_interval_seconds`: reread the shared down set, then (`prober`) GET each upstream's health path;
    each answer goes to `availability`, which takes a failing upstream out of the split and brings one back."""

    def __init__(self, cfg: ExporterConfig, metrics: ExporterMetrics, availability: Availability,
                 refresh: Callable[[], None] = lambda: None, prober: bool = True) -> None:
        self.cfg, self.metrics, self.availability = cfg, metrics, availability
        self.refresh, self.prober = refresh, prober
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._without_endpoint: set[str] = set()  # said once in the log
        self._versions: dict[str, str] = {}  # variant -> the version it answered since it last came up
        self._last_version: dict[str, str] = {}  # variant -> the last version it answered, down or up

    async def probe_once(self, session: aiohttp.ClientSession) -> None:
        self.refresh()
        for variant, url in self.cfg.upstreams.items():
            self.availability.probed(variant, await self._ask(session, variant, url))

    async def _ask(self, session: aiohttp.ClientSession, variant: str, url: str) -> bool | None:
        """True: up; False: down; None: no health endpoint, or no probe (judged by its requests)."""
        path = self.cfg.health_path
        if path is None:
            return None
        try:
            async with session.get(url + path, timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_SECONDS)) as r:
                status: int | None = r.status
        except (aiohttp.ClientError, TimeoutError, OSError):
            status = None
        self.metrics.upstream_up.labels(variant).set(1 if status in (200, NO_ENDPOINT) else 0)
        if status == NO_ENDPOINT:
            if variant not in self._without_endpoint:
                self._without_endpoint.add(variant)
                log.info("upstream %s answers %s with 404: no health endpoint, judged by its requests", variant,
                         path)
            return None
        self._without_endpoint.discard(variant)
        if status != 200:
            self.metrics.probe_errors.labels(variant).inc()
            self._versions.pop(variant, None)  # read again once it is back
        elif variant not in self._versions:
            await self._read_version(session, variant, url)
        return status == 200

    async def _read_version(self, session: aiohttp.ClientSession, variant: str, url: str) -> None:
        """`specwatch_upstream_version_info{variant, version}` from the upstream's GET /version."""
        try:
            async with session.get(url + VERSION_PATH,
                                   timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_SECONDS)) as r:
                body = await r.json(content_type=None) if r.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return  # asked again at the next probe
        found = body.get("version") if isinstance(body, dict) else None
        version = found if isinstance(found, str) and VERSION.fullmatch(found) else UNKNOWN_VERSION
        before = self._versions.get(variant) or self._last_version.get(variant)
        if before is not None and before != version:
            self.metrics.upstream_version.labels(variant, before).set(0)
        self.metrics.upstream_version.labels(variant, version).set(1)
        self._versions[variant] = self._last_version[variant] = version

    async def _forever(self, session: aiohttp.ClientSession) -> None:
        while True:
            try:
                if self.prober:
                    await self.probe_once(session)
                else:
                    self.refresh()
            except Exception:  # noqa: BLE001 - a round that failed is logged; the next one runs
                log.exception("upstream probe round failed")
            await asyncio.sleep(self.cfg.probe_interval_seconds)

    def start(self) -> None:
        """Probe from now on, over a client of the probe's own (the tap's requests go over `upstream.py`)."""
        self._session = aiohttp.ClientSession(auto_decompress=False)
        self._task = asyncio.create_task(self._forever(self._session))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._session is not None:
            await self._session.close()
