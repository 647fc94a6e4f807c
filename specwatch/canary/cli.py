"""The `specwatch canary` verb: arguments, one evaluation (or a watch loop), the report, the exit code.

Exit codes: 0 pass, 3 fail, 4 marginal, 5 insufficient data (on every task or a critical
metric); 1 a runtime error (Prometheus or the exporter unreachable, an unreadable log; with `--watch`,
the last evaluation failed), 2 a usage error (bad flags or policy). Every evaluation has a deadline
(`--deadline`, 30 s): Prometheus queries wait at most what is left of it. `--watch` (`watch.py`) prints
a failed evaluation and keeps watching; `--serve` (`serve.py`) answers the verdict over HTTP instead,
503 while there is none or it is stale, and exits 0 when stopped. A policy's notices (cautions dropped
for metrics it does not define) are printed once, on stderr.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from specwatch.canary import policy as policy_mod
from specwatch.canary import report
from specwatch.canary import serve as serve_mod
from specwatch.canary.samples import Data, SourceError, from_event_log, from_prometheus, parse_window
from specwatch.canary.scoring import CanaryVerdict, canary_verdict
from specwatch.canary.watch import AdminError, push_verdict, watch
from specwatch.config import Home
from specwatch.exit_codes import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from specwatch.exporter.config import DEFAULT_ADMIN_TOKEN_ENV
from specwatch.exporter.labels import NAME_PATTERN

# the verdict's own codes, beside the common ones (specwatch/exit_codes.py): a script tests pass / fail / marginal
EXIT_PASS, EXIT_FAIL, EXIT_MARGINAL, EXIT_INSUFFICIENT = EXIT_OK, 3, 4, 5
EXIT_CODES = {"pass": EXIT_PASS, "fail": EXIT_FAIL, "marginal": EXIT_MARGINAL, "insufficient": EXIT_INSUFFICIENT}


@dataclass(frozen=True)
class CanaryConfig:
    baseline: str
    candidate: str
    window: str
    tasks: tuple[str, ...]  # empty: every task seen in the data
    policy: policy_mod.Policy
    prometheus: str | None = None
    event_log: Path | None = None


def evaluate(cfg: CanaryConfig, due: float | None = None) -> CanaryVerdict:
    """Collect the window's data from the given sources and judge it; Prometheus answers by `due` (a
    `time.monotonic()`; None: each query within its own timeout). SourceError where a source fails."""
    data: Data = {}
    variants = (cfg.baseline, cfg.candidate)
    tasks = cfg.tasks or None
    sources = []
    if cfg.event_log is not None:
        from_event_log(cfg.event_log, parse_window(cfg.window), variants, tasks, data=data)
        sources.append(f"event log {cfg.event_log}")
    if cfg.prometheus is not None:
        from_prometheus(cfg.prometheus, cfg.window, variants, tasks, data=data, deadline=due)
        sources.append(f"Prometheus {cfg.prometheus}")
    seen = {t for (t, _), side in data.items() if side.requests or side.counts.get("requests", 0) > 0}
    chosen = cfg.tasks or tuple(sorted(seen))
    return canary_verdict(cfg.policy, data, cfg.baseline, cfg.candidate, chosen, cfg.window, sources)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = "Exit codes: 0 pass, 3 fail, 4 marginal, 5 insufficient data, 1 error, 2 usage."
    p.add_argument("--prometheus", metavar="URL", help="Prometheus scraping the exporter (ratios of rates, ITL p95)")
    p.add_argument("--event-log", type=Path, metavar="FILE", help="the exporter's --event-log (per-request samples)")
    p.add_argument("--baseline", default="baseline", help="the reference variant (default baseline)")
    p.add_argument("--candidate", default="candidate", help="the variant under test (default candidate)")
    p.add_argument("--window", default="10m", help="how far back to look, Prometheus style: 90s, 10m, 1h")
    p.add_argument("--task", action="append", default=[], help="a task to judge (repeatable; default: all seen)")
    p.add_argument("--policy", type=Path, help="YAML policy (default: the packaged specwatch/data/canary-policy.yaml)")
    p.add_argument("--out", type=Path, help="write canary.md and canary.json here")
    p.add_argument("--push-to", metavar="EXPORTER_URL", help="push the verdict to the exporter's /admin/verdict")
    p.add_argument("--admin-token-env", default=DEFAULT_ADMIN_TOKEN_ENV,
                   help=f"environment variable with the exporter's admin token (default {DEFAULT_ADMIN_TOKEN_ENV})")
    p.add_argument("--watch", action="store_true",
                   help="re-evaluate every --interval seconds until a fail; a failed evaluation is printed and the "
                        "watch goes on (exit 1 when the last one failed)")
    p.add_argument("--interval", type=float, default=60.0, help="seconds between evaluations (default 60)")
    p.add_argument("--deadline", type=float, default=30.0, metavar="SECONDS",
                   help="the most one evaluation may take (default 30); Prometheus queries time out within it. "
                        "--serve: past it the endpoint answers 503 and starts no second evaluation beside it; a "
                        "verdict older than 2 x --interval + --deadline is stale (503)")
    p.add_argument("--rounds", type=int, help="--watch: stop after this many evaluations")
    p.add_argument("--stop-split", action="store_true",
                   help="--watch: on a failed verdict set the candidate's weight to 0 at --push-to")
    p.add_argument("--serve", metavar="HOST:PORT",
                   help="judge every --interval seconds and answer GET /verdict[?task=T] here ([::1]:PORT for "
                        "IPv6), for Argo Rollouts and Flagger: 200 pass, 412 fail, 425 inconclusive, 503 no "
                        "verdict (an evaluation failed or runs past --deadline; the body's error says why) or a "
                        "stale one; ?always_200=true for Argo's web provider (the state in the body's verdict: "
                        "none, stale, ...); runs until SIGTERM / SIGINT")


def _usage(message: str) -> int:
    print(f"specwatch canary: {message}", file=sys.stderr)
    return EXIT_USAGE


def _print(verdict: CanaryVerdict, out: Path | None) -> None:
    for t in verdict.tasks:
        score = "-" if t.score is None else f"{t.score:.0f}"
        print(f"{report.LABELS[t.verdict]:<17} {t.task:<8} score {score:>3}  {t.reasons[0] if t.reasons else ''}")
    print(f"verdict: {report.LABELS[verdict.verdict]} (comparison: {verdict.comparison.replace('_', ' ')})",
          flush=True)
    if out is not None:
        md, js = report.write(verdict, out)
        print(f"report: {md}\n        {js}", flush=True)


def _serve(cfg: CanaryConfig, address: tuple[str, int], args: argparse.Namespace) -> int:
    """`--serve`: until SIGTERM / SIGINT (or --rounds evaluations); 0 at a clean stop, 1 where it cannot listen."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve_mod.serve(address, lambda due: evaluate(cfg, due), args.interval, lambda v: _print(v, args.out), stop,
                        args.rounds, args.deadline)
    except OSError as exc:
        print(f"specwatch canary: cannot serve on {args.serve}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_PASS


def run(home: Home, args: argparse.Namespace) -> int:
    if not args.prometheus and not args.event_log:
        return _usage("give --prometheus URL and/or --event-log FILE")
    for name in (args.baseline, args.candidate, *args.task):
        if not NAME_PATTERN.match(name):
            return _usage(f"{name!r}: expected a variant / task name (lowercase letters, digits, '-', '_')")
    if args.baseline == args.candidate:
        return _usage("--baseline and --candidate must differ")
    if (args.stop_split and not args.watch) or (args.stop_split and not args.push_to):
        return _usage("--stop-split needs --watch and --push-to EXPORTER_URL")
    if args.interval <= 0 or args.deadline <= 0:
        return _usage("--interval and --deadline must be positive")
    if args.serve and (args.watch or args.stop_split):
        return _usage("--serve keeps judging on its own: leave out --watch and --stop-split")
    try:
        parse_window(args.window)
        policy = policy_mod.load(args.policy)
        address = serve_mod.parse_address(args.serve) if args.serve else None
    except ValueError as exc:
        return _usage(str(exc))
    for notice in policy.notices:
        print(f"specwatch canary: notice: {notice}", file=sys.stderr, flush=True)
    token = os.environ.get(args.admin_token_env) if args.push_to else None
    if args.push_to and not token:
        return _usage(f"--push-to needs the exporter's admin token in ${args.admin_token_env}")
    cfg = CanaryConfig(args.baseline, args.candidate, args.window, tuple(dict.fromkeys(args.task)), policy,
                       args.prometheus, args.event_log)
    if address is not None:
        return _serve(cfg, address, args)
    try:
        if args.watch:
            last = watch(lambda: evaluate(cfg, time.monotonic() + args.deadline), args.interval,
                         lambda v: _print(v, args.out), args.push_to, token, args.stop_split, args.rounds)
            if last is None:
                return EXIT_ERROR  # the last evaluation failed (said on stderr as it happened)
            verdict = last
            if verdict.verdict == "fail" and args.stop_split:
                print(f"split stopped: {args.candidate} weight set to 0 at {args.push_to}", flush=True)
        else:
            verdict = evaluate(cfg, time.monotonic() + args.deadline)
            _print(verdict, args.out)
            if args.push_to and token:
                push_verdict(args.push_to, token, verdict)
    except (AdminError, SourceError) as exc:
        print(f"specwatch canary: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_CODES[verdict.verdict]
