"""The benches' one SSE client: streams a chat completion over HTTP/1.1 and times each content chunk.

`HttpConn` is a keep-alive connection (an `asyncio.Protocol`: chunked or length-delimited bodies) that runs
one `Exchange` at a time; the exchange splits the body into SSE events and stamps each non-empty content
chunk with `time.perf_counter()` as its bytes arrive, so the measuring side's cost per chunk stays low
(uvloop is used where the caller installs it). `chat_request` builds the harness's streamed request,
`stream_chat` sends one on a fresh connection. Standard library only: it travels to the benchmark host
with the rest of bench/perf/.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any
from urllib.parse import urlsplit

perf_counter = time.perf_counter
PROMPT = "Write a short note about speculative decoding."

HEAD, CHUNK_SIZE, CHUNK_DATA, CHUNK_CRLF, TRAILER, BODY_LEN, BODY_CLOSE, DONE = range(8)


class Exchange:
    """One request/response on a connection: HTTP framing, SSE events, timestamps."""

    __slots__ = ("fut", "t0", "state", "buf", "sse", "status", "headers", "keep_alive", "chunk_left",
                 "t_headers", "t_done", "t_end", "times", "parts", "usage", "spec", "bad",
                 "error", "err_body")

    def __init__(self, fut: asyncio.Future[None]) -> None:
        self.fut = fut
        self.t0 = 0.0
        self.state = HEAD
        self.buf = bytearray()
        self.sse = b""
        self.status = 0
        self.headers: dict[str, str] = {}  # names lowercased
        self.keep_alive = True
        self.chunk_left = 0
        self.t_headers = 0.0
        self.t_done = 0.0
        self.t_end = 0.0
        self.times: list[float] = []
        self.parts: list[str] = []
        self.usage: dict[str, Any] | None = None
        self.spec = False
        self.bad = 0
        self.error = ""
        self.err_body = b""

    # framing ------------------------------------------------------------------
    def feed(self, data: bytes, t: float) -> None:
        if self.state == HEAD:
            self.buf += data
            i = self.buf.find(b"\r\n\r\n")
            if i < 0:
                return
            head = bytes(self.buf[:i]).decode("latin-1").split("\r\n")
            data = bytes(self.buf[i + 4:])
            self.buf.clear()
            self._head(head, t)
            if self.state == DONE:
                self._finish(t)
                return
            if not data:
                return
        if self.state == BODY_LEN:
            take = data[:self.chunk_left]
            self.chunk_left -= len(take)
            self._body(take, t)
            if self.chunk_left <= 0:
                self.state = DONE
                self._finish(t)
        elif self.state == BODY_CLOSE:
            self._body(data, t)
        elif self.state != DONE:
            self._chunked(data, t)

    def _head(self, lines: list[str], t: float) -> None:
        status = lines[0].split(" ", 2)
        self.status = int(status[1]) if len(status) > 1 and status[1].isdigit() else 0
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip().lower()
        self.headers = headers
        self.t_headers = t
        if status[0] == "HTTP/1.0" or headers.get("connection") == "close":
            self.keep_alive = False
        if "chunked" in headers.get("transfer-encoding", ""):
            self.state = CHUNK_SIZE
        elif "content-length" in headers:
            self.chunk_left = int(headers["content-length"])
            self.state = BODY_LEN if self.chunk_left > 0 else DONE
        else:
            self.state = BODY_CLOSE
            self.keep_alive = False

    def _chunked(self, data: bytes, t: float) -> None:
        buf = self.buf
        buf += data
        pieces = []
        while True:
            st = self.state
            if st == CHUNK_DATA:
                if not buf:
                    break
                take = min(len(buf), self.chunk_left)
                pieces.append(bytes(buf[:take]))
                del buf[:take]
                self.chunk_left -= take
                if self.chunk_left == 0:
                    self.state = CHUNK_CRLF
            elif st == CHUNK_SIZE:
                j = buf.find(b"\r\n")
                if j < 0:
                    break
                size = int(bytes(buf[:j]).split(b";")[0], 16)
                del buf[:j + 2]
                if size == 0:
                    self.state = TRAILER
                else:
                    self.chunk_left = size
                    self.state = CHUNK_DATA
            elif st == CHUNK_CRLF:
                if len(buf) < 2:
                    break
                del buf[:2]
                self.state = CHUNK_SIZE
            elif st == TRAILER:
                j = buf.find(b"\r\n")
                if j < 0:
                    break
                del buf[:j + 2]
                if j == 0:
                    self.state = DONE
                    break
            else:
                break
        if pieces:
            self._body(b"".join(pieces), t)
        if self.state == DONE:
            self._finish(t)

    def eof(self, t: float, exc: BaseException | None) -> None:
        """The connection closed while this exchange was running."""
        if self.state == BODY_CLOSE:
            self.state = DONE
            self._finish(t)
        elif not self.fut.done():
            self.error = f"connection closed mid-response ({exc or 'EOF'})"
            self.fut.set_result(None)

    def _finish(self, t: float) -> None:
        self.t_end = t
        if self.sse.strip():
            self._event(self.sse, t)
            self.sse = b""
        if not self.fut.done():
            self.fut.set_result(None)

    # SSE ------------------------------------------------------------------------
    def _body(self, data: bytes, t: float) -> None:
        if self.status != 200:
            if len(self.err_body) < 2000:
                self.err_body += data[:2000]
            return
        s = self.sse + data
        if b"\r" in s:
            s = s.replace(b"\r\n", b"\n")
        events = s.split(b"\n\n")
        self.sse = events.pop()
        for ev in events:
            self._event(ev, t)

    def _event(self, ev: bytes, t: float) -> None:
        payload = None
        for line in ev.split(b"\n"):
            if line.startswith(b"data:"):
                line = line[6:] if line[5:6] == b" " else line[5:]
                payload = line if payload is None else payload + b"\n" + line
        if payload is None:
            return  # comment or keep-alive
        if payload == b"[DONE]":
            self.t_done = t
            return
        try:
            obj = json.loads(payload)
            choices = obj.get("choices")
        except (ValueError, AttributeError):
            self.bad += 1
            return
        if choices:
            delta = choices[0].get("delta") or {}
            content = delta.get("content")
            if content:
                self.times.append(t)
                self.parts.append(content)
        if obj.get("usage"):  # vLLM sends it with choices: []; some proxies re-shape it
            self.usage = obj["usage"]
        metrics = obj.get("metrics")
        if isinstance(metrics, dict) and "speculative_decoding" in metrics:
            self.spec = True
        if "error" in obj and not self.error:
            self.error = "error event: " + str(obj["error"])[:200]


class HttpConn(asyncio.Protocol):
    """A keep-alive HTTP/1.1 connection that runs one Exchange at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        t = perf_counter()
        ex = self.exchange
        if ex is not None:
            ex.feed(data, t)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        ex = self.exchange
        if ex is not None:
            ex.eof(perf_counter(), exc)

    async def request(self, payload: bytes, timeout: float) -> Exchange:
        ex = Exchange(asyncio.get_running_loop().create_future())
        self.exchange = ex
        assert self.transport is not None
        ex.t0 = perf_counter()
        self.transport.write(payload)
        try:
            await asyncio.wait_for(ex.fut, timeout)
        except TimeoutError:
            ex.error = f"timeout after {timeout:g} s"
            self.close()
        self.exchange = None
        if not ex.keep_alive or ex.error:
            self.close()
        return ex

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True


async def connect(host: str, port: int) -> HttpConn:
    loop = asyncio.get_running_loop()
    _, proto = await asyncio.wait_for(loop.create_connection(HttpConn, host, port), 10)
    return proto


def chat_path(path: str) -> str:
    """A URL's path with `/v1/chat/completions` added where it stops short of it."""
    path = path.rstrip("/")
    if not path.endswith("/chat/completions"):
        path += "/chat/completions" if path.endswith("/v1") else "/v1/chat/completions"
    return path


def chat_request(host: str, port: int, path: str, *, model: str = "stub-model", prompt: str = PROMPT,
                 max_tokens: int = 0, include_usage: bool = True, api_key: str = "",
                 extra: dict[str, Any] | None = None) -> bytes:
    """The bytes of one streamed chat completion request (HTTP/1.1, keep-alive)."""
    body: dict[str, Any] = {"model": model, "stream": True, "messages": [{"role": "user", "content": prompt}]}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    if max_tokens:
        body["max_tokens"] = max_tokens
    body.update(extra or {})
    raw = json.dumps(body, separators=(",", ":")).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"User-Agent: proxy_bench/1\r\nContent-Length: {len(raw)}\r\n")
    if api_key:
        head += f"Authorization: Bearer {api_key}\r\n"
    return head.encode() + b"\r\n" + raw


async def stream_chat(url: str, timeout: float = 60.0, **request: Any) -> Exchange:
    """One streamed chat completion to `url` (http://host:port[/prefix]) on a connection of its own."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    conn = await connect(host, port)
    try:
        return await conn.request(chat_request(host, port, chat_path(parts.path), **request), timeout)
    finally:
        conn.close()
