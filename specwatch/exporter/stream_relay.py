"""One streamed answer relayed from the tap's own upstream connection (`upstream.Connection`) to its client.

`StreamRelay` is the state machine of that relay. Bytes are relayed inside the connection's
`data_received` (`sink`): each read is read by the relay (`SseRelay` / `BodyRelay`) and written to the
client's transport at once (`deliver`); the coroutine `run` only waits: for the end, a slow client (drain,
then read on) or a gone one. Between ordinary content chunks of an SSE answer the stream may go to the
compiled relay thread (`hand_over`); while `lease` is set the thread owns both sockets (the connection
and the client's transport are paused and nothing here reads or writes them), and the thread's result
(`taken_back`) makes them the loop's again (`resume`). A stream handed over with `tail` (the client asked
for usage itself, so the tap changes nothing in its last events; and nothing the tap writes outlives the
process: `Tap.tail_ends`) may end in the thread: the thread writes the tail and the end of the chunked
body, and hands back the tail's raw bytes (`sent`). The upstream connection reads them at once (framing
only: the connection goes back to the pool), the response is marked ended (`compat.ended_elsewhere`) and
the handler returns, so a keep-alive client's next request is read at once; the tail is read and the
request counted afterwards by a task of its own (`count_after_end`, at its turn in `counts_after`), which
then calls `FastRelay.settled()`. Once the upstream's answer is complete,
`release()` hands the connection back to the pool at once, before the accounting and the last bytes
(and before their turn, where one is still to come): nothing here touches it after that.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http_writer import StreamWriter
from multidict import CIMultiDict

from specwatch.exporter import compat, fastrelay
from specwatch.exporter.accounting import Gaps, RequestRecord
from specwatch.exporter.fastrelay import FastRelay
from specwatch.exporter.metrics import ExporterMetrics
from specwatch.exporter.relays import BodyRelay, SseRelay, UpstreamRequest
from specwatch.exporter.sse import _decoded
from specwatch.exporter.turns import Turns
from specwatch.exporter.upstream import Connection, Head

log = logging.getLogger("specwatch.exporter")
WRITE_HIGH_WATER = 256 * 1024  # bytes queued for a slow client before the upstream connection stops being read
FRUITLESS_HANDOVERS = 3  # hand-overs that came back at once (an n = 2 stream alternates its chunk shape) stop them


class ClientGone(Exception):
    """The client closed the connection while the response was being relayed."""


def fileno(transport: asyncio.BaseTransport) -> int:
    sock = transport.get_extra_info("socket")
    return sock.fileno() if sock is not None else -1


class StreamRelay:
    """The relay of one streamed answer: what `run` waits for, and the callbacks that wake it."""

    def __init__(self, conn: Connection, head: Head, plan: UpstreamRequest, record: RequestRecord,
                 metrics: ExporterMetrics, fast: FastRelay | None, turns: Turns,
                 finish: Callable[[RequestRecord], None], counts_after: Turns | None = None,
                 later: Callable[[Coroutine[Any, Any, None]], None] | None = None) -> None:
        self.conn, self.head, self.record, self.metrics, self.turns, self.finish = (
            conn, head, record, metrics, turns, finish)
        sse = head.headers.get("Content-Type", "").startswith("text/event-stream")
        self.relay: SseRelay | BodyRelay = SseRelay(plan, record, metrics) if sse else BodyRelay(record)
        self.loop = asyncio.get_running_loop()
        self.fut: asyncio.Future[None] | None = None  # `run` waits on it; `wake` sets it
        self.paused = False  # the client is slow: the connection is paused until the writer drains
        self.gone = False  # the client left: nothing more is written, the connection stays paused
        self.unread: bytes | None = None  # the stream's end as the relay thread handed it back, fed at its turn
        self.headers_sent = False
        self.writer: aiohttp.abc.AbstractStreamWriter | None = None
        self.transport: asyncio.Transport | None = None
        self.chunked = False
        self.fast = fast if isinstance(self.relay, SseRelay) else None  # chunked only: set in `run`
        self.lease: int | None = None  # the relay thread's id for the stream while it owns both sockets
        self.fruitless = 0
        # the thread may write this stream's tail and end; its count is then a task (`later`) that waits its
        # turn in `counts_after`
        self.counts_after, self.later = counts_after, later
        self.tail = counts_after is not None and later is not None and not plan.strip_usage
        self.sent: tuple[bytes, float] | None = None  # the tail the thread wrote, and when it was read
        self.quiet = False  # reading what the thread wrote already: nothing is written again
        self.at = 0.0  # the read time of the bytes being fed where it is not now (the thread's tail)
        self.end_written = False  # the thread wrote the end of the client's body
        self.deferred: list[bytes] | None = None  # ... and the body bytes of its tail, read after the handler
        self.unsettled = False  # `FastRelay.settled()` is still owed for this stream
        # what the thread counted for a stream it ended, applied by `count_after_end`
        self.thread_counts: tuple[list[tuple[bytes, bool]], tuple[int, ...], float, float, int] | None = None

    # -- waking ---------------------------------------------------------------------------------------
    def wake(self) -> None:
        fut = self.fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def wait(self) -> None:
        self.fut = self.loop.create_future()
        try:
            await self.fut
        finally:
            self.fut = None

    # -- the byte path in the loop -----------------------------------------------------------------------
    def sink(self, chunk: bytes) -> None:
        """The connection's `data_received`: read, write to the client, and hand over where it pays."""
        if self.gone:
            return
        if self.deferred is not None:  # the thread wrote it to the client: read and counted after the handler
            self.deferred.append(chunk)
            return
        out = self.relay.feed(chunk, self.at)
        if out and not self.quiet:
            self.deliver(out)
            if self.fast is not None and self.lease is None:
                self.hand_over()

    def deliver(self, data: bytes) -> None:
        transport = self.transport
        if transport is None:
            return  # a mirror: discarded
        assert self.lease is None, "the relay thread owns the client's socket"
        if transport.is_closing():
            self.gone = True
            self.conn.pause()
            self.wake()
            return
        framed = b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data
        if self.headers_sent:
            transport.write(framed)
        else:  # aiohttp holds the headers back until the first body write: they leave with it, one write
            self.headers_sent = True
            if not compat.send_with_held_headers(self.writer, data):
                transport.write(framed)
        if transport.get_write_buffer_size() > WRITE_HIGH_WATER:
            self.paused = True
            self.conn.pause()
            self.wake()

    # -- the relay thread ------------------------------------------------------------------------------
    def hand_over(self) -> None:
        """To the relay thread, where the stream is between ordinary content chunks and nothing waits."""
        fast, transport, relay, conn, record = self.fast, self.transport, self.relay, self.conn, self.record
        assert fast is not None and transport is not None and isinstance(relay, SseRelay)
        prefix = relay.plain.prefix
        if (prefix is None or not relay.plain.last_plain or self.fruitless >= FRUITLESS_HANDOVERS
                or not self.headers_sent or self.paused or self.gone or relay.saw_done or relay.held
                or not relay.splitter.empty() or not conn.between_chunks() or record.last_token is None
                or transport.get_write_buffer_size() or transport.is_closing()):
            return
        up_fd, client_fd = conn.fileno(), fileno(transport)
        if up_fd < 0 or client_fd < 0:
            return
        gaps = record.gaps
        if gaps is None:
            gaps = record.gaps = Gaps(self.metrics.of(record.variant, record.task).itl, record.last_token)
        conn.pause()  # the thread reads the upstream from now on ...
        transport.pause_reading()  # ... and writes the client; the loop does neither until `taken_back`
        try:
            self.lease = fast.start(up_fd, client_fd, prefix, relay.plain.suffix, tuple(gaps.bounds),
                                    record.last_token, self.taken_back, self.tail)
        except (OSError, RuntimeError, MemoryError, ValueError):
            log.exception("fast relay: hand-over refused; relaying this stream in Python")
            self.fast = None
            conn.resume()
            transport.resume_reading()
            return
        self.metrics.fast_relay_handovers.inc()

    def take_back(self) -> None:
        """Before the thread hands it back (the request is ending otherwise): its counts, then ours again."""
        if self.lease is not None and self.fast is not None:
            self.fast.take_back(self.lease)

    def taken_back(self, result: fastrelay.Result) -> None:
        self.lease = None
        try:
            self.resume(result)
        except Exception:  # never leave the stream waiting: it ends as a cut one
            log.exception("fast relay: taking a stream back failed")
            self.gone = True
            self.conn.abort()
        self.wake()

    def resume(self, result: fastrelay.Result) -> None:
        _, reason, _, unread, unsent, segments, counts, gap_sum, last_token, tokens, sent, tail_at, ended_at = result
        record, conn, transport = self.record, self.conn, self.transport
        if ended_at:  # the thread wrote the body's end (to a client gone meanwhile too): settled once counted
            self.unsettled = True
        if reason == fastrelay.UNUSUAL and tokens < 2:
            self.fruitless += 1
        assert transport is not None
        if not transport.is_closing():
            transport.resume_reading()
        if reason == fastrelay.CANCELLED:  # the request is ending (a timeout): no more bytes either way
            self.apply_counts(segments, counts, gap_sum, last_token, tokens)
            return
        if unsent and not transport.is_closing():
            transport.write(unsent)
            unsent = b""
        if ended_at and reason != fastrelay.CLIENT and not unsent:  # the client has it all, the end included
            # what the thread counted is applied by the count after the end, before its tail: the client's next
            # request (on this connection, after this handler) waits for nothing more here than the framing
            self.thread_counts = (segments, counts, gap_sum, last_token, tokens)
            self.end_written, self.at, record.end = True, tail_at, ended_at
            self.metrics.fast_relay_ends.inc()
            self.deferred = []
            conn.resume()
            conn.data_received(sent)  # the connection's framing now (its end: back to the pool), the rest later
            if unread:  # bytes after the body's end: the connection will not be used again
                conn.data_received(unread)
            return
        self.apply_counts(segments, counts, gap_sum, last_token, tokens)
        if reason == fastrelay.CLIENT or transport.is_closing():
            self.gone = True  # the upstream connection stays paused: nothing more is read for this client
            return
        if sent and reason in (fastrelay.UNUSUAL, fastrelay.EOF):
            self.sent = (sent, tail_at)  # the stream's end: `run` reads it at its turn (`Turns`), then `unread`
            self.unread = unread or None
            return
        if unread and reason in (fastrelay.UNUSUAL, fastrelay.EOF):
            self.unread = unread  # most likely the stream's end: `run` feeds it at its turn (`Turns`)
            return
        conn.resume()
        if sent:  # a tail that is not the end (a slow client, the thread's time up): read, not written again
            self.read_sent(sent, tail_at)
        if unread:  # as if just read (a slow client too: bounded by one read): the rest goes on in Python
            conn.data_received(unread)
        if transport.get_write_buffer_size() > WRITE_HIGH_WATER:
            self.paused = True
            conn.pause()

    def apply_counts(self, segments: list[tuple[bytes, bool]], counts: tuple[int, ...], gap_sum: float,
                     last_token: float, tokens: int) -> None:
        """What the thread counted while it held the stream: the text it relayed (for the output hash), the
        inter-token gaps per ITL bucket and the last token's time."""
        record = self.record
        for text, plain in segments:  # the thread checked each body as the pattern's text group
            decoded = text if plain else _decoded(text)
            if decoded is None:
                record.outcome = "bad_response"
            else:
                record.output.update(decoded)
        if tokens:
            self.metrics.fast_relay_chunks.inc(tokens)
        gaps = record.gaps
        if tokens and gaps is not None:
            for i, n in enumerate(counts):
                if n:
                    gaps.counts[i] += n
            gaps.total += gap_sum
            record.last_token = last_token
            now = time.perf_counter()
            if now >= gaps.flush_at:
                gaps.flush(now)

    def apply_thread_counts(self) -> None:
        """The counts of a stream the thread ended (`resume` kept them), once, before anything counts it."""
        if self.thread_counts is not None:
            counted, self.thread_counts = self.thread_counts, None
            self.apply_counts(*counted)

    def read_sent(self, sent: bytes, at: float) -> None:
        """What the thread wrote to the client already, read and counted as if it had arrived at `at`."""
        self.quiet, self.at = True, at
        try:
            self.conn.data_received(sent)
        finally:
            self.quiet, self.at = False, 0.0

    def settle(self) -> None:
        if self.unsettled and self.fast is not None:
            self.unsettled = False
            self.fast.settled()

    # -- the coroutine ---------------------------------------------------------------------------------
    async def run(self, client: web.Request | None, timeout: asyncio.Timeout,
                  release: Callable[[], None], headers: CIMultiDict[str]) -> tuple[web.StreamResponse, bool]:
        """Relay to `client` (None: a mirror, discard) until the end. Returns the response and whether the
        upstream response ended cleanly."""
        head, conn, record = self.head, self.conn, self.record
        response = compat.HeldHeadersResponse(status=head.status, reason=head.reason or None,
                                              headers=headers)
        writer = self.writer = await response.prepare(client) if client is not None else None
        self.transport = client.transport if client is not None else None
        self.chunked = writer is not None and getattr(writer, "chunked", False)
        if not self.chunked:
            self.fast = None
        ended = conn.ended
        assert ended is not None
        ended.add_done_callback(lambda _: self.wake())
        try:
            conn.attach(self.sink)  # what came with the upstream's head goes out now, the headers with it
            if not self.headers_sent and not ended.done() and isinstance(writer, StreamWriter):
                self.headers_sent = True  # the head came alone: so do the client's (the end would take them along)
                try:
                    writer.send_headers()
                except aiohttp.ClientConnectionResetError:
                    self.gone = True  # ends below as a client abort
            turned = await self._until_ended(writer)
            ended.result()  # raises where the upstream broke off
            release()  # a new request need not open a connection while this stream's end waits
            if self.end_written and self.later is not None:  # the thread wrote the last bytes and the end:
                compat.ended_elsewhere(response)                # the handler returns, the count comes after
                record.counted_later = True
                self.later(self.count_after_end(head.status))
                return response, True
            if not turned:  # the stream's end waits behind new requests and first chunks, not ahead of them
                await self.turns.wait()
            last = self.relay.finish(head.status)
            self.finish(record)  # before the last bytes: a client that has its answer sees it counted
            if self.gone or (self.transport is not None and self.transport.is_closing()):
                raise ClientGone()
            if writer is not None:  # the last bytes and the end of the body in one write (one syscall)
                timeout.reschedule(None)  # the upstream's answer is complete: its deadline no longer applies
                try:
                    await response.write_eof(last)
                except (ConnectionResetError, aiohttp.ClientConnectionResetError):
                    raise ClientGone() from None
            return response, True
        except ClientGone:
            record.outcome = "client_abort"
        except (OSError, asyncio.CancelledError) as exc:
            if isinstance(exc, asyncio.CancelledError) and not timeout.expired():
                raise  # the client left (aiohttp cancels its handler)
            record.outcome = "upstream_error"  # the upstream broke off mid-response, or hung past the deadline
            self.take_back()
            if self.transport is not None:
                self.transport.abort()  # the client sees the cut (no end of the chunked body), not a complete answer
        finally:
            self.take_back()  # the thread still had it: its counts, then ours again
            if not self.record.counted_later:
                self.apply_thread_counts()  # a stream the thread ended, cut short here: counted by the handler
                self.settle()  # counted above, or never to be: /metrics waits no longer for it
        return response, False

    async def count_after_end(self, status: int) -> None:
        """The tail the thread wrote, read and counted at its turn, after everything else (`counts_after`); at
        once where the task is cancelled (the exporter stopping)."""
        assert self.counts_after is not None and self.deferred is not None
        try:
            await self.counts_after.wait()
        finally:
            deferred, self.deferred = self.deferred, None
            record = self.record
            try:
                self.apply_thread_counts()  # first: the thread's text came before the tail's
                for chunk in deferred:
                    self.relay.feed(chunk, self.at)
                self.relay.finish(status)
            except Exception:  # noqa: BLE001 - a bug in reading the tail must not lose the request's count
                log.exception("request %s: reading the tail the relay thread wrote failed; counted as bad_response",
                              record.request_id)
                record.outcome = "bad_response"
            finally:
                record.counted_later = False
                try:
                    self.finish(record)
                finally:
                    self.settle()

    async def _until_ended(self, writer: aiohttp.abc.AbstractStreamWriter | None) -> bool:
        """Wait for the upstream's end, draining a slow client and feeding what the thread handed back on the
        way. Returns whether the stream has had its turn already."""
        conn, ended, turned = self.conn, self.conn.ended, False
        assert ended is not None
        while True:
            if self.gone:
                raise ClientGone()
            if self.unread is not None or self.sent is not None:  # handed back by the relay thread: read on
                await self.turns.wait()                              # at this stream's turn
                turned = True
                unread, self.unread, sent, self.sent = self.unread, None, self.sent, None
                conn.resume()
                if sent is not None:
                    self.read_sent(*sent)
                if unread:
                    conn.data_received(unread)
                if self.transport is not None and self.transport.get_write_buffer_size() > WRITE_HIGH_WATER:
                    self.paused = True
                    conn.pause()
                continue
            if self.paused:
                self.paused = False
                if writer is not None:
                    await writer.drain()
                if self.unread is None:  # else it resumes after those bytes (above), never before them
                    conn.resume()
                continue
            if ended.done():
                return turned
            await self.wait()
