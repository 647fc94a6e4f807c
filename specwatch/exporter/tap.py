"""The request path: forward every request unchanged, relay responses as they arrive, account them.

Every request goes to its upstream over the tap's own HTTP/1.1 client (`upstream.py`; upstreams are plain
`http://`, `config.plain_http`), and every answer comes back through `stream_relay.StreamRelay`: streams
event by event with the upstream's exact bytes, plain bodies read by read. Streams are read and accounted by
`relays.SseRelay` (the usage chunk the tap asked for removed, ordinary content chunks read by a byte
pattern, the rest parsed in full); long runs of ordinary content chunks go to the compiled relay thread
(`fastrelay`), and stream ends are accounted in turns (`turns`); where nothing the tap writes outlives the
process (`tail_ends`), the thread also writes a stream's last events and the end of its body, and the tap
counts them just after (`/metrics` waits for those counts, `settled`). The split's route comes from
`routing.Router`, which routes around an upstream known down (`availability`: fed here by the requests that
reach it or do not); a rerouted request is counted once it is forwarded, and never mirrored. Faults never
escape: an unreachable upstream becomes a 502 with an OpenAI-style error, a malformed answer is relayed and
counted `bad_response`, a client that leaves cancels the upstream request. Headers pass through untouched
(minus hop-by-hop and the tap's own) and are never logged.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import secrets
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from specwatch.exporter import fastrelay
from specwatch.exporter.accounting import ITL_FLUSH_SECONDS, RequestRecord, settle
from specwatch.exporter.classify import TASK_HEADER, classify
from specwatch.exporter.config import ExporterConfig, plain_http
from specwatch.exporter.eventlog import EventLog
from specwatch.exporter.fastrelay import FastRelay
from specwatch.exporter.metrics import ExporterMetrics
from specwatch.exporter.relays import (
    GENERATION_PATHS,
    BodyError,
    UpstreamRequest,
    plan_request,
)
from specwatch.exporter.routing import VARIANT_HEADER, Router
from specwatch.exporter.stream_relay import StreamRelay
from specwatch.exporter.turns import Turns
from specwatch.exporter.upstream import Connection, Head, NotSent, Pool, request_bytes

log = logging.getLogger("specwatch.exporter")
HOP_BY_HOP = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive",
                        "proxy-connection", "te", "trailer", "upgrade", "accept-encoding", "content-encoding",
                        TASK_HEADER, VARIANT_HEADER})
_HOP_BY_HOP_RAW = frozenset(name.encode("ascii") for name in HOP_BY_HOP)
MAX_MIRRORS_IN_FLIGHT = 64


def error_response(status: int, message: str, err_type: str) -> web.Response:
    body = {"error": {"message": message, "type": err_type, "param": None, "code": status}}
    return web.Response(status=status, body=json.dumps(body).encode(), content_type="application/json")


def _forward_headers(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP)


def forward_header_lines(raw: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The client's header lines as they came (aiohttp's `raw_headers`), minus the hop-by-hop ones."""
    return b"".join(b"%b: %b\r\n" % (k, v) for k, v in raw if k.lower() not in _HOP_BY_HOP_RAW)


class Tap:
    def __init__(self, cfg: ExporterConfig, metrics: ExporterMetrics, router: Router,
                 event_log: EventLog | None = None) -> None:
        self.cfg, self.metrics, self.router, self.event_log = cfg, metrics, router, event_log
        self.pool = Pool(connect_timeout=5)
        self._direct: dict[str, tuple[str, int, str]] = {}  # (host, port, path prefix) by variant
        for name, url in cfg.upstreams.items():
            where = plain_http(url)
            assert where is not None, f"{name}={url}: config.load takes plain http:// upstreams only"
            self._direct[name] = where
        self._mirrors = asyncio.Semaphore(MAX_MIRRORS_IN_FLIGHT)
        self._background: set[asyncio.Task[None]] = set()
        # request ids for requests without X-Request-Id: a random prefix per process and a counter (16 hex
        # digits as before; no getrandom syscall per request)
        self._id_prefix, self._ids = secrets.token_hex(4), itertools.count()
        self.fast: FastRelay | None = None  # the compiled relay thread, where built and enabled (`start`)
        self.turns = Turns()  # the ends of streams, a few per loop iteration (`turns.py`)
        self.counts_after = Turns(share=None)  # ends the relay thread wrote: one count per iteration, last
        self._counting: set[asyncio.Task[None]] = set()  # their counts, each a task of its own
        # The relay thread may write a stream's end before the tap counts it only where a crash between the two
        # loses nothing that would otherwise outlive the process: one process (its counters die with it) and no
        # event log (a file, whose line for that request would be missing). With `--workers` (counters in mmap
        # files) or `--event-log`, every end is counted before its last bytes leave, as before.
        self.tail_ends = cfg.workers == 1 and event_log is None

    def _new_id(self) -> str:
        return f"{self._id_prefix}{next(self._ids) & 0xFFFFFFFF:08x}"

    async def start(self) -> None:
        self.fast, why = self._fast_relay()
        relay = "compiled" if self.fast is not None else "python"
        self.metrics.relay.labels(relay).set(1)
        log.info("content chunks relayed by the %s relay%s", relay, f" ({why})" if why else "")

    def _fast_relay(self) -> tuple[FastRelay | None, str]:
        """The compiled relay thread where it is built, asked for and starts; else None, and why."""
        if not self.cfg.fast_relay:
            return None, "--no-fast-relay"
        if not fastrelay.AVAILABLE:
            return None, "the compiled relay is not built (no C compiler at install?)"
        try:
            return FastRelay(asyncio.get_running_loop(), ITL_FLUSH_SECONDS), ""
        except (OSError, RuntimeError) as exc:  # its eventfd or thread did not start: Python relays everything
            log.warning("the compiled relay did not start (%s): relaying in Python", exc)
            return None, f"the compiled relay did not start: {exc}"

    async def settled(self, within: float = 1.0) -> None:
        """Return once every stream end the relay thread wrote is counted (at most `within` seconds): the ends
        written before this call were counted before `/metrics` answers it."""
        fast = self.fast
        if fast is None or not fast.unsettled():
            return
        deadline = asyncio.get_running_loop().time() + within
        while fast.unsettled() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.001)  # their hand-backs, turns and counts run meanwhile

    def _count_later(self, count: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(count)
        self._counting.add(task)
        task.add_done_callback(self._counting.discard)

    async def close(self) -> None:
        if self._counting:  # the ends the thread wrote are counted before the counters go
            await asyncio.gather(*self._counting, return_exceptions=True)
        for task in list(self._background):
            task.cancel()
        self.pool.close()
        if self.fast is not None:
            self.fast.close()

    # -- the handler ---------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            self._account(self._rejected(request, 413))  # counted and logged on any path: nothing was forwarded
            return error_response(413, f"request body larger than {self.cfg.max_body_bytes} bytes",
                                  "RequestEntityTooLarge")
        try:
            plan = plan_request(request.path, raw, request.content_type)
        except BodyError as exc:  # counted and answered here, no traceback: nothing was forwarded
            self._account(self._rejected(request, 400))
            return error_response(400, str(exc), "BadRequestError")
        task = classify(self.cfg, request.path, request.headers, plan.parsed)
        variant, rerouted_from = self.router.pick(request.headers)
        record = self._record(request, plan, variant, task)
        if (self.cfg.mirror and variant == self.cfg.default_variant and rerouted_from is None
                and plan.parsed is not None and request.method == "POST"):  # its own traffic, not rerouted
            self._start_mirror(request, plan, task, record)
        try:
            return await self._exchange(request, plan, record, rerouted_from)
        finally:
            self._finish(record)

    def _record(self, request: web.Request, plan: UpstreamRequest, variant: str, task: str) -> RequestRecord:
        parsed = plan.parsed or {}
        prompt = parsed.get("prompt")
        single = parsed.get("n", 1) in (1, None) and not (isinstance(prompt, list) and len(prompt) > 1
                                                         and not isinstance(prompt[0], int))
        return RequestRecord(
            request_id=request.headers.get("X-Request-Id") or self._new_id(), variant=variant, task=task,
            path=request.path, stream=plan.stream, greedy=parsed.get("temperature") == 0,
            single=plan.parsed is not None and single)

    def _rejected(self, request: web.Request, status: int) -> RequestRecord:
        """A request refused before its body was read: classified by path and headers only."""
        task = classify(self.cfg, request.path, request.headers, None)
        return RequestRecord(
            request_id=request.headers.get("X-Request-Id") or self._new_id(),
            variant=self.router.route(request.headers), task=task, path=request.path, stream=False, greedy=False,
            single=False, outcome="rejected", status=status)

    def _finish(self, record: RequestRecord) -> None:
        if record.accounted or record.counted_later or record.path not in GENERATION_PATHS:
            return  # counted already, or by a task after the handler; or models, tokenize, ...: not accounted
        self._account(record)

    def _account(self, record: RequestRecord) -> None:
        settle(record, self.metrics, self.event_log)

    def _answered(self, record: RequestRecord, status: int) -> None:
        """The variant's upstream sent a response head: it is reachable, and a 5xx or 4xx sets the outcome."""
        self.router.availability.reached(record.variant)
        record.status = status
        if status >= 500:
            record.outcome = "upstream_error"
        elif status >= 400:
            record.outcome = "rejected"

    async def _exchange(self, request: web.Request, plan: UpstreamRequest, record: RequestRecord,
                        rerouted_from: str | None = None, mirror: bool = False) -> web.StreamResponse:
        """Send `request` to the record's variant over the tap's own upstream client (`upstream.py`) and relay the
        answer to its client (a mirror's is discarded). `rerouted_from`: the split's pick it was rerouted from,
        counted once the request is on its way."""
        client = None if mirror else request
        host, port, prefix = self._direct[record.variant]
        payload = request_bytes(request.method, prefix + request.path_qs, host, port,
                                forward_header_lines(request.raw_headers), plan.body)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.upstream_timeout_seconds
        conn: Connection | None = None
        done = sent = False
        try:
            async with asyncio.timeout_at(deadline) as timeout:  # one deadline for the head and the relay
                try:
                    for attempt in (1, 2):
                        conn, reused = await self.pool.acquire(host, port)
                        try:
                            conn.send(payload, head_request=request.method == "HEAD")
                            if not sent:  # on its way (a retry on a fresh connection is the same request)
                                sent = True
                                self.router.forwarded(record.variant, rerouted_from)
                            assert conn.head is not None
                            head = await conn.head
                            break
                        except ConnectionError as exc:
                            # gone before the request left (`NotSent`: even a new connection, reset as it was
                            # accepted), or a kept-alive one the upstream closed meanwhile: once more on a fresh one
                            if attempt == 2 or conn.received or not (reused or isinstance(exc, NotSent)):
                                raise
                            conn.abort()
                except (OSError, asyncio.CancelledError) as exc:
                    expired = isinstance(exc, asyncio.CancelledError)
                    if expired and not timeout.expired():
                        raise
                    record.outcome = "upstream_error"  # unreachable, broke off, or no head before the deadline
                    # unreachable: refused, reset or a connect timeout before any byte of an answer; not a request
                    # sent that had no head by the deadline (a slow upstream), nor a malformed head
                    if not (conn is not None and conn.received) and not (expired and sent):
                        self.router.availability.failed(record.variant)
                    name = type(exc).__name__ if isinstance(exc, OSError) else "TimeoutError"
                    return error_response(502, f"upstream {record.variant} failed: {name}", "BadGateway")
                assert conn is not None
                self._answered(record, head.status)

                def release() -> None:  # the upstream's answer is complete: its connection may serve the next one
                    nonlocal conn
                    if conn is not None:
                        self.pool.release(host, port, conn)
                        conn = None

                response, done = await self._relay_direct(conn, head, plan, record, client, timeout, release)
                return response
        except asyncio.CancelledError:
            record.outcome = "client_abort"
            raise
        finally:
            if conn is not None:
                if done:
                    self.pool.release(host, port, conn)
                else:
                    conn.abort()  # the upstream sees the request cancelled (vLLM counts an abort)

    async def _relay_direct(self, conn: Connection, head: Head, plan: UpstreamRequest, record: RequestRecord,
                            client: web.Request | None, timeout: asyncio.Timeout,
                            release: Callable[[], None]) -> tuple[web.StreamResponse, bool]:
        """Relay from `conn` to `client` (`StreamRelay`); the response and whether the upstream's ended cleanly."""
        stream = StreamRelay(conn, head, plan, record, self.metrics, self.fast, self.turns, self._finish,
                             *((self.counts_after, self._count_later) if self.tail_ends else ()))
        return await stream.run(client, timeout, release, _forward_headers(head.headers))

    # -- mirror ---------------------------------------------------------------------------
    def _start_mirror(self, request: web.Request, plan: UpstreamRequest, task: str, primary: RequestRecord) -> None:
        mirror = self.cfg.mirror
        assert mirror is not None
        record = RequestRecord(request_id=primary.request_id, variant=mirror, task=task, path=request.path,
                               stream=plan.stream, greedy=primary.greedy, single=primary.single)
        if self._mirrors.locked():  # bounded: a copy that cannot be afforded is counted, not queued
            record.outcome = "rejected"
            self._finish(record)
            return
        primary_ended = primary.ended = asyncio.get_running_loop().create_future()

        async def run() -> None:
            async with self._mirrors:
                try:
                    await self._exchange(request, plan, record, mirror=True)
                except Exception:  # noqa: BLE001 - a mirror's failure is accounted, never surfaced
                    if record.outcome == "ok":
                        record.outcome = "upstream_error"
                finally:
                    self._finish(record)
                await primary_ended  # the primary is accounted: its output hash is final
                if record.greedy and record.outcome == "ok" and primary.outcome == "ok":
                    same = record.output.hexdigest() == primary.output.hexdigest()
                    self.metrics.mirror_outputs.labels(mirror, task, "identical" if same else "different").inc()

        task_ = asyncio.create_task(run())
        self._background.add(task_)
        task_.add_done_callback(self._background.discard)
