"""The dashboard viewer's server: the bundled Perses front end, the Perses dashboards, /api/v1 proxied to Prometheus.

`specwatch viewer --prometheus URL` serves, on 127.0.0.1:8080 by default (Perses's own port):

    /                    viewer/dist/ (built by `make viewer`: Perses's libraries and plugins, one bundle)
    /dashboards/*.json   specwatch/data/perses/dashboards/, each Prometheus datasource pointed at this origin
    /api/v1/*            Prometheus's HTTP API, GET and POST passed through to --prometheus (nothing else is)
    /healthz             200 when the bundle is there

No Perses server is involved: the front end loads its plugins from the bundle and reads only Prometheus's
API. The bundle is a build output (about 12 MB), not package data: `make viewer` writes it into the
checkout's viewer/dist/; `--web.root` points elsewhere (the compose service's /opt/specwatch/viewer, built into
the specwatch image).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import aiohttp
from aiohttp import web

from specwatch import resources
from specwatch.config import Home
from specwatch.exit_codes import EXIT_OK, EXIT_USAGE

DEFAULT_PORT = 8080
WEB_ROOT = Path(__file__).resolve().parents[1] / "viewer" / "dist"
SESSION = web.AppKey("session", aiohttp.ClientSession)
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "host"}


def dashboard_for_viewer(text: str) -> str:
    """A Perses dashboard whose Prometheus datasources read this origin (`directUrl` empty: /api/v1/... here)."""
    board = json.loads(text)
    for source in board["spec"].get("datasources", {}).values():
        if source["plugin"]["kind"] == "PrometheusDatasource":
            source["plugin"]["spec"] = {**source["plugin"]["spec"], "directUrl": ""}
    return json.dumps(board)


def make_app(prometheus: str, web_root: Path = WEB_ROOT,
             dashboards: Path = resources.PERSES_DASHBOARDS) -> web.Application:
    prometheus = prometheus.rstrip("/")
    app = web.Application()

    async def on_startup(app: web.Application) -> None:
        app[SESSION] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60), auto_decompress=False)

    async def on_cleanup(app: web.Application) -> None:
        await app[SESSION].close()

    async def proxy(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP | {"cookie"}}
        body = await request.read()
        url = f"{prometheus}{request.rel_url.path}"
        try:
            async with app[SESSION].request(request.method, url, params=request.rel_url.query, data=body or None,
                                              headers=headers) as upstream:
                payload = await upstream.read()
                out = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP - {"content-encoding"}}
                return web.Response(status=upstream.status, body=payload, headers=out)
        except (TimeoutError, aiohttp.ClientError) as exc:
            body_json = {"status": "error", "errorType": "unavailable", "error": f"Prometheus at {prometheus}: {exc}"}
            return web.json_response(body_json, status=502)

    async def dashboard(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        path = dashboards / f"{name}.json"
        if "/" in name or not path.is_file():
            raise web.HTTPNotFound()
        text = path.read_text() if name == "index" else dashboard_for_viewer(path.read_text())
        return web.Response(text=text, content_type="application/json", headers={"Cache-Control": "no-cache"})

    async def index(_request: web.Request) -> web.StreamResponse:
        return web.FileResponse(web_root / "index.html", headers={"Cache-Control": "no-cache"})

    async def healthz(_request: web.Request) -> web.StreamResponse:
        ok = (web_root / "viewer.js").is_file()
        return web.Response(status=200 if ok else 503, text="ok\n" if ok else f"no bundle in {web_root}\n")

    app.router.add_route("GET", "/api/v1/{tail:.*}", proxy)
    app.router.add_route("POST", "/api/v1/{tail:.*}", proxy)
    app.router.add_get("/dashboards/{name}.json", dashboard)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/", index)
    app.router.add_static("/", web_root)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.splitlines()[0] if __doc__ else None
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090", help="the Prometheus to read")
    parser.add_argument("--web.listen-address", dest="listen", default=f"127.0.0.1:{DEFAULT_PORT}",
                        help="HOST:PORT to serve on")
    parser.add_argument("--web.root", dest="web_root", type=Path, default=WEB_ROOT,
                        help="the built front end (make viewer)")


def run(home: Home, args: argparse.Namespace) -> int:
    if not (args.web_root / "viewer.js").is_file():
        print(f"specwatch viewer: no built front end in {args.web_root}: run `make viewer`")
        return EXIT_USAGE
    host, _, port = args.listen.rpartition(":")
    print(f"specwatch viewer on http://{host}:{port}/ reading {args.prometheus}", flush=True)
    web.run_app(make_app(args.prometheus, args.web_root), host=host.strip("[]"), port=int(port), print=None)
    return EXIT_OK
