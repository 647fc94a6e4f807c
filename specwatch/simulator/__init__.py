"""A stand-in for `vllm serve` 0.32.0: same argv, HTTP API and /metrics families, GPU-like timing."""
