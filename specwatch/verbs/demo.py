"""The `specwatch demo` verb: the real vLLM on CPU with n-gram, per-task acceptance reconciled with its counters.

Exit codes: 0 reconciled, 2 a usage error, 3 a check failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from specwatch.config import Home
from specwatch.exit_codes import EXIT_CHECK, EXIT_OK, EXIT_USAGE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=8, help="rows per task (default 8)")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--lang", choices=["en", "zh"], default="en")
    parser.add_argument("--url", help="use this running server instead of starting the real vLLM")
    parser.add_argument("--out", type=Path, help="run folder (default <home>/runs/demo-<time>)")
    parser.add_argument("--json", action="store_true", help="print the per-task result as JSON too")


def run(home: Home, args: argparse.Namespace) -> int:
    from specwatch.demo import DemoConfig
    from specwatch.demo import run as run_demo

    if args.rows < 1 or args.concurrency < 1 or args.max_tokens < 1:
        print("specwatch demo: --rows, --concurrency and --max-tokens must be positive", file=sys.stderr)
        return EXIT_USAGE
    out = args.out or home.runs / time.strftime("demo-%Y%m%d-%H%M%S")
    report = run_demo(DemoConfig(home, out, args.rows, args.concurrency, args.max_tokens, args.lang, args.url))
    if args.json:
        print(json.dumps({t: a.as_dict() for t, a in report.per_task.items()}))
    return EXIT_OK if report.ok else EXIT_CHECK
