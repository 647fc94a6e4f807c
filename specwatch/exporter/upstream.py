"""The tap's HTTP/1.1 client, for every request it forwards: keep-alive connections per upstream, each body
read handed to a callback as it arrives (no StreamReader, no task wake-up per chunk).

aiohttp's client costs tens of microseconds of Python per relayed chunk (protocol, parser callbacks,
StreamReader, a task resumed per read); this one decodes the response framing in `data_received` and
calls the tap's relay there, which writes to the client's transport at once. It speaks only what the
tap needs from a vLLM server: one request per connection at a time, `Content-Length` request bodies,
responses framed by `Transfer-Encoding: chunked`, `Content-Length` or the connection's end. Errors are
`OSError`s (`ConnectionError` when the upstream breaks off, `TimeoutError` from the caller's deadline),
the same family the tap already maps to a 502 or `upstream_error`.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import Callable

from multidict import CIMultiDict

MAX_HEAD_BYTES = 64 * 1024
IDLE_SECONDS = 15.0  # an idle connection older than this is closed, not reused (aiohttp's keep-alive default)
MAX_IDLE_PER_UPSTREAM = 2048  # idle connections kept per upstream beyond this are closed, the oldest first (above
# the concurrency one process serves: a lock-step peak must find its connections again)
NO_BODY_STATUS = frozenset({204, 304})

_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILER, _LENGTH, _UNTIL_CLOSE, _DONE = range(8)


HEX_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")


def chunk_size(line: bytes) -> int | None:
    """The size on a chunk-size line (RFC 9112 7.1: 1*HEXDIG, then optional chunk extensions after BWS and ";");
    None for anything else: `0x1f`, `+1f`, ` 1f `, `-5` are bad framing, not 31 (what int(x, 16) reads)."""
    size, semicolon, _ = line.partition(b";")
    if semicolon:
        size = size.rstrip(b" \t")
    return int(size, 16) if HEX_SIZE.fullmatch(size) else None


class Head:
    """Status, reason and headers of an upstream response."""

    __slots__ = ("status", "reason", "headers")

    def __init__(self, status: int, reason: str, headers: CIMultiDict[str]) -> None:
        self.status, self.reason, self.headers = status, reason, headers


class NotSent(ConnectionResetError):
    """The connection was gone before the request was written: nothing of it reached the upstream."""


class Connection(asyncio.Protocol):
    """One upstream connection. `send()` a request, await `head`, then `attach()` a body callback;
    `ended` resolves when the response is complete (None) or broke off (an exception)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.idle_since = 0.0
        self.head: asyncio.Future[Head] | None = None
        self.ended: asyncio.Future[None] | None = None
        self.received = False  # any byte of the current response arrived
        self._state = _DONE
        self._buf = b""
        self._left = 0
        self._keep_alive = False
        self._no_body = False
        self._sink: Callable[[bytes], None] | None = None
        self._pending: list[bytes] = []

    # -- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._state == _UNTIL_CLOSE:
            self._finish()
        elif self._state != _DONE:
            self._fail(ConnectionResetError(f"upstream closed the connection mid-response ({exc or 'EOF'})"))

    def data_received(self, data: bytes) -> None:
        self.received = True
        state = self._state
        if state == _HEAD:
            data = self._head(data)
            state = self._state
            if not data or state == _DONE:
                return
        if state == _CHUNK_SIZE and not self._buf:  # the usual read: exactly one whole chunk
            eol = data.find(b"\r\n")
            if 0 < eol < 16:
                size = chunk_size(data[:eol]) or 0
                if size > 0 and len(data) == eol + size + 4 and data.endswith(b"\r\n"):
                    self._body(data[eol + 2:-2])
                    return
            self._chunked(data)
        elif _CHUNK_SIZE <= state <= _TRAILER:
            self._chunked(data)
        elif state == _LENGTH:
            take = data[:self._left]
            self._left -= len(take)
            self._body(take)
            if self._left == 0:
                self._finish()
        elif state == _UNTIL_CLOSE:
            self._body(data)
        else:  # bytes nobody asked for: the connection cannot be trusted again
            self._keep_alive = False
            if self.transport is not None:
                self.transport.close()

    # -- the request ---------------------------------------------------------------------------
    def send(self, payload: bytes, head_request: bool = False) -> None:
        """Write the request. Raises `NotSent` where the connection is already gone: the upstream closed or
        reset it (even one just opened: a server that accepts and resets at once), so no byte of it left."""
        transport = self.transport
        if transport is None or self.lost or transport.is_closing():
            raise NotSent("upstream closed the connection before the request was sent")
        self.head = self.loop.create_future()
        self.ended = self.loop.create_future()
        self.received = False
        self._state, self._buf, self._sink, self._pending = _HEAD, b"", None, []
        self._no_body = head_request
        transport.write(payload)

    def attach(self, sink: Callable[[bytes], None]) -> None:
        """From now on every body read goes to `sink` at once; what arrived before goes first."""
        pending, self._pending = self._pending, []
        self._sink = sink
        for piece in pending:
            sink(piece)

    def between_chunks(self) -> bool:
        """The response is chunked and the next byte starts a chunk's size line: nothing is held back."""
        return self._state == _CHUNK_SIZE and not self._buf and not self._pending and self._sink is not None

    def fileno(self) -> int:
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        return sock.fileno() if sock is not None else -1

    def pause(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.resume_reading()

    def abort(self) -> None:
        self._keep_alive = False
        if self.transport is not None:
            self.transport.abort()

    @property
    def reusable(self) -> bool:
        return (self._keep_alive and self._state == _DONE and not self.lost and self.transport is not None
                and not self.transport.is_closing())

    # -- framing -------------------------------------------------------------------------------
    def _head(self, data: bytes) -> bytes:
        buf = self._buf + data if self._buf else data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD_BYTES:
                self._fail(ConnectionAbortedError("upstream response head too large"))
                self.abort()
            else:
                self._buf = buf
            return b""
        self._buf = b""
        lines = buf[:end].decode("latin-1").split("\r\n")
        rest = buf[end + 4:]
        version, _, tail = lines[0].partition(" ")
        code, _, reason = tail.partition(" ")
        if not version.startswith("HTTP/1.") or not code.isdigit():
            self._fail(ConnectionAbortedError(f"not an HTTP/1.x response: {lines[0][:80]!r}"))
            self.abort()
            return b""
        status = int(code)
        headers: CIMultiDict[str] = CIMultiDict()
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers.add(name.strip(), value.strip())
        if 100 <= status < 200:  # an interim answer: the real head follows
            return self._head(rest) if rest else b""
        connection = headers.get("Connection", "").lower()
        self._keep_alive = version == "HTTP/1.1" and "close" not in connection
        if self._no_body or status in NO_BODY_STATUS:
            self._state = _DONE
        elif "chunked" in headers.get("Transfer-Encoding", "").lower():
            self._state = _CHUNK_SIZE
        elif "Content-Length" in headers:
            try:
                self._left = int(headers["Content-Length"])
            except ValueError:
                self._left = -1
            if self._left < 0:
                self._fail(ConnectionAbortedError("bad Content-Length from upstream"))
                self.abort()
                return b""
            self._state = _LENGTH if self._left else _DONE
        else:
            self._state = _UNTIL_CLOSE
            self._keep_alive = False
        assert self.head is not None
        if not self.head.done():
            self.head.set_result(Head(status, reason, headers))
        if self._state == _DONE:
            self._finish()
        return rest

    def _chunked(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        self._buf = b""
        out: list[bytes] = []
        pos, n = 0, len(buf)
        while pos < n:
            state = self._state
            if state == _CHUNK_DATA:
                take = min(self._left, n - pos)
                out.append(buf[pos:pos + take])
                pos += take
                self._left -= take
                if self._left == 0:
                    self._state = _CHUNK_CRLF
            elif state == _CHUNK_SIZE:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    if n - pos > 1024:
                        return self._bad_framing()
                    self._buf = buf[pos:]
                    break
                parsed = chunk_size(buf[pos:eol])
                if parsed is None:
                    return self._bad_framing()
                size = parsed
                pos = eol + 2
                if size == 0:
                    self._state = _TRAILER
                else:
                    self._left, self._state = size, _CHUNK_DATA
            elif state == _CHUNK_CRLF:
                if n - pos < 2:
                    self._buf = buf[pos:]
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    return self._bad_framing()
                pos += 2
                self._state = _CHUNK_SIZE
            elif state == _TRAILER:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    self._buf = buf[pos:]
                    break
                if eol == pos:  # the blank line: the body is complete
                    pos += 2
                    self._state = _DONE
                    break
                pos = eol + 2
            else:
                break
        if out:
            self._body(out[0] if len(out) == 1 else b"".join(out))
        if self._state == _DONE:
            if pos < n:
                self._keep_alive = False  # bytes past the response: do not reuse
            self._finish()

    def _bad_framing(self) -> None:
        self._fail(ConnectionAbortedError("bad chunked framing from upstream"))
        self.abort()

    def _body(self, piece: bytes) -> None:
        if not piece:
            return
        sink = self._sink
        if sink is not None:
            sink(piece)
        else:
            self._pending.append(piece)

    def _finish(self) -> None:
        self._state = _DONE
        self.idle_since = time.monotonic()
        if self.ended is not None and not self.ended.done():
            self.ended.set_result(None)

    def _fail(self, exc: Exception) -> None:
        self._state = _DONE
        self._keep_alive = False
        for fut in (self.head, self.ended):
            if fut is not None and not fut.done():
                fut.set_exception(exc)
        if self.ended is not None:
            self.ended.exception()  # retrieved: nobody may be waiting on it any more


class Pool:
    """Idle keep-alive connections per (host, port); a connection serves one request at a time.

    The most recently used connection is reused first. Idle connections are bounded: at most `max_idle`
    per upstream (the oldest closed beyond), and none older than `idle_seconds` (a sweep closes them
    while traffic is quiet), so a peak of a thousand streams does not leave a thousand sockets open.
    """

    def __init__(self, connect_timeout: float = 5.0, idle_seconds: float = IDLE_SECONDS,
                 max_idle: int = MAX_IDLE_PER_UPSTREAM) -> None:
        self.connect_timeout, self.idle_seconds, self.max_idle = connect_timeout, idle_seconds, max_idle
        self._idle: dict[tuple[str, int], list[Connection]] = {}  # per upstream, oldest first
        self._sweep: asyncio.TimerHandle | None = None
        self._closed = False

    async def acquire(self, host: str, port: int) -> tuple[Connection, bool]:
        """A connection and whether it was reused (a reused one may have been closed by the server meanwhile)."""
        idle = self._idle.get((host, port))
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.reusable and now - conn.idle_since < self.idle_seconds:
                return conn, True
            conn.abort()
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(loop.create_connection(lambda: Connection(loop), host, port),
                                         self.connect_timeout)
        return conn, False

    def release(self, host: str, port: int, conn: Connection) -> None:
        if not conn.reusable or self._closed:
            conn.abort()
            return
        conn.resume()  # an idle connection reads: the upstream's close is seen there, not on the next request
        idle = self._idle.setdefault((host, port), [])
        idle.append(conn)
        if len(idle) > self.max_idle:
            idle.pop(0).abort()
        if self._sweep is None:
            self._sweep = conn.loop.call_later(self.idle_seconds, self._close_stale)

    def idle_count(self) -> int:
        return sum(len(conns) for conns in self._idle.values())

    def _close_stale(self) -> None:
        """Close the connections idle for `idle_seconds` or more; come back while any remain."""
        self._sweep = None
        now = time.monotonic()
        soonest = None
        for idle in self._idle.values():
            while idle and (now - idle[0].idle_since >= self.idle_seconds or not idle[0].reusable):
                idle.pop(0).abort()
            if idle:
                due = idle[0].idle_since + self.idle_seconds - now
                soonest = due if soonest is None else min(soonest, due)
        if soonest is not None and not self._closed:
            self._sweep = asyncio.get_running_loop().call_later(max(soonest, 0.05), self._close_stale)

    def close(self) -> None:
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for conns in self._idle.values():
            for conn in conns:
                conn.abort()
        self._idle.clear()


def request_bytes(method: str, path_qs: str, host: str, port: int, header_lines: bytes, body: bytes) -> bytes:
    """The request head and body; `header_lines` are the client's header lines ("Name: value\r\n" each) minus
    the hop-by-hop ones (no Host, no length)."""
    head = f"{method} {path_qs} HTTP/1.1\r\nHost: {host}:{port}\r\n".encode("utf-8", "surrogateescape")
    return b"%b%bContent-Length: %d\r\n\r\n%b" % (head, header_lines, len(body), body)
