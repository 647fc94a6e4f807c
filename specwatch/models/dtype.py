"""The dtype this CPU computes a model fastest in: the CPU server serves in it and the EAGLE-3 trainer computes its
training data in it, so the head learns from the hidden states the server will hand it."""

from __future__ import annotations

import functools
from pathlib import Path


def cpu_dtype(cpuinfo: str) -> str:
    """The article's bfloat16 where the CPU computes it natively, else float32.

    Measured on a 2-core AVX2-only EPYC: oneDNN cannot build a bf16 matmul there ("fallback to
    torch linear") and SmolLM2 with n-gram ran 2.4 times faster in float32 (112 s vs 264 s for
    the demo's 16 requests), and the EAGLE-3 trainer's cut-head test (20 prompts answered and read) took 33 s
    against 96 s (docs/vllm-cpu.md). AVX-512 machines with bf16 keep the article's dtype.
    """
    flags = set(cpuinfo.split())
    return "bfloat16" if flags & {"avx512_bf16", "amx_bf16"} else "float32"


@functools.cache
def host_cpu_dtype() -> str:
    try:
        return cpu_dtype(Path("/proc/cpuinfo").read_text())
    except OSError:
        return "bfloat16"
