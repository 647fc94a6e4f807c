"""Run a plan: each variant on its own server, in the plan's design, results written as they are produced, resumable.

For each variant: start its server (its backend), wait for health, record the environment,
warm up, snapshot `/metrics`, acceptance pass per task, the performance pass in blocks,
snapshot again, reconcile, stop the server and confirm it is gone, then write `status.json`
last. The design decides when: `sequential` runs each variant from start to stop in turn, one
block per concurrency; `interleaved` starts every server at once and runs the performance pass in
rounds of one block per variant, the order rotated each round (`specwatch.experiment.blocks`), so
that whatever slows the machine slows every variant of a round. A variant with a `done` status is
never redone or touched; anything else is set aside under `interrupted/` and redone.

Recovery: while each block runs the runner reads what others took from the machine
(`specwatch.experiment.disturbance`, a rule fixed before any result is read). At the end of a
concurrency's rounds a disturbed round is measured again as a new round, in the replaced round's
order and with its share of requests, up to the plan's `max_extra_rounds`; the replaced round's
blocks stay on disk, marked `replaced_by`, and are left out of the merged pass (a sequential
design measures the disturbed block again at once). Every block records its signal in
`status.json`; the report lists what was replaced and why.
"""

from __future__ import annotations

import signal
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import requests
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specwatch import __version__, snapshot
from specwatch.backends import Backend, BackendError, HealthCheck, Launch, make_backend, wait_http_health
from specwatch.backends.base import Server
from specwatch.config import Home
from specwatch.exit_codes import EXIT_CHECK, EXIT_ERROR, EXIT_OK
from specwatch.experiment import blocks, disturbance, environment, passes
from specwatch.experiment.blocks import bracket, rotation
from specwatch.experiment.layout import DONE, FAILED, RunFolder, VariantFolder
from specwatch.experiment.plan import DYNAMIC, StudyPlan, Variant, batch_size, sweep_variant_name
from specwatch.experiment.timeline import PrometheusError, Span, Timeline
from specwatch.files import read_json_object, sha256_file
from specwatch.load.results import RequestResult
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

    @property
    def exit_code(self) -> int:
        """EXIT_ERROR where a variant failed, else EXIT_CHECK where one failed its checks, else EXIT_OK."""
        return EXIT_ERROR if self.failed else EXIT_CHECK if self.checks_failed else EXIT_OK


BACKEND_OPTIONS = ("--host", "--port")  # the backend adds its own (backends/base.py)


def variant_args(plan: StudyPlan, v: Variant) -> list[str]:
    """`vllm serve` arguments after the word `serve`, without serve_argv's --host / --port (the backend adds them).

    The plan's own `server.args` and the variant's `args` follow unchanged; the batch holds the performance pass's
    largest concurrency where neither sets `--max-num-seqs` (`plan.batch_size`).
    """
    concurrencies = plan.performance.concurrencies if plan.performance else ()
    own = _without_options(serve_argv(v.model, speculative_config=v.speculative_config, dtype=plan.server.dtype,
                                      max_num_seqs=batch_size((*plan.server.args, *v.args), concurrencies)),
                           BACKEND_OPTIONS)
    argv = [*own, *plan.server.args, *v.args]
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
    """Progress steps per variant: start, acceptance per task, one block per concurrency and round, stop."""
    perf = len(plan.performance.concurrencies) * plan.rounds if plan.performance else 0
    return 2 + len(plan.tasks) + perf


Step = Callable[[str], None]
Advance = Callable[[], None]


@dataclass
class Serving:
    """One variant of the run while it is measured: its server, its folder, and what it has recorded so far."""

    variant: Variant
    folder: VariantFolder
    status: dict[str, Any]
    started: float  # time.monotonic() when its turn began
    launch: Launch | None = None
    server: Server | None = None
    before: snapshot.Snapshot | None = None
    window_start: float = 0.0
    blocks: list[dict[str, Any]] = field(default_factory=list)  # the performance blocks: concurrency, round, times
    lifetimes: int = 0  # server starts so far (more than one in a bracketed design)
    differences: list[snapshot.Difference] = field(default_factory=list)  # one per lifetime: before to after

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url


class Runner:
    """One attempt at a plan's run folder: `prepare` checks the folder fits the plan (a resume must pass the same plan
    and inputs) and records it (`run.json`, `inputs/`, `sweep.json`); `execute` starts each variant's server, puts
    its blocks in the plan's design (sequential, interleaved rounds or bracketed), measures a disturbed round again
    (`disturbance`), and stops every server; the records of each variant go to its folder as they are made
    (`layout.VariantFolder`), `status.json` last."""

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
        # why the machine is not watched (a server in a container), or None: it is
        self.unwatched = disturbance.unwatchable({v.name: v.backend.kind for v in plan.variants})

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
            self.run.write_plan(self.plan.text)
        self._inputs()
        record = self.run.read_record() or {"run_id": self.options.run_id, "plan": self.plan.name,
                                      "created": _now(), "specwatch": __version__, "attempts": []}
        if record.get("inputs_sha256", self.inputs) != self.inputs:
            raise RunConflict(f"--resume: the task files changed since the run started ({self.run.run}); "
                              "start a new run")
        earlier = [str(name) for name in record.get("variants", [])]  # a later run into the folder adds its own
        record.update({"inputs_sha256": self.inputs,
                       "variants": earlier + [v.name for v in self.plan.variants if v.name not in earlier]})
        record["attempts"].append({"started": _now(), "resume": self.options.resume})
        self.run.write_record(record)
        self._sweep_record()

    def _sweep_record(self) -> None:
        """A sweep's cells in `sweep.json`: what `specwatch tune` reads beside the variants' results."""
        sweep, perf = self.plan.sweep, self.plan.performance
        if sweep is None or perf is None:
            return
        self.run.write_sweep({
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
        if articles and not all(self.run.article_file(self.plan.lang, a).exists() for a in articles):
            write_article_workloads(self.run.article_file(self.plan.lang, "code").parent, self.plan.lang)
        for task in self.plan.tasks:
            target = self.run.task_file(task.name)
            source = task.path or self.run.article_file(self.plan.lang, str(task.article))
            if not target.exists():
                self.run.copy_input(task.name, Path(source))
            elif task.path is not None and sha256_file(source) != sha256_file(target):
                raise RunConflict(f"tasks.{task.name}: {source} changed since the run started; start a new run")
            self.workloads[task.name] = target
            self.rows[task.name] = load_jsonl(target, task.name)
        self.inputs = {"plan.yaml": sha256_file(self.run.plan),
                       **{str(p.relative_to(self.run.root)): sha256_file(p) for p in self.workloads.values()}}

    # -- variants ---------------------------------------------------------------------------------

    def execute(self) -> RunResult:
        self.prepare()
        unfinished = [v for v in self.plan.variants if not self.run.variant(v.name).finished()]
        if unfinished:  # `vllm serve --help` takes ~20 s: read it while the first server starts
            self._help(unfinished[0], self._backend(unfinished[0]))
        self.timeline = self._start_timeline() if unfinished else None
        try:
            result = self._variants(self.plan.variants)
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
        windows = {name: Span(*s["window"]) for name, s in statuses.items()
                   if s.get("state") == DONE and s.get("window") and name not in saved}
        backends = {v.name: v.backend.kind for v in self.plan.variants}
        try:
            self.timeline.save(windows, backends)
        except (PrometheusError, requests.RequestException, OSError) as exc:  # the results stand without curves
            self.console.print(f"the dashboard queries over the run could not be saved: {exc}")

    def _variants(self, variants: Sequence[Variant]) -> RunResult:
        statuses: dict[str, dict[str, Any]] = {}
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=self.console) as progress:
            bar = progress.add_task("experiment", total=steps(self.plan) * len(variants))
            todo: list[Serving] = []
            for v in variants:
                folder = self.run.variant(v.name)
                if folder.finished():
                    statuses[v.name] = folder.read_status() or {}
                    progress.advance(bar, steps(self.plan))
                    progress.console.print(f"{v.name}: finished earlier, kept")
                    continue
                moved = self.run.set_aside(v.name)
                if moved:
                    progress.console.print(f"{v.name}: unfinished results moved to {moved}; redoing it")
                todo.append(Serving(v, folder, {"variant": v.name, "started": _now(), "baseline": v.baseline,
                                                "speculative_config": v.speculative_config,
                                                "design": self.plan.design}, time.monotonic()))

            def step(what: str) -> None:
                progress.update(bar, description=what)

            def advance() -> None:
                progress.advance(bar)

            if self.plan.design == "bracketed":
                done = self._bracketed(todo, step, advance)
            elif self.plan.design == "interleaved":
                if statuses and todo:
                    progress.console.print(f"{', '.join(s.variant.name for s in todo)}: measured in rounds of their "
                                           f"own; {', '.join(statuses)} finished earlier, outside those rounds")
                done = self._interleaved(todo, step, advance)
            else:
                done = [self._sequential(s, step, advance) for s in todo]
            for s in done:
                statuses[s.variant.name] = s.status
                progress.console.print(f"{s.variant.name}: {s.status['state']}" + (
                    f", reconciliation {'equal' if s.status.get('ok') else 'MISMATCH'}" if s.status["state"] == DONE
                    else f": {s.status.get('error')}"))
            progress.update(bar, description="experiment done")
        record = self.run.read_record() or {}
        record["attempts"][-1]["finished"] = _now()
        record.update(design=self.plan.design, rounds=self.plan.rounds)
        record["servers"] = {**record.get("servers", {}), **{  # what else the sides may differ in (the report names it)
            name: environment.server_identity(read_json_object(self.run.variant(name).environment) or {})
            for name in statuses}}
        record["recovery"] = {"max_extra_rounds": self.plan.max_extra_rounds,
                              "disturbed_above_cores": self.plan.disturbed_above_cores, "not_watched": self.unwatched,
                              "replaced": replaced_rounds(statuses)}
        record["statuses"] = {**record.get("statuses", {}),
                              **{n: {k: s.get(k) for k in ("state", "ok")} for n, s in statuses.items()}}
        self.run.write_record(record)
        return RunResult(self.run.root, statuses)

    # -- designs: which server is up when, and the order of the blocks ------------------------------

    def _sequential(self, s: Serving, step: Step, advance: Advance) -> Serving:
        """One variant from start to stop: its passes, then one block per concurrency."""
        with self._stopped_on_the_way_out([s]):
            if self._start(s, step, advance):
                self._guard(s, partial(self._open, s, step, advance))
                for c in self._concurrencies():
                    self._guard(s, partial(self._block, s, c, 1, step, advance))

                    def again(r: int, new: int, share: int, c: int = c) -> None:
                        self._guard(s, partial(self._block, s, c, new, step, _quiet, share, r))

                    self._recover([s], c, again)
                self._guard(s, partial(self._close, s, step))
            return self._finish(s, step, advance)

    def _interleaved(self, todo: Sequence[Serving], step: Step, advance: Advance) -> list[Serving]:
        """Every server up at once; the passes of each; then per concurrency `rounds` rounds of one block per
        variant, the order rotated each round, so a slowdown of the machine lands on every variant of a round."""
        if not todo:
            return []
        with self._stopped_on_the_way_out(todo):
            step(f"starting {len(todo)} servers side by side")
            with ThreadPoolExecutor(len(todo), thread_name_prefix="server-start") as pool:
                up = list(pool.map(lambda s: self._start(s, step, advance), todo))
            live = {s.variant.name: s for s, ok in zip(todo, up, strict=True) if ok}
            for s in live.values():
                self._guard(s, partial(self._open, s, step, advance))
            for c in self._concurrencies():
                for r in range(1, self.plan.rounds + 1):
                    for name in rotation(list(live), r):
                        self._guard(live[name], partial(self._block, live[name], c, r, step, advance))

                def again(r: int, new: int, share: int, c: int = c) -> None:
                    for name in rotation(list(live), r):  # the replaced round's order
                        self._guard(live[name], partial(self._block, live[name], c, new, step, _quiet, share, r))

                self._recover(list(live.values()), c, again)
            for s in live.values():
                self._guard(s, partial(self._close, s, step))
            return [self._finish(s, step, advance) for s in todo]

    def _bracketed(self, todo: Sequence[Serving], step: Step, advance: Advance) -> list[Serving]:
        """One server at a time: per concurrency `rounds` rounds of one block per variant, the order reversed every
        other round (baseline, candidates | candidates, baseline | ...), each variant's server started for its
        block and stopped after it (kept up where the next block is its own again). Its first start also runs its
        warm-up and acceptance pass; every start warms up and takes its own snapshots."""
        with self._stopped_on_the_way_out(todo):
            by_name = {s.variant.name: s for s in todo}
            plan: list[tuple[int | None, int, str]] = [
                (c, r, name) for c in self._concurrencies() for r in range(1, self.plan.rounds + 1)
                for name in bracket(list(by_name), r)] or [(None, 1, name) for name in by_name]
            current: Serving | None = None

            def block(c: int | None, r: int, name: str, share: int | None = None, replaces: int | None = None) -> None:
                nonlocal current
                s = by_name[name]
                if "error" in s.status:
                    return
                if current is not s:
                    if current is not None:
                        self._guard(current, partial(self._snapshot_after, current))
                        self._down(current, step)
                    current = None
                    if not self._start(s, step, advance):
                        return
                    current = s
                    self._guard(s, partial(self._open, s, step, advance))
                if c is not None:
                    self._guard(s, partial(self._block, s, c, r, step, advance if replaces is None else _quiet,
                                           share, replaces))

            for i, (c, r, name) in enumerate(plan):
                block(c, r, name)
                if c is not None and (i + 1 == len(plan) or plan[i + 1][0] != c):  # the concurrency's last block

                    def again(r: int, new: int, share: int, c: int = c) -> None:
                        for name in bracket(list(by_name), r):  # the replaced round's order
                            block(c, new, name, share, r)

                    self._recover(todo, c, again)
            if current is not None:
                self._guard(current, partial(self._snapshot_after, current))
                self._down(current, step)
            for s in todo:
                self._guard(s, partial(self._close, s, step))
            return [self._finish(s, step, advance) for s in todo]

    @contextmanager
    def _stopped_on_the_way_out(self, todo: Sequence[Serving]) -> Iterator[None]:
        """On an interrupt (Ctrl+C, SIGTERM) or an unexpected error, stop every server still up, write no status."""
        try:
            yield
        except BaseException:
            for s in todo:
                if s.server is not None:
                    try:
                        s.server.stop()
                    except BackendError as exc:
                        self.console.print(f"{s.variant.name}: {exc}")
            raise

    def _concurrencies(self) -> tuple[int, ...]:
        return self.plan.performance.concurrencies if self.plan.performance else ()

    # -- one variant's steps ----------------------------------------------------------------------

    def _guard(self, s: Serving, work: Callable[[], None]) -> None:
        """Run one step of `s` unless an earlier one failed; an error is recorded in its status, the run goes on."""
        if "error" in s.status:
            return
        try:
            work()
        except Exception as exc:  # recorded in status.json; the other variants go on
            s.status["error_trace"] = traceback.format_exc(limit=8)
            s.status["error"] = f"{type(exc).__name__}: {exc}"

    def _start(self, s: Serving, step: Step, advance: Advance) -> bool:
        """Start the variant's server (again, in a bracketed design: a new lifetime with its own log)."""
        v = s.variant
        s.folder.root.mkdir(parents=True, exist_ok=True)
        backend = self._backend(v)
        s.lifetimes += 1
        log = s.folder.lifetime(s.lifetimes)[0]
        s.launch = Launch(v.name, tuple(variant_args(self.plan, v)), free_port(), log, self.plan.server.startup_timeout)
        if self.timeline is not None:  # Prometheus takes the new target up while the server starts
            self.timeline.target(v.name, backend.address(s.launch))
        step(f"{v.name}: starting {v.backend.kind} server" + (f" ({s.lifetimes})" if s.lifetimes > 1 else ""))
        started = time.monotonic()
        try:
            s.server = backend.start(s.launch)
        except BackendError as exc:
            s.status.update(error=str(exc))
            return False
        if s.lifetimes == 1:
            s.status["startup_seconds"] = round(time.monotonic() - s.started, 2)
            s.window_start = time.time()
            advance()
        else:
            s.status.setdefault("restarts", []).append({"startup_seconds": round(time.monotonic() - started, 2)})
        return True

    def _open(self, s: Serving, step: Step, advance: Advance) -> None:
        """The environment, the warm-up, the first snapshot and the acceptance pass of each task; after a restart
        (a bracketed design's next lifetime) the warm-up and the lifetime's first snapshot only."""
        v, folder, url = s.variant, s.folder, s.url
        backend, model = self._backend(v), self.plan.served_model_name
        if self.timeline is not None and not self.timeline.watch(v.name, url):
            self.console.print(f"{v.name}: Prometheus did not scrape its server within 15 s; its curves start later")
        if s.lifetimes > 1:
            self._warm_up(s, step)
            s.before = snapshot.take(url)
            snapshot.write(s.before, folder.lifetime(s.lifetimes)[1])
            return
        step(f"{v.name}: recording the environment")
        help_text = self._help(v, backend).result()
        if help_text:
            folder.write_help(help_text)
        before_env = snapshot.take(url)
        assert s.launch is not None
        folder.write_environment(environment.environment(
            url=url, command=backend.command_line(s.launch), args=s.launch.args, model=v.model,
            speculative_config=v.speculative_config, backend=backend.describe(), inputs=self.inputs,
            metrics_text=before_env.text, startup_seconds=s.status["startup_seconds"], has_help=bool(help_text),
            server_log=folder.server_log.read_text(errors="replace") if folder.server_log.exists() else ""))
        self._warm_up(s, step)
        s.before = snapshot.take(url)
        snapshot.write(s.before, folder.metrics_before)
        for task in self.plan.tasks:
            step(f"{v.name}: acceptance pass, {task.name}")
            passes.acceptance_pass(url, task.name, self.rows[task.name], folder, self.plan.acceptance, model)
            advance()

    def _warm_up(self, s: Serving, step: Step) -> None:
        """A few requests per task before the snapshot (numba's JIT of the proposers, the first batch's shapes)."""
        if self.plan.warmup_requests:
            step(f"{s.variant.name}: warming up")
            rows = [r for t in self.plan.tasks for r in self.rows[t.name][:self.plan.warmup_requests]]
            passes.chat_pass(s.url, rows, s.folder.warmup, max_tokens=16, concurrency=len(rows),
                             model=self.plan.served_model_name)

    def _snapshot_after(self, s: Serving) -> None:
        """The lifetime's last snapshot, and its difference from the first."""
        after = snapshot.take(s.url)
        snapshot.write(after, s.folder.lifetime(s.lifetimes)[2])
        assert s.before is not None
        s.differences.append(snapshot.diff(s.before, after))

    def _block(self, s: Serving, c: int, r: int, step: Step, advance: Advance, share: int | None = None,
               replaces: int | None = None) -> None:
        """Round `r`'s block at concurrency `c`: the share of the pass's requests of round `share` (its own by
        default; a re-measured round takes the replaced one's), Locust's warm-up in the first round only, and
        what others took from the machine meanwhile."""
        perf = self.plan.performance
        assert perf is not None
        again = f" (again, for round {replaces})" if replaces is not None else ""
        step(f"{s.variant.name}: performance, concurrency {c}, round {r} of {self.plan.rounds}{again}")
        started = time.time()
        before = disturbance.read() if self.unwatched is None else None
        passes.performance_pass(s.url, self.workloads, s.folder.block(c, r), perf, c, self.plan.served_model_name,
                                requests=perf.block_requests(c, self.plan.rounds, share or r),
                                warmup=perf.warmup if r == 1 else 0)
        record: dict[str, Any] = {"concurrency": c, "round": r, "start": started, "end": time.time()}
        machine = disturbance.between(before, disturbance.read() if before is not None else None)
        if machine is not None:
            record.update(machine=machine.record(), disturbed=machine.disturbed(self.plan.disturbed_above_cores))
        if replaces is not None:
            record["replaces"] = replaces
        s.blocks.append(record)
        advance()

    def _recover(self, servings: Sequence[Serving], c: int, measure: Callable[[int, int, int], None]) -> None:
        """Measure the disturbed rounds at `c` again, oldest first, each as a new round (`measure(replaced, new,
        share)`: the round replaced, the new round's number, whose share of requests it takes), up to the plan's
        `max_extra_rounds`; the replaced round's blocks are marked `replaced_by` and left out of the merge."""
        share: dict[int, int] = {}
        for _ in range(self.plan.max_extra_rounds):
            live = [s for s in servings if "error" not in s.status]
            at_c = [b for s in live for b in s.blocks if b["concurrency"] == c]
            pending = sorted({b["round"] for b in at_c if b.get("disturbed") and "replaced_by" not in b})
            if not pending:
                return
            r, new = pending[0], max(b["round"] for b in at_c) + 1
            why = next(b["disturbed"] for b in at_c if b["round"] == r and b.get("disturbed"))
            self.console.print(f"round {r} at concurrency {c} was disturbed ({why}): measuring it again as round {new}")
            share[new] = share.get(r, r)
            measure(r, new, share[new])
            for s in live:
                for b in s.blocks:
                    if b["concurrency"] == c and b["round"] == r:
                        b["replaced_by"] = new

    def _close(self, s: Serving, step: Step) -> None:
        """The blocks merged per concurrency, the last snapshot, the reconciliation."""
        v, folder = s.variant, s.folder
        perf: dict[str, Any] = {}
        for c in self._concurrencies():
            rounds = sorted({b["round"] for b in s.blocks if b["concurrency"] == c and "replaced_by" not in b})
            summary = blocks.merge(folder, c, rounds)
            failures = sum(t["failures"] for t in summary["tasks"].values())
            perf[f"c{c}"] = {"failures": failures, "locust_exit_code": summary["locust_exit_code"], "rounds": rounds}
            if self.plan.sweep is not None:
                self.console.print(cell_line(v, c, summary, folder.requests(c)))
        if s.server is not None:
            self._snapshot_after(s)
        reconciliation = passes.check_counters(snapshot.combine(s.differences), folder,
                                               v.speculative_config is not None)
        reconciliation["lifetimes"] = len(s.differences)
        folder.write_reconciliation(reconciliation)
        perf_ok = all(p["failures"] == 0 and p["locust_exit_code"] == 0 for p in perf.values())
        s.status.update(reconciled=reconciliation["ok"], performance=perf, ok=reconciliation["ok"] and perf_ok,
                        window=[s.window_start, time.time()])  # Unix seconds: healthy to the last snapshot

    def _down(self, s: Serving, step: Step) -> None:
        """Stop the server, confirmed gone (else BackendError: the run stops)."""
        if s.server is None:
            return
        step(f"{s.variant.name}: stopping the server")
        s.status["stopped"] = s.server.stop()
        s.server = None
        if self.timeline is not None:
            self.timeline.untarget(s.variant.name)

    def _finish(self, s: Serving, step: Step, advance: Advance) -> Serving:
        """Stop the server if it is up and write the status, last."""
        self._down(s, step)
        s.status["blocks"] = s.blocks
        advance()
        state = FAILED if "error" in s.status else DONE
        s.status.update(state=state, seconds=round(time.monotonic() - s.started, 2))
        if state == DONE:
            s.status["finished"] = _now()
        s.folder.write_status(s.status)  # last: the variant is finished only from here on
        return s

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


def _quiet() -> None:
    """The progress bar's steps count the plan's rounds: a re-measured block advances none."""


def replaced_rounds(statuses: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every replaced round, once per concurrency: the round, the one that replaced it, and why (run.json)."""
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for status in statuses.values():
        for b in status.get("blocks") or []:
            if "replaced_by" in b:
                entry = out.setdefault((b["concurrency"], b["round"]), {
                    "concurrency": b["concurrency"], "round": b["round"], "replaced_by": b["replaced_by"],
                    "reason": None, "outside_cores": 0.0})
                if b.get("disturbed") and entry["reason"] is None:
                    entry["reason"] = b["disturbed"]
                entry["outside_cores"] = max(entry["outside_cores"], (b.get("machine") or {}).get("outside_cores", 0))
    return [out[k] for k in sorted(out)]


def cell_line(v: Variant, concurrency: int, summary: Mapping[str, Any], rows: Sequence[RequestResult]) -> str:
    """A sweep cell's progress line: the variant, its k, the concurrency, requests and TPOT p50 per task.

    The TPOT is the server's (`mean_itl_ms`) where it reported one: a busy client's own is bunched."""
    k = (v.speculative_config or {}).get("num_speculative_tokens", 0)
    table = (v.speculative_config or {}).get("num_speculative_tokens_per_batch_size")
    what = f"k per batch size {table}" if table else f"k={k}"
    server: dict[str, list[float]] = {}
    for r in rows:
        itl = (r.server or {}).get("mean_itl_ms")
        if r.ok and not r.warmup and isinstance(itl, int | float):
            server.setdefault(r.task, []).append(float(itl))
    parts = []
    for task, s in summary["tasks"].items():
        tpot = f"{median(server[task]):.2f} ms (server)" if server.get(task) else f"{s['tpot_ms']['p50']} ms"
        parts.append(f"{task} {s['requests'] - s['failures']}/{s['requests']} ok, TPOT p50 {tpot}")
    return f"cell {v.name} ({what}) at concurrency {concurrency}: {', '.join(parts)}"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def run_plan(plan: StudyPlan, options: RunOptions, console: Console | None = None) -> RunResult:
    return Runner(plan, options, console or Console()).execute()


def stop_on_sigterm() -> None:
    """From here on SIGTERM stops a run like Ctrl+C: the running servers are stopped first (for the verbs that
    run plans, in their main thread)."""
    signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
