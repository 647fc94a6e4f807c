"""Shared fixtures: the specwatch home and one real vLLM 0.32.0 CPU server (n-gram) per test run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import requests

from specwatch.config import Home, resolve_home
from specwatch.models import build as models
from specwatch.net import free_port
from specwatch.promconfig.server import PrometheusServer, Targets
from specwatch.vllm_cpu.server import NGRAM_CONFIG, VllmServer, serve_argv
from specwatch.vllm_cpu.setup import is_installed
from specwatch.vllm_metrics import samples

pytest_plugins = ["tests.compose_prebuild"]  # the compose tier's images build while the rest runs


# A test that takes one of these fixtures needs what the marker names (`make check` leaves them out).
NEEDS = {"ngram_server": "real_vllm", "model_folders": "real_vllm", "prometheus_factory": "prometheus",
         "promtool": "prometheus", "service_factory": "servers", "study": "servers"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in set(getattr(item, "fixturenames", ())) & NEEDS.keys():
            item.add_marker(NEEDS[fixture])


def pytest_configure(config: pytest.Config) -> None:
    """Tests that stop a child with SIGINT (Ctrl+C) need it to reach the child. A shell that starts the suite in
    the background without job control (`make test &` in a script) ignores SIGINT, and an ignored signal stays
    ignored across exec, so those children never saw it. With a handler here, children start with SIGINT at its
    default and Python turns it into KeyboardInterrupt as in a terminal."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def home() -> Home:
    resolved = resolve_home(None)
    if not is_installed(resolved):
        pytest.fail(f"no vLLM CPU environment at {resolved.vllm_env}: run the README's test command "
                    "(`make test`), which installs it first")
    return resolved


@pytest.fixture(scope="session")
def model_folders(home: Home) -> models.ModelFolders:
    return models.build(home)


@pytest.fixture(scope="session")
def ngram_server(home: Home, model_folders: models.ModelFolders,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """The real server with the article's n-gram config and per-request metrics, started once; in summary mode,
    as the golden capture (`ngram`) the simulator (NGRAM_SIM_ARGS) is compared with on the wire."""
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "ngram.log"
    argv = serve_argv(model_folders.target, port=port, speculative_config=NGRAM_CONFIG, per_request_metrics="summary",
                      extra=["--max-num-seqs", "8"])
    with VllmServer(home, argv, port, log).start() as server:
        yield server


class Service:
    """A specwatch process (`sim`, `exporter`) on a free loopback port, healthy before it is returned."""

    def __init__(self, verb: str, args: list[str], log: Path, health: str = "/health") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        port_args = ["--port", str(self.port)] if verb == "sim" else ["--web.listen-address", f"127.0.0.1:{self.port}"]
        cmd = [sys.executable, "-m", "specwatch.cli", verb, *args, *port_args]
        self.proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{verb} exited: {log.read_text()}")
            try:
                if requests.get(self.url + health, timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{verb} not healthy: {log.read_text()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


SimServer = Service


def requests_by_variant(url: str) -> dict[str, float]:
    """The tap's requests so far per variant (`specwatch_requests_total` summed over task and outcome)."""
    totals: dict[str, float] = {}
    for (name, labels), value in samples(requests.get(url + "/metrics", timeout=10).text).items():
        if name == "specwatch_requests_total":
            variant = dict(labels)["variant"]
            totals[variant] = totals.get(variant, 0.0) + value
    return totals


# summary, as the golden capture of the real n-gram server the simulator is compared with (`ngram`); DETAILED_SIM_ARGS
# is the same server in detailed mode, the default of every server specwatch starts
NGRAM_SIM_ARGS = ["Qwen/Qwen3-8B", "--served-model-name", "spec-demo", "--max-model-len", "4096",
                  "--max-num-seqs", "16", "--seed", "42", "--per-request-spec-decode-metrics", "summary",
                  "--speculative-config", json.dumps(NGRAM_CONFIG), "--sim-time-scale", "0.02"]


DETAILED_SIM_ARGS = [a if a != "summary" else "detailed" for a in NGRAM_SIM_ARGS]


# What a test module started through the factories below, stopped when the module ends. Left running to the end of
# the run, they added up: 53 exporters, 23 simulators and 8 Prometheus servers took 0.4 of the 2 cores here, idle,
# by the time the real-CPU study ran (its blocks 40-50 % slower than alone, and near the 0.5-core limit at which
# the study measures a round again). The session's shared simulators (`sim_ngram`, `sim_baseline`) are kept.
MODULE_STARTED: list[Service | PrometheusServer] = []


@pytest.fixture(scope="module", autouse=True)
def stop_what_the_module_started() -> Iterator[None]:
    """Autouse, so set up before the module's other fixtures and torn down after them."""
    yield
    while MODULE_STARTED:
        MODULE_STARTED.pop().stop()


@pytest.fixture(scope="session")
def service_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str, list[str]], Service]]:
    """Start specwatch processes, each stopped when the test module that started it ends (every one, at the latest,
    at the end of the run)."""
    started: list[Service] = []

    def start(verb: str, args: list[str]) -> Service:
        health = "/health" if verb == "sim" else "/healthz"
        server = Service(verb, args, tmp_path_factory.mktemp(verb) / f"{verb}.log", health)
        started.append(server)
        MODULE_STARTED.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def for_the_session(server: Service) -> Service:
    """`server` kept up to the end of the run (a session fixture's), not stopped with the module that started it."""
    MODULE_STARTED.remove(server)
    return server


@pytest.fixture(scope="session")
def sim_factory(service_factory: Callable[[str, list[str]], Service]) -> Callable[[list[str]], Service]:
    return lambda args: service_factory("sim", args)


@pytest.fixture(scope="session")
def sim_ngram(sim_factory: Callable[[list[str]], SimServer]) -> SimServer:
    return for_the_session(sim_factory(NGRAM_SIM_ARGS))


@pytest.fixture(scope="session")
def sim_baseline(sim_factory: Callable[[list[str]], SimServer]) -> SimServer:
    return for_the_session(sim_factory(["Qwen/Qwen3-8B", "--served-model-name", "spec-demo", "--max-model-len",
                                        "4096", "--max-num-seqs", "16", "--seed", "42", "--sim-time-scale", "0.02"]))


@pytest.fixture(scope="session")
def prometheus_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., PrometheusServer]]:
    """The Debian Prometheus on the repository's configuration and the given targets (and tuned rule files, such
    as a cost table), stopped when the test module that started it ends."""
    started: list[PrometheusServer] = []

    def start(targets: Targets, tuned: Sequence[Path] = ()) -> PrometheusServer:
        server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), targets, free_port(), tuned=tuned).start()
        started.append(server)
        MODULE_STARTED.append(server)
        return server

    yield start
    for server in started:
        server.stop()
