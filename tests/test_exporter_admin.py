"""The exporter's admin API and health probe, in process: tokens, weights, verdicts, upstream up / down."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from specwatch.exporter.config import load
from specwatch.exporter.health import UpstreamProbe
from specwatch.exporter.main import Exporter
from specwatch.net import free_port

TOKEN = "test-only-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DEAD = f"http://127.0.0.1:{free_port()}"


def with_client(token: str, check: Callable[[TestClient[Any, Any], Exporter], Awaitable[None]]) -> None:
    cfg = load({"upstream": [f"baseline={DEAD}", f"candidate={DEAD}/c"], "split": ["candidate=10"],
                "admin_token_env": "SPECWATCH_TEST_TOKEN"}, None)
    exporter = Exporter(cfg, token)

    async def run() -> None:
        async with TestClient(TestServer(exporter.app())) as client:
            await check(client, exporter)

    asyncio.run(run())


def test_admin_needs_its_token_and_sets_weights_and_verdicts() -> None:
    async def check(client: TestClient[Any, Any], exporter: Exporter) -> None:
        assert (await client.post("/admin/weights", json={"candidate": 0})).status == 401
        assert (await client.post("/admin/weights", json={"candidate": 0},
                                  headers={"Authorization": "Bearer nope"})).status == 401
        moved = await client.post("/admin/weights", json={"candidate": 0}, headers=AUTH)
        assert moved.status == 200 and exporter.router.weights == {"candidate": 0.0}
        assert await (await client.get("/admin/weights", headers=AUTH)).json() == {"weights": {"candidate": 0.0}}
        too_much = await client.post("/admin/weights", json={"baseline": 60, "candidate": 50}, headers=AUTH)
        assert too_much.status == 400 and "more than 100" in (await too_much.json())["error"]
        pushed = await client.post("/admin/verdict", headers=AUTH,
                                   json={"tasks": {"code": {"verdict": "fail", "score": 40}}})
        assert pushed.status == 200
        value = exporter.registry.get_sample_value
        assert value("specwatch_canary_verdict", {"task": "code", "verdict": "fail"}) == 1
        assert value("specwatch_canary_verdict", {"task": "code", "verdict": "pass"}) == 0
        assert value("specwatch_canary_score", {"task": "code"}) == 40
        bad = await client.post("/admin/verdict", headers=AUTH, json={"tasks": {"code": {"verdict": "maybe"}}})
        assert bad.status == 400 and "verdict must be one of" in (await bad.json())["error"]
        assert (await client.post("/admin/other", headers=AUTH, json={})).status == 404
        assert (await client.delete("/admin/weights", headers=AUTH)).status == 405

    with_client(TOKEN, check)


def test_without_a_token_admin_is_404_and_never_proxied() -> None:
    async def check(client: TestClient[Any, Any], exporter: Exporter) -> None:
        for path in ("/admin", "/admin/weights", "/admin/verdict"):
            assert (await client.post(path, json={}, headers=AUTH)).status == 404  # not a 502 from the dead upstream
        assert exporter.router.weights == {"candidate": 10.0}
        assert (await client.get("/healthz")).status == 200

    with_client("", check)


def test_the_probe_marks_each_upstream_up_or_down_and_counts_failures() -> None:
    async def health(request: web.Request) -> web.Response:
        return web.Response(status=200 if request.path == "/up/health" else 503)

    async def run() -> dict[str, tuple[float | None, float | None, float | None]]:
        app = web.Application()
        app.router.add_get("/{tail:.*}", health)
        async with TestServer(app) as server:
            base = str(server.make_url("")).rstrip("/")
            cfg = load({"upstream": [f"good={base}/up", f"sick={base}/sick", f"gone={DEAD}"]}, None)
            exporter = Exporter(cfg)
            probe = UpstreamProbe(cfg, exporter.metrics, exporter.router.availability)
            async with aiohttp.ClientSession() as session:
                await probe.probe_once(session)
                await probe.probe_once(session)
            value = exporter.registry.get_sample_value
            return {v: (value("specwatch_upstream_up", {"variant": v}),
                        value("specwatch_upstream_probe_errors_total", {"variant": v}),
                        value("specwatch_upstream_routable", {"variant": v})) for v in cfg.upstreams}

    assert asyncio.run(run()) == {"good": (1, 0, 1), "sick": (0, 2, 0), "gone": (0, 2, 0)}
