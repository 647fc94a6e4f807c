"""The latency and capacity dashboard: what speculation costs or buys in TTFT / TPOT / ITL, throughput, memory."""

from __future__ import annotations

from specwatch.grafana.board import Dashboard, Section
from specwatch.grafana.panels import (
    BY_VT,
    COUNT,
    GREEN,
    ORANGE,
    RATIO,
    RED,
    REQ_PER_S,
    SECONDS,
    TOKENS_PER_S,
    VM,
    VT,
    Json,
    V,
    per_variant_task,
    stat,
    table,
    targets,
    thresholds,
    timeseries,
)
from specwatch.monitoring import MONITORING, in_words, percent
from specwatch.promconfig.rules import record_metric

S, A = MONITORING, MONITORING.alerts
UID = "specwatch-latency"
LIVE = S.fast.rate
QUANTILE_LEGEND = "p{{quantile}} {{variant}}"


def _client(metric: str, title: str, what: str) -> Json:
    return timeseries(f"{title} p50 / p95 / p99 (client side)", what + " Measured at the exporter, as the client "
                      "sees it, per variant and task over the last minute (histogram_quantile of the "
                      "exporter's histogram; no line where the window had no requests).",
                      targets((f"variant_task_quantile:{metric}:histogram_quantile_{LIVE}{{{VT}}}",
                               QUANTILE_LEGEND + " · {{task}}")), SECONDS, w=8, min_=0)


def _server(metric: str, title: str, what: str) -> Json:
    return timeseries(f"{title} p50 / p95 / p99 (server side)", what + " From vLLM's own histogram per variant "
                      "(summed over engines), over the last minute: the server's view, without network and "
                      "exporter time.",
                      targets((f"variant_quantile:{metric}:histogram_quantile_{LIVE}{{{V}}}", QUANTILE_LEGEND)),
                      SECONDS, w=8, min_=0)


def _latency() -> list[Section]:
    ttft = "Time to first token: queueing plus prefill; speculation should not change it much."
    tpot = "Time per output token after the first: where speculation pays (fewer engine steps per token)."
    itl = ("Inter-token latency: time between streamed chunks. With speculation one chunk carries several "
           "tokens, so ITL grows while TPOT falls.")
    return [
        Section("Client side (exporter, per task and variant)", [
            _client(S.exporter.ttft, "TTFT", ttft), _client(S.exporter.tpot, "TPOT", tpot),
            _client(S.exporter.itl, "ITL", itl)]),
        Section("Server side (vLLM, per variant)", [
            _server(record_metric(S.vllm.ttft), "TTFT", ttft),
            _server(record_metric(S.vllm.tpot), "TPOT", tpot),
            _server(record_metric(S.vllm.itl), "ITL", itl)]),
    ]


def _throughput() -> Section:
    return Section("Throughput", [
        timeseries("Output tokens per second", "Generated tokens per second: the exporter's per variant and task "
                   "(usage.completion_tokens of the responses it relayed) and vLLM's own per variant (all "
                   "traffic). Under a fixed concurrency, higher is better.",
                   targets((f"variant_task:specwatch_completion_tokens:{LIVE}{{{VT}}}", "exporter " + BY_VT),
                           (f"variant:vllm_generation_tokens:{LIVE}{{{V}}}", "vLLM {{variant}}")),
                   TOKENS_PER_S, w=8, min_=0),
        timeseries("Per-stream speed", "Output tokens per second of request time (completion tokens / summed "
                   "end-to-end seconds), per variant and task: the speed one client sees, independent of how much "
                   "traffic the variant gets.",
                   per_variant_task(f"specwatch_output_tokens_per_request_second:ratio_{LIVE}"),
                   TOKENS_PER_S, w=8, min_=0),
        timeseries("Requests per second", "Requests through the exporter per variant and task (every outcome), and "
                   "requests vLLM finished per variant and finish reason (filtered by model).",
                   targets((f"variant_task:specwatch_requests:{LIVE}{{{VT}}}", "exporter " + BY_VT),
                           (f"sum by (variant, finished_reason) (rate({S.vllm.request_success}{{{VM}}}"
                            "[$__rate_interval]))", "vLLM {{variant}} {{finished_reason}}")),
                   REQ_PER_S, w=8, min_=0),
    ])


def _capacity() -> Section:
    kv_full = A.kv_cache_full.level
    return Section("Capacity (vLLM, per variant)", [
        timeseries("Running and waiting requests", "Requests in the running batch and waiting to be scheduled, "
                   "summed over engines. Waiting above 0 for long means the server is saturated at this "
                   "concurrency; the breakdown by reason (filtered by model) says why.",
                   targets(("variant:vllm_num_requests_running:sum{" + V + "}", "running {{variant}}"),
                           ("variant:vllm_num_requests_waiting:sum{" + V + "}", "waiting {{variant}}"),
                           (f"sum by (variant, reason) (vllm:num_requests_waiting_by_reason{{{VM}}})",
                            "waiting {{variant}} ({{reason}})")), COUNT, w=8, min_=0, decimals=0),
        timeseries("KV cache usage", "KV cache usage of the fullest engine per variant (0..100 %). A draft model "
                   f"shares the memory, so a speculative variant has fewer blocks and fills sooner; above "
                   f"{percent(kv_full)} for {in_words(A.kv_cache_full.for_)} fires {A.kv_cache_full.name}.",
                   targets(("variant:vllm_kv_cache_usage_perc:max{" + V + "}", "{{variant}}")), RATIO, w=8,
                   min_=0, max_=1, steps=thresholds(GREEN, (0.75, ORANGE), (kv_full, RED))),
        timeseries("Preemptions per second", "Requests the scheduler preempted (evicted from the KV cache and "
                   f"recomputed later) per second, per variant. Anything above {A.preemptions.level:g} for "
                   f"{in_words(A.preemptions.for_)} fires {A.preemptions.name}: the cache is too small for the load.",
                   targets((f"variant:vllm_num_preemptions:{LIVE}{{{V}}}", "{{variant}}")), REQ_PER_S, w=8, min_=0),
        table("KV cache blocks per variant", "vLLM's cache_config_info labels per variant and engine: num_gpu_blocks "
              "is the KV capacity left after weights (and a draft model) are loaded; compare a speculative "
              "variant with the baseline to see the capacity the draft costs. kv_cache_max_concurrency is how many "
              "max-length requests fit.",
              f"max by (variant, engine, num_gpu_blocks, block_size, kv_cache_size_tokens, kv_cache_max_concurrency) "
              f"(vllm:cache_config_info{{{V}}})",
              {"variant": "Variant", "engine": "Engine", "num_gpu_blocks": "num_gpu_blocks",
               "block_size": "Block size", "kv_cache_size_tokens": "KV tokens",
               "kv_cache_max_concurrency": "Max concurrency"}, w=12),
        timeseries("Server queue time p95", "95th percentile of the time requests waited in vLLM's queue before "
                   "scheduling, per variant (raw histogram, filtered by model). Rising queue time with flat TPOT "
                   "means more concurrency than the batch can hold.",
                   targets(("histogram_quantile(0.95, sum by (variant, le) (rate(vllm:request_queue_time_seconds_"
                            f"bucket{{{VM}}}[$__rate_interval])))", "{{variant}}")), SECONDS, w=12, min_=0),
    ])


def _errors() -> Section:
    return Section("Errors", [
        timeseries("Error ratio", "Upstream errors and malformed responses / all requests through the exporter, "
                   f"per variant and task ({S.fast.duration}). Client aborts and rejected requests are not errors of "
                   "the server.",
                   per_variant_task(f"specwatch_error:ratio_{LIVE}"),
                   RATIO, w=16, min_=0, steps=thresholds(GREEN, (0.01, ORANGE), (0.05, RED))),
        stat("Upstream health", "The exporter's periodic /health probe of each variant: UP or DOWN (DOWN for "
             f"{in_words(A.upstream_down.for_)} fires {A.upstream_down.name} and requests to it fail with 502).",
             targets((f"{S.exporter.upstream_up}{{{V}}}", "{{variant}}")), COUNT, w=8, h=8,
             steps=thresholds(RED, (1, GREEN)),
             mappings=[{"type": "value", "options": {"0": {"text": "DOWN", "color": RED, "index": 0},
                                                      "1": {"text": "UP", "color": GREEN, "index": 1}}}]),
    ])


def dashboard() -> Dashboard:
    return Dashboard(UID, "specwatch / Latency and capacity",
                     "TTFT / TPOT / ITL quantiles at the client (exporter) and the server (vLLM), throughput, "
                     "batch and KV cache capacity, preemptions and errors, per variant and task.",
                     [*_latency(), _throughput(), _capacity(), _errors()])
