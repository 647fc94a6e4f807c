"""Start, wait for and stop the real `vllm serve` 0.32.0 of the CPU environment.

`serve_argv` is the one place the article's common flags live, so the argv printed here
runs unchanged with `vllm serve` on a GPU host (minus `--enforce-eager`, a CPU start-up
shortcut). `VllmServer` runs one server through `specwatch.supervisor`: start, health wait, log file, stop.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from specwatch.config import Home
from specwatch.models.dtype import host_cpu_dtype
from specwatch.supervisor import Supervisor, log_tail

ENTRY = Path(__file__).with_name("vllm_entry.py")
SERVED_MODEL_NAME = "spec-demo"

# The article's common flags (PLAYBOOK §1) that apply on CPU; GPU-only sizing flags
# (--gpu-memory-utilization, --tensor-parallel-size) are left to the GPU backends.
# `--max-num-seqs` follows `--max-model-len` (serve_argv's `max_num_seqs`: 16 unless the caller needs another batch).
COMMON_FLAGS: tuple[str, ...] = (
    "--served-model-name", SERVED_MODEL_NAME,
    "--max-model-len", "4096",
    "--max-num-batched-tokens", "4096",
    "--no-enable-prefix-caching",
    "--generation-config", "vllm",
    "--seed", "42",
)
DEFAULT_MAX_NUM_SEQS = 16
# CPU-only: no graph capture halves start-up (about 30 s instead of 60 s here).
CPU_FLAGS: tuple[str, ...] = ("--enforce-eager",)

# The article's n-gram variant.
NGRAM_CONFIG: dict[str, object] = {
    "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4,
}


class ServerError(RuntimeError):
    """The server failed to start or stopped early; the message carries the log tail."""


def serve_argv(
    model: Path | str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    speculative_config: Mapping[str, object] | None = None,
    per_request_metrics: str = "detailed",
    dtype: str | None = None,
    max_num_seqs: int | None = DEFAULT_MAX_NUM_SEQS,
    extra: Sequence[str] = (),
) -> list[str]:
    """`vllm serve` arguments (after the word `serve`) for one variant of the study.

    `dtype` None picks what this CPU computes fastest (`host_cpu_dtype`); `max_num_seqs` None leaves the batch
    size to `extra` (or to vLLM's default).
    """
    common = list(COMMON_FLAGS)
    if max_num_seqs is not None:
        at = common.index("--max-model-len") + 2
        common[at:at] = ["--max-num-seqs", str(max_num_seqs)]
    argv = [str(model), "--host", host, "--port", str(port), *common, "--dtype", dtype or host_cpu_dtype(), *CPU_FLAGS]
    if speculative_config is not None:
        argv += ["--speculative-config", json.dumps(dict(speculative_config), separators=(",", ":"))]
        # Only valid with a speculative config: vLLM refuses to start otherwise.
        argv += ["--per-request-spec-decode-metrics", per_request_metrics]
    return argv + list(extra)


def server_environment(base: Mapping[str, str], kv_cache_gib: int = 1) -> dict[str, str]:
    """The environment vLLM's CPU build needs: without a KV cache size its memory check fails.

    `VLLM_ENABLE_V1_MULTIPROCESSING=0`: the engine process runs the model itself instead of spawning a
    worker process that imports vLLM and torch once more (the CPU platform forces that `mp` executor
    otherwise, even for one worker). Measured on this 2-core machine with the n-gram server: start to
    healthy 36-38 s instead of 46-60 s, the same decode speed, and the same per-request and `/metrics`
    spec-decode counts. The API server still runs the engine in its own process.
    """
    env = dict(base)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "auto")
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    return env


@dataclass
class VllmServer:
    """One real vLLM server process group, with its log file; a context manager."""

    home: Home
    args: list[str]
    port: int
    log_path: Path
    host: str = "127.0.0.1"
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    startup_seconds: float | None = None
    _proc: Supervisor | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [str(self.home.vllm_python), str(ENTRY), "serve", *self.args]

    @property
    def pid(self) -> int | None:
        """The process group leader while running."""
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout: float = 300.0) -> VllmServer:
        if not self.home.vllm_python.exists():
            raise ServerError(
                f"no vLLM CPU environment at {self.home.vllm_env}: run `specwatch vllm-cpu setup`")
        # SIGINT: vLLM's own Ctrl+C path stops its engine processes; the whole group gets SIGKILL after the grace
        self._proc = Supervisor("vLLM", self.command(), self.log_path, self.url + "/health",
                                env=server_environment(self.environ), stop_signal=signal.SIGINT, grace=20.0,
                                error=ServerError)
        started = time.monotonic()
        self._proc.start(timeout)
        self.startup_seconds = time.monotonic() - started
        return self

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def stop(self, grace: float = 20.0) -> None:
        """Stop the whole process group (vLLM spawns engine processes); never leaves one behind."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.stop(grace)

    def __enter__(self) -> VllmServer:
        return self.start() if self._proc is None else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
