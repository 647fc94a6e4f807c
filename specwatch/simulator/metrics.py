"""The simulator's `/metrics`: vLLM 0.32.0's families with their exact names, types, labels and buckets.

Registration order, HELP texts, label sets and pre-created children follow the real server
(captured in tests/fixtures/vllm-0.32.0/ and the catalog read from the wheel). Not
reproduced: prometheus-fastapi-instrumentator's `http_*` families (they describe the HTTP
layer, not the engine) and the families that need features the simulator has no notion of
(LoRA, KV connectors, watermarking, tool parsers, `--kv-cache-metrics`).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.gc_collector import GCCollector

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


def request_token_buckets(max_model_len: int) -> list[int]:
    """vLLM's 1-2-5 series capped at max_model_len (buckets.py)."""
    out: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10 ** exponent
            if value > max_model_len:
                return out
            out.append(value)
        exponent += 1


class VllmMetrics:
    """All families for one engine (`engine="0"`) serving `model_name`."""

    def __init__(self, registry: CollectorRegistry, model_name: str, max_model_len: int,
                 num_spec_tokens: int | None, cache_info: dict[str, str]) -> None:
        self.registry = registry
        GCCollector(registry=registry)  # the default registry's order: gc, platform, process
        PlatformCollector(registry=registry)
        ProcessCollector(registry=registry)
        labels = ("model_name", "engine")
        base = {"model_name": model_name, "engine": "0"}
        self._base = base

        def counter(name: str, doc: str, extra: Iterable[str] = ()) -> Counter:
            return Counter(name, doc, [*labels, *extra], registry=registry)

        def gauge(name: str, doc: str, extra: Iterable[str] = ()) -> Gauge:
            return Gauge(name, doc, [*labels, *extra], registry=registry)

        def histogram(name: str, doc: str, buckets: Iterable[float]) -> Histogram:
            return Histogram(name, doc, list(labels), buckets=list(buckets), registry=registry)

        self.spec_enabled = num_spec_tokens is not None
        if num_spec_tokens is not None:
            self.spec_drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.").labels(**base)
            self.spec_draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.").labels(
                **base)
            self.spec_accepted = counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.").labels(
                **base)
            per_pos = counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                              "Accepted tokens per draft position.", ["position"])
            self.spec_per_pos = [per_pos.labels(**base, position=str(p)) for p in range(num_spec_tokens)]
        for name, doc in (
                ("vllm:estimated_flops_per_gpu", "Estimated number of floating point operations per GPU (for Model "
                                                 "Flops Utilization calculations)."),
                ("vllm:estimated_read_bytes_per_gpu", "Estimated number of bytes read from memory per GPU (for Model "
                                                      "Flops Utilization calculations)."),
                ("vllm:estimated_write_bytes_per_gpu", "Estimated number of bytes written to memory per GPU (for Model "
                                                       "Flops Utilization calculations).")):
            counter(name, doc).labels(**base)
        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.").labels(
            **base)
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.").labels(**base)
        by_reason = gauge("vllm:num_requests_waiting_by_reason",
                          "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
                          "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, "
                          "blocked status). Sum of all reasons equals vllm:num_requests_waiting.", ["reason"])
        self.waiting_capacity = by_reason.labels(**base, reason="capacity")
        by_reason.labels(**base, reason="deferred")
        sleep = gauge("vllm:engine_sleep_state",
                      "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
                      "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
                      ["sleep_state"])
        sleep.labels(**base, sleep_state="awake").set(1)
        sleep.labels(**base, sleep_state="weights_offloaded")
        sleep.labels(**base, sleep_state="discard_all")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.").labels(**base)
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "Prefix cache queries, in terms of number of queried tokens.").labels(**base)
        counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.").labels(**base)
        counter("vllm:external_prefix_cache_queries",
                "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number "
                "of queried tokens.").labels(**base)
        counter("vllm:external_prefix_cache_hits",
                "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of "
                "cached tokens.").labels(**base)
        counter("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.").labels(
            **base)
        counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.").labels(**base)
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.").labels(
            **base)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.").labels(**base)
        by_source = counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ["source"])
        self.prompt_tokens_local = by_source.labels(**base, source="local_compute")
        by_source.labels(**base, source="local_cache_hit")
        by_source.labels(**base, source="external_kv_transfer")
        counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).").labels(**base)
        cached_by_source = counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to "
            "DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at "
            "admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.", ["source"])
        for source in ("device", "host", "p2p", "disk", "external_unspecified"):
            cached_by_source.labels(**base, source=source)
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.").labels(
            **base)
        success = counter("vllm:request_success", "Count of successfully processed requests.", ["finished_reason"])
        self.request_success = {r: success.labels(**base, finished_reason=r) for r in FINISHED_REASONS}
        rejections = Counter("vllm:admission_rejections",
                             "Number of admission attempts rejected by a queue limit, by reason.",
                             ["model_name", "reason"], registry=registry)
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            rejections.labels(model_name=model_name, reason=reason)
        token_buckets = request_token_buckets(max_model_len)
        self.request_prompt_tokens = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                               token_buckets).labels(**base)
        self.request_generation_tokens = histogram("vllm:request_generation_tokens",
                                                   "Number of generation tokens processed.",
                                                   token_buckets).labels(**base)
        self.iteration_tokens = histogram("vllm:iteration_tokens_total",
                                          "Histogram of number of tokens per engine_step.",
                                          ITERATION_TOKENS_BUCKETS).labels(**base)
        self.max_num_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.", token_buckets).labels(**base)
        self.params_n = histogram("vllm:request_params_n", "Histogram of the n request parameter.",
                                  PARAMS_N_BUCKETS).labels(**base)
        self.params_max_tokens = histogram("vllm:request_params_max_tokens",
                                           "Histogram of the max_tokens request parameter.",
                                           token_buckets).labels(**base)
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS).labels(**base)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             ITL_BUCKETS).labels(**base)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS).labels(**base)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             REQUEST_LATENCY_BUCKETS).labels(**base)
        self.queue_time = histogram("vllm:request_queue_time_seconds",
                                    "Histogram of time spent in WAITING phase for request.",
                                    REQUEST_LATENCY_BUCKETS).labels(**base)
        self.inference_time = histogram("vllm:request_inference_time_seconds",
                                        "Histogram of time spent in RUNNING phase for request.",
                                        REQUEST_LATENCY_BUCKETS).labels(**base)
        self.prefill_time = histogram("vllm:request_prefill_time_seconds",
                                      "Histogram of time spent in PREFILL phase for request.",
                                      REQUEST_LATENCY_BUCKETS).labels(**base)
        self.decode_time = histogram("vllm:request_decode_time_seconds",
                                     "Histogram of time spent in DECODE phase for request.",
                                     REQUEST_LATENCY_BUCKETS).labels(**base)
        self.request_preemptions = histogram("vllm:request_num_preemptions",
                                             "Histogram of the number of times a request was preempted.",
                                             PREEMPTIONS_BUCKETS).labels(**base)
        self.prefill_kv_computed = histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            token_buckets).labels(**base)
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                     [*cache_info.keys(), "engine"], registry=registry)
        info.labels(**cache_info, engine="0").set(1)

    def observe_spec_step(self, drafted: int, accepted: int) -> None:
        self.spec_drafts.inc()
        self.spec_draft_tokens.inc(drafted)
        if accepted:
            self.spec_accepted.inc(accepted)
        for p in range(accepted):
            self.spec_per_pos[p].inc()
