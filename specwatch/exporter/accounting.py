"""Per-request accounting for the tap: what one response said about speculation and latency.

A `RequestRecord` collects, while the response passes through, the time of the first and the
last token-carrying chunk (counting each inter-chunk gap as ITL on the way: `Gaps`, into the histogram at least
once a second), the usage, `metrics.speculative_decoding`, the finish reasons and a hash of
the output text.
`account()` turns a finished record into counter increments and histogram observations,
parsing the spec-decode field with `specwatch.acceptance.parse`; `RequestRecord.event()` is
its event-log line. `settle()` is what the tap calls once per request: the counts (a failure in
them counted as a bad_response, never raised), the event-log line, and the mirror's wake-up.
Decode steps are derived as completion tokens - 1 - C
(the first token comes from prefill, every decode step emits 1 + its accepted drafts), never
less than R: exact unless max_tokens or an EOS cut the last step's accepted drafts (then low
by at most k).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specwatch.acceptance import (
    ACCEPTED,
    DRAFTED,
    HISTOGRAM,
    STEPS,
    AcceptanceFieldError,
    SpecFields,
    is_count,
    parse,
    spec_field,
    survival,
)
from specwatch.exporter import compat
from specwatch.exporter.eventlog import EventLog
from specwatch.exporter.metrics import ExporterMetrics

log = logging.getLogger("specwatch.exporter")

ITL_FLUSH_SECONDS = 1.0


@dataclass
class RequestRecord:
    request_id: str
    variant: str
    task: str
    path: str
    stream: bool
    greedy: bool
    single: bool  # n == 1 and a single prompt: the only case that carries the per-request field
    start: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    last_token: float | None = None
    usage: dict[str, Any] | None = None
    spec: dict[str, Any] | None = None
    finish_reasons: list[str] = field(default_factory=list)
    output: Any = field(default_factory=hashlib.sha256)
    outcome: str = "ok"
    status: int | None = None
    end: float | None = None
    accounted: bool = False
    counted_later: bool = False  # the relay thread wrote its end; a task counts it after the handler returned
    ended: asyncio.Future[None] | None = None  # resolved when accounted; only where a mirror waits for it
    gaps: Gaps | None = None  # the stream's inter-token gaps not yet in the ITL histogram (hot path)

    def saw_tokens(self, text: bytes, now: float, metrics: ExporterMetrics) -> None:
        """A streamed chunk carried text (UTF-8, as `utf8()` encodes it): record TTFT / ITL and hash the text."""
        self.output.update(text)
        if self.first_token is None:
            self.first_token = now
        else:
            gaps = self.gaps
            if gaps is None:
                gaps = self.gaps = Gaps(metrics.of(self.variant, self.task).itl, now)
            gaps.add(now - (self.last_token or now), now)
        self.last_token = now

    def saw_final(self, obj: dict[str, Any]) -> None:
        """The object with usage (a JSON body or the usage chunk)."""
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        field_ = spec_field(obj)
        if field_ is not None:
            self.spec = dict(field_)

    def saw_body(self, body: dict[str, Any]) -> None:
        """A whole non-streaming response."""
        self.saw_final(body)
        for choice in body.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if choice.get("finish_reason"):
                self.finish_reasons.append(str(choice["finish_reason"]))
            message = choice.get("message")
            text = message.get("content") if isinstance(message, dict) else choice.get("text")
            if isinstance(text, str):
                self.output.update(utf8(text))

    def event(self) -> dict[str, Any]:
        usage = self.usage or {}
        spec = self.spec or {}
        end = self.end or time.perf_counter()
        return {
            "ts": time.time(), "request_id": self.request_id, "variant": self.variant, "task": self.task,
            "path": self.path, "stream": self.stream, "outcome": self.outcome, "status": self.status,
            "ttft_s": None if self.first_token is None else self.first_token - self.start,
            "tpot_s": self.tpot(), "e2e_s": end - self.start,
            "prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": usage.get("completion_tokens"),
            "C": spec.get(ACCEPTED), "D": spec.get(DRAFTED), "R": spec.get(STEPS), "histogram": spec.get(HISTOGRAM),
            "finish_reasons": self.finish_reasons, "output_sha256": self.output.hexdigest(),
        }

    def tpot(self) -> float | None:
        tokens = (self.usage or {}).get("completion_tokens")
        if self.first_token is None or self.last_token is None or not isinstance(tokens, int) or tokens < 2:
            return None
        return (self.last_token - self.first_token) / (tokens - 1)


class Gaps:
    """One stream's inter-token gaps, counted per bucket here and added to the ITL histogram child in one
    go at least every `ITL_FLUSH_SECONDS` and when the request is accounted: per chunk a bisect and a list
    increment instead of `Histogram.observe` (a walk over 32 bounds and two locked increments). The
    histogram ends exactly as if each gap had been observed (`le` buckets: a gap equal to a bound counts in
    it); it reads up to a second behind while a stream runs. The buckets are reached through `compat`
    (`tests/test_exporter_parts.py` checks the equivalence)."""

    __slots__ = ("child", "bounds", "counts", "total", "flush_at")

    def __init__(self, child: Any, now: float) -> None:
        self.child = child
        self.bounds: list[float] = compat.histogram_bounds(child)
        self.counts = [0] * len(self.bounds)
        self.total = 0.0
        self.flush_at = now + ITL_FLUSH_SECONDS

    def add(self, gap: float, now: float) -> None:
        self.counts[bisect_left(self.bounds, gap)] += 1
        self.total += gap
        if now >= self.flush_at:
            self.flush(now)

    def flush(self, now: float) -> None:
        compat.histogram_add(self.child, self.counts, self.total)
        self.total = 0.0
        self.flush_at = now + ITL_FLUSH_SECONDS


def observe(child: Any, amount: float) -> None:
    """`Histogram.observe` on a labelled child with a bisect instead of its walk over the bounds (as `Gaps`
    counts: the same buckets and sum; NaN, which no bound takes, goes to the library's own walk)."""
    bounds = compat.histogram_bounds(child)
    i = bisect_left(bounds, amount)
    if i == len(bounds) or amount != amount:
        child.observe(amount)
        return
    compat.histogram_observe_at(child, i, amount)


def utf8(text: str) -> bytes:
    """Text as the output hash sees it; a lone surrogate (a JSON `\\ud800` escape) is kept, not an error."""
    return text.encode("utf-8", "surrogatepass")


USAGE_KEYS = ("prompt_tokens", "completion_tokens")


def checked(record: RequestRecord) -> tuple[SpecFields | None, dict[str, int]]:
    """The record's spec-decode field and token counts, validated before anything is counted; AcceptanceFieldError
    names what is out of range or contradicts itself (then nothing of the request's usage may be counted)."""
    fields = parse(record.spec) if record.spec is not None else None
    usage: dict[str, int] = {}
    for key in USAGE_KEYS:
        value = (record.usage or {}).get(key)
        if value is None:
            continue
        if not is_count(value):
            raise AcceptanceFieldError(f"usage.{key}: expected an integer in 0..2^53, got {str(value)[:40]!r}")
        usage[key] = value
    return fields, usage


def _add_each(children: list[Any], counts: Sequence[int]) -> None:
    """children[i] += counts[i] where it is not 0 (an `inc(0)` still takes the child's lock)."""
    for child, n in zip(children, counts, strict=True):
        if n:
            child.inc(n)


def account(record: RequestRecord, metrics: ExporterMetrics) -> None:
    """Count a finished request, once: everything it reports is validated first, so that a field out of range or
    contradicting itself makes the request a bad_response (logged, one line) before any counter moves."""
    v, t = record.variant, record.task
    ch = metrics.of(v, t)
    record.end = record.end or time.perf_counter()
    if record.gaps is not None:
        record.gaps.flush(record.end)
    c = r = 0
    fields: SpecFields | None = None
    usage: dict[str, int] = {}
    if record.outcome == "ok":
        try:
            fields, usage = checked(record)
        except AcceptanceFieldError as exc:
            record.outcome = "bad_response"
            log.warning("request %s (%s, %s): bad_response: %s", record.request_id, v, t, exc)
    if record.outcome == "ok" and fields is not None:
        c, d, r, hist = fields.accepted, fields.drafted, fields.steps, fields.histogram
        pos = metrics.ensure_positions(v, t, fields.k)
        ch.steps.inc(r)
        ch.draft_tokens.inc(d)
        ch.accepted.inc(c)
        _add_each(pos.by_accepted, hist)
        _add_each(pos.per_pos, survival(hist))
        reached, full_depth = fields.reached, fields.full_depth  # each computed once (properties)
        if reached is None or full_depth is None:  # summary mode
            if r:
                ch.steps_without_per_step.inc(r)
        else:
            _add_each(pos.reaching, reached)
            _add_each(pos.full_depth_per_pos, survival(full_depth))
            if any(full_depth):
                pos.full_depth_steps.inc(sum(full_depth))
        if fields.acceptance_rate is not None:
            observe(ch.request_acceptance_rate, fields.acceptance_rate)
    if record.outcome == "ok":
        if record.spec is None and record.single:
            ch.missing.inc()
        for key, counter in (("prompt_tokens", ch.prompt_tokens), ("completion_tokens", ch.completion_tokens)):
            if key in usage:
                counter.inc(usage[key])
        completion = usage.get("completion_tokens")
        if record.single and completion is not None and completion > 0:
            ch.decode_steps.inc(max(completion - 1 - c, r))
        if record.first_token is not None:
            observe(ch.ttft, record.first_token - record.start)
        tpot = record.tpot()
        if tpot is not None:
            observe(ch.tpot, tpot)
        observe(ch.e2e, record.end - record.start)
    requests = ch.requests.get(record.outcome)
    if requests is None:
        requests = ch.requests[record.outcome] = metrics.requests.labels(v, t, record.outcome)
    requests.inc()


def settle(record: RequestRecord, metrics: ExporterMetrics, event_log: EventLog | None) -> None:
    """Counters and the event-log line, once per record. `account` validates before it counts; should it still
    raise, the request is counted a bad_response and the error logged, and the client's bytes go on."""
    record.accounted = True
    try:
        account(record, metrics)
    except Exception:  # noqa: BLE001 - a bug in accounting must not cut the client's answer
        log.exception("request %s: accounting failed; counted as bad_response", record.request_id)
        record.outcome = "bad_response"
        metrics.requests.labels(record.variant, record.task, "bad_response").inc()
    if event_log is not None:
        try:
            event_log.write(record.event())
        except OSError:
            log.exception("event log write failed")
    if record.ended is not None and not record.ended.done():
        record.ended.set_result(None)
