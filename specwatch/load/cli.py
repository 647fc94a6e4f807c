"""The `specwatch load` verb: Locust headless at fixed concurrency over task-labelled JSONL workloads.

Exit codes: 0 no failed request, 2 a usage error, 3 some requests failed or Locust did.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specwatch.config import Home
from specwatch.exit_codes import EXIT_CHECK, EXIT_OK, EXIT_USAGE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="base URL: the exporter, or a server directly")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=64, help="measured requests per task")
    parser.add_argument("--warmup", type=int, default=4, help="warm-up requests per task (not measured)")
    parser.add_argument("--task", action="append", required=True, metavar="TASK=PATH.jsonl")
    parser.add_argument("--ignore-eos", action="store_true", help="fixed work per request (performance runs)")
    parser.add_argument("--max-tokens", type=int, default=0, help="override every row's output_tokens")
    parser.add_argument("--max-seconds", type=int, default=3600, help="stop anyway after this long")
    parser.add_argument("--out", type=Path, required=True)


def run(home: Home, args: argparse.Namespace) -> int:
    from specwatch.load.run import LoadConfig
    from specwatch.load.run import run as run_load

    workloads: dict[str, Path] = {}
    for item in args.task:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            print(f"specwatch load: --task {item!r}: expected TASK=PATH.jsonl", file=sys.stderr)
            return EXIT_USAGE
        workloads[name] = Path(path)
    if args.concurrency < 1 or args.requests < 1 or args.warmup < 0:
        print("specwatch load: --concurrency and --requests must be positive", file=sys.stderr)
        return EXIT_USAGE
    summary = run_load(LoadConfig(args.target, args.concurrency, args.requests, workloads, args.out,
                                  args.warmup, args.ignore_eos, args.max_tokens, args.max_seconds))
    failures = sum(t["failures"] for t in summary["tasks"].values())
    return EXIT_OK if failures == 0 and summary["locust_exit_code"] == 0 else EXIT_CHECK
