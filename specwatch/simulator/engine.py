"""The simulated engine: continuous batching, speculative steps verified against the target, GPU timing.

One asyncio task runs engine steps back to back. Each step admits waiting requests up to
`max_num_seqs` and the KV capacity (preempting the newest request when decoding needs
blocks that are not there), prefills new requests (one token each), and for every decoding
request asks its proposer for drafts, verifies them against the target's tokens (accepted =
the matching prefix), emits accepted + 1 tokens and accounts the step exactly as vLLM
0.32.0 does: async-scheduled methods count every decode step as a k-slot draft, n-gram and
suffix steps without a proposal are not drafts, acceptance is recorded before max_tokens
or EOS cut the output. The step's duration comes from the timing model; outputs are
delivered when it has elapsed (times `time_scale`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specwatch.simulator import timing
from specwatch.simulator.metrics import VllmMetrics
from specwatch.simulator.proposers import (
    DEFAULT_PROFILES,
    ModelledDrafter,
    NgramIndex,
    SuffixCache,
    SuffixIndex,
)
from specwatch.simulator.spec_config import SpecConfig, k_for_batch
from specwatch.simulator.spec_stats import RequestSpecStats

log = logging.getLogger("specwatch.sim.engine")
EOS = ""  # the end-of-sequence piece: counted as a completion token, never shown


@dataclass(frozen=True)
class EngineConfig:
    spec: SpecConfig | None
    per_request_spec_metrics: str  # none | summary | detailed
    max_num_seqs: int
    max_model_len: int
    block_size: int
    num_blocks: int
    time_scale: float = 1.0
    draft_profile: tuple[float, ...] | None = None
    seed: int = 0


@dataclass
class StepOutput:
    text: str
    new_tokens: int
    finish_reason: str | None = None
    stop_reason: str | None = None
    pieces: tuple[str, ...] = ()  # the step's tokens (EOS included), whatever of their text is held back


@dataclass
class EngineRequest:
    """One sequence: the target's tokens, what was generated, timestamps and spec accounting."""

    request_id: str
    prompt: Sequence[str]
    target: Sequence[str]  # the target's tokens, ending with EOS unless ignore_eos
    max_tokens: int
    stop: tuple[str, ...] = ()
    n: int = 1
    outputs: asyncio.Queue[StepOutput] = field(default_factory=asyncio.Queue)
    generated: list[str] = field(default_factory=list)
    arrival: float = field(default_factory=time.monotonic)
    scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    preemptions: int = 0
    needs_prefill: bool = True
    finished: bool = False
    finish_reason: str | None = None
    spec_stats: RequestSpecStats | None = None
    spec_visible: bool = True  # False when a stop string ended it (vLLM attaches no field then)
    sent_chars: int = 0
    proposer: Any = None
    modelled_first_ms: float | None = None  # the timing model's clock at the first and the last token
    modelled_last_ms: float | None = None

    def context_len(self) -> int:
        return len(self.prompt) + len(self.generated)

    def timing_metrics(self) -> dict[str, float | None]:
        """`--enable-per-request-metrics` fields (engine clock; TTFT excludes queueing)."""
        def ms(a: float | None, b: float | None) -> float | None:
            return (b - a) * 1000 if a is not None and b is not None else None
        n = len(self.generated)
        generation = ms(self.first_token, self.last_token)
        span = ms(self.scheduled, self.last_token)
        return {
            "time_to_first_token_ms": ms(self.scheduled, self.first_token),
            "generation_time_ms": generation,
            "queue_time_ms": ms(self.arrival, self.scheduled),
            "mean_itl_ms": generation / (n - 1) if generation is not None and n > 1 else None,
            "tokens_per_second": n / (span / 1000) if span else None,
        }


class Engine:
    def __init__(self, cfg: EngineConfig, metrics: VllmMetrics) -> None:
        self.cfg, self.metrics = cfg, metrics
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self._wake = asyncio.Event()
        self._rng = random.Random(cfg.seed)
        spec = cfg.spec
        self.k = spec.num_speculative_tokens if spec else 0
        self.suffix_cache = (SuffixCache(spec.suffix_decoding_max_cached_requests, spec.suffix_decoding_max_tree_depth)
                             if spec and spec.method == "suffix" and spec.suffix_decoding_max_cached_requests > 0
                             else None)
        self.steps = 0
        self.modelled_ms = 0.0  # sum of modelled step durations (for the timing benchmark)

    # -- requests -------------------------------------------------------------------------
    def add(self, req: EngineRequest) -> None:
        if self.cfg.spec is not None:
            req.spec_stats = RequestSpecStats(self.k)
            req.proposer = self._proposer(req)
        self.waiting.append(req)
        self._gauges()
        self._wake.set()

    def abort(self, req: EngineRequest) -> None:
        if req.finished:
            return
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        req.finished, req.finish_reason = True, "abort"
        self.metrics.request_success["abort"].inc()
        self._gauges()

    def _proposer(self, req: EngineRequest) -> Any:
        spec = self.cfg.spec
        assert spec is not None
        if spec.method == "ngram":
            assert spec.prompt_lookup_min is not None and spec.prompt_lookup_max is not None
            index: NgramIndex | SuffixIndex = NgramIndex(spec.prompt_lookup_min, spec.prompt_lookup_max)
        elif spec.method == "suffix":
            index = SuffixIndex(spec.suffix_decoding_max_tree_depth, spec.suffix_decoding_min_token_prob,
                                spec.suffix_decoding_max_spec_factor, self.suffix_cache)
        else:
            profile = self.cfg.draft_profile or DEFAULT_PROFILES.get(spec.method, DEFAULT_PROFILES["draft_model"])
            # a lookup over the context tells the drafter which upcoming pieces are copyable
            lookup = NgramIndex(2, 4)
            lookup.extend(req.prompt)
            return (ModelledDrafter(profile, random.Random(self._rng.random())), lookup)
        index.extend(req.prompt)
        return index

    # -- the loop --------------------------------------------------------------------------
    async def run(self) -> None:
        deadline = time.monotonic()
        while True:
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
                deadline = time.monotonic()
            try:
                duration_ms, outputs = self._step()
                self.modelled_ms += duration_ms
                deadline += duration_ms / 1000 * self.cfg.time_scale
                delay = deadline - time.monotonic()
                await asyncio.sleep(delay if delay > 0 else 0)
                self._deliver(outputs)
            except Exception:  # a bug must not leave clients hanging: end what is in flight, keep serving
                log.exception("engine step failed; aborting %d in-flight requests",
                              len(self.running) + len(self.waiting))
                for req in [*self.running, *self.waiting]:
                    self.abort(req)
                    req.outputs.put_nowait(StepOutput("", 0, "abort"))

    def _blocks(self, tokens: int) -> int:
        return math.ceil(tokens / self.cfg.block_size)

    def _step(self) -> tuple[float, list[tuple[EngineRequest, list[str]]]]:
        self.steps += 1
        used = sum(self._blocks(r.context_len() + 1 + self.k) for r in self.running)
        while self.waiting and len(self.running) < self.cfg.max_num_seqs:
            need = self._blocks(self.waiting[0].context_len() + 1 + self.k)
            if used + need > self.cfg.num_blocks:
                break
            req = self.waiting.popleft()
            used += need
            if req.scheduled is None:
                req.scheduled = time.monotonic()
                self.metrics.prompt_tokens.inc(len(req.prompt))
                self.metrics.prompt_tokens_local.inc(len(req.prompt))
                self.metrics.prefix_queries.inc(len(req.prompt))
            self.running.append(req)
        while used > self.cfg.num_blocks and len(self.running) > 1:  # preempt the newest (recompute later)
            victim = self.running.pop()
            used -= self._blocks(victim.context_len() + 1 + self.k)
            victim.needs_prefill = True
            victim.preemptions += 1
            self.metrics.preemptions.inc()
            self.waiting.appendleft(victim)

        prefill = [r for r in self.running if r.needs_prefill]
        decode = [r for r in self.running if not r.needs_prefill]
        outputs: list[tuple[EngineRequest, list[str]]] = []
        prefill_tokens = 0
        for req in prefill:
            prefill_tokens += req.context_len()
            req.needs_prefill = False
            outputs.append((req, [req.target[len(req.generated)]]))
        k_now = k_for_batch(self.cfg.spec, len(decode)) if self.cfg.spec and decode else 0
        verified = 0
        for req in decode:
            pieces, drafted = self._speculate(req, k_now)
            verified += 1 + drafted
            outputs.append((req, pieces))
        context = sum(r.context_len() for r in decode) / len(decode) if decode else 0.0
        method = self.cfg.spec.method if self.cfg.spec else None
        duration = timing.step_ms(method, len(decode), k_now, verified / len(decode) if decode else 1.0,
                                  context, prefill_tokens)
        self.metrics.iteration_tokens.observe(prefill_tokens + sum(len(p) for _, p in outputs))
        return duration, outputs

    def _speculate(self, req: EngineRequest, k: int) -> tuple[list[str], int]:
        """Propose, verify against the target, account; returns the emitted pieces and the draft slots."""
        pos = len(req.generated)
        upcoming = req.target[pos:pos + k + 1]
        spec = self.cfg.spec
        if spec is None or k == 0:
            return [upcoming[0]], 0
        if spec.async_scheduled:
            drafter, lookup = req.proposer
            guess = lookup.propose(k)  # what a lookup would copy: learned drafters find it easier
            copyable = [p < len(guess) and guess[p] == upcoming[p] for p in range(min(k, len(upcoming)))]
            proposal = drafter.propose(upcoming, k, copyable)
            slots = k  # every decode step is a k-slot draft under async scheduling
        else:
            proposal = req.proposer.propose(k)
            slots = len(proposal)
        limit = min(slots, len(upcoming) - 1)  # one target token must remain as the bonus
        if spec.rejection_sample_method == "synthetic":
            accepted = min(self._synthetic_accepted(spec, slots), limit)
        else:
            accepted = 0
            while accepted < limit and proposal[accepted] == upcoming[accepted]:
                accepted += 1
        if slots:
            assert req.spec_stats is not None
            req.spec_stats.observe(slots, accepted)
            self.metrics.observe_spec_step(slots, accepted)
        return list(upcoming[:accepted + 1]), slots

    def _synthetic_accepted(self, spec: SpecConfig, slots: int) -> int:
        """vLLM's synthetic kernel: position p is accepted iff uniform < c_p and every earlier one was."""
        conditional = spec.synthetic_conditional_rates or ()
        accepted = 0
        while accepted < min(slots, len(conditional)) and self._rng.random() < conditional[accepted]:
            accepted += 1
        return accepted

    def _deliver(self, outputs: list[tuple[EngineRequest, list[str]]]) -> None:
        now = time.monotonic()
        for req, pieces in outputs:
            if req.finished:
                continue
            if req.modelled_first_ms is None:
                req.modelled_first_ms = self.modelled_ms
            req.modelled_last_ms = self.modelled_ms
            if req.first_token is None:
                req.first_token = now
                self.metrics.ttft.observe(now - req.arrival)
            else:
                self.metrics.itl.observe(now - (req.last_token or now))
            req.last_token = now
            self._append(req, pieces)
        self._gauges()

    def _append(self, req: EngineRequest, pieces: list[str]) -> None:
        limit = min(req.max_tokens, self.cfg.max_model_len - len(req.prompt))
        pieces = pieces[:max(limit - len(req.generated), 0)]
        finish: str | None = None
        if EOS in pieces:
            pieces = pieces[:pieces.index(EOS) + 1]
            finish = "stop"
        req.generated += pieces
        self.metrics.generation_tokens.inc(len(pieces))
        if req.proposer is not None:
            index = req.proposer[1] if isinstance(req.proposer, tuple) else req.proposer
            index.extend([p for p in pieces if p != EOS])
        if finish is None and len(req.generated) >= limit:
            finish = "length"
        text = "".join(req.generated)
        stop_reason = None
        for s in req.stop:
            at = text.find(s)
            if at >= 0:
                text, finish, stop_reason = text[:at], "stop", s
                req.spec_visible = False
                break
        visible = text
        if finish is None and req.stop:  # hold back what could still become a stop string
            visible = text[:max(len(text) - max(len(s) for s in req.stop) + 1, req.sent_chars)]
        delta, req.sent_chars = visible[req.sent_chars:], len(visible)
        if finish is not None:
            self._finish(req, finish)
        req.outputs.put_nowait(StepOutput(delta, len(pieces), finish, stop_reason, tuple(pieces)))

    def _finish(self, req: EngineRequest, reason: str) -> None:
        req.finished, req.finish_reason = True, reason
        self.running.remove(req)
        m, n = self.metrics, len(req.generated)
        now = req.last_token or time.monotonic()
        first, scheduled = req.first_token or now, req.scheduled or now
        m.request_success[reason].inc()
        m.e2e.observe(now - req.arrival)
        m.queue_time.observe(scheduled - req.arrival)
        m.inference_time.observe(now - scheduled)
        m.prefill_time.observe(first - scheduled)
        m.decode_time.observe(now - first)
        m.tpot.observe((now - first) / (n - 1) if n > 1 else 0.0)
        m.request_prompt_tokens.observe(len(req.prompt))
        m.request_generation_tokens.observe(n)
        m.max_num_generation_tokens.observe(req.max_tokens)
        m.params_n.observe(req.n)
        m.params_max_tokens.observe(req.max_tokens)
        m.request_preemptions.observe(req.preemptions)
        m.prefill_kv_computed.observe(len(req.prompt))
        if self.suffix_cache is not None:
            self.suffix_cache.add([p for p in req.generated if p != EOS])

    def _gauges(self) -> None:
        self.metrics.running.set(len(self.running))
        self.metrics.waiting.set(len(self.waiting))
        self.metrics.waiting_capacity.set(len(self.waiting))
        used = sum(self._blocks(r.context_len()) for r in self.running)
        self.metrics.kv_usage.set(min(used / self.cfg.num_blocks, 1.0) if self.cfg.num_blocks else 0.0)
