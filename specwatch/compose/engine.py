"""A Docker engine to run the stack on: the one that answers, else a private `dockerd` started here.

The private engine keeps everything of its own under one folder (data root, exec root, socket, pid file,
log), by default $SPECWATCH_HOME/docker, so the host's /var/lib/docker and /var/run/docker.sock are never
touched and its layers are reused by the next run on the same machine. Starting it needs root.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from specwatch.compose.docker_cli import DockerError, docker_binary


@dataclass
class DockerEngine:
    """An engine and the environment that reaches it (DOCKER_HOST); `proc` only when started here."""

    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None

    def stop(self, timeout: float = 60) -> None:
        """Stop the engine if it was started here (its containers stop with it); a no-op otherwise."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def answers(env: Mapping[str, str], timeout: float = 20) -> bool:
    try:
        return subprocess.run([docker_binary(), "info", "--format", "{{.ServerVersion}}"], env=dict(env),
                              capture_output=True, timeout=timeout, check=False).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def private_host(state: Path) -> str:
    return f"unix://{state / 'docker.sock'}"


def obtain(state: Path, environ: Mapping[str, str], *, start_timeout: float = 90, niceness: int = 0) -> DockerEngine:
    """The engine of DOCKER_HOST (or the default socket) when it answers, else the private one under
    `state` when it already runs, else a private dockerd started now and waited for. A private dockerd
    started with `niceness` > 0 runs under `nice`, and so does every build step and container it starts."""
    base = dict(environ)
    if answers(base):
        return DockerEngine(base)
    env = {**base, "DOCKER_HOST": private_host(state)}
    if answers(env):
        return DockerEngine(env)
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise DockerError("no Docker engine answers and there is no `dockerd`: "
                          "apt-get install --no-install-recommends docker.io (as root)")
    if os.geteuid() != 0:
        raise DockerError("no Docker engine answers, and starting a private dockerd needs root")
    state.mkdir(parents=True, exist_ok=True)
    (state / "docker.sock").unlink(missing_ok=True)
    log = state / "dockerd.log"
    nice = ["nice", "-n", str(niceness)] if niceness > 0 else []
    proc = subprocess.Popen(
        [*nice, dockerd, "--data-root", str(state / "data"), "--exec-root", str(state / "exec"),
         "--pidfile", str(state / "dockerd.pid"), "--host", private_host(state)],
        stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
    engine = DockerEngine(env, proc)
    deadline = time.monotonic() + start_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            raise DockerError(f"dockerd exited {proc.returncode} at start; {log}:\n{tail}")
        if answers(env, timeout=5):
            return engine
        time.sleep(1)
    engine.stop()
    raise DockerError(f"dockerd did not answer within {start_timeout:.0f} s; see {log}")
