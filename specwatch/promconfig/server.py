"""A local Prometheus (the Debian binary) on the packaged configuration, for `specwatch up` and tests.

The run folder gets a verbatim copy of `specwatch/data/prometheus/prometheus.yml`, a link to the rules,
loopback target files in the layout compose mounts, and a `tuned/` folder for rule files of the user's own
(a step-cost table from `specwatch tune`), so the local stack and compose read the same configuration and
differ only in where the targets and the tuned rules are.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import requests
import yaml

from specwatch import resources
from specwatch.files import write_text
from specwatch.monitoring import MONITORING
from specwatch.supervisor import Supervisor

VLLM_JOB, EXPORTER_JOB = MONITORING.jobs.vllm, MONITORING.jobs.exporter  # the job names prometheus.yml uses


class PrometheusError(RuntimeError):
    """Prometheus could not start, answer, or evaluate a query."""


def host_port(url: str) -> str:
    """`http://127.0.0.1:8000` -> `127.0.0.1:8000` (what a scrape target names)."""
    parts = urlsplit(url if "//" in url else f"http://{url}")
    if not parts.hostname or not parts.port:
        raise ValueError(f"target URL {url!r}: expected http://HOST:PORT")
    return f"{parts.hostname}:{parts.port}"


@dataclass(frozen=True)
class Targets:
    """What to scrape: vLLM (or simulator) servers by variant, and exporters.

    A variant maps to one URL, or to several (its replicas: one target each, the same `variant` label).
    """

    vllm: Mapping[str, str | Sequence[str]] = field(default_factory=dict)   # variant -> URL or URLs
    exporters: tuple[str, ...] = ()

    def files(self) -> dict[str, list[dict[str, Any]]]:
        return {
            "vllm.yml": [{"targets": [host_port(url) for url in ([urls] if isinstance(urls, str) else urls)],
                          "labels": {"variant": variant}}
                         for variant, urls in self.vllm.items()],
            "exporter.yml": [{"targets": [host_port(url) for url in self.exporters]}] if self.exporters else [],
        }


def write_layout(folder: Path, targets: Targets, source: Path = resources.PROMETHEUS,
                 tuned: Sequence[Path] = ()) -> Path:
    """The configuration folder Prometheus runs from; returns the path of its prometheus.yml.

    `tuned`: rule files copied into its `tuned/` folder (prometheus.yml loads `tuned/*.yml`), e.g. a cost table.
    """
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "prometheus.yml"
    shutil.copyfile(source / "prometheus.yml", config)
    rules = folder / "rules"
    if rules.is_symlink() or rules.exists():
        rules.unlink()
    rules.symlink_to(source / "rules", target_is_directory=True)
    target_dir = folder / "targets"
    target_dir.mkdir(exist_ok=True)
    for name, groups in targets.files().items():
        write_text(target_dir / name, yaml.safe_dump(groups, sort_keys=False))  # file_sd never reads half a file
    tuned_dir = folder / MONITORING.cost_table.folder
    tuned_dir.mkdir(exist_ok=True)
    for path in tuned:
        if path.suffix != ".yml":
            raise ValueError(f"tuned rule file {path}: prometheus.yml loads only tuned/*.yml")
        shutil.copyfile(path, tuned_dir / path.name)
    return config


class PrometheusServer:
    """`prometheus` on 127.0.0.1:`port`, its data and log under `folder`; stopped with its context."""

    def __init__(self, folder: Path, targets: Targets, port: int, binary: str = "prometheus",
                 tuned: Sequence[Path] = ()) -> None:
        self.folder = folder
        self.targets = targets
        self.tuned = tuple(tuned)  # rule files for its tuned/ folder (a cost table)
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.binary = binary
        self.process: Supervisor | None = None

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        """The running `prometheus` (its pid is its process group's id)."""
        return self.process.proc if self.process is not None else None

    def argv(self, config: Path) -> list[str]:
        return [self.binary, f"--config.file={config}", f"--storage.tsdb.path={self.folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle",
                "--storage.tsdb.retention.time=7d"]

    def start(self, timeout: float = 60) -> PrometheusServer:
        found = shutil.which(self.binary)
        if found is None:
            raise PrometheusError(f"no `{self.binary}` on PATH: the README's commands install Debian's prometheus "
                                  "(apt-get install --no-install-recommends prometheus)")
        config = write_layout(self.folder / "config", self.targets, tuned=self.tuned)
        self.process = Supervisor("prometheus", self.argv(config), self.folder / "prometheus.log",
                                  self.url + "/-/ready", grace=20.0, append=True, error=PrometheusError)
        self.process.start(timeout)
        return self

    def retarget(self, targets: Targets) -> None:
        """Point the running server at other targets (file discovery picks them up within seconds)."""
        self.targets = targets
        write_layout(self.folder / "config", targets, tuned=self.tuned)

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query; the vector's samples as {"metric": labels, "value": [ts, "v"]}."""
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        return self._result("query", params, timeout=30)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query; the matrix's series as {"metric": labels, "values": [[ts, "v"], ...]}."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return self._result("query_range", params, timeout=60)

    def _result(self, endpoint: str, params: dict[str, str], timeout: float) -> list[dict[str, Any]]:
        """`data.result` of a GET on /api/v1/<endpoint>; a PrometheusError where the query failed."""
        resp = requests.get(f"{self.url}/api/v1/{endpoint}", params=params, timeout=timeout)
        body = resp.json()
        if resp.status_code != 200 or body.get("status") != "success":
            raise PrometheusError(f"{endpoint} {params['query']!r}: {body.get('error', resp.text[:300])}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def values(self, expr: str, at: float | None = None) -> dict[tuple[tuple[str, str], ...], float]:
        """An instant query as {sorted labels without __name__: value}."""
        return {tuple(sorted((k, v) for k, v in s["metric"].items() if k != "__name__")): float(s["value"][1])
                for s in self.query(expr, at)}

    def wait_until_up(self, count: int, timeout: float = 60) -> None:
        """Until `count` targets have been scraped and all answered (`up` == 1)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            up = self.values("up")
            if len(up) == count and all(v == 1 for v in up.values()):
                return
            time.sleep(0.5)
        raise PrometheusError(f"targets not all up after {timeout:.0f} s: "
                              f"{[(t['scrapeUrl'], t['health'], t['lastError']) for t in self.active_targets()]}")

    def wait_for_sum(self, expr: str, expected: float, timeout: float = 60) -> float:
        """Until the latest samples of `expr` sum to `expected`; returns the newest sample's scrape time."""
        deadline = time.monotonic() + timeout
        seen = None
        while time.monotonic() < deadline:
            seen = next(iter(self.values(f"sum({expr})").values()), None)
            if seen == expected:
                return max(self.values(f"timestamp({expr})").values())
            time.sleep(0.5)
        raise PrometheusError(f"Prometheus has sum({expr}) = {seen}, expected {expected}, after {timeout:.0f} s")

    def wait_evaluated(self, after: float, *records: str, timeout: float = 30) -> None:
        """Until each record's rule group has evaluated after time `after` (groups run at their own phases)."""
        deadline = time.monotonic() + timeout
        for record in records:
            while True:
                stamps = self.values(f"timestamp({record})")
                if stamps and min(stamps.values()) >= after:
                    break
                if time.monotonic() > deadline:
                    raise PrometheusError(f"{record} not evaluated after {after:.3f} within {timeout:.0f} s")
                time.sleep(0.5)

    def active_targets(self) -> list[dict[str, Any]]:
        resp = requests.get(self.url + "/api/v1/targets", params={"state": "active"}, timeout=10)
        targets: list[dict[str, Any]] = resp.json()["data"]["activeTargets"]
        return targets

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def __enter__(self) -> PrometheusServer:
        return self if self.proc is not None else self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
