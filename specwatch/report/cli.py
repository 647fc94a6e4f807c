"""The `specwatch report` verb: Markdown + HTML report and the go / no-go lines for a finished experiment."""

from __future__ import annotations

import argparse
from pathlib import Path

from specwatch.config import Home
from specwatch.exit_codes import EXIT_OK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", type=Path, help="results/<run-id> written by `specwatch experiment`")
    parser.add_argument("--baseline", help="the reference variant (default: `baseline`, else the first without a "
                                           "speculative config)")
    parser.add_argument("--target-concurrency", type=int,
                        help="judge at this concurrency (default: the highest run)")
    parser.add_argument("--capacity-loss", type=float, default=0.25,
                        help="largest acceptable KV capacity loss vs the baseline, 0..1 (default 0.25)")
    parser.add_argument("--policy", type=Path,
                        help="the judge's policy: tolerances, alpha, confidence, min_samples (default: the canary's "
                             "packaged specwatch/data/canary-policy.yaml)")


def run(home: Home, args: argparse.Namespace) -> int:
    from specwatch.report import build

    study = build(args.results, args.baseline, args.target_concurrency, args.capacity_loss, args.policy)
    for v in study.verdicts:
        print(f"{v.label:<12} {v.variant:<14} {v.task:<6} {v.reason}")
    print(f"report: {study.markdown}\n        {study.html}")
    return EXIT_OK
