"""`specwatch up`: the whole stack on loopback without Docker, from the files compose uses.

Two servers (the real vLLM CPU build with SmolLM2, simulators, or URLs given), the exporter in
front of them (baseline and an n-gram candidate, split), the Debian Prometheus on
the packaged `prometheus.yml` and its rules, Locust (web UI, or one labelled headless load), and
Grafana when a `grafana` binary is on PATH. Every part is healthy before the next starts, logs go
to the run folder, and everything is stopped on Ctrl+C, SIGTERM, an error or the end of the
headless load, process groups included.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console
from rich.table import Table

from specwatch import snapshot
from specwatch.config import Home
from specwatch.load.run import LOCUSTFILE, LoadConfig
from specwatch.load.run import run as run_load
from specwatch.monitoring import MONITORING
from specwatch.net import free_port, free_port_pair
from specwatch.promconfig.server import PrometheusServer, Targets
from specwatch.stack.grafana import grafana_binary, grafana_process
from specwatch.stack.processes import StackError, managed
from specwatch.supervisor import Supervisor
from specwatch.vllm_cpu.server import NGRAM_CONFIG, VllmServer, serve_argv
from specwatch.workloads import write_article_workloads

VARIANTS = ("baseline", "candidate")
BACKENDS = ("vllm-cpu", "sim", "urls")


@dataclass(frozen=True)
class Ports:
    vllm: int = 8000        # the baseline; the candidate gets the next port
    exporter: int = 9400
    prometheus: int = 9090
    locust: int = 8089
    grafana: int = 3000
    viewer: int = 8080      # the dashboards drawn by Perses's libraries (`specwatch viewer`)


@dataclass(frozen=True)
class StackConfig:
    home: Home
    run_dir: Path
    backend: str = "vllm-cpu"
    urls: dict[str, str] = field(default_factory=dict)   # backend "urls": variant -> URL
    ports: Ports = Ports()
    split: int = 50                  # percent of requests the exporter sends to the candidate
    headless: bool = False
    requests: int = 4                # headless: measured requests per task
    concurrency: int = 2
    max_tokens: int = 64
    duration: float | None = None    # web UI: stop after this many seconds (default: Ctrl+C)
    sim_time_scale: float = 1.0
    # from the environment (GRAFANA_ADMIN_PASSWORD); None: no Grafana. Kept out of repr (logs, tracebacks).
    grafana_password: str | None = field(default=None, repr=False)
    # the variable holding the exporter's admin token (set in the environment the exporter inherits); None: no
    # admin API. The token itself is never in this object.
    admin_token_env: str | None = None
    # rule files of the user's own for Prometheus's tuned/ folder (a cost table from `specwatch tune`)
    tuned_rules: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        for path in self.tuned_rules:
            if path.suffix != ".yml" or not path.is_file():
                raise ValueError(f"--rules {path}: expected an existing .yml rule file (a cost table)")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend {self.backend!r}: expected one of {', '.join(BACKENDS)}")
        if self.backend == "urls" and set(self.urls) != set(VARIANTS):
            raise ValueError("backend urls: expected --url baseline=URL and --url candidate=URL")
        if not 0 <= self.split <= 100:
            raise ValueError(f"split {self.split}: expected a percentage 0..100")


def sim_argv(variant: str, port: int, time_scale: float) -> list[str]:
    argv = [sys.executable, "-m", "specwatch.cli", "sim", "Qwen/Qwen3-8B", "--served-model-name", "spec-demo",
            "--max-model-len", "4096", "--max-num-seqs", "16", "--seed", "42", "--port", str(port),
            "--sim-time-scale", str(time_scale)]
    if variant == "candidate":
        argv += ["--speculative-config", json.dumps(NGRAM_CONFIG), "--per-request-spec-decode-metrics", "detailed"]
    return argv


class Stack:
    """The running parts, stopped in reverse order by `close()`."""

    def __init__(self, cfg: StackConfig, console: Console) -> None:
        self.cfg = cfg
        self.console = console
        self.exits = contextlib.ExitStack()
        self.processes: list[Supervisor] = []
        self.servers: dict[str, str] = {}
        self.exporter_url = f"http://127.0.0.1:{cfg.ports.exporter}"
        self.prometheus: PrometheusServer | None = None
        self.workloads: dict[str, Path] = {}
        self.pids: dict[str, int] = {}

    def _record(self, name: str, pid: int | None) -> None:
        """`processes.json` in the run folder: every process group started, for checks and clean-up by hand."""
        if pid is not None:
            self.pids[name] = pid
            (self.cfg.run_dir / "processes.json").write_text(json.dumps(self.pids, indent=2))

    def _start(self, proc: Supervisor, timeout: float = 60) -> Supervisor:
        self.exits.callback(proc.stop)
        proc.start(timeout)
        self.processes.append(proc)
        self._record(proc.name, proc.pid)
        self.console.print(f"[green]up[/] {proc.name:<10} {proc.health_url.rsplit('/', 1)[0]}   log {proc.log}")
        return proc

    def start_servers(self) -> None:
        cfg = self.cfg
        if cfg.backend == "urls":
            self.servers = dict(cfg.urls)
            return
        ports = {"baseline": cfg.ports.vllm, "candidate": cfg.ports.vllm + 1}
        if cfg.backend == "sim":
            for variant in VARIANTS:
                proc = managed(f"sim {variant}", sim_argv(variant, ports[variant], cfg.sim_time_scale),
                               cfg.run_dir / f"{variant}.log", f"http://127.0.0.1:{ports[variant]}/health")
                self._start(proc)
                self.servers[variant] = f"http://127.0.0.1:{ports[variant]}"
            return
        from specwatch.models import build as models
        target = models.build(cfg.home).target
        servers = {v: VllmServer(cfg.home, serve_argv(target, port=ports[v],
                                                       speculative_config=NGRAM_CONFIG if v == "candidate" else None,
                                                       extra=["--max-num-seqs", "8"]),
                                 ports[v], cfg.run_dir / f"{v}.log") for v in VARIANTS}
        for server in servers.values():
            self.exits.callback(server.stop)
        self.console.print("starting two real vLLM 0.32.0 CPU servers (about a minute) ...")
        errors: list[BaseException] = []

        def start(server: VllmServer) -> None:
            try:
                server.start()
            except BaseException as exc:  # reported below, after both threads end
                errors.append(exc)

        threads = [threading.Thread(target=start, args=(s,)) for s in servers.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise StackError(str(errors[0]))
        for variant, server in servers.items():
            self.servers[variant] = server.url
            self._record(f"vllm {variant}", server.pid)
            self.console.print(f"[green]up[/] vllm {variant:<5} {server.url}   log {server.log_path} "
                               f"({server.startup_seconds:.0f} s)")

    def start_exporter(self) -> None:
        argv = [sys.executable, "-m", "specwatch.cli", "exporter",
                *[a for v in VARIANTS for a in ("--upstream", f"{v}={self.servers[v]}")],
                "--split", f"candidate={self.cfg.split}", "--event-log", str(self.cfg.run_dir / "events.jsonl"),
                "--web.listen-address", f"127.0.0.1:{self.cfg.ports.exporter}",
                *(["--admin-token-env", self.cfg.admin_token_env] if self.cfg.admin_token_env else [])]
        self._start(managed("exporter", argv, self.cfg.run_dir / "exporter.log", self.exporter_url + "/healthz"))

    def start_prometheus(self) -> None:
        prom = PrometheusServer(self.cfg.run_dir / "prometheus", Targets(self.servers, (self.exporter_url,)),
                                self.cfg.ports.prometheus, tuned=self.cfg.tuned_rules)
        self.exits.callback(prom.stop)
        prom.start()
        self.prometheus = prom
        self._record("prometheus", prom.proc.pid if prom.proc else None)
        self.console.print(f"[green]up[/] prometheus {prom.url}   log {prom.folder / 'prometheus.log'}")

    def start_locust_ui(self) -> None:
        port = self.cfg.ports.locust
        workloads = ",".join(f"{task}={path}" for task, path in self.workloads.items())
        argv = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--host", self.exporter_url,
                "--web-host", "127.0.0.1", "--web-port", str(port), "--workloads", workloads,
                "--max-tokens", str(self.cfg.max_tokens), "-u", str(self.cfg.concurrency),
                "-r", str(self.cfg.concurrency)]
        self._start(managed("locust", argv, self.cfg.run_dir / "locust.log", f"http://127.0.0.1:{port}/"))

    def start_grafana(self) -> None:
        binary = grafana_binary()
        if binary is None:
            self.console.print("grafana: no `grafana` binary on PATH, not started (compose starts one)")
            return
        assert self.prometheus is not None
        if self.cfg.grafana_password is None:
            self.console.print("grafana: set GRAFANA_ADMIN_PASSWORD to start it (never a default password)")
            return
        self._start(grafana_process(binary, self.cfg.run_dir / "grafana", self.prometheus.url,
                                    self.cfg.ports.grafana, self.cfg.grafana_password), timeout=120)

    def start_viewer(self) -> None:
        from specwatch.viewer import WEB_ROOT

        if not (WEB_ROOT / "viewer.js").is_file():
            self.console.print(f"viewer: no built front end in {WEB_ROOT}, not started (`make viewer` builds it)")
            return
        assert self.prometheus is not None
        port = self.cfg.ports.viewer
        argv = [sys.executable, "-m", "specwatch.cli", "viewer", "--prometheus", self.prometheus.url,
                "--web.listen-address", f"127.0.0.1:{port}"]
        self._start(managed("viewer", argv, self.cfg.run_dir / "viewer.log", f"http://127.0.0.1:{port}/healthz"))

    def close(self) -> None:
        self.exits.close()


def _summary(cfg: StackConfig, stack: Stack, before: snapshot.Snapshot, after: snapshot.Snapshot,
             console: Console) -> dict[str, Any]:
    diff = snapshot.diff(before, after)
    prom = stack.prometheus
    assert prom is not None
    # every counter the record divides: a last request with all drafts rejected moves only the draft counters
    last = max(prom.wait_for_sum(name, _total(after, name)) for name in (
        MONITORING.exporter.accepted, MONITORING.exporter.draft_tokens, MONITORING.exporter.spec_steps))
    record = f"variant_task:specwatch_acceptance_rate:ratio_{MONITORING.slow.rate}"
    prom.wait_evaluated(last, record)
    recorded = prom.values(record)
    table = Table(title="per variant and task: exact snapshot difference at the exporter, and Prometheus (5m)")
    for col in ("variant", "task", "C", "D", "R", "C/D", "1+C/R", "Prometheus C/D"):
        table.add_column(col)
    rows = []
    for (variant, task), f in sorted(diff.by_task.items()):
        prom_rate = recorded.get((("task", task), ("variant", variant)))
        rows.append({"variant": variant, "task": task, **f.as_dict(), "prometheus_acceptance_rate": prom_rate})
        table.add_row(variant, task, f"{f.accepted:g}", f"{f.draft_tokens:g}", f"{f.steps:g}",
                      "-" if f.acceptance_rate is None else f"{f.acceptance_rate:.3f}",
                      "-" if f.mean_acceptance_length is None else f"{f.mean_acceptance_length:.2f}",
                      "-" if prom_rate is None else f"{prom_rate:.3f}")
    console.print(table)
    return {"backend": cfg.backend, "servers": stack.servers, "exporter": stack.exporter_url,
            "prometheus": prom.url, "seconds": diff.seconds, "by_task": rows}


def _total(snap: snapshot.Snapshot, name: str) -> float:
    return sum(v for (n, _), v in snap.samples().items() if n == name)


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl+C, so the stack is stopped either way."""
    def handler(_sig: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(cfg: StackConfig, console: Console | None = None) -> dict[str, Any]:
    """Start the stack; headless: one labelled load and a summary, then stop; else serve until stopped."""
    console = console or Console()
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    stack = Stack(cfg, console)
    with _terminate_as_interrupt():
        try:
            stack.workloads = {t: cfg.run_dir / "data" / f"{t}.jsonl" for t in ("code", "chat")}
            write_article_workloads(cfg.run_dir / "data", lang="en")
            stack.start_servers()
            stack.start_exporter()
            stack.start_prometheus()
            assert stack.prometheus is not None
            stack.prometheus.wait_until_up(len(stack.servers) + 1)
            if cfg.headless:
                before = snapshot.take(stack.exporter_url)
                summary = run_load(LoadConfig(stack.exporter_url, cfg.concurrency, cfg.requests, stack.workloads,
                                              cfg.run_dir / "load", 1, False, cfg.max_tokens, 1800), console)
                after = snapshot.take(stack.exporter_url)
                result = {**_summary(cfg, stack, before, after, console), "load": summary["tasks"]}
                (cfg.run_dir / "stack-summary.json").write_text(json.dumps(result, indent=2))
                console.print(f"summary: {cfg.run_dir / 'stack-summary.json'}")
                return result
            stack.start_locust_ui()
            stack.start_viewer()
            stack.start_grafana()
            console.print("the stack is up; Ctrl+C stops everything")
            deadline = None if cfg.duration is None else time.monotonic() + cfg.duration
            while deadline is None or time.monotonic() < deadline:
                dead = [p.name for p in stack.processes if not p.alive()]
                if dead:
                    raise StackError(f"{', '.join(dead)} stopped; shutting the stack down")
                time.sleep(1)
            return {"servers": stack.servers, "exporter": stack.exporter_url}
        finally:
            console.print("stopping the stack ...")
            stack.close()


def free_ports() -> Ports:
    """Free loopback ports for every part (tests, or a second stack beside a running one), all distinct."""
    return Ports(free_port_pair(), free_port(), free_port(), free_port(), free_port(), free_port())
