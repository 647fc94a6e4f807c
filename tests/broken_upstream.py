"""A deliberately broken OpenAI-style upstream for fault tests: `python tests/broken_upstream.py PORT`.

Non-streaming chat answers 200 with invalid JSON; streaming chat answers an SSE stream whose
second event is not JSON and which never sends [DONE]; /health is fine; POST /v1/echo-headers
answers the request headers it received.
"""

import sys

from aiohttp import web


async def health(request: web.Request) -> web.Response:
    return web.Response()


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if not body.get("stream"):
        return web.Response(body=b'{"id": "x", "choices": [', content_type="application/json")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await resp.prepare(request)
    await resp.write(b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,'
                     b'"delta":{"content":"hi"},"finish_reason":null}]}\n\n')
    await resp.write(b"data: {this is not json\n\n")
    await resp.write_eof()
    return resp


async def echo_headers(request: web.Request) -> web.Response:
    return web.json_response(dict(request.headers))


if __name__ == "__main__":
    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/echo-headers", echo_headers)
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
