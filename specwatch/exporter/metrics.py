"""The exporter's own families (a public contract: dashboards and rules use these names).

The request families carry `variant` and `task`; the upstream probe's (`specwatch_upstream_up`,
`specwatch_upstream_probe_errors_total`) carry `variant` only, the canary's
(`specwatch_canary_verdict{task,verdict}`, `specwatch_canary_score{task}`) `task` and no variant.
Counters end in `_total`; the registry is passed in. Children for every configured variant and
task, every outcome, every canary verdict and (once k is known) every position are created up
front so series exist at 0.

With `--workers N` each worker's values live in prometheus_client's multiprocess files and
`/metrics` sums them (counters and histogram buckets exactly; see `specwatch.exporter.workers`).
The gauges are state, not per-worker quantities. The probe's `specwatch_upstream_up` and the canary's
gauges aggregate as `mostrecent`: the last probe's answer (worker 0 probes; not exported at all with
`health_path: off`), the last verdict pushed through the admin API, whichever worker took it.
`specwatch_upstream_routable` is each worker's view of the shared down set (every worker rereads it
each probe round) and aggregates as `livemin`: 0 while any live worker routes around the variant, and
a dead worker's value goes with it (the supervisor calls `mark_process_dead` for its pid, which removes
its `live*` gauge files), so a worker killed while a variant was down leaves no 0 behind.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from specwatch.exporter.config import ExporterConfig
from specwatch.exporter.families import FAMILIES as F
from specwatch.exporter.families import declared
from specwatch.exporter.labels import OUTCOMES

# Fine enough for millisecond TPOT / ITL on a GPU and for seconds of TTFT under load.
LATENCY_BUCKETS = (0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009, 0.01, 0.0125, 0.015, 0.02,
                   0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0,
                   60.0, 120.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0,
               300.0, 600.0)
RATE_BUCKETS = tuple(i / 10 for i in range(1, 11))
CANARY_VERDICTS = ("pass", "marginal", "fail", "insufficient")  # `specwatch canary --push-to`


class PositionChildren(NamedTuple):
    """The children of one (variant, task, k) that carry a position or an accepted count."""

    by_accepted: list[Any]  # accepted = 0..k
    per_pos: list[Any]  # position = 0..k-1, every request with the field
    reaching: list[Any]  # position = 0..k-1, detailed requests: steps whose draft reached the position
    full_depth_per_pos: list[Any]  # position = 0..k-1, detailed requests: steps that drafted k and accepted p + 1
    full_depth_steps: Any  # detailed requests: steps that drafted k


class Children:
    """One (variant, task)'s children of the request families, looked up once: `labels()` costs
    microseconds per call (argument checks, a lock, a dict), and a request touches about ten of them."""

    __slots__ = ("requests", "missing", "steps", "steps_without_per_step", "draft_tokens", "accepted", "decode_steps",
                 "prompt_tokens", "completion_tokens", "ttft", "tpot", "itl", "e2e", "request_acceptance_rate")

    def __init__(self, m: ExporterMetrics, variant: str, task: str) -> None:
        vt = (variant, task)
        self.requests: dict[str, Any] = {}  # outcome -> child, filled on first use
        self.missing: Any = m.missing.labels(*vt)
        self.steps: Any = m.steps.labels(*vt)
        self.steps_without_per_step: Any = m.steps_without_per_step.labels(*vt)
        self.draft_tokens: Any = m.draft_tokens.labels(*vt)
        self.accepted: Any = m.accepted.labels(*vt)
        self.decode_steps: Any = m.decode_steps.labels(*vt)
        self.prompt_tokens: Any = m.prompt_tokens.labels(*vt)
        self.completion_tokens: Any = m.completion_tokens.labels(*vt)
        self.ttft: Any = m.ttft.labels(*vt)
        self.tpot: Any = m.tpot.labels(*vt)
        self.itl: Any = m.itl.labels(*vt)
        self.e2e: Any = m.e2e.labels(*vt)
        self.request_acceptance_rate: Any = m.request_acceptance_rate.labels(*vt)


class ExporterMetrics:
    def __init__(self, registry: CollectorRegistry, cfg: ExporterConfig) -> None:
        self.registry = registry
        vt = ("variant", "task")
        self.requests = Counter(declared(F.requests), "Requests through the tap by outcome.", [*vt, "outcome"],
                                registry=registry)
        self.missing = Counter(declared(F.spec_metrics_missing),
                               "ok responses without metrics.speculative_decoding.", vt, registry=registry)
        self.steps = Counter(declared(F.spec_steps), "Verify steps with a draft (sum of R).", vt, registry=registry)
        self.steps_without_per_step = Counter(
            declared(F.steps_without_per_step), "Verify steps of requests whose field had no per-step arrays "
            "(vLLM's summary mode): while it grows, acceptance of drafts that reached a position is not recorded.",
            vt, registry=registry)
        self.draft_tokens = Counter(declared(F.draft_tokens), "Draft tokens proposed (sum of D).", vt,
                                    registry=registry)
        self.accepted = Counter(declared(F.accepted), "Draft tokens accepted (sum of C).", vt,
                                registry=registry)
        self.per_pos = Counter(declared(F.accepted_per_pos),
                               "Steps that accepted at least position+1 drafts (as vLLM's per-position counter).",
                               [*vt, "position"], registry=registry)
        self.drafts_reaching = Counter(
            declared(F.drafts_reaching), "Verify steps whose draft had at least position+1 tokens (vLLM's "
            "detailed mode, per_step_drafted; the denominator of acceptance of drafts that reached a position).",
            [*vt, "position"], registry=registry)
        self.full_depth_steps = Counter(declared(F.full_depth_steps),
                                        "Verify steps whose draft had all k tokens (detailed mode).", vt,
                                        registry=registry)
        self.full_depth_per_pos = Counter(declared(F.full_depth_per_pos),
                                          "Full-depth verify steps (drafted k) that accepted at least position+1 "
                                          "drafts (detailed mode).", [*vt, "position"], registry=registry)
        self.by_accepted = Counter(declared(F.spec_steps_by_accepted),
                                   "Verify steps by the number of drafts they accepted (the summed histogram).",
                                   [*vt, "accepted"], registry=registry)
        self.decode_steps = Counter(declared(F.decode_steps),
                                    "Decode steps, with or without a draft: completion tokens - 1 - C, at least R.",
                                    vt, registry=registry)
        self.prompt_tokens = Counter(declared(F.prompt_tokens), "Prompt tokens (usage).", vt, registry=registry)
        self.completion_tokens = Counter(declared(F.completion_tokens), "Completion tokens (usage).", vt,
                                         registry=registry)
        self.ttft = Histogram(F.ttft, "Time to the first token-carrying chunk, at the tap.", vt,
                              buckets=LATENCY_BUCKETS, registry=registry)
        self.tpot = Histogram(F.tpot, "Per request: (last token time - first) / (tokens - 1).",
                              vt, buckets=LATENCY_BUCKETS, registry=registry)
        self.itl = Histogram(F.itl, "Time between streamed token-carrying chunks.", vt,
                             buckets=LATENCY_BUCKETS, registry=registry)
        self.e2e = Histogram(F.e2e, "Request start to the end of the response, at the tap.", vt,
                             buckets=E2E_BUCKETS, registry=registry)
        self.request_acceptance_rate = Histogram(F.request_acceptance_rate,
                                                 "Per-request draft acceptance rate C / D (requests with D > 0).",
                                                 vt, buckets=RATE_BUCKETS, registry=registry)
        self.upstream_up = Gauge(F.upstream_up, "1 when the upstream answered its last health probe with "
                                 "200, or 404 (no health endpoint: judged by its requests).",
                                 ["variant"], registry=registry, multiprocess_mode="mostrecent")
        self.upstream_version = Gauge(F.upstream_version,
                                      "1 for the version the upstream's GET /version answered (vLLM's {\"version\": "
                                      "...}) while it is up; 0 for one it answered before a restart.",
                                      ["variant", "version"], registry=registry, multiprocess_mode="mostrecent")
        self.probe_errors = Counter(declared(F.probe_errors), "Failed upstream health probes.",
                                    ["variant"], registry=registry)
        self.upstream_routable = Gauge(F.upstream_routable,
                                       "1 while the variant takes its share of the split; 0 while it is known down "
                                       "and its share goes to the others (`availability`).", ["variant"],
                                       registry=registry, multiprocess_mode="livemin")
        self.rerouted = Counter(declared(F.rerouted), "Requests the split gave to `from`, forwarded to `to` because "
                                "`from` was known down.", ["from", "to"], registry=registry)
        self.mirror_outputs = Counter(declared(F.mirror_outputs),
                                      "Mirrored greedy requests whose output matched the primary's.",
                                      [*vt, "result"], registry=registry)
        self.canary_verdict = Gauge(F.canary_verdict,
                                    "1 for the last verdict `specwatch canary` pushed for the task, 0 for the others.",
                                    ["task", "verdict"], registry=registry, multiprocess_mode="mostrecent")
        self.canary_score = Gauge(F.canary_score, "The last canary score pushed for the task, 0..100.",
                                  ["task"], registry=registry, multiprocess_mode="mostrecent")
        self.fast_relay_chunks = Counter(declared(F.fast_relay_chunks),
                                         "Content chunks relayed by the compiled relay thread (the rest: in Python).",
                                         registry=registry)
        self.fast_relay_handovers = Counter(declared(F.fast_relay_handovers),
                                            "Streams handed to the compiled relay thread (one stream may be handed "
                                            "over again after a chunk it does not take).", registry=registry)
        self.fast_relay_ends = Counter(declared(F.fast_relay_ends),
                                       "Streams whose last events and end of body the relay thread wrote, counted "
                                       "by the tap just after (one process, no event log).", registry=registry)
        self.relay = Gauge(F.relay, "1 for the relay that carries ordinary content chunks: compiled (the "
                           "relay thread) or python.", ["relay"], registry=registry, multiprocess_mode="max")
        self._positions: dict[tuple[str, str, int], PositionChildren] = {}
        self._children: dict[tuple[str, str], Children] = {}
        for task in cfg.task_labels:  # all 0 until a canary pushes a verdict
            for verdict in CANARY_VERDICTS:
                self.canary_verdict.labels(task, verdict)
        for variant in cfg.upstreams:
            if cfg.health_path is not None:  # no probe, no probe series (an alert on `up == 0` stays quiet)
                self.upstream_up.labels(variant)
                self.probe_errors.labels(variant)
            for other in cfg.upstreams:
                if other != variant:  # every pair at 0 (the mirror's too: never rerouted, shown so)
                    self.rerouted.labels(variant, other)
            for task in cfg.task_labels:
                for outcome in OUTCOMES:
                    self.requests.labels(variant, task, outcome)
                for family in (self.missing, self.steps, self.steps_without_per_step, self.draft_tokens,
                               self.accepted, self.decode_steps, self.prompt_tokens, self.completion_tokens,
                               self.ttft, self.tpot, self.itl, self.e2e, self.request_acceptance_rate):
                    family.labels(variant, task)
                if variant == cfg.mirror:
                    for result in ("identical", "different"):
                        self.mirror_outputs.labels(variant, task, result)

    def of(self, variant: str, task: str) -> Children:
        """The cached children of (variant, task) (variant and task are bounded: the configured names)."""
        try:
            return self._children[variant, task]
        except KeyError:
            child = self._children[variant, task] = Children(self, variant, task)
            return child

    def ensure_positions(self, variant: str, task: str, k: int) -> PositionChildren:
        """Pre-create position and histogram children once a variant's k is known (at most MAX_K: parse checks);
        returns them, cached. The detailed-mode families are created with the others: at 0 where the server
        runs `summary`, which a panel reads as "no per-step data" (their position 0 stays 0 while steps grow)."""
        try:
            return self._positions[variant, task, k]
        except KeyError:
            pass
        vt = (variant, task)
        out = PositionChildren([self.by_accepted.labels(*vt, str(a)) for a in range(k + 1)],
                               [self.per_pos.labels(*vt, str(p)) for p in range(k)],
                               [self.drafts_reaching.labels(*vt, str(p)) for p in range(k)],
                               [self.full_depth_per_pos.labels(*vt, str(p)) for p in range(k)],
                               self.full_depth_steps.labels(*vt))
        self._positions[variant, task, k] = out
        return out
