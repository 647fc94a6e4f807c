"""The one small interface every backend implements, and the health wait and gone-checks they share.

A backend turns a variant's `vllm serve` arguments (model first, no `--host` / `--port`: the
backend adds where the server listens) into a running server on a loopback port. `start`
returns a `Server` once it answers `/health` (the wait is a pluggable `HealthCheck`), and
`Server.stop` returns only when the server is confirmed gone: its port closed and its process
group dead, or its container removed. Anything else raises `BackendError`.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from specwatch.supervisor import wait_http

HOST = "127.0.0.1"


class BackendError(RuntimeError):
    """A server could not be started, did not become healthy, or could not be confirmed gone."""


@dataclass(frozen=True)
class Launch:
    """What one variant's server needs: its `vllm serve` arguments, a loopback port and a log file."""

    name: str
    args: tuple[str, ...]  # after `vllm serve`, model first, without --host / --port
    port: int
    log_path: Path
    timeout: float = 600.0  # seconds to wait for /health


# (url, deadline as time.monotonic(), a probe returning why the server died, or None while it lives)
HealthCheck = Callable[[str, float, Callable[[], str | None]], None]


def wait_http_health(url: str, deadline: float, died: Callable[[], str | None]) -> None:
    """Poll `GET url/health` until 200; fail early when the server dies, with the probe's reason."""
    if not wait_http(url + "/health", deadline, died, BackendError):
        raise BackendError(f"not healthy at {url} within the timeout")


def port_open(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def wait_port_closed(port: int, seconds: float = 15.0, host: str = HOST) -> bool:
    deadline = time.monotonic() + seconds
    while port_open(port, host):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


class Server(Protocol):
    """A running server: where it answers, where it logs, and how to stop it for good."""

    @property
    def url(self) -> str: ...

    @property
    def log_path(self) -> Path: ...

    def stop(self) -> dict[str, object]:
        """Stop, confirm it is gone (raise BackendError if not), return what was confirmed."""
        ...


class Backend(Protocol):
    """How a vLLM server is obtained."""

    kind: str

    def start(self, launch: Launch) -> Server: ...

    def address(self, launch: Launch) -> str:
        """Where the server of `launch` answers once started (known before it is, for Prometheus's target)."""
        ...

    def help_text(self) -> str | None:
        """`vllm serve --help` as this backend runs it, or None when it cannot give it."""
        ...

    def describe(self) -> dict[str, object]:
        """What to record about this backend in a variant's environment (command, image, ...)."""
        ...

    def command_line(self, launch: Launch) -> list[str]:
        """The full command this backend runs (for the record; the docker one is the container's argv)."""
        ...


ServerT = TypeVar("ServerT", bound=Server)


def healthy_or_stopped(server: ServerT, health: HealthCheck, timeout: float, died: Callable[[], str | None]) -> ServerT:
    """`server` once `health` has seen it answer; stopped first when it dies, times out or is interrupted."""
    try:
        health(server.url, time.monotonic() + timeout, died)
    except BaseException:
        server.stop()
        raise
    return server


def with_listen(args: Sequence[str], host: str, port: int) -> list[str]:
    """The model, then where to listen, then the rest: the order `serve_argv` uses."""
    return [args[0], "--host", host, "--port", str(port), *args[1:]] if args else ["--host", host, "--port", str(port)]
