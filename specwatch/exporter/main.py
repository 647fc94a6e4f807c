"""`specwatch exporter`: flags in, the tap served (its own /metrics and /healthz, every other path proxied).

The admin API (`/admin/`, with `--admin-token-env`) is `specwatch.exporter.admin`; `/healthz` and
the upstream probe are `specwatch.exporter.health`. A configuration error exits 2 with its message.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import uvloop
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from specwatch.exporter import config as config_mod
from specwatch.exporter.admin import Admin
from specwatch.exporter.config import ConfigError, ExporterConfig
from specwatch.exporter.eventlog import EventLog
from specwatch.exporter.health import UpstreamProbe, healthz
from specwatch.exporter.metrics import ExporterMetrics
from specwatch.exporter.routing import Router
from specwatch.exporter.tap import Tap

log = logging.getLogger("specwatch.exporter")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specwatch exporter", description=__doc__.splitlines()[0])
    p.add_argument("--upstream", action="append", metavar="NAME=URL",
                   help="a route (variant) and its vLLM base URL; the first is the default route")
    p.add_argument("--split", action="append", metavar="NAME=PERCENT", help="send PERCENT of traffic to NAME")
    p.add_argument("--mirror", metavar="NAME", help="copy each request to NAME, discard its answer, account it")
    p.add_argument("--sticky-header", help="route requests with the same value of this header the same way")
    p.add_argument("--config.file", dest="config_file", type=Path, help="YAML with the same settings, tasks, rules")
    p.add_argument("--web.listen-address", dest="listen", help="HOST:PORT (default 127.0.0.1:9400)")
    p.add_argument("--event-log", type=Path, help="per-request JSONL event log (size-bounded)")
    p.add_argument("--admin-token-env", metavar="NAME",
                   help="enable POST /admin/weights and /admin/verdict, bearer token read from $NAME")
    return p


class Exporter:
    """The running tap: the aiohttp app wiring the proxy, `/metrics`, health and the admin API."""

    def __init__(self, cfg: ExporterConfig, admin_token: str = "") -> None:
        self.cfg = cfg
        self.registry = CollectorRegistry()
        self.metrics = ExporterMetrics(self.registry, cfg)
        self.router = Router(cfg)
        self.event_log = EventLog(cfg.event_log, cfg.event_log_max_bytes) if cfg.event_log else None
        self.tap = Tap(cfg, self.metrics, self.router, self.event_log)
        self.probe = UpstreamProbe(cfg, self.metrics)
        self.admin = Admin(cfg, self.router, self.metrics, admin_token)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.cfg.max_body_bytes)
        app.router.add_get("/metrics", self.metrics_handler)
        app.router.add_get("/healthz", healthz)
        self.admin.add_routes(app)  # before the proxy: /admin is never forwarded
        app.router.add_route("*", "/{tail:.*}", self.tap.handle)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def metrics_handler(self, request: web.Request) -> web.Response:
        resp = web.Response(body=generate_latest(self.registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def _on_startup(self, app: web.Application) -> None:
        await self.tap.start()
        assert self.tap.session is not None
        self.probe.start(self.tap.session)

    async def _on_cleanup(self, app: web.Application) -> None:
        self.probe.stop()
        await self.tap.close()
        if self.event_log is not None:
            self.event_log.close()


async def serve(cfg: ExporterConfig, admin_token: str = "") -> None:
    exporter = Exporter(cfg, admin_token)
    runner = web.AppRunner(exporter.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, cfg.listen_host, cfg.listen_port).start()
    log.info("specwatch exporter on http://%s:%d, routes %s", cfg.listen_host, cfg.listen_port,
             ", ".join(f"{k}={v}" for k, v in cfg.upstreams.items()))
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: Sequence[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parser().parse_args(argv)
    try:
        cfg = config_mod.load({"upstream": args.upstream, "split": args.split, "mirror": args.mirror,
                               "sticky_header": args.sticky_header, "listen": args.listen,
                               "event_log": args.event_log, "admin_token_env": args.admin_token_env},
                              args.config_file)
    except ConfigError as exc:
        print(f"specwatch exporter: {exc}", file=sys.stderr)
        return 2
    # the secret is read here, at the top, and handed down; it never enters the config object or a log
    admin_token = os.environ.get(cfg.admin_token_env, "") if cfg.admin_token_env else ""
    uvloop.run(serve(cfg, admin_token))  # libuv's loop: measurably less CPU per relayed chunk than asyncio's default
    return 0
