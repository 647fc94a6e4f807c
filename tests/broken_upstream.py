"""A deliberately broken OpenAI-style upstream for fault tests: `python tests/broken_upstream.py PORT`.

Non-streaming chat answers 200 with invalid JSON; streaming chat answers an SSE stream whose
second event is not JSON and which never sends [DONE]; /health is fine; GET /version answers a version no label
should carry (a space, markup, 80 characters); POST /v1/echo-headers
answers the request headers it received. POST /v1/completions answers well-formed (a stream with usage
and [DONE], or a JSON body) and then holds the connection open a second before it ends the response.
A streaming chat request with `"stall": N` sends N content chunks and then hangs for 5 s.
A streaming chat request with `"flood": N` answers N bytes of ordinary content events as fast as the
reader takes them (then the usage chunk and [DONE]); GET /v1/flood-progress says how many bytes it has
handed to its transport so far, and whether the reader left.
"""

import asyncio
import json
import sys

from aiohttp import web

LATE_END_S = 1.0


async def health(request: web.Request) -> web.Response:
    return web.Response()


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": "0.32.0 <b>" + "x" * 70 + "</b>"})


FLOOD = {"written": 0, "reader_left": False}
FLOOD_TEXT = "x" * 16384


async def flood(request: web.Request, total: int) -> web.StreamResponse:
    """Ordinary content events (16 KiB of text each) until `total` bytes are written, waiting on the transport
    between writes (aiohttp's write drains): how far it gets shows how much the reader, here the tap, buffers."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await resp.prepare(request)
    event = b"data: " + json.dumps({"id": "f", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                    "choices": [{"index": 0, "delta": {"content": FLOOD_TEXT},
                                                 "logprobs": None, "finish_reason": None}]},
                                   separators=(",", ":")).encode() + b"\n\n"
    FLOOD["written"], FLOOD["reader_left"] = 0, False
    try:
        while FLOOD["written"] < total:
            await resp.write(event)
            FLOOD["written"] += len(event)
        await resp.write(b'data: {"id":"f","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
                         b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}\n\ndata: [DONE]\n\n')
        await resp.write_eof()
    except (ConnectionError, asyncio.CancelledError):
        FLOOD["reader_left"] = True
        raise
    return resp


async def stall(request: web.Request, chunks: int) -> web.StreamResponse:
    """The role chunk and `chunks` ordinary content chunks 20 ms apart (as vLLM writes them), then nothing for
    five seconds: an upstream that hangs mid-stream, past the deadline the test gives the tap."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await resp.prepare(request)

    def event(delta: dict) -> bytes:
        return b"data: " + json.dumps({"id": "s", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                       "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                    "finish_reason": None}]}, separators=(",", ":")).encode() + b"\n\n"

    await resp.write(event({"role": "assistant", "content": ""}))
    for i in range(chunks):
        await resp.write(event({"content": f" word{i}"}))
        await asyncio.sleep(0.02)
    await asyncio.sleep(5)
    return resp


async def flood_progress(request: web.Request) -> web.Response:
    return web.json_response(FLOOD)


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if body.get("stream") and isinstance(body.get("flood"), int):
        return await flood(request, body["flood"])
    if body.get("stream") and isinstance(body.get("stall"), int):
        return await stall(request, body["stall"])
    if not body.get("stream"):
        return web.Response(body=b'{"id": "x", "choices": [', content_type="application/json")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await resp.prepare(request)
    await resp.write(b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,'
                     b'"delta":{"content":"hi"},"finish_reason":null}]}\n\n')
    await resp.write(b"data: {this is not json\n\n")
    await resp.write_eof()
    return resp


async def late_end(request: web.Request) -> web.StreamResponse:
    """A complete answer whose response ends a second after its last byte (an upstream slow to close)."""
    body = await request.json()
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    if body.get("stream"):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        await resp.write(b'data: {"id":"x","object":"text_completion","choices":[{"index":0,"text":"hi",'
                         b'"finish_reason":"length"}]}\n\n')
        await resp.write(b"data: " + json.dumps({"id": "x", "object": "text_completion", "choices": [],
                                                 "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n")
    else:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(json.dumps({"id": "x", "object": "text_completion", "usage": usage, "choices": [
            {"index": 0, "text": "hi", "finish_reason": "length"}]}).encode())
    await asyncio.sleep(LATE_END_S)
    await resp.write_eof()
    return resp


async def echo_headers(request: web.Request) -> web.Response:
    return web.json_response(dict(request.headers))


if __name__ == "__main__":
    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_get("/v1/flood-progress", flood_progress)
    app.router.add_post("/v1/echo-headers", echo_headers)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", late_end)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
