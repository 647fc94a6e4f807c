"""The exporter's admin API: `/admin/weights` (the split) and `/admin/verdict` (the canary gauges).

With `--admin-token-env NAME` (and a non-empty `$NAME`), `POST /admin/weights` (JSON
`{"candidate": 0}`: percent per variant) changes the split, `GET /admin/weights` reads it, and
`POST /admin/verdict` (JSON `{"tasks": {"code": {"verdict": "fail", "score": 40}}}`) sets
`specwatch_canary_verdict` and `specwatch_canary_score`, all with `Authorization: Bearer <token>`;
a wrong token is 401. Without a token every `/admin/` path is 404 (never proxied). The token is
never logged.

With several workers (`--workers`) both live in the run folder's `SharedState`: a change made on
the worker that answered applies to all, and a read from any worker gives the same answer. The
canary gauges are set under the state's lock by the worker that took the change, and each worker
sets them from the state when it starts; `mostrecent` aggregation then shows the last one.
"""

from __future__ import annotations

import hmac
import json
import logging
from typing import Any

from aiohttp import web

from specwatch.exporter.config import ExporterConfig, check_split
from specwatch.exporter.metrics import CANARY_VERDICTS, ExporterMetrics
from specwatch.exporter.routing import Router
from specwatch.exporter.shared import SharedState, State

log = logging.getLogger("specwatch.exporter")


class Admin:
    def __init__(self, cfg: ExporterConfig, router: Router, metrics: ExporterMetrics, token: str) -> None:
        self.cfg, self.router, self.metrics = cfg, router, metrics
        self.shared: SharedState | None = router.shared
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
            self.router.refresh()
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
        if self.shared is None:
            self.router.weights.update(self._weights(self.router.weights, body))  # read on the next request
            return self.router.weights

        def change(state: State) -> State:
            return {**state, "weights": self._weights(state["weights"], body)}

        self.shared.update(change)
        self.router.refresh()
        return self.router.weights

    def _weights(self, current: dict[str, float], body: dict[str, object]) -> dict[str, float]:
        """`current` with the body's changes, validated by the config's own split rule (a ConfigError, which is a
        ValueError, names the problem)."""
        return check_split({**current, **body}, self.cfg.upstreams, where="weights")

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
        if self.shared is None:
            self._set_gauges(tasks)
            return tasks

        def change(state: State) -> State:
            verdicts = dict(state["verdicts"])
            for task, item in tasks.items():  # a push without a score keeps the last one, as the gauge does
                score = item.get("score")
                verdicts[task] = {"verdict": item["verdict"],
                                  "score": verdicts.get(task, {}).get("score") if score is None else score}
            return {**state, "verdicts": verdicts}

        with self.shared.locked():  # the gauges' timestamps follow the order of the changes
            self.shared.update_locked(change)
            self._set_gauges(tasks)
        return tasks

    def load_shared_verdicts(self) -> None:
        """A worker at its start: every canary gauge from the shared state (0 where no verdict was pushed yet)."""
        assert self.shared is not None
        with self.shared.locked():
            verdicts = self.shared.read()[1]["verdicts"]
            self._set_gauges({task: verdicts.get(task, {"verdict": None}) for task in self.cfg.task_labels})

    def _set_gauges(self, tasks: dict[str, Any]) -> None:
        for task, item in tasks.items():
            for verdict in CANARY_VERDICTS:
                self.metrics.canary_verdict.labels(task, verdict).set(1 if item["verdict"] == verdict else 0)
            if item.get("score") is not None:
                self.metrics.canary_score.labels(task).set(float(item["score"]))
