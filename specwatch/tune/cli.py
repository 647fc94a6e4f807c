"""`specwatch tune RUN [--max-tpot-ms MS] [--mix code=0.7,chat=0.3] [--prometheus URL --window 1h] [...]`.

Reads a sweep run (`specwatch experiment` with a `sweep:` plan), writes `RUN/tune/` (or `--out`):
the `--speculative-config` with its per-batch-size table, the report, the plot, `cost-rules.yml`;
and the proof, `proof.md`. Where the plan asks for it (`sweep.proof`, the default) and the run has
not measured it yet, tune measures its recommendation first: the variant `dynamic`, one more run
into the sweep's folder (`tune.dynamic`). Exit codes: 0 done; 2 not a sweep run or a bad flag;
1 Prometheus unreachable or empty, or the proof's variant failed; 3 the proof's variant finished
but a check failed (reconciliation mismatch, Locust failures).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console

from specwatch.config import Home
from specwatch.exit_codes import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from specwatch.experiment.layout import RunFolder
from specwatch.experiment.plan import DYNAMIC, PlanError
from specwatch.experiment.runner import RunConflict
from specwatch.exporter.labels import NAME_PATTERN
from specwatch.tune import dynamic, fit, live, proof, render, tuner
from specwatch.tune.fit import Recommendation
from specwatch.tune.sweep import Sweep, SweepError, load


def _mix(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in text.split(","):
        task, sep, weight = part.partition("=")
        try:
            value = float(weight)
        except ValueError:
            value = -1.0
        if not sep or not task.strip() or value < 0:
            raise argparse.ArgumentTypeError(f"{part!r}: expected TASK=WEIGHT, e.g. code=0.7,chat=0.3")
        out[task.strip()] = value
    if not sum(out.values()) > 0:
        raise argparse.ArgumentTypeError("the weights add up to 0")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", type=Path, help="a sweep's run folder (results/<run-id>)")
    p.add_argument("--out", type=Path, help="where to write (default RUN/tune)")
    p.add_argument("--max-tpot-ms", type=float, help="the TPOT objective: every task's expected TPOT must stay at "
                   "or below it (default: the plan's sweep.max_tpot_ms, else none)")
    p.add_argument("--mix", type=_mix, help="the task mix, e.g. code=0.7,chat=0.3 (default: the observed traffic's: "
                   "the sweep's requests, or the Prometheus window's with --prometheus)")
    p.add_argument("--tolerance", type=float, default=0.01,
                   help="prefer the smallest k within this fraction of the best throughput (default 0.01)")
    p.add_argument("--prometheus", help="take the acceptance (and the default mix) from live traffic: this "
                   "Prometheus's exporter counters over --window; the step costs stay the sweep's")
    p.add_argument("--window", default="1h", help="the live window (a PromQL range, default 1h)")
    p.add_argument("--variant", default=".*", help="the exporter's variant label(s) to read (a regex, default all)")
    p.add_argument("--data-parallel-size", type=int, default=None, metavar="N",
                   help="the deployment's --data-parallel-size: above 1 vLLM ignores the per-batch-size table, and "
                   "tune says so (default: read from --prometheus, vLLM's engine label; else 1)")
    p.add_argument("--cost-variant", help="the `variant` label of cost-rules.yml: the live deployment's (the "
                   "exporter's route, e.g. candidate), so the dashboard's best k joins its traffic (default: the "
                   "sweep's method)")
    p.add_argument("--no-proof", action="store_true", help="do not measure the recommendation where the sweep asks "
                   "for its proof and has not measured it yet (no server is started; a proof already measured is "
                   "still written)")


def run(home: Home, args: argparse.Namespace) -> int:
    if args.cost_variant is not None and not NAME_PATTERN.fullmatch(args.cost_variant):
        print(f"specwatch tune: --cost-variant {args.cost_variant!r}: expected a variant label "
              f"({NAME_PATTERN.pattern})", file=sys.stderr)
        return EXIT_USAGE
    try:
        sweep = load(args.run)
    except SweepError as exc:
        print(f"specwatch tune: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.data_parallel_size is not None and args.data_parallel_size < 1:
        print(f"specwatch tune: --data-parallel-size {args.data_parallel_size}: expected 1 or more", file=sys.stderr)
        return EXIT_USAGE
    out = args.out or RunFolder(args.run).tune
    console = Console(stderr=True)
    mix, acceptance, source, dp = args.mix, None, "the sweep", args.data_parallel_size or 1
    if args.prometheus:
        swept = fit.build_model(sweep).acceptance
        try:
            found = live.acceptance(args.prometheus, args.window, args.variant, swept, max(sweep.ks))
            if args.data_parallel_size is None:
                dp = max(1, live.data_parallel_size(args.prometheus, args.window, args.variant))
        except live.LiveError as exc:
            print(f"specwatch tune: {exc}", file=sys.stderr)
            return EXIT_ERROR
        acceptance, mix = found.acceptance, mix or found.mix
        source = (f"live traffic ({args.prometheus}, last {args.window}): "
                  + "; ".join(f"{t} from {b}" for t, b in sorted(found.basis.items())))
    warnings = tuner.data_parallel_warning(dp)
    try:
        rec = tuner.tune(sweep, mix=mix, max_tpot_ms=args.max_tpot_ms if args.max_tpot_ms is not None
                         else sweep.max_tpot_ms, acceptance=acceptance, acceptance_source=source,
                         tolerance=args.tolerance, warnings=warnings)
    except ValueError as exc:
        print(f"specwatch tune: {exc}", file=sys.stderr)
        return EXIT_USAGE
    tuner.write(sweep, rec, out, args.cost_variant)
    for warning in rec.warnings:
        console.print(f"[bold yellow]warning:[/] {warning}")
    console.print(render.summary(sweep, rec))
    code = EXIT_OK
    config = rec.speculative_config
    if sweep.proof and not sweep.dynamic and not args.no_proof:
        if config is None:
            console.print("tune recommends no speculation at any batch size: nothing dynamic to prove")
        else:
            code = _measure(home, args.run, config, console)
            if code in (EXIT_ERROR, EXIT_USAGE):
                return code
            sweep = load(args.run)
            tuner.write(sweep, rec, out, args.cost_variant)  # tune.md names proof.md now
    if sweep.dynamic:
        _proof(sweep, rec, out, console)
    console.print(f"written: {out}/tune.md, speculative-config.json, cost-rules.yml, tune.png"
                  + (", proof.md" if sweep.dynamic else ""))
    return code


def _measure(home: Home, run: Path, config: Mapping[str, Any], console: Console) -> int:
    """The proof's variant `dynamic`: the recommended config measured in the sweep's folder; its exit code."""
    console.print("the proof: measuring the recommended config as the variant `dynamic` of the sweep's run")
    try:
        result = dynamic.measure(run, config, home, os.environ, console)
    except (PlanError, RunConflict) as exc:
        print(f"specwatch tune: {run}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    folder = RunFolder(run).variant(DYNAMIC)
    if result.failed:
        console.print(f"the proof's variant failed: see {folder.status} (tune again to redo it)")
    elif result.checks_failed:
        console.print(f"the proof's variant failed its checks: see {folder.reconciliation}")
    return result.exit_code


def _proof(sweep: Sweep, rec: Recommendation, out: Path, console: Console) -> None:
    if sweep.dynamic_config != rec.speculative_config:
        console.print("[bold yellow]warning:[/] the run's proof measured another config than this recommendation "
                      f"({json.dumps(sweep.dynamic_config)}); proof.md compares that one")
    console.print(proof.write_proof(sweep.root, out))
