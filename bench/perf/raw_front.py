"""A bare HTTP/1.1 front for one upstream, to measure what the exporter's per-request path could cost
without aiohttp's server: an `asyncio.Protocol` per client connection that finds the request head and its
`Content-Length` body by hand, parses the JSON body (the tap classifies from it), sends the request over
the tap's own upstream client (`specwatch.exporter.upstream`: `Pool`, `Connection`) and writes the
response head and every body read to the client's transport, re-framed as chunked. No accounting, no
routing, no metrics: the floor a leaner front would start from, not a proxy to deploy.

`--aiohttp` serves the same work from an aiohttp handler instead (`web.Application`, `request.read()`,
`StreamResponse.prepare`, `write`, `write_eof`): the difference to the bare front is aiohttp's server, the
difference to the exporter is the tap's own per-request work.

Usage: python raw_front.py --upstream http://127.0.0.1:PORT --port PORT [--aiohttp]
Measured with `per_request.py` beside the exporter and the stub (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from urllib.parse import urlsplit

import uvloop
from aiohttp import web

from specwatch.exporter.compat import HeldHeadersResponse, send_with_held_headers
from specwatch.exporter.tap import HOP_BY_HOP, forward_header_lines
from specwatch.exporter.upstream import Pool, request_bytes


class Front(asyncio.Protocol):
    """One client connection: one request at a time (reading pauses while it is served)."""

    def __init__(self, pool: Pool, host: str, port: int) -> None:
        self.pool, self.host, self.port = pool, host, port
        self.transport: asyncio.Transport | None = None
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        lines = self.buf[:end].split(b"\r\n")
        method, target, _ = lines[0].split(b" ", 2)
        length, headers = 0, []
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
            headers.append((name.strip(), value.strip()))
        if len(self.buf) < end + 4 + length:
            return
        body = self.buf[end + 4:end + 4 + length]
        self.buf = self.buf[end + 4 + length:]
        assert self.transport is not None
        self.transport.pause_reading()
        asyncio.get_running_loop().create_task(
            self.exchange(method.decode(), target.decode(), forward_header_lines(headers), body))

    async def exchange(self, method: str, target: str, headers: bytes, body: bytes) -> None:
        transport = self.transport
        assert transport is not None
        json.loads(body)  # the tap reads the request to classify it
        conn, _ = await self.pool.acquire(self.host, self.port)
        conn.send(request_bytes(method, target, self.host, self.port, headers, body))
        assert conn.head is not None and conn.ended is not None
        head = await conn.head
        out = [f"HTTP/1.1 {head.status} {head.reason}"]
        out += [f"{k}: {v}" for k, v in head.headers.items() if k.lower() not in HOP_BY_HOP]
        out.append("Transfer-Encoding: chunked\r\n\r\n")
        first = ["\r\n".join(out).encode("latin-1")]

        def sink(chunk: bytes) -> None:
            framed = b"%x\r\n%b\r\n" % (len(chunk), chunk)
            if first:
                transport.write(first.pop() + framed)
            else:
                transport.write(framed)

        conn.attach(sink)
        await conn.ended
        transport.write((first.pop() if first else b"") + b"0\r\n\r\n")
        self.pool.release(self.host, self.port, conn)
        transport.resume_reading()
        if self.buf:
            self.data_received(b"")


def aiohttp_app(pool: Pool, host: str, port: int) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        json.loads(body)
        headers = forward_header_lines(request.raw_headers)
        conn, _ = await pool.acquire(host, port)
        conn.send(request_bytes(request.method, request.path_qs, host, port, headers, body))
        assert conn.head is not None and conn.ended is not None
        head = await conn.head
        response = HeldHeadersResponse(status=head.status, reason=head.reason, headers={  # as the tap's
            k: v for k, v in head.headers.items() if k.lower() not in HOP_BY_HOP})
        await response.prepare(request)
        transport = request.transport
        assert transport is not None
        writer = response._payload_writer

        def sink(chunk: bytes) -> None:  # as the tap does: the headers leave with the first body bytes
            if not send_with_held_headers(writer, chunk):
                transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))

        conn.attach(sink)
        await conn.ended
        await response.write_eof()
        pool.release(host, port, conn)
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    return app


async def serve(upstream: str, port: int, use_aiohttp: bool, cancellation: bool = False) -> None:
    split = urlsplit(upstream)
    host, up_port = split.hostname or "127.0.0.1", split.port or 80
    pool = Pool()
    loop = asyncio.get_running_loop()
    if use_aiohttp:
        runner = web.AppRunner(aiohttp_app(pool, host, up_port), access_log=None, handler_cancellation=cancellation)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
        await asyncio.Event().wait()
    server = await loop.create_server(lambda: Front(pool, host, up_port), "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--aiohttp", action="store_true", help="the same work behind an aiohttp handler")
    parser.add_argument("--handler-cancellation", action="store_true",
                        help="with --aiohttp: AppRunner(handler_cancellation=True), as the exporter runs")
    args = parser.parse_args()
    uvloop.run(serve(args.upstream, args.port, args.aiohttp, args.handler_cancellation))


if __name__ == "__main__":
    main()
