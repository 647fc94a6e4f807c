"""KV capacity of the simulated GPU: how many blocks fit beside the weights (and a draft model's).

An H200 (141 GB): the KV budget is `gpu_memory_utilization` of it minus the target's bf16
weights (Qwen3-8B, 16.4 GB), a drafter's weights, and an activation reserve. A block holds
`block_size` tokens of every attention layer that shares the pool, so a draft model (its
own layers) makes every token dearer: the capacity a draft model costs, visible in
`vllm:cache_config_info{num_gpu_blocks}` as on the real server.
"""

from __future__ import annotations

GPU_MEMORY = {"h200": 141 * 10 ** 9, "h100": 80 * 10 ** 9}
TARGET_WEIGHTS = 16.4 * 10 ** 9
ACTIVATION_RESERVE = 2 * 10 ** 9
# bytes per token of KV: layers x kv_heads x head_dim x (k, v) x 2 bytes
TARGET_KV_PER_TOKEN = 36 * 8 * 128 * 2 * 2
DRAFTER = {  # method -> (weights, KV bytes per token)
    "draft_model": (1.2 * 10 ** 9, 28 * 8 * 128 * 2 * 2),
    "eagle": (0.8 * 10 ** 9, 1 * 8 * 128 * 2 * 2),
    "eagle3": (0.8 * 10 ** 9, 1 * 8 * 128 * 2 * 2),
    "mtp": (0.4 * 10 ** 9, 1 * 8 * 128 * 2 * 2),
}


def num_gpu_blocks(gpu: str, gpu_memory_utilization: float, block_size: int, method: str | None) -> int:
    if gpu not in GPU_MEMORY:
        raise ValueError(f"unknown --sim-gpu {gpu!r}; expected one of {sorted(GPU_MEMORY)}")
    weights, draft_kv = DRAFTER.get(method or "", (0.0, 0))
    budget = GPU_MEMORY[gpu] * gpu_memory_utilization - TARGET_WEIGHTS - weights - ACTIVATION_RESERVE
    return max(int(budget // (block_size * (TARGET_KV_PER_TOKEN + draft_kv))), 0)
