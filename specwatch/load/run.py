"""`specwatch load`: run Locust headless at fixed concurrency, show progress, write summary.json.

Locust runs as its own process (`python -m locust -f <our locustfile> --headless ...`), writes
its CSVs to the run folder and one JSON line per request to `requests.jsonl`; the summary is
computed from those lines (per task: requests, failures, TTFT / TPOT / ITL p50 / p95 / p99 in
ms, output tokens per second, acceptance summed first, then divided).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from specwatch.load.results import read_results, summarise
from specwatch.workloads import load_jsonl

# Never imported here: importing locust monkey-patches this process (gevent).
LOCUSTFILE = Path(__file__).with_name("locustfile.py")


@dataclass(frozen=True)
class LoadConfig:
    target: str
    concurrency: int
    requests_per_task: int
    workloads: dict[str, Path]
    out: Path
    warmup: int = 0
    ignore_eos: bool = False
    max_tokens: int = 0
    max_seconds: int = 3600
    model: str = "spec-demo"


def locust_command(cfg: LoadConfig) -> list[str]:
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
            "-u", str(cfg.concurrency), "-r", str(cfg.concurrency), "--host", cfg.target.rstrip("/"),
            "--run-time", f"{cfg.max_seconds}s", "--stop-timeout", "30", "--csv", str(cfg.out / "locust"),
            "--workloads", ",".join(f"{k}={v}" for k, v in cfg.workloads.items()),
            "--requests-per-task", str(cfg.requests_per_task), "--warmup", str(cfg.warmup),
            "--max-tokens", str(cfg.max_tokens), "--model", cfg.model,
            "--results-file", str(cfg.out / "requests.jsonl"), *(["--ignore-eos"] if cfg.ignore_eos else [])]


def run(cfg: LoadConfig, console: Console | None = None) -> dict[str, Any]:
    console = console or Console()
    for task, path in cfg.workloads.items():
        load_jsonl(path, task)  # a bad row fails here, with its line number, before anything starts
    cfg.out.mkdir(parents=True, exist_ok=True)
    results = cfg.out / "requests.jsonl"
    results.unlink(missing_ok=True)
    total = (cfg.requests_per_task + cfg.warmup) * len(cfg.workloads)
    with (cfg.out / "locust.log").open("wb") as log:
        proc = subprocess.Popen(locust_command(cfg), stdout=log, stderr=subprocess.STDOUT)
        try:
            with Progress(console=console, transient=True) as progress:
                bar = progress.add_task(f"{cfg.concurrency} in flight", total=total)
                while proc.poll() is None:
                    done = len(results.read_text().splitlines()) if results.exists() else 0
                    progress.update(bar, completed=done)
                    time.sleep(0.5)
        finally:  # interrupted (Ctrl+C, SIGTERM turned into an exception): Locust stops with us
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    summary = summarise(read_results([results]))
    summary["locust_exit_code"] = proc.returncode
    summary["config"] = {"target": cfg.target, "concurrency": cfg.concurrency,
                         "requests_per_task": cfg.requests_per_task, "warmup": cfg.warmup,
                         "ignore_eos": cfg.ignore_eos, "workloads": {k: str(v) for k, v in cfg.workloads.items()}}
    (cfg.out / "summary.json").write_text(json.dumps(summary, indent=1))
    _print(summary, console)
    return summary


def _print(summary: dict[str, Any], console: Console) -> None:
    table = Table(title="Load summary: ms at p50 / p99; C/D and 1+C/R summed first, then divided")
    for col in ("task", "req", "fail", "TTFT", "TPOT", "ITL p99", "tok/s", "C/D", "1+C/R"):
        table.add_column(col, justify="right", no_wrap=True)

    def f(v: Any) -> str:
        return "-" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)

    for task, s in summary["tasks"].items():
        a = s["acceptance"]
        table.add_row(task, str(s["requests"]), str(s["failures"]),
                      f"{f(s['ttft_ms']['p50'])} / {f(s['ttft_ms']['p99'])}",
                      f"{f(s['tpot_ms']['p50'])} / {f(s['tpot_ms']['p99'])}", f(s["itl_ms"]["p99"]),
                      f(s["output_tokens_per_second"]), f(a["acceptance_rate"]), f(a["mean_acceptance_length"]))
    console.print(table)
