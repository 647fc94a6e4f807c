"""The `specwatch check-server` verb: one real vLLM CPU server with n-gram, per-task acceptance reconciled.

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
    parser.add_argument("--out", type=Path, help="run folder (default <home>/runs/check-server-<time>)")
    parser.add_argument("--json", action="store_true", help="print the per-task result as JSON too")


def run(home: Home, args: argparse.Namespace) -> int:
    from specwatch.server_check import ServerCheckConfig
    from specwatch.server_check import run as run_check

    if args.rows < 1 or args.concurrency < 1 or args.max_tokens < 1:
        print("specwatch check-server: --rows, --concurrency and --max-tokens must be positive", file=sys.stderr)
        return EXIT_USAGE
    out = args.out or home.runs / time.strftime("check-server-%Y%m%d-%H%M%S")
    report = run_check(ServerCheckConfig(home, out, args.rows, args.concurrency, args.max_tokens, args.lang, args.url))
    if args.json:
        print(json.dumps({t: a.as_dict() for t, a in report.per_task.items()}))
    return EXIT_OK if report.ok else EXIT_CHECK
