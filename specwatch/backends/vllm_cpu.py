"""The `vllm_cpu` backend: the real vLLM 0.32.0 CPU build of `specwatch vllm-cpu setup`, as a process group.

The command and environment are `specwatch.vllm_cpu.server`'s (its entry script, which works around
the `vllm-cpu` console-script trap, and `VLLM_CPU_KVCACHE_SPACE`); the arguments are the plan's.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from specwatch.backends.base import BackendError, HealthCheck, Launch, wait_http_health
from specwatch.backends.process import ProcessBackend, ProcessServer
from specwatch.config import Home
from specwatch.vllm_cpu.server import ENTRY, server_environment

_FREEZE = ("import importlib.metadata as m, json; "
           "print(json.dumps(sorted(f\"{d.metadata['Name']}=={d.version}\" for d in m.distributions())))")


@dataclass
class VllmCpuBackend(ProcessBackend):
    home: Home | None = None

    def start(self, launch: Launch) -> ProcessServer:
        if self.home is not None and not self.home.vllm_python.exists():
            raise BackendError(f"no vLLM CPU environment at {self.home.vllm_env}: run `specwatch vllm-cpu setup`")
        return super().start(launch)

    def describe(self) -> dict[str, object]:
        record = super().describe()
        try:  # the environment's `pip freeze`, as the article asks
            done = subprocess.run([self.command[0], "-c", _FREEZE], capture_output=True, text=True, timeout=60)
            record["packages"] = json.loads(done.stdout) if done.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, ValueError):
            record["packages"] = None
        return record


def vllm_cpu_backend(home: Home, environ: Mapping[str, str], kv_cache_gib: int = 1,
                     health: HealthCheck = wait_http_health) -> VllmCpuBackend:
    return VllmCpuBackend((str(home.vllm_python), str(ENTRY), "serve"), server_environment(environ, kv_cache_gib),
                          (), health, kind="vllm_cpu", help_timeout=240.0, home=home)
