"""Run a plan: each variant in turn on its own server, results written as they are produced, resumable.

For each variant: start its server (its backend), wait for health, record the environment,
warm up, snapshot `/metrics`, acceptance pass per task, performance pass per concurrency,
snapshot again, reconcile, stop the server and confirm it is gone, then write `status.json`
last. A variant with a `done` status is never redone or touched; anything else is set aside
under `interrupted/` and redone.
"""

from __future__ import annotations

import json
import shutil
import time
import traceback
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specwatch import __version__, snapshot
from specwatch.backends import Backend, BackendError, HealthCheck, Launch, make_backend, wait_http_health
from specwatch.backends.base import HOST
from specwatch.config import Home
from specwatch.experiment import environment, passes
from specwatch.experiment.layout import (
    DONE,
    FAILED,
    RunFolder,
    VariantFolder,
    read_json_object,
    sha256_file,
    write_json,
    write_text,
)
from specwatch.experiment.plan import DYNAMIC, StudyPlan, Variant, batch_room, sweep_variant_name
from specwatch.experiment.timeline import PrometheusError, Timeline, Window
from specwatch.net import free_port
from specwatch.stats import median
from specwatch.vllm_cpu.server import serve_argv
from specwatch.workloads import Row, load_jsonl, write_article_workloads


class RunConflict(ValueError):
    """The run folder does not fit the request: it exists without --resume, or holds another plan."""


@dataclass(frozen=True)
class RunOptions:
    out: Path
    run_id: str
    home: Home
    resume: bool = False
    environ: Mapping[str, str] = field(default_factory=dict)
    health: HealthCheck = wait_http_health
    prometheus: str | None = "prometheus"   # the binary that records the timeline; None: no Prometheus


@dataclass(frozen=True)
class RunResult:
    folder: Path
    statuses: dict[str, dict[str, Any]]

    @property
    def failed(self) -> list[str]:
        return [n for n, s in self.statuses.items() if s.get("state") != DONE]

    @property
    def checks_failed(self) -> list[str]:
        return [n for n, s in self.statuses.items() if s.get("state") == DONE and not s.get("ok")]


BACKEND_OPTIONS = ("--host", "--port")  # the backend adds its own (backends/base.py)


def variant_args(plan: StudyPlan, v: Variant) -> list[str]:
    """`vllm serve` arguments after the word `serve`, without serve_argv's --host / --port (the backend adds them).

    The plan's own `server.args` and the variant's `args` follow unchanged, then room in the batch for the
    performance pass's largest concurrency where neither sets `--max-num-seqs` (`plan.batch_room`).
    """
    own = _without_options(serve_argv(v.model, speculative_config=v.speculative_config, dtype=plan.server.dtype),
                           BACKEND_OPTIONS)
    concurrencies = plan.performance.concurrencies if plan.performance else ()
    argv = [*own, *plan.server.args, *v.args, *batch_room((*plan.server.args, *v.args), concurrencies)]
    if not plan.server.enforce_eager:
        argv = [arg for arg in argv if arg != "--enforce-eager"]
    argv[argv.index("--served-model-name") + 1] = plan.served_model_name
    return argv


def _without_options(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """`argv` without the options `names` and their values, written `--port 8000` or `--port=8000`."""
    out: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg in names:
            next(args, None)
        elif arg.partition("=")[0] not in names:
            out.append(arg)
    return out


def steps(plan: StudyPlan) -> int:
    perf = len(plan.performance.concurrencies) if plan.performance else 0
    return 2 + len(plan.tasks) + perf  # start, acceptance per task, perf per concurrency, stop


class Runner:
    def __init__(self, plan: StudyPlan, options: RunOptions, console: Console) -> None:
        self.plan, self.options, self.console = plan, options, console
        self.run = RunFolder(options.out / options.run_id)
        self.backends: dict[str, Backend] = {}
        self.help: dict[str, Future[str | None]] = {}
        self.helpers = ThreadPoolExecutor(1, thread_name_prefix="server-help")
        self.timeline: Timeline | None = None
        self.workloads: dict[str, Path] = {}
        self.rows: dict[str, list[Row]] = {}
        self.inputs: dict[str, str] = {}

    # -- the run folder ---------------------------------------------------------------------------

    def prepare(self) -> None:
        root = self.run.root
        if self.options.resume:
            if not self.run.plan.exists():
                raise RunConflict(f"--resume: no run at {root} (no plan.yaml)")
            if self.run.plan.read_text(encoding="utf-8") != self.plan.text:
                raise RunConflict(f"--resume: {self.run.plan} differs from the plan given; resume with the same plan")
        elif root.exists() and any(root.iterdir()):
            raise RunConflict(f"{root} already exists: pass --resume to finish it, or another --run-id")
        root.mkdir(parents=True, exist_ok=True)
        if not self.run.plan.exists():
            write_text(self.run.plan, self.plan.text)
        self._inputs()
        record = read_json_object(self.run.run) or {"run_id": self.options.run_id, "plan": self.plan.name,
                                      "created": _now(), "specwatch": __version__, "attempts": []}
        if record.get("inputs_sha256", self.inputs) != self.inputs:
            raise RunConflict(f"--resume: the task files changed since the run started ({self.run.run}); "
                              "start a new run")
        record.update({"inputs_sha256": self.inputs, "variants": [v.name for v in self.plan.variants]})
        record["attempts"].append({"started": _now(), "resume": self.options.resume})
        write_json(self.run.run, record)
        self._sweep_record()

    def _sweep_record(self) -> None:
        """A sweep's cells in `sweep.json`: what `specwatch tune` reads beside the variants' results."""
        sweep, perf = self.plan.sweep, self.plan.performance
        if sweep is None or perf is None:
            return
        write_json(self.run.sweep, {
            "method": dict(sweep.method), "ks": list(sweep.ks), "concurrencies": list(perf.concurrencies),
            "tasks": [t.name for t in self.plan.tasks], "max_tpot_ms": sweep.max_tpot_ms,
            "requests_per_task": perf.requests, "max_tokens": perf.max_tokens, "proof": sweep.proof,
            "variants": {sweep_variant_name(k): k for k in sweep.ks}, "dynamic": DYNAMIC,
            "backend": self.plan.variants[0].backend.kind, "backend_args": list(self.plan.variants[0].backend.args),
            "model": self.plan.model})


    def _inputs(self) -> None:
        inputs = self.run.inputs
        inputs.mkdir(exist_ok=True)
        articles = {t.article for t in self.plan.tasks if t.article}
        if articles and not all((inputs / f"article-{self.plan.lang}" / f"{a}.jsonl").exists() for a in articles):
            write_article_workloads(inputs / f"article-{self.plan.lang}", self.plan.lang)
        for task in self.plan.tasks:
            target = inputs / f"{task.name}.jsonl"
            source = task.path or inputs / f"article-{self.plan.lang}" / f"{task.article}.jsonl"
            if not target.exists():
                shutil.copyfile(source, target)
            elif task.path is not None and sha256_file(source) != sha256_file(target):
                raise RunConflict(f"tasks.{task.name}: {source} changed since the run started; start a new run")
            self.workloads[task.name] = target
            self.rows[task.name] = load_jsonl(target, task.name)
        self.inputs = {"plan.yaml": sha256_file(self.run.plan),
                       **{f"inputs/{t}.jsonl": sha256_file(p) for t, p in self.workloads.items()}}

    # -- variants ---------------------------------------------------------------------------------

    def execute(self) -> RunResult:
        self.prepare()
        unfinished = [v for v in self.plan.variants if not self.run.variant(v.name).finished()]
        if unfinished:  # `vllm serve --help` takes ~20 s: read it while the first server starts
            self._help(unfinished[0], self._backend(unfinished[0]))
        self.timeline = self._start_timeline() if unfinished else None
        try:
            result = self._variants(self.plan.variants)
            if self.plan.sweep is not None and self.plan.sweep.proof and not result.failed:
                result = self._proof(result)
            self._save_timeline(result.statuses)
            return result
        finally:
            self.helpers.shutdown(wait=False, cancel_futures=True)
            if self.timeline is not None:
                self.timeline.stop()

    def _start_timeline(self) -> Timeline | None:
        binary = self.options.prometheus
        if binary is None:
            return None
        if not Timeline.available(binary):
            self.console.print(f"no `{binary}` on PATH: the report will have no dashboard queries over the run "
                               "(`make prometheus` installs Debian's)")
            return None
        timeline = Timeline(self.run.prometheus, self.run.timeline, binary)
        try:
            self.console.print(f"Prometheus on {timeline.start()} records the dashboard queries over the run")
        except PrometheusError as exc:
            self.console.print(f"Prometheus did not start, the report will have no timeline: {exc}")
            return None
        return timeline

    def _save_timeline(self, statuses: dict[str, dict[str, Any]]) -> None:
        """The key dashboard queries over the window of every finished variant the timeline lacks."""
        if self.timeline is None:
            return
        saved = self.run.timeline_variants()
        windows = {name: Window(*s["window"]) for name, s in statuses.items()
                   if s.get("state") == DONE and s.get("window") and name not in saved}
        backends = {v.name: v.backend.kind for v in self.plan.variants}
        try:
            self.timeline.save(windows, backends)
        except (PrometheusError, requests.RequestException, OSError) as exc:  # the results stand without curves
            self.console.print(f"the dashboard queries over the run could not be saved: {exc}")

    def _proof(self, result: RunResult) -> RunResult:
        """After a sweep: tune, measure the recommended dynamic config as one more variant, write the proof."""
        from specwatch.tune import proof, tuner  # the tune package reads the experiment's layout

        recommendation = tuner.tune_run(self.run.root, self.run.tune, max_tpot_ms=self.plan.sweep.max_tpot_ms
                                        if self.plan.sweep else None, console=self.console)
        config = recommendation.speculative_config
        if config is None:
            self.console.print("tune recommends no speculation at any batch size: nothing dynamic to prove")
            return result
        first = self.plan.variants[0]
        dynamic = Variant(DYNAMIC, self.plan.model, config, first.backend, first.args, sweep_variant_name(0))
        folder = self.run.variant(DYNAMIC)
        status = folder.read_status() or {}
        if folder.finished() and status.get("speculative_config") != config:
            raise RunConflict(f"--resume: {folder.root} measured another config than the one tune recommends now; "
                              "start a new run")
        record = read_json_object(self.run.run) or {}
        if DYNAMIC not in record.get("variants", []):
            record["variants"] = [*record.get("variants", []), DYNAMIC]
            write_json(self.run.run, record)
        more = self._variants([dynamic])
        statuses = {**result.statuses, **more.statuses}
        if not more.failed:
            table = proof.write_proof(self.run.root, self.run.tune)
            self.console.print(table)
        return RunResult(self.run.root, statuses)

    def _variants(self, variants: Sequence[Variant]) -> RunResult:
        statuses: dict[str, dict[str, Any]] = {}
        per_variant = steps(self.plan)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=self.console) as progress:
            bar = progress.add_task("experiment", total=per_variant * len(variants))
            for v in variants:
                folder = self.run.variant(v.name)
                if folder.finished():
                    statuses[v.name] = folder.read_status() or {}
                    progress.advance(bar, per_variant)
                    progress.console.print(f"{v.name}: finished earlier, kept")
                    continue
                moved = self.run.set_aside(v.name)
                if moved:
                    progress.console.print(f"{v.name}: unfinished results moved to {moved}; redoing it")
                done_before = progress.tasks[0].completed

                def step(what: str, name: str = v.name) -> None:
                    progress.update(bar, description=f"{name}: {what}")

                def advance() -> None:
                    progress.advance(bar)

                statuses[v.name] = self.variant(v, folder, step, advance)
                progress.update(bar, completed=done_before + per_variant)
                s = statuses[v.name]
                progress.console.print(f"{v.name}: {s['state']}" + (
                    f", reconciliation {'equal' if s.get('ok') else 'MISMATCH'}" if s["state"] == DONE
                    else f": {s.get('error')}"))
            progress.update(bar, description="experiment done")
        record = read_json_object(self.run.run) or {}
        record["attempts"][-1]["finished"] = _now()
        record["statuses"] = {**record.get("statuses", {}),
                              **{n: {k: s.get(k) for k in ("state", "ok")} for n, s in statuses.items()}}
        write_json(self.run.run, record)
        return RunResult(self.run.root, statuses)

    def _backend(self, v: Variant) -> Backend:
        key = repr(v.backend)
        if key not in self.backends:
            self.backends[key] = make_backend(v.backend, self.options.home, self.options.environ, self.options.health)
        return self.backends[key]

    def _help(self, v: Variant, backend: Backend) -> Future[str | None]:
        """`vllm serve --help` as the backend runs it, once per backend, read in the background."""
        key = repr(v.backend)
        if key not in self.help:
            self.help[key] = self.helpers.submit(backend.help_text)
        return self.help[key]

    def variant(self, v: Variant, folder: VariantFolder, step: Any, advance: Any) -> dict[str, Any]:
        started = time.monotonic()
        status: dict[str, Any] = {"variant": v.name, "started": _now(), "baseline": v.baseline,
                                  "speculative_config": v.speculative_config}
        folder.root.mkdir(parents=True, exist_ok=True)
        backend = self._backend(v)
        args = variant_args(self.plan, v)
        launch = Launch(v.name, tuple(args), free_port(), folder.server_log, self.plan.server.startup_timeout)
        if self.timeline is not None:  # Prometheus takes the new target up while the server starts
            self.timeline.target(v.name, f"http://{HOST}:{launch.port}")
        step(f"starting {v.backend.kind} server")
        try:
            server = backend.start(launch)
        except BackendError as exc:
            return self._failed(folder, status, exc, started)
        status["startup_seconds"] = round(time.monotonic() - started, 2)
        advance()
        window_start = time.time()
        try:
            if self.timeline is not None and not self.timeline.watch(v.name, server.url):
                self.console.print(f"{v.name}: Prometheus did not scrape its server within 15 s; "
                                   "its curves start later")
            self._measure(v, folder, server.url, backend, launch, status, step, advance)
            status["window"] = [window_start, time.time()]  # Unix seconds: healthy to the last snapshot
        except Exception as exc:  # recorded in status.json; the run goes on with the next variant
            status["error_trace"] = traceback.format_exc(limit=8)
            status["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            step("stopping the server")
            status["stopped"] = server.stop()  # raises BackendError when not confirmed gone: the run stops
            advance()
        if "error" in status:
            status.update(state=FAILED, seconds=round(time.monotonic() - started, 2))
            write_json(folder.status, status)
            return status
        status.update(state=DONE, finished=_now(), seconds=round(time.monotonic() - started, 2))
        write_json(folder.status, status)  # last: the variant is finished only from here on
        return status

    def _measure(self, v: Variant, folder: VariantFolder, url: str, backend: Backend, launch: Launch,
                 status: dict[str, Any], step: Any, advance: Any) -> None:
        model = self.plan.served_model_name
        step("recording the environment")
        help_text = self._help(v, backend).result()
        if help_text:
            write_text(folder.help_text, help_text)
        before_env = snapshot.take(url)
        write_json(folder.environment, environment.environment(
            url=url, command=backend.command_line(launch), args=launch.args, model=v.model,
            speculative_config=v.speculative_config, backend=backend.describe(), inputs=self.inputs,
            metrics_text=before_env.text, startup_seconds=status["startup_seconds"], has_help=bool(help_text)))
        if self.plan.warmup_requests:
            step("warming up")
            rows = [r for t in self.plan.tasks for r in self.rows[t.name][:self.plan.warmup_requests]]
            passes.chat_pass(url, rows, folder.warmup, max_tokens=16, concurrency=len(rows), model=model)
        before = snapshot.take(url)
        snapshot.write(before, folder.metrics_before)
        for task in self.plan.tasks:
            step(f"acceptance pass, {task.name}")
            passes.acceptance_pass(url, task.name, self.rows[task.name], folder, self.plan.acceptance, model)
            advance()
        perf: dict[str, Any] = {}
        if self.plan.performance is not None:
            for c in self.plan.performance.concurrencies:
                step(f"performance pass, concurrency {c}")
                summary = passes.performance_pass(url, self.workloads, folder, self.plan.performance, c, model)
                failures = sum(t["failures"] for t in summary["tasks"].values())
                perf[f"c{c}"] = {"failures": failures, "locust_exit_code": summary["locust_exit_code"]}
                if self.plan.sweep is not None:
                    self.console.print(cell_line(v, c, summary, folder.perf(c) / "requests.jsonl"))
                advance()
        after = snapshot.take(url)
        snapshot.write(after, folder.metrics_after)
        reconciliation = passes.reconcile(snapshot.diff(before, after), folder, v.speculative_config is not None)
        write_json(folder.reconciliation, reconciliation)
        perf_ok = all(p["failures"] == 0 and p["locust_exit_code"] == 0 for p in perf.values())
        status.update(reconciled=reconciliation["ok"], performance=perf, ok=reconciliation["ok"] and perf_ok)

    def _failed(self, folder: VariantFolder, status: dict[str, Any], exc: Exception, started: float) -> dict[str, Any]:
        status.update(state=FAILED, error=str(exc), seconds=round(time.monotonic() - started, 2))
        write_json(folder.status, status)
        return status


def cell_line(v: Variant, concurrency: int, summary: Mapping[str, Any], requests_file: Path) -> str:
    """A sweep cell's progress line: the variant, its k, the concurrency, requests and TPOT p50 per task.

    The TPOT is the server's (`mean_itl_ms`) where it reported one: a busy client's own is bunched."""
    k = (v.speculative_config or {}).get("num_speculative_tokens", 0)
    table = (v.speculative_config or {}).get("num_speculative_tokens_per_batch_size")
    what = f"k per batch size {table}" if table else f"k={k}"
    server: dict[str, list[float]] = {}
    for line in requests_file.read_text().splitlines() if requests_file.exists() else []:
        r = json.loads(line) if line.strip() else {}
        itl = (r.get("server") or {}).get("mean_itl_ms")
        if r.get("ok") and not r.get("warmup") and isinstance(itl, int | float):
            server.setdefault(r["task"], []).append(float(itl))
    parts = []
    for task, s in summary["tasks"].items():
        tpot = f"{median(server[task]):.2f} ms (server)" if server.get(task) else f"{s['tpot_ms']['p50']} ms"
        parts.append(f"{task} {s['requests'] - s['failures']}/{s['requests']} ok, TPOT p50 {tpot}")
    return f"cell {v.name} ({what}) at concurrency {concurrency}: {', '.join(parts)}"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def run_plan(plan: StudyPlan, options: RunOptions, console: Console | None = None) -> RunResult:
    return Runner(plan, options, console or Console()).execute()
