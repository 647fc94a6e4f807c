"""The `specwatch up` verb: the stack on loopback without Docker, in the web UI mode or `--headless`."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from specwatch.config import Home
from specwatch.exit_codes import EXIT_ERROR, EXIT_OK, EXIT_USAGE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Starts two servers (baseline and an n-gram candidate), the exporter, Prometheus, "
                          "Locust's web UI and the dashboard viewer on 8080 when built (Grafana too when a "
                          "`grafana` binary is on PATH and "
                          "GRAFANA_ADMIN_PASSWORD is set); Ctrl+C stops everything. --headless runs one labelled "
                          "load through the exporter, prints per-task acceptance, then stops.")
    parser.add_argument("--backend", choices=["vllm-cpu", "sim", "urls"], default="vllm-cpu",
                        help="real vLLM CPU servers with SmolLM2 (default), simulators, or --url servers")
    parser.add_argument("--url", action="append", default=[], metavar="VARIANT=URL",
                        help="with --backend urls: baseline=URL and candidate=URL")
    parser.add_argument("--headless", action="store_true", help="one labelled load, a summary, then stop")
    parser.add_argument("--requests", type=int, default=4, help="headless: measured requests per task")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--split", type=int, default=50, help="percent of requests sent to the candidate")
    parser.add_argument("--duration", type=float, help="web UI mode: stop after this many seconds")
    parser.add_argument("--free-ports", action="store_true",
                        help="pick free loopback ports instead of 8000/8001, 9400, 9090, 8089, 3000, 8080")
    parser.add_argument("--sim-time-scale", type=float, default=1.0)
    parser.add_argument("--out", type=Path, help="run folder (default <home>/runs/up-<time>)")
    parser.add_argument("--rules", type=Path, action="append", default=[], metavar="FILE.yml",
                        help="a rule file of your own for Prometheus to load, e.g. the cost table `specwatch tune` "
                             "writes (the best-k panel); repeatable")


def run(home: Home, args: argparse.Namespace) -> int:
    from specwatch.exporter.config import DEFAULT_ADMIN_TOKEN_ENV
    from specwatch.stack.processes import StackError
    from specwatch.stack.up import Ports, StackConfig, free_ports
    from specwatch.stack.up import run as run_stack

    urls = {}
    for item in args.url:
        name, sep, url = item.partition("=")
        if not sep:
            print(f"specwatch up: --url {item!r}: expected VARIANT=URL", file=sys.stderr)
            return EXIT_USAGE
        urls[name] = url
    try:
        cfg = StackConfig(home, args.out or home.runs / time.strftime("up-%Y%m%d-%H%M%S"), args.backend, urls,
                          free_ports() if args.free_ports else Ports(), args.split, args.headless, args.requests,
                          args.concurrency, args.max_tokens, args.duration, args.sim_time_scale,
                          os.environ.get("GRAFANA_ADMIN_PASSWORD"),
                          DEFAULT_ADMIN_TOKEN_ENV if os.environ.get(DEFAULT_ADMIN_TOKEN_ENV) else None,
                          tuple(args.rules))
    except ValueError as exc:
        print(f"specwatch up: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        run_stack(cfg)
    except StackError as exc:
        print(f"specwatch up: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK
