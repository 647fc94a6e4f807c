"""`specwatch experiment plan.yaml [--out results] [--run-id ID] [--resume]`: the verb's shell over `run_plan`.

Exit codes: 0 every variant finished and reconciled; 1 a variant failed (server did not start,
a pass raised) or a server could not be confirmed gone; 2 a bad plan or run folder
(the message names the key); 3 every variant finished but a check failed (reconciliation
mismatch, Locust failures); 130 interrupted (finished variants are kept; `--resume` goes on).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from rich.console import Console

from specwatch.config import Home
from specwatch.exit_codes import EXIT_USAGE
from specwatch.experiment.plan import PlanError, load_plan
from specwatch.experiment.runner import RunConflict, RunOptions, run_plan, stop_on_sigterm


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", type=Path, help="the plan (YAML); see examples/plans/")
    p.add_argument("--out", type=Path, default=Path("results"), help="results folder (default results)")
    p.add_argument("--run-id", help="the run's folder name under --out (default: the start time)")
    p.add_argument("--resume", action="store_true",
                   help="finish the run --run-id: skip finished variants, redo an unfinished one")
    p.add_argument("--no-prometheus", action="store_true",
                   help="do not run Prometheus beside the study (the report then has no dashboard queries over "
                        "the run); by default it runs when `prometheus` is on PATH")


def run(home: Home, args: argparse.Namespace) -> int:
    if args.resume and not args.run_id:
        print("specwatch experiment: --resume needs the --run-id of the run to finish", file=sys.stderr)
        return EXIT_USAGE
    try:
        plan = load_plan(args.plan, home)
    except PlanError as exc:
        print(f"specwatch experiment: {args.plan}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    run_id = args.run_id or time.strftime("%Y%m%d-%H%M%S")
    stop_on_sigterm()
    console = Console(stderr=True)
    try:
        result = run_plan(plan, RunOptions(args.out, run_id, home, args.resume, dict(os.environ),
                                           prometheus=None if args.no_prometheus else "prometheus"), console)
    except RunConflict as exc:
        print(f"specwatch experiment: {exc}", file=sys.stderr)
        return EXIT_USAGE
    console.print(f"results in {result.folder}")
    if plan.sweep is not None and not result.failed:
        console.print(f"next: `specwatch tune {result.folder}`, the best k per batch size"
                      + (" and its proof (measured there)" if plan.sweep.proof else ""))
    if result.failed:
        console.print(f"failed: {', '.join(result.failed)} (see their status.json; --resume redoes them)")
    elif result.checks_failed:
        console.print(f"checks failed: {', '.join(result.checks_failed)} (see their reconciliation.json)")
    return result.exit_code
