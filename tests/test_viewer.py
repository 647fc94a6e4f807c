"""The viewer's server: the bundle, the dashboards pointed at its own origin, /api/v1 proxied to Prometheus only."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from specwatch import resources
from specwatch.viewer import dashboard_for_viewer, make_app


def test_a_dashboard_for_the_viewer_reads_prometheus_through_the_viewer() -> None:
    text = (resources.PERSES_DASHBOARDS / "specwatch-acceptance.json").read_text()
    board = json.loads(dashboard_for_viewer(text))
    spec = board["spec"]["datasources"]["prometheus"]["plugin"]["spec"]
    assert spec["directUrl"] == "" and spec["scrapeInterval"] == "5s"


@pytest.fixture
def web_root(tmp_path: Path) -> Path:
    (tmp_path / "index.html").write_text("<html>viewer</html>")
    (tmp_path / "viewer.js").write_text("// bundle")
    return tmp_path


def test_serves_the_bundle_the_dashboards_and_proxies_api_v1(web_root: Path) -> None:
    asyncio.run(_serves(web_root))


async def _serves(web_root: Path) -> None:
    prom = web.Application()
    seen: list[tuple[str, str, str]] = []

    async def api(request: web.Request) -> web.Response:
        seen.append((request.method, request.path, (await request.text()) or request.query_string))
        return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": []}})

    prom.router.add_route("*", "/{tail:.*}", api)
    async with TestServer(prom) as upstream:
        app = make_app(str(upstream.make_url("")).rstrip("/"), web_root)
        async with TestClient(TestServer(app)) as client:
            assert (await client.get("/healthz")).status == 200
            assert "viewer" in await (await client.get("/")).text()
            index = await (await client.get("/dashboards/index.json")).json()
            assert [d["name"] for d in index] == ["specwatch-acceptance", "specwatch-latency", "specwatch-canary"]
            board = await (await client.get("/dashboards/specwatch-canary.json")).json()
            assert board["spec"]["datasources"]["prometheus"]["plugin"]["spec"]["directUrl"] == ""
            assert (await client.get("/dashboards/nothing.json")).status == 404
            resp = await client.post("/api/v1/query_range", data={"query": "up", "step": "5"})
            assert resp.status == 200 and (await resp.json())["status"] == "success"
            assert (await client.get("/api/v1/label/task/values?match[]=x")).status == 200
            # nothing but /api/v1 reaches Prometheus (no admin or lifecycle endpoints through the viewer)
            assert (await client.post("/-/quit")).status in (404, 405)
    assert seen[0] == ("POST", "/api/v1/query_range", "query=up&step=5")
    assert seen[1][:2] == ("GET", "/api/v1/label/task/values")
    assert len(seen) == 2


def test_an_unreachable_prometheus_is_a_502_with_a_prometheus_shaped_error(web_root: Path) -> None:
    asyncio.run(_unreachable(web_root))


async def _unreachable(web_root: Path) -> None:
    async with TestClient(TestServer(make_app("http://127.0.0.1:1", web_root))) as client:
        resp = await client.get("/api/v1/query?query=up")
        body = await resp.json()
        assert resp.status == 502 and body["status"] == "error" and "127.0.0.1:1" in body["error"]
