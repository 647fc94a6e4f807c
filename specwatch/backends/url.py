"""The `url` backend: a vLLM server already running at a URL, measured as it is and never started or stopped.

What the server runs (its model, its speculative config) is the server's own: the plan's variant says what it
is for the record and the report, and nothing the plan would pass to `vllm serve` reaches it. `stop` leaves the
server up and says so. `specwatch check-server --url` is a one-variant plan on this backend.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from specwatch.backends.base import BackendError, HealthCheck, Launch, healthy_or_stopped, wait_http_health

HEALTH_SECONDS = 15.0  # a server already running answers /health at once; a plan's startup_timeout is for a start


def server_url(text: str) -> str:
    """`http(s)://HOST[:PORT][/PATH]` without a trailing slash; BackendError for anything else (no credentials:
    they would be written into the run's records)."""
    parts = urlsplit(text)
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok or parts.query or parts.fragment:
        raise BackendError(f"{text!r}: expected a server URL such as http://127.0.0.1:8000 (no query or fragment)")
    if parts.username or parts.password:
        raise BackendError("the server URL carries credentials, which would be written into the run's records; "
                           "give the URL without them")
    return text.rstrip("/")


@dataclass
class UrlServer:
    """The running server at `url`; the log file only notes that its own log is elsewhere."""

    url: str
    log_path: Path

    def died(self) -> str | None:
        """Why waiting for its health is pointless: nothing listens there (a server that is slow to answer is
        waited for, up to HEALTH_SECONDS)."""
        parts = urlsplit(self.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            with socket.create_connection((parts.hostname or "", port), timeout=2.0):
                return None
        except ConnectionRefusedError:
            return f"nothing listens at {self.url}: `kind: url` measures a server that is already running"
        except OSError:
            return None  # a timeout or an unreachable route: the health wait's own timeout says so

    def stop(self) -> dict[str, object]:
        return {"external": True, "left_running": self.url}


@dataclass
class UrlBackend:
    url: str
    health: HealthCheck = wait_http_health
    kind: str = "url"

    def address(self, launch: Launch) -> str:
        return self.url

    def command_line(self, launch: Launch) -> list[str]:
        return []  # nothing is run

    def start(self, launch: Launch) -> UrlServer:
        launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        launch.log_path.write_text(f"a server already running at {self.url}: its log is its own\n")
        server = UrlServer(self.url, launch.log_path)
        return healthy_or_stopped(server, self.health, min(launch.timeout, HEALTH_SECONDS), server.died)

    def help_text(self) -> str | None:
        return None  # its `vllm serve --help` is the server host's

    def describe(self) -> dict[str, object]:
        return {"kind": self.kind, "url": self.url}


def url_backend(url: str | None, health: HealthCheck = wait_http_health) -> UrlBackend:
    if url is None:
        raise BackendError("a `url` backend needs the server's url")
    return UrlBackend(server_url(url), health)
