"""`specwatch exporter`: flags in, the tap served (its own /metrics and /healthz, every other path proxied).

With `--admin-token-env NAME` (and a non-empty `$NAME`), `POST /admin/weights` (JSON
`{"candidate": 0}`: percent per variant) changes the split and `POST /admin/verdict` (JSON
`{"tasks": {"code": {"verdict": "fail", "score": 40}}}`) sets `specwatch_canary_verdict`, both
with `Authorization: Bearer <token>`; a wrong token is 401. Without a token every `/admin/`
path is 404 (never proxied). The token is never logged.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import uvloop
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from specwatch.exporter import config as config_mod
from specwatch.exporter.config import ConfigError, ExporterConfig
from specwatch.exporter.eventlog import EventLog
from specwatch.exporter.metrics import CANARY_VERDICTS, ExporterMetrics
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
    """The running tap: the aiohttp app, the upstream probe, the registry."""

    def __init__(self, cfg: ExporterConfig, admin_token: str = "") -> None:
        self.cfg = cfg
        self.registry = CollectorRegistry()
        self.metrics = ExporterMetrics(self.registry, cfg)
        self.router = Router(cfg)
        self.event_log = EventLog(cfg.event_log, cfg.event_log_max_bytes) if cfg.event_log else None
        self.tap = Tap(cfg, self.metrics, self.router, self.event_log)
        self._probe: asyncio.Task[None] | None = None
        self._admin_token = admin_token
        if cfg.admin_token_env and not self._admin_token:
            log.warning("--admin-token-env %s: the variable is empty or unset; /admin/ is disabled",
                        cfg.admin_token_env)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.cfg.max_body_bytes)
        app.router.add_get("/metrics", self.metrics_handler)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_route("*", "/admin", self.admin)  # before the proxy: /admin is never forwarded
        app.router.add_route("*", "/admin/{tail:.*}", self.admin)
        app.router.add_route("*", "/{tail:.*}", self.tap.handle)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def metrics_handler(self, request: web.Request) -> web.Response:
        resp = web.Response(body=generate_latest(self.registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def admin(self, request: web.Request) -> web.Response:
        if not self._admin_token:
            raise web.HTTPNotFound()
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self._admin_token}".encode()):
            raise web.HTTPUnauthorized(headers={"WWW-Authenticate": "Bearer"})
        action = request.match_info.get("tail", "")
        if action not in ("weights", "verdict"):
            raise web.HTTPNotFound()
        if request.method == "GET" and action == "weights":
            return web.json_response({"weights": self.router.weights})
        if request.method != "POST":
            raise web.HTTPMethodNotAllowed(request.method, ["POST"])
        try:
            body = json.loads(await request.read())
            if not isinstance(body, dict):
                raise ValueError("expected a JSON object")
            result = self._set_weights(body) if action == "weights" else self._set_verdict(body)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        log.info("admin: %s set to %s", action, json.dumps(result))
        return web.json_response({action: result})

    def _set_weights(self, body: dict[str, object]) -> dict[str, float]:
        weights = dict(self.router.weights)
        for name, pct in body.items():
            if name not in self.cfg.upstreams:
                raise ValueError(f"{name!r}: no such upstream; known: {sorted(self.cfg.upstreams)}")
            if isinstance(pct, bool) or not isinstance(pct, int | float) or not 0 <= pct <= 100:
                raise ValueError(f"{name}: expected a percentage in 0..100, got {pct!r}")
            weights[name] = float(pct)
        if sum(weights.values()) > 100:
            raise ValueError(f"weights {weights} add up to more than 100 %")
        self.router.weights.update(weights)  # the router reads it on the next request
        return self.router.weights

    def _set_verdict(self, body: dict[str, object]) -> dict[str, object]:
        tasks = body.get("tasks")
        if not isinstance(tasks, dict):
            raise ValueError('expected {"tasks": {TASK: {"verdict": ..., "score": ...}}}')
        for task, item in tasks.items():
            if task not in self.cfg.task_labels or not isinstance(item, dict):
                raise ValueError(f"task {task!r}: expected one of {list(self.cfg.task_labels)} with an object")
            if item.get("verdict") not in CANARY_VERDICTS:
                raise ValueError(f"{task}: verdict must be one of {', '.join(CANARY_VERDICTS)}")
            score = item.get("score")
            if score is not None and (isinstance(score, bool) or not isinstance(score, int | float)):
                raise ValueError(f"{task}: score must be a number or null")
        for task, item in tasks.items():
            for verdict in CANARY_VERDICTS:
                self.metrics.canary_verdict.labels(task, verdict).set(1 if item["verdict"] == verdict else 0)
            if item.get("score") is not None:
                self.metrics.canary_score.labels(task).set(float(item["score"]))
        return tasks

    async def _on_startup(self, app: web.Application) -> None:
        await self.tap.start()
        self._probe = asyncio.create_task(self.probe_forever())

    async def _on_cleanup(self, app: web.Application) -> None:
        if self._probe is not None:
            self._probe.cancel()
        await self.tap.close()
        if self.event_log is not None:
            self.event_log.close()

    async def probe_once(self) -> None:
        assert self.tap.session is not None
        for variant, url in self.cfg.upstreams.items():
            try:
                async with self.tap.session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    up = r.status == 200
            except (aiohttp.ClientError, TimeoutError, OSError):
                up = False
            self.metrics.upstream_up.labels(variant).set(1 if up else 0)
            if not up:
                self.metrics.probe_errors.labels(variant).inc()

    async def probe_forever(self) -> None:
        while True:
            await self.probe_once()
            await asyncio.sleep(self.cfg.probe_interval_seconds)


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
