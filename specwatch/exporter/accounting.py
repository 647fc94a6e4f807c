"""Per-request accounting for the tap: what one response said about speculation and latency.

A `RequestRecord` collects, while the response passes through, the time of the first and the
last token-carrying chunk (observing each inter-chunk gap as ITL on the way), the usage,
`metrics.speculative_decoding`, the finish reasons and a hash of the output text.
`account()` turns a finished record into counter increments and histogram observations,
parsing the spec-decode field with `specwatch.acceptance.parse`; `RequestRecord.event()` is
its event-log line, which the tap writes. Decode steps are derived as completion tokens - 1 - C
(the first token comes from prefill, every decode step emits 1 + its accepted drafts), never
less than R: exact unless max_tokens or an EOS cut the last step's accepted drafts (then low
by at most k).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

from specwatch.acceptance import ACCEPTED, DRAFTED, HISTOGRAM, STEPS, AcceptanceFieldError, parse, spec_field, survival
from specwatch.exporter.metrics import ExporterMetrics


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
    ended: asyncio.Future[None] | None = None  # resolved when accounted; only where a mirror waits for it
    _itl: Any = None  # the ITL histogram child, looked up once per request (hot path)

    def saw_tokens(self, text: bytes, now: float, metrics: ExporterMetrics) -> None:
        """A streamed chunk carried text (UTF-8, as `utf8()` encodes it): record TTFT / ITL and hash the text."""
        self.output.update(text)
        if self.first_token is None:
            self.first_token = now
        else:
            if self._itl is None:
                self._itl = metrics.of(self.variant, self.task).itl
            self._itl.observe(now - (self.last_token or now))
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


def utf8(text: str) -> bytes:
    """Text as the output hash sees it; a lone surrogate (a JSON `\\ud800` escape) is kept, not an error."""
    return text.encode("utf-8", "surrogatepass")


def account(record: RequestRecord, metrics: ExporterMetrics) -> None:
    """Count a finished request. A malformed field makes the outcome bad_response; nothing raises."""
    v, t = record.variant, record.task
    ch = metrics.of(v, t)
    record.end = record.end or time.perf_counter()
    c = r = 0
    if record.outcome == "ok" and record.spec is not None:
        try:
            fields = parse(record.spec)
        except AcceptanceFieldError:
            record.outcome = "bad_response"
        else:
            c, d, r, hist = fields.accepted, fields.drafted, fields.steps, fields.histogram
            by_accepted, per_pos = metrics.ensure_positions(v, t, len(hist) - 1)
            ch.steps.inc(r)
            ch.draft_tokens.inc(d)
            ch.accepted.inc(c)
            for accepted, steps in enumerate(hist):
                if steps:
                    by_accepted[accepted].inc(steps)
            for p, survivors in enumerate(survival(hist)):
                if survivors:
                    per_pos[p].inc(survivors)
            if fields.acceptance_rate is not None:
                ch.request_acceptance_rate.observe(fields.acceptance_rate)
    if record.outcome == "ok":
        if record.spec is None and record.single:
            ch.missing.inc()
        usage = record.usage or {}
        for key, counter in (("prompt_tokens", ch.prompt_tokens), ("completion_tokens", ch.completion_tokens)):
            value = usage.get(key)
            if isinstance(value, int) and value >= 0:
                counter.inc(value)
        completion = usage.get("completion_tokens")
        if record.single and isinstance(completion, int) and completion > 0:
            ch.decode_steps.inc(max(completion - 1 - c, r))
        if record.first_token is not None:
            ch.ttft.observe(record.first_token - record.start)
        tpot = record.tpot()
        if tpot is not None:
            ch.tpot.observe(tpot)
        ch.e2e.observe(record.end - record.start)
    requests = ch.requests.get(record.outcome)
    if requests is None:
        requests = ch.requests[record.outcome] = metrics.requests.labels(v, t, record.outcome)
    requests.inc()
