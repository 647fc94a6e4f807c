"""One compose project under test: `docker compose` as a user runs it, and reads through the published ports.

Each stack is its own compose project (`-p`), on free loopback ports, with the environment a user would put
in .env; Prometheus is published by compose.offline.yaml, vLLM never is (the exporter and Prometheus reach it
on the project's network). Every wait is bounded; a wait that runs out names the service and its last logs.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import requests

from specwatch.compose.docker_cli import compose_command, docker_binary
from specwatch.compose.images import compose_files
from specwatch.net import free_port
from specwatch.vllm_metrics import samples

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")
Sample = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class ComposeStack:
    project: str
    profile: str
    offline: bool
    env: dict[str, str]
    ports: dict[str, int] = field(default_factory=dict)
    up_seconds: float = 0.0  # `up -d --wait` until every service was healthy
    started_at: float = 0.0  # wall clock when `up` was called

    @classmethod
    def create(cls, project: str, profile: str, offline: bool, engine_env: Mapping[str, str],
               settings: Mapping[str, str]) -> ComposeStack:
        ports = {name: free_port() for name in ("exporter", "locust", "prometheus", "grafana", "viewer")}
        env = {**engine_env, "COMPOSE_PROFILES": profile, **{f"{name.upper()}_PORT": str(port)
                                                               for name, port in ports.items()}, **settings}
        return cls(project, profile, offline, env, ports)

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.ports[service]}"

    # --- compose
    def _compose(self, args: tuple[str, ...], timeout: float) -> subprocess.CompletedProcess[str]:
        cmd = [*compose_command(), "--project-directory", str(ROOT), "-p", self.project,
               *compose_files(ROOT, self.offline), "--env-file", str(ROOT / ".env.example"), *args]
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout, check=False)

    def compose(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        try:
            done = self._compose(args, timeout)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"`{' '.join(args)}` still running after {timeout:.0f} s\n{self.logs()}\n"
                                 f"{self.states()}") from exc
        if check and done.returncode != 0:
            # compose's own words and the states last: a CI log is often read from its end
            raise AssertionError(f"`{' '.join(args)}` exited {done.returncode}\n{self.logs()}\n"
                                 f"--- compose's output:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n"
                                 f"{self.states()}")
        return done

    def docker(self, *args: str, timeout: float = 60) -> str:
        done = subprocess.run([docker_binary(), *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        assert done.returncode == 0, f"docker {' '.join(args)}: {done.stderr}"
        return done.stdout

    def logs(self, *services: str, tail: int = 40) -> str:
        done = self._compose(("logs", "--no-color", "--tail", str(tail), *services), 60)
        return f"--- last {tail} log lines of {', '.join(services) or 'every service'}:\n{done.stdout}{done.stderr}"

    def states(self) -> str:
        """Every container of the project, stopped ones included: status, exit code, OOM kill, restarts and its
        last health probes; what says why `up --wait` gave up, beside the logs."""
        ids = self._compose(("ps", "-aq"), 60).stdout.split()
        if not ids:
            return "--- no containers"
        try:
            inspected = self.docker("inspect", *ids)
        except AssertionError as exc:  # a diagnosis that fails says so rather than hide the failure it explains
            return f"--- {exc}"
        lines = ["--- container states:"]
        for found in json.loads(inspected):
            state = found["State"]
            health = state.get("Health") or {}
            lines.append(f"{found['Name'].lstrip('/')}: {state['Status']} exit={state['ExitCode']} "
                         f"oom_killed={state['OOMKilled']} restarts={found['RestartCount']} "
                         f"started={state['StartedAt']} finished={state['FinishedAt']} "
                         f"health={health.get('Status', '-')}")
            for probe in (health.get("Log") or [])[-3:]:
                lines.append(f"    probe {probe['Start']} exit={probe['ExitCode']}: {probe['Output'].strip()[-300:]}")
        return "\n".join(lines)

    def container(self, service: str) -> str:
        out = self.compose("ps", "-q", service).stdout.split()
        assert len(out) == 1, f"{service}: containers {out}"
        return out[0]

    def inspect(self, service: str) -> dict[str, Any]:
        found: list[dict[str, Any]] = json.loads(self.docker("inspect", self.container(service)))
        return found[0]

    def leftovers(self) -> dict[str, list[str]]:
        """Containers, networks and volumes that still carry this project's label."""
        label = f"label=com.docker.compose.project={self.project}"
        return {kind: self.docker(kind, "ls", "-q", "--filter", label).split() if kind != "container"
                else self.docker("container", "ls", "-aq", "--filter", label).split()
                for kind in ("container", "network", "volume")}

    # --- the published ports
    def prometheus(self, query: str, at: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"query": query}
        if at is not None:
            params["time"] = at
        body = requests.get(self.url("prometheus") + "/api/v1/query", params=params, timeout=10).json()
        assert body["status"] == "success", (query, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def prometheus_values(self, query: str, by: str) -> dict[str, float]:
        return {r["metric"].get(by, ""): float(r["value"][1]) for r in self.prometheus(query)}

    def exporter_samples(self) -> Sample:
        return samples(requests.get(self.url("exporter") + "/metrics", timeout=10).text)

    def wait(self, what: str, probe: Callable[[], T | None], timeout: float, services: tuple[str, ...] = (),
             interval: float = 1.0) -> T:
        """probe() until it returns something other than None (exceptions count as not yet)."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            try:
                got = probe()
                if got is not None:
                    return got
            except (requests.RequestException, AssertionError, KeyError, ValueError) as exc:
                last = exc
            time.sleep(interval)
        raise AssertionError(f"{self.project}: {what} not within {timeout:.0f} s (last: {last!r})\n"
                             f"{self.logs(*services)}")


def total(snap: Sample, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in snap.items() if n == name and all((k, w) in ls for k, w in labels.items()))
