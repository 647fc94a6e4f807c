"""The exporter's admin API: `/admin/weights` (the split) and `/admin/verdict` (the canary gauges).

With `--admin-token-env NAME` (and a non-empty `$NAME`), `POST /admin/weights` (JSON
`{"candidate": 0}`: percent per variant) changes the split, `GET /admin/weights` reads it, and
`POST /admin/verdict` (JSON `{"tasks": {"code": {"verdict": "fail", "score": 40}}}`) sets
`specwatch_canary_verdict` and `specwatch_canary_score`, all with `Authorization: Bearer <token>`;
a wrong token is 401. Without a token every `/admin/` path is 404 (never proxied). The token is
never logged.
"""

from __future__ import annotations

import hmac
import json
import logging

from aiohttp import web

from specwatch.exporter.config import ExporterConfig
from specwatch.exporter.metrics import CANARY_VERDICTS, ExporterMetrics
from specwatch.exporter.routing import Router

log = logging.getLogger("specwatch.exporter")


class Admin:
    def __init__(self, cfg: ExporterConfig, router: Router, metrics: ExporterMetrics, token: str) -> None:
        self.cfg, self.router, self.metrics = cfg, router, metrics
        self._token = token
        if cfg.admin_token_env and not token:
            log.warning("--admin-token-env %s: the variable is empty or unset; /admin/ is disabled",
                        cfg.admin_token_env)

    def add_routes(self, app: web.Application) -> None:
        """Register `/admin` and everything below it (before the proxy: /admin is never forwarded)."""
        app.router.add_route("*", "/admin", self.handle)
        app.router.add_route("*", "/admin/{tail:.*}", self.handle)

    async def handle(self, request: web.Request) -> web.Response:
        if not self._token:
            raise web.HTTPNotFound()
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self._token}".encode()):
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
            result = self.set_weights(body) if action == "weights" else self.set_verdict(body)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        log.info("admin: %s set to %s", action, json.dumps(result))
        return web.json_response({action: result})

    def set_weights(self, body: dict[str, object]) -> dict[str, float]:
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

    def set_verdict(self, body: dict[str, object]) -> dict[str, object]:
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
