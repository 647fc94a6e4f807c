"""What the tap does with one response as it arrives: the request's plan, and the relays that account it.

`plan_request` decides what goes upstream (a streaming client that did not ask for usage gets
`stream_options.include_usage` added, and the usage chunk removed again on the way back). `SseRelay`
reads an event stream read by read: ordinary content chunks through the byte pattern of
`sse.PlainReader`, every other event parsed in full; the usage chunk the tap asked for is dropped and
its `system_fingerprint` stamped on the terminal chunks, as vLLM would have put it there; from `[DONE]`
on everything is held back, so the request is accounted before its last bytes leave. `BodyRelay` does
the same for a plain body. Neither touches a socket: `tap.Tap` moves the bytes.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import Any

from specwatch.exporter.accounting import RequestRecord, utf8
from specwatch.exporter.metrics import ExporterMetrics
from specwatch.exporter.sse import Event, PlainReader, SseSplitter

GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")
MAX_BUFFERED_BODY = 32 * 1024 * 1024


class BodyError(ValueError):
    """A generation request's body the tap cannot parse although it is JSON by its content type (nested deeper
    than the parser goes): the tap answers it with a 400 of its own rather than forward what it cannot account."""


@dataclass
class UpstreamRequest:
    """What to send upstream and how to treat the answer."""

    body: bytes
    parsed: dict[str, Any] | None
    stream: bool
    strip_usage: bool  # the tap added include_usage: remove the usage chunk before the client sees it


def plan_request(path: str, raw: bytes, content_type: str) -> UpstreamRequest:
    parsed: dict[str, Any] | None = None
    if path in GENERATION_PATHS and "json" in content_type:
        try:
            value = json.loads(raw) if raw else None
        except (ValueError, UnicodeDecodeError):
            value = None
        except RecursionError:
            raise BodyError("request body nested deeper than the exporter parses (a JSON value of at most "
                            f"{sys.getrecursionlimit()} levels)") from None
        parsed = value if isinstance(value, dict) else None
    if parsed is None:
        return UpstreamRequest(raw, None, False, False)
    stream = parsed.get("stream") is True
    options = parsed.get("stream_options")
    if stream and not (isinstance(options, dict) and options.get("include_usage") is True):
        patched = dict(parsed)
        patched["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
        return UpstreamRequest(json.dumps(patched).encode(), parsed, True, True)
    return UpstreamRequest(raw, parsed, stream, False)


def _stamp_fingerprint(raw: bytes, fingerprint: str) -> bytes:
    """Insert `"system_fingerprint": ...` as the last key of the event's JSON object, as vLLM serialises it."""
    end = raw.rfind(b"}")
    return raw[:end] + b',"system_fingerprint":' + json.dumps(fingerprint).encode() + raw[end:]


class SseRelay:
    """The accounting of one event stream, read by read: `feed()` takes upstream bytes and returns what the
    client gets now (b"" for nothing); from the read that carries `[DONE]` on, everything is held back and
    `finish()` returns it, so that the caller can account the request before its last bytes leave."""

    def __init__(self, plan: UpstreamRequest, record: RequestRecord, metrics: ExporterMetrics) -> None:
        self.plan, self.record, self.metrics = plan, record, metrics
        self.splitter = SseSplitter()
        self.plain = PlainReader()  # the per-chunk fast path, learning this stream's chunk shape
        self.held: list[Event] = []  # terminal chunks waiting for the fingerprint of the stripped usage chunk
        self.fingerprint: str | None = None
        self.saw_done = False
        self.forced = False  # usage on content chunks: the server forces usage, the client gets it anyway
        self.last: list[bytes] = []

    def feed(self, chunk: bytes, at: float = 0.0) -> bytes:
        """`at`: when these bytes were read, where not now (a tail the relay thread wrote already)."""
        # The usual read: one whole single-line event. Where the splitter holds nothing, it would cut this
        # very event with this very payload (see `sse._data`), so it is read here without it: an ordinary
        # content chunk by the reader alone, any other event in full (the reader asked once). Anything else
        # goes through the splitter.
        if (not self.saw_done and chunk.startswith(b"data: ") and chunk.find(b"\n") == len(chunk) - 2
                and chunk.endswith(b"\n\n") and self.splitter.empty()):
            data = chunk[6:-2]
            text = self.plain.text(data)
            if text is not None:
                if text:
                    self.record.saw_tokens(text, at or time.perf_counter(), self.metrics)
                return chunk
            out: list[bytes] = []
            self._parsed(Event(chunk, data), at or time.perf_counter(), out)
            return self._released(out)
        events = self.splitter.feed(chunk)
        if not events:
            return b""
        now = at or time.perf_counter()  # one clock per read: its events arrived together
        out = []
        for event in events:
            self._handle(event, now, out)
        return self._released(out)

    def _released(self, out: list[bytes]) -> bytes:
        """What of a read's events the client gets now: nothing from the read with `[DONE]` on (held back)."""
        if self.saw_done:
            self.last.extend(out)
            return b""
        return out[0] if len(out) == 1 else b"".join(out)

    def finish(self, status: int) -> bytes:
        """The held-back bytes (the stream has ended); a stream without `[DONE]` is a bad_response."""
        last = self.last
        for event in self.splitter.flush():
            self._handle(event, time.perf_counter(), last)
        last.extend(h.raw for h in self.held)  # a stream that ended without [DONE]
        self.held.clear()
        record = self.record
        if not self.saw_done and record.outcome == "ok" and status == 200:
            record.outcome = "bad_response"
        self.last = []
        return b"".join(last)

    def _handle(self, event: Event, now: float, out: list[bytes]) -> None:
        data = event.data
        if data is not None:
            text = self.plain.text(data)  # the per-chunk fast path: an ordinary content delta
            if text is not None:
                if text:
                    self.record.saw_tokens(text, now, self.metrics)
                out.append(event.raw)
                return
        self._parsed(event, now, out)

    def _parsed(self, event: Event, now: float, out: list[bytes]) -> None:
        """An event that is not an ordinary content chunk, read in full."""
        data = event.data
        record, plan = self.record, self.plan
        obj = event.json()
        if isinstance(obj, dict):
            choices = obj.get("choices")
            if choices == [] and "usage" in obj:
                record.saw_final(obj)
                if plan.strip_usage and not self.forced:
                    self.fingerprint = obj.get("system_fingerprint")
                    return
            elif isinstance(choices, list):
                self.forced = self.forced or "usage" in obj
                terminal = False
                for choice in choices:
                    if not isinstance(choice, dict):
                        continue
                    delta = choice.get("delta")
                    value = delta.get("content") if isinstance(delta, dict) else choice.get("text")
                    if isinstance(value, str) and value:
                        record.saw_tokens(utf8(value), now, self.metrics)
                    if choice.get("finish_reason"):
                        record.finish_reasons.append(str(choice["finish_reason"]))
                        terminal = True
                if terminal and plan.strip_usage and not self.forced and "system_fingerprint" not in obj:
                    self.held.append(event)
                    return
        elif data == b"[DONE]":
            self.saw_done = True
            fingerprint = self.fingerprint
            out.extend(_stamp_fingerprint(h.raw, fingerprint) if fingerprint else h.raw for h in self.held)
            self.held.clear()
        elif data is not None:
            record.outcome = "bad_response"  # not JSON: relayed as is, counted
        out.append(event.raw)


class BodyRelay:
    """A plain body, read by read, with the same shape as `SseRelay`: every read but the last goes out at once;
    `finish()` parses what was buffered (a generation path's 200) and returns the last read, unsent."""

    def __init__(self, record: RequestRecord) -> None:
        self.record = record
        self.body = bytearray()
        self.last = b""

    def feed(self, chunk: bytes, at: float = 0.0) -> bytes:
        out, self.last = self.last, chunk
        if len(self.body) < MAX_BUFFERED_BODY:
            self.body += chunk
        return out

    def finish(self, status: int) -> bytes:
        record = self.record
        if record.path in GENERATION_PATHS and status == 200:
            try:
                parsed = json.loads(bytes(self.body))
                if not isinstance(parsed, dict):
                    raise ValueError("not an object")
                record.saw_body(parsed)
            except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deep to parse
                record.outcome = "bad_response"
        last, self.last = self.last, b""
        return last
