"""The `docker` backend: the `vllm/vllm-openai` image through the `docker` SDK, one container per variant.

`containers.run` gets the variant's `vllm serve` arguments as the command (the image's
entrypoint is `vllm serve`), a GPU `device_requests` entry, the server port published on
127.0.0.1 only, the Hugging Face cache as a volume (and any local model folder named in the
arguments, read-only at the same path), `ipc_mode="host"` as vLLM's docs ask. Stopping
copies the container's log to the variant's `server.log`, stops and removes the container,
and confirms it: the engine no longer knows the container and the port is closed.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specwatch.backends.base import (
    HOST,
    BackendError,
    HealthCheck,
    Launch,
    healthy_or_stopped,
    wait_http_health,
    wait_port_closed,
    with_listen,
)
from specwatch.supervisor import log_tail

IMAGE = "vllm/vllm-openai:v0.32.0"
CONTAINER_PORT = 8000
HF_CACHE_IN_CONTAINER = "/root/.cache/huggingface"

# The SDK, loaded by name: it ships no type information, and a repository folder named `docker/`
# (Dockerfiles) would shadow it for the type checker.
docker: Any = importlib.import_module("docker")
DeviceRequest: Any = importlib.import_module("docker.types").DeviceRequest


@dataclass(frozen=True)
class DockerSettings:
    image: str = IMAGE
    base_url: str | None = None  # None: the SDK's environment (DOCKER_HOST or the local socket)
    gpus: str | tuple[str, ...] = "all"  # "all", or device ids ("0", "1")
    hf_cache: Path | None = None  # host folder mounted at /root/.cache/huggingface
    environment: Mapping[str, str] = field(default_factory=dict)  # e.g. HF_TOKEN, given by the caller
    shm_size: str | None = None
    stop_timeout: int = 30


def device_requests(gpus: str | tuple[str, ...]) -> list[Any]:
    if gpus == "all":
        return [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    return [DeviceRequest(device_ids=list(gpus), capabilities=[["gpu"]])]


def local_model_volumes(args: Sequence[str]) -> dict[str, dict[str, str]]:
    """Absolute paths in the arguments that exist on this host (model / draft folders), mounted read-only."""
    volumes: dict[str, dict[str, str]] = {}
    for arg in args:
        for candidate in {arg, *(_json_paths(arg))}:
            if candidate.startswith("/") and Path(candidate).is_dir():
                volumes[candidate] = {"bind": candidate, "mode": "ro"}
    return volumes


def _json_paths(arg: str) -> list[str]:
    """`"model":"/path"` inside a --speculative-config value."""
    if not arg.startswith("{"):
        return []
    try:
        value = json.loads(arg)
    except ValueError:
        return []
    return [v for v in value.values() if isinstance(v, str)] if isinstance(value, dict) else []


@dataclass
class DockerServer:
    client: Any  # docker.DockerClient
    container: Any  # docker.models.containers.Container
    port: int
    log_path: Path
    stop_timeout: int = 30

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def died(self) -> str | None:
        try:
            self.container.reload()
        except docker.errors.NotFound:
            return f"container {self.container.id[:12]} disappeared before it was healthy"
        if self.container.status in ("exited", "dead"):
            self._save_log()
            return (f"container {self.container.id[:12]} {self.container.status} before it was healthy; "
                    f"log {self.log_path}:\n{log_tail(self.log_path)}")
        return None

    def _save_log(self) -> None:
        try:
            text = self.container.logs(stdout=True, stderr=True)
        except docker.errors.APIError:
            return
        with self.log_path.open("ab") as f:
            f.write(text if isinstance(text, bytes) else str(text).encode())

    def stop(self) -> dict[str, object]:
        started = time.monotonic()
        cid = self.container.id
        try:
            self.container.stop(timeout=self.stop_timeout)
            self._save_log()
            self.container.remove(v=True, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            raise BackendError(f"container {cid[:12]} could not be stopped and removed: {exc}") from exc
        try:
            self.client.containers.get(cid)
            removed = False
        except docker.errors.NotFound:
            removed = True
        closed = wait_port_closed(self.port)
        if not (removed and closed):
            raise BackendError(f"container {cid[:12]} not confirmed gone: {'removed' if removed else 'still known'}, "
                               f"port {self.port} {'closed' if closed else 'still open'}")
        return {"container": cid, "container_removed": True, "port_closed": True,
                "stop_seconds": round(time.monotonic() - started, 2)}


@dataclass
class DockerBackend:
    settings: DockerSettings = field(default_factory=DockerSettings)
    health: HealthCheck = wait_http_health
    kind: str = "docker"
    _client: Any = None  # docker.DockerClient, made on first use

    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                self._client = (docker.DockerClient(base_url=self.settings.base_url) if self.settings.base_url
                                else docker.from_env())
            except docker.errors.DockerException as exc:
                raise BackendError(f"no Docker engine: {exc}") from exc
        return self._client

    def address(self, launch: Launch) -> str:
        return f"http://{HOST}:{launch.port}"

    def command_line(self, launch: Launch) -> list[str]:
        return with_listen(launch.args, "0.0.0.0", CONTAINER_PORT)

    def run_options(self, launch: Launch) -> dict[str, Any]:
        volumes = local_model_volumes(launch.args)
        if self.settings.hf_cache is not None:
            volumes[str(self.settings.hf_cache)] = {"bind": HF_CACHE_IN_CONTAINER, "mode": "rw"}
        options: dict[str, Any] = {
            "detach": True, "device_requests": device_requests(self.settings.gpus),
            "ports": {f"{CONTAINER_PORT}/tcp": (HOST, launch.port)}, "volumes": volumes, "ipc_mode": "host",
            "environment": dict(self.settings.environment), "labels": {"specwatch.variant": launch.name},
        }
        if self.settings.shm_size:
            options["shm_size"] = self.settings.shm_size
        return options

    def start(self, launch: Launch) -> DockerServer:
        launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        command = self.command_line(launch)
        launch.log_path.write_text(f"+ docker run {self.settings.image} {' '.join(command)}\n")
        try:
            container = self.client.containers.run(self.settings.image, command, **self.run_options(launch))
        except docker.errors.DockerException as exc:
            raise BackendError(f"docker run {self.settings.image}: {exc}") from exc
        server = DockerServer(self.client, container, launch.port, launch.log_path, self.settings.stop_timeout)
        return healthy_or_stopped(server, self.health, launch.timeout, server.died)

    def help_text(self) -> str | None:
        """`vllm serve --help` from the image (a short-lived container, removed afterwards)."""
        try:
            container = self.client.containers.create(self.settings.image, ["--help=all"])
        except (docker.errors.DockerException, BackendError):
            return None
        try:
            container.start()
            container.wait(timeout=300)
            out = container.logs(stdout=True, stderr=False)
            return out.decode(errors="replace") if isinstance(out, bytes) else str(out)
        except (docker.errors.DockerException, OSError):
            return None
        finally:
            try:
                container.remove(force=True)
            except docker.errors.DockerException:
                pass

    def describe(self) -> dict[str, object]:
        record: dict[str, object] = {"kind": self.kind, "image": self.settings.image, "gpus": self.settings.gpus}
        try:
            image = self.client.images.get(self.settings.image)
            record["image_id"] = image.id
            record["repo_digests"] = image.attrs.get("RepoDigests", [])
        except (docker.errors.DockerException, BackendError):
            record["image_id"] = None
        return record
