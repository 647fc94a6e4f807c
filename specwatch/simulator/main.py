"""`specwatch sim`: parse `vllm serve`-style argv, build the engine, metrics and API, and serve."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import signal
import sys
from collections.abc import Sequence

from aiohttp import web
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

from specwatch.simulator.args import SimArgs, parse_sim_args
from specwatch.simulator.capacity import num_gpu_blocks
from specwatch.simulator.engine import Engine, EngineConfig
from specwatch.simulator.metrics import VllmMetrics
from specwatch.simulator.server import VERSION, ApiConfig, SimApi
from specwatch.simulator.spec_config import SpecConfigError

log = logging.getLogger("specwatch.sim")
DEFAULT_MAX_MODEL_LEN = 8192


def cache_config_labels(args: SimArgs, blocks: int, max_model_len: int) -> dict[str, str]:
    """`vllm:cache_config_info` labels: every CacheConfig field, as str(value), in definition order."""
    tokens = blocks * args.block_size
    return {
        "block_size": str(args.block_size), "user_specified_block_size": "False", "kv_cache_layout": "None",
        "prefix_match_unit": "None", "gpu_memory_utilization": str(args.gpu_memory_utilization),
        "cache_dtype": "auto", "is_attention_free": "False",
        "num_gpu_blocks_override": str(args.num_gpu_blocks_override), "sliding_window": "None",
        "enable_prefix_caching": "False", "prefix_caching_hash_algo": "sha256",
        "prefix_cache_retention_interval": "0", "kv_cache_dtype_skip_layers": "[]",
        "mamba_page_size_padded": "None", "skip_page_size_padded": "None", "mamba_block_size": "None",
        "mamba_cache_dtype": "auto", "mamba_ssm_cache_dtype": "auto", "mamba_cache_mode": "none",
        "enable_mamba_shared_prefix_checkpoint": "False", "replayssm_buffer_len": "16", "use_replayssm": "False",
        "use_kda_recoverssm": "False", "num_gpu_blocks": str(blocks), "num_cpu_blocks": "None",
        "effective_attention_block_size": str(args.block_size), "kv_cache_size_tokens": str(tokens),
        "kv_cache_max_concurrency": str(tokens / max_model_len), "hash_block_size": "None",
        "cache_hit_alignment_tokens": "None", "kv_sharing_fast_prefill": "False", "swa_bounded_replay": "True",
        "kv_cache_memory_bytes": "None", "kv_offloading_size": "None", "kv_offloading_backend": "native",
        "_block_size_resolved": "True",
    }


def build(args: SimArgs) -> tuple[SimApi, Engine]:
    method = args.speculative.method if args.speculative else None
    blocks = args.sim.kv_blocks or args.num_gpu_blocks_override or num_gpu_blocks(
        args.sim.gpu, args.gpu_memory_utilization, args.block_size, method)
    max_model_len = args.max_model_len or DEFAULT_MAX_MODEL_LEN
    registry = CollectorRegistry()
    for collector in (ProcessCollector, PlatformCollector, GCCollector):  # as vLLM's default registry: process_*,
        collector(registry=registry)  # python_info, python_gc_* (process_start_time_seconds tells a restart)
    metrics = VllmMetrics(registry, args.served_model_names[0], max_model_len,
                          args.speculative.num_speculative_tokens if args.speculative else None,
                          cache_config_labels(args, blocks, max_model_len))
    engine = Engine(EngineConfig(
        spec=args.speculative, per_request_spec_metrics=args.per_request_spec_decode_metrics,
        max_num_seqs=args.max_num_seqs, max_model_len=max_model_len, block_size=args.block_size,
        num_blocks=blocks, time_scale=args.sim.time_scale, draft_profile=args.sim.draft_acceptance,
        seed=args.sim.seed if args.seed is None else args.seed), metrics)
    fingerprint = "vllm-" + VERSION + "-" + hashlib.sha256(repr(args).encode()).hexdigest()[:8]
    api = SimApi(ApiConfig(
        served_model_names=args.served_model_names, model_path=args.model, max_model_len=max_model_len,
        per_request_spec_metrics=args.per_request_spec_decode_metrics,
        enable_per_request_metrics=args.enable_per_request_metrics,
        force_include_usage=args.enable_force_include_usage, seed=args.seed, fingerprint=fingerprint),
        engine, registry)
    for flag, value in args.ignored:
        log.info("accepted and ignored (GPU-only): %s %s", flag, value)
    log.info("simulated %s: %d KV blocks of %d tokens, max_num_seqs %d, speculative %s", args.sim.gpu, blocks,
             args.block_size, args.max_num_seqs, method or "off")
    return api, engine


async def serve(args: SimArgs) -> None:
    api, engine = build(args)
    runner = web.AppRunner(api.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    loop_task = asyncio.create_task(engine.run())
    await site.start()
    log.info("specwatch sim (vLLM %s API) on http://%s:%d", VERSION, args.host, args.port)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    loop_task.cancel()
    await runner.cleanup()


def main(argv: Sequence[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        args = parse_sim_args(argv)
    except (SpecConfigError, ValueError) as exc:
        print(f"specwatch sim: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve(args))
    return 0
